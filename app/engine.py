"""One ONNX Runtime session per model, with options for a dynamic-shape, batch-at-a-time workload."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import onnxruntime as ort

from app.bundle import Bundle
from app.tokenization import Row

log = logging.getLogger("app")


def session_options(intra_op_threads: int) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.intra_op_num_threads = intra_op_threads  # 0: ORT picks (physical cores)
    # One batch at a time per model: parallelism inside an op pays, between ops it only contends.
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Every batch has a new [batch, seq] shape; the memory-pattern planner would re-plan (and keep
    # growing its arena) for each one (microsoft/onnxruntime#11118).
    so.enable_mem_pattern = False
    return so


def providers() -> list[str]:
    available = ort.get_available_providers()
    return (["CUDAExecutionProvider"] if "CUDAExecutionProvider" in available else []) + [
        "CPUExecutionProvider"
    ]


class Engine:
    def __init__(self, bundle: Bundle, intra_op_threads: int) -> None:
        self.bundle = bundle
        self.session = ort.InferenceSession(
            str(bundle.model_path), sess_options=session_options(intra_op_threads), providers=providers()
        )
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
        log.info(
            "%s: providers %s, inputs %s, %d intra-op thread(s) per run",
            bundle.name, self.session.get_providers(), self.input_names, intra_op_threads,
        )  # fmt: skip

    def pad(self, rows: Sequence[Row], pad_id: int) -> dict[str, np.ndarray]:
        """Right-pad rows to the longest one; attention_mask marks the real tokens."""
        width = max(len(r.ids) for r in rows)
        ids = np.full((len(rows), width), pad_id, dtype=np.int64)
        types = np.zeros((len(rows), width), dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, r in enumerate(rows):
            n = len(r.ids)
            ids[i, :n], types[i, :n], mask[i, :n] = r.ids, r.type_ids, 1
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return {k: feeds[k] for k in self.input_names}

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """Detector: [batch, seq] replaced probabilities; classifier: [batch, num_labels]."""
        return self.session.run([self.output_name], feeds)[0]
