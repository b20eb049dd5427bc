"""Under a memory limit (app/scheduling/memory.py) every batch is cut to its engine session's share of the room;
where not even a row per session fits, the split of before: interactive batches are cut to one row and get a
share, and every large request is refused 413; one-sentence requests are served. The budget's arithmetic, and a real
server on the shipped models (the cgroup files: test_app_cgroup.py)."""

from __future__ import annotations

import logging
import re
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.errors import AppError, ErrorType
from app.scheduling import memory
from app.scheduling.forming import Job, Lane, Step, next_step
from app.scheduling.memory import HEADROOM, MIB, MemoryBudget, bulk_batches, plan, settle

try:
    from app_fixtures import run_server
except ImportError:  # tests/ made a package
    from tests.app_fixtures import run_server

REPO = Path(__file__).resolve().parents[1]
LONG = "The river flows past the old mill, where the village once ground its grain. " * 80  # ~1.4k tokens


def budget(limit_mib: int, baseline_mib: int, per_token: float) -> MemoryBudget:
    b = MemoryBudget(limit_mib * MIB, "test")
    b.measured(per_token)
    b.settle()
    b.baseline = baseline_mib * MIB  # as if this much were resident
    return b


def _models(n: int, budget: int, max_length: int | list[int] = 512, bulk_budget: int = 4096) -> dict:
    """What plan reads of a served model: its longest row and its two lanes."""
    lengths = max_length if isinstance(max_length, list) else [max_length] * n
    return {f"m{i}": SimpleNamespace(bundle=SimpleNamespace(manifest=SimpleNamespace(max_length=lengths[i])),
                                     scheduler=SimpleNamespace(lanes={False: Lane(budget, bulk=False),
                                                                      True: Lane(bulk_budget, bulk=True)}))
            for i in range(n)}  # fmt: skip


def _settings(runners: int = 2, interactive_tokens: int = 256) -> SimpleNamespace:
    return SimpleNamespace(runners=runners, batch_token_budget=16384, bulk_batch_budget=4096,
                           interactive_tokens=interactive_tokens)  # fmt: skip


def test_the_room_is_what_headroom_of_the_limit_leaves_above_the_models():
    b = budget(1000, 500, per_token=30_000)
    assert b.room == int(HEADROOM * 1000 * MIB) - 500 * MIB


def test_a_large_request_admitted_before_the_server_settled_is_not_refused():
    """The first model serves while the next loads: nothing is planned yet, and a large request is served,
    though once the server has settled at this baseline every one of them gets 413."""
    b = MemoryBudget(600 * MIB, "test")
    b.check_large()  # before settle: no price, no baseline
    b.measured(30_000)
    b.settle()
    b.baseline = 500 * MIB
    b.interactive_tokens = 256
    plan(b, _settings(), _models(2, 16384))
    with pytest.raises(AppError) as too_big:
        b.check_large()
    assert too_big.value.type is ErrorType.TOO_MANY_TOKENS


def test_where_not_even_a_row_per_session_fits_interactive_batches_get_one_row_and_large_requests_413(caplog):
    b = budget(600, 500, per_token=30_000)  # 40 MiB above the models; four 512-token rows need ~59 MiB
    b.interactive_tokens = 256
    models = _models(2, 16384)
    with caplog.at_level(logging.WARNING, logger="app"):
        batch = plan(b, _settings(), models)
    assert not b.by_session and batch == 512
    # Interactive batches of one row each, that much kept for them; bulk batches cut to one row too.
    assert all(
        m.scheduler.lanes[False].budget == m.scheduler.lanes[True].budget == 512 for m in models.values()
    )
    assert b.interactive == 4 * b.cost(512, 512) and b.refuses_large
    assert "even batches of one 512-token row may not all fit the 40 MiB" in caplog.text
    assert "interactive batches are cut to one row" in caplog.text
    # Every large request, whatever its size, is refused, and told what is served.
    with pytest.raises(AppError) as too_big:
        b.check_large()
    message = too_big.value.message
    assert too_big.value.type is ErrorType.TOO_MANY_TOKENS and "600 MiB" in message, message
    assert f"{b.interactive / MIB:.0f} MiB kept for interactive batches" in message, message
    assert "send at most 256 model-input tokens per request" in message, message
    assert f"about {b.cost(257, 512) / MIB:.0f} MiB" in message, message


