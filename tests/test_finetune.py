"""Fine-tuning: layer-wise learning rates, learning a real task, the output in transformers, user data, errors."""

from __future__ import annotations

import contextlib
import csv
import json
import random
import re
import shutil
import unicodedata
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from app.model.bundle import Manifest, read_bundle
from tests.helpers_models import TINY_ENCODER as TINY
from training.checkpoint import commit_checkpoint, load_model
from training.data.tokenizer_loading import load_tokenizer
from training.finetune import main as finetune
from training.finetuning.batches import collate, encode
from training.finetuning.data import CLASSIFICATION, Example, TaskData
from training.finetuning.layerwise_lr import layerwise_param_groups
from training.finetuning.metrics import selection_key
from training.finetuning.model import init_classifier
from training.model import (
    ElectraConfig,
    ElectraForSequenceClassification,
)
from training.optim import linear_schedule

WORDS = {"good": "a great fun warm film", "bad": "a dull awful boring mess", "meh": "an ordinary film, fine"}


def run(*args) -> dict:
    return finetune(["--threads", "1", "--seed", "7", *map(str, args)])


@pytest.fixture(scope="module")
def spam_run(tiny_init, registry_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("spam") / "out"
    evals = run("--init", tiny_init, "--task", "sms_spam", "--data-dir", registry_data, "--out", out,
                "--max-train-examples", 600, "--max-eval-examples", 200, "--max-seq-len", 64, "--epochs", 5,
                "--batch-size", 32, "--lr", 5e-3, "--layerwise-lr-decay", 0.9)  # fmt: skip
    return out, evals


def write_csv(path: Path, n: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "review", "title", "verdict"])
        for i in range(n):
            label = ("good", "bad", "meh")[i % 3]
            w.writerow([i, f"{WORDS[label]} {rng.randint(0, 99)}", f"title {i}", label])
    return path


# ---------------------------------------------------------------------------------------- learning rates


def test_layerwise_decay_gives_head_full_lr_top_layer_one_power_embeddings_l_plus_one():
    cfg = ElectraConfig(vocab_size=50, **{**TINY, "num_hidden_layers": 3}, id2label={0: "a", 1: "b"})
    model = ElectraForSequenceClassification(cfg)
    groups = layerwise_param_groups(model, lr=1e-3, decay=0.5, weight_decay=0.01)
    lr_of = {id(p): g["lr"] for g in groups for p in g["params"]}
    wd_of = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    names = dict(model.named_parameters())
    assert len(lr_of) == len(names) == sum(len(g["params"]) for g in groups)  # each parameter exactly once
    expected = {"classifier.": 1e-3, "electra.encoder.layer.2.": 5e-4, "electra.encoder.layer.1.": 2.5e-4,
                "electra.encoder.layer.0.": 1.25e-4, "electra.embeddings.": 6.25e-5,
                "electra.embeddings_project.": 6.25e-5}  # fmt: skip
    for name, p in names.items():
        prefix = next(k for k in expected if name.startswith(k))
        assert lr_of[id(p)] == expected[prefix], name
        assert wd_of[id(p)] == (0.0 if p.ndim < 2 or "LayerNorm" in name else 0.01), name
    # ELECTRA's Small/Base rate: the top layer 0.8, the embeddings 0.8^4 of the peak.
    groups = layerwise_param_groups(model, lr=1.0, decay=0.8, weight_decay=0.0)
    lr_of = {id(p): g["lr"] for g in groups for p in g["params"]}
    assert lr_of[id(names["electra.encoder.layer.2.output.dense.weight"])] == pytest.approx(0.8)
    assert lr_of[id(names["electra.embeddings.word_embeddings.weight"])] == pytest.approx(0.8**4)


def test_the_kept_weights_are_the_best_metrics_and_on_a_tie_the_lowest_loss():
    """A small dev set reached accuracy 1.0 at loss 0.37, and that first step was kept over a later one at
    0.014. NaN (an undefined correlation) is the worst."""
    early, late = {"accuracy": 1.0, "loss": 0.37}, {"accuracy": 1.0, "loss": 0.014}
    assert selection_key(late, "accuracy") > selection_key(early, "accuracy")
    assert selection_key({"accuracy": 0.9, "loss": 0.001}, "accuracy") < selection_key(early, "accuracy")
    assert selection_key({"pearson": float("nan"), "loss": 0.0}, "pearson")[0] == float("-inf")


def test_warmup_then_linear_decay():
    assert [linear_schedule(s, total=10, warmup=2) for s in (0, 1, 2, 6, 10)] == [0.5, 1.0, 1.0, 0.5, 0.0]


# ------------------------------------------------------------------------------------------ a real task


def test_tiny_model_learns_sms_spam_well_above_majority(spam_run):
    out, evals = spam_run
    for split in ("dev", "test"):
        m = evals[split]
        assert m["n"] == 200 and m["positive_label"] == "spam"
        assert m["accuracy"] > m["majority_baseline_accuracy"] + 0.05, m  # majority (ham) is ~0.88
        assert m["f1"] > 0.7 and m["mcc"] > 0.6, m  # the spam class is really found, not just ham
    for f in ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt", "trainer_state.json",
              "eval_dev.json", "eval_test.json", "finetune_config.json", "metrics.jsonl"):  # fmt: skip
        assert (out / f).is_file(), f
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["task"] == "sms_spam" and state["best_metric"] == "macro_f1"
    saved = json.loads((out / "eval_dev.json").read_text())
    assert saved["labels"] == ["ham", "spam"] and sum(map(sum, saved["confusion_matrix"])) == 200
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["split"] == "dev" for r in rows) == 5  # one evaluation per epoch
    # The kept weights are the best dev macro F1's, and among equal ones the lowest dev loss's.
    dev = [r for r in rows if r["split"] == "dev"]
    best = max(dev, key=lambda r: (r["macro_f1"], -r["loss"]))
    assert state["step"] == best["step"], [(r["step"], r["macro_f1"], r["loss"]) for r in dev]
    options = json.loads((out / "finetune_config.json").read_text())
    assert options["metric"] == "macro_f1"
    # What the hardware options came to here (bf16 true is asked, not done, on a CPU without AMX).
    assert options["as_run"]["device"] == "cpu" and options["as_run"]["precision"] in (
        "fp32",
        "bf16 autocast",
    )
    assert state["as_run"] == options["as_run"]
    # Every dev and test example with the best model's answer: the figures above recomputed from them.
    for split in ("dev", "test"):
        got = [json.loads(line) for line in (out / f"predictions_{split}.jsonl").read_text().splitlines()]
        assert len(got) == 200 and all(set(r["probs"]) == {"ham", "spam"} for r in got)
        assert all(r["predicted"] == max(r["probs"], key=r["probs"].get) for r in got)
        accuracy = sum(r["predicted"] == r["label"] for r in got) / len(got)
        assert accuracy == pytest.approx(evals[split]["accuracy"]), split


def test_output_loads_in_transformers_with_the_same_logits(spam_run, registry_data):
    transformers = pytest.importorskip("transformers")
    from training.finetuning.sets import load_labelled

    out, _ = spam_run
    hf = transformers.ElectraForSequenceClassification.from_pretrained(out).eval()
    assert (
        hf.config.id2label == {0: "ham", 1: "spam"}
        and hf.config.problem_type == "single_label_classification"
    )
    ours, _, _ = load_model(out)
    ours.eval()
    texts = [t for t, _ in load_labelled("sms_spam", registry_data)["test"][:16]]
    pairs = [Example(t, "and a second text" if i % 3 == 0 else None, 0) for i, t in enumerate(texts)]
    items = encode(load_tokenizer(out), pairs, 64)
    b = collate(items, pad_id=0)
    assert b["attention_mask"].min() == 0  # padded: the comparison covers masking
    with torch.no_grad():
        a = ours(b["input_ids"], b["attention_mask"], b["token_type_ids"])
        h = hf(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"], token_type_ids=b["token_type_ids"]
        )
    assert (a - h.logits).abs().max().item() <= 1e-5


