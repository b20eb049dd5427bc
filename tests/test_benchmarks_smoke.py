"""The HTTP benchmarks work end to end on tiny bundles: a few seconds of load, not a measurement.

1. Every server of serve_compare answers the same text with the same per-token probabilities (fp32
   bundle vs the transformers model it came from; LitServe and mosec alone and batched): the comparison
   is between equals.
2. load_profile drives our server with the realistic mix through locust and writes a table with no
   failed request; a SIGTERM to it stops the server it started.
3. bulk_aging runs its workload against a server per order (strict, then aged) and writes each order's
   figures, the aged-batch counter from /metrics among them, and the ratios to the strict order.
4. drain_direct SIGTERMs a server its keep-alive clients are sending to and counts what each request got.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

try:
    from app_fixtures import bundles_dir  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.app_fixtures import bundles_dir  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
TEXT = "The chef cooked the meal, and the guests ate it slowly in the garden."


@pytest.fixture(scope="module")
def bench(registry_data):
    # find_spec, not importorskip: importing locust would monkey-patch this process with gevent.
    for name in ("locust", "transformers", "psutil", "litserve", "mosec"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed (pip install -e .[bench])")
    return registry_data


@pytest.mark.slow
def test_all_compared_servers_give_the_same_probabilities(bench, bundles_dir: Path, tmp_path: Path):
    from benchmarks.load import peer_check, serving
    from benchmarks.load.loadmodels import prepare

    hf = bundles_dir.parent / (bundles_dir.name + "-hf") / "detector"  # what app_fixtures exported from
    models = prepare(str(hf), str(bundles_dir), "fp32", str(bench), with_classifier=False, work=tmp_path)
    assert models.hf_dir == hf

    def argv(kind: str):
        return lambda port: serving.command(
            kind, port, models_dir=models.bundle, bundle=models.bundle, hf_dir=models.hf_dir
        )

    texts = [TEXT, "short one", "A third text, of a length between the other two."]
    with serving.serve("ours", argv("ours"), tmp_path, timeout=90) as ours_server:
        ours = peer_check.ours_tokens(ours_server.url, texts)
        for kind in (k for k in serving.SERVERS if k != "ours"):
            with serving.serve(kind, argv(kind), tmp_path, timeout=90) as server:
                if kind in serving.PEERS:  # one text a request, alone and batched across requests
                    figures = peer_check.check(server.url, ours_server.url, texts)
                    assert figures["max_abs_diff_batched"] < 1e-4, kind
                    continue
                answers = serving.post_json(server.url + "/detect", {"texts": texts})["results"]
            theirs = [(r["tokens"], r["probs"]) for r in answers]
            for (tok_a, p_a), (tok_b, p_b) in zip(ours, theirs, strict=True):
                assert tok_a == tok_b, kind
                assert max(abs(a - b) for a, b in zip(p_a, p_b, strict=True)) < 1e-4, kind


@pytest.mark.slow
def test_load_profile_runs_locust_and_writes_a_table(bench, bundles_dir: Path, tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k != "ELECTRA_DATA_DIR"}
    cmd = [
        sys.executable, "-m", "benchmarks.load.load_profile", "--bundle", str(bundles_dir), "--users", "2",
        "--run-time", "5", "--mix", "detect:3,detect_batch:1,classify:1", "--batch-texts", "4",
        "--data-dir", str(bench), "--work", str(tmp_path / "work"), "--results", str(tmp_path), "--name", "smoke",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "| users | req/s |" in proc.stdout
    data = json.loads((tmp_path / "smoke.json").read_text())
    (step,) = data["steps"]
    assert step["requests"] > 0 and step["failures"] == 0, step["failure_messages"]
    # Locust draws each request from the mix at random: in 5 s every name is likely, not certain.
    assert (
        set(step["per_name"]) <= {"detect x1", "detect x4", "classify x1"} and "detect x1" in step["per_name"]
    )
    assert sum(v["requests"] for v in step["per_name"].values()) == step["requests"]
    assert step["p50_ms"] <= step["p99_ms"]
    # The figures' own window, from locust: about a second of the 5 goes to start-up and spawning.
    assert 2 < step["measured_s"] < 5 and step["run_time_s"] == 5
    assert (tmp_path / "smoke.md").read_text().startswith("## Load profile")


@pytest.mark.slow
def test_load_profile_on_a_url_sends_the_servers_api_key_and_refuses_without_it(
    bench, bundles_dir: Path, tmp_path: Path, monkeypatch, capsys
):
    """Against a server started with --api-key every request once failed with 401, and the run exited 0
    with its results written."""
    from benchmarks import cli
    from benchmarks.load import load_profile, serving

    monkeypatch.delenv("ELECTRA_API_KEY", raising=False)
    key, port = "bench-key-0123456789", serving.free_port()
    log = (tmp_path / "server.log").open("w")
    argv = [sys.executable, "-m", "app", "--models", str(bundles_dir), "--port", str(port), "--api-key", key,
            "--log-level", "warning"]  # fmt: skip
    server = subprocess.Popen(argv, cwd=REPO, env=serving.server_env(), stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        serving.wait_ready("keyed", server, url + "/ready", 90, lambda: (tmp_path / "server.log").read_text())
        common = ["--url", url, "--users", "1", "--run-time", "5", "--mix", "detect:2,classify:1",
                  "--data-dir", str(bench), "--work", str(tmp_path / "work"), "--name", "keyed"]  # fmt: skip
        for given, said in (([], "wants an API key"), (["--api-key", "not-the-key"], "to the API key given")):
            with pytest.raises(SystemExit) as stopped:
                cli.run(load_profile.main, [*common, *given, "--results", str(tmp_path / "refused")])
            assert stopped.value.code == 2 and said in capsys.readouterr().err
        assert not (tmp_path / "refused").exists()
        assert cli.run(load_profile.main, [*common, "--api-key", key, "--results", str(tmp_path)]) == 0
    finally:
        serving.stop(server)
        log.close()
    data = json.loads((tmp_path / "keyed.json").read_text())
    (step,) = data["steps"]
    assert step["requests"] > 0 and step["failures"] == 0, step["failure_messages"]
    assert data["config"]["api_key"] == "(given)" and key not in (tmp_path / "keyed.md").read_text()
    assert key not in json.dumps(data) and key not in capsys.readouterr().out
    assert "load generator's machine" in (tmp_path / "keyed.md").read_text()


def test_paced_users_keep_their_own_phase_and_never_burst():
    if importlib.util.find_spec("locust") is None:
        pytest.skip("locust is not installed (pip install -e .[bench])")
    # In a subprocess: importing locust monkey-patches the process with gevent.
    code = """
