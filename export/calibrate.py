"""The calibration step of a detector export: fit the map, choose the default threshold, and check that
int8 stays close to fp32 token by token (export/calibration.py says what and why)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from export import calibration as cal
from export import evaldata
from export.evaluation.items import MIN_SENTENCES, CalibrationDataError, Texts, build_texts, fitting
from export.evaluation.scoring import score
from export.parity import ParityError, deviation, roc_auc
from export.wordscores import WordScorer
from training.progress import progress_bar

# Per-token |int8 - fp32| of the calibrated probability, on the calibration sentences: the gate beside
# the AUC drop. AUC hides a token whose probability moves by 0.2 as long as the ranking over many tokens
# holds; a user reading one sentence's scores does not.
MAX_DEVIATION_P99 = 0.02
MAX_DEVIATION = 0.1


@dataclass
class Calibration:
    cmap: cal.LengthMap
    texts: Texts
    ece_before: float
    ece_fitted: float


def fit(src, fp32_onnx: Path, tokenizer: Path):
    """Score the calibration sentences with the uncalibrated fp32 graph, fit the map; returns the
    export source with the map in its graph (and in the torch side parity compares with)."""
    from tokenizers import Tokenizer

    from export.onnx import CalibratedLogits

    cfg = src.cfg
    generator = evaldata.run_generator(src.ckpt, Tokenizer.from_file(str(tokenizer)))
    data_dir = cfg.data_dir  # as given: "" is none, over $ELECTRA_DATA_DIR, as the registry reads it
    # The long quiet stretches of an export (the swaps here, the int8 check, the threshold's scoring: 15,
    # 9 and 7 s for the tiny config on 2 cores, minutes for a larger model on a busy machine) each say
    # what they do before they start.
    src.log("calibration: swapping words in held-out sentences" + (" with the run's generator" if generator else "")
            + ", by frequency and by part of speech ...")  # fmt: skip
    texts = build_texts(
        tokenizer,
        generator,
        cfg.calibration_text,
        data_dir,
        cfg.calibration_sentences,
        cfg.seed,
        progress=True,
    )
    built, texts = len(texts.texts), fitting(texts, Tokenizer.from_file(str(tokenizer)), src.max_length)
    if len(texts.texts) < built:
        src.log(f"calibration: {built - len(texts.texts)} of {built} sentences left out: longer than one row of "
                f"max_length {src.max_length}")  # fmt: skip
    src.log(f"calibration: {len(texts.texts)} sentences from {texts.source_counts()} ({texts.counts()})")
    if len(texts.texts) < built:
        _enough_that_fit(texts, built, src)
    if not texts.texts:  # a map fitted on nothing would be the identity's guess, shipped as calibrated
        raise CalibrationDataError("calibration found no held-out sentence it could use (each must tokenize to words the "
                         "model knows); check that the tokenizer is the model's, or pass --no-calibrate")  # fmt: skip
    _, probs, labels, lengths = score(WordScorer(fp32_onnx, tokenizer, src.max_length), texts)
    cmap = cal.LengthMap.fit(probs, labels, lengths)
    if cmap.identity:
        src.log("warning: calibration: on these sentences the model's scores do not rise with replaced tokens "
                "(a fitted map would reverse its ranking): the probabilities are left as the model gives them")  # fmt: skip
    fitted = cmap.apply(probs, lengths)
    result = Calibration(cmap, texts, cal.expected_calibration_error(probs, labels),
                         cal.expected_calibration_error(fitted, labels))  # fmt: skip
    for b in cmap.to_manifest():
        src.log(f"calibration: rows of {b['tokens']} tokens: sigmoid({b['scale']:.4f} z + {b['bias']:.4f})")
    src.log(f"calibration: ECE {result.ece_before:.4f} -> {result.ece_fitted:.4f}")
    src.graph.calibration = cmap
    return dataclasses.replace(src, model=CalibratedLogits(src.model, cmap)), result


def _enough_that_fit(texts, built: int, src) -> None:
    """After the sentences longer than a row are left out, enough must stay, clean and swapped alike: a
    --max-length of 12 once left 2 and no clean one, and the figures at the threshold came out NaN."""
    swapped = sum(span is not None for span in texts.spans)
    clean = len(texts.texts) - swapped
    if len(texts.texts) >= MIN_SENTENCES and clean and swapped:
        return
    allowed = src.mcfg.max_position_embeddings
    # A model of 8 positions was told to export at a larger --max-length, which it cannot take.
    longer = (f"export with a larger --max-length (the model has {allowed} positions), or "
              if src.max_length < allowed else f"the model has no positions past its {allowed}: ")  # fmt: skip
    raise CalibrationDataError(
        f"calibration: {len(texts.texts)} of {built} sentences fit one row of max_length {src.max_length} "
        f"({clean} clean, {swapped} swapped); fitting the map needs at least {MIN_SENTENCES}, clean and swapped "
        f"alike: {longer}pass --no-calibrate"
    )


def finish(c: Calibration, bundle_dir: Path, src) -> dict:
    """The default threshold and the figures, measured on the bundle's own model.onnx (the precision
    being shipped): the manifest's `threshold` and `calibration`."""
    from export.bundle_writer import MODEL, TOKENIZER

    scorer = WordScorer(bundle_dir / MODEL, bundle_dir / TOKENIZER, src.max_length)
    src.log(
        f"default threshold: scoring the {len(c.texts.texts)} calibration sentences with the bundle's model ..."
    )
    with progress_bar(total=len(c.texts.texts), desc="default threshold", unit="sentence") as bar:
        sentences, probs, labels, lengths = score(scorer, c.texts, bar=bar)
    chosen = cal.choose_threshold(sentences)
    shown = json.dumps(_no_nan(chosen), default=lambda v: v.item() if hasattr(v, "item") else str(v))
    src.log(f"default threshold: {shown}")  # JSON, as the lines beside it
    unlike = unlike_training(src.ckpt, src.cfg.calibration_text)
    warnings = quality_warnings(ranking_auc(probs, labels, c.cmap.bucket(lengths)), chosen, unlike)
    for warning in warnings:
        src.log(f"warning: {warning}")
    return {
        **({"warnings": warnings} if warnings else {}),  # /models shows them with the bundle's own
        "threshold": chosen["threshold"],
        "calibration": {
            "method": "platt by length",
            "map": "sigmoid(scale * logit + bias), the scale and bias of the row's length bucket (its "
            "attention mask's token count, [CLS] and [SEP] included), in the graph before its output Sigmoid",
            "buckets": c.cmap.to_manifest(),
            "operating_point": operating_point(c.texts),
            "in_words": in_words(chosen),
            "data": c.texts.where,
            "sentences": c.texts.counts(),
            "sources": c.texts.source_counts(),
            "ece_uncalibrated": c.ece_before,
            "ece": cal.expected_calibration_error(probs, labels),
            "threshold_rule": f"the highest recall whose spans keep a precision of at least {cal.TARGET_PRECISION} "
            f"(on at least {cal.MIN_SPANS} spans) and give a span to at most {cal.EVERYDAY_CLEAN_WITH_SPAN:.0%} "
            f"of clean sentences of {cal.EVERYDAY_MAX_WORDS} words or fewer",
            "at_threshold": _no_nan({k: v for k, v in chosen.items() if k != "threshold"}),
            "spans": "words with a letter or digit; punctuation keeps its probability but is never a span",
        },
    }


