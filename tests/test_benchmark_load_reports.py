"""serve_compare's and the other load programs' reports, with no server started: which code each server
runs, the settings recorded, the runs that did not measure the load they were meant to."""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

import pytest

from benchmarks.load import load_reports, locust_runs, serving
from benchmarks.load import serve_compare as sc
from benchmarks.load.loadmodels import REPO
from benchmarks.load.serve_compare_report import achieved, ratio_table
from benchmarks.load.serve_compare_rounds import targets
from benchmarks.load.serve_compare_servers import VARIANT, describe, launch


def _args(tmp_path: Path, **kw) -> argparse.Namespace:
    base = dict(server_args="--access-log", variant_args="--max-wait-ms 2", variant_checkout=str(tmp_path),
                litserve_args="--workers 1", mosec_args="")  # fmt: skip
    return argparse.Namespace(**(base | kw))


def test_each_server_runs_its_own_code_with_its_own_flags(tmp_path: Path):
    bundle = tmp_path / "bundle"
    cmd = {}
    for kind in ("ours", VARIANT, "litserve", "mosec"):
        argv_for, cwd = launch(kind, _args(tmp_path), bundle, None)
        cmd[kind] = (argv_for(19700), cwd)
    assert cmd[VARIANT][1] == tmp_path and cmd["ours"][1] == REPO and cmd["mosec"][1] == REPO
    assert cmd[VARIANT][0][2] == "app" and "--max-wait-ms" in cmd[VARIANT][0]
    assert "--access-log" in cmd["ours"][0] and "--access-log" not in cmd[VARIANT][0]
    assert "--workers" in cmd["litserve"][0] and "--access-log" not in cmd["mosec"][0]
    # --variant-args alone: the same code, other flags
    assert launch(VARIANT, _args(tmp_path, variant_checkout=None), bundle, None)[1] == REPO


def _row(users: int = 64, rps: float = 50.0, **kw) -> dict:
    return {"users": users, "rps": rps, "texts_per_s": rps, "p50_ms": 10, "p95_ms": 20, "p99_ms": 30,
            "p99_over_p50": 3.0, "requests": 500, "failures": 0, "error_rate": 0.0, "failure_messages": [],
            "measured_s": 9.5, "run_time_s": 10, "cpu_pct": {}, "server_cpu_ms_per_text": None} | kw  # fmt: skip


def _fake_run(tmp_path: Path, monkeypatch, row=_row, **kw) -> tuple[argparse.Namespace, list]:
    """serve_compare.run's arguments, with no server or locust started: each locust run gives row(users,
    offered_rps=...); the list collects (name, cwd, log name) of each server started."""
    started = []

    @contextlib.contextmanager
    def serve(name, argv_for, log_dir, cwd=REPO, log_name=None, **_):
        started.append((name, cwd, log_name))
        yield serving.Server(
            name, "http://127.0.0.1:19700", argparse.Namespace(pid=1), log_dir / (log_name or "x")
        )

    class Models:
        bundle, hf_dir, description = tmp_path, None, "m"

    sentences = tmp_path / "s.txt"
    sentences.write_text("one sentence\n")
    monkeypatch.setattr(serving, "serve", serve)
    monkeypatch.setattr(load_reports, "machine", lambda: {"cpu": "c", "cores": 2, "int8_kernel_path": "AVX2",
                                                "features": ["avx2"], "load_avg_at_start": [0, 0, 0]})  # fmt: skip
    monkeypatch.setattr(locust_runs, "run_locust", lambda url, users, load, prefix, user_rate=0.0, **_: locust_runs.check_run(
        row(users, offered_rps=round(users * user_rate, 2) if user_rate else None)))  # fmt: skip
    monkeypatch.setattr(serving, "idle_cpu", lambda server: 0.1)
    monkeypatch.setattr(serving, "pause", lambda server, paused: None)
    monkeypatch.setattr(serving, "server_settings", lambda server: None)
    monkeypatch.setattr(sc, "prepare", lambda *a, **k: Models)
    monkeypatch.setattr(sc, "write_sentences", lambda *a, **k: {"file": str(sentences), "source": "s",
                                                                 "mean_words": 2})  # fmt: skip
    run = dict(servers=["ours", VARIANT], work=str(tmp_path), name="t", results=str(tmp_path),
               model=None, bundle=None, precision="int8", data_dir=None, hf=None, mix="detect:1",
               batch_texts=8, run_time=10.0, detect_return="both", rounds=2, users=(64,),
               offered_rps=["auto"], fraction=0.7, no_pause=False)  # fmt: skip
    return _args(tmp_path, **(run | kw)), started


