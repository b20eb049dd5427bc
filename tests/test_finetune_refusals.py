"""Fine-tuning's answers to what goes wrong around a run: a loss that is no longer finite ends the run
(it wrote a NaN model and exited 0), a damaged resume state or run file is named (exit 2, not a
traceback), the --init the resume message asks for is taken, a run started with relative paths resumes
from any directory, and --threads beyond the machine is refused before torch's pools crash."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from training.finetune import main as finetune

try:
    from test_finetune import write_csv
except ImportError:  # tests/ made a package
    from tests.test_finetune import write_csv
from tests.helpers_models import held_elsewhere
from tests.helpers_refusals import refused_by

REPO = Path(__file__).resolve().parents[1]


def args_for(init, data: Path, out: Path, *extra) -> list[str]:
    return ["--init", str(init), "--train", str(data), "--text-column", "review", "--label-column", "verdict",
            "--epochs", "2", "--batch-size", "8", "--threads", "1", "--out", str(out), *map(str, extra)]  # fmt: skip


@pytest.fixture(scope="module")
def stopped(tiny_init, tmp_path_factory) -> tuple[Path, list[str]]:
    """A run stopped at step 3 (as after Ctrl-C), its resume/ state written; and its command."""
    from training.finetuning import start, tuner

    where = tmp_path_factory.mktemp("stopped")
    args = args_for(tiny_init, write_csv(where / "r.csv", 60), where / "out")
    t = start.setup(args)
    tuner._train(t, time.time(), stopping=lambda: t.step >= 3)
    return where / "out", args


def refused(argv: list[str], *says: str, own_process: bool = False) -> str:
    """Fine-tuning's refusal (tests/helpers_refusals.py): in this process, or in one of its own."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return refused_by(finetune, "training.finetune", argv, says, () if own_process else None, env)


def test_a_registry_task_whose_data_cannot_be_fetched_is_a_failure_not_an_input_to_change(
    tiny_init, tmp_path
):
    """Every DatasetError was exit 2, "--task trec (or --data-dir): ...": a network outage or a cache that
    cannot be written read as a wrong --task. A data dir's wrong copy is still the user's to change (2)."""
    cache = tmp_path / "cache"
    cache.write_text("a file where the cache directory should be")
    env = {k: v for k, v in os.environ.items() if k != "ELECTRA_DATA_DIR"}
    argv = ["--init", str(tiny_init), "--task", "trec", "--out", str(tmp_path / "out")]
    done = subprocess.run([sys.executable, "-m", "training.finetune", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**env, "PYTHONPATH": str(REPO), "ELECTRA_CACHE_DIR": str(cache)})  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    assert (
        "error: --task trec: cannot create the data cache" in done.stderr and "Traceback" not in done.stderr
    )
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "trec.csv").write_text("not the published file\n")
    refused([*argv, "--data-dir", str(tmp_path / "data")], "--task trec (or --data-dir): trec.csv in ")


def copy_of(stopped, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(stopped[0], out, copy_function=shutil.copy)
    (out / ".lock").unlink(missing_ok=True)
    return out


@pytest.mark.slow
def test_a_loss_no_longer_finite_ends_the_run_without_a_model(tiny_init, tmp_path):
    data, out = write_csv(tmp_path / "r.csv", 60), tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "training.finetune", *args_for(tiny_init, data, out, "--lr", "1e6")],
                          cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    assert "training diverged at step" in done.stderr and "--overwrite" in done.stderr, done.stderr[-2000:]
    assert not (out / "model.safetensors").exists()


@pytest.mark.parametrize(
    ("sealed", "where"),
    [("parent", "where the fine-tuned model is built"), ("out", "where the run writes its progress")],
)
def test_an_out_it_cannot_write_in_or_beside_is_refused_before_any_training(
    tiny_init, tmp_path, sealed, where
):
    """The final model is built in a directory beside --out: with only --out writable, the whole run trained,
    then failed writing it. And a read-only --out on a small disk was said to be full, not read-only."""
    from tests.unprivileged import CAPS

    data, out = write_csv(tmp_path / "r.csv", 60), tmp_path / "parent" / "out"
    out.mkdir(parents=True)
    read_only = out.parent if sealed == "parent" else out
    read_only.chmod(0o555)
    prefix = ("setpriv", f"--inh-caps={CAPS}", f"--bounding-set={CAPS}") if os.geteuid() == 0 else ()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        refused_by(finetune, "training.finetune", args_for(tiny_init, data, out), (
            f"--out {out}: cannot write in {read_only} (Permission denied), {where}: choose a --out you can write to",
        ), prefix, env)  # fmt: skip
    finally:
        read_only.chmod(0o755)
    assert list(out.iterdir()) == []


