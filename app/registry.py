"""The served models: bundles read (and hash-checked) at start, sessions loaded and warmed in the
background so that /health answers at once and /ready says when scoring can start."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from app.batcher import Batcher, InFlight
from app.bundle import Bundle
from app.engine import Engine
from app.errors import AppError, ErrorType
from app.metrics import Metrics
from app.schemas import ModelInfo
from app.settings import Settings, SettingsError
from app.tokenization import TextTokenizer

log = logging.getLogger("app")


@dataclass(frozen=True)
class Model:
    bundle: Bundle
    tokenizer: TextTokenizer
    engine: Engine
    batcher: Batcher

    @property
    def name(self) -> str:
        return self.bundle.name

    @property
    def threshold(self) -> float:
        return default_threshold(self.bundle.manifest)


# What a detector bundle exported before calibration (issue 21) is served with, as it always was.
UNCALIBRATED_THRESHOLD = 0.5


def default_threshold(manifest) -> float:
    return manifest.threshold if manifest.threshold is not None else UNCALIBRATED_THRESHOLD


def calibration_info(manifest) -> dict:
    """What /models says about a detector's probabilities and default threshold."""
    if manifest.calibration is not None:
        return {
            "calibrated": True,
            "threshold": default_threshold(manifest),
            "calibration": manifest.calibration,
        }
    note = (
        "not calibrated: this bundle was exported before calibration (or with --no-calibrate); its "
        "probabilities carry the pretraining prior and the default threshold is 0.5. Re-export it with "
        "python -m export to calibrate it and choose a threshold"
    )
    return {"calibrated": False, "threshold": default_threshold(manifest), "calibration": {"note": note}}


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
        self.settings = settings
        self.metrics = metrics
        self.in_flight = InFlight()  # admitted requests over all models: a lone one runs on every core
        self.models: dict[str, Model] = {}
        self.state = "loading"  # loading -> ready -> draining; or failed
        self.detail: str | None = None
        self.drain_timed_out = False  # requests were still unanswered at the graceful timeout: exit 1
        self._loop: asyncio.AbstractEventLoop | None = None
        for b in bundles:
            for flag, budget in (("--batch-token-budget", settings.batch_token_budget),
                                 ("--bulk-batch-tokens", settings.bulk_batch_tokens)):  # fmt: skip
                if b.manifest.max_length > budget:
                    raise SettingsError(
                        f"{flag} {budget} is smaller than one row of {b.name!r} (max_length "
                        f"{b.manifest.max_length})"
                    )

    def default(self, kind: str) -> str | None:
        names = sorted(n for n, b in self.bundles.items() if b.manifest.kind == kind)
        return names[0] if names else None

    def resolve(self, name: str | None, kind: str) -> Model:
        """The model a request names (or the default of its kind), or the 4xx/503 saying why not."""
        if name is None:
            name = self.default(kind)
            if name is None:
                raise AppError(
                    ErrorType.UNKNOWN_MODEL, f"no {kind} is served; see GET /models", field="model"
                )
        bundle = self.bundles.get(name)
        if bundle is None and name in self.broken:
            raise AppError(
                ErrorType.UNAVAILABLE, f"model {name!r} is broken: {self.broken[name]}", field="model"
            )
        if bundle is None:
            served = ", ".join(sorted(self.bundles))
            raise AppError(
                ErrorType.UNKNOWN_MODEL, f"unknown model {name!r}; served: {served}", field="model"
            )
        if bundle.manifest.kind != kind:
            endpoint = "/detect" if bundle.manifest.kind == "detector" else "/classify"
            msg = f"model {name!r} is a {bundle.manifest.kind}, not a {kind}; use {endpoint}"
            raise AppError(ErrorType.WRONG_MODEL_KIND, msg, field="model")
        if self.state == "draining":
            raise AppError(ErrorType.UNAVAILABLE, "server is shutting down", headers={"retry-after": "5"})
        model = self.models.get(name)
        if model is None:
            raise AppError(
                ErrorType.UNAVAILABLE, f"model {name!r} is {self.state}", headers={"retry-after": "1"}
            )
        return model

    def readiness(self) -> tuple[str, str | None]:
        """(status, detail): "degraded" when some models serve and others are broken."""
        if self.state == "ready" and self.broken:
            names = ", ".join(sorted(self.broken))
            return "degraded", f"broken bundle(s), not served: {names}; see GET /models for why"
        return self.state, self.detail

    def describe(self) -> list[ModelInfo]:
        defaults = {self.default("detector"), self.default("classifier")}
        out = []
        for name, b in sorted(self.bundles.items()):
            m = b.manifest
            provenance = {
                "source": m.source,
                "created_at": m.created_at,
                "versions": m.versions,
                "parity": m.parity,
                "optimizations": m.optimizations,
                "opset": m.opset,
            }
            out.append(
                ModelInfo(
                    name=name,
                    kind=m.kind,
                    labels=list(m.labels),
                    problem_type=m.problem_type,
                    precision=m.precision,
                    max_length=m.max_length,
                    sha256=m.model_sha256,
                    files_sha256=b.verified,
                    warnings=list(b.warnings),
                    inputs=list(m.inputs),
                    provenance=provenance,
                    default=name in defaults,
                    **(calibration_info(m) if m.kind == "detector" else {}),
                )
            )
        return out

    async def load(self) -> None:
        self._loop = asyncio.get_running_loop()
        for bundle in list(self.bundles.values()):
            try:
                tokenizer, engine = await asyncio.to_thread(self._load_and_warm, bundle)
            except Exception as e:  # this bundle fails alone; the reason stays readable on /models
                self.broken[bundle.name] = f"loading failed: {type(e).__name__}: {e}"
                del self.bundles[bundle.name]
                log.exception("%s: loading failed; the other models are served", bundle.name)
                continue
            try:
                batcher = Batcher(
                    bundle.name,
                    engine,
                    tokenizer.pad_id,
                    token_budget=self.settings.batch_token_budget,
                    bulk_token_budget=self.settings.bulk_batch_tokens,
                    max_wait_ms=self.settings.max_wait_ms,
                    queue_size=self.settings.queue_size,
                    metrics=self.metrics,
                    runners=self.settings.runners,
                    interactive_tokens=self.settings.interactive_tokens,
                    max_bulk_tokens=self.settings.max_bulk_tokens,
                    in_flight=self.in_flight,
                )
                batcher.start()
            except Exception as e:  # a bug of ours, not the bundle's: /ready reports it, the process stays up
                self.state, self.detail = "failed", f"{type(e).__name__}: {e}"
                log.exception("starting the batchers failed")
                return
            self.models[bundle.name] = Model(bundle, tokenizer, engine, batcher)
            log.info("%s: loaded and warmed up (%s)", bundle.name, bundle.manifest.kind)
        if not self.models:
            self.state, self.detail = "failed", "no bundle could be loaded; see GET /models"
        elif self.state == "loading":
            self.state = "ready"

    def _load_and_warm(self, bundle: Bundle) -> tuple[TextTokenizer, Engine]:
        m = bundle.manifest
        tokenizer = TextTokenizer(bundle.tokenizer_path, m.max_length, self.settings.window_stride)
        engine = Engine(
            bundle,
            self.settings.threads_per_runner(),
            self.settings.memory_arena,
            self.settings.providers,
            solo_threads=self.settings.threads_when_alone(),
        )
        # One short and one full-length batch: first runs allocate and pick kernels; a client should not pay.
        for length in (8, m.max_length):
            engine.run(engine.pad([tokenizer.warmup_row(length)] * 2, tokenizer.pad_id))
        if engine.solo is not None:
            engine.run(engine.pad([tokenizer.warmup_row(8)], tokenizer.pad_id), solo=True)
        return tokenizer, engine

    def begin_drain(self) -> None:
        """SIGTERM: refuse new work with 503; what is admitted keeps going."""
        self.state = "draining"
        for model in self.models.values():
            model.batcher.closing = True
        # Called from a signal handler: hand over to the loop. The deadline answers what is still
        # waiting with a JSON 503 *before* uvicorn's own timeout (a little later, see __main__) would
        # cancel those handlers and send a plain-text 500.
        if self._loop is not None and self.settings.graceful_timeout_s > 0:
            self._loop.call_soon_threadsafe(
                self._loop.call_later, self.settings.graceful_timeout_s, self._drain_deadline
            )

    def _drain_deadline(self) -> None:
        msg = f"server shut down: --graceful-timeout-s {self.settings.graceful_timeout_s} passed first"
        unanswered = sum(model.batcher.abort(msg) for model in self.models.values())
        if unanswered:
            self.drain_timed_out = True
            log.warning("graceful timeout: %d request(s) answered 503 unscored", unanswered)

    async def close(self) -> None:
        for model in self.models.values():
            await model.batcher.close()