def test_both_phases_start_the_variant_from_its_checkout_with_logs_of_their_own(tmp_path, monkeypatch):
    """The equal-load phase ran `ours-variant` from this checkout, over the saturation phase's log."""
    args, started = _fake_run(tmp_path, monkeypatch)
    assert sc.run(args) == 0
    variant = [(cwd, log) for name, cwd, log in started if name == VARIANT]
    assert variant == [
        (tmp_path, "ours-variant-saturation-server.log"),
        (tmp_path, "ours-variant-equal-server.log"),
    ]
    assert len({log for _, _, log in started}) == len(started) == 4


def test_a_comparison_where_most_requests_failed_exits_1_and_offers_no_load_from_its_failures(
    tmp_path, monkeypatch, capsys
):
    """--batch-texts 40 to ours and unbatched: every request refused (422), yet exit 0, a ratio and the
    targets judged; and 'auto' offered 70% of a rate of failures. Now the report is written, no
    equal-load phase runs, and the run ends with exit 1 naming the steps."""
    refused = lambda users, **kw: _row(users, rps=0.0, failures=500, error_rate=1.0,  # noqa: E731
                                        failure_messages=["500x POST detect x40: HTTP 422"], **kw)  # fmt: skip
    args, started = _fake_run(tmp_path, monkeypatch, refused, servers=["ours", "unbatched"])
    assert sc.run(args) == 1
    assert [log for _, _, log in started] == ["ours-saturation-server.log", "unbatched-saturation-server.log"]
    err = capsys.readouterr().err
    assert "most requests failed" in err and "ours at 64 users: 1000 of 1000 requests failed" in err
    assert (tmp_path / "t.json").is_file()


def test_a_run_short_of_its_offered_load_or_stalled_is_flagged_and_not_counted_as_meeting_a_target():
    """The reviewer's run: 38 req/s offered, 11.7 achieved over 26.6 s for 10 s asked; its target read yes."""
    bad = locust_runs.check_run(_row(rps=11.7, offered_rps=38.0, measured_s=26.6, run_time_s=10))
    good = locust_runs.check_run(_row(rps=37.9, offered_rps=38.0, measured_s=9.8, run_time_s=10))
    assert bad["achieved_share"] == 0.308 and len(bad["warnings"]) == 2 and good["warnings"] == []
    assert locust_runs.check_run(_row(measured_s=30.0))["warnings"]  # a closed-loop run that stalled
    assert locust_runs.check_run(_row())["achieved_share"] is None
    sat = {"ours": [_row(rps=100.0)]}
    below = targets(sat, {"ours": [bad]}, 64)[-1]
    assert below["met"] is None and "left out" in below["value"]
    assert targets(sat, {"ours": [good, bad]}, 64)[-1]["met"] is True
    assert "(!)" in load_reports.marked("ours", bad) and load_reports.marked("ours", good) == "ours"
    assert achieved(bad) == "31% NO" and achieved(good) == "100%"