def test_a_text_that_fits_exactly_is_not_counted_as_truncated_as_the_server_says():
    """The start-up count of texts "truncated to L tokens" took every text of L tokens for cut, one that fit
    exactly too; the server's `truncated` (tokens left over) is what it means."""
    from app.model.tokenization import TextTokenizer

    path = Path(__file__).parents[1] / "models" / "detector" / "tokenizer.json"
    tok = Tokenizer.from_file(str(path))
    served = TextTokenizer(path, max_length=8, stride=0)
    # [CLS] + 6 words + [SEP] is 8 tokens; a pair has three special tokens.
    inputs = ["a b c d e f", "a b c d e f g", ("a b c", "d e"), ("a b c", "d e f"), "a b"]
    items = encode(tok, [Example(x, None, 0) if isinstance(x, str) else Example(*x, 0) for x in inputs], 8)
    assert [len(e.ids) for e in items] == [8, 8, 8, 8, 4]
    assert [e.truncated for e in items] == [False, True, False, True, False]
    as_served = [
        e.truncated for e in served.encode_classify([x if isinstance(x, str) else list(x) for x in inputs])
    ]
    assert as_served == [e.truncated for e in items]


# ------------------------------------------------------------------------------------------- user data


@pytest.mark.parametrize("given", [None, "meh,good,bad"])
def test_user_csv_with_custom_columns_keeps_label_names(tiny_init, tmp_path, given):
    train = write_csv(tmp_path / "reviews.csv", 60)
    # Through a run directory, as pretraining leaves it: resolved via checkpoints/latest.
    run_dir = tmp_path / "pretrain-run"
    commit_checkpoint(run_dir, 10, lambda d: shutil.copytree(tiny_init, d, dirs_exist_ok=True))
    out = tmp_path / "out"
    args = ["--init", run_dir, "--train", train, "--text-column", "review", "--text-pair-column", "title",
            "--label-column", "verdict", "--out", out, "--epochs", 1, "--batch-size", 8]  # fmt: skip
    evals = run(*args, *(["--labels", given] if given else []))
    names = given.split(",") if given else ["bad", "good", "meh"]  # as given, else sorted
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {str(i): n for i, n in enumerate(names)}
    assert config["label2id"] == {n: i for i, n in enumerate(names)}
    assert config["architectures"] == ["ElectraForSequenceClassification"]
    assert config["trained_positions"] == 64  # the init's 64: no training row here is longer
    assert evals["dev"]["labels"] == names and evals["dev"]["n"] == 6  # a stratified 10% of 60
    assert "test" not in evals and not (out / "eval_test.json").exists()
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["task"] is None and state["data"]["train"] == str(train)
    # The recipe the export copies into the bundle tells the server this model takes pairs.
    from export.recipe import recipe

    manifest = Manifest(format_version=1, kind="classifier", max_length=64, output="logits", model_sha256="",
                        source={"training": recipe(out)})  # fmt: skip
    assert manifest.trained_on == "pairs"


def _regression_run(tiny_init, tmp_path) -> tuple[Path, dict]:
    """A one-epoch fine-tuning run on 40 texts with float scores (a regression): its --out and figures."""
    rng = random.Random(0)
    rows = [{"sentence": f"{WORDS['good']} {i}", "score": round(rng.uniform(0, 5), 2)} for i in range(40)]
    (tmp_path / "sts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    evals = run("--init", tiny_init, "--train", tmp_path / "sts.jsonl", "--text-column", "sentence",
                "--label-column", "score", "--out", out, "--epochs", 1, "--batch-size", 8)  # fmt: skip
    return out, evals


def test_float_labels_in_jsonl_make_a_regression(tiny_init, tmp_path):
    transformers = pytest.importorskip("transformers")
    out, evals = _regression_run(tiny_init, tmp_path)
    assert {"pearson", "spearman", "mse"} <= set(evals["dev"])
    hf = transformers.ElectraForSequenceClassification.from_pretrained(out)
    assert hf.config.problem_type == "regression" and hf.config.num_labels == 1
    assert json.loads((out / "finetune_config.json").read_text())["metric"] == "spearman"
    # Served, it answers the predicted value under the target's name, and refuses top_k, which ranks labels
    # (it was dropped in silence, the value read as a label's probability).
    from litestar.testing import TestClient

    from app.http.server import create_app
    from app.settings import Settings
    from export.__main__ import main as export
    from tests.app_fixtures import wait_for

    assert (
        export([str(out), "--out", str(tmp_path / "models" / "sts"), "--precision", "fp32", "--no-calibrate"])
        == 0
    )
    dev = json.loads((out / "predictions_dev.jsonl").read_text().splitlines()[0])
    with TestClient(create_app(Settings(models_dir=tmp_path / "models", ui=False))) as c:
        wait_for(lambda: c.get("/ready").status_code == 200, what="the regression model loaded")
        refused = c.post("/classify", json={"text": dev["text"], "top_k": 1})
        assert refused.status_code == 422 and refused.json()["error"]["field"] == "top_k", refused.text
        assert "top_k applies to classification models; model 'sts' is a regression" in refused.text
        got = c.post("/classify", json={"text": dev["text"]}).json()["results"][0]
    assert got["label"] == "score" and got["probs"] == {"score": got["score"]} and "top_k" not in got
    assert got["score"] == pytest.approx(dev["predicted"], abs=1e-4)


def test_a_regressions_dev_figures_under_bf16_are_its_fp32_exports(tiny_init, tmp_path, monkeypatch):
    """Under bf16 autocast (CUDA, AMX CPUs) the dev evaluations rounded a regression's single output to
    8 bits of mantissa: Spearman 0.19 where fp32 read 0.57 on the same weights, and --patience stopped on
    it. Dev is evaluated in fp32, as the bundle computes: the kept step's row is eval_dev.json's."""
    from training.finetuning import start
    from training.report import read_metrics

    # bf16 autocast whatever this CPU is (without AMX it is slow, not wrong).
    monkeypatch.setattr(start, "autocast_for",
                        lambda device, want: (True, lambda: torch.autocast("cpu", dtype=torch.bfloat16)))  # fmt: skip
    out, evals = _regression_run(tiny_init, tmp_path)
    assert json.loads((out / "finetune_config.json").read_text())["as_run"]["precision"] == "bf16 autocast"
    state = json.loads((out / "trainer_state.json").read_text())
    (row,) = [
        r for r in read_metrics(out / "metrics.jsonl") if r["split"] == "dev" and r["step"] == state["step"]
    ]
    for k in ("pearson", "spearman", "mse", "loss"):
        assert row[k] == pytest.approx(evals["dev"][k], rel=1e-9, abs=1e-12), k
    assert state["best_value"] == pytest.approx(evals["dev"]["spearman"], rel=1e-9, abs=1e-12)


def save_hf_classifier(tmp_path: Path, tiny_init: Path, labels: tuple[str, ...]) -> Path:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(3)
    vocab = len((tiny_init / "vocab.txt").read_text().splitlines())
    cfg = transformers.ElectraConfig(vocab_size=vocab, **TINY, id2label=dict(enumerate(labels)),
                                     label2id={n: i for i, n in enumerate(labels)})  # fmt: skip
    d = tmp_path / "hf_classifier"
    transformers.ElectraForSequenceClassification(cfg).save_pretrained(d)
    shutil.copyfile(tiny_init / "vocab.txt", d / "vocab.txt")  # an HF dir may hold only vocab.txt
    return d


def test_hf_classifier_with_another_label_count_starts_a_fresh_head(tiny_init, tmp_path, capsys):
    hf_dir = save_hf_classifier(tmp_path, tiny_init, ("negative", "positive"))
    run("--init", hf_dir, "--train", write_csv(tmp_path / "r.csv", 30), "--text-column", "review",
        "--label-column", "verdict", "--out", tmp_path / "out", "--epochs", 1)  # fmt: skip
    assert "starting a fresh head" in capsys.readouterr().out
    assert (tmp_path / "out" / "tokenizer.json").is_file()  # built from the HF dir's vocab.txt