NEAR_CHANCE_AUC = 0.6  # word-level ROC AUC under which a detector's scores say little (0.5: chance)
# Under this the ranking is reversed, not weak: a few hundred sentences a kind put chance within about
# 0.02 of 0.5. A detector trained on a user's corpus gave 0.05 on the default calibration sentences and
# 0.54 on text of its own kind: "barely tells" and "train it longer" sent its user the wrong way.
REVERSED_AUC = 0.45
NEAR_CHANCE = "the detector barely tells"  # how each near-chance warning begins (one is enough)
REVERSED = "the detector ranks"  # how each reversed-ranking warning begins
WEAK_RANKING = (NEAR_CHANCE, REVERSED)


def ranking_warning(auc: float, what: str, others: str, on: str, instead: str) -> str | None:
    """A warning for a detector whose ranking says little or runs backwards on `on` (the text scored):
    `what` are the tokens it should put above `others` ("swapped words", "the rest"), `instead` the option
    that scores text of the user's own kind (--calibration-text, --eval-text). None from NEAR_CHANCE_AUC up."""
    figure = f"ROC AUC {auc:.2f} on {on}; 0.5 is chance"
    if auc < REVERSED_AUC:
        return (f"{REVERSED} {what} below {others} ({figure}, and under it the ranking is reversed, not "
                f"weak): on this text its probabilities point the wrong way. A detector does that on text unlike "
                f"what it trained on: export again with {instead} FILE, held-out text of the kind it trained on and "
                "will score; if it stays under 0.5 there, train it longer or on more text")  # fmt: skip
    if auc < NEAR_CHANCE_AUC:
        return (f"{NEAR_CHANCE} {what} from {others} ({figure}): its probabilities say little. "
                "Train it longer or on more text")  # fmt: skip
    return None