def test_bulk_batches_are_cut_to_one_row_of_the_longest_model():
    b = budget(600, 500, per_token=30_000)  # room 40 MiB: one 512-token row costs ~15 MiB
    models = _models(2, 16384, max_length=[256, 512])
    assert plan(b, _settings(), models) == 512
    assert [m.scheduler.lanes[True].budget for m in models.values()] == [512, 512]
    assert [m.scheduler.lanes[False].budget for m in models.values()] == [512, 512]


def test_without_a_measured_price_nothing_is_cut_and_only_a_room_below_zero_refuses():
    """The measurement at load saw no rise (or there is no /proc): nothing to cut by; large requests get
    413 only where the models alone take more than HEADROOM of the limit."""
    for baseline_mib, refused in ((500, False), (600, True)):
        b = budget(600, baseline_mib, per_token=0.0)
        models = _models(2, 16384)
        assert plan(b, _settings(), models) == 4096 and not b.by_session and b.interactive == 0
        assert all(m.scheduler.lanes[False].budget == 16384 for m in models.values())
        assert all(m.scheduler.lanes[True].budget == 4096 for m in models.values())
        assert b.refuses_large is refused


def _settle(b: MemoryBudget, baseline_mib: int, settings, models, monkeypatch) -> None:
    """settle() as the registry calls it, resident memory read as `baseline_mib`."""
    monkeypatch.setattr(memory, "rss", lambda: baseline_mib * MIB)
    gauge = SimpleNamespace(labels=lambda what: SimpleNamespace(set=lambda value: None))
    settle(b, settings, SimpleNamespace(memory=gauge), models)


def test_the_start_warning_counts_one_requests_bulk_batches_on_every_runner_that_may_take_them(
    caplog, monkeypatch
):
    """With --runners 3 a model runs two bulk batches at once, and both may be one request's: a free runner
    forms the next of its batches while the first runs. The warning counts both."""
    bulk, interactive = Lane(4096, bulk=True), Lane(16384, bulk=False)
    long = Job([SimpleNamespace(ids=[7] * 512) for _ in range(24)], Future(), bulk=True)
    bulk.push(long)
    running = []
    for _ in range(
        bulk_batches(SimpleNamespace(runners=3))
    ):  # bulk_running < 2 lets a second runner take bulk
        step, lane = next_step(interactive, bulk, bulk_allowed=len(running) < 3 - 1)
        if step is Step.FORM:
            lane.take()
            step, lane = next_step(interactive, bulk, bulk_allowed=len(running) < 3 - 1)
        assert step is Step.CLAIM
        running.append(lane.claim())
    assert {job for batch in running for job, _ in batch.items} == {long} and len(running) == 2
    assert bulk_batches(SimpleNamespace(runners=2)) == bulk_batches(SimpleNamespace(runners=1)) == 1
    for runners, said in ((3, "2 bulk batches at once (--runners 3, one fewer) of 512 tokens"),
                          (2, "one bulk batch of 512 tokens")):  # fmt: skip
        b = MemoryBudget(600 * MIB, "test")
        b.measured(30_000)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="app"):
            _settle(b, 500, _settings(runners=runners), _models(2, 16384), monkeypatch)
        at_once = 2 if runners == 3 else 1
        assert f"{said} (a row of the longest model, the least a batch holds) needs about " \
               f"{b.cost(512 * at_once, 512 * at_once) / MIB:.0f} MiB" in caplog.text, caplog.text  # fmt: skip
        assert "requests over --interactive-tokens (256) will be refused (413)" in caplog.text, caplog.text