def test_a_fresh_head_for_another_label_count_keeps_the_encoder_as_trained(tiny_init, tmp_path):
    transformers = pytest.importorskip("transformers")
    hf_dir = save_hf_classifier(tmp_path, tiny_init, ("negative", "positive"))
    model, _, notes = init_classifier(str(hf_dir), TaskData(None, CLASSIFICATION, ("bad", "meh", "good"), {}))
    assert "starting a fresh head" in notes[0] and model.classifier.out_proj.out_features == 3
    ids = torch.randint(5, 200, (3, 9))
    with torch.no_grad():
        ours = model.eval().electra(ids)
        hf = transformers.ElectraForSequenceClassification.from_pretrained(hf_dir).eval()
        theirs = hf.electra(ids).last_hidden_state
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


# A head saved with "élevé" decomposed (e and a combining accent), as names were stored before they were
# read composed (NFC, 2026-12-01), met the data's "élevé" as another name: kept by position, its classes
# swapped, said as "renamed" between names that print alike.
@pytest.mark.parametrize("saved, data_labels", [
    (("negative", "positive"), ("positive", "negative")),
    ((unicodedata.normalize("NFD", "élevé"), "faible"), ("faible", "élevé")),
], ids=["reordered", "decomposed"])  # fmt: skip
def test_hf_classifier_with_the_same_labels_in_another_order_keeps_its_head(
    tiny_init, tmp_path, saved, data_labels
):
    transformers = pytest.importorskip("transformers")
    hf_dir = save_hf_classifier(tmp_path, tiny_init, saved)
    data = TaskData(None, CLASSIFICATION, data_labels, {})
    model, _, notes = init_classifier(str(hf_dir), data)
    ids = torch.randint(5, 200, (3, 9))
    with torch.no_grad():
        ours = model.eval()(ids)
        theirs = transformers.ElectraForSequenceClassification.from_pretrained(hf_dir).eval()(ids).logits
    torch.testing.assert_close(ours, theirs[:, [1, 0]], rtol=1e-5, atol=1e-5)
    assert "reordered" in notes[0], notes


# ------------------------------------------------------------------------------- control and failures


def test_same_seed_same_model_and_early_stopping(tiny_init, tmp_path, capsys):
    train = write_csv(tmp_path / "r.csv", 40)
    outs = []
    for name in ("a", "b"):
        outs.append(tmp_path / name)
        run("--init", tiny_init, "--train", train, "--text-column", "review", "--label-column", "verdict",
            "--out", outs[-1], "--epochs", 4, "--batch-size", 4, "--lr", 1e-12, "--eval-every", 3,
            "--patience", 2)  # fmt: skip
    assert (outs[0] / "model.safetensors").read_bytes() == (outs[1] / "model.safetensors").read_bytes()
    state = json.loads((outs[0] / "trainer_state.json").read_text())
    # A learning rate of ~0 never improves on the first evaluation: stop two evaluations later.
    assert state["stopped_early"] and state["step"] == 3 and state["global_step"] == 9
    metric, value = state["best_metric"], state["eval"]["dev"][state["best_metric"]]
    said = capsys.readouterr().out
    assert (
        f"early stop at step 9 of 40: dev {metric} has not risen above {value:.4f} in 2 evaluations" in said
    )
    # The last line said "step 3 of 9": the best of the steps run, read as a run of 9 steps.
    assert f"model: {outs[1]} (best at step 3; stopped early at step 9 of 40 (--patience); " in said


def test_patience_spent_at_the_last_evaluation_is_no_early_stop(tiny_init, tmp_path, capsys):
    """A run whose patience ran out at its last evaluation said "early stop at step 20" and saved
    stopped_early true, though every step of its schedule had run."""
    from training.report import read_metrics

    run("--init", tiny_init, "--train", write_csv(tmp_path / "r.csv", 40), "--text-column", "review",
        "--label-column", "verdict", "--out", tmp_path / "out", "--epochs", 2, "--batch-size", 4, "--lr", 1e-12,
        "--patience", 1)  # fmt: skip
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    dev = [r for r in read_metrics(tmp_path / "out" / "metrics.jsonl") if r["split"] == "dev"]
    assert len(dev) == 2 and dev[1][state["best_metric"]] == dev[0][state["best_metric"]]  # patience spent
    assert dev[1]["step"] == state["global_step"] and state["stopped_early"] is False
    said = capsys.readouterr().out
    assert "early stop" not in said
    assert f"(best at step {state['step']}; all {state['global_step']} steps run; " in said


def test_a_lower_loss_at_the_same_figure_is_kept_but_not_called_an_improvement(tiny_init, tmp_path, capsys):
    """Evaluations at a saturated dev figure were marked "* best" (a lower loss broke the tie) while the run
    then stopped for "no dev improvement" in as many evaluations."""
    from training.finetuning import start
    from training.report import MetricsLog

    t = start.setup(["--init", str(tiny_init), "--train", str(write_csv(tmp_path / "r.csv", 40)), "--text-column",
                     "review", "--label-column", "verdict", "--out", str(tmp_path / "out"), "--patience", "1",
                     "--threads", "1"])  # fmt: skip
    figures = t.evaluate("dev")
    metric = t.cfg.metric
    t.best.update(score=(figures[metric], -(figures["loss"] + 1.0)), metrics=figures, state={}, step=0)
    log = MetricsLog(tmp_path / "out" / "metrics.jsonl")
    capsys.readouterr()
    assert t.evaluate_dev(log)  # the figure did not rise: patience 1 is spent
    said = capsys.readouterr().out
    assert f"* kept: the same {metric} at a lower loss" in said and "* best" not in said
    assert t.best["step"] == t.step and t.stale == 1


def test_bad_options_fail_naming_the_option(tiny_init, tmp_path):
    train = write_csv(tmp_path / "r.csv", 30)
    (tmp_path / "data.xlsx").write_text("x")
    base = ["--init", tiny_init, "--out", tmp_path / "out"]
    user = [*base, "--train", train, "--text-column", "review", "--label-column", "verdict"]
    cases = [
        (["--out", tmp_path / "o", "--task", "trec"], "--init"),
        (base, "--task or --train"),
        ([*base, "--task", "imdb"], "--task"),
        ([*base, "--task", "trec", "--train", train], "--task and --train"),
        ([*base, "--task", "trec", "--text-column", "review"], "--text-column: only for --train data"),
        ([*base, "--task", "trec", "--dev-fraction", 0.2], "--dev-fraction: only for --train data"),
        ([*user, "--dev", train, "--dev-fraction", 0.2], "--dev-fraction: splits --train when no --dev"),
        ([*base, "--train", tmp_path / "nope.csv"], "--train"),
        ([*base, "--train", tmp_path / "data.xlsx"], "--train"),
        ([*base, "--train", train, "--label-column", "verdict"], "--text-column"),
        ([*base, "--train", train, "--text-column", "review"], "--label-column"),
        ([*user, "--labels", "good,bad"], "--labels"),
        ([*user, "--problem-type", "regression"], "--problem-type"),
        ([*user, "--metric", "pearson"], "--metric"),
        ([*user, "--positive-label", "great"], "--positive-label"),
        (
            [*user, "--positive-label", "good"],
            "applies to binary classification only; this data has 3 classes",
        ),
        ([*user, "--init", Path(__file__).parents[1] / "models" / "detector"], "export.recover"),
        (
            [*user, "--init", Path(__file__).parents[1] / "models" / "sentiment"],
            "use the fine-tuning run it was",
        ),
        ([*user, "--layerwise-lr-decay", 1.5], "--layerwise-lr-decay"),
        ([*user, "--epochs", "two"], "--epochs"),
        ([*user, "--max-seq-len", 1000], "positions: give --max-seq-len "),
        ([*user, "--init", tmp_path / "missing"], "--init"),
    ]
    for args, option in cases:
        with pytest.raises(SystemExit) as e:
            run(*args)
        assert option in str(e.value) and e.value.code == 2, (args, str(e.value))
    assert not (tmp_path / "out").exists()  # nothing was written by a failed start
    with pytest.raises(SystemExit, match="unrecognized arguments: --epoch"):
        run(*user, "--epoch", 3)  # unknown flags are refused, not guessed
    run(*user, "--epochs", 1)
    with pytest.raises(SystemExit, match="--overwrite"):
        run(*user, "--epochs", 1)