def test_a_throughput_target_judges_the_paired_ratio_the_report_gives():
    """With --rounds 4 the target divided each server's lower middle round (160 / 100: 1.6x, met), while
    the paired ratio the text reports, the lower middle of the round-by-round ratios, read 1.40."""
    from benchmarks.load.serve_compare_rounds import median_round, paired

    def rounds(*rps):
        return median_round([_row(rps=x) for x in rps])

    ours, other = rounds(140.0, 280.0, 160.0, 170.0), rounds(100.0, 200.0, 100.0, 100.0)
    assert ours["rps"] / other["rps"] == 1.6 and paired(ours, other).startswith("1.40 ")
    target = next(
        t for t in targets({"ours": [ours], "unbatched": [other]}, {}, 64) if "unbatched" in t["target"]
    )
    assert (target["value"], target["met"]) == ("1.40x", False)


def test_failures_at_an_offered_load_count_against_ours_and_a_baseline_answering_none_measures_no_ratio():
    """req/s counts answered requests: a run at its offered rate with 10% failed read as a load it missed
    (left out of the no-failure target, "not measured"), and a baseline failing every request made ours
    "infx", its throughput targets met."""
    failing = locust_runs.check_run(
        _row(rps=63.0, sent_rps=70.0, offered_rps=70.0, requests=2100, failures=210)
    )
    assert failing["achieved_share"] == 1.0 and failing["warnings"] == []
    assert targets({"ours": [_row(rps=100.0)]}, {"ours": [failing]}, 64)[-1]["met"] is False
    dead = _row(rps=0.0, sent_rps=900.0, requests=900, failures=900)
    ratios = [
        t
        for t in targets({"ours": [_row(rps=100.0)], "transformers": [dead]}, {}, 64)
        if "throughput" in t["target"]
    ]
    assert ratios and all(t["met"] is None and "answered no request" in t["value"] for t in ratios), ratios


def test_the_report_leads_with_the_paired_ratio_and_labels_the_other_unpaired():
    table = "\n".join(
        ratio_table([{"users": 1, "ours/mosec": 1.76, "ours/mosec, paired": "1.75 (ahead in 2 of 2)"}])
    )
    head = table.splitlines()[2]
    assert head.index("mosec, paired") < head.index("mosec, unpaired: median rows of different rounds")
    assert "| 1 | 1.75 (ahead in 2 of 2) | 1.76 |" in table


LOG = """settings:
  host                   = '127.0.0.1'
  api_key                = '***'
  batch_token_budget     = 16384
  max_wait_ms            = 0.0
  runners                = 2
  intra_op_threads       = 0 (auto: 1 per runner)
  solo_threads           = 0 (auto: 2, every core)
  memory_limit_mb        = 0 (auto: none, no cgroup limit)
2026-12-01 04:13:10 WARNING app: something
"""


def test_the_settings_a_server_resolved_are_read_from_what_it_printed():
    said = serving.printed_settings(LOG)
    assert said["resolved"] == {"runners": 2, "threads_per_runner": 1, "solo_threads": 2, "max_wait_ms": 0.0,
                                "batch_token_budget": 16384}  # fmt: skip
    assert "api_key" not in said["printed"] and said["printed"]["host"] == "127.0.0.1"
    off = LOG.replace("0 (auto: 2, every core)", "1 (off, no more than a runner's threads)")
    assert serving.printed_settings(off)["resolved"]["solo_threads"] == 0
    assert serving.printed_settings("no block here") is None
    assert "2 runners x 1 thread(s)" in serving.describe_settings(said["resolved"])


def test_an_explicit_solo_threads_that_turns_the_solo_session_off_is_said_at_start():
    from app.settings import Settings

    settings, _ = Settings.from_sources(
        ["--runners", "1", "--intra-op-threads", "1", "--solo-threads", "1"], env={}
    )
    assert "solo_threads           = 1 (off" in settings.describe()


def test_a_peer_without_flags_is_described_by_its_resolved_defaults():
    from benchmarks.load.baselines.common import peer_settings

    assert peer_settings("mosec", []) == {"workers": 2, "threads": 1, "max_batch_size": 16, "max_wait_ms": 1}
    assert peer_settings("litserve", ["--workers", "1", "--threads", "2"])["threads"] == 2
    text = describe("mosec", argparse.Namespace(mosec_args=""))
    assert (
        "its defaults here" not in text and "workers 2, threads 1, max_batch_size 16, max_wait_ms 1" in text
    )