import time, types
from benchmarks.load.locustfile import ScoringUser
user = types.SimpleNamespace(period=0.5, next_at=time.perf_counter() + 0.2)
wait = ScoringUser.wait_time(user)
assert 0.6 < wait <= 0.7, wait  # the next slot of this user's own schedule, not 0.5 s from now
user.next_at = time.perf_counter() - 2.0  # the last answer came four periods late
assert ScoringUser.wait_time(user) == 0.0  # go now, once:
assert 0.45 < ScoringUser.wait_time(user) <= 0.5  # the missed slots are not fired in a burst
user.period = 0.0
assert ScoringUser.wait_time(user) == 0.0  # closed loop
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_interleaved_rounds_report_the_median_round_and_hide_no_failure():
    from benchmarks.load.serve_compare_rounds import median_round

    rounds = [
        {"rps": 150.0, "p50_ms": 7, "failures": 0, "requests": 1500},
        {"rps": 210.0, "p50_ms": 4, "failures": 2, "requests": 2100},
        {"rps": 170.0, "p50_ms": 6, "failures": 0, "requests": 1700},
    ]
    r = median_round(rounds)
    assert (r["rps"], r["p50_ms"]) == (170.0, 6)  # one whole round's figures, not a mix of rounds
    assert (r["failures"], r["requests"], r["median_round"]) == (0, 1700, 3)  # that round's counts too
    assert (r["all_rounds_failures"], r["all_rounds_requests"]) == (2, 5300)  # the others' beside them
    assert r["rounds_rps"] == [150.0, 210.0, 170.0]
    assert median_round(rounds[:2])["rps"] == 150.0  # an even count takes the lower middle


