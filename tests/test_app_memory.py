"""Under a memory limit (app/scheduling/memory.py) every batch is cut to its engine session's share of the room;
where not even a row per session fits, the split of before: large requests reserve, and are refused (413
when one alone would not fit, 429 while others hold the room); one-sentence requests are served. The
budget's arithmetic, the cgroup files, and a real server on the shipped models."""

from __future__ import annotations

import re
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.errors import AppError, ErrorType
from app.scheduling.forming import Job, Lane, Step, next_step
from app.scheduling.memory import (
    HEADROOM,
    MIB,
    MemoryBudget,
    bulk_at_once,
    cap_bulk,
    cap_interactive,
    cgroup_limit,
    plan,
)

try:
    from app_fixtures import run_server
except ImportError:  # tests/ made a package
    from tests.app_fixtures import run_server

REPO = Path(__file__).resolve().parents[1]
LONG = "The river flows past the old mill, where the village once ground its grain. " * 80  # ~1.4k tokens


@pytest.mark.parametrize(
    "v2, v1, expected",
    [("max\n", None, None), ("268435456\n", None, 268435456), (None, "9223372036854771712\n", None),
     (None, "536870912\n", 536870912), (None, None, None)],
)  # fmt: skip
def test_the_cgroup_limit_is_read_from_v2_then_v1(tmp_path, v2, v1, expected):
    files = (tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes")
    for path, text in zip(files, (v2, v1), strict=True):
        if text is not None:
            path.write_text(text)
    assert cgroup_limit(files) == expected


def budget(limit_mib: int, baseline_mib: int, per_token: float) -> MemoryBudget:
    b = MemoryBudget(limit_mib * MIB, "test")
    b.measured(per_token)
    b.settle()
    b.baseline = baseline_mib * MIB  # as if this much were resident
    return b


def test_large_requests_reserve_room_and_give_it_back():
    b = budget(1000, 500, per_token=30_000)  # a 4096-token batch: ~117 MiB; room 400 MiB
    assert b.room == int(HEADROOM * 1000 * MIB) - 500 * MIB
    # A request's batches are at most 4096 tokens: it holds one batch's worth.
    held = [b.reserve("m", 10_000, 4096) for _ in range(3)]
    with pytest.raises(AppError) as busy:
        b.reserve("m", 10_000, 4096)
    assert busy.value.type is ErrorType.OVERLOADED and busy.value.headers["retry-after"]
    # Counted as rejected reason "memory", not "overloaded" as a full queue and the bulk token limit were too.
    assert busy.value.reason == "memory"
    b.release(held.pop())
    b.reserve("m", 10_000, 4096)


def test_a_request_admitted_before_the_server_settled_gives_back_only_what_it_reserved():
    """The first model serves while the next loads: a request admitted then reserves nothing, and its
    release once the server has settled used to take a whole batch's price off the others' reservations."""
    b = MemoryBudget(1000 * MIB, "test")
    early = b.reserve("m", 10_000, 4096)  # before settle: no price yet
    assert early == 0
    b.measured(30_000)
    b.settle()
    b.baseline = 500 * MIB
    late = b.reserve("m", 10_000, 4096)
    b.release(early)
    assert b.reserved == late > 0
    b.release(late)
    assert b.reserved == 0


def test_a_request_that_could_never_fit_is_413_naming_the_limit():
    b = budget(600, 500, per_token=30_000)
    with pytest.raises(AppError) as too_big:
        b.reserve("m", 4096, 4096)
    assert too_big.value.type is ErrorType.TOO_MANY_TOKENS and "600 MiB" in too_big.value.message


@pytest.mark.parametrize(("limit_mib", "fits"), [(560, "none"), (600, "some"), (640, "some"), (700, "all")])
def test_the_most_tokens_a_request_may_have_is_the_last_that_reserve_takes(limit_mib, fits):
    b = budget(limit_mib, 500, per_token=30_123.7)  # a 4096-token batch: ~118 MiB, more than 600's room
    b.interactive_tokens = 256
    most = b.most_tokens(4096)
    assert (most is None) == (fits == "all") and (most is not None and most <= 256) == (fits == "none")
    if most is None:  # a whole batch fits, and no request reserves more
        b.release(b.reserve("m", 100_000, 4096))
        return
    if most > 256:
        b.release(b.reserve("m", most, 4096))
    with pytest.raises(AppError) as too_big:
        b.reserve("m", max(most, 256) + 1, 4096)
    assert too_big.value.type is ErrorType.TOO_MANY_TOKENS


def _models(n: int, budget: int, max_length: int = 512, bulk_budget: int = 4096) -> dict:
    """What cap_interactive and cap_bulk read of a served model: its longest row, its two lanes and the bulk
    batch size its reservations count."""
    return {f"m{i}": SimpleNamespace(bundle=SimpleNamespace(manifest=SimpleNamespace(max_length=max_length)),
                                     scheduler=SimpleNamespace(lanes={False: Lane(budget, bulk=False),
                                                                      True: Lane(bulk_budget, bulk=True)},
                                                               admission=SimpleNamespace(bulk_batch_tokens=bulk_budget)))
            for i in range(n)}  # fmt: skip


def _fill(b: MemoryBudget, tokens: int, batch_tokens: int) -> None:
    """Reserve as large requests would until the budget refuses one (429, or 413 when none fits)."""
    while True:
        try:
            b.reserve("m", tokens, batch_tokens)
        except AppError:
            return


@pytest.mark.parametrize("limit_mib", [800, 1024, 10240])
def test_interactive_batches_and_large_requests_all_at_once_fit_the_room(limit_mib):
    """A reviewer's mixed load (2/3 /detect, 1/3 /classify, texts of 5 to 1,500 words) took a server with
    --memory-limit-mb 800 to 910 MiB: interactive batches were cut so that all of them at once filled the
    room above the models, while large requests could reserve that whole room too. Here the figures of that
    server: 376 MiB resident after loading, 67 MiB per 1k padded tokens, 2 runners x 2 models."""
    b = budget(limit_mib, 376, per_token=67.14 * MIB / 1024)
    b.interactive_tokens = 2048
    models = _models(2, 16384)
    cap_interactive(b, SimpleNamespace(runners=2, batch_token_budget=16384), models)
    for tokens in (3000, 2049, 100_000):  # large requests of one size, then smaller ones into what is left
        _fill(b, tokens, 4096)
    interactive = sum(2 * b.cost(m.scheduler.lanes[False].budget, 16384) for m in models.values())
    assert b.reserved > 0 and b.reserved + interactive <= b.room, (b.reserved / MIB, interactive / MIB)
    assert interactive == b.interactive
    # Neither half is starved: each has at least a batch of one full-length row (or all of its budget).
    assert all(m.scheduler.lanes[False].budget >= 512 for m in models.values())
    if limit_mib == 10240:  # all four batches at --batch-token-budget fit half the room: none is cut
        assert all(m.scheduler.lanes[False].budget == 16384 for m in models.values())


def test_interactive_batches_take_at_most_half_the_room_when_they_must_be_cut():
    b = budget(800, 376, per_token=67.14 * MIB / 1024)  # room 344 MiB
    models = _models(2, 16384)
    cap_interactive(b, SimpleNamespace(runners=2, batch_token_budget=16384), models)
    cut = models["m0"].scheduler.lanes[False].budget
    assert 512 < cut < 16384 and b.interactive <= b.room // 2 < b.interactive + 4 * b.cost(1, 1)
    assert b.bulk_room == b.room - b.interactive
    # One batch of --bulk-batch-tokens fit the whole room, not the half left to large requests: as it is, a
    # request of 4,096 tokens is refused 413, naming the share kept ...
    with pytest.raises(AppError) as too_big:
        b.reserve("m", 4096, 4096)
    assert too_big.value.type is ErrorType.TOO_MANY_TOKENS
    assert f"{b.interactive / MIB:.0f} MiB kept for interactive batches" in too_big.value.message
    # ... so the large requests' batches are cut to what their half holds, and every size is served whole,
    # in more batches, one request at a time at the most.
    cut = cap_bulk(b, SimpleNamespace(bulk_batch_budget=4096), models)
    assert 512 <= cut < 4096 and b.most_tokens(cut) is None
    assert all(
        m.scheduler.lanes[True].budget == m.scheduler.admission.bulk_batch_tokens == cut
        for m in models.values()
    )
    b.release(b.reserve("m", 100_000, cut))
    assert b.reserve("m", 4096, cut) + b.interactive <= b.room


def test_bulk_batches_are_cut_no_further_than_one_row_of_the_longest_model():
    b = budget(600, 500, per_token=30_000)  # room 40 MiB: one 512-token row costs ~15 MiB
    models = _models(1, 16384, max_length=512)
    cap_interactive(b, SimpleNamespace(runners=2, batch_token_budget=16384), models)
    assert cap_bulk(b, SimpleNamespace(bulk_batch_budget=4096), models) == 512
    most = b.most_tokens(512)  # what even those leave: requests past it get 413, as before
    assert most is None or b.need(most, 512) <= b.bulk_room < b.need(most + 1, 512)


def test_one_bulk_request_runs_on_several_runners_at_once_and_reserves_for_each():
    """With --runners 3 a model runs two bulk batches at once, and both may be one request's: a free runner
    forms the next of its batches while the first runs. One batch's reservation undercounted it."""
    bulk, interactive = Lane(4096, bulk=True), Lane(16384, bulk=False)
    long = Job([SimpleNamespace(ids=[7] * 512) for _ in range(24)], Future(), bulk=True)
    bulk.push(long)
    running = []
    for _ in range(bulk_at_once(3)):  # runners 3: bulk_running < 2 lets a second runner take bulk work
        step, lane = next_step(interactive, bulk, bulk_allowed=len(running) < 3 - 1)
        if step is Step.FORM:
            lane.take()
            step, lane = next_step(interactive, bulk, bulk_allowed=len(running) < 3 - 1)
        assert step is Step.CLAIM
        running.append(lane.claim())
    assert {job for batch in running for job, _ in batch.items} == {long} and len(running) == 2
    b = budget(4096, 376, per_token=67.14 * MIB / 1024)
    b.bulk_at_once = bulk_at_once(3)
    assert b.reserve("m", long.tokens, 4096) == b.cost(2 * 4096, 2 * 4096)
    assert b.reserve("m", 3000, 4096) == b.cost(3000, 3000)  # never more than its tokens
    assert bulk_at_once(2) == bulk_at_once(1) == 1  # one bulk batch per model: the default's reservation


def _texts_of(model_tokens: int, word: str = "river") -> list[str]:
    """Texts of a one-token word whose rows (one each, [CLS] and [SEP] added) hold `model_tokens` in all."""
    rows = -(-model_tokens // 512)
    each, extra = divmod(model_tokens - 2 * rows, rows)
    return [" ".join([word] * (each + (i < extra))) for i in range(rows)]


def test_the_start_warning_names_the_size_past_which_large_requests_get_413(tmp_path):
    """It said every request over --interactive-tokens would be refused once one full bulk batch did not
    fit, while smaller bulk requests reserve less and were served (at 700 MiB, texts of 3,000 tokens)."""
    from app.model.tokenization import TextTokenizer

    tokenizer = TextTokenizer(REPO / "models" / "detector" / "tokenizer.json", 512, 32)
    # 600 MiB plans for 540 (HEADROOM); the shipped models keep 370-500 resident here, and the room above them
    # holds a few hundred tokens' batches (~17 MiB) and not one of 4096 (~275 MiB) for anything from 265 to
    # 523. A machine whose models take more or less gets one of the other two answers, each checked as said.
    flags = ("--memory-limit-mb", "600", "--interactive-tokens", "256")
    with run_server(REPO / "models", *flags, log_dir=tmp_path) as server, server.client() as c:
        log = server.log()
        if said := re.search(r"requests over (\d+) model-input tokens will be refused \(413\)", log):
            most = int(said.group(1))
            assert "those over --interactive-tokens (256) up to" in log
        elif "requests over --interactive-tokens (256) will be refused (413)" in log:
            most = 256  # interactive requests reserve nothing: served whatever the room
        else:  # one whole bulk batch fits: no warning, and no request is refused for memory
            assert "needs about" not in log, log
            most = 3000
        for tokens, status in ((most, 200), (most + 1, 413 if most < 3000 else 200)):
            texts = _texts_of(tokens)
            assert sum(len(r.ids) for e in tokenizer.encode_detect(texts) for r in e.rows) == tokens
            r = c.post("/detect", json={"texts": texts})
            assert r.status_code == status, (tokens, r.text)


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
        # Interactive batches, which reserve nothing, are cut to a row of the longest model at a time.
        assert "interactive batches are cut at 512 tokens" in server.log()
        assert "memory: limit 300 MiB (--memory-limit-mb); loading 2 model(s)" in server.log()
        r = c.post(
            "/detect", json={"texts": ["A short sentence.", "Another one, a little longer than that."] * 8}
        )
        assert r.status_code == 200 and len(r.json()["results"]) == 16


def test_a_server_with_room_answers_large_requests(tmp_path):
    with (
        run_server(REPO / "models", "--memory-limit-mb", "100000", log_dir=tmp_path) as server,
        server.client() as c,
    ):
        assert c.post("/detect", json={"texts": [LONG, LONG]}).status_code == 200
        assert server.metric("electra_memory_bytes", what="reserved") == 0  # given back once answered
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
    batch, of either lane, is cut to an equal share, and large requests reserve nothing."""
    baseline = 377 if limit_mib == 600 else 376  # 0.9 of 600 MiB less 377: the reviewer's 163 MiB of room
    b = budget(limit_mib, baseline, per_token=67.14 * MIB / 1024)
    b.interactive_tokens = 2048
    models = _models(2, 16384)
    batch = plan(
        b, SimpleNamespace(runners=runners, batch_token_budget=16384, bulk_batch_budget=4096), models
    )
    assert b.by_session and 512 <= batch < 4096
    lanes = [m.scheduler.lanes[bulk].budget for m in models.values() for bulk in (False, True)]
    assert set(lanes) == {batch} and all(
        m.scheduler.admission.bulk_batch_tokens == batch for m in models.values()
    )
    assert runners * len(models) * b.cost(batch, batch) <= b.room  # every runner's batch at once
    assert b.most_tokens(batch) is None and b.reserve("m", 3233, batch) == 0 and b.reserved == 0


def test_where_not_even_one_row_per_runner_fits_the_split_stands_and_large_requests_get_413():
    b = budget(600, 500, per_token=30_000)  # 40 MiB above the models; four 512-token rows need ~59 MiB
    b.interactive_tokens = 256
    models = _models(2, 16384)
    plan(b, SimpleNamespace(runners=2, batch_token_budget=16384, bulk_batch_budget=4096), models)
    assert not b.by_session
    with pytest.raises(AppError) as too_big:
        b.reserve("m", 4096, models["m0"].scheduler.admission.bulk_batch_tokens)
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
        assert now >= before and b.reserve("m", 100_000, now[1]) == 0, limit_mib  # nothing waits on memory
        assert (runners + 1) * 2 * b.cost(max(now), max(now)) <= b.room, limit_mib  # solo sessions counted
        before = now
    assert before == (16384, 4096)  # a limit high enough cuts nothing
