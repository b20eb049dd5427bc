"""Held-out data for the int8 accuracy check: text, its corruption, labelled dev sets.

Corruption follows ELECTRA (google-research/electra, `FakedData`): 15% of the real tokens are masked, the
generator samples a replacement for each, and a token counts as replaced only if the sample differs from
the original. Without a generator, replacements come from the unigram distribution of the text itself,
which is easier to detect than a generator's samples; the manifest says which one was used.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from export.config import COLUMN_OPTIONS
from export.parity import MASK_RATE, Batch


class EvalDataError(ValueError):
    """Held-out or labelled data that cannot be found or read; the message says which flag to use."""


# One input of a classifier: a text, or a (text, text_pair) pair, as fine-tuning (training.finetuning.batches.encode)
# and the server (`pairs` of /classify) give the tokenizer a sentence pair.
Input = str | tuple[str, str]


@dataclass(frozen=True)
class Columns:
    """The columns of --eval-data: those the model was fine-tuned with (its trainer_state.json), unless
    --text-column, --text-pair-column or --label-column name others; `text` and `label` for a model from
    elsewhere. `pair` is set for a model fine-tuned on sentence pairs."""

    text: str
    label: str
    pair: str | None = None

    @property
    def read(self) -> tuple[str, ...]:
        """The columns read, in order: text, the pair's second text (a pair model's), label."""
        return tuple(c for c in (self.text, self.pair, self.label) if c)

    def names(self) -> str:
        """'q1', 'q2' and 'lab': the columns, in a message."""
        cols = [repr(c) for c in self.read]
        return f"{', '.join(cols[:-1])} and {cols[-1]}"


def trained_on_pairs(ckpt: Path | None) -> bool | None:
    """Whether fine-tuning gave the model sentence pairs (its config's text_pair_column, which the bundle's
    manifest reads as `trained_on`); None where no fine-tuning recipe says (a model from elsewhere)."""
    config = trainer_state(ckpt).get("config") or {}
    return bool(config["text_pair_column"]) if "text_pair_column" in config else None


def takes_pairs(ckpt: Path | None, cfg=None) -> bool:
    """A classifier checked and calibrated on pairs: fine-tuned on pairs, or given --text-pair-column."""
    return bool(trained_on_pairs(ckpt) or getattr(cfg, "text_pair_column", None))


def eval_columns(ckpt: Path | None, cfg=None) -> Columns:
    """--eval-data's columns: as `cfg` (an ExportConfig) names them, else as fine-tuning read its files."""
    config = trainer_state(ckpt).get("config") or {}

    def pick(name: str, default: str | None) -> str | None:
        return getattr(cfg, name, None) or config.get(name) or default

    return Columns(pick("text_column", "text"), pick("label_column", "label"), pick("text_pair_column", None))


def as_pairs(lines: list[str]) -> list[tuple[str, str]]:
    """Held-out texts for a pair model that has no pairs of its own to be checked on: each two in turn."""
    return list(zip(lines[0::2], lines[1::2], strict=False))


def optional_path(p: str | None) -> Path | None:
    """An option that names a file or directory, as a Path; None when it is not given."""
    return Path(p) if p else None


def _own_lines(eval_text: Path) -> tuple[str, ...]:
    """--eval-text's non-blank lines, opened as --calibration-text and pretraining's --corpus open theirs
    (training/data/corpus_sources.py): a .txt.gz read gunzipped (read as plain bytes it was "not UTF-8"),
    a byte-order mark dropped, a byte that is not UTF-8 named with its line."""
    from training.data.corpus_sources import CorpusError, open_text, reading

    try:
        with reading(eval_text), open_text(eval_text) as f:
            lines = [ln.strip() for ln in f.read().splitlines()]
    except CorpusError as e:
        raise EvalDataError(f"--eval-text: {e}") from None
    return tuple(ln for ln in lines if ln)


def held_out_text(eval_text: Path | None, data_dir: Path | str | None) -> tuple[list[str], str]:
    """(paragraphs, where they came from): --eval-text (one text a line), else WikiText-2 validation.
    Read once per export: the int8 check, the activation ranges and the load-time check all ask."""
    lines, where = _read_held_out(eval_text, data_dir)
    return list(lines), where