def test_an_even_rounds_figure_and_paired_ratio_take_the_same_middle():
    """With --rounds 4 a server's figure was the lower middle round, while the paired ratio averaged the
    two middle ratios: the two said different things of the same rounds."""
    from benchmarks.load.serve_compare_rounds import median_round, paired

    def rounds(*rps):
        return median_round([{"rps": x, "failures": 0, "requests": 10} for x in rps])

    ours, other = rounds(100.0, 120.0, 140.0, 160.0), rounds(100.0, 100.0, 100.0, 100.0)
    assert ours["rps"] == 120.0  # the lower middle round
    assert paired(ours, other) == "1.20 (ahead in 3 of 4)"  # not 1.30, the mean of 1.2 and 1.4


def test_a_median_rows_counts_are_its_own_and_every_rounds_are_beside_them():
    """The failures and requests were summed over the rounds but the error rate kept the median round's:
    "300/3600 (0.00%)"; then the rate was the sums', beside the median round's req/s, latencies and window.
    A row is now one round throughout, the sums under all_rounds_* (and in the targets and notes)."""
    from benchmarks.load.load_reports import load_row
    from benchmarks.load.serve_compare_rounds import median_round

    def r(rps, requests, failures, messages=()):
        return {"rps": rps, "texts_per_s": rps, "p50_ms": 5, "p95_ms": 9, "p99_ms": 10, "p99_over_p50": 2.0,
                "failures": failures, "requests": requests, "error_rate": failures / requests,
                "failure_messages": list(messages), "run_time_s": 6, "measured_s": 4.9, "cpu_pct": {}}  # fmt: skip

    m = median_round([r(100, 1000, 300, ["300x POST detect x1: HTTP 503"]), r(120, 1200, 0), r(140, 1400, 0)])
    assert (m["rps"], m["failures"], m["requests"], m["error_rate"]) == (120, 0, 1200, 0.0)  # round 2's
    assert "0/1200 (0.00%)" in load_row(m)
    assert (m["all_rounds_failures"], m["all_rounds_requests"]) == (300, 3600)
    assert m["all_rounds_error_rate"] == 300 / 3600
    # though round 2 is shown
    assert m["all_rounds_failure_messages"] == ["round 1: 300x POST detect x1: HTTP 503"]
    assert m["measured_load_s"] == 14.7  # what locust measured, not the 18 s asked


def test_rounds_are_whole_seconds_that_add_up_to_the_run_time(capsys):
    """Each round's time was rounded to a second (locust takes whole seconds): --run-time 10 --rounds 4
    gave four rounds of 2 s, 8 s of load, while the report said 10. And the report said the time asked,
    where locust measured about a second less a round: it says what was measured now."""
    from benchmarks import cli
    from benchmarks.load.serve_compare import main
    from benchmarks.load.serve_compare_report import load_s
    from benchmarks.load.serve_compare_rounds import round_times

    assert round_times(10, 4) == [3, 3, 2, 2]
    assert round_times(60, 3) == [20, 20, 20]
    assert round_times(10.4, 3) == [4, 3, 3]
    sat = {
        "ours": [{"users": 1, "measured_load_s": 16.2}],
        "unbatched": [{"users": 1, "measured_load_s": 16.6}],
    }
    assert load_s({"config": {"run_time": 20.0}, "saturation": sat}) == "16.2-16.6 s measured (20 s asked)"
    sat["ours"][0].pop("measured_load_s")
    assert load_s({"config": {"run_time": 20.0}, "saturation": sat}) == "20 s asked, measured: not known"
    with pytest.raises(SystemExit) as refused:
        cli.run(main, ["--run-time", "19", "--rounds", "4"])
    assert refused.value.code == 2 and "each round needs at least 5 s" in capsys.readouterr().err


