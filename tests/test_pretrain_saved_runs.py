"""What a pretraining run leaves behind, taken up again: its saved config.json given back as --config
runs it again (it was "not valid TOML"); a handoff unpacked from it is refused by --resume saying to go
on with --init (it was called a damaged checkpoint); a --data-dir given that names no directory is
refused, while a resume whose saved data_dir is gone on this machine goes on, saying so."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

import options
from training.pretrain import main as pretrain

try:
    from test_pretrain_refusals import REPO, tiny
except ImportError:  # tests/ made a package
    from tests.test_pretrain_refusals import REPO, tiny


@pytest.fixture(scope="module")
def finished(tmp_path_factory, small_corpus, small_tokenizer) -> Path:
    """A 4-step run with checkpoints at steps 2 and 4."""
    run = tmp_path_factory.mktemp("finished") / "run"
    pretrain(tiny(run, small_corpus, small_tokenizer))
    return run


def copy_of(finished: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(finished, run, copy_function=shutil.copy)
    (run / ".lock").unlink(missing_ok=True)
    return run


def refused(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        pretrain(argv)
    assert stop.value.code == 2
    return capsys.readouterr().err


def test_the_saved_config_given_back_as_config_resolves_to_the_same_run(finished, tmp_path):
    from training.pretraining.run_config import resolve_config

    saved = json.loads((finished / "config.json").read_text())
    again, _ = resolve_config(["--config", str(finished / "config.json"), "--out", str(tmp_path / "again")])
    assert {k: v for k, v in options.as_dict(again).items() if k != "out"} == {
        k: v for k, v in saved.items() if k not in ("out", "as_run")
    }
    assert again.out == str(tmp_path / "again")  # where that run wrote is its own


def test_the_saved_config_given_back_without_out_is_refused_not_trained_into_runs_small(finished, tmp_path):
    """`--config RUN/config.json` alone trained into ./runs/small, the default, in silence: the run's own out
    is left out of a replay (it must never write into that run), and --out had a default. Fine-tuning's
    --out has none, and export's saved one was asked for again: pretraining's is asked for too."""
    from training.finetuning.config import FinetuneConfig
    from training.pretraining.config import PretrainConfig
    from training.pretraining.run_config import resolve_config

    config = finished / "config.json"
    with pytest.raises(SystemExit, match=re.escape(
            f"--out: required with --config {config}, a run's saved options: a run of them never writes into that "
            f"run's directory ({finished}); give the new run's --out")):  # fmt: skip
        resolve_config(["--config", str(config)])
    with pytest.raises(
        SystemExit, match=re.escape(f"to go on with that run, give --out {finished} --resume")
    ):
        resolve_config(["--config", str(config), "--resume"])
    moved = tmp_path / "moved"  # a copy of the run: its own checkpoints are the ones to go on from
    (moved / "checkpoints").mkdir(parents=True)
    (moved / "checkpoints" / "latest").write_text("step-00000001\n")
    shutil.copy(config, moved)
    with pytest.raises(SystemExit, match=re.escape(f"give --out {moved} --resume")):
        resolve_config(["--config", str(moved / "config.json"), "--resume"])
    # A benchmark's base config (each of its runs gets its own --out) takes a run's saved options as they are.
    assert options.resolve(PretrainConfig, ["--config", str(config)], env={}, template=True).max_steps > 0
    saved = tmp_path / "finetune_config.json"
    saved.write_text(json.dumps({"init": str(finished), "out": str(tmp_path / "ft"), "task": "trec"}))
    with pytest.raises(options.ConfigError, match=re.escape(f"that run's directory ({tmp_path / 'ft'})")):
        options.resolve(FinetuneConfig, ["--config", str(saved)], env={})
    assert (
        options.resolve(FinetuneConfig, ["--config", str(saved), "--out", str(tmp_path / "b")], env={}).task
        == "trec"
    )


def test_a_checkpoints_model_config_given_as_config_names_the_runs_options_file(finished):
    """RUN/checkpoints/step-N/config.json is the model's (Hugging Face's); as --config it failed on "unknown
    option 'architectures'", which said nothing of the run's own config.json two directories up."""
    from training.pretraining.run_config import resolve_config

    model_config = finished / "checkpoints" / "step-00000004" / "config.json"
    with pytest.raises(SystemExit, match=re.escape(f"not the options a run saved: give {finished / 'config.json'}, "
                                                   "that run's options; to start from that model, give its "
                                                   "directory as --init")):  # fmt: skip
        resolve_config(["--config", str(model_config), "--out", str(finished.parent / "again")])


