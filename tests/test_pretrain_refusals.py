"""What a pretraining user gets wrong, or finds damaged, ends in a message that names it and what to do
(exit 2), not a traceback, a silent wrong run, or a failure after the work: damaged checkpoints and
shards on --resume, a run resumed from another directory, seeds and loss weights out of range, a corpus
of copies, quoted numbers in a --config file."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import options
from tests.helpers_models import held_elsewhere
from tests.helpers_refusals import refused_by
from training.pretrain import main as pretrain
from training.pretraining.config import PretrainConfig

REPO = Path(__file__).resolve().parent.parent


def tiny(out, corpus, tokenizer, *extra) -> list[str]:
    return ["--config", str(REPO / "configs" / "tiny.toml"), "--out", str(out), "--corpus", str(corpus),
            "--tokenizer", str(tokenizer), "--threads", "1", "--max-steps", "4", "--save-every", "2",
            "--eval-every", "4", *map(str, extra)]  # fmt: skip


@pytest.fixture(scope="module")
def finished(tmp_path_factory, small_corpus, small_tokenizer) -> Path:
    """A 4-step run with checkpoints at steps 2 and 4."""
    run = tmp_path_factory.mktemp("finished") / "run"
    pretrain(tiny(run, small_corpus, small_tokenizer))
    return run


def refused(argv: list[str], *says: str, prefix: tuple[str, ...] | None = None) -> str:
    """Pretraining's refusal (tests/helpers_refusals.py): in this process, or in one of its own given a
    `prefix` (() or a command that runs it)."""
    return refused_by(pretrain, "training.pretrain", argv, says, prefix)


def damaged_copy(finished: Path, tmp_path: Path, damage) -> Path:
    run = tmp_path / "run"
    shutil.copytree(finished, run, copy_function=shutil.copy)  # no hard links into the original
    (run / ".lock").unlink(missing_ok=True)
    damage(run, run / "checkpoints" / "step-00000004")
    return run


@pytest.mark.slow
def test_a_run_held_by_a_live_process_is_refused_naming_it_before_what_it_holds(
    tmp_path, finished, small_corpus, small_tokenizer
):
    """Its checkpoints were refused first ("already holds a run; pass --resume"), and following that
    advice met the lock ("is in use ... pid N"): the live process is named at once, with or without
    --resume, and once it has ended the run's own refusal is back."""
    run = tmp_path / "run"
    shutil.copytree(finished, run, copy_function=shutil.copy)
    with held_elsewhere(run) as pid:
        in_use = f"is in use: another training process (pid {pid})"
        for argv in (
            tiny(run, small_corpus, small_tokenizer),
            ["--out", str(run), "--resume", "--max-steps", "6"],
        ):
            assert "already holds a run" not in refused(argv, in_use, prefix=())  # a process of its own
        # Under torchrun rank 0 looks and every rank stops with it, the refusal said once (rank 1 looking
        # too could find rank 0's own lock, taken just after).
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
                    "training.pretrain", "--out", str(run), "--resume", "--max-steps", "6"]  # fmt: skip
        done = subprocess.run(torchrun, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        said = done.stdout + done.stderr
        assert done.returncode != 0 and said.count(in_use) == 1, said[-3000:]
        assert re.search(r"exitcode\s*: 2 ", said[said.index("Root Cause") :]), said[
            -3000:
        ]  # rank 0's refusal
    refused(tiny(run, small_corpus, small_tokenizer), "already holds a run; pass --resume")


def truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda run, d: truncate(d / "optimizer.safetensors", 5000), "optimizer.safetensors does not read"),
        (lambda run, d: (d / "optimizer.safetensors").unlink(), "optimizer.safetensors does not read"),
        (lambda run, d: (d / "trainer_state.json").write_text("{bad"), "trainer_state.json does not read"),
        (lambda run, d: (d / "model.safetensors").unlink(), "holds no weights"),
        (lambda run, d: truncate(d / "generator" / "model.safetensors", 100), "does not read as weights"),
    ],
    ids=["optimizer cut short", "optimizer gone", "state not JSON", "weights gone", "generator cut short"],
)
def test_a_damaged_checkpoint_names_the_file_and_the_kept_one_to_resume_from(
    finished, tmp_path, damage, says
):
    run = damaged_copy(finished, tmp_path, damage)
    refused(["--out", str(run), "--resume", "--max-steps", "6"], "checkpoint step-00000004 is damaged", says,
            "it is kept: step-00000002", str(run / "checkpoints" / "latest"))  # fmt: skip
    # As the message says: the kept checkpoint, named in checkpoints/latest, resumes.
    (run / "checkpoints" / "latest").write_text("step-00000002")
    pretrain(["--out", str(run), "--resume", "--max-steps", "3"])


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda run, d: (run / "checkpoints" / "latest").write_text("\n"), "checkpoints/latest is empty"),
        (lambda run, d: shutil.rmtree(d), "names step-00000004, which is gone (no "),
        (lambda run, d: (d / "config.json").unlink(), "names step-00000004, but"),
    ],
    ids=["latest empty", "latest's checkpoint gone", "its config.json gone"],
)
def test_a_latest_that_names_no_checkpoint_says_which_way_and_what_is_kept(finished, tmp_path, damage, says):
    """checkpoints/latest empty, or naming a checkpoint directory that is gone, was said as "holds no
    config.json" (the checkpoints directory's, or the gone one's), and the checkpoints kept went unnamed."""
    run = damaged_copy(finished, tmp_path, damage)
    refused(["--out", str(run), "--resume", "--max-steps", "6"], says, "kept checkpoint (step-00000002")
    named = (run / "checkpoints" / "latest").read_text().strip()
    for d in (run / "checkpoints").glob("step-*"):
        if d.name != named:
            shutil.rmtree(d)
    refused(["--out", str(run), "--resume", "--max-steps", "6"], says, "no checkpoint (step-*) is kept")


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda run, d: (run / "config.json").write_text("{bad"), "config.json does not read"),
        (lambda run, d: (run / "config.json").unlink(), "config.json is missing"),
    ],
    ids=["not JSON", "gone"],
)
def test_a_runs_settings_damaged_or_gone_are_named_not_replaced_by_the_defaults(
    finished, tmp_path, damage, says
):
    run = damaged_copy(finished, tmp_path, damage)
    refused(["--out", str(run), "--resume", "--max-steps", "6"], says, "trainer_state.json")