def test_models_past_the_limit_alone_are_told_so_not_that_0_mib_is_left(caplog, monkeypatch):
    """At --memory-limit-mb 350 the shipped models take 378 MiB with two runners: the start said "0 MiB above
    the models". Every session's memory is resident in that baseline (258 MiB with one runner), so fewer
    runners are advice that helps, beside a higher limit."""
    b = MemoryBudget(350 * MIB, "--memory-limit-mb")
    b.measured(30_000)
    with caplog.at_level(logging.INFO, logger="app"):
        _settle(b, 378, _settings(runners=2), _models(2, 16384), monkeypatch)
    assert "none above the models: they pass 90% of the limit by 63 MiB" in caplog.text, caplog.text
    assert ("the loaded models take 378 MiB, more than the 315 MiB (90% of the 350 MiB limit, --memory-limit-mb) "
            "that batches are planned within: every batch runs beyond it (interactive batches are cut to one row), "
            "and requests over --interactive-tokens (256) will be refused (413); raise the limit well above 420 MiB, "
            "hold less resident (every session holds memory of its own: lower --runners), or serve fewer models"
            in caplog.text), caplog.text  # fmt: skip
    assert b.refuses_large and " 0 MiB above" not in caplog.text
    # With one runner and no lone request's session, nothing of the kind is left to lower.
    b = MemoryBudget(150 * MIB, "--memory-limit-mb")
    b.measured(30_000)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="app"):
        _settle(b, 378, _settings(runners=1), _models(2, 16384), monkeypatch)
    assert "raise the limit well above 420 MiB or serve fewer models" in caplog.text, caplog.text
    caplog.clear()  # one model served: serving fewer is serving none
    with caplog.at_level(logging.INFO, logger="app"):
        _settle(b, 378, _settings(runners=1), _models(1, 16384), monkeypatch)
    assert caplog.text.rstrip().endswith("will be refused (413); raise the limit well above 420 MiB"), (
        caplog.text
    )


