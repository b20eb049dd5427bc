"""The served models: bundles read (and hash-checked) at start, sessions loaded and warmed in the
background so that /health answers at once and /ready says when scoring can start."""

from __future__ import annotations

import asyncio
import logging
import typing
from dataclasses import dataclass

from app.errors import AppError, ErrorType, clip
from app.machine import cpu
from app.metrics import Metrics
from app.model import load_check as engine_check
from app.model.bundle import Bundle, manifest_kind
from app.model.catalog import default_threshold, describe
from app.model.engine import Engine
from app.model.faults import FaultInjector, FaultSpec
from app.model.tokenization import TextTokenizer
from app.model_settings import DEFAULT_WINDOW_STRIDE
from app.scheduling.admission import Admission
from app.scheduling.health import EngineHealth
from app.scheduling.lifecycle import Lifecycle, Phase
from app.scheduling.memory import MemoryBudget, budget_for, peak_during, rss, settle
from app.scheduling.scheduler import Scheduler
from app.scheduling.server_load import ServerLoad
from app.schemas import ModelInfo
from app.settings import Settings, SettingsError

log = logging.getLogger("app")
ENDPOINTS = {"detector": "/detect", "classifier": "/classify"}


@dataclass(frozen=True)
class Model:
    bundle: Bundle
    tokenizer: TextTokenizer
    engine: Engine
    scheduler: Scheduler  # owns every request's scheduling state: its place, its lane, its bulk reservation

    @property
    def name(self) -> str:
        return self.bundle.name

    @property
    def threshold(self) -> float:
        return default_threshold(self.bundle.manifest)