def test_shards_cut_short_are_named_with_how_to_make_them_again(finished, tmp_path):
    run = damaged_copy(
        finished, tmp_path, lambda run, d: truncate(run / "data" / "train" / "tokens.bin", 1000)
    )
    refused(
        ["--out", str(run), "--resume", "--max-steps", "6"],
        "is damaged",
        "delete",
        "run the same command again",
    )
    shutil.rmtree(run / "data" / "train")  # as it says
    pretrain(["--out", str(run), "--resume", "--max-steps", "5"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "read_only, what",
    [("checkpoints", "its checkpoints"), (".", "its settings and metrics"), ("tokenizer", "its tokenizer")],
)
def test_a_resume_that_cannot_write_its_checkpoints_is_refused_before_training(
    finished, tmp_path, read_only, what
):
    """The run directory itself too: with only checkpoints/ writable, the resume read its data and ended in a
    PermissionError traceback saving its settings."""
    # Root writes into a read-only directory: as root, the run goes without the capability that allows it.
    prefix = ("setpriv", "--bounding-set", "-all", "--inh-caps", "-all") if os.geteuid() == 0 else ()
    if prefix and not shutil.which("setpriv"):
        pytest.skip("running as root without setpriv (util-linux) to drop root's override of permissions")
    run = damaged_copy(finished, tmp_path, lambda run, d: None)
    (run / ".lock").touch()  # a run that has been held keeps its lock file: holding it again writes nothing
    (run / read_only).chmod(0o555)
    try:
        refused(
            ["--out", str(run), "--resume", "--max-steps", "6"],
            f"cannot write in {run if read_only == '.' else run / read_only} (",
            f"where the run writes {what}; make it writable",
            prefix=prefix,
        )
    finally:
        (run / read_only).chmod(0o755)


@pytest.mark.parametrize("error", [
    "torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 20.00 GiB')",
    "RuntimeError(\"[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
    "tried to allocate 160000000000 bytes. Error code 12 (Cannot allocate memory)\")",
])  # fmt: skip
def test_a_step_out_of_memory_names_the_options_that_size_it(tmp_path, small_corpus, small_tokenizer, monkeypatch,
                                                             error, capsys):  # fmt: skip
    """Not a traceback from deep in attention (--seq-len 100000 on the CPU: 160 GB for one layer's scores):
    exit 1, saying which options size a step."""
    import torch

    from training.pretraining.trainer import Trainer

    def out_of_memory(self):
        raise eval(error, {"torch": torch})

    monkeypatch.setattr(Trainer, "train_step", out_of_memory)
    with pytest.raises(SystemExit) as ended:
        pretrain(tiny(tmp_path / "run", small_corpus, small_tokenizer))
    said = str(ended.value.code)
    assert said.startswith("error: out of memory at step 1 (") and (
        "20.00 GiB" in said or "160000000000" in said
    )
    assert said.endswith("a micro-step takes --batch-size 8 rows of --seq-len 64 tokens on each process. Lower "
                         "--batch-size (a higher --grad-accum keeps the rows per optimizer step) or --seq-len")  # fmt: skip


@pytest.mark.slow
def test_a_run_started_with_relative_paths_resumes_from_any_directory(
    tmp_path, small_corpus, small_tokenizer
):
    (tmp_path / "here").mkdir()
    shutil.copy(small_corpus, tmp_path / "here" / "corpus.txt")
    shutil.copy(small_tokenizer, tmp_path / "here" / "tokenizer.json")
    args = [a for a in tiny("run", "corpus.txt", "tokenizer.json")]
    args[args.index("--max-steps") + 1] = "2"
    done = subprocess.run([sys.executable, "-m", "training.pretrain", *args], cwd=tmp_path / "here",
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    saved = json.loads((tmp_path / "here" / "run" / "config.json").read_text())
    assert saved["corpus"] == str(tmp_path / "here" / "corpus.txt")
    assert saved["tokenizer"] == str(tmp_path / "here" / "tokenizer.json")
    # From elsewhere, by the run alone; and with the corpus named again by its whole path.
    pretrain(["--out", str(tmp_path / "here" / "run"), "--resume", "--max-steps", "3"])
    pretrain(["--out", str(tmp_path / "here" / "run"), "--resume", "--max-steps", "4",
              "--corpus", str(tmp_path / "here" / "corpus.txt")])  # fmt: skip


def test_a_run_whose_corpus_is_gone_resumes_from_its_own_shards(tmp_path, small_corpus, small_tokenizer):
    """A resume trains on the run's data/ shards and never reads its corpus, yet one whose corpus file was
    deleted was refused: "neither a registry corpus ... nor a file or directory that exists". With the
    shards gone too, which would be made again from it, it says so."""
    corpus = tmp_path / "gone.txt"
    shutil.copy(small_corpus, corpus)
    run = tmp_path / "run"
    args = tiny(run, corpus, small_tokenizer)
    args[args.index("--max-steps") + 1] = "2"
    pretrain(args)
    corpus.unlink()
    pretrain(["--out", str(run), "--resume", "--max-steps", "3"])
    assert json.loads((run / "checkpoints" / "step-00000003" / "trainer_state.json").read_text())["step"] == 3
    shutil.rmtree(run / "data")
    refused(["--out", str(run), "--resume", "--max-steps", "4"], f"--corpus '{corpus}' does not exist",
            f"{run / 'data'} does not hold the run's shards", "restore the corpus")  # fmt: skip


def test_a_resume_given_its_corpus_by_another_path_is_the_same_run(
    tmp_path, monkeypatch, small_corpus, small_tokenizer
):
    """`--corpus ../corpus.txt` from a subdirectory names the file the run saved as D/corpus.txt, yet the
    two texts were compared and the resume refused as a change of corpus ("start a new run"). The run's
    config.json keeps its own spelling; another file is still refused."""
    (tmp_path / "sub").mkdir()
    shutil.copy(small_corpus, tmp_path / "corpus.txt")
    shutil.copy(small_corpus, tmp_path / "other.txt")
    monkeypatch.chdir(tmp_path)
    args = tiny("run", "corpus.txt", small_tokenizer)
    args[args.index("--max-steps") + 1] = "2"
    pretrain(args)
    monkeypatch.chdir(tmp_path / "sub")
    pretrain(["--out", "../run", "--resume", "--max-steps", "3", "--corpus", "../corpus.txt"])
    assert json.loads((tmp_path / "run" / "config.json").read_text())["corpus"] == str(
        tmp_path / "corpus.txt"
    )
    with pytest.raises(SystemExit) as stop:
        pretrain(["--out", "../run", "--resume", "--max-steps", "4", "--corpus", "../other.txt"])
    assert stop.value.code == 2


def test_a_resume_checks_flags_against_the_runs_settings_not_the_defaults(finished, tmp_path):
    """--valid-fraction was refused as a change to a registry corpus (the default's), not to the run's."""
    run = damaged_copy(finished, tmp_path, lambda run, d: None)
    says = refused(["--out", str(run), "--resume", "--valid-fraction", "0.5"], "--valid-fraction")
    assert "registry corpora" not in says


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--seed", "-1"], "--seed: must lie in [0, 2**63), got -1"),
        (["--seed", str(2**64)], "--seed: must lie in [0, 2**63)"),
        (["--max-steps", str(10**23)], "--max-steps: at most 99,999,999"),  # overflowed after tokenizing
        (["--disc-weight", "-1"], "--disc-weight: must not be negative"),
        (["--gen-weight", "-0.5"], "--gen-weight: must not be negative"),
        (["--disc-weight", "0"], "--objective mlm"),
        (["--init-lr", "1e-4"], "--init-lr: sets the learning rate of the tensors --init loads"),
        (["--keep-checkpoints", "-1"], "--keep-checkpoints: must not be negative (0 keeps them all)"),
    ],
)
def test_seeds_and_loss_weights_out_of_range_are_refused_before_any_work(tmp_path, small_corpus, small_tokenizer,
                                                                          flags, says):  # fmt: skip
    refused(tiny(tmp_path / "x", small_corpus, small_tokenizer, *flags), says)
    assert not (tmp_path / "x" / "data").exists()