def _texts_of(model_tokens: int, word: str = "river") -> list[str]:
    """Texts of a one-token word whose rows (one each, [CLS] and [SEP] added) hold `model_tokens` in all."""
    rows = -(-model_tokens // 512)
    each, extra = divmod(model_tokens - 2 * rows, rows)
    return [" ".join([word] * (each + (i < extra))) for i in range(rows)]


@pytest.mark.slow
def test_the_start_warning_that_large_requests_get_413_is_kept_by_the_server(tmp_path):
    """At 600 MiB the shipped models leave one row per session or not, depending on what they keep resident
    on the machine: where they do not, the server warns that every request over --interactive-tokens gets
    413, and it does, while one of --interactive-tokens is served; where they do, it says nothing of the
    kind, and a request of 3,000 tokens is served."""
    from app.model.tokenization import TextTokenizer

    tokenizer = TextTokenizer(REPO / "models" / "detector" / "tokenizer.json", 512, 32)
    flags = ("--memory-limit-mb", "600", "--interactive-tokens", "256")
    with run_server(REPO / "models", *flags, log_dir=tmp_path) as server, server.client() as c:
        log = server.log()
        if "requests over --interactive-tokens (256) will be refused (413)" in log:
            most = 256  # interactive requests are served whatever the room
        else:  # a row per session fits: no warning, and no request is refused for memory
            assert "needs about" not in log and "will be refused" not in log, log
            most = 3000
        for tokens, status in ((most, 200), (most + 1, 413 if most < 3000 else 200)):
            texts = _texts_of(tokens)
            assert sum(len(r.ids) for e in tokenizer.encode_detect(texts) for r in e.rows) == tokens
            r = c.post("/detect", json={"texts": texts})
            assert r.status_code == status, (tokens, r.text)


@pytest.mark.slow
def test_a_server_below_its_models_refuses_large_requests_and_serves_sentences(tmp_path):
    # The shipped models need ~500 MiB resident: 300 MiB leaves nothing for a large request's batches.
    with (
        run_server(REPO / "models", "--memory-limit-mb", "300", log_dir=tmp_path) as server,
        server.client() as c,
    ):
        assert c.post("/detect", json={"text": "A short sentence is served."}).status_code == 200
        r = c.post("/detect", json={"texts": [LONG, LONG]})
        assert r.status_code == 413, r.text
        message = r.json()["error"]["message"]
        assert "memory limit (300 MiB, --memory-limit-mb)" in message, message
        # No large request fits at all: the client is told what does, not to send "fewer or shorter texts".
        assert "send at most 2048 model-input tokens per request" in message, message
        assert "limit (--memory-limit-mb) raised" in message and "fewer or shorter" not in message, message
        assert server.metric("electra_memory_bytes", what="limit") == 300 * MIB
        assert "requests over --interactive-tokens (2048) will be refused (413)" in server.log()
        # Interactive batches, never refused for memory, are cut to a row of the longest model at a time.
        assert "interactive batches are cut to one row" in server.log()
        assert "memory: limit 300 MiB (--memory-limit-mb); loading 2 model(s)" in server.log()
        r = c.post(
            "/detect", json={"texts": ["A short sentence.", "Another one, a little longer than that."] * 8}
        )
        assert r.status_code == 200 and len(r.json()["results"]) == 16


@pytest.mark.slow
def test_a_server_with_room_answers_large_requests(tmp_path):
    with (
        run_server(REPO / "models", "--memory-limit-mb", "100000", log_dir=tmp_path) as server,
        server.client() as c,
    ):
        assert c.post("/detect", json={"texts": [LONG, LONG]}).status_code == 200
        assert 'what="reserved"' not in c.get("/metrics").text  # nothing is held per request
        assert "interactive batches are cut" not in server.log()
        # Every session's batch at its budget fits its share (2 runners and a solo session, 2 models): no cut,
        # and what all of them hold at once is published.
        kept = server.metric("electra_memory_bytes", what="interactive")
        said = re.search(r"(\d+) MiB above the models, (\d+) MiB of it for every session's batch at once",
                         server.log())  # fmt: skip
        assert said and kept > 0 and abs(int(said.group(2)) - kept / MIB) < 1, server.log()
        assert int(said.group(2)) <= int(said.group(1)) and "is cut at" not in server.log()


@pytest.mark.parametrize(("limit_mib", "runners"), [(600, 2), (800, 4), (700, 3)])
def test_where_the_split_leaves_large_requests_no_row_every_runner_gets_a_share_and_none_is_refused(
    limit_mib, runners
):
    """A reviewer's servers: at 600 MiB (~163 MiB above the models) the interactive share, four batches of
    one full-length row, left large requests 25 MiB, less than their one row; at 800 MiB with --runners 4
    three batches at once of one row did not fit what was left either. Every request over
    --interactive-tokens got 413, though one row per runner at a time fits the room. Now every runner's
    batch, of either lane, is cut to an equal share, and no large request is refused for memory."""
    baseline = 377 if limit_mib == 600 else 376  # 0.9 of 600 MiB less 377: the reviewer's 163 MiB of room
    b = budget(limit_mib, baseline, per_token=67.14 * MIB / 1024)
    b.interactive_tokens = 2048
    models = _models(2, 16384)
    batch = plan(
        b, SimpleNamespace(runners=runners, batch_token_budget=16384, bulk_batch_budget=4096), models
    )
    assert b.by_session and 512 <= batch < 4096
    lanes = [m.scheduler.lanes[bulk].budget for m in models.values() for bulk in (False, True)]
    assert set(lanes) == {batch}
    assert runners * len(models) * b.cost(batch, batch) <= b.room  # every runner's batch at once
    assert not b.refuses_large
    b.check_large()


def test_where_not_even_one_row_per_runner_fits_the_split_stands_and_large_requests_get_413():
    b = budget(600, 500, per_token=30_000)  # 40 MiB above the models; four 512-token rows need ~59 MiB
    b.interactive_tokens = 256
    models = _models(2, 16384)
    plan(b, SimpleNamespace(runners=2, batch_token_budget=16384, bulk_batch_budget=4096), models)
    assert not b.by_session
    with pytest.raises(AppError) as too_big:
        b.check_large()
    assert too_big.value.type is ErrorType.TOO_MANY_TOKENS


@pytest.mark.parametrize("runners", [1, 2, 3, 4])
def test_a_higher_limit_never_serves_with_smaller_batches_or_fewer_large_requests(runners):
    """As a fallback of the split, the share applied only below a cliff: --runners 4 at 800 MiB shared, and
    at 840 MiB the split stood again, interactive batches cut to 512 tokens and large requests waiting one at
    a time (429). Counted with the solo sessions, whose arenas keep what they took (600 MiB was reached)."""
    settings = SimpleNamespace(runners=runners, batch_token_budget=16384, bulk_batch_budget=4096)
    before = (0, 0)
    for limit_mib in range(560, 13000, 40):
        b = budget(limit_mib, 376, per_token=67.14 * MIB / 1024)
        b.interactive_tokens = 2048
        models = _models(2, 16384)
        for m in models.values():
            m.engine = SimpleNamespace(has_solo=True)
        plan(b, settings, models)
        if not b.by_session:  # not even a row per session: only below the share's first limit
            assert before == (0, 0), limit_mib
            continue
        lanes = models["m0"].scheduler.lanes
        now = (lanes[False].budget, lanes[True].budget)
        assert now >= before and not b.refuses_large, limit_mib  # no large request refused for memory
        assert (runners + 1) * 2 * b.cost(max(now), max(now)) <= b.room, limit_mib  # solo sessions counted
        before = now
    assert before == (16384, 4096)  # a limit high enough cuts nothing