@pytest.mark.parametrize(
    "damage",
    [
        lambda out: (out / "resume" / "rng.safetensors").unlink(),
        lambda out: (out / "resume" / "optimizer.safetensors").write_bytes(b"\0" * 10),
        lambda out: (out / "resume" / "model.safetensors").write_bytes(b"not weights"),
        lambda out: (out / "resume" / "state.json").write_text('{"step": '),
    ],
    ids=["rng gone", "optimizer cut", "weights garbage", "state cut"],
)
def test_a_damaged_resume_state_is_named(stopped, tmp_path, damage):
    out = copy_of(stopped, tmp_path)
    damage(out)
    refused(["--out", str(out), "--resume"], "does not read", "is damaged", "--overwrite")


def test_damaged_run_files_are_named(stopped, tmp_path):
    out = copy_of(stopped, tmp_path)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert lines  # a torn row before them (only the last row may be torn by a kill)
    (out / "metrics.jsonl").write_text("\n".join(['{"step": 1, "spl', *lines]) + "\n")
    refused(["--out", str(out), "--resume"], "line 1 of", "is not JSON", "delete that line")
    (out / "finetune_config.json").write_text("{bad")
    refused(["--out", str(out), "--resume"], "finetune_config.json does not read", "--overwrite")


def test_resume_with_another_init_as_the_message_asks(stopped, tmp_path, tiny_init):
    """The resume of a run whose --init is gone says to give --init; given, it was refused for want of
    --task or --train."""
    out = copy_of(stopped, tmp_path)
    finetune(["--out", str(out), "--resume", "--init", str(tiny_init)])
    assert json.loads((out / "trainer_state.json").read_text())["interrupted"] is False


def test_a_run_started_with_relative_paths_resumes_from_another_directory(tiny_init, tmp_path):
    from training.finetuning import start, tuner

    here = tmp_path / "here"
    here.mkdir()
    shutil.copytree(tiny_init, here / "init")
    write_csv(here / "r.csv", 60)
    cwd = Path.cwd()
    os.chdir(here)
    try:
        t = start.setup(args_for("init", Path("r.csv"), Path("out")))
        tuner._train(t, time.time(), stopping=lambda: t.step >= 3)
    finally:
        os.chdir(cwd)
    saved = json.loads((here / "out" / "finetune_config.json").read_text())
    assert (saved["init"], saved["train"]) == (str(here / "init"), str(here / "r.csv"))
    # Its --train given again from a subdirectory, as ../r.csv: the same file, not a change of data (the
    # texts were compared, and the resume refused).
    (here / "sub").mkdir()
    os.chdir(here / "sub")
    try:
        finetune(["--out", "../out", "--resume", "--train", "../r.csv"])
    finally:
        os.chdir(cwd)
    assert json.loads((here / "out" / "trainer_state.json").read_text())["interrupted"] is False
    assert json.loads((here / "out" / "finetune_config.json").read_text())["train"] == str(here / "r.csv")


def test_threads_beyond_the_machine_are_refused(tmp_path):
    refused(["--out", str(tmp_path / "x"), "--task", "sms_spam", "--init", str(tmp_path), "--threads", "100000"],
            "--threads: 100000 is more than 4x")  # fmt: skip


def test_run_settings_without_an_init_are_named(stopped, tmp_path):
    out = copy_of(stopped, tmp_path)
    (out / "finetune_config.json").write_text("{}")
    refused(["--out", str(out), "--resume"], "holds no run settings")


def test_an_infinite_target_among_fractional_labels_is_named_not_made_a_class(tiny_init, tmp_path):
    rows = [{"text": f"a film {i}", "score": 0.5 + i / 7} for i in range(30)] + [
        {"text": "odd", "score": "inf"}
    ]
    data = tmp_path / "r.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    refused(["--init", str(tiny_init), "--train", str(data), "--label-column", "score", "--out", str(tmp_path / "o")],
            "label 'inf' is not a finite number", "--problem-type classification")  # fmt: skip


def test_a_text_pair_needs_room_for_both_texts(tmp_path):
    refused(["--out", str(tmp_path / "x"), "--init", str(tmp_path), "--train", str(tmp_path / "t.csv"),
             "--text-pair-column", "b", "--max-seq-len", "4"], "a text pair needs at least 5")  # fmt: skip