def test_the_generator_of_an_electra_runs_checkpoint_is_refused_naming_the_checkpoint_above(
    tiny_init, registry_data, tmp_path
):
    """It was fine-tuned as the encoder in silence (a model a quarter of the discriminator's width), then
    exported and served so; pack and export refused it by name."""
    from training.checkpoint import save_model
    from training.model import ElectraConfig, ElectraForMaskedLM

    shutil.copytree(tiny_init, ckpt := tmp_path / "step-00000040")
    gen = ElectraForMaskedLM(ElectraConfig(vocab_size=load_tokenizer(tiny_init / "tokenizer.json").get_vocab_size(),
                                           **{**TINY, "hidden_size": 32, "num_attention_heads": 1}))  # fmt: skip
    (ckpt / "generator").mkdir()
    save_model(gen, ckpt / "generator", "ElectraForMaskedLM")
    with pytest.raises(SystemExit) as e:
        run(
            "--init",
            ckpt / "generator",
            "--task",
            "sms_spam",
            "--data-dir",
            registry_data,
            "--out",
            tmp_path / "o",
        )
    assert "is the generator of an ELECTRA run's checkpoint" in str(e.value), str(e.value)
    assert f"give --init {ckpt}" in str(e.value) and not (tmp_path / "o").exists()


def test_user_files_that_would_train_on_the_wrong_thing_fail_naming_file_line_and_fix(
    tiny_init, tmp_path, capsys
):
    """Each of these once trained silently on something else (a NaN became a class, a comma in a text moved
    the label, a JSON row without its text trained on "") or ended in a traceback."""
    good = [f"{WORDS[lab]} {i},{lab}" for i, lab in enumerate(["good", "bad"] * 6)]
    files = {
        "nan.csv": "text,label\n" + "\n".join(good[:5] + ["a film,NaN"] + good[5:]) + "\n",
        "ragged.csv": "text,label\n" + "\n".join(good[:3] + ["hello, world,good"] + good[3:]) + "\n",
        "short.csv": "text,label\n" + "\n".join(good[:3] + ["no label here"] + good[3:]) + "\n",
        "tabs.csv": "text\tlabel\n" + "\n".join(g.replace(",", "\t") for g in good) + "\n",
        "semicolons.csv": "text;label\n"
        + "\n".join(g.replace(",", ";") for g in good)
        + "\nwell, fine;good\n",
        "semicolons-only.csv": "text;label\n" + "\n".join(g.replace(",", ";") for g in good) + "\n",
        # Excel's separator line, which some exports write first: the header was read as a row.
        "excel.csv": "sep=,\ntext,label\n" + "\n".join(good) + "\n",
        "excel-semicolons.csv": "sep=;\ntext;label\n"
        + "\n".join(g.replace(",", ";") for g in good)
        + "\nwell, fine;good\n",
        "excel.tsv": "sep=,\ntext\tlabel\n" + "\n".join(g.replace(",", "\t") for g in good) + "\n",
        "excel-tabs.csv": "sep=\t\ntext\tlabel\n" + "\n".join(g.replace(",", "\t") for g in good) + "\n",
        # DictReader keeps a name's last column: it trained on the ids.
        "twice.csv": "text,label,text\n" + "\n".join(f"{g},id{i}" for i, g in enumerate(good)) + "\n",
        "nulls.jsonl": "\n\n"
        + "\n".join(  # blank lines: rows are named by their line
            json.dumps({"text": None if i == 4 else g.split(",")[0], "label": g.split(",")[1]})
            for i, g in enumerate(good)
        )
        + "\n",  # fmt: skip
        "multilabel.jsonl": "\n".join(
            json.dumps(
                {"text": g.split(",")[0], "label": [g.split(",")[1], "long"] if i == 2 else g.split(",")[1]}
            )
            for i, g in enumerate(good)
        )
        + "\n",  # fmt: skip
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "latin1.csv").write_bytes(
        ("text,label\n" + "\n".join(good) + "\ncaf\u00e9,good\n").encode("latin-1")
    )
    cases = {
        "nan.csv": "row 6 has no value in the label column 'label' ('NaN')",
        "ragged.csv": "line 5 has more fields than the header's 2; a text holding a comma",
        "short.csv": "line 5 has fewer fields",
        "tabs.csv": "it looks tab-separated: name it .tsv",
        "semicolons.csv": "the header is one field with semicolons: write the file comma-separated",
        "semicolons-only.csv": "it looks semicolon-separated: write the file comma-separated",
        "excel.csv": "line 1 ('sep=,') is Excel's separator line, not a header: delete that line",
        "excel-semicolons.csv": "line 1 ('sep=;') is Excel's separator line, not a header: delete that line and "
        "write the file comma-separated",
        "excel.tsv": "line 1 ('sep=,') is Excel's separator line, not a header: delete that line (a .tsv is read "
        "tab-separated)",
        "excel-tabs.csv": "line 1 ('sep=\\t') is Excel's separator line, not a header: delete that line and name "
        "the file .tsv",
        "twice.csv": "header names 'text' 2 times (columns 1, 3); give each column its own name",
        "nulls.jsonl": "line 7 has no 'text'",
        "multilabel.jsonl": "line 3: the label is a JSON list",
        "latin1.csv": "is not UTF-8",
    }
    for name, says in cases.items():
        with pytest.raises(SystemExit) as e:
            run("--init", tiny_init, "--out", tmp_path / "out", "--train", tmp_path / name)
        assert name in str(e.value) and says in str(e.value), (name, str(e.value))
    # A whole document in one field: over the csv module's default limit of 128 KB, and read. An empty
    # text is kept, with a warning naming its row (the server would refuse it).
    long = "a great fun warm film " * 7000
    # Two columns of one name that are not read (notes) are no reason to refuse it.
    (tmp_path / "long.csv").write_text(
        "text,label,note,note\n" + "\n".join(f"{g},x,y" for g in good) + f"\n{long},good,x,y\n,bad,x,y\n"
    )
    capsys.readouterr()
    run("--init", tiny_init, "--out", tmp_path / "long", "--train", tmp_path / "long.csv", "--epochs", 1,
        "--max-seq-len", 96)  # fmt: skip
    assert "long.csv has 1 row(s) with empty text (row 14); they are kept" in capsys.readouterr().err
    # The same for a pair's second text, which the server would refuse as well.
    pairs = [g.replace(",", ",a second text,") for g in good] + [f"{WORDS['good']} x,,good"]
    (tmp_path / "pairs.csv").write_text("text,other,label\n" + "\n".join(pairs) + "\n")
    run("--init", tiny_init, "--out", tmp_path / "pairs", "--train", tmp_path / "pairs.csv", "--text-pair-column",
        "other", "--epochs", 1)  # fmt: skip
    assert "pairs.csv has 1 row(s) with empty text (row 13)" in capsys.readouterr().err
    # The long row trained all 96 positions, past the init's 64: what export's --max-length follows.
    assert json.loads((tmp_path / "long" / "config.json").read_text())["trained_positions"] == 96
    # A test label the training data never shows: the fix named is to train it or leave it out.
    (tmp_path / "unseen.csv").write_text("text,label\n" + "\n".join(good[:4]) + "\na film,ugly\n")
    with pytest.raises(SystemExit) as e:
        run(
            "--init",
            tiny_init,
            "--out",
            tmp_path / "o3",
            "--train",
            tmp_path / "long.csv",
            "--test",
            tmp_path / "unseen.csv",
        )
    assert "labels ['ugly'] do not occur in the training data" in str(e.value), str(e.value)
    assert "leave those rows out of --test" in str(e.value)
    # --out where no model can go, and an --init whose files are damaged.
    (tmp_path / "a-file").write_text("")
    run_dir = tmp_path / "pretraining-run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "latest").write_text("step-00000010")
    broken = tmp_path / "broken-init"
    shutil.copytree(tiny_init, broken)
    (broken / "model.safetensors").write_bytes(b"not weights")
    user = ["--train", tmp_path / "long.csv", "--init", tiny_init]
    for args, says in [
        (["--out", tmp_path / "a-file"], "is a file"),
        (
            ["--out", tmp_path / "o4", "--train", tmp_path],
            "is a directory; name one .csv, .tsv or .jsonl file",
        ),
        (["--out", tmp_path / "a-file" / "sub"], "cannot create"),
        (["--out", run_dir, "--overwrite"], "is a pretraining run"),
        (
            ["--out", Path(__file__).parents[1] / "models" / "sentiment", "--overwrite"],
            "holds an exported bundle",
        ),
        (["--out", tiny_init, "--overwrite"], "holds another model's files (config.json, model.safetensors"),
        (["--out", tmp_path / "o2", "--init", broken], "does not read as weights"),
    ]:
        with pytest.raises(SystemExit) as e:
            run(*user, *args)
        assert says in str(e.value), (args, str(e.value))


