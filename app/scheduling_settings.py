"""The server's scheduling settings: what a request may cost and how requests become batches (one group
of app/settings.py's Settings)."""

from __future__ import annotations

from dataclasses import dataclass

from options import option


@dataclass(frozen=True)
class SchedulingSettings:
    """What a request may cost and how requests become batches: token bounds, queues, batch budgets, runners and their threads, and memory."""

    batch_token_budget: int = option(
        16384, "rows * longest row (padding counted) per inference batch", env="ELECTRA_BATCH_TOKEN_BUDGET"
    )
    # 0: an idle runner takes what is queued at once. Under load batches fill while the runners are
    # busy anyway; waiting only adds latency when it is quiet (docs/benchmarks.md, "Server settings").
    max_wait_ms: float = option(
        0.0, "how long an idle runner lets the oldest request wait for company", env="ELECTRA_MAX_WAIT_MS"
    )
    queue_size: int = option(
        256, "admitted, unanswered requests per model; beyond it 429", env="ELECTRA_QUEUE_SIZE"
    )
    # Work bounds (issue 12): a request's cost is its tokens, not its bytes; 100 KB of "!" is 100k tokens.
    # 8,192 tokens are ~17 windows of 512.
    max_text_tokens: int = option(
        8192, "tokens one text may have (/detect); more: 413 too_many_tokens", env="ELECTRA_MAX_TEXT_TOKENS"
    )
    max_request_tokens: int = option(
        16384,
        "model-input tokens one request may cause (windows and special tokens counted); more: 413",
        env="ELECTRA_MAX_REQUEST_TOKENS",
    )
    # Requests above --interactive-tokens are "bulk": they wait behind interactive ones, never hold every
    # runner at once, and are admitted only while the model's bulk tokens in flight stay under this.
    max_bulk_tokens: int = option(
        65536,
        "tokens of bulk requests admitted and unanswered per model; beyond it 429",
        env="ELECTRA_MAX_BULK_TOKENS",
    )
    interactive_tokens: int = option(
        2048, "requests up to this many model-input tokens go first", env="ELECTRA_INTERACTIVE_TOKENS"
    )
    # Strict priority starved bulk work under a sustained interactive load (a reviewer's 16 closed-loop
    # clients left a 2,400-word request 19 s in the queue). Past this wait without a bulk batch claimed, the
    # next runner free to take bulk work takes it first; the clock starts again at each bulk claim, so a long
    # request waits about this long before each of its batches. 1 s is a tenth of a 10-20 s client timeout
    # for the first batch, and leaves interactive work all runners but one bulk batch a second
    # (docs/deploy.md, "A long request under interactive load").
    bulk_max_wait_ms: float = option(
        1000.0,
        "how long bulk work may wait behind interactive work without a batch of it run; past it the next "
        "runner that may run bulk takes bulk work first; 0: never (interactive work always first)",
        env="ELECTRA_BULK_MAX_WAIT_MS",
    )
    # Bulk rows are long windows, whose attention scores grow with rows x length^2: a smaller budget for
    # them bounds the process's peak memory at no cost in speed (long rows are large matrix products
    # already; docs/benchmarks.md, "Memory").
    bulk_batch_tokens: int = option(
        4096, "rows * longest row per batch of bulk requests' rows", env="ELECTRA_BULK_BATCH_TOKENS"
    )
    max_batch_size: int = option(32, "texts (or pairs) in one request", env="ELECTRA_MAX_BATCH_SIZE")
    # Two batches in flight, each on half the cores, beat one batch on all of them on small machines:
    # a single-threaded run never waits at a barrier for a thread the event loop has preempted
    # (docs/benchmarks.md, "Server settings").
    runners: int = option(
        2, "batches in flight at once per model, each on its own thread", env="ELECTRA_RUNNERS"
    )
    intra_op_threads: int = option(
        0,
        "ONNX Runtime threads per batch; 0: the available cores / --runners",
        env="ELECTRA_INTRA_OP_THREADS",
    )
    # A lone request on one runner's share leaves the other cores idle. A second session per model runs
    # such batches on all of them (app/scheduling/placement.py; docs/benchmarks.md, "One user").
    solo_threads: int = option(
        0,
        "ONNX Runtime threads for a batch run while no other request is in flight; 0: all cores; 1: off",
        env="ELECTRA_SOLO_THREADS",
    )
    # A container's limit is its cgroup's: batches are cut to fit it, before they could reach it, not the
    # OOM killer after (app/scheduling/memory.py).
    memory_limit_mb: int = option(
        0,
        "memory the server may use, MiB: every batch is cut to its engine session's share of it (where not "
        "even one full-length row per session fits, large requests get 413); 0: the cgroup's limit when there "
        "is one; -1: none",
        env="ELECTRA_MEMORY_LIMIT_MB",
    )
