"""The detector's calibration by length and its threshold rule (export/calibration.py), without a model."""

from __future__ import annotations

import numpy as np
import pytest

from export.calibration import LengthMap, SentenceScores, choose_threshold, span_figures


def test_a_row_takes_the_bucket_of_its_own_token_count():
    cmap = LengthMap((14, 26), (1.0, 2.0, 3.0), (0.1, 0.2, 0.3))
    assert cmap.bucket(np.array([1, 14, 15, 26, 27, 512])).tolist() == [0, 0, 1, 1, 2, 2]
    # The manifest states each bucket's token range; reading it back gives the same map.
    stated = cmap.to_manifest()
    assert [b["tokens"] for b in stated] == [[1, 14], [15, 26], [27, None]]
    assert LengthMap.from_manifest({"buckets": stated}) == cmap


def test_a_bundle_from_before_length_buckets_reads_as_one_map():
    old = LengthMap.from_manifest({"method": "platt", "scale": 0.8, "bias": -1.9})
    assert old.edges == () and old.bucket(np.array([3, 300])).tolist() == [0, 0]
    p = np.array([0.2, 0.7])
    z = np.log(p / (1 - p))
    np.testing.assert_allclose(old.apply(p, np.array([3, 300])), 1 / (1 + np.exp(-(0.8 * z - 1.9))))


def test_fit_gives_short_rows_their_own_bias():
    """Short rows whose replaced tokens score the same raw logit as long rows' but are replaced more
    often (one word in eight against one in thirty) get a higher calibrated probability."""
    rng = np.random.default_rng(0)
    probs, labels, lengths = [], [], []
    for n, rate in ((10, 1 / 8), (40, 1 / 30)):
        y = rng.random(20000) < rate
        z = np.where(y, rng.normal(1.0, 1.5, y.size), rng.normal(-3.0, 1.5, y.size))
        probs.append(1 / (1 + np.exp(-z)))
        labels.append(y.astype(int))
        lengths.append(np.full(y.size, n))
    cmap = LengthMap.fit(np.concatenate(probs), np.concatenate(labels), np.concatenate(lengths))
    short, long = cmap.apply(np.array([0.5, 0.5]), np.array([10, 40]))
    assert short > long + 0.1


def test_a_map_never_reverses_the_ranking():
    """Scores that run against the labels (a model worse than chance on the calibration data) once gave a
    negative scale in every bucket, and shipped a bundle that flagged clean words over swapped ones."""
    rng = np.random.default_rng(1)
    y = rng.random(20000) < 0.1
    z = np.where(y, rng.normal(-2.0, 1.0, y.size), rng.normal(0.0, 1.0, y.size))  # replaced score lower
    probs, n = 1 / (1 + np.exp(-z)), np.full(y.size, 20)
    cmap = LengthMap.fit(probs, y.astype(int), n)
    assert cmap.identity and all(s > 0 for s in cmap.scales)
    ranked = cmap.apply(np.array([0.2, 0.8]), np.array([20, 20]))
    assert ranked[0] < ranked[1]
    # One bucket reversed among sound ones: it takes the fit of all, not its own.
    z_ok = np.where(y, rng.normal(1.0, 1.0, y.size), rng.normal(-2.0, 1.0, y.size))
    mixed = LengthMap.fit(np.concatenate([1 / (1 + np.exp(-z_ok)), probs[:3000]]),
                          np.concatenate([y, y[:3000]]).astype(int),
                          np.concatenate([np.full(y.size, 40), np.full(3000, 10)]))  # fmt: skip
    assert all(s > 0 for s in mixed.scales) and not mixed.identity