def unlike_training(ckpt: Path, calibration_text: str | None) -> str | None:
    """A warning where a pretraining run's corpus (its trainer_state.json) and the registry sources it is
    calibrated on share no source: a detector trained on a user's corpus, calibrated on the default
    sentences, is fitted to text of another kind (and can rank it backwards). None for a checkpoint from
    elsewhere, or text of the user's own (--calibration-text FILE: theirs to choose)."""
    from export.sentence_sources import CALIBRATION_SOURCES
    from training.data.corpus_sources import REGISTRY_CORPORA

    config = evaldata.trainer_state(ckpt).get("config")
    corpus = config.get("corpus") if isinstance(config, dict) else None
    if not isinstance(corpus, str) or (calibration_text and Path(calibration_text).exists()):
        return None
    trained = [c.strip() for c in corpus.split(",") if c.strip()]
    given = [n.strip() for n in calibration_text.split(",") if n.strip()] if calibration_text else []
    sources = given or list(CALIBRATION_SOURCES)
    if not trained or set(trained) & set(sources):
        return None
    # A path by its name alone: the manifest, which carries this warning, travels to other machines.
    named = ", ".join(c if c in REGISTRY_CORPORA else Path(c).name for c in trained)
    which = ", ".join(sources) if given else f"the default sources, {', '.join(sources)}"
    return (f"the calibration sentences ({which}) come from none of the corpora the detector trained on "
            f"({named}): its map, default threshold and the figures at it are fitted to them, and where its own "
            "text is of another kind they do not hold for it (a detector can even rank such text backwards). "
            "Export with --calibration-text FILE: held-out text like its training corpus (documents it did not "
            "train on; plain text, blank lines between documents)")  # fmt: skip


def ranking_auc(probs: np.ndarray, labels: np.ndarray, buckets: np.ndarray) -> float:
    """ROC AUC within each length bucket, weighted by its tokens: how well the model itself ranks. Pooled
    over buckets, the calibration's own per-length biases would count as skill (a random model reached
    0.63 so, past the near-chance gate)."""
    total, weighted = 0, 0.0
    for b in np.unique(buckets):
        sel = buckets == b
        if 0 < labels[sel].sum() < sel.sum():
            weighted += sel.sum() * roc_auc(probs[sel], labels[sel])
            total += sel.sum()
    return weighted / total if total else roc_auc(probs, labels)


def quality_warnings(auc: float, chosen: dict, unlike: str | None = None) -> list[str]:
    """What a user must hear before serving the bundle: calibration text unlike the training corpus
    (`unlike`, from unlike_training), a detector near chance or ranking backwards, and a default threshold
    that misses the rule it was chosen by (the export still writes it; a weak model is a valid bundle)."""
    out = [unlike] if unlike else []
    if weak := ranking_warning(
        auc, "swapped words", "the rest", "the calibration sentences", "--calibration-text"
    ):
        out.append(weak)
    if "note" in chosen and "precision" not in chosen:  # not one span at any threshold
        out.append(f"the default threshold {chosen['threshold']} is a guess: {chosen['note']}")
    elif "note" in chosen:
        clean = chosen.get("everyday", chosen)[
            "clean_with_span"
        ]  # the rule's clean sentences: the short ones
        out.append(f"the default threshold {chosen['threshold']} misses the rule ({chosen['note']}): at it, "
                   f"{chosen['precision']:.0%} of its {chosen['spans']} spans are swapped words and {clean:.0%} "
                   "of clean short sentences get one")  # fmt: skip
    return out


def _no_nan(figures):
    """JSON has no NaN: a figure with nothing to count (precision without spans) is null."""
    if isinstance(figures, dict):
        return {k: _no_nan(v) for k, v in figures.items()}
    return None if isinstance(figures, float) and figures != figures else figures


SWAP_NAMES = {"generator": "generator", "frequency": "similar-frequency", "pos": "same-part-of-speech"}