def test_quantization_aware_finetuning_is_reproducible_and_exports_int8_compute(
    tiny_init, tmp_path, registry_data
):
    """--qat: ranges from the training texts in config.json, stochastic rounding drawn from the seeded
    generator (the same seed, the same model), and the export computes in int8 within its gates."""
    from export.__main__ import main as export

    train = write_csv(tmp_path / "r.csv", 64)
    outs = []
    for name in ("a", "b"):
        outs.append(tmp_path / name)
        # A model that learns (dev accuracy 1.0 by epoch 10; int8-simulated, it is slow to start, and the
        # default patience stopped it at epoch 4): at 2 epochs and the default lr the loss stayed at ln 3,
        # and whether its near-equal logits answered one label for all 6 dev texts (a warning in the
        # bundle) was up to the CPU's rounding: an AVX-512 Xeon's did, an AVX2 EPYC's did not.
        run("--init", tiny_init, "--train", train, "--text-column", "review", "--label-column", "verdict",
            "--out", outs[-1], "--epochs", 10, "--lr", 2e-3, "--patience", 10, "--batch-size", 8,
            "--qat", "--qat-rounding", "stochastic")  # fmt: skip
    assert (outs[0] / "model.safetensors").read_bytes() == (outs[1] / "model.safetensors").read_bytes()
    spec = json.loads((outs[0] / "config.json").read_text())["quantization"]
    assert (
        spec["scheme"] == "int8-static-u8s7" and len(spec["activations"]) == 13
    )  # 2 layers x 6 + projection
    # 64 rows (dev held out) in batches of 8: fewer than the 16 batches once claimed, of held-out text.
    taken = re.fullmatch(
        r"quantization-aware training, ranges from (\d+) batches of training text(, smoothed .*)?",
        spec["origin"],
    )
    assert taken and int(taken[1]) == 8, spec["origin"]
    export([str(outs[0]), "--out", str(tmp_path / "bundle"),
            "--data-dir", str(registry_data)])  # fmt: skip
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert manifest["optimizations"]["int8"]["method"].startswith("int8 compute")
    assert manifest["load_check"]["at_export"]["max"] <= manifest["load_check"]["gate"]["max"]
    assert read_bundle(tmp_path / "bundle").manifest.trained_on == "texts"  # what /classify will take
    assert not manifest.get("warnings")
    # Its fp32 bundle is another function than the one trained: it says so.
    export(
        [
            str(outs[0]),
            "--out",
            str(tmp_path / "fp32"),
            "--precision",
            "fp32",
            "--data-dir",
            str(registry_data),
        ]
    )
    warnings = json.loads((tmp_path / "fp32" / "manifest.json").read_text())["warnings"]
    assert any("trained quantization-aware" in w for w in warnings), warnings


def test_the_exported_bundle_answers_as_the_runs_predictions_for_long_texts_and_typed_sep(
    tiny_init, tmp_path, registry_data, capsys
):
    """The bundle truncates where fine-tuning did (--max-seq-len 16, not the init's 64 positions), and a
    "[SEP]" typed in a text is text in training as it is in the server: predictions_dev.jsonl is what the
    served bundle answers, to the float."""
    import numpy as np

    from app.model.engine import Engine
    from app.model.scoring import Classify, run_rows
    from app.model.tokenization import TextTokenizer
    from export.__main__ import main as export

    rng = random.Random(1)
    rows = []
    for i in range(90):
        label = ("good", "bad", "meh")[i % 3]
        words = " ".join([WORDS[label]] * rng.randint(1, 5)) + (" [SEP] [MASK] end" if i % 2 else "")
        rows.append(f'"{words}",{label}')
    (tmp_path / "long.csv").write_text("text,label\n" + "\n".join(rows) + "\n")
    run("--init", tiny_init, "--out", tmp_path / "run", "--train", tmp_path / "long.csv", "--epochs", 1,
        "--max-seq-len", 16, "--dev-fraction", 0.3)  # fmt: skip
    assert "training text(s) hold [MASK], [SEP]: read as text" in capsys.readouterr().err
    export([str(tmp_path / "run"), "--out", str(tmp_path / "bundle"), "--precision", "fp32",
            "--data-dir", str(registry_data)])  # fmt: skip
    bundle = read_bundle(tmp_path / "bundle")
    assert bundle.manifest.max_length == 16
    dev = [json.loads(line) for line in (tmp_path / "run" / "predictions_dev.jsonl").read_text().splitlines()]
    assert sum("[SEP]" in r["text"] for r in dev) > 5
    tok = TextTokenizer(bundle.tokenizer_path, bundle.manifest.max_length, 32)
    kind = Classify(top_k=None)
    encoded = kind.encode(tok, [r["text"] for r in dev])
    assert sum(truncated for truncated in encoded.per_item) > 5  # long texts are cut, as in training
    outs = run_rows(Engine(bundle, 1), encoded.rows, tok.pad_id, 4096)
    served = kind.results(bundle.manifest, encoded, outs)
    for r, got in zip(dev, served, strict=True):
        want = [r["probs"][label] for label in bundle.manifest.labels]
        np.testing.assert_allclose([got.probs[label] for label in bundle.manifest.labels], want, atol=1e-5)


def test_a_max_seq_len_past_the_positions_pretraining_trained_is_warned_at_the_start(
    tiny_init, tmp_path, capsys
):
    """The default --max-seq-len 128 on a model pretrained at --seq-len 64 said nothing: positions 64-127 kept
    their initial values (but for the few texts that long), which only export noted afterwards."""
    long = " ".join([WORDS["good"]] * 30)  # past 64 tokens
    rows = [f"{WORDS[('good', 'bad')[i % 2]]} {i},{('good', 'bad')[i % 2]}" for i in range(40)]
    (tmp_path / "train.csv").write_text("text,label\n" + "\n".join([*rows, *[f"{long},good"] * 3]) + "\n")
    (tmp_path / "dev.csv").write_text("text,label\n" + "\n".join(rows[:10]) + "\n")
    data = [
        "--train",
        tmp_path / "train.csv",
        "--dev",
        tmp_path / "dev.csv",
        "--epochs",
        1,
        "--batch-size",
        16,
    ]
    capsys.readouterr()
    run("--init", tiny_init, "--out", tmp_path / "past", *data)  # the default --max-seq-len, 128
    err = capsys.readouterr().err
    assert "warning: --max-seq-len 128 goes past the 64 positions pretraining trained (its --seq-len): 3 of the " \
           "43 training texts are longer than 64 tokens" in err, err  # fmt: skip
    assert "give --max-seq-len 64, or pretrain at a longer --seq-len" in err
    run("--init", tiny_init, "--out", tmp_path / "within", *data, "--max-seq-len", 64)
    assert "positions pretraining trained" not in capsys.readouterr().err


