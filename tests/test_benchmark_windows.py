"""What the benchmarks' figures cover: a load run's rates and CPU come from the same window (locust's
stats window, not the run time asked), and the engine sweep keeps the shapes it finished. Unit-level:
synthetic samples and a locust summary; nothing is timed against a server."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from benchmarks.load import cpu_sampling, load_options, load_reports, locust_runs

SPAWNED, LAST_REQUEST = 1000.0, 1004.0  # locust's stats reset (the last user spawned), its last request


def summary(tmp_path: Path, requests: int, start: float, end: float | None) -> Path:
    """A locustfile --summary-json: `requests` answered one-text requests over [start, end]."""
    rps = requests / (end - start) if end else 0.0
    figures = {"requests": requests, "failures": 0, "rps": rps, "mean_ms": 9.0, "max_ms": 30,
               "p50_ms": 9, "p95_ms": 20, "p99_ms": 30}  # fmt: skip
    path = tmp_path / "run_summary.json"
    path.write_text(json.dumps({"window": {"start": start, "end": end}, "total": figures,
                                "per_name": {"detect x1": figures} if requests else {}, "errors": []}))  # fmt: skip
    return path


def samples(every: float = 1.0) -> list[dict]:
    """The sampler's rows from locust's start (1.5 s before the stats reset) to its exit: the server idle
    while locust starts and spawns, then busy one core of two; locust itself busy a quarter of a core."""
    rows, wall = [], SPAWNED - 1.5
    while wall <= LAST_REQUEST + 0.6:
        server = max(0.0, wall - SPAWNED)  # CPU seconds so far
        rows.append({"t": wall - 900.0, "wall": wall, "busy": server * 1.25,
                     "cpu": {"server": server, "locust": 0.25 * (wall - SPAWNED + 1.5)}, "rss": {}})  # fmt: skip
        wall += every
    return rows


def test_cpu_per_text_is_over_locusts_stats_window(tmp_path):
    """run_locust took the CPU over the sampler's whole span (start-up included) for a run under ~5 s,
    and divided it by texts/s of locust's stats window: 0.68-3.36 ms a text where it was ~10.9."""
    result = locust_runs.parse_summary(summary(tmp_path, 400, SPAWNED, LAST_REQUEST))
    assert result["measured_s"] == 4.0 and result["rps"] == 100.0  # 400 texts in the 4 s measured
    figures = cpu_sampling.window_cpu(result, samples(), cores=2)
    assert figures["cpu_pct"]["server"] == 50.0  # one core of two, the idle start-up left out
    assert figures["server_cpu_ms_per_text"] == 10.0  # 1 core-second / 100 texts


def test_cpu_shares_are_of_the_cores_the_heading_counts(tmp_path, monkeypatch):
    """The heading named the process's cores (its affinity: 2) while the shares were divided by every core
    of the host (8): a server busy on one core of its two read 12.5%, and its CPU time per text held."""
    from app.machine import cpu

    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert cpu()["cores"] == 2
    result = locust_runs.parse_summary(summary(tmp_path, 400, SPAWNED, LAST_REQUEST))
    figures = cpu_sampling.window_cpu(result, samples())
    assert figures["cpu_pct"]["server"] == 50.0 and figures["server_cpu_ms_per_text"] == 10.0


def test_req_s_counts_answered_requests_only(tmp_path):
    """Locust's rate counts failures too: a server refusing every request at once (422 to a batch over its
    limit) showed a higher req/s than one answering them."""
    path = summary(tmp_path, 400, SPAWNED, LAST_REQUEST)
    raw = json.loads(path.read_text())
    raw["total"]["failures"] = 300
    path.write_text(json.dumps(raw))
    result = locust_runs.parse_summary(path)
    assert (result["rps"], result["sent_rps"]) == (25.0, 100.0)


def test_a_window_too_short_to_sample_shows_no_cpu_figure(tmp_path):
    """Where no two samples fall in the window, no figure from another window: '-' in the table."""
    result = locust_runs.parse_summary(summary(tmp_path, 5, SPAWNED, SPAWNED + 0.8))
    result |= cpu_sampling.window_cpu(result, samples(), cores=2)
    assert result["cpu_pct"] == {} and result["server_cpu_ms_per_text"] is None
    no_request = locust_runs.parse_summary(summary(tmp_path, 0, SPAWNED, None))
    assert (
        no_request["measured_s"] is None and cpu_sampling.window_cpu(no_request, samples())["cpu_pct"] == {}
    )
    row = load_reports.table(
        ["users", *load_reports.LOAD_HEADERS], [[1, *load_reports.load_row(result)]]
    ).splitlines()[-1]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[load_reports.LOAD_HEADERS.index("server CPU ms/text") + 1] == "-"
    assert cells[load_reports.LOAD_HEADERS.index("measured s") + 1] == "0.80"


def test_a_load_run_too_short_to_measure_is_refused():
    with pytest.raises(Exception, match="at least 5 s"):
        load_options.run_seconds("4")
    assert load_options.run_seconds("5") == 5.0


def test_engine_shapes_are_parsed():
    from benchmarks.speed import engine

    assert engine.parse_shapes("1x16, 8X64") == ((1, 16), (8, 64))
    assert engine.parse_args(["--shapes", "32x128"]).shapes == ((32, 128),)
    assert engine.parse_args([]).shapes == engine.SHAPES
    for bad in ("1x0", "16", "ax3", ",", "1x16,1x16"):
        with pytest.raises(Exception, match="shape"):
            engine.parse_shapes(bad)


def test_engine_keeps_the_shapes_it_finished_when_stopped(tmp_path):
    """The JSON was written once, at the end: a run killed during its last shape kept nothing."""
    from benchmarks.speed import engine
    from training.model import ElectraConfig

    shapes, out = ((1, 4), (1, 8)), tmp_path / "engine.json"

    def model(input_ids, **_feeds):  # the model timed; stopped (as by a signal) in the second shape
        if input_ids.shape == (1, 8):
            raise KeyboardInterrupt

    def finished(rows):
        engine.write_progress(out, {"threads": 1}, rows, shapes)

    with pytest.raises(KeyboardInterrupt):
        engine.time_shapes({}, model, ElectraConfig(), {"fp32": 1.0, "int8": 1.0}, shapes, finished)
    data = json.loads(out.read_text())
    assert data["complete"] is False and data["shapes_done"] == ["1x4"] and data["shapes"] == ["1x4", "1x8"]
    assert [(r["batch"], r["length"], r["engine"]) for r in data["rows"]] == [(1, 4, "transformers eager")]
    rows = data["rows"] + [{**data["rows"][0], "length": 8}]
    engine.write_progress(out, {"threads": 1}, rows, shapes)
    assert json.loads(out.read_text())["complete"] is True
