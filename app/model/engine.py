"""One ONNX Runtime session per model, with options for a dynamic-shape, batch-at-a-time workload."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from app.model.bundle import Bundle, BundleError
from app.model.faults import FaultInjector
from app.model.tokenization import Row
from app.model_settings import ARENA_MODES, PROVIDERS
from app.settings import SettingsError

log = logging.getLogger("app")


# How ONNX Runtime's CPU arena may hold memory (ARENA_MODES; issue 12: one request of a megabyte grew
# the process fourfold, and the arena kept it). "shrink": keep the arena (small batches reuse it) but
# hand back what a batch larger than SHRINK_TOKENS grew it by, after that run; "off": no arena, every run
# allocates from the system; "on": ORT's default, grows to the largest batch seen and keeps it.
# SHRINK_TOKENS is below the default --bulk-batch-tokens, so that every bulk batch hands its memory back
# (docs/benchmarks.md, "Memory").
SHRINK_TOKENS = 2048


def _glibc():
    """glibc, to hand freed heap back to the system (malloc_trim): without it, the buffers of one big
    batch stay resident even with ORT's arena off (docs/benchmarks.md, "Memory"). None elsewhere."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _glibc()


# PROVIDERS (--providers): auto is CUDA when onnxruntime offers it, else CPU.


class ProviderError(SettingsError):
    """--providers asks for what this onnxruntime cannot give; the message names the setting."""