@functools.lru_cache(maxsize=4)
def _read_held_out(eval_text: Path | None, data_dir: Path | str | None) -> tuple[tuple[str, ...], str]:
    if eval_text is not None:
        return _own_lines(Path(eval_text)), str(eval_text)
    from training.data.corpus import read_corpus

    try:
        docs = list(read_corpus("wikitext2", "valid", data_dir=data_dir))
    except Exception as e:  # missing files, no network, bad checksum: all end the same way for the user
        raise EvalDataError(
            f"the int8 accuracy check needs held-out text and WikiText-2 validation could not be read ({e}); "
            "pass --eval-text FILE, or --data-dir DIR (or ELECTRA_DATA_DIR) holding wikitext2-valid.raw.gz"
        ) from e
    # An article is its title line then its paragraphs; each paragraph is one text (titles are too short
    # to pass `encode`'s minimum length).
    return tuple(p for d in docs for p in d.split("\n") if p.strip()), "wikitext2 valid"


def encode(tokenizer, texts: list[Input], max_len: int, limit: int, min_tokens: int = 8):
    """Tokenize as fine-tuning and the server do (special tokens by the tokenizer's own post-processor, a
    pair as [CLS] A [SEP] B [SEP] with its type ids, cut longest first; "[SEP]" in a text is text), pad;
    (Batch, special mask)."""
    from app.model.text_heads import text_heads
    from training.finetuning.batches import tokenizer_copy

    # Copies reading typed text as fine-tuning does ("[SEP]" is text; the model's own "[URL]" one token).
    # Each text cut to the start its tokens come from, as fine-tuning cuts it: the tokenizer builds every
    # overflow window of what it is given, and an --eval-data row may hold a whole document.
    counting = tokenizer_copy(tokenizer)
    tokenizer = tokenizer_copy(tokenizer, max_len)  # cut longest first
    heads = [
        text_heads(counting, *(x if isinstance(x, tuple) else (x, None)), max_len) for x in texts[: limit * 2]
    ]
    inputs = [text if pair is None else (text, pair) for text, pair in heads]
    encs = [e for e in tokenizer.encode_batch(inputs) if len(e.ids) >= min_tokens][:limit]
    if not encs:
        raise EvalDataError(
            f"no held-out text of {min_tokens} tokens or more to evaluate on (--eval-text, --eval-data)"
        )
    T = max(len(e.ids) for e in encs)
    ids, mask, types, special = (np.zeros((len(encs), T), np.int64) for _ in range(4))
    for i, e in enumerate(encs):
        n = len(e.ids)
        ids[i, :n], mask[i, :n], types[i, :n], special[i, :n] = e.ids, 1, e.type_ids, e.special_tokens_mask
    return Batch(ids, mask, types), (special == 1) | (mask == 0)


def run_generator(ckpt: Path, tok):
    """The pretraining run's generator in eval mode, or None (a fine-tuned model, an imported discriminator):
    calibration swaps words with it, and the int8 check corrupts held-out text with it. None too where `tok`
    (the bundle's tokenizer) has no [MASK]: a generator predicts the words put in its place."""
    if not (ckpt / "generator").is_dir() or tok.token_to_id("[MASK]") is None:
        return None
    from training.checkpoint import load_model

    generator, _, _ = load_model(ckpt / "generator", "ElectraForMaskedLM")
    return generator.eval()


def corrupt(batch: Batch, special: np.ndarray, generator, mask_id: int, seed: int = 0):
    """(corrupted Batch, labels (B, T) bool, how) with training.pretraining.objective's masking and sampling."""
    from training.pretraining.masking import Corruption, draw_noise
    from training.pretraining.objective import generator_fill, replace_with_samples

    ids = torch.from_numpy(batch.input_ids)
    noise = draw_noise(tuple(ids.shape), seed, 0, slice(None), "cpu")
    vocab = int(generator.config.vocab_size) if generator is not None else int(ids.max()) + 1
    masked = Corruption(mask_id, vocab, mask_prob=MASK_RATE).mask(ids, torch.from_numpy(special), noise)
    if generator is not None:
        with torch.no_grad():
            _, fake = generator_fill(generator, masked, torch.from_numpy(batch.attention_mask),
                                     torch.from_numpy(batch.token_type_ids), noise)  # fmt: skip
        how = (
            "generator: 15% of tokens masked (ELECTRA's 85% [MASK] / 15% kept), replaced by generator samples"
        )
    else:
        counts = torch.bincount(ids[torch.from_numpy(~special)], minlength=vocab).double()
        cdf = counts.cumsum(0) / counts.sum()
        u = masked.at_slots(noise.sample)
        fake = replace_with_samples(masked, torch.searchsorted(cdf, u.double()).clamp_(max=vocab - 1))
        how = (
            "unigram: no generator/ in the checkpoint (or no [MASK] in its vocabulary to feed one); 15% of "
            "tokens replaced by samples from the held-out text's own unigram distribution (easier to detect "
            "than generator samples)"
        )
    out = Batch(fake.input_ids.numpy(), batch.attention_mask, batch.token_type_ids)
    return out, fake.is_replaced.numpy(), how