def test_a_corpus_of_one_text_copied_is_named_as_such(tmp_path, small_tokenizer):
    copies = tmp_path / "copies.txt"
    copies.write_text("\n\n".join(["the cat sat on the mat and looked at the dog."] * 500) + "\n")
    refused(tiny(tmp_path / "x", copies, small_tokenizer), "all the same text")


def test_a_corpus_file_with_a_comma_in_its_name_is_refused_saying_commas_separate_corpora(
    tmp_path, small_corpus
):
    """It said "--corpus '/tmp/my': neither a registry corpus ... nor a file or directory that exists", of a
    file that exists, and nothing of the comma."""
    named = tmp_path / "my,corpus.txt"
    shutil.copy(small_corpus, named)
    with pytest.raises(options.ConfigError) as refused:
        options.resolve(PretrainConfig, ["--corpus", str(named)], env={})
    assert str(refused.value) == (
        f"--corpus {str(named)!r}: a comma separates corpora, and one of those it names, {str(tmp_path / 'my')!r}, "
        f"does not exist; the file {str(named)!r} cannot be named in --corpus: rename it without the comma, or "
        "give the directory it is in (each corpus file there is read)"
    )
    assert options.resolve(PretrainConfig, ["--corpus", str(tmp_path)], env={}).corpus == str(tmp_path)


def test_a_corpus_file_named_twice_is_refused_for_a_new_run_not_for_a_resume(tmp_path, small_corpus):
    """It was read twice, in silence. A run that trained so resumes as it trained."""
    twice = f"{tmp_path},{small_corpus},{small_corpus}"
    shutil.copy(small_corpus, tmp_path / "wiki.txt")
    with pytest.raises(options.ConfigError, match=re.escape(
            f"--corpus: {small_corpus} is named twice, so its documents would train twice as often as the "
            "others': name each once")):  # fmt: skip
        options.resolve(PretrainConfig, ["--corpus", twice], env={})
    assert options.resolve(PretrainConfig, ["--resume"], env={}, base={"corpus": twice}).corpus == twice