class Registry:
    def __init__(
        self,
        bundles: list[Bundle],
        settings: Settings,
        metrics: Metrics,
        broken: dict[str, str] | None = None,
    ) -> None:
        self.bundles = {b.name: b for b in bundles}
        # A bundle that failed its checks or would not load, by name, with the reason: it fails alone
        # (503 naming the reason); /ready and /models say which and why.
        self.broken: dict[str, str] = dict(broken or {})
        # The kind of each broken bundle whose manifest says one: a request for another kind is a 404.
        self.broken_kinds = {n: k for n in self.broken if (k := manifest_kind(settings.models_dir / n))}
        self.on_nothing_served = None  # called when no bundle loaded: __main__ stops the server (exit 1)
        self.settings = settings
        for kind in ENDPOINTS:
            self._check_default(kind)
        said = ", ".join(
            f"{endpoint} {n!r}" for kind, endpoint in ENDPOINTS.items() if (n := self.default(kind))
        )
        if said:
            log.info(
                "a request that names no model goes to: %s (--default-detector, --default-classifier)", said
            )
        self.metrics = metrics
        # Over all models: a lone request runs on every core (app/scheduling/placement.py).
        self.server_load = ServerLoad()
        self.lifecycle = Lifecycle()
        self.models: dict[str, Model] = {}
        self.health: dict[str, EngineHealth] = {}  # of each model's engine: app/scheduling/health.py
        self.state = "loading"  # loading -> ready, or failed; draining is the lifecycle's
        self.detail: str | None = None
        self.aborted_at_stop = 0  # requests the scheduler answered 503 at the deadline or a forced stop
        self.refuse_uploads: typing.Callable[[str], int] | None = None  # at a stop: 503 to bodies coming in
        self._loop: asyncio.AbstractEventLoop | None = None
        self.load_checks: dict[str, dict | None] = {}  # app/model/load_check.py: this CPU vs the reference
        self.memory = budget_for(settings.memory_limit_mb)  # app/scheduling/memory.py; None: no limit
        for name, reason in _over_budget(bundles, settings).items():  # that bundle fails alone
            self.broken_kinds[name] = self.bundles.pop(name).manifest.kind
            self.broken[name] = reason
            log.error("bundle %s is broken and will not be served: %s", name, reason)
        if not self.bundles:
            raise SettingsError("no bundle can be served:\n" + "\n".join(self.broken.values()))
        for name in self.broken:  # something to alert on: /ready stays 200 "degraded" unless told otherwise
            metrics.bundle_broken.labels(name).set(1)
        for bundle in self.bundles.values():
            for warning in bundle.manifest.warnings:  # the export's: a detector near chance, a missed rule
                log.warning("%s: %s", bundle.name, warning)

    def default(self, kind: str) -> str | None:
        """--default-KIND (broken, it is answered 503 as a request naming it is), else the first served
        bundle of the kind by name."""
        if name := getattr(self.settings, f"default_{kind}"):
            return name
        names = sorted(n for n, b in self.bundles.items() if b.manifest.kind == kind)
        return names[0] if names else None

    def _check_default(self, kind: str) -> None:
        """--default-KIND names a bundle of that kind in the models directory (or one whose manifest could
        not be read): a SettingsError before the port opens otherwise."""
        name = getattr(self.settings, f"default_{kind}")
        if not name:  # unset, or empty (ELECTRA_DEFAULT_DETECTOR= from a template): the first by name
            return
        found = self.bundles[name].manifest.kind if name in self.bundles else self.broken_kinds.get(name)
        if found == kind or (found is None and name in self.broken):
            return
        ours = sorted(n for n, b in self.bundles.items() if b.manifest.kind == kind)
        why = f"a {found}, not a {kind}" if found else "no bundle of that name"
        raise SettingsError(f"--default-{kind} {name!r}: {why}; the {kind}s in the models directory "
                            f"{self.settings.models_dir}: {', '.join(ours) or 'none'}")  # fmt: skip

    def resolve(self, name: str | None, kind: str, arrived_before_drain: bool = False) -> Model:
        """The model a request names (or the default of its kind), or the 4xx/503 saying why not.
        `arrived_before_drain`: its head came in before the drain began (Lifecycle.check_admission)."""
        if name is None:
            name = self.default(kind)
            if name is None:
                self._none_of(kind)
        bundle = self.bundles.get(name)
        if bundle is None and name in self.broken:
            raise AppError(
                ErrorType.UNAVAILABLE, f"model {name!r} is broken: {self.broken[name]}", field="model"
            )
        if bundle is None:
            served = ", ".join(sorted(self.bundles))
            raise AppError(
                ErrorType.UNKNOWN_MODEL, f"unknown model {clip(name)!r}; served: {served}", field="model"
            )
        if bundle.manifest.kind != kind:
            endpoint = "/detect" if bundle.manifest.kind == "detector" else "/classify"
            msg = f"model {name!r} is a {bundle.manifest.kind}, not a {kind}; use {endpoint}"
            raise AppError(ErrorType.WRONG_MODEL_KIND, msg, field="model")
        self.lifecycle.check_admission(arrived_before_drain)
        model = self.models.get(name)
        if model is None:
            raise AppError(
                ErrorType.UNAVAILABLE, f"model {name!r} is {self.state}", headers={"retry-after": "1"}
            )
        return model

    def _none_of(self, kind: str) -> typing.NoReturn:
        """No bundle of `kind` serves: 503 when one was meant to (it is broken, or may be: a manifest
        that could not be read has no kind), 404 when the models directory never held one."""
        broken = sorted(n for n in self.broken if self.broken_kinds.get(n, kind) == kind)
        if broken:
            reasons = "; ".join(f"{n!r}: {self.broken[n]}" for n in broken)
            raise AppError(ErrorType.UNAVAILABLE, f"no {kind} is served; broken: {reasons}", field="model")
        raise AppError(ErrorType.UNKNOWN_MODEL, f"no {kind} is served; see GET /models", field="model")

    async def check_engines(self) -> None:
        """/ready's and /metrics': probe the engines that keep failing (app/scheduling/health.py), off the event loop."""
        if self.state == "ready" and self.lifecycle.phase is Phase.SERVING:
            await asyncio.gather(*(health.check() for health in self.health.values()))

    @property
    def failing(self) -> dict[str, str]:
        """Served bundles whose engine fails, by name, with why (EngineHealth.now)."""
        return {name: why for name, h in self.health.items() if (why := h.now)}

    def readiness(self) -> tuple[str, str | None]:
        """(status, detail): "failing" when every served model's engine fails (check_engines); "degraded"
        when some models serve and others are broken or failing; "draining" from the moment SIGTERM arrives,
        so a load balancer takes the replica out before its work ends."""
        if self.lifecycle.phase is Phase.LEAVING:
            return "draining", "shutting down: out of rotation, still answering until --drain-delay-s ends"
        if self.lifecycle.phase is not Phase.SERVING:
            return "draining", "shutting down: finishing the requests already admitted"
        failing = self.failing
        if self.state == "ready" and failing and len(failing) == len(self.models):
            names = ", ".join(sorted(failing))
            return "failing", f"inference fails on every served bundle: {names}; see `failing` for why"
        if self.state == "ready" and (self.broken or failing):
            said = [f"broken bundle(s), not served: {', '.join(sorted(self.broken))}"] if self.broken else []
            if failing:
                said.append(f"failing bundle(s), their inference fails: {', '.join(sorted(failing))}")
            return "degraded", f"{'; '.join(said)}; see GET /models for why"
        return self.state, self.detail

    def describe(self) -> list[ModelInfo]:
        return describe(
            self.bundles, {self.default("detector"), self.default("classifier")}, self.load_checks
        )

    async def load(self) -> None:
        self._loop = asyncio.get_running_loop()
        bundles = list(self.bundles.values())
        for bundle, loaded in zip(bundles, await _load_all(bundles, self.settings, self.memory), strict=True):
            if isinstance(loaded, Exception):  # this bundle fails alone; the reason stays readable on /models
                self.broken[bundle.name] = f"loading failed: {type(loaded).__name__}: {loaded}"
                self.broken_kinds[bundle.name] = self.bundles.pop(bundle.name).manifest.kind
                self.metrics.bundle_broken.labels(bundle.name).set(1)
                rest = "the other models are served" if self.bundles else "no bundle is left to serve"
                log.error("%s: loading failed; %s", bundle.name, rest, exc_info=loaded)
                continue
            tokenizer, engine, check = loaded
            try:
                scheduler = _scheduler(self, bundle.name, tokenizer, engine)
            except Exception as e:  # a bug of ours, not the bundle's: /ready reports it, the process stays up
                self.state, self.detail = "failed", f"{type(e).__name__}: {e}"
                log.exception("starting the schedulers failed")
                return
            self.models[bundle.name] = Model(bundle, tokenizer, engine, scheduler)
            self.health[bundle.name] = EngineHealth(
                bundle.name, engine, engine.pad([tokenizer.warmup_row(8)], tokenizer.pad_id),
                self.settings.unready_after_failures, self.metrics.engine_failures.labels(bundle.name, "probe"),
                self.metrics.bundle_failing.labels(bundle.name),
            )  # fmt: skip
            self.load_checks[bundle.name] = check
            if check is not None:
                self.metrics.record_load_check(bundle.name, check)
            log.info("%s: loaded and warmed up (%s)%s", bundle.name, bundle.manifest.kind, _said(check))
        if self.memory is not None:
            settle(self.memory, self.settings, self.metrics, self.models)
        if not self.models:
            self.state, self.detail = "failed", "no bundle could be loaded; see GET /models"
            if not self.bundles and self.on_nothing_served is not None:
                # Up with nothing to serve, a replica would pass its liveness probe and never be ready.
                log.error("no bundle could be loaded: the server stops")
                self.on_nothing_served()
        elif self.state == "loading":
            self.state = "ready"

    def leave_rotation(self) -> None:
        """SIGTERM with --drain-delay-s: /ready answers 503 and connections close after their response,
        while requests are still admitted (a balancer sends some until its next health check)."""
        self.lifecycle.leave()

    def begin_drain(self) -> None:
        """Refuse new work with 503 and leave /ready; what is admitted keeps going."""
        if self.lifecycle.phase not in (Phase.SERVING, Phase.LEAVING):
            return  # a second signal: the deadline already runs
        self.lifecycle.drain()
        # Called from a signal handler: hand over to the loop. The deadline answers what is still
        # waiting with a JSON 503 *before* uvicorn's own timeout (a little later, see __main__) would
        # cancel those handlers and send a plain-text 500. --graceful-timeout-s 0: no deadline at all.
        if self._loop is not None and self.settings.graceful_timeout_s > 0:
            self._loop.call_soon_threadsafe(
                self._loop.call_later, self.settings.graceful_timeout_s, self._drain_deadline
            )

    def call_later(self, delay_s: float, fn, *args) -> bool:
        """Run fn on the server's loop after delay_s (safe from a signal handler); False before load."""
        if self._loop is None:
            return False
        self._loop.call_soon_threadsafe(self._loop.call_later, delay_s, fn, *args)
        return True

    @property
    def drain_timed_out(self) -> bool:
        """Whether a stop answered admitted requests 503 unscored: queued (aborted) or still being
        tokenized (refused at their first step after it). The process then exits 1."""
        return bool(self.aborted_at_stop or self.lifecycle.refused_after_stop)

    def _drain_deadline(self) -> None:
        self._stop_now(f"server shut down: --graceful-timeout-s {self.settings.graceful_timeout_s} passed first",
                       "graceful timeout")  # fmt: skip

    def quit_now(self, why: str) -> None:
        """A SIGINT once the drain began (a second Ctrl-C, or one after SIGTERM: `why` says which),
        uvicorn's force quit (safe from a signal handler): it waits for no request and skips the shutdown
        that closes the schedulers, so queued requests were cancelled into uvicorn's plain-text 500 and the
        exit was 0. They are answered the JSON 503 of a stop instead, at once."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop_now, f"server shut down: quit at once ({why})", why)

    def _stop_now(self, msg: str, why: str) -> None:
        self.lifecycle.stop(msg)
        unanswered = sum(model.scheduler.abort(msg) for model in self.models.values())
        self.aborted_at_stop += unanswered
        # And those still sending their bodies (the server's connections: app/__main__.py sets the hook).
        if self.refuse_uploads is not None:
            refused = self.refuse_uploads(msg)
            unanswered += refused
            self.aborted_at_stop += refused
        if unanswered:
            log.warning("%s: %d request(s) answered 503 unscored", why, unanswered)

    async def close(self) -> None:
        self.lifecycle.stop("server shut down before inference")
        for model in self.models.values():
            await model.scheduler.close()
        if late := self.lifecycle.refused_after_stop:
            log.warning(
                "%d request(s) still being tokenized when the server stopped answered 503 unscored", late
            )


def _over_budget(bundles: list[Bundle], settings: Settings) -> dict[str, str]:
    """The bundles whose longest row fits no batch, interactive or bulk, with the reason."""
    over = {}
    for b in bundles:
        for flag, budget in (("--batch-token-budget", settings.batch_token_budget),
                             ("--bulk-batch-tokens", settings.bulk_batch_tokens)):  # fmt: skip
            if b.manifest.max_length > budget and b.name not in over:
                over[b.name] = (f"{flag} {budget} is smaller than one row of {b.name!r} (max_length "
                                f"{b.manifest.max_length}); raise it to serve this bundle")  # fmt: skip
    return over


def _scheduler(registry: Registry, name: str, tokenizer: TextTokenizer, engine: Engine) -> Scheduler:
    """The model's scheduler, with the admission it owns, its runners started."""
    st = registry.settings
    admission = Admission(
        name, queue_size=st.queue_size, interactive_tokens=st.interactive_tokens,
        max_bulk_tokens=st.max_bulk_tokens, lifecycle=registry.lifecycle, load=registry.server_load,
        series=registry.metrics.of_model(name), memory=registry.memory,
    )  # fmt: skip
    scheduler = Scheduler(
        engine, tokenizer.pad_id, admission, registry.server_load, token_budget=st.batch_token_budget,
        bulk_token_budget=st.bulk_batch_budget, max_wait_ms=st.max_wait_ms,
        runners=st.runners, bulk_max_wait_ms=st.bulk_max_wait_ms,
    )  # fmt: skip
    scheduler.start()
    return scheduler


