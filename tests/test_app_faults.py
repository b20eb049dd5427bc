"""When ONNX Runtime fails inside a batch (--inject-faults, app/model/faults.py): the failing request gets a JSON 500
that names the failure, its batch-mates are retried without it and answered, the server goes on, and
/metrics counts it. Against a real server process."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from app.model.faults import FaultSpec, FaultSpecError
from app.settings import Settings, SettingsError

try:
    from app_fixtures import bundles_dir, run_server, wait_for  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.app_fixtures import bundles_dir, run_server, wait_for  # noqa: F401

TEXTS = [
    "The chef cooked the meal in the old kitchen.",
    "A river flows north through the valley.",
    "She played the violin at the concert last night.",
    "Prices rose again in the spring.",
    "The committee will publish its report next week.",
    "Rain fell on the town for three days.",
    "He left the house early to catch the train.",
]


def single_token_word(bundle: Path, text: str) -> str:
    """A word of `text` that the bundle's tokenizer keeps whole, and that no other text holds."""
    tok = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    others = " ".join(TEXTS).lower().split()
    for word in text.lower().rstrip(".").split():
        if len(tok.encode(word, add_special_tokens=False).ids) == 1 and others.count(word) == 0:
            return word
    raise AssertionError(f"no single-token word unique to {text!r}")


def test_a_poisoned_request_fails_alone_and_its_batch_mates_are_answered(bundles_dir: Path, tmp_path):
    poisoned = "The army marched past the church toward the island."
    word = single_token_word(bundles_dir / "detector", poisoned)
    # One runner that waits for its batch to fill, no solo session: the eight requests share one batch.
    # --log-level warning: the access lines, asked for, are written still (they once went with the INFO lines).
    flags = (
        "--log-level",
        "warning",
        "--inject-faults",
        f"poison={word}",
        "--runners",
        "1",
        "--solo-threads",
        "1",
        "--max-wait-ms",
        "300",
    )
    with (
        run_server(bundles_dir, *flags, "--access-log", log_dir=tmp_path) as server,
        server.client() as client,
    ):
        texts = [*TEXTS[:3], poisoned, *TEXTS[3:]]
        with ThreadPoolExecutor(len(texts)) as pool:
            answers = list(pool.map(lambda i: client.post("/detect", json={"text": texts[i]},
                                                          headers={"x-request-id": f"trace-{i}"}), range(len(texts))))  # fmt: skip
        failed = answers.pop(3)
        assert failed.status_code == 500, failed.text
        error = failed.json()["error"]
        assert error["type"] == "inference_failed"
        assert "InjectedFault" in error["message"] and word in error["message"]
        assert [a.status_code for a in answers] == [200] * len(TEXTS)
        assert server.metric("electra_engine_failures_total", model="detector", run="batch") >= 1
        retried = server.metric("electra_retried_requests_total", model="detector", outcome="answered")
        assert retried >= 1  # the batch-mates that shared the poisoned batch
        assert server.metric("electra_retried_requests_total", model="detector", outcome="failed") == 1
        assert server.metric("electra_engine_failures_total", model="detector", run="retry") == 1
        # The operator hears of it too, with the traceback and the request's id, not only the client.
        said = "detector: a request failed again alone; answered 500 inference_failed (x-request-id trace-3)"
        assert said in server.log()
        assert "POST /detect 500" in server.log() and "x-request-id=trace-3" in server.log()  # the access log
        assert "loaded and warmed up" not in server.log()  # an INFO line: --log-level warning holds for them
        assert "Traceback" in server.log() and "InjectedFault" in server.log()
        # A path's CR LF (percent-encoded, decoded by the server) cannot begin a line of its own in the log,
        # nor its spaces write fields of their own into the access line (a 200 and a model for a 404).
        assert client.get("/x%0d%0a2026-01-01 00:00:00,000 INFO app: forged%1b[31m").status_code == 404
        assert client.get("/y%20200%201.0%20ms%20model=detector").status_code == 404
        lines = server.log().splitlines()
        assert not any(line.startswith("2026-01-01") for line in lines) and "\x1b" not in server.log()
        assert any("GET /x%0D%0A2026-01-01%2000:00:00,000%20INFO%20app:%20forged%1B%5B31m 404 -" in line
                   for line in lines)  # fmt: skip
        assert any("GET /y%20200%201.0%20ms%20model=detector 404 - model=-" in line for line in lines)
        # The server goes on serving, and the requests' queue is empty again.
        assert client.post("/detect", json={"text": TEXTS[0]}).status_code == 200
        assert server.metric("electra_queue_depth", model="detector") == 0
        # A client resending the text that breaks the engine fails run after run (4 in a row here), but
        # /ready's probe, a clean row, runs: the replica stays in rotation for everyone else.
        assert [client.post("/detect", json={"text": poisoned}).status_code for _ in range(2)] == [500, 500]
        ready = client.get("/ready")
        assert ready.status_code == 200 and ready.json()["status"] == "ready", ready.text
        assert server.metric("electra_engine_failures_total", model="detector", run="probe") == 0
        assert "/ready's one-row probe ran: the engine works" in server.log()