def test_a_quoted_number_in_a_config_file_is_refused(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('num_layers = "2"\n')
    refused(
        ["--config", str(config), "--out", str(tmp_path / "x")], "num_layers: expected int", "without quotes"
    )


def test_an_out_inside_the_corpus_directory_is_refused(tmp_path, small_corpus, small_tokenizer):
    """`--corpus DIR --out DIR/run` trained on the run's own tokenizer/vocab.txt (written before the corpus
    is read: it was the held-out document), and a second run failed on the first's metrics.jsonl."""
    corpus = tmp_path / "texts"
    corpus.mkdir()
    shutil.copy(small_corpus, corpus / "wiki.txt")
    for out in (corpus / "run", corpus):
        refused(tiny(out, corpus, small_tokenizer), f"--out: {out} is inside the corpus directory {corpus}",
                "give an --out outside it")  # fmt: skip
    assert [p.name for p in corpus.iterdir()] == ["wiki.txt"]  # nothing written there


def fill(disk: Path, leave: int) -> None:
    """Take every byte of `disk` but `leave`, as another writer would."""
    with open(disk / "filler", "wb", buffering=0) as f:  # unbuffered: nothing left to fail at close
        try:
            while True:
                f.write(b"\0" * 2**12)
        except OSError:
            pass
    with open(disk / "filler", "r+b") as f:
        f.truncate(max(0, (disk / "filler").stat().st_size - leave))


def test_a_full_disk_before_the_first_step_names_the_disk_and_leaves_no_temporaries(
    tmp_path, small_corpus, small_tokenizer
):
    """config.json or the tokenizer meeting a full disk said only "[Errno 28] No space left on device",
    and left tokenizer/.tokenizer.json.tmp behind."""
    from benchmarks.training_faults import tmpfs

    try:
        with tmpfs(tmp_path / "disk", 2**20) as disk:
            # A page (4 KB) for the lock file: config.json fails. Two more: config.json fits, the tokenizer
            # (about 20 KB) does not.
            for leave, run, holding in ((4, "a", ""), (12, "b", "/tokenizer")):
                fill(disk, leave * 2**10)
                with pytest.raises(SystemExit) as e:
                    pretrain(tiny(disk / run, small_corpus, small_tokenizer))
                said = str(e.value.code)
                assert (
                    f"no space left on the disk holding {disk / run}{holding} (mounted at {disk}: " in said
                ), said
                assert "free some space (or give another --out) and run the same command again" in said, said
                left = sorted(p.relative_to(disk).as_posix() for p in disk.rglob("*") if p.is_file())
                assert not [p for p in left if p.endswith(".tmp")], left
                (disk / "filler").unlink()
    except PermissionError as e:
        pytest.skip(str(e))


def test_a_resume_whose_data_is_made_again_from_an_edited_corpus_is_refused_until_it_is_restored(
    tmp_path, small_corpus, small_tokenizer
):
    """Its data/ deleted and the corpus edited, a resume rebuilt the shards and failed on their row count,
    and kept failing after the corpus was restored (the rebuilt shards stayed); an edit that kept the row
    count (here, the documents reordered) resumed in silence on other text. The checkpoint now records
    what identifies the rows, and a resume checks the rows it makes against it."""
    corpus = tmp_path / "texts.txt"
    original = small_corpus.read_bytes()
    corpus.write_bytes(original)
    run = tmp_path / "run"
    pretrain(tiny(run, corpus, small_tokenizer))
    state = json.loads((run / "checkpoints" / "step-00000004" / "trainer_state.json").read_text())
    assert (
        state["data"]["train"]["rows"]
        == json.loads((run / "data" / "train" / "meta.json").read_text())["rows"]
    )
    documents = original.decode().strip().split("\n\n")
    for edit in (original.decode().replace(" the ", " a "), "\n\n".join(reversed(documents)) + "\n"):
        shutil.rmtree(run / "data")
        corpus.write_text(edit)
        with pytest.raises(SystemExit) as e:
            pretrain(["--out", str(run), "--resume", "--max-steps", "6"])
        assert e.value.code == 2 and "--resume: the corpus changed since the run started" in str(e.value), (
            e.value
        )
        assert "Restore it as it was and resume again" in str(e.value)
        assert not (run / "data" / "train").exists()  # not left there as the run's
    corpus.write_bytes(original)  # restored (a new modification time: the text decides)
    pretrain(["--out", str(run), "--resume", "--max-steps", "6"])
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-00000006"


def test_a_second_config_file_is_refused_not_dropped(tmp_path):
    """argparse kept the last --config: `--config A --config B` ran without A's settings, and said nothing."""
    from training.finetuning.config import FinetuneConfig
    from training.pretraining.config import PretrainConfig

    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.write_text("num_layers = 3\n")
    b.write_text("hidden_size = 64\n")
    for cls in (PretrainConfig, FinetuneConfig):  # every entry point's --config is declared by options.parser
        with pytest.raises(
            options.ConfigError, match=f"--config given twice \\({a}, then {b}\\): give one file"
        ):
            options.resolve(cls, ["--config", str(a), f"--config={b}", "--out", str(tmp_path / "x")])
    refused(["--config", str(a), "--config", str(b), "--out", str(tmp_path / "x")], "--config given twice")


def test_a_vocabulary_smaller_than_asked_is_noted_once(tmp_path, capsys):
    """configs/tiny.toml on a small corpus said "training a 2000-token WordPiece vocabulary", printed and saved
    vocab_size = 2000, and only the as_run line showed that the model had far fewer tokens."""
    import random

    pick = random.Random(0).choice
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "big", "red", "house"]
    corpus = tmp_path / "few-words.txt"
    corpus.write_text("\n\n".join("\n".join(" ".join(pick(words) for _ in range(12)) + " ." for _ in range(8))
                                   for _ in range(60)) + "\n")  # fmt: skip
    pretrain(
        tiny(tmp_path / "run", corpus, "train", "--max-steps", "2", "--eval-every", "2", "--save-every", "2")
    )
    size = json.loads((tmp_path / "run" / "config.json").read_text())["as_run"]["vocab_size"]
    err = capsys.readouterr().err
    said = f"note: the trained vocabulary holds {size} tokens, fewer than --vocab-size 2000: the corpus has too few"
    assert size < 2000 and err.count(said) == 1, err[-3000:]