def test_a_resume_whose_init_tokenizer_now_numbers_otherwise_is_refused(tmp_path, tiny_init):
    """The tokenizer of the checkpoint a run began from, changed in place between the stop and the resume
    (the same size, two ids swapped): the run went on with other ids and said it resumed."""
    from training.finetuning import start, tuner

    init = tmp_path / "init"
    shutil.copytree(tiny_init, init)
    args = args_for(init, write_csv(tmp_path / "r.csv", 60), tmp_path / "out")
    t = start.setup(args)
    tuner._train(t, time.time(), stopping=lambda: t.step >= 3)
    spec = json.loads((init / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[-2:]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (init / "tokenizer.json").write_text(json.dumps(spec))
    said = refused(["--out", str(tmp_path / "out"), "--resume"], "numbers tokens otherwise")
    assert "is damaged" not in said


def test_a_classifier_fine_tuned_on_its_own_files_is_export_checked_on_its_dev_file(
    tiny_init, tmp_path, registry_data
):
    """Export measured int8's accuracy drop on a registry task's dev split only; a run on the user's own
    files got an argmax-disagreement check on WikiText instead, though its --dev file was right there."""
    from export.__main__ import main as export

    train, dev = write_csv(tmp_path / "r.csv", 60), write_csv(tmp_path / "d.csv", 24, seed=1)
    finetune([*args_for(tiny_init, train, tmp_path / "out"), "--dev", str(dev)])
    export([str(tmp_path / "out"), "--out", str(tmp_path / "bundle"), "--data-dir", str(registry_data)])
    check = json.loads((tmp_path / "bundle" / "manifest.json").read_text())["parity"]["int8_accuracy"]
    # The path cut as the manifest cuts every path (export/portable.py): the server shows it.
    shown = "/".join(("...", *Path(dev).parts[-3:]))
    assert check["metric"] == "dev_accuracy" and check["data"] == f"the run's --dev file {shown}", check


def test_a_classifier_whose_dev_split_was_cut_from_its_train_file_is_export_checked_on_that_split(
    tiny_init, tmp_path, registry_data
):
    from export.__main__ import main as export

    finetune(args_for(tiny_init, write_csv(tmp_path / "r.csv", 80), tmp_path / "out"))
    export([str(tmp_path / "out"), "--out", str(tmp_path / "bundle"), "--data-dir", str(registry_data)])
    check = json.loads((tmp_path / "bundle" / "manifest.json").read_text())["parity"]["int8_accuracy"]
    assert check["metric"] == "dev_accuracy" and check["data"].startswith("the run's dev split (10% of"), (
        check
    )
    rows = json.loads((tmp_path / "out" / "eval_dev.json").read_text())["n"]
    assert check["rows"] == rows  # the very rows the run was selected on
    # The run's own warnings only (this tiny one answers one label for every dev text: fine-tuning said so)
    said = json.loads((tmp_path / "out" / "trainer_state.json").read_text()).get("warnings", [])
    assert json.loads((tmp_path / "bundle" / "manifest.json").read_text()).get("warnings", []) == said
    # A run stopped before its schedule ended: its bundle says so, as /models and the page show warnings.
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    (tmp_path / "out" / "trainer_state.json").write_text(json.dumps({**state, "interrupted": True}))
    export([str(tmp_path / "out"), "--out", str(tmp_path / "stopped"), "--precision", "fp32"])
    warnings = json.loads((tmp_path / "stopped" / "manifest.json").read_text())["warnings"]
    assert any(f"stopped at step {state['global_step']}, before its schedule ended" in w for w in warnings)
    # One that answers one label for every dev text (fine-tuning warned, and saved it): so does its bundle,
    # which was exported and served without a word.
    one = "the model answers 'positive' for every dev text, whatever the text; train longer (--epochs)"
    (tmp_path / "out" / "trainer_state.json").write_text(
        json.dumps({**state, "warnings": [one], "interrupted": False})
    )
    export([str(tmp_path / "out"), "--out", str(tmp_path / "one"), "--precision", "fp32"])
    assert json.loads((tmp_path / "one" / "manifest.json").read_text())["warnings"] == [one]


def test_dev_texts_that_are_training_texts_are_warned_of(tiny_init, tmp_path, capsys):
    """The same file as --train and --dev trained and chose the model on the same texts, and said nothing."""
    train = write_csv(tmp_path / "r.csv", 40)
    finetune([*args_for(tiny_init, train, tmp_path / "out"), "--dev", str(train), "--epochs", "1"])
    assert "warning: 40 of 40 dev texts are also training texts" in capsys.readouterr().err


def test_a_run_saved_with_options_its_data_left_unused_still_resumes(tiny_init, tmp_path):
    """--text-column with --task (or --dev-fraction with --dev) was saved and ignored by the previous version,
    and is refused now: the run it saved resumed no more, the refusal naming a flag no one gave."""
    import options
    from training.finetuning.config import FinetuneConfig
    from training.finetuning.resume import resumed_config

    out = tmp_path / "out"
    (out / "resume").mkdir(parents=True)
    (out / "resume" / "state.json").write_text("{}")  # a stopped run's, for the options' check
    start = options.resolve(FinetuneConfig, ["--init", str(tiny_init), "--task", "trec", "--out", str(out)])
    saved = {**options.as_dict(start), "text_column": "sentence", "dev_fraction": 0.2}
    (out / "finetune_config.json").write_text(json.dumps(saved))
    argv = ["--out", str(out), "--resume"]
    cfg, _ = resumed_config(options.resolve(FinetuneConfig, argv), argv, "finetune", "")
    assert (cfg.task, cfg.text_column, cfg.dev_fraction) == ("trec", "text", 0.1)
    with pytest.raises(options.ConfigError, match="--text-column: only for --train data; --task trec"):
        options.resolve(FinetuneConfig, ["--init", str(tiny_init), "--task", "trec", "--out", str(out),
                                         "--text-column", "sentence"])  # fmt: skip


def test_a_model_that_answers_one_label_for_everything_is_warned_of():
    """A fine-tune that learnt only the majority class printed f1 0.92 for it, and nothing else."""
    from types import SimpleNamespace

    from training.finetuning.fine_tuner import _one_class_note

    data = SimpleNamespace(problem_type="classification")
    rows = [{"label": "junk", "predicted": "normal"}] + [{"label": "normal", "predicted": "normal"}] * 9
    assert "answers 'normal' for every dev text" in _one_class_note(rows, data)
    assert _one_class_note([*rows, {"label": "junk", "predicted": "junk"}], data) is None
    assert _one_class_note([{"label": "normal", "predicted": "normal"}] * 3, data) is None  # one class given


def test_torchrun_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    """Under torchrun every rank trained the whole run into --out: rank 1 was refused "--out is in use",
    and torchrun ended in a ChildFailedError traceback."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in ("1", "0"):
        monkeypatch.setenv("RANK", rank)
        with pytest.raises(SystemExit) as stop:
            finetune(["--init", str(tmp_path), "--task", "sms_spam", "--out", str(tmp_path / "out")])
        assert stop.value.code == 2
        said = capsys.readouterr().err
        assert (
            said == ""
            if rank == "1"
            else "error: fine-tuning runs in one process, and torchrun started 2" in said
        )
    assert not (tmp_path / "out").exists()


def test_a_positive_label_on_a_regression_says_it_is_for_binary_classification(tiny_init, tmp_path, capsys):
    """It said "'1' is not one of the labels ['score']": a regression's one output is named after its column."""
    data = tmp_path / "r.jsonl"
    data.write_text("".join(json.dumps({"text": f"a film {i}", "score": i / 7}) + "\n" for i in range(30)))
    with pytest.raises(SystemExit):
        finetune(["--init", str(tiny_init), "--train", str(data), "--label-column", "score", "--positive-label", "1",
                  "--out", str(tmp_path / "out")])  # fmt: skip
    assert "--positive-label: applies to binary classification only; this data is a regression" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("metric", ["f1", "macro_f1"])
def test_a_classification_metric_on_a_regression_names_the_regression_figures(
    tiny_init, tmp_path, capsys, metric
):
    """--metric f1 said "use macro_f1", which was then refused with "use pearson or spearman"."""
    data = tmp_path / "r.jsonl"
    data.write_text("".join(json.dumps({"text": f"a film {i}", "score": i / 7}) + "\n" for i in range(30)))
    with pytest.raises(SystemExit):
        finetune(["--init", str(tiny_init), "--train", str(data), "--label-column", "score", "--metric", metric,
                  "--out", str(tmp_path / "out")])  # fmt: skip
    err = capsys.readouterr().err
    assert f"--metric {metric}: a classification figure, and this data is a regression" in err, err
    assert "use pearson or spearman" in err and "use macro_f1" not in err, err
    assert not (tmp_path / "out").exists()


def test_threads_0_is_every_core_and_cuda_without_a_gpu_leaves_out_untouched(tmp_path, capsys):
    """--threads 0 was refused ("must be positive") where pretraining takes it as every core; --device cuda
    on a machine without one was refused after --out was created and locked."""
    import torch

    import options
    from training.finetuning.config import FinetuneConfig

    argv = ["--init", str(tmp_path), "--task", "sms_spam", "--out", str(tmp_path / "out")]
    assert options.resolve(FinetuneConfig, [*argv, "--threads", "0"]).threads == 0
    with pytest.raises(
        options.ConfigError, match=r"--threads: must not be negative \(0 or none: every core\)"
    ):
        options.resolve(FinetuneConfig, [*argv, "--threads", "-1"])
    if torch.cuda.is_available():
        return
    with pytest.raises(SystemExit) as stop:
        finetune([*argv, "--device", "cuda"])
    assert stop.value.code == 2 and "--device cuda: no CUDA device is visible" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_data_dir_given_that_names_no_directory_is_refused(tmp_path, monkeypatch, capsys):
    """--data-dir /nonexistent (or ELECTRA_DATA_DIR) was ignored in silence: the registry's cache or the
    network stood in for it. (Own files and an --init of nothing: the old code fails at once, elsewhere.)"""
    gone, train = tmp_path / "nowhere", write_csv(tmp_path / "r.csv", 30)
    argv = ["--init", str(tmp_path), "--train", str(train), "--out", str(tmp_path / "o")]
    monkeypatch.delenv("ELECTRA_DATA_DIR", raising=False)
    with pytest.raises(SystemExit) as stop:
        finetune([*argv, "--data-dir", str(gone)])
    assert stop.value.code == 2 and f"error: --data-dir: {gone} does not exist" in capsys.readouterr().err
    monkeypatch.setenv("ELECTRA_DATA_DIR", str(gone))
    with pytest.raises(SystemExit) as stop:
        finetune(argv)
    assert (
        stop.value.code == 2 and f"error: ELECTRA_DATA_DIR: {gone} does not exist" in capsys.readouterr().err
    )
    assert not (tmp_path / "o").exists()


def test_a_resume_whose_saved_data_dir_is_gone_goes_on(stopped, tmp_path, monkeypatch, capsys):
    """A data_dir the run saved, gone on the machine it resumes on, is the run's, not given now: noted."""
    out = copy_of(stopped, tmp_path)
    saved = json.loads((out / "finetune_config.json").read_text())
    (out / "finetune_config.json").write_text(json.dumps({**saved, "data_dir": str(tmp_path / "gone")}))
    monkeypatch.delenv("ELECTRA_DATA_DIR", raising=False)
    finetune(["--out", str(out), "--resume"])
    assert json.loads((out / "trainer_state.json").read_text())["interrupted"] is False
    assert f"note: the run's data_dir {tmp_path / 'gone'} does not exist here" in capsys.readouterr().err


def test_the_original_command_resumes_when_it_spelled_its_labels_otherwise_than_the_data(tiny_init, tmp_path):
    """A run started with --positive-label 1.0 saved the class it names, "1": the same command with --resume
    was refused as changing it ("--positive-label '1' then, '1.0' now"); so was --labels spelled otherwise."""
    import options
    from training.finetuning import start, tuner
    from training.finetuning.config import FinetuneConfig
    from training.finetuning.resume import resumed_config

    data, out = tmp_path / "r.csv", tmp_path / "out"
    data.write_text(
        "review,verdict\n" + "".join(f"film {i} {'good' if i % 2 else 'bad'},{i % 2}\n" for i in range(40))
    )
    args = [*args_for(tiny_init, data, out), "--positive-label", "1.0", "--labels", "0.0, 1"]
    t = start.setup(args)
    tuner._train(t, time.time(), stopping=lambda: t.step >= 3)
    respelled = ["--out", str(out), "--resume", "--labels", "0,1.0", "--positive-label", "+1"]
    cfg, _ = resumed_config(options.resolve(FinetuneConfig, respelled), respelled, "finetune", "")
    assert (cfg.labels, cfg.positive_label) == ("0.0, 1", "1")  # the run's own record is kept
    finetune([*args, "--resume"])  # the original command, --resume added
    assert json.loads((out / "trainer_state.json").read_text())["interrupted"] is False
    assert json.loads((out / "eval_dev.json").read_text())["positive_label"] == "1"


def test_an_out_held_by_a_live_run_is_refused_naming_it_before_what_it_holds(stopped, tmp_path):
    """Its files were refused first ("already holds ...; pass --resume"), advice that then met the lock:
    the live process is named at once, with or without --resume."""
    out = copy_of(stopped, tmp_path)
    with held_elsewhere(out) as pid:
        in_use = f"is in use: another training process (pid {pid})"
        for argv in (stopped[1][:-1] + [str(out)], ["--out", str(out), "--resume"]):
            assert "already holds" not in refused(argv, in_use, own_process=True)
    refused(stopped[1][:-1] + [str(out)], "already holds", "pass --resume")