def test_a_random_detector_is_near_chance_even_when_lengths_set_its_rates():
    """Scores with no skill, but short rows replaced more often and lifted by their bucket's bias: pooled,
    the AUC looks like skill; within each bucket it is chance, which is what the warning reads."""
    from export.calibrate import ranking_auc
    from export.parity import roc_auc

    rng = np.random.default_rng(2)
    buckets = np.repeat([0, 1], 20000)
    labels = (rng.random(40000) < np.where(buckets == 0, 0.3, 0.05)).astype(int)
    probs = 1 / (1 + np.exp(-(rng.normal(0, 1, 40000) + np.where(buckets == 0, 2.0, -2.0))))
    assert roc_auc(probs, labels) > 0.6 and abs(ranking_auc(probs, labels, buckets) - 0.5) < 0.02


def _sentences(word_probs: list[list[float]], swapped: list[int | None], words: int) -> list[SentenceScores]:
    return [SentenceScores(np.array(p), s, None, words) for p, s in zip(word_probs, swapped, strict=True)]


def test_threshold_rule_keeps_clean_short_sentences_quiet():
    """At 0.40 every swapped word is a span at precision 0.91, but one clean short sentence in ten gets a
    span; the rule gives up recall for at most 5% of them (80 spans at 0.60: enough to measure)."""
    swapped = _sentences([[0.9, 0.1], [0.6, 0.1], [0.4, 0.1]] * 40, [0, 0, 0] * 40, words=8)
    clean = _sentences([[0.45, 0.1]] * 12 + [[0.1, 0.1]] * 108, [None] * 120, words=8)
    chosen = choose_threshold(swapped + clean)
    assert chosen["threshold"] == 0.6  # the highest of the thresholds with the same recall, 0.46-0.60
    assert chosen["everyday"]["clean_with_span"] == 0.0 and chosen["recall"] == pytest.approx(2 / 3)
    without_rule = choose_threshold(swapped + clean, everyday_clean=1.0)
    assert without_rule["threshold"] == 0.4 and without_rule["recall"] == 1.0
    assert span_figures(clean, 0.4)["clean_with_span"] == pytest.approx(0.1)


def test_a_model_that_never_reaches_the_precision_still_keeps_clean_sentences_quiet():
    """Near chance, the most precise threshold underlined 58% of clean sentences; the quiet ones come first."""
    rng = np.random.default_rng(0)
    swapped = _sentences(rng.uniform(0, 1, (40, 2)).tolist(), [0] * 40, words=8)
    clean = _sentences(rng.uniform(0, 1, (40, 2)).tolist(), [None] * 40, words=8)
    chosen = choose_threshold(swapped + clean)
    assert "the most precise one of those giving at most 5% of clean short sentences a span" in chosen["note"]
    assert chosen["everyday"]["clean_with_span"] <= 0.05 and chosen["precision"] < 0.8
    from export.calibrate import quality_warnings

    said = quality_warnings(0.51, chosen)
    assert (
        "ROC AUC 0.51" in said[0]
        and f"the default threshold {chosen['threshold']} misses the rule" in said[1]
    )
    assert quality_warnings(0.9, {"threshold": 0.5}) == []
    # Far under 0.5 the ranking is reversed, which "barely tells ... train it longer" misread: a detector
    # trained on a user's corpus gave 0.05 on the default sentences and 0.54 on text of its own kind.
    (reversed_,) = quality_warnings(0.05, {"threshold": 0.5})
    assert reversed_.startswith("the detector ranks swapped words below the rest (ROC AUC 0.05"), reversed_
    assert "the ranking is reversed" in reversed_ and "export again with --calibration-text FILE" in reversed_
    assert quality_warnings(0.5, {"threshold": 0.5})[0].startswith(
        "the detector barely tells"
    )  # chance itself
    nothing = quality_warnings(
        0.9, {"threshold": 0.5, "note": "no threshold gives any span on the calibration set"}
    )
    assert nothing == [
        "the default threshold 0.5 is a guess: no threshold gives any span on the calibration set"
    ]
    from export.calibrate import in_words

    assert (
        in_words({"threshold": 0.5, "note": "no threshold gives any span"}) == "no threshold gives any span"
    )
    # Said of the rows' length only: calibrated on a user's own text, they are not "everyday" sentences.
    assert in_words(chosen).startswith("one swapped word in a short sentence (6-14 words): about ")