@pytest.mark.slow
def test_settings_that_run_but_not_as_named_are_noted(tmp_path, small_corpus, small_tokenizer, capsys):
    pretrain(tiny(tmp_path / "run", small_corpus, "train", "--vocab-size", "10", "--eval-batches", "500",
                  "--max-steps", "2", "--eval-every", "2", "--save-every", "2"))  # fmt: skip
    err = capsys.readouterr().err
    assert "--warmup-steps 10 is above --max-steps 2: the learning rate never reaches" in err
    assert "--eval-batches 500: the held-out data makes" in err
    assert "more than --vocab-size 10" in err
    # Each pass over the corpus has its bar, one after another: tokenizing sat at "0doc" through the
    # held-out split's hashing, and counting the vocabulary's words showed nothing.
    bars = [line.rsplit(": ", 1)[0] for line in err.splitlines() if re.search(r": \d+doc \[", line)]
    held_out = f"choosing held-out documents of {small_corpus.name}"
    assert [b for i, b in enumerate(bars) if bars[i - 1 : i] != [b]] == [
        held_out,
        "counting words for the vocabulary",
        held_out,
        "tokenizing train",
        held_out,
        "tokenizing valid",
    ], bars


def test_a_resume_that_changes_a_setting_names_it_as_a_key_and_a_flag(tmp_path):
    """A seq_len changed in a TOML file was called a flag: "--seq-len 64 then, 32 now"."""
    from training.pretraining.resume import check_resumable

    saved = options.as_dict(options.resolve(PretrainConfig, ["--seq-len", "64"], env={}))
    (tmp_path / "run.toml").write_text("seq_len = 32\n")
    now = options.as_dict(options.resolve(PretrainConfig, ["--config", str(tmp_path / "run.toml")], env={}))
    with pytest.raises(
        options.ConfigError, match=re.escape("these differ: seq_len (--seq-len) 64 then, 32 now.")
    ):
        check_resumable(saved, now)


def test_a_run_saved_before_a_recipe_check_resumes_as_it_trained():
    """The recipe checks judge a new run; a saved one that trained with --init-lr and no --init, or with
    --disc-weight 0, resumes (it could not otherwise: neither may change on a resume)."""
    import options
    from training.pretraining.config import PretrainConfig

    saved = {"init_lr": 1e-4, "disc_weight": 0.0}
    cfg = options.resolve(PretrainConfig, ["--resume"], env={}, base=saved)
    assert (cfg.init_lr, cfg.disc_weight) == (1e-4, 0.0)
    with pytest.raises(options.ConfigError, match="--disc-weight 0"):
        options.resolve(PretrainConfig, [], env={}, base=saved)


def test_a_path_through_a_link_and_up_keeps_naming_the_same_file(tmp_path, monkeypatch):
    from training.config import absolute_paths

    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "real" / "corpus.txt").write_text("text\n")
    (tmp_path / "link").symlink_to(tmp_path / "real" / "sub")
    monkeypatch.chdir(tmp_path)
    got = absolute_paths({"corpus": "wikitext2, link/../corpus.txt", "tokenizer": "~nosuchuser/t.json"})
    assert Path(got["corpus"].split(",")[1]).resolve() == (tmp_path / "real" / "corpus.txt").resolve()
    assert got["corpus"].startswith("wikitext2,") and got["tokenizer"] == "~nosuchuser/t.json"


@pytest.mark.parametrize("name", ["out", "corpus", "tokenizer", "init", "init_generator", "data_dir"])
def test_a_home_of_no_such_user_is_refused_naming_its_flag(name, monkeypatch, tmp_path):
    """`~nosuchuser/x` in a path option ended in pathlib's RuntimeError ("Could not determine home
    directory"), a traceback from wherever the path was first read; now a ConfigError naming the flag."""
    from training.config import check_data_dir
    from training.finetuning.config import FinetuneConfig

    monkeypatch.chdir(tmp_path)
    argv = ["--init", "base"] if name == "init_generator" else []
    flag = "--" + name.replace("_", "-")
    with pytest.raises(options.ConfigError, match=f"^{flag}.*no user 'nosuchuser'"):
        check_data_dir(options.resolve(PretrainConfig, [*argv, flag, "~nosuchuser/x"], env={}))
    with pytest.raises(options.ConfigError, match="^--train ~nosuchuser/t.csv: there is no user"):
        options.resolve(
            FinetuneConfig, ["--init", "base", "--train", "~nosuchuser/t.csv", "--out", "o"], env={}
        )