def _said(check: dict | None) -> str:
    if check is None:
        return "; the bundle carries no load-time check"
    return f"; load-time check on {check['machine']['int8_kernel_path']}: p99 {check['p99']:.4f}, max {check['max']:.4f}"


async def _load_all(bundles: list[Bundle], settings: Settings, memory: MemoryBudget | None) -> list:
    """Each bundle's (tokenizer, engine, check), or the exception that stopped it, in order. The models
    load side by side (ONNX Runtime leaves the GIL while it builds and runs a session), except under a
    memory limit: there each measures what its batches add to resident memory, which it must do alone."""
    if memory is None:
        work = (asyncio.to_thread(_load_and_warm, b, settings) for b in bundles)
        return list(await asyncio.gather(*work, return_exceptions=True))
    # Said before the loading, which a limit too small for the models ends with the OOM killer (no line
    # of ours after it): the last line an operator then reads names the limit, and says what a death there
    # means. It is no death notice: a server that loads logs "memory: memory limit ..." next.
    log.info("memory: limit %.0f MiB (%s); loading %d model(s) one at a time, measuring what a batch costs "
             "(were the server killed before it logs what the limit leaves, the limit would be too small for "
             "the models)", memory.limit / 2**20, memory.source, len(bundles))  # fmt: skip
    loaded = []
    for bundle in bundles:
        try:
            loaded.append(await asyncio.to_thread(_load_and_warm, bundle, settings, memory))
        except Exception as e:
            loaded.append(e)
    return loaded