def operating_point(texts: Texts) -> str:
    """What the map and threshold were fitted on, from the calibration sentences themselves: the swaps
    made, and each source's shape of text. It once said "short everyday ones of 6-14 words and long ones"
    whatever was given, also for a --calibration-text of the user's own."""
    from export.evaluation.items import MAX_WORDS, MIN_WORDS
    from export.sentence_sources import SHORT_WORDS, SOURCES

    swaps = [SWAP_NAMES.get(k, k) for k in texts.counts() if k != "clean"]
    shares = " in equal shares" if len(swaps) > 1 else ""
    short, long, own = [], [], []
    for name in texts.source_counts():
        source = SOURCES.get(name)
        if source is None:  # a file or directory of the user's
            own.append(name)
        else:
            (short if source.words == SHORT_WORDS else long).append(source)
    shapes = []
    if short:
        lo, hi = short[0].words
        shapes.append(f"short everyday ones of {lo}-{hi} words ({', '.join(s.name for s in short)})")
    if long:
        lo, hi = long[0].words
        shapes.append(f"long ones of {lo}-{hi} words ({', '.join(s.name for s in long)})")
    if own:
        shapes.append(f"sentences of {MIN_WORDS}-{MAX_WORDS} words from your own text ({', '.join(own)})")
    return (f"held-out sentences, half with one word swapped ({_listed(swaps)} swaps{shares}), half clean: "
            + " and ".join(shapes))  # fmt: skip


def _listed(names: list[str]) -> str:
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


def in_words(chosen: dict) -> str:
    """The operating point as a user reads it, from the calibration sentences' own figures."""

    if "spans" not in chosen:  # not one span at any threshold: the note says so
        return chosen["note"]

    def said(f: dict, what: str) -> str:
        if not f["spans"]:
            return f"{what}: no word reaches the threshold"
        # A share of a handful of flagged words is mostly luck: "about 10 in 10" of one word says so.
        few = (f" (of only {f['spans']} flagged word{'s' if f['spans'] > 1 else ''}: too few to go by)"
               if f["spans"] < cal.MIN_SPANS else "")  # fmt: skip
        return (f"{what}: about {round(10 * f['recall'])} in 10 swapped words are flagged, about "
                f"{round(10 * f['precision'])} in 10 of the words flagged are swapped{few}, and about "
                f"{round(100 * f['clean_with_span'])} in 100 sentences with no swap get a span")  # fmt: skip

    if "everyday" not in chosen:
        return said(chosen, "one swapped word in a sentence")
    text = said(chosen["everyday"], "one swapped word in a short sentence (6-14 words)")
    if "longer" in chosen:
        text += "; " + said(chosen["longer"], "in a longer one (15-30 words)")
    return text


def token_deviation(
    reference, int8: Path, tokenizer: Path, max_length: int, texts: Texts, quantization_aware: bool = False,
    instead: str | None = None,
) -> dict:  # fmt: skip
    """p50 / p99 / max of |int8 - reference| over every token of the calibration sentences, through the
    server's word scoring; `reference` is the fp32 graph's path or a session (parity.TorchReference).
    ParityError beyond the gate, naming `instead` (check_deviation's) to export in its place."""
    # Part of the int8 check's quiet stretch: its bar counts the sentences once for each model.
    with progress_bar(total=2 * len(texts.texts), desc="int8 token deviation", unit="sentence") as bar:
        a = WordScorer(reference, tokenizer, max_length).results(texts.texts, bar=bar)
        b = WordScorer(int8, tokenizer, max_length).results(texts.texts, bar=bar)
    figures = deviation([t.prob for r in a for t in r.tokens], [t.prob for r in b for t in r.tokens])
    return check_deviation(
        figures, "the calibration sentences", quantization_aware, instead=instead or INT8_WEIGHTS
    )


INT8_WEIGHTS = "--int8 weights (int8 storage, fp32 compute)"
FP32 = "--precision fp32 (or fp16)"  # what is left once int8 weights miss the gate too


def check_deviation(figures: dict, where: str, quantization_aware: bool = False,
                    output: str = "a token's probability", instead: str = INT8_WEIGHTS) -> dict:  # fmt: skip
    """Adds the gate to `figures` (parity.deviation); ParityError when p99 or max is beyond it. `output`:
    what moved, as the user reads the bundle's answers; `instead`: the export to try in its place."""
    figures["gate"] = {"p99": MAX_DEVIATION_P99, "max": MAX_DEVIATION}
    if not (figures["p99"] <= MAX_DEVIATION_P99 and figures["max"] <= MAX_DEVIATION):
        qat = instead == INT8_WEIGHTS and not quantization_aware
        raise ParityError(
            f"int8 moves {output} from its reference by {figures['p99']:.3f} at p99 and "
            f"{figures['max']:.3f} at most (gate {MAX_DEVIATION_P99} / {MAX_DEVIATION}) on {where}. Export "
            f"{instead}"
            + (", or train the model quantization-aware (--qat) first" if qat else "")
            + "; docs/int8.md says why int8 can miss the gate"
        )
    return figures