def test_a_data_dir_file_that_is_not_the_published_one_exits_2(tmp_path, registry_data, small_tokenizer):
    """A registry file in --data-dir whose sha256 is not the published one is an input to change (exit 2,
    as the README says of a data file); it exited 1, as a failure while running."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "wikitext2-train.raw.gz").write_bytes(
        (registry_data / "wikitext2-train.raw.gz").read_bytes() + b"x"
    )
    refused([*tiny(tmp_path / "run", "wikitext2", small_tokenizer), "--data-dir", str(data)],
            "wikitext2-train.raw.gz in", "expected", prefix=("env", f"ELECTRA_CACHE_DIR={tmp_path / 'cache'}"))  # fmt: skip


def test_an_empty_out_is_refused_not_trained_into_the_current_directory(
    tmp_path, small_corpus, small_tokenizer
):
    """`--out ""` was taken as the current directory, and a run trained there among the user's files."""
    refused(tiny("", small_corpus, small_tokenizer), "--out: must not be empty")
    with pytest.raises(options.ConfigError, match="--out: must not be empty"):
        options.resolve(PretrainConfig, ["--out", ""], env={})
    # So was an empty --tokenizer: the current directory's tokenizer.json, read in silence.
    with pytest.raises(options.ConfigError, match='--tokenizer: must not be empty; "train" trains one'):
        options.resolve(PretrainConfig, ["--out", str(tmp_path / "run"), "--tokenizer="], env={})


def test_a_nul_character_in_a_config_files_value_is_refused_naming_it(tmp_path):
    """Only a TOML or JSON file can carry one: a path holding it was a ValueError traceback."""
    (config := tmp_path / "n.toml").write_text('out = "x\\u0000y"\ncorpus = ["a", "b\\u0000"]\n')
    refused(["--config", str(config)], f"{config}: out: holds a NUL character")


def test_out_of_no_such_users_home_exits_2_without_a_traceback(tmp_path):
    refused(["--out", "~nosuchuser/run", "--max-steps", "1"], "--out ~nosuchuser/run: there is no user")


def test_file_options_are_made_absolute_beside_the_corpus(tmp_path, monkeypatch):
    from training.config import FINETUNE_PATHS, absolute_paths

    for name in ("tokenizer.json", "base", "train"):
        (tmp_path / name).touch()
    monkeypatch.chdir(tmp_path)
    got = absolute_paths({"corpus": "wikitext2", "tokenizer": "tokenizer.json", "init": "base"})
    assert got == {
        "corpus": "wikitext2",
        "tokenizer": str(tmp_path / "tokenizer.json"),
        "init": str(tmp_path / "base"),
    }
    assert absolute_paths({"tokenizer": "train"}) == {}  # a trained vocabulary, not a file named train
    assert absolute_paths({"train": "train"}, FINETUNE_PATHS) == {"train": str(tmp_path / "train")}


def test_the_resumed_run_is_the_last_out_given_in_either_spelling(tmp_path):
    from training.run_dir import resumed_settings

    for name in ("a", "b"):
        (tmp_path / name / "checkpoints").mkdir(parents=True)
        (tmp_path / name / "checkpoints" / "latest").write_text("step-00000001")
        (tmp_path / name / "config.json").write_text(json.dumps({"seed": ord(name)}))
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    assert resumed_settings(["--out", a, "--resume", f"--out={b}"]) == {"seed": ord("b")}
    assert resumed_settings([f"--out={a}", "--out", b, "--resume=true"]) == {"seed": ord("b")}
    assert resumed_settings(["--out", a]) is None


def test_out_is_kept_whole_and_a_resume_of_nothing_says_so(
    tmp_path, monkeypatch, small_corpus, small_tokenizer
):
    from training.pretraining.run_config import resolve_config

    monkeypatch.chdir(tmp_path)
    assert resolve_config(["--out", "runs/a"])[0].out == str(tmp_path / "runs" / "a")
    refused(
        tiny(tmp_path / "nowhere", small_corpus, small_tokenizer, "--resume"),
        "does not exist; give the --out",
    )


def test_a_resume_reads_metrics_as_the_uninterrupted_run_wrote_them(finished, tmp_path):
    """A last line cut short (a kill mid-row) ended a resume in a JSONDecodeError traceback; a line before
    it that is not JSON is named; the evaluation a --max-minutes cut added at a step where none was due
    stayed in the resumed run's metrics.jsonl, a row the uninterrupted run never wrote."""
    from training.report import MetricsError, MetricsLog, read_metrics

    run = damaged_copy(finished, tmp_path, lambda run, d: None)
    (run / "checkpoints" / "latest").write_text("step-00000002")  # as if killed after step 2's checkpoint
    whole = read_metrics(run / "metrics.jsonl")
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "spl')
    pretrain(["--out", str(run), "--resume"])
    resumed = read_metrics(run / "metrics.jsonl")
    assert [r for r in resumed if r["step"] <= 2] == [r for r in whole if r["step"] <= 2]
    assert [(r["step"], r["split"]) for r in resumed] == [(r["step"], r["split"]) for r in whole]
    rows = tmp_path / "metrics.jsonl"
    rows.write_text('{"step": 1, "split": "train"}\n{"step": 2, "split": "eval"}\n{"step": 2, "split": "train"}\n'
                    '{"step": 3, "split": "train"}\n{"step": 4, "spl')  # fmt: skip
    MetricsLog(rows, truncate_after=2, evaluated=False)  # a cut at step 2, where no evaluation was due
    assert [(r["step"], r["split"]) for r in read_metrics(rows)] == [(1, "train"), (2, "train")]
    rows.write_text('{"step": 1, "split": "train"}\n{"st\n{"step": 2, "split": "train"}\n')
    with pytest.raises(MetricsError, match="line 2 of .* is not JSON"):
        MetricsLog(rows, truncate_after=2)


