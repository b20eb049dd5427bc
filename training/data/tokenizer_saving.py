"""Saving a tokenizer with the tokenizer_config.json transformers reads it by (save_tokenizer, copy_tokenizer),
and what transformers would read otherwise than training does (transformers_reads_otherwise)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tokenizers import Tokenizer

from training.data.tokenizer_loading import TOKENIZER_CONFIG, load_tokenizer
from training.errors import write_text_atomically

__all__ = ["save_tokenizer", "transformers_config", "transformers_reads_otherwise", "write_tokenizer_config"]

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", TOKENIZER_CONFIG)  # what save_tokenizer writes


def transformers_reads_otherwise(directory: Path) -> str | None:
    """What transformers does otherwise with a directory's tokenizer.json than training does, or None. With no
    tokenizer_config.json beside it, training takes the file as it is (our checkpoints saved before they
    carried one, cased ones included, were trained so), while transformers reads it as BERT's tokenizer with
    BERT's defaults (lowercased, accents stripped, CJK characters split), whatever the file's normalizer.
    And a file without a post-processor, with or without one (`_specials_left_out`)."""
    if not (directory / "tokenizer.json").is_file():
        return None
    said = [s for s in (_normalised_otherwise(directory), _specials_left_out(directory)) if s]
    return ". Also: ".join(said) or None


def _normalised_otherwise(directory: Path) -> str | None:
    """A tokenizer.json with no tokenizer_config.json beside it that keeps case, accents or CJK characters
    unsplit (transformers_reads_otherwise)."""
    if (directory / TOKENIZER_CONFIG).is_file():
        return None
    norm = json.loads(load_tokenizer(directory / "tokenizer.json").to_str()).get("normalizer") or {}
    if norm.get("type") != "BertNormalizer":
        return None
    keeps = []
    if not norm["lowercase"]:
        keeps.append("case")
    strips = norm["lowercase"] if norm["strip_accents"] is None else norm["strip_accents"]
    if not strips:
        keeps.append("accents")
    if not norm["handle_chinese_chars"]:
        keeps.append("CJK characters unsplit")
    if not keeps:
        return None
    cfg = _config_fields(norm)
    return (f"tokenizer.json keeps {' and '.join(keeps)}, and no tokenizer_config.json is beside it: the bundle "
            "tokenizes as the file says (as training read it), while transformers' AutoTokenizer reads that "
            "directory with BERT's defaults (lowercased, accents stripped), so its ids differ from the bundle's "
            "on such text. If the model was trained on the file as it is (our checkpoints saved before they "
            f"carried a tokenizer_config.json), the bundle is right: write a tokenizer_config.json of {json.dumps(cfg)} "
            "beside it for transformers to agree; if it was trained lowercased, write one with do_lower_case "
            "true and export again")  # fmt: skip


def _specials_left_out(directory: Path) -> str | None:
    """A tokenizer.json without a post-processor: the bundle frames every text with [CLS] ... [SEP], as
    ELECTRA is trained, and transformers' AutoTokenizer does so only on transformers 5 under BERT's and
    ELECTRA's classes (not under PreTrainedTokenizerFast or TokenizersBackend, nor on 4.x under any). The
    export's note said transformers adds them. Naming ELECTRA's class instead would rebuild a tokenizer not
    of BERT's shape otherwise; a post-processor in the file makes every version and class agree."""
    try:
        if json.loads((directory / "tokenizer.json").read_text(encoding="utf-8")).get("post_processor"):
            return None
    except (OSError, ValueError, AttributeError):  # unreadable: the tokenizer's own reading says so
        return None
    return ("tokenizer.json has no post-processor: the bundle frames each text as [CLS] ... [SEP], as ELECTRA is "
            "trained, while transformers' AutoTokenizer frames it so only on transformers 5 under BERT's and "
            "ELECTRA's tokenizer classes (not under PreTrainedTokenizerFast or TokenizersBackend, nor on 4.x), so "
            "its ids and the model's outputs there may differ from the bundle's. If the model was trained with "
            "them (as ELECTRA's pretraining and fine-tuning do), the bundle is right: give tokenizer.json the "
            "post-processor the bundle's has (tokenizers' TemplateProcessing, single \"[CLS] $A [SEP]\", pair "
            "\"[CLS] $A [SEP] $B:1 [SEP]:1\") for every reader to agree; if it was trained without them, it "
            "cannot be served as it is")  # fmt: skip