def session_options(
    intra_op_threads: int,
    arena: str = "shrink",
    *,
    spinning: bool = True,
    stop_spinning_after_run: bool = False,
    quiet: bool = False,
) -> ort.SessionOptions:
    """The server's options; the engine benchmark and the export checks take the same ones, so what
    they measure is what the server runs. `spinning=False` is a variant the benchmark times."""
    so = ort.SessionOptions()
    so.enable_cpu_mem_arena = arena != "off"
    so.intra_op_num_threads = intra_op_threads  # 0: ORT picks (physical cores)
    # One batch at a time per model: parallelism inside an op pays, between ops it only contends.
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Every batch has a new [batch, seq] shape; the memory-pattern planner would re-plan (and keep
    # growing its arena) for each one (microsoft/onnxruntime#11118).
    so.enable_mem_pattern = False
    if not spinning:  # ORT's default (on) is what the server keeps
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if stop_spinning_after_run:
        # Spin inside a run (the pool's threads meet at every op), not after it: a pool still spinning
        # when the run is over holds the core the event loop needs to answer and take the next request.
        so.add_session_config_entry("session.force_spinning_stop", "1")
    if quiet:
        so.log_severity_level = 3  # a fused graph's shape-inference notes are not the user's concern
    return so


def providers(setting: str = "auto") -> list[str]:
    """ONNX Runtime's provider list for --providers; "cuda" without CUDA is an error, not a fallback."""
    if setting not in PROVIDERS:
        raise ProviderError(f"--providers must be one of {', '.join(PROVIDERS)}, not {setting!r}")
    available = ort.get_available_providers()
    cuda = "CUDAExecutionProvider" in available
    if setting == "cuda" and not cuda:
        raise ProviderError(
            f"--providers cuda: this onnxruntime offers no CUDAExecutionProvider (it has "
            f"{', '.join(available)}); install onnxruntime-gpu on a machine with CUDA, or use "
            "--providers auto or cpu"
        )
    return (["CUDAExecutionProvider"] if cuda and setting != "cpu" else []) + ["CPUExecutionProvider"]


def session(
    path: str | Path,
    intra_op_threads: int = 0,
    *,
    providers_setting: str = "auto",
    arena: str = "shrink",
    spinning: bool = True,
    stop_spinning_after_run: bool = False,
    quiet: bool = False,
) -> ort.InferenceSession:
    """The one way this project opens an ONNX Runtime session (server, benchmarks, export checks)."""
    options = session_options(
        intra_op_threads,
        arena,
        spinning=spinning,
        stop_spinning_after_run=stop_spinning_after_run,
        quiet=quiet,
    )
    return ort.InferenceSession(
        str(path),
        sess_options=options,
        providers=providers(providers_setting),
    )


def check_output_width(bundle: Bundle, sess: ort.InferenceSession) -> None:
    """Refused (BundleError): a classifier whose graph gives another number of outputs than its manifest
    names labels (a manifest edited by hand). /classify answered under made-up names, LABEL_0 and on, that
    /models never listed, a regression's `score` was its first output's, and bulk failed every part with a
    KeyError. A width the graph leaves open (a dimension by name) is not judged."""
    m = bundle.manifest
    shape = next((o.shape for o in sess.get_outputs() if o.name == m.output), None)
    width = shape[-1] if shape else None
    if m.kind != "classifier" or not isinstance(width, int) or width == len(m.labels):
        return
    raise BundleError(f"{bundle.path / 'manifest.json'}: `labels` names {len(m.labels)} output(s) "
                      f"({', '.join(m.labels)}) and the model gives {width}: /classify answers each output "
                      "under its label; give one label per output, in the model's order, or export the model "
                      "again (python -m export writes them from its id2label)")  # fmt: skip


class Engine:
    """A model's sessions: the runners' one, and optionally a wider one for a batch that runs alone.

    Each runner's batch gets `intra_op_threads` (the cores shared out among the runners), which is what
    a loaded server wants. When one request is all there is, that leaves cores idle: the `solo` session
    (`solo_threads` > intra_op_threads, on the CPU only) runs such a batch on all of them.
    """

    def __init__(
        self,
        bundle: Bundle,
        intra_op_threads: int,
        arena: str = "shrink",
        providers_setting: str = "auto",
        solo_threads: int = 0,
    ) -> None:
        assert arena in ARENA_MODES, arena
        self.bundle = bundle
        self.session = session(
            bundle.model_path, intra_op_threads, providers_setting=providers_setting, arena=arena
        )
        self.solo: ort.InferenceSession | None = None
        on_cpu = self.session.get_providers()[0] == "CPUExecutionProvider"
        if on_cpu and solo_threads > intra_op_threads:
            self.solo = session(
                bundle.model_path, solo_threads, providers_setting="cpu", arena=arena,
                stop_spinning_after_run=True, quiet=True,
            )  # fmt: skip
        self.faults: FaultInjector | None = None  # --inject-faults, set once the engine is warm
        # Runs that raised since the last one that did not, and the last one's error: a replica whose engine
        # fails every run leaves readiness on it (app/scheduling/health.py). Written by the runners' threads
        # without a lock: a count one short for a moment only delays that by a run.
        self.failures_in_a_row = 0
        self.last_failure = ""
        self._shrink: ort.RunOptions | None = None
        if arena == "shrink":
            self._shrink = ort.RunOptions()
            self._shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        # Feed what the graph takes, whatever the manifest claims: an exported graph whose
        # token_type_ids were constant-folded away has no such input, and feeding it is an error.
        self.input_names = [i.name for i in self.session.get_inputs()]
        unknown = set(self.input_names) - {"input_ids", "attention_mask", "token_type_ids"}
        if unknown:
            raise ValueError(f"{bundle.model_path}: unsupported graph inputs {sorted(unknown)}")
        outputs = [o.name for o in self.session.get_outputs()]
        if bundle.manifest.output not in outputs:
            raise ValueError(
                f"{bundle.model_path}: output {bundle.manifest.output!r} not in graph outputs {outputs}"
            )
        self.output_name = bundle.manifest.output
        check_output_width(bundle, self.session)
        log.info(
            "%s: providers %s, inputs %s, %d intra-op thread(s) per run%s",
            bundle.name, self.session.get_providers(), self.input_names, intra_op_threads,
            f", {solo_threads} for a batch that runs alone" if self.solo else "",
        )  # fmt: skip

    @property
    def has_solo(self) -> bool:
        """Whether this engine has the wider session for a batch that runs alone (it decides: on the
        CPU, when --solo-threads gives more threads than a runner's share)."""
        return self.solo is not None

    def pad(self, rows: Sequence[Row], pad_id: int) -> dict[str, np.ndarray]:
        """Right-pad rows to the longest one; attention_mask marks the real tokens."""
        width = max(len(r.ids) for r in rows)
        ids = np.full((len(rows), width), pad_id, dtype=np.int64)
        types = np.zeros((len(rows), width), dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, r in enumerate(rows):
            n = len(r.ids)
            ids[i, :n], types[i, :n], mask[i, :n] = r.ids, r.type_ids, 1
        return self.feeds(ids, mask, types)

    def feeds(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> dict[str, np.ndarray]:
        """A padded batch as this graph's inputs: the ones it takes, whatever the manifest lists (the
        load-time check feeds its rows through here too, so a bundle is checked as it is served)."""
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return {k: feeds[k] for k in self.input_names}

    def run(self, feeds: dict[str, np.ndarray], solo: bool = False) -> np.ndarray:
        """Detector: [batch, seq] replaced probabilities; classifier: [batch, num_labels]. `solo`: the
        caller knows nothing else runs; the wider session is used when there is one."""
        assert not solo or self.solo is not None, "placement chose the solo session of an engine without one"
        sess = self.solo if solo else self.session
        big = self._shrink is not None and next(iter(feeds.values())).size > SHRINK_TOKENS
        try:
            if self.faults is not None:
                self.faults.check(feeds)
            out = sess.run([self.output_name], feeds, self._shrink if big else None)[0]
        except Exception as e:
            self.failures_in_a_row += 1
            self.last_failure = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
            raise
        self.failures_in_a_row = 0
        if big and _LIBC is not None:
            _LIBC.malloc_trim(0)  # after the arena shrank: give the freed pages back
        return out
