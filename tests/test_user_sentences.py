"""benchmarks.quality.user_sentences on a tiny run's calibrated bundle: every figure is there and means
what it says (spans at the bundle's own threshold, never punctuation; sentences from text never trained
on; the same clean sentences behind every kind of swap)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def measure(args: list[str]) -> None:
    """The benchmark's command, as a user runs it."""
    cmd = [sys.executable, "-m", "benchmarks.quality.user_sentences", *args]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_user_sentences_measures_a_calibrated_bundle(tmp_path, small_corpus, small_tokenizer, registry_data):
    from export.config import ExportConfig
    from export.pipeline import run_export
    from training.pretrain import main as pretrain

    try:
        from test_pretrain import tiny_args
    except ImportError:  # tests/ made a package
        from tests.test_pretrain import tiny_args

    run = tmp_path / "run"
    pretrain(tiny_args(run, small_corpus, small_tokenizer, "--max-steps", 20, "--eval-every", 1000))
    bundle = tmp_path / "bundle"
    manifest = run_export(ExportConfig(checkpoint=str(run), out=str(bundle), precision="fp32",
                                       data_dir=str(registry_data), calibration_sentences=20), log=lambda _: None)  # fmt: skip
    # Trained on a file of the user's, calibrated on the default sources: the manifest says they are none of
    # its corpora and how to calibrate on text like it (a path by its name: the manifest travels).
    assert any(w.startswith("the calibration sentences (the default sources, wikitext2, news, chat, trec) come from "
                            f"none of the corpora the detector trained on ({small_corpus.name})")
               and "--calibration-text FILE" in w and str(small_corpus) not in w
               for w in manifest["warnings"]), manifest["warnings"]  # fmt: skip
    from export.calibrate import unlike_training
    from training.checkpoint import resolve_checkpoint

    assert (
        unlike_training(resolve_checkpoint(run), str(small_corpus)) is None
    )  # their own text: theirs to choose
    assert "sentences (trec) come from none" in unlike_training(resolve_checkpoint(run), "trec")
    out, per_sentence = tmp_path / "us.json", tmp_path / "us_examples.json"
    measure(["--bundle", str(bundle), "--generator", str(run), "--sentences", "15", "--reference-text",
             str(small_corpus), "--data-dir", str(registry_data), "--out", str(out),
             "--examples", str(per_sentence)])  # fmt: skip
    report = json.loads(out.read_text())
    assert "examples" not in report  # the summary only: the per-sentence detail is opt-in
    assert report["threshold"] == manifest["threshold"] and report["calibrated"] is True
    assert report["model_sha256"] == manifest["files"]["model.onnx"]
    assert report["source"] == "commons" and report["cpu"]["int8_kernel_path"]
    assert set(report["summary"]) == {"all", "generator", "frequency", "pos"}
    for kind in ("generator", "frequency", "pos"):
        s = report["summary"][kind]
        assert s["sentences"] == 15
        assert 0 <= s["top1"] <= s["top3"] <= 1 and 0 <= s["ece"] <= 1
        assert 0 <= s["bigram_top1"] <= 1 and s["chance_top1"] < 0.5
    examples = json.loads(per_sentence.read_text())["examples"]
    clean = {x["text"] for x in examples if x["kind"] == "clean"}
    assert len(clean) == 15
    for x in examples:
        if x["kind"] != "clean":
            start, end = x["span"]
            assert x["text"][start:end] == x["replacement"] != x["original"]
            # One word swapped in a held-out sentence, the rest of it untouched.
            assert x["text"][:start] + x["original"] + x["text"][end:] == x["clean"]
            assert 1 <= x["rank"] <= x["words"]
        text = x["text"]
        assert all(any(ch.isalnum() for ch in text[a:b]) for a, b in x["spans"])  # never punctuation
    b = report["breakdowns"]["all"]
    assert sum(v["sentences"] for v in b["by_length"].values()) == 45
    assert sum(v["sentences"] for v in b["by_position"].values()) == 45
    assert out.with_suffix(".png").stat().st_size > 10_000

    # The same items scored again (--items): the same texts and the same figures, with no generator.
    again, again_examples = tmp_path / "again.json", tmp_path / "again_examples.json"
    measure(["--bundle", str(bundle), "--items", str(per_sentence), "--reference-text", str(small_corpus),
             "--data-dir", str(registry_data), "--out", str(again), "--examples", str(again_examples)])  # fmt: skip
    second = json.loads(again.read_text())
    assert [x["text"] for x in json.loads(again_examples.read_text())["examples"]] == [
        x["text"] for x in examples
    ]
    assert second["summary"] == report["summary"]

    # The dev slice, where recipes are chosen, shares no sentence with the test slice.
    dev = tmp_path / "dev.json"
    measure(["--bundle", str(bundle), "--slice", "dev", "--sentences", "15", "--reference-text",
             str(small_corpus), "--data-dir", str(registry_data), "--out", str(tmp_path / "dev_summary.json"),
             "--examples", str(dev)])  # fmt: skip
    dev_clean = {x["text"] for x in json.loads(dev.read_text())["examples"] if x["kind"] == "clean"}
    assert len(dev_clean) == 15 and not dev_clean & clean