def _load_and_warm(
    bundle: Bundle, settings: Settings, memory: MemoryBudget | None = None
) -> tuple[TextTokenizer, Engine, dict | None]:
    """Tokenizer and sessions, warmed and checked against the bundle's reference outputs: a worker
    thread's work, off the event loop. EngineCheckError when --load-check refuses the bundle."""
    m = bundle.manifest
    tokenizer = TextTokenizer(bundle.tokenizer_path, m.max_length, settings.window_stride)
    # Only /detect scores in windows; a classifier truncates, and the stride is nothing to it.
    if m.kind == "detector" and (note := tokenizer.stride_note()):  # half a window at most
        # The default on a short-windowed model (configs/tiny.toml's 64 tokens) is nothing to warn about;
        # a stride someone chose is.
        asked = settings.window_stride != DEFAULT_WINDOW_STRIDE
        log.log(logging.WARNING if asked else logging.INFO, "%s: %s", bundle.name, note)
    engine = Engine(
        bundle,
        settings.threads_per_runner(),
        settings.memory_arena,
        settings.providers,
        solo_threads=settings.threads_when_alone(),
    )
    # One short and one full-length batch: first runs allocate and pick kernels; a client should not pay.
    for length in (8, m.max_length):
        engine.run(engine.pad([tokenizer.warmup_row(length)] * 2, tokenizer.pad_id))
    if engine.has_solo:
        engine.run(engine.pad([tokenizer.warmup_row(8)], tokenizer.pad_id), solo=True)
    check = engine_check.run(engine, bundle, cpu())
    warning = engine_check.verdict(check, settings.load_check, bundle.name)
    if warning:
        log.warning(warning)
    if memory is not None:  # what a batch at the bulk budget of full-length rows adds to resident memory
        rows = max(1, settings.bulk_batch_budget // m.max_length)
        batch = engine.pad([tokenizer.warmup_row(m.max_length)] * rows, tokenizer.pad_id)
        before = rss()
        _, peak = peak_during(lambda: engine.run(batch))
        # Against what stays resident once the arena has shrunk back after it: the full price of such a
        # batch, not only what it added to the arena the smaller warm-up batches had already grown.
        memory.measured(max(0, peak - min(before, rss())) / (rows * m.max_length))
    faults = FaultSpec.parse(settings.inject_faults)
    if faults is not None:  # after the warm-up and the check: only client batches count
        engine.faults = FaultInjector.for_model(faults, bundle.name, tokenizer.word_ids)
        log.warning(
            "%s: --inject-faults %s: inference will fail on purpose", bundle.name, settings.inject_faults
        )
    return tokenizer, engine, check