def test_a_precision_measured_on_a_handful_of_spans_does_not_meet_the_rule():
    """A tiny detector's threshold 0.24 "met" the rule at precision 1/1 (recall 0.007), and /models then said
    about 10 in 10 of the words flagged are swapped. Too few spans to measure a precision miss the rule, with
    its warning; where enough spans are quiet too, those are taken over the lucky few."""
    from export.calibrate import in_words, quality_warnings
    from export.calibration import MIN_SPANS

    # Above 0.5 only the one confident word is a span; at or below it every sentence has a false one.
    lucky = _sentences([[0.97, 0.1]], [0], words=8)
    swapped = _sentences([[0.3, 0.5]] * 100, [0] * 100, words=8)
    clean = _sentences([[0.5, 0.1]] * 100, [None] * 100, words=8)
    chosen = choose_threshold(lucky + swapped + clean)
    assert chosen["spans"] == 1 and chosen["precision"] == 1.0  # the quietest there is, still the one taken
    assert f"no threshold reaches precision 0.8 on at least {MIN_SPANS} spans" in chosen["note"], chosen
    # Of those giving at most 5% of clean short sentences a span, none gives MIN_SPANS: it said "the most
    # precise one of those" as though it were measured on as many.
    assert chosen["note"].endswith(f"a span was taken, measured on 1 span (none of those giving at most 5% of "
                                   f"clean short sentences a span gives {MIN_SPANS})"), chosen["note"]  # fmt: skip
    said = quality_warnings(0.9, chosen)
    assert len(said) == 1 and said[0].startswith(
        f"the default threshold {chosen['threshold']} misses the rule"
    )
    assert "100% of its 1 spans are swapped words" in said[0], said
    assert "10 in 10 of the words flagged are swapped (of only 1 flagged word: too few to go by)" in in_words(
        chosen
    )

    # Enough spans at a quiet threshold: a precision of 0.6 measured on them is taken over 1/1.
    measured = _sentences([[0.8, 0.1]] * 60 + [[0.1, 0.8]] * 40, [0] * 100, words=8)
    chosen = choose_threshold(lucky + measured + clean)
    assert chosen["threshold"] == 0.8 and chosen["spans"] == 101 and "note" in chosen, chosen
    assert "too few" not in in_words(chosen)
    # And at MIN_SPANS spans a precision that reaches 0.8 meets the rule, as before.
    enough = _sentences([[0.8, 0.1]] * MIN_SPANS, [0] * MIN_SPANS, words=8)
    chosen = choose_threshold(enough + clean)
    assert chosen["threshold"] == 0.8 and chosen["spans"] == MIN_SPANS and "note" not in chosen, chosen


def test_threshold_rule_ignores_long_sentences_for_the_quiet_condition():
    swapped = _sentences([[0.9, 0.1], [0.6, 0.1], [0.4, 0.1]] * 40, [0, 0, 0] * 40, words=25)
    clean = _sentences([[0.45, 0.1]] * 12 + [[0.1, 0.1]] * 108, [None] * 120, words=25)
    chosen = choose_threshold(swapped + clean)
    assert "everyday" not in chosen and chosen["threshold"] == 0.4


def test_a_deviation_past_the_gate_names_an_export_other_than_the_one_that_failed():
    """Int8 weights missing the gate told the user to export --int8 weights, the method that had failed."""
    from export import calibrate
    from export.parity import ParityError

    figures = {"p50": 0.01, "p99": 0.16, "max": 0.4}
    with pytest.raises(
        ParityError, match=r"Export --precision fp32 \(or fp16\); docs/int8.md"
    ) as weights_failed:
        calibrate.check_deviation(dict(figures), "the calibration sentences", instead=calibrate.FP32)
    assert "--int8 weights" not in str(weights_failed.value)
    with pytest.raises(ParityError, match=r"Export --int8 weights .*, or train the model quantization-aware"):
        calibrate.check_deviation(dict(figures), "the calibration sentences")