def test_a_transient_fault_is_retried_and_no_client_sees_it(bundles_dir: Path, tmp_path):
    flags = ("--inject-faults", "every=2", "--solo-threads", "1")
    with run_server(bundles_dir, *flags, log_dir=tmp_path) as server, server.client() as client:
        codes = [client.post("/detect", json={"text": t}).status_code for t in TEXTS[:4]]
        assert codes == [200] * 4  # runs 1 ok; 2 fails, retried as 3; 4 fails, retried as 5; ...
        assert server.metric("electra_engine_failures_total", model="detector", run="batch") >= 2
        assert server.metric("electra_retried_requests_total", model="detector", outcome="answered") >= 2


def test_a_fault_that_persists_takes_the_replica_out_of_readiness_until_the_engine_runs_again(
    bundles_dir: Path, tmp_path
):
    """Every request fails with a JSON 500, and past --unready-after-failures (3) failed runs in a row /ready
    probes the engine itself: 503 "failing" while the probe fails too, at most one probe a second however
    often /ready is asked, and ready again once a probe runs. It stayed 200 "ready" while every request
    failed, and a balancer kept sending the replica its traffic. /health (liveness) stays 200."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "detector").symlink_to(bundles_dir / "detector")  # one model: every served one fails
    # Runs 1-4: two requests, each failing in its batch and alone; 5: the first probe; 6 on: no fault.
    flags = ("--inject-faults", "first=5", "--solo-threads", "1")
    with run_server(models, *flags, log_dir=tmp_path) as server, server.client() as client:
        r = client.post("/detect", json={"text": TEXTS[0]})
        assert r.status_code == 500
        assert r.json()["error"]["type"] == "inference_failed" and "twice" in r.json()["error"]["message"]
        assert client.get("/ready").json()["status"] == "ready"  # 2 failures: a bad input can do that much
        assert client.post("/detect", json={"text": TEXTS[1]}).status_code == 500
        ready = client.get("/ready")
        assert ready.status_code == 503 and ready.json()["status"] == "failing", ready.text
        assert (
            "InjectedFault" in ready.json()["failing"]["detector"]
            and "probe" in ready.json()["failing"]["detector"]
        )
        for _ in range(5):  # within the second: the last probe's verdict, no new probe
            assert client.get("/ready").status_code == 503
        assert server.metric("electra_engine_failures_total", model="detector", run="probe") == 1
        assert server.metric("electra_bundle_failing", model="detector") == 1
        assert "detector" in client.get("/models").json()["failing"]
        assert client.get("/health").status_code == 200  # alive: out of rotation, not restarted
        assert "answered 500 inference_failed" in server.log()
        # The fault clears; no request comes (out of rotation): /ready's next probe brings it back.
        wait_for(lambda: client.get("/ready").status_code == 200, timeout=10, what="/ready 200 again")
        assert client.get("/ready").json()["status"] == "ready"
        assert server.metric("electra_bundle_failing", model="detector") == 0
        assert "detector: failing, /ready leaves rotation" in server.log()
        assert "detector: the engine runs again" in server.log()
        assert client.post("/detect", json={"text": TEXTS[0]}).status_code == 200


@pytest.mark.parametrize("spec", ["every=0", "poison=", "sometimes", "every=x"])
def test_a_bad_fault_spec_is_refused_naming_the_setting(spec):
    with pytest.raises(FaultSpecError):
        FaultSpec.parse(spec)
    with pytest.raises(SettingsError, match="--inject-faults"):
        Settings.from_sources(["--inject-faults", spec], env={})


def test_faults_are_off_by_default():
    settings, _ = Settings.from_sources([], env={})
    assert FaultSpec.parse(settings.inject_faults) is None


def scheduling(*, interactive_tokens: int = 2048):
    """A real engine on the shipped detector, with the admission and load a scheduler of it needs."""
    from app.metrics import Metrics
    from app.model.bundle import read_bundle
    from app.model.engine import Engine
    from app.scheduling.admission import Admission
    from app.scheduling.lifecycle import Lifecycle
    from app.scheduling.server_load import ServerLoad

    engine = Engine(read_bundle(Path(__file__).resolve().parent.parent / "models" / "detector"), 1)
    load = ServerLoad()
    admission = Admission("detector", queue_size=8, interactive_tokens=interactive_tokens, max_bulk_tokens=10**6,
                          lifecycle=Lifecycle(), load=load, series=Metrics().of_model("detector"))  # fmt: skip
    return engine, admission, load


def a_row(*ids: int):
    import numpy as np

    from app.model.tokenization import Row

    ids = ids or (101, 2023, 2003, 102)
    return Row(np.array(ids), np.zeros(len(ids), dtype=np.int64))


def test_a_bug_around_a_run_answers_its_requests_500_and_the_runner_goes_on():
    """An exception outside the run itself (padding the batch, here) used to end the runner's task: its
    requests waited for ever, holding their places, and the next requests found no runner."""
    import asyncio

    from app.errors import AppError, ErrorType
    from app.scheduling.scheduler import Scheduler

    engine, admission, load = scheduling()
    pad, calls = engine.pad, []

    def pad_failing_once(rows, pad_id):
        calls.append(len(rows))
        if len(calls) == 1:
            raise ValueError("a bug in padding")
        return pad(rows, pad_id)

    engine.pad = pad_failing_once

    async def two_requests():
        scheduler = Scheduler(engine, 0, admission, load, token_budget=4096, bulk_token_budget=4096,
                              max_wait_ms=0, runners=1)  # fmt: skip
        scheduler.start()
        try:
            answers = []
            for _ in range(2):
                with admission.request():
                    try:
                        answers.append(await asyncio.wait_for(scheduler.submit([a_row()]), 30))
                    except AppError as e:
                        answers.append(e)
            return answers
        finally:
            await scheduler.close()
            scheduler.running.shutdown()

    first, second = asyncio.run(two_requests())
    assert isinstance(first, AppError) and first.type is ErrorType.INTERNAL, first
    assert len(second.outputs) == 1 and admission.admitted == 0


def test_bulk_work_that_comes_while_a_runner_gathers_takes_an_idle_runner():
    """One runner waits (--max-wait-ms) for company for a lone sentence; a bulk request that came then
    woke no other runner, and waited for the gathering and its batch."""
    import asyncio

    from app.errors import ErrorType
    from app.scheduling.scheduler import Scheduler

    engine, admission, load = scheduling(interactive_tokens=2)  # a four-token row is bulk

    async def gathering_then_bulk():
        scheduler = Scheduler(engine, 0, admission, load, token_budget=4096, bulk_token_budget=4096,
                              max_wait_ms=20_000, runners=2)  # fmt: skip
        scheduler.start()
        with admission.request(), admission.request():
            interactive = scheduler.submit([a_row(101, 102)])
            await asyncio.sleep(0.2)  # a runner is gathering now
            try:
                bulk = await asyncio.wait_for(scheduler.submit([a_row()]), 10)
                return interactive.done(), bulk
            finally:
                await scheduler.close()  # the interactive request, still gathering, is answered 503
                scheduler.running.shutdown()
                assert interactive.exception().type is ErrorType.UNAVAILABLE

    interactive_done, bulk = asyncio.run(gathering_then_bulk())
    assert not interactive_done and len(bulk.outputs) == 1
