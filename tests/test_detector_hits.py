"""benchmarks.quality.detector_hits: the bigram yardstick's scoring, and the whole benchmark on a tiny run."""

import json

import pytest

from benchmarks.quality.bigram import BigramReference, words_of


def test_bigram_reference_flags_the_word_that_breaks_its_neighbours(small_tokenizer):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(small_tokenizer))
    corpus = ["the cat sat on the mat.\nthe dog sat on the rug."] * 50
    reference = BigramReference(corpus, tok)
    text = "The cat sat under the mat."
    words = words_of(tok, text)
    assert words == ["the", "cat", "sat", "under", "the", "mat", "."]
    suspicion = reference.suspicion(words)
    assert suspicion.argmax() == words.index("under")
    # A sentence seen in training has no word that breaks its neighbours.
    assert reference.suspicion(["the", "cat", "sat", "on", "the", "mat", "."]).max() < 0


@pytest.mark.timeout(300)
def test_hit_benchmark_runs_on_a_pretraining_runs_bundle(
    tmp_path, small_corpus, small_tokenizer, registry_data
):
    from benchmarks.quality.detector_hits import main as hits
    from export.pipeline import ExportConfig, run_export
    from training.pretrain import main as pretrain

    try:
        from test_pretrain import tiny_args
    except ImportError:  # tests/ made a package
        from tests.test_pretrain import tiny_args

    run = tmp_path / "run"
    pretrain(tiny_args(run, small_corpus, small_tokenizer, "--max-steps", 20, "--eval-every", 1000))
    bundle = tmp_path / "bundle"
    run_export(ExportConfig(checkpoint=str(run), out=str(bundle), precision="fp32", data_dir=str(registry_data)),
               log=lambda _: None)  # fmt: skip
    out = tmp_path / "hits.json"
    hits(["--bundle", str(bundle), "--generator", str(run), "--sentences", "20",
          "--data-dir", str(registry_data), "--out", str(out)])  # fmt: skip
    data = json.loads(out.read_text())
    summary = data["summary"]
    assert summary["sentences"] == 20 == len(data["examples"])
    for key in ("top1_hit_rate", "top3_hit_rate", "bigram_reference_top1_hit_rate"):
        assert 0 <= summary[key] <= 1
    assert summary["top1_hit_rate"] <= summary["top3_hit_rate"]
    for row in data["examples"]:
        assert row["original"].lower() != row["replacement"].lower()
        assert row["replacement"] in row["text"]
        assert 1 <= row["rank"] <= row["words"] and 1 <= row["bigram_rank"] <= row["words"]

    # The context-blind replacement needs no generator: a random word of similar corpus frequency.
    freq = tmp_path / "freq.json"
    hits(["--bundle", str(bundle), "--replacement", "frequency", "--sentences", "20",
          "--data-dir", str(registry_data), "--out", str(freq)])  # fmt: skip
    rows = json.loads(freq.read_text())["examples"]
    assert len(rows) == 20 and all(r["original"].lower() != r["replacement"].lower() for r in rows)

    # Replayed, without the generator: the same sentences, swaps and ranks.
    replayed = tmp_path / "replayed.json"
    hits(["--bundle", str(bundle), "--replay", str(out), "--sentences", "20",
          "--data-dir", str(registry_data), "--out", str(replayed)])  # fmt: skip
    again = json.loads(replayed.read_text())
    assert [r["text"] for r in again["examples"]] == [r["text"] for r in data["examples"]]
    assert again["summary"] == summary