def test_a_resume_with_another_eval_every_keeps_the_checkpoints_evaluation(finished, tmp_path):
    """Whether the checkpoint's step had been evaluated was decided by the --eval-every given now: a resume
    from step 4 (evaluated, --eval-every 4) with --eval-every 3 dropped that evaluation's row."""
    from training.report import read_metrics

    run = damaged_copy(finished, tmp_path, lambda run, d: None)
    pretrain(["--out", str(run), "--resume", "--max-steps", "7", "--eval-every", "3"])
    rows = [(r["step"], r["split"]) for r in read_metrics(run / "metrics.jsonl")]
    assert (4, "eval") in rows and (6, "eval") in rows and (7, "eval") in rows, rows


def test_a_plot_that_cannot_be_written_leaves_the_finished_run_finished(finished, tmp_path, capsys):
    """curves.png on a full disk once failed a run whose last checkpoint was saved: exit 1, "stopped", and a
    --resume that failed the same way."""
    from training.report import plot_curves

    (tmp_path / "file").write_text("")
    plot_curves(finished / "metrics.jsonl", tmp_path / "file" / "curves.png")  # its directory is a file
    said = capsys.readouterr().out
    assert "curves.png not drawn (" in said and "the figures are all in metrics.jsonl" in said, said


@pytest.mark.slow
def test_the_saved_config_says_what_ran_and_options_that_change_nothing_are_noted(
    tmp_path, small_corpus, small_tokenizer, capsys
):
    """config.json once said device auto, bf16 true on a CPU without it, lowercase false for a tokenizer that
    lowercases, and nothing of the generator an --init run trained; options with no effect (request-row
    shares on packed rows) went unsaid, then refused the run's resume."""
    run = tmp_path / "run"
    pretrain(tiny(run, small_corpus, small_tokenizer, "--max-steps", "2", "--sentence-rows", "0.6",
                  "--lowercase", "false", "--word-swap-kinds", "pos"))  # fmt: skip
    err = capsys.readouterr().err
    assert "--sentence-rows sets sentence_rows 0.6, which changes nothing: it shapes request rows" in err
    assert "--word-swap-kinds sets word_swap_kinds 'pos', which changes nothing: --word-swap-prob is 0" in err
    assert (
        f"--lowercase sets lowercase false, which is not used: the tokenizer {small_tokenizer} lowercases"
        in err
    )
    saved = json.loads((run / "config.json").read_text())
    assert saved["lowercase"] is True and saved["vocab_size"] == 1000
    ran = saved["as_run"]
    assert ran["device"] == "cpu" and ran["threads"] == 1 and ran["step"] == "eager" and not ran["tf32"]
    assert ran["generator"] == {"from": "fresh", "hidden_size": 32, "num_layers": 2, "num_heads": 1}
    assert ran["max_predictions_per_micro_batch"] > 0
    state = json.loads((run / "checkpoints" / "step-00000002" / "trainer_state.json").read_text())
    assert state["as_run"] == ran  # a bundle's manifest takes it from here

    # As the previous version saved it (the options' values, not the tokenizer's): a resume puts it right.
    (run / "config.json").write_text(json.dumps({**saved, "lowercase": False, "vocab_size": 2000}))
    pretrain(["--out", str(run), "--resume", "--max-steps", "3", "--sentence-rows", "0.4"])  # nothing changed
    resumed = json.loads((run / "config.json").read_text())
    assert resumed["as_run"] == ran  # 2 steps of tiny's 10 of warm-up: --max-steps 3 changed no rate
    assert resumed["lowercase"] is True and resumed["vocab_size"] == 1000

    # The generator comes with --init RUN: --generator-fraction cannot size it.
    with pytest.raises(SystemExit, match=r"--generator-fraction sets generator_fraction 1.0, and the generator "
                                         r"comes with --init .*: hidden 32, 2 layers\): drop --generator-fra"):  # fmt: skip
        pretrain(["--init", str(run), "--out", str(tmp_path / "warm"), "--corpus", str(small_corpus),
                  "--generator-fraction", "1.0", "--max-steps", "2"])  # fmt: skip
    # Its config.json, replayed, holds generator_fraction as every saved config does (the default, unused):
    # the replay noted "config.json sets generator_fraction 0.25", a value the user never set.
    pretrain(
        [
            "--init",
            str(run),
            "--out",
            str(tmp_path / "warm"),
            "--corpus",
            str(small_corpus),
            "--max-steps",
            "1",
        ]
    )
    capsys.readouterr()
    pretrain(["--config", str(tmp_path / "warm" / "config.json"), "--out", str(tmp_path / "again")])
    assert "generator_fraction" not in capsys.readouterr().err