def test_a_detector_near_chance_on_its_own_task_is_warned_of():
    """Held-out replaced-token AUC 0.52 passed without a word: the calibration sentences' easier swaps gave 0.68."""
    from export.pipeline import _near_chance_on_held_out

    report = {"int8_accuracy": {"metric": "replaced_token_roc_auc", "fp32": 0.523, "int8": 0.52,
                                "corruption": "generator: 15% of tokens masked ..."}}  # fmt: skip
    assert "the generator's replacements from the original tokens (ROC AUC 0.52 on held-out text" in (
        _near_chance_on_held_out(report, [])
    )
    unigram = {"int8_accuracy": {**report["int8_accuracy"], "corruption": "unigram: no generator/ ..."}}
    assert "random replacements" in _near_chance_on_held_out(unigram, [])  # no generator was there to say it
    assert (
        _near_chance_on_held_out(report, ["the detector barely tells swapped words (ROC AUC 0.55)"]) is None
    )
    backwards = {"int8_accuracy": {**report["int8_accuracy"], "fp32": 0.1}}
    said = _near_chance_on_held_out(backwards, [])
    assert said.startswith("the detector ranks the generator's replacements below the original tokens (ROC AUC "
                           "0.10 on held-out text") and "--eval-text FILE" in said, said  # fmt: skip
    assert _near_chance_on_held_out(report, ["the detector ranks swapped words below the rest (...)"]) is None
    assert _near_chance_on_held_out({"int8_accuracy": {**report["int8_accuracy"], "fp32": 0.8}}, []) is None
    assert _near_chance_on_held_out({"int8_accuracy": {"metric": "dev_accuracy", "fp32": 0.5}}, []) is None


def test_calibration_on_a_corpus_the_run_trained_on_is_not_warned_of(tmp_path):
    """The warning that the calibration sentences are none of the training corpora stays off where they share
    one (the shipped detector trained on wikitext2 and news) and for a checkpoint without a recipe."""
    import json

    from export.calibrate import unlike_training

    assert unlike_training(tmp_path, None) is None  # a Hugging Face checkpoint: no trainer_state.json
    (tmp_path / "trainer_state.json").write_text(json.dumps({"config": {"corpus": "wikitext2,news"}}))
    assert unlike_training(tmp_path, None) is None and unlike_training(tmp_path, "news,chat") is None
    assert "(chat, trec) come from none of the corpora the detector trained on (wikitext2, news)" in (
        unlike_training(tmp_path, "chat,trec")
    )


def test_the_operating_point_says_what_the_calibration_sentences_were():
    """It said "short everyday ones of 6-14 words and long ones of 8-30 words" also for an export
    calibrated on --calibration-text of the user's own, while in_words adapted."""
    from export.calibrate import operating_point
    from export.evaluation.items import Texts

    def texts(kinds: list[str], sources: list[str]) -> Texts:
        n = len(kinds)
        return Texts(["a b c d e f."] * n, [None] * n, kinds, ",".join(dict.fromkeys(sources)), sources)

    default = operating_point(texts(["generator", "frequency", "pos", "clean", "clean", "clean"],
                                    ["wikitext2", "news", "chat", "trec", "trec", "trec"]))  # fmt: skip
    assert default == (
        "held-out sentences, half with one word swapped (generator, similar-frequency and same-part-of-speech "
        "swaps in equal shares), half clean: short everyday ones of 6-14 words (chat, trec) and long ones of "
        "8-30 words (wikitext2, news)"
    )
    # The user's own text, and a checkpoint without a generator: no "everyday", no generator swaps.
    own = operating_point(texts(["frequency", "pos", "clean", "clean"], ["my_texts/a.txt"] * 4))
    assert own == (
        "held-out sentences, half with one word swapped (similar-frequency and same-part-of-speech swaps in "
        "equal shares), half clean: sentences of 6-30 words from your own text (my_texts/a.txt)"
    )
    # Long sources alone (--calibration-text wikitext2,news) are not called everyday either.
    assert "everyday" not in operating_point(texts(["pos", "clean"], ["wikitext2", "news"]))