def test_a_target_no_run_measured_is_marked_not_measured():
    """With one users step and --offered-rps none nothing ran below saturation, and the target once read
    "yes" all the same."""
    from benchmarks.load.serve_compare_report import MET
    from benchmarks.load.serve_compare_rounds import targets

    top = {"users": 16, "rps": 100.0, "failures": 0, "requests": 1000, "p99_over_p50": 2.0}

    def below(sat: dict, equal: dict) -> list:
        return [t["met"] for t in targets(sat, equal, 16) if "no failed request" in t["target"]]

    assert below({"ours": [top]}, {}) == [None, None] and MET[None] == "not measured"
    one_user = {**top, "users": 1, "failures": 2}
    paced = {"offered_rps": 70.0, "failures": 0}
    assert below({"ours": [one_user, top]}, {"ours": [paced]}) == [False, True]
    assert below({"ours": [top]}, {"ours": [{**paced, "offered_rps": 99.0}]}) == [None, None]  # saturated
    other_round = {**one_user, "failures": 0, "all_rounds_failures": 2}  # not in the median round
    assert below({"ours": [other_round, top]}, {}) == [False, None]


def test_bulk_is_compared_warm_with_warm_rivals_and_end_to_end():
    """The server and the plain loop are timed warm; bulk's steady rate (its workers' own clocks) is the
    like-for-like ratio, its wall rate (start-up included) the other. Both go to the JSON and the table."""
    from benchmarks.speed.bulk import _ratios, markdown

    def timed(tokens_per_s: float, steady: float | None = None) -> dict:
        return {"docs": 10, "tokens": 1000, "wall_s": 1000 / tokens_per_s, "docs_per_s": 1.0,
                "tokens_per_s": tokens_per_s, "steady_tokens_per_s": steady}  # fmt: skip

    row = {"corpus": "c", "model": "m", "local_1": timed(400, 500), "local_2": timed(800, 1200),
           "ray_1": timed(300, 450), "ray_2": timed(600, 1080), "server": timed(600), "plain_loop": timed(1600)}  # fmt: skip
    ratios = _ratios(row)
    assert ratios["bulk_vs_server_steady"] == 2.0 and ratios["bulk_vs_server"] == 1.33
    assert ratios["bulk_vs_plain_loop_steady"] == 0.75 and ratios["bulk_vs_plain_loop"] == 0.5
    assert ratios["ray_vs_local_steady"] == 0.9 and ratios["ray_vs_local_wall"] == 0.75
    machine = dict.fromkeys(
        ("cpu", "cores", "cpu_flags", "int8_kernel_path", "load_avg_start", "load_avg_end"), "-"
    )
    text = markdown({"results": [row], "ratios": [ratios], "memory": [], "machine": machine})
    assert "| c | m | 2.00 | 1.33 | 0.75 | 0.50 | 0.90 | 0.75 |" in text


def test_detectors_are_compared_column_by_column_from_their_results():
    from benchmarks.quality.compare_detectors import main, markdown

    results = REPO / "benchmarks" / "results" / "detector-gpu-2026-11-26"
    table = markdown({"shipped": results / "shipped", "gpu": results / "gpu-trained"}).splitlines()
    shipped = json.loads((results / "shipped" / "user_sentences.json").read_text())["summary"]["all"]
    gpu = json.loads((results / "gpu-trained" / "user_sentences.json").read_text())["summary"]["all"]
    assert f"| Commons | top1 | {shipped['top1']:.4g} | {gpu['top1']:.4g} |" in table
    # The first GPU comparison measured no classifier: its cells stay empty, the shipped one's are filled.
    accuracy = next(line for line in table if line.startswith("| sentiment via /classify | accuracy"))
    assert accuracy.endswith(" |  |") and "0.83" in accuracy
    with pytest.raises(SystemExit):
        main(["shipped=/no/such/directory"])
    # A directory of no results: an all-empty column read as results not measured, exit 0.
    with pytest.raises(SystemExit) as e:
        main([f"shipped={results / 'shipped'}", f"none={REPO / 'docs'}"])
    assert e.value.code == 2