def test_a_finished_run_ends_with_the_next_step_and_that_step_runs(tiny_init, tmp_path, registry_data, capsys,
                                                                   monkeypatch):  # fmt: skip
    """Fine-tuning ended at "model: DIR (...)", where pretraining ends with the commands that come next."""
    from export.__main__ import main as export

    run("--init", tiny_init, "--out", tmp_path / "sentiment", "--train", write_csv(tmp_path / "r.csv", 30),
        "--text-column", "review", "--label-column", "verdict", "--epochs", 1)  # fmt: skip
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == (
        f"next: python -m export {tmp_path / 'sentiment'} --out bundles/sentiment (a classifier "
        "bundle), then python -m app --models bundles serves it as 'sentiment' at /classify"
    ), last
    monkeypatch.chdir(tmp_path)  # the command as printed, with what the test machine needs besides
    export([*last.split("python -m export ", 1)[1].split(" (", 1)[0].split(), "--precision", "fp32",
            "--data-dir", str(registry_data)])  # fmt: skip
    assert read_bundle(tmp_path / "bundles" / "sentiment").manifest.kind == "classifier"


def test_a_quantization_aware_init_is_fine_tuned_as_qat_says(tiny_init, tmp_path, capsys):
    """An init with int8 ranges (a --qat run, or a detector recovered from its int8 bundle) simulated int8
    in training whatever --qat said, while the printed options read qat = false: its fp32 export was then
    another function than the one trained. Left at its default, --qat now follows the init; given false,
    the ranges go and the model trains, and is saved, in fp32."""
    train = write_csv(tmp_path / "r.csv", 48)
    common = ["--train", train, "--text-column", "review", "--label-column", "verdict", "--epochs", 1,
              "--batch-size", 8]  # fmt: skip
    run("--init", tiny_init, *common, "--out", tmp_path / "qat", "--qat")
    # Its figures include the simulated int8 rounding: they were announced as an fp32 export's.
    assert (
        "eval_*.json in fp32 with the int8 rounding simulated (--qat), as its default export (--int8 compute)"
        in (capsys.readouterr().out)
    )
    run("--init", tmp_path / "qat", *common, "--out", tmp_path / "follows")
    assert (
        "is quantization-aware (int8 ranges in its config.json): fine-tuning it so too"
        in capsys.readouterr().out
    )
    assert json.loads((tmp_path / "follows" / "finetune_config.json").read_text())["qat"] is True
    assert "quantization" in json.loads((tmp_path / "follows" / "config.json").read_text())
    run("--init", tmp_path / "qat", *common, "--out", tmp_path / "fp32", "--qat", "false")
    said = capsys.readouterr().out
    assert "are dropped (--qat false): fine-tuning in fp32" in said
    assert "eval_*.json in fp32, as an fp32 export computes" in said
    assert json.loads((tmp_path / "fp32" / "config.json").read_text()).get("quantization") is None
    model, _, _ = load_model(tmp_path / "fp32")
    assert not any(type(m).__name__.startswith(("Int8", "StoredInt8")) for m in model.modules())


def test_ctrl_c_before_training_is_a_message_not_a_traceback(tmp_path, monkeypatch, capsys):
    """Ctrl-C while the data is read and tokenized (before the graceful stop watches): exit 130 and what
    to run again, as --out holds it: it said to add --overwrite to a command that ran as it was, where --out
    held only the run's lock."""
    import training.finetuning.tuner as tuner

    out = tmp_path / "out"
    writes: list[str] = []

    def interrupted(argv):
        out.mkdir(exist_ok=True)
        for name in (".lock", *writes):
            (out / name).write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(tuner, "run", interrupted)
    for wrote, again in [([], "the same command runs it again"),
                         (["finetune_config.json"], "the same command with --overwrite runs it again")]:  # fmt: skip
        writes[:] = wrote
        with pytest.raises(SystemExit) as stop:
            finetune(["--init", str(tmp_path), "--task", "trec", "--out", str(out)])
        assert stop.value.code == 130
        err = capsys.readouterr().err
        assert f"stopped at once, before the fine-tuned model was written; {again}" in err, err


@pytest.mark.parametrize("sig", ["SIGINT", "SIGHUP"])
def test_ctrl_c_keeps_the_best_model_so_far_and_says_the_run_is_not_complete(tiny_init, tmp_path, sig):
    """It ended in a KeyboardInterrupt traceback with nothing written, minutes of training lost. A closed
    SSH session (SIGHUP) ended it where it stood: now it stops as Ctrl-C does."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "training.finetune", "--init", str(tiny_init), "--train",
           str(write_csv(tmp_path / "r.csv", 120)), "--text-column", "review", "--label-column", "verdict",
           "--epochs", "200", "--batch-size", "8", "--log-every", "1", "--threads", "1", "--out", str(out)]  # fmt: skip
    # The signal at its default, as from a terminal: a pytest-xdist worker ignores SIGINT, a suite started
    # under nohup SIGHUP, and so would the run (a signal its parent ignores stays ignored).
    proc = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[1], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(getattr(signal, sig), signal.SIG_DFL))  # fmt: skip
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 120
    try:  # a run that does not stop is ended here, not left training for 200 epochs
        while time.time() < deadline and proc.poll() is None:
            if metrics.is_file() and metrics.read_text().count("\n") >= 3:
                break
            time.sleep(0.05)
        proc.send_signal(signal.Signals[sig])
        said = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.Signals[sig], said[-3000:]
    assert "Traceback" not in said, said[-3000:]
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["interrupted"] is True and state["global_step"] < 200 * 15
    # The best step, and the stop step of the run's whole length (it once said "of" the stop step).
    said_stop = re.search(
        rf"best at step (\d+); stopped at step (\d+) of (\d+) by {sig}, so the run is not complete", said
    )
    assert said_stop, said[-3000:]
    best, stopped, of = map(int, said_stop.groups())
    assert (best, stopped) == (state["step"], state["global_step"]) and of % 200 == 0 and of > stopped, said[
        -3000:
    ]
    assert load_model(out)[0] is not None  # the best model so far, readable


def test_a_signal_while_the_finished_run_is_saved_does_not_unmake_it(tiny_init, tmp_path, monkeypatch):
    """A scheduler's SIGTERM that came while the last model was written made a complete run exit 143 and
    call itself not complete."""
    import os
    import signal

    from training.finetuning import fine_tuner

    save = fine_tuner.FineTuner.save_best

    def signalled(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # handled by the run's GracefulStop: noted, nothing stops
        return save(self, *args, **kwargs)

    monkeypatch.setattr(fine_tuner.FineTuner, "save_best", signalled)
    evals = run("--init", tiny_init, "--train", write_csv(tmp_path / "r.csv", 30), "--text-column", "review",
                "--label-column", "verdict", "--epochs", 1, "--out", tmp_path / "out")  # fmt: skip
    assert "dev" in evals and "interrupted" not in evals
    assert json.loads((tmp_path / "out" / "trainer_state.json").read_text())["interrupted"] is False


def test_weights_files_are_as_readable_as_the_rest_of_the_output(spam_run):
    """safetensors writes its files private (0600); a model read by a teammate or a server's own user
    must not be (the checkpoint's config.json beside it is not)."""
    out, _ = spam_run
    weights, config = (out / "model.safetensors").stat().st_mode, (out / "config.json").stat().st_mode
    assert weights & 0o777 == config & 0o777, (oct(weights), oct(config))


def test_whole_number_labels_written_as_decimals_are_the_same_classes(tmp_path):
    """pandas writes an integer label column that has a missing value as floats: a train CSV of "0.0" and
    "1.0" beside a dev CSV of "0" and "1" once made four classes, and the dev file failed as holding labels
    the training data lacks."""
    from training.finetuning.config import FinetuneConfig
    from training.finetuning.data import load_task_data

    rows = [("a fine film", 1), ("a dull film", 0)] * 5
    (tmp_path / "train.csv").write_text("text,label\n" + "".join(f"{t},{y}.0\n" for t, y in rows))
    (tmp_path / "dev.csv").write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in rows))
    (tmp_path / "test.jsonl").write_text(
        "".join(json.dumps({"text": t, "label": float(y)}) + "\n" for t, y in rows)
    )
    where = {"init": str(tmp_path), "out": str(tmp_path / "out")}
    cfg = FinetuneConfig(train=str(tmp_path / "train.csv"), dev=str(tmp_path / "dev.csv"),
                         test=str(tmp_path / "test.jsonl"), **where)  # fmt: skip
    data = load_task_data(cfg)
    assert data.labels == ("0", "1") and data.problem_type == "single_label_classification"
    assert [ex.label for ex in data.splits["dev"]] == [ex.label for ex in data.splits["train"]] == [1, 0] * 5
    assert [ex.label for ex in data.splits["test"]] == [1, 0] * 5
    # Text labels that only look like numbers keep their names.
    versions = "".join(
        f"{t} {i},v{y}.0\n" for i, (t, y) in enumerate(rows * 4)
    )  # distinct texts: a dev split
    (tmp_path / "versions.csv").write_text("text,label\n" + versions)
    assert load_task_data(FinetuneConfig(train=str(tmp_path / "versions.csv"), **where)).labels == (
        "v0.0",
        "v1.0",
    )