def test_an_unpacked_handoff_cannot_be_resumed_and_says_to_go_on_with_init(finished, tmp_path, capsys):
    from training.handoff import main as handoff

    assert handoff(["pack", str(finished), "--out", str(tmp_path / "packed")]) == 0
    assert handoff(["unpack", str(tmp_path / "packed"), "--out", str(tmp_path / "unpacked")]) == 0
    said = refused(["--out", str(tmp_path / "unpacked"), "--resume"], capsys)
    assert "was unpacked from a handoff (handoff.json)" in said and "is damaged" not in said
    assert f"python -m training.pretrain --init {tmp_path / 'unpacked'} --out NEW_RUN" in said


def test_a_data_dir_given_that_names_no_directory_is_refused(
    tmp_path, monkeypatch, capsys, small_corpus, small_tokenizer
):
    """--data-dir /nonexistent (or ELECTRA_DATA_DIR) was ignored in silence: the registry's cache or the
    network stood in for it. (A one-step run on a corpus file: the old code trains it, and fails at once.)"""
    gone, run = tmp_path / "nowhere", tmp_path / "run"
    argv = ["--out", str(run), "--corpus", str(small_corpus), "--tokenizer", str(small_tokenizer), "--threads", "1",
            "--max-steps", "1"]  # fmt: skip
    monkeypatch.delenv("ELECTRA_DATA_DIR", raising=False)
    said = refused(["--config", str(REPO / "configs" / "tiny.toml"), *argv, "--data-dir", str(gone)], capsys)
    assert f"error: --data-dir: {gone} does not exist" in said
    monkeypatch.setenv("ELECTRA_DATA_DIR", str(gone))
    said = refused(["--config", str(REPO / "configs" / "tiny.toml"), *argv], capsys)
    assert f"error: ELECTRA_DATA_DIR: {gone} does not exist" in said
    monkeypatch.delenv("ELECTRA_DATA_DIR")
    (tmp_path / "file").write_text("")
    config = tmp_path / "run.toml"
    config.write_text((REPO / "configs" / "tiny.toml").read_text() + f'data_dir = "{tmp_path / "file"}"\n')
    said = refused(["--config", str(config), *argv], capsys)
    assert f"error: {config}: data_dir: {tmp_path / 'file'} is not a directory" in said
    assert not run.exists()


def test_a_resume_whose_saved_data_dir_is_gone_goes_on(finished, tmp_path, monkeypatch, capsys):
    """On another machine the run's data_dir may be gone: it is the run's, not given now, and registry files
    come from the cache (sha256-checked) instead."""
    run = copy_of(finished, tmp_path)
    saved = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**saved, "data_dir": str(tmp_path / "gone")}))
    monkeypatch.delenv("ELECTRA_DATA_DIR", raising=False)
    pretrain(["--out", str(run), "--resume", "--max-steps", "5", "--threads", "1"])
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-00000005"
    assert f"note: the run's data_dir {tmp_path / 'gone'} does not exist here" in capsys.readouterr().err


def test_a_resume_of_shards_older_than_their_digest_hashes_each_token_file_once(
    finished, tmp_path, monkeypatch
):
    """Shards made before meta.json recorded their digest are hashed whole at a start (tokens.bin: GBs
    for a large corpus); a resume hashed each split twice, once to check it against the checkpoint and
    once more for the identity every checkpoint keeps. The spy calls the real digest through."""
    from training.pretraining import data

    run = copy_of(finished, tmp_path)
    for split in ("train", "valid"):
        meta = run / "data" / split / "meta.json"
        meta.write_text(json.dumps({k: v for k, v in json.loads(meta.read_text()).items() if k != "digest"}))
    hashed, real = [], data.rows_digest

    def counting(info):
        if not info.digest:  # the whole file read
            hashed.append(Path(info.path).name)
        return real(info)

    monkeypatch.setattr(data, "rows_digest", counting)
    pretrain(["--out", str(run), "--resume", "--max-steps", "5", "--threads", "1"])
    assert sorted(hashed) == ["train", "valid"]
    state = {s: json.loads((run / "checkpoints" / s / "trainer_state.json").read_text())["data"]
             for s in ("step-00000004", "step-00000005")}  # fmt: skip
    assert state["step-00000005"] == state["step-00000004"]  # the same rows, known by the same digest


def test_a_finished_run_resumed_says_its_final_evaluation_and_draws_no_progress(finished, tmp_path, capsys):
    """Resumed with nothing to train, its final: line lacked the evaluation its checkpoint holds (the one
    made at its end), and its progress bar, full from the start, was drawn twice."""
    run = copy_of(finished, tmp_path)
    state = json.loads((run / "checkpoints" / "step-00000004" / "trainer_state.json").read_text())
    pretrain(["--out", str(run), "--resume"])
    said = capsys.readouterr()
    final = json.loads(next(line for line in said.out.splitlines() if line.startswith("final: "))[7:])
    assert final["eval_step"] == 4 and final["loss"] == round(state["eval"]["loss"], 4), final
    assert "pretrain:" not in said.err, said.err