def test_sigterm_to_a_load_benchmark_stops_the_server_it_started(bench, bundles_dir: Path, tmp_path: Path):
    """The server runs in a session of its own, so a SIGTERM to the benchmark (a `timeout`, a scheduler)
    reaches only the benchmark: it must stop the server (and locust) itself, and write no report."""
    import psutil

    env = {k: v for k, v in os.environ.items() if k != "ELECTRA_DATA_DIR"}
    cmd = [
        sys.executable, "-m", "benchmarks.load.load_profile", "--bundle", str(bundles_dir), "--users", "1",
        "--run-time", "300", "--mix", "detect:1", "--data-dir", str(bench), "--work", str(tmp_path / "work"),
        "--results", str(tmp_path / "results"),
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    started: list = []
    try:
        bench_proc, deadline = psutil.Process(proc.pid), time.monotonic() + 120
        while not any("locust" in " ".join(c.cmdline()) for c in bench_proc.children()):  # the load is on
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-2000:]
            time.sleep(0.2)
        started = bench_proc.children(recursive=True)
        assert any(c.cmdline()[1:3] == ["-m", "app"] for c in started)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM, proc.stdout.read()[-2000:]
        _, alive = psutil.wait_procs(started, timeout=10)
        assert not alive, [p.cmdline() for p in alive]  # the server and locust went with it
        assert not (tmp_path / "results").exists()
    finally:  # a failed run must not leave them behind either
        for p in started:
            with contextlib.suppress(psutil.Error):
                p.kill()
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_bulk_aging_runs_both_orders_and_reads_the_aged_counter(
    registry_data, bundles_dir: Path, tmp_path: Path
):
    """Two seconds of each order on the tiny bundles: not a measurement, the fields the docs cite."""
    if importlib.util.find_spec("psutil") is None:  # load_reports.machine()
        pytest.skip("psutil is not installed (pip install -e .[bench])")
    from benchmarks.load.bulk_aging import parse_orders

    assert parse_orders("0, default,250.0") == ["0", "default", "250"]
    env = {k: v for k, v in os.environ.items() if k != "ELECTRA_DATA_DIR"}
    cmd = [
        sys.executable, "-m", "benchmarks.load.bulk_aging", "--models", str(bundles_dir), "--mode", "sentence",
        "--seconds", "2", "--clients", "2", "--bulk-every-s", "0.5", "--data-dir", str(registry_data),
        "--work", str(tmp_path / "work"), "--results", str(tmp_path), "--name", "smoke",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "bulk_aging configuration: " in proc.stdout  # the resolved options, printed and saved
    data = json.loads((tmp_path / "smoke.json").read_text())
    assert data["config"]["orders"] == ["0", "default"] and data["machine"]["features"] is not None
    strict, aged = data["runs"]
    assert (strict["bulk_max_wait_ms"], aged["bulk_max_wait_ms"]) == (0, 1000)  # the default, as printed
    for run in (strict, aged):
        assert run["interactive_answered"] > 0 and run["bulk_answered"] == run["bulk_sent"] > 0, run["errors"]
        assert not run["errors"]
        assert run["bulk_p50_s"] <= run["bulk_max_s"] and run["interactive_p50_s"] <= run["interactive_p99_s"]
        assert isinstance(run["aged_bulk_batches"], int) and run["aged_bulk_batches"] >= 0
        assert run["server_settings"]["printed"]["bulk_max_wait_ms"] == run["bulk_max_wait_ms"]
    assert strict["aged_bulk_batches"] == 0  # 0: bulk work never goes first
    assert set(data["ratios"]) == {"default"} and "interactive_p99_s" in data["ratios"]["default"]
    assert (tmp_path / "smoke.md").read_text().startswith("## Bulk aging")


@pytest.mark.slow
def test_drain_direct_counts_every_request_as_what_its_client_saw(bundles_dir: Path, tmp_path: Path):
    """One round of four clients on the tiny bundles: not a measurement, the fields the docs cite."""
    if importlib.util.find_spec("psutil") is None:  # load_reports.machine()
        pytest.skip("psutil is not installed (pip install -e .[bench])")
    cmd = [sys.executable, "-m", "benchmarks.load.drain_direct", "--models", str(bundles_dir), "--rounds", "1",
           "--clients", "4", "--seconds", "1", "--work", str(tmp_path / "work"), "--results", str(tmp_path),
           "--name", "smoke"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "drain_direct configuration: " in proc.stdout
    (only,) = json.loads((tmp_path / "smoke.json").read_text())["rounds"]
    assert only["exit_code"] == 0 and only["answered_200"] > 0 and only["other"] == 0, only
    assert only["closed_unanswered"] == len(only["unanswered_sent_after_signal_s"])
    assert "| closed unanswered |" in (tmp_path / "smoke.md").read_text()