def read_labelled(
    path: Path, ckpt: Path | None = None, cfg=None, flag: str = "--eval-data"
) -> list[tuple[Input, str]]:
    """(input, label name) rows of --eval-data, read as fine-tuning reads its files (training.finetuning.data:
    the same formats, checks and label names), from the columns the checkpoint was fine-tuned with (its
    trainer_state.json: a pair model's two texts as a (text, text_pair) input), unless `cfg` (an
    ExportConfig) names others; else `text` and `label`. `flag`: what the messages call the file (the run's
    own --dev file, read unasked, was called --eval-data)."""
    from training.finetuning.data import DataError
    from training.finetuning.labels import label_name
    from training.finetuning.rows import missing, read_rows, row_columns

    cols = eval_columns(ckpt, cfg)
    wanted = cols.read
    if len(set(wanted)) < len(wanted):  # --text-pair-column label fed the labels in as the second texts
        roles = {"text": cols.text, "second text": cols.pair, "label": cols.label}
        said = ", ".join(f"{role} {name!r}" for role, name in roles.items() if name)
        raise EvalDataError(f"{flag}: one column in two roles ({said}): --text-column, --text-pair-column "
                            "and --label-column name distinct columns")  # fmt: skip
    try:
        read = read_rows(str(path), flag, wanted)
    except DataError as e:
        raise EvalDataError(str(e)) from None
    rows = read.rows
    if not rows:
        raise EvalDataError(f"{flag} {path}: no labelled rows in it (a header alone?)")
    columns = row_columns(rows)  # not the first row's: a JSONL row may leave a key out (named below)
    if any(c not in columns for c in wanted):
        held = ", ".join(map(repr, columns))  # repr: spaces around a name show
        named = [f"--{n.replace('_', '-')}" for n in COLUMN_OPTIONS if getattr(cfg, n, None)]
        recipe = trainer_state(ckpt).get("config") or {}
        fine_tuned = "text_column" in recipe or "label_column" in recipe
        whose = (
            "those the model was fine-tuned with"
            if fine_tuned
            else "the defaults without a fine-tuning recipe"
        )
        whose += f", as {', '.join(named)} renamed them" if named else ""
        what = " (a text pair and its label)" if cols.pair else ""
        flags = (
            "--text-column, --text-pair-column and --label-column"
            if cols.pair
            else "--text-column and --label-column"
        )
        raise EvalDataError(f"{flag}: {path}: expected columns {cols.names()}{what}, {whose} (it holds: "
                            f"{held}); {flags} name others")  # fmt: skip
    out: list[tuple[Input, str]] = []
    for i, r in enumerate(rows):
        gone = next((c for c in (cols.text, cols.pair) if c and r.get(c) is None), None)
        if gone is None and missing(r.get(cols.label)):
            gone = cols.label
        if gone is not None:
            raise EvalDataError(f"{flag}: {path} {read.place(i)} has no {gone!r}")
        text = str(r[cols.text])
        out.append(((text, str(r[cols.pair])) if cols.pair else text, label_name(r[cols.label])))
    return out


def trainer_state(ckpt: Path | None) -> dict:
    """The checkpoint's trainer_state.json (fine-tuning's task, columns and options); {} where it has none."""
    path = ckpt / "trainer_state.json" if ckpt is not None else None
    if path is None or not path.is_file():
        return {}
    try:
        state = json.loads(path.read_text())
    except ValueError:
        return {}
    return state if isinstance(state, dict) else {}


def label_ids(
    rows: list[tuple[str, str]], id2label: dict[int, str], ptype: str, where: str = "--eval-data"
) -> np.ndarray:
    """Label column -> class index (by name, else by number) or float for regression. `where`: the rows'
    source as the message names it: --eval-data, or the run's own dev file, which export reads unasked
    (a label it refuses there was blamed on an --eval-data never given)."""
    if ptype == "regression":
        from training.finetuning.labels import as_float  # fine-tuning's rule: finite numbers only

        bad = next((lab for _, lab in rows if as_float(lab) is None), None)
        if bad is not None:
            raise EvalDataError(
                f"{where}: label {bad!r} is not a number, and the model is a regression{_unless_given(where)}"
            )
        return np.array([as_float(lab) for _, lab in rows])
    from training.finetuning.labels import as_float, label_name  # fine-tuning's spellings: "1.0" is "1"

    by_name = {label_name(v): k for k, v in id2label.items()}
    # A number names a class by its index only for a model whose labels are not numbers themselves
    # (LABEL_0, LABEL_1 of an import): a model fine-tuned on labels 1 and 2 once read a 0 as its label "1".
    numbered = any(as_float(name) is not None for name in by_name)
    out = []
    for _, lab in rows:
        name = label_name(lab)
        if name in by_name:
            out.append(by_name[name])
        elif not numbered and name.isdigit() and int(name) in id2label:
            out.append(int(name))
        else:
            raise EvalDataError(
                f"{where}: label {lab!r} is not one of the model's labels {sorted(by_name)}{_unless_given(where)}"
            )
    return np.array(out)