def copy_tokenizer(source: Path, directory: Path) -> None:
    """A saved tokenizer's files from `source` into `directory` (which must exist), as they are: every
    checkpoint carries its own, since its embedding rows are indexed by the tokenizer's ids. A tokenizer saved
    before tokenizer_config.json was written (a run resumed) gets one made from its tokenizer.json."""
    for name in TOKENIZER_FILES:
        if name == TOKENIZER_CONFIG and not (source / name).is_file():
            write_tokenizer_config(load_tokenizer(source / "tokenizer.json"), directory)
            continue
        (directory / name).write_bytes((source / name).read_bytes())


def save_tokenizer(tok: Tokenizer, directory: str | os.PathLike[str]) -> Path:
    """Write ``tokenizer.json``, ``vocab.txt`` and ``tokenizer_config.json`` into ``directory`` (created if
    needed); return it."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    vocab = tok.get_vocab(with_added_tokens=True)
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    # vocab.txt encodes ids as line numbers, so the ids must be exactly 0..n-1.
    assert [i for _, i in by_id] == list(range(len(by_id))), "vocabulary ids are not contiguous"
    # Each file whole or not at all: every rank, and a resume, reads what rank 0 wrote here.
    write_text_atomically(d / "tokenizer.json", tok.to_str(pretty=True))
    write_text_atomically(d / "vocab.txt", "".join(f"{t}\n" for t, _ in by_id))
    write_tokenizer_config(tok, d)
    return d


def write_tokenizer_config(tok: Tokenizer, directory: Path) -> None:
    """``tokenizer_config.json`` for `tok` in `directory`: without one, transformers reads a directory whose
    config.json is ELECTRA's with BERT's tokenizer and do_lower_case true, rebuilding the normalizer, so a
    cased tokenizer.json came out lowercased there and a checkpoint did not load in transformers unchanged."""
    write_text_atomically(directory / TOKENIZER_CONFIG, json.dumps(transformers_config(tok), indent=2) + "\n")


# BERT's tokens under transformers' names for them: what its tokenizers pad, mask and frame texts with.
_SPECIAL_NAMES = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                  "mask_token": "[MASK]"}  # fmt: skip


def transformers_config(tok: Tokenizer) -> dict:
    """What a tokenizer_config.json says for AutoTokenizer to give `tok`'s ids. transformers' ElectraTokenizer
    rebuilds BERT's tokenizer from the vocabulary and the normalisation said here, so it is named only for a
    tokenizer of that shape; any other is named PreTrainedTokenizerFast, which takes tokenizer.json as it is.
    The normalisation is written either way: our own reader (_as_config_says) follows it."""
    state = json.loads(tok.to_str())
    norm = state.get("normalizer") or {}
    said = _config_fields(norm) if norm.get("type") == "BertNormalizer" else {}
    specials = {name: t for name, t in _SPECIAL_NAMES.items() if tok.token_to_id(t) is not None}
    cls = "ElectraTokenizer" if said and _bert_shaped(state) else "PreTrainedTokenizerFast"
    return {"tokenizer_class": cls, **said, **specials}


def _config_fields(norm: dict) -> dict:
    """A BertNormalizer's settings (its JSON state) under tokenizer_config.json's names for them."""
    return {"do_lower_case": norm["lowercase"], "strip_accents": norm["strip_accents"],
            "tokenize_chinese_chars": norm["handle_chinese_chars"]}  # fmt: skip


def _bert_shaped(state: dict) -> bool:
    """Whether a tokenizer (its JSON `state`) is what transformers' BertTokenizer builds from its vocabulary:
    BertNormalizer cleaning text, BERT's pre-tokenizer, WordPiece with its defaults, no tokens added beyond
    the vocabulary and no other special tokens."""
    model = state.get("model") or {}
    vocab = model.get("vocab") or {}
    return (
        state["normalizer"].get("clean_text") is True
        and (state.get("pre_tokenizer") or {}).get("type") == "BertPreTokenizer"
        and model.get("type") == "WordPiece"
        and model.get("unk_token") == "[UNK]"
        and model.get("continuing_subword_prefix") == "##"
        and model.get("max_input_chars_per_word") == 100
        and all(
            a["content"] in vocab and a["content"] in _SPECIAL_NAMES.values()
            for a in state.get("added_tokens", [])
        )
    )
