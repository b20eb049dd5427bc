"""A detector graph's word probabilities for many texts, through the server's own code: its tokenizer
(app.model.tokenization), its session options (app.model.engine.session, through export.optimize.session:
on the export's --threads) and its post-processing (app.model.postprocess).

What calibration fits and what the quality benchmark measures is then exactly what `/detect` returns.
Texts are run in batches of similar length; the int8 graph is static (scales fixed at export), so a
text's scores do not depend on its batch-mates.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.model.postprocess import detect_result
from app.model.tokenization import TextTokenizer
from app.schemas import DetectResult

__all__ = ["WordScorer"]


class WordScorer:
    def __init__(self, model, tokenizer: Path, max_length: int, threads: int | None = None) -> None:
        """`model`: a graph's path, or anything answering `run` as a session does (parity.TorchReference);
        `threads` as export.optimize.session's."""
        self.tokenizer = TextTokenizer(tokenizer, max_length, stride=32)
        if hasattr(model, "run"):
            self.session, self.inputs = model, model.inputs
        else:
            from export import (
                optimize,
            )  # here: it imports onnx (the training install's), the scorer needs not

            self.session = optimize.session(model, threads)
            self.inputs = [i.name for i in self.session.get_inputs()]

    def _run(self, encodings, batch_size: int = 32, bar=None) -> list[list[np.ndarray]]:
        """Per text, the graph's output for each of its windows (special tokens included); `bar` (a
        progress bar, or None) advances by each batch's rows."""
        rows = [(t, w, row) for t, enc in enumerate(encodings) for w, row in enumerate(enc.rows)]
        rows.sort(key=lambda r: len(r[2].ids))
        out: list[list[np.ndarray]] = [[None] * len(enc.rows) for enc in encodings]  # type: ignore[list-item]
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            width = len(chunk[-1][2].ids)
            ids = np.full((len(chunk), width), self.tokenizer.pad_id, np.int64)
            mask = np.zeros_like(ids)
            types = np.zeros_like(ids)
            for i, (_, _, row) in enumerate(chunk):
                n = len(row.ids)
                ids[i, :n], types[i, :n], mask[i, :n] = row.ids, row.type_ids, 1
            feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
            probs = self.session.run(None, {k: feeds[k] for k in self.inputs})[0]  # a bundle has one output
            for i, (t, w, row) in enumerate(chunk):
                out[t][w] = probs[i, : len(row.ids)]
            if bar is not None:
                bar.update(len(chunk))
        return out

    def results(self, texts: list[str], threshold: float = 0.5, bar=None) -> list[DetectResult]:
        """Per text, what /detect returns for it at `threshold`, with words and tokens; `bar`: as _run's
        (one row a text, for texts that fit one window)."""
        encodings = self.tokenizer.encode_detect(texts)
        outputs = self._run(encodings, bar=bar)
        return [
            detect_result(text, enc, outs, threshold, "both")
            for text, enc, outs in zip(texts, encodings, outputs, strict=True)
        ]