def test_soak_says_how_often_it_sampled_its_cpu_and_its_servers_settings():
    from benchmarks.load.soak import markdown

    soak = locust_runs.check_run(_row(users=64, rps=20.0, offered_rps=40.0, measured_s=59.0, run_time_s=60))
    data = {"config": {"mix": "detect:1", "users": 64, "minutes": 1, "warmup_s": 15, "sample_s": 5.0,
                       "max_growth": 5.0, "fraction": 0.7},
            "sentences": {"source": "s"}, "model": "m", "probe": None, "offered_rps": 40.0, "soak": soak,
            "memory": {"warmup_s": 15}, "minutes": [], "passed": {"rss_growth": True, "no_failures": True},
            "machine": {"cpu": "c", "cores": 2, "int8_kernel_path": "AVX2", "features": ["avx2"],
                        "load_avg_at_start": [0, 0, 0]},
            "server_settings": serving.printed_settings(LOG)}  # fmt: skip
    text = markdown(data)
    assert "sampled every 5 s in the soak" in text and "once a second" not in text
    assert "2 runners x 1 thread(s)" in text and "soak (!)" in text and "sent 20 of 40" in text


def test_a_machine_is_described_with_its_cpu_features_by_every_load_report():
    import inspect

    from benchmarks.load import faults, rolling

    for module in (sc, rolling, faults):
        source = inspect.getsource(module.markdown)
        assert "describe_cpu(m)" in source and "m['cores']" not in source


def test_bulk_stores_no_ratio_where_a_steady_rate_is_missing():
    from benchmarks.speed.bulk import _ratios

    def timed(tokens_per_s: float, steady: float | None = None) -> dict:
        return {"tokens_per_s": tokens_per_s, "steady_tokens_per_s": steady}

    row = {"corpus": "c", "model": "m", "local_2": timed(800), "ray_2": timed(600, 1080), "server": timed(600),
           "plain_loop": timed(1600)}  # fmt: skip
    ratios = _ratios(row)
    assert ratios["ray_vs_local_steady"] is None and ratios["bulk_vs_server_steady"] is None
    assert ratios["ray_vs_local_wall"] == 0.75


def test_a_load_profile_stopped_part_way_keeps_the_steps_it_finished(tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM after a step had finished wrote nothing: the report came only after the last."""
    from benchmarks.load import load_options, load_profile

    def run_locust(url, users, load, prefix, **_):
        if users == 64:
            raise KeyboardInterrupt  # what benchmarks.cli makes of SIGTERM too
        return locust_runs.check_run(_row(users, per_name={"detect x1": _row(users)}))

    monkeypatch.setattr(locust_runs, "run_locust", run_locust)
    monkeypatch.setattr(load_options, "check_answers", lambda *a, **k: None)
    monkeypatch.setattr(load_profile, "write_sentences", lambda *a, **k: {"file": "s.txt", "source": "s",
                                                                           "count": 1, "mean_words": 2})  # fmt: skip
    monkeypatch.setattr(load_reports, "machine", lambda: {"cpu": "c", "cores": 2, "int8_kernel_path": "AVX2",
                                                "features": ["avx2"], "load_avg_at_start": [0, 0, 0]})  # fmt: skip
    cfg = load_profile.ProfileConfig(url="http://127.0.0.1:9", users=(1, 16, 64), run_time=5.0, mix="detect:1",
                                     work=str(tmp_path), results=tmp_path)  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        load_profile.run(cfg)
    data = json.loads((tmp_path / "load_profile.json").read_text())
    assert data["complete"] is False and data["users_done"] == [1, 16] and len(data["steps"]) == 2
    assert "stopped part way: 2 of 3 users steps measured" in (tmp_path / "load_profile.md").read_text()