def test_progress_in_a_log_file_is_lines_not_redraws(capsys):
    """Written to a file, each tqdm redraw was a carriage return and the bar again: hundreds of KB a run."""
    from training.progress import progress_bar

    with progress_bar(total=5000, desc="pretrain") as bar:
        for _ in range(5000):
            bar.update(1)
            bar.set_postfix(loss="1.0", refresh=False)
    err = capsys.readouterr().err
    assert "\r" not in err, err[:500]
    lines = err.splitlines()
    assert 1 <= len(lines) <= 3 and "5000/5000" in lines[-1], lines


def test_sigterm_before_training_stops_as_ctrl_c_does(tmp_path, monkeypatch, capsys):
    """SIGTERM while the corpus is read (a scheduler's stop) ended the process where it stood: exit 143, no
    word, its temporaries left behind. Now Ctrl-C's message and exit, and the caller's handlers back after."""
    import signal
    import time

    import training.pretraining.loop as loop

    def reading(argv):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises here

    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(loop, "run", reading)
    with pytest.raises(SystemExit) as stop:
        pretrain(["--out", str(tmp_path / "run"), "--corpus", "wikitext2"])
    assert stop.value.code == 128 + signal.SIGTERM
    assert (
        "stopped at once; no checkpoint was saved; the same command starts again" in capsys.readouterr().err
    )
    assert signal.getsignal(signal.SIGTERM) == before


def test_pretraining_called_from_another_thread_runs(tmp_path):
    """Signal handlers can only be set from the main thread: the SIGTERM handler of the set-up made every
    call from another (a notebook's worker, a test runner's) fail before it began."""
    import threading

    errors = []

    def call():
        try:
            pretrain(["--out", str(tmp_path / "run"), "--corpus", "wikitext2", "--resume"])
        except SystemExit as e:  # the run's own refusal (nothing to resume), past the set-up's handlers
            errors.append(str(e))
        except BaseException as e:
            errors.append(f"{type(e).__name__}: {e}")

    thread = threading.Thread(target=call)
    thread.start()
    thread.join(60)
    assert errors and "does not exist; give the --out of the run to go on" in errors[0], errors


@pytest.mark.slow
def test_an_init_directorys_unk_warning_names_its_tokenizer_config_and_following_it_ends_the_warning(
    tmp_path, small_corpus, small_tokenizer, capsys
):
    """A Hugging Face directory whose tokenizer_config.json says do_lower_case false over an uncased
    vocabulary was told "give --lowercase true"; given it, the run noted that --lowercase is not used there
    and warned again, the same advice. It is told to set do_lower_case in that file, which ends it."""
    from tests.helpers_models import save_detector

    init = save_detector(tmp_path / "hf", small_tokenizer.parent)
    config = init / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "do_lower_case": False}))
    argv = ["--config", str(REPO / "configs" / "tiny.toml"), "--init", str(init), "--corpus", str(small_corpus),
            "--threads", "1", "--max-steps", "2", "--save-every", "2", "--eval-every", "2"]  # fmt: skip
    pretrain([*argv, "--out", str(tmp_path / "cased")])
    err = capsys.readouterr().err
    assert "of the training text's tokens are [UNK]" in err, err[-3000:]
    assert f'the tokenizer keeps case but the vocabulary has no capital letters (an uncased one, such as bert-base-uncased): set "do_lower_case": true in {config}\n' in err  # fmt: skip
    assert "--lowercase" not in err
    pretrain([*argv, "--out", str(tmp_path / "given"), "--lowercase", "true"])  # what it used to say
    assert f'keeps case as "do_lower_case" in {config} says' in capsys.readouterr().err
    config.write_text(json.dumps({**json.loads(config.read_text()), "do_lower_case": True}))  # as it says
    pretrain([*argv, "--out", str(tmp_path / "lowercased")])
    assert "are [UNK]" not in capsys.readouterr().err


@pytest.mark.slow
def test_a_resume_says_when_its_corpus_changed_and_keeps_training_on_its_stored_shards(
    tmp_path, small_corpus, small_tokenizer, capsys
):
    """README said a change to a resumed run's data is refused, yet a corpus edited since the start was
    passed over in silence: the run went on with its data/ shards (right for an exact resume). It says so
    now, in a line, and which way trains on the edit; a run whose shards predate the record says nothing."""
    corpus = tmp_path / "texts.txt"
    shutil.copy(small_corpus, corpus)
    run = tmp_path / "run"
    args = tiny(run, corpus, small_tokenizer)
    args[args.index("--max-steps") + 1] = "2"
    pretrain(args)
    meta = (run / "data" / "train" / "meta.json").read_text()
    said = "note: --resume: the corpus files"
    pretrain(["--out", str(run), "--resume", "--max-steps", "3"])
    assert said not in capsys.readouterr().err
    corpus.write_text(corpus.read_text() + "\n\nA document written after the run started.\n")
    pretrain(["--out", str(run), "--resume", "--max-steps", "4"])
    err = capsys.readouterr().err
    line = next((s for s in err.splitlines() if s.startswith(said)), err[-3000:])
    assert line == (f"{said} ({corpus}) changed since the run built its shards (other files, or a size or "
                    f"modification time differs); the run keeps training on its stored shards ({run / 'data'}), "
                    "as it started: to train on the changed corpus, start a new run with another --out")  # fmt: skip
    assert (run / "data" / "train" / "meta.json").read_text() == meta
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-00000004"
    for split in ("train", "valid"):  # shards built before they recorded their source
        path = run / "data" / split / "meta.json"
        path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "source"}))
    pretrain(["--out", str(run), "--resume", "--max-steps", "5"])
    assert said not in capsys.readouterr().err