def test_a_disk_without_room_for_the_model_is_refused_before_training(tiny_init, tmp_path):
    from benchmarks.training_faults import tmpfs

    train = write_csv(tmp_path / "r.csv", 30)
    weights = (tiny_init / "model.safetensors").stat().st_size
    try:
        with tmpfs(tmp_path / "small-disk", weights // 2) as disk:
            with pytest.raises(SystemExit) as e:
                run("--init", tiny_init, "--out", disk / "out", "--train", train, "--text-column", "review",
                    "--label-column", "verdict", "--epochs", 1)  # fmt: skip
            assert f"--out: not enough space on the disk holding {disk} (mounted at {disk}" in str(e.value)
            assert "free some space or choose another --out" in str(e.value)
            assert list(disk.iterdir()) == []
            # The mount point itself: a model is built beside --out and renamed into its place.
            with pytest.raises(SystemExit) as e:
                run("--init", tiny_init, "--out", disk, "--train", train, "--text-column", "review",
                    "--label-column", "verdict", "--epochs", 1)  # fmt: skip
            assert f"--out: {disk} is a mount point, which cannot be replaced" in str(e.value)
    except PermissionError as e:
        pytest.skip(str(e))


def test_a_disk_that_fills_during_the_run_ends_it_with_a_message(tiny_init, tmp_path):
    from benchmarks.training_faults import tmpfs
    from training.finetuning import start, tuner

    train = write_csv(tmp_path / "r.csv", 30)
    weights = (tiny_init / "model.safetensors").stat().st_size
    try:
        # Room at the start (check_model_fits: the model, and two resume/ at about four times it each)
        with tmpfs(tmp_path / "disk", 10 * weights + 2**23) as disk:
            t = start.setup(["--threads", "1", "--init", str(tiny_init), "--out", str(disk / "out"), "--train",
                             str(train), "--text-column", "review", "--label-column", "verdict", "--epochs", "1"])  # fmt: skip
            # Then another writer fills the disk.
            with (
                open(disk / "someone-elses-file", "wb", buffering=0) as ballast,
                contextlib.suppress(OSError),
            ):
                while True:
                    ballast.write(b"\0" * 4096)
            with pytest.raises(SystemExit) as e:
                tuner.train_and_save(t)
            message = str(e.value)
            assert f"no space left on the disk holding {disk}" in message, message
            assert "the fine-tuned model was not written" in message
            assert not (disk / "out" / "model.safetensors").exists()
            assert not [p for p in disk.iterdir() if p.name.startswith(".")]  # no half-written model left
    except PermissionError as e:
        pytest.skip(str(e))


@pytest.mark.parametrize(
    "stop_at, extra",
    [(5, ()),  # before the first dev evaluation: the stop evaluates, the resumed run must not
     (10, ("--eval-every", "4", "--sort-by-length", "--patience", "2", "--metric", "auto"))],  # early stopping's count kept
)  # fmt: skip
def test_a_stopped_run_resumes_to_the_uninterrupted_runs_weights_and_metrics(
    tiny_init, tmp_path, stop_at, extra, capsys
):
    """--resume goes on from resume/ (written at each dev evaluation and at a stop) to the same weights,
    metrics.jsonl rows and figures as the run never stopped; a finished run keeps no resume/."""
    import time

    from training.finetuning import start, tuner
    from training.report import read_metrics

    data = write_csv(tmp_path / "r.csv", 120)

    def args(out: Path) -> list[str]:
        return ["--init", str(tiny_init), "--train", str(data), "--text-column", "review", "--label-column",
                "verdict", "--epochs", "3", "--batch-size", "8", "--log-every", "2", "--threads", "1",
                "--out", str(out), *extra]  # fmt: skip

    finetune(args(tmp_path / "whole"))
    t = start.setup(
        [*args(tmp_path / "stopped"), "--overwrite"]
    )  # saved in its config: no clash with --resume
    # As after Ctrl-C at that step, of a first part that trained 10 minutes.
    tuner._train(t, time.time() - 600, stopping=lambda: t.step >= stop_at)
    assert (tmp_path / "stopped" / "resume" / "state.json").is_file()
    with (tmp_path / "stopped" / "metrics.jsonl").open("a") as torn:  # as a kill mid-row leaves it
        torn.write('{"step": 999, "spl')
    # The original command, --resume added; and the embedding gradients' fallback (a GPU's way out if the
    # custom op fails), which in eager mode computes the same kernels: the same weights all the same.
    finetune([*args(tmp_path / "stopped"), "--resume", "--embedding-grads", "autograd"])
    assert (
        json.loads((tmp_path / "stopped" / "finetune_config.json").read_text())["embedding_grads"]
        == "autograd"
    )

    whole, resumed = tmp_path / "whole", tmp_path / "stopped"
    assert (whole / "model.safetensors").read_bytes() == (resumed / "model.safetensors").read_bytes()

    def rows(run: Path) -> list[dict]:
        return [
            {k: v for k, v in r.items() if k != "examples_per_s"} for r in read_metrics(run / "metrics.jsonl")
        ]

    assert rows(whole) == rows(resumed)
    assert json.loads((whole / "eval_dev.json").read_text()) == json.loads(
        (resumed / "eval_dev.json").read_text()
    )
    assert not (resumed / "resume").exists() and not (whole / "resume").exists()
    # Its time is both parts' (it was the resumed part's alone).
    assert json.loads((resumed / "trainer_state.json").read_text())["minutes"] >= 10
    # The epoch as the step lines give it (a fraction of epochs done), not the number of the one under way.
    said = re.search(r"resumed: step (\d+) of (\d+) \(epoch (\d+\.\d\d)\)", capsys.readouterr().out)
    step, total, epoch = int(said[1]), int(said[2]), said[3]
    assert step == stop_at and epoch == f"{step / (total / 3):.2f}", said[0]


def test_resume_refuses_a_finished_run_and_a_changed_recipe(tiny_init, tmp_path, capsys):
    data = write_csv(tmp_path / "r.csv", 60)
    out = tmp_path / "out"
    finetune(["--init", str(tiny_init), "--train", str(data), "--text-column", "review", "--label-column",
              "verdict", "--epochs", "1", "--batch-size", "8", "--threads", "1", "--out", str(out)])  # fmt: skip
    with pytest.raises(SystemExit):
        finetune(["--out", str(out), "--resume"])
    assert "holds no resume state: its run finished" in capsys.readouterr().err
    (out / "resume").mkdir()
    (out / "resume" / "state.json").write_text("{}")  # as a stopped run leaves it, for the options' check
    with pytest.raises(SystemExit):
        finetune(["--out", str(out), "--resume", "--lr", "1e-3"])
    assert "lr (--lr) 0.0003 then, 0.001 now" in capsys.readouterr().err
    # Another source of data, given by a --config file: refused as a change, not as "--task and --train".
    recipe = tmp_path / "recipe.toml"
    recipe.write_text('task = "rotten_tomatoes"\n')
    with pytest.raises(SystemExit):
        finetune(["--out", str(out), "--resume", "--config", str(recipe)])
    said = capsys.readouterr().err
    assert (
        "task (--task) None then, 'rotten_tomatoes' now; train (--train) " in said and "give one" not in said
    )


def test_resume_refuses_training_data_changed_since_the_stop(tiny_init, tmp_path, capsys):
    """And test data: read at the start, scored at the end, an edited --test file went unnoticed, and the
    resumed run's test figures were not the run's. A run saved before the test's fingerprint still resumes."""
    import time

    from training.finetuning import start, tuner

    data, test, out = write_csv(tmp_path / "r.csv", 60), write_csv(tmp_path / "t.csv", 10), tmp_path / "out"
    t = start.setup(["--init", str(tiny_init), "--train", str(data), "--test", str(test), "--text-column", "review",
                     "--label-column", "verdict", "--epochs", "2", "--batch-size", "8", "--threads", "1",
                     "--out", str(out)])  # fmt: skip
    tuner._train(t, time.time(), stopping=lambda: t.step >= 3)
    kept = test.read_bytes()
    write_csv(test, 10, seed=1)
    with pytest.raises(SystemExit):
        finetune(["--out", str(out), "--resume"])
    assert "the test data differ from what the run" in capsys.readouterr().err
    test.write_bytes(kept)
    write_csv(data, 60, seed=1)  # other numbers in the texts
    with pytest.raises(SystemExit):
        finetune(["--out", str(out), "--resume"])
    err = capsys.readouterr().err
    assert "the training or dev data differ from what the run" in err
    assert "a run stopped under an earlier version may also have read its labels otherwise" in err
    assert "also held out other dev rows from --train" in err  # a classification's split changed 2026-11-30
    assert "is damaged" not in err  # it was also said to be, with advice that threw the resume state away
    write_csv(data, 60)
    state = json.loads((out / "resume" / "state.json").read_text())
    del state["test_data"]  # as a run saved before it kept one: not refused
    (out / "resume" / "state.json").write_text(json.dumps(state))
    write_csv(test, 10, seed=1)
    finetune(["--out", str(out), "--resume"])
    assert json.loads((out / "trainer_state.json").read_text())["stopped_early"] is False


def test_overwrite_keeps_the_previous_model_until_the_new_one_is_written(tiny_init, tmp_path):
    """--overwrite deleted the previous model at the start: a run that then failed (a crash, a kill, a
    divergence) left --out with no model at all."""
    from training.finetuning import start, tuner

    data, out = write_csv(tmp_path / "r.csv", 60), tmp_path / "out"
    args = ["--init", str(tiny_init), "--train", str(data), "--text-column", "review", "--label-column", "verdict",
            "--epochs", "1", "--batch-size", "8", "--threads", "1", "--out", str(out)]  # fmt: skip
    finetune([*args, "--test", str(write_csv(tmp_path / "t.csv", 12))])
    before = (out / "model.safetensors").read_bytes()
    t = start.setup([*args, "--overwrite", "--seed", "7"])  # as a run that then crashes leaves it
    assert (out / "model.safetensors").read_bytes() == before and (out / "eval_test.json").is_file()
    assert not (out / "metrics.jsonl").exists()  # the previous run's progress goes at the start
    tuner.train_and_save(t)
    assert (out / "model.safetensors").read_bytes() != before
    assert not (out / "eval_test.json").exists()  # not this run's: it had no --test


def test_a_signal_during_the_last_step_leaves_a_finished_run_finished(tiny_init, tmp_path):
    """It was written as interrupted, with an older resume/ linked in, and told to --resume."""
    import time

    from training.finetuning import start, tuner

    t = start.setup(["--init", str(tiny_init), "--train", str(write_csv(tmp_path / "r.csv", 60)), "--text-column",
                     "review", "--label-column", "verdict", "--epochs", "2", "--batch-size", "8", "--threads", "1",
                     "--out", str(tmp_path / "out")])  # fmt: skip
    evals = tuner._train(t, time.time(), stopping=lambda: t.step >= t.total)
    assert "interrupted" not in evals and t.step == t.total
    assert json.loads((tmp_path / "out" / "trainer_state.json").read_text())["interrupted"] is False
    assert not (tmp_path / "out" / "resume").exists()


def test_resume_after_the_pretraining_run_removed_the_checkpoint_it_began_from(tiny_init, tmp_path, capsys):
    """A pretraining run that goes on keeps its last --keep-checkpoints: the one a fine-tuning run began from
    may be gone at its --resume. Its weights come from resume/; --init (the run) gives shape and tokenizer."""
    import time

    from training.finetuning import start, tuner

    run = tmp_path / "pretraining"
    shutil.copytree(tiny_init, run / "checkpoints" / "step-00000001")
    (run / "checkpoints" / "latest").write_text("step-00000001\n")
    args = ["--init", str(run), "--train", str(write_csv(tmp_path / "r.csv", 60)), "--text-column", "review",
            "--label-column", "verdict", "--epochs", "2", "--batch-size", "8", "--threads", "1",
            "--out", str(tmp_path / "out")]  # fmt: skip
    t = start.setup(args)
    tuner._train(t, time.time(), stopping=lambda: t.step >= 3)
    (run / "checkpoints" / "step-00000001").rename(run / "checkpoints" / "step-00000002")
    (run / "checkpoints" / "latest").write_text("step-00000002\n")
    with pytest.raises(SystemExit):
        finetune(["--out", str(tmp_path / "out"), "--resume"])
    assert "the checkpoint this run began from, is gone; give --init" in capsys.readouterr().err
    finetune([*args, "--resume"])  # the original command: its --init is the run, which goes on
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    assert state["interrupted"] is False
    # The record keeps the start, not the checkpoint that gave the resume its shape and tokenizer.
    start = str(run / "checkpoints" / "step-00000001")
    assert state["init"] == state["config"]["init"] == start
    assert json.loads((tmp_path / "out" / "finetune_config.json").read_text())["init"] == start
    assert "the run began from" in capsys.readouterr().out


def test_the_saved_options_given_as_config_make_the_same_model(tiny_init, tmp_path):
    """finetune_config.json given back as --config was "not valid TOML": --config read TOML alone."""
    first = tmp_path / "first"
    run("--init", tiny_init, "--train", write_csv(tmp_path / "r.csv", 40), "--text-column", "review",
        "--label-column", "verdict", "--out", first, "--epochs", 1, "--batch-size", 8)  # fmt: skip
    saved = json.loads((first / "finetune_config.json").read_text())
    finetune(["--config", str(first / "finetune_config.json"), "--out", str(tmp_path / "again")])
    again = json.loads((tmp_path / "again" / "finetune_config.json").read_text())
    assert {k: v for k, v in again.items() if k != "out"} == {k: v for k, v in saved.items() if k != "out"}
    assert (first / "model.safetensors").read_bytes() == (
        tmp_path / "again" / "model.safetensors"
    ).read_bytes()