def _unless_given(where: str) -> str:
    return "" if where == "--eval-data" else _EDITED


# Said of the run's own dev file, which export reads unasked, where it is found wrong.
_EDITED = ("; edited since the model was fine-tuned? Restore it, or give --eval-data FILE: labelled rows of the "
           "model's labels to check it on")  # fmt: skip


def registry_dev_rows(
    ckpt: Path, data_dir: Path | str | None, split: str = "dev"
) -> tuple[list[tuple[str, str]], str] | None:
    """A split (default dev) of the registry task named in trainer_state.json (`task`, or `config.task`)."""
    state = trainer_state(ckpt)
    task = state.get("task") or (state.get("config") or {}).get("task")
    if not task:
        return None
    from training.finetuning.sets import LABELLED_SETS, load_labelled

    if task not in LABELLED_SETS:
        return None
    data = load_labelled(task, data_dir=data_dir)
    return [(text, data.labels[i]) for text, i in data[split]], f"registry task {task!r} {split} split"


def run_dev_rows(ckpt: Path) -> tuple[list[tuple[Input, str]], str] | None:
    """The dev rows a classifier fine-tuned on the user's own files was selected on: its --dev file, read as
    --eval-data is, or the share of --train fine-tuning held out (seeded, so the same rows), while those
    files are still there; a pair model's as pairs; None otherwise (a regression, files gone)."""
    from training.finetuning.data import CLASSIFICATION

    state = trainer_state(ckpt)
    config = state.get("config") or {}
    train, dev = config.get("train"), config.get("dev")
    if state.get("problem_type") != CLASSIFICATION or not train:
        return None
    if dev:
        if not Path(dev).is_file():
            return None
        try:
            return read_labelled(Path(dev), ckpt, flag="the run's --dev file"), f"the run's --dev file {dev}"
        except EvalDataError as e:
            raise EvalDataError(f"{e}{_EDITED}") from None
    data = _run_data(config)
    if data is None:
        return None
    return [
        (_input(ex), data.labels[ex.label]) for ex in data.splits["dev"]
    ], f"the run's dev split ({data.source['dev']})"


def run_train_inputs(ckpt: Path) -> tuple[list[Input], str] | None:
    """The inputs a model was fine-tuned on from the user's own files (--train, less the dev share it held
    out), a pair model's as pairs, while those files are still there: what its activation ranges are set
    on. None for a registry task (registry_dev_rows reads those) or files gone."""
    data = _run_data(trainer_state(ckpt).get("config") or {})
    if data is None:
        return None
    return [_input(ex) for ex in data.splits["train"]], f"the run's train split ({data.source['train']})"


_RUN_DATA: dict[str, object] = {}


def _run_data(config: dict):
    """Fine-tuning's own reading and split of the run's --train (and --dev) files; None where it has none.
    Read once per export: an int8 pair model wants both its train inputs (ranges) and its dev rows
    (threshold), and reading twice printed each of the reader's warnings twice."""
    from types import SimpleNamespace

    from training.finetuning.data import DataError, load_task_data

    if config.get("task") or not config.get("train") or not Path(config["train"]).is_file():
        return None
    # Keyed by the files' sizes and times too: a process exporting again (a test, a notebook) after the
    # files changed reads them again.
    files = [Path(config[k]) for k in ("train", "dev") if config.get(k) and Path(config[k]).is_file()]
    key = json.dumps([config, [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]],
                     sort_keys=True, default=str)  # fmt: skip
    if key not in _RUN_DATA:
        _RUN_DATA.clear()  # the last run's data only: a notebook exporting run after run keeps one
        try:
            _RUN_DATA[key] = load_task_data(SimpleNamespace(**config), reread_by="export")
        except (DataError, TypeError, AttributeError):  # files edited since, or a config of another version
            _RUN_DATA[key] = None
    return _RUN_DATA[key]


def _input(ex) -> Input:
    """A fine-tuning example's input: its text, or its (text, text_pair)."""
    return ex.text if ex.pair is None else (ex.text, ex.pair)
