"""python -m training.handoff on tiny models (a discriminator, an MLM run's model): the limits a GPU call's
return sets are kept (a tensor larger than a shard is split by rows, each header entry counted), and what
comes back is the packed weights exactly, with the rounding that packing did said."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers_models import save_classifier, save_detector, save_mlm_run, train_tokenizer
from training.checkpoint import load_model
from training.handoff import HEADER_ROOM, main

REPO = Path(__file__).resolve().parent.parent

WORDS = "electra.embeddings.word_embeddings.weight"
QUERY, KEY = (f"electra.encoder.layer.0.attention.self.{n}.weight" for n in ("query", "key"))


def swap_parts(a: str, b: str):
    """An edit of handoff.json: tensors `a` and `b` (of one shape) read from each other's keys."""

    def edit(index: dict, _) -> None:
        t = index["tensors"]
        t[a]["parts"], t[b]["parts"] = t[b]["parts"], t[a]["parts"]

    return edit


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    tok = train_tokenizer(tmp_path_factory.mktemp("tok"))
    return save_detector(tmp_path_factory.mktemp("det") / "detector", tok, with_generator=True)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_small_shards_come_back_as_the_packed_weights(detector, tmp_path, capsys, dtype):
    limit_mib = 0.05  # the word embeddings (1000 x 32 in fp16: 62.5 KiB) cannot fit one shard whole
    assert main(["pack", str(detector), "--out", str(tmp_path / "p"), "--dtype", dtype,
                 "--max-shard-mib", str(limit_mib), "--max-files", "8"]) == 0  # fmt: skip
    index = json.loads((tmp_path / "p" / "handoff.json").read_text())
    assert all(s["bytes"] <= limit_mib * 2**20 for s in index["shards"]) and len(index["shards"]) > 1
    assert len(index["tensors"]["electra.embeddings.word_embeddings.weight"]["parts"]) > 1
    packed = capsys.readouterr().out
    assert main(["unpack", str(tmp_path / "p"), "--out", str(tmp_path / "run")]) == 0
    unpacked = capsys.readouterr().out
    original, _, _ = load_model(detector)
    back, _, _ = load_model(tmp_path / "run")
    cast = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    for name, t in original.state_dict().items():
        assert torch.equal(back.state_dict()[name], t.to(cast).float()), name
    # The rounding, said and kept: it was only "(fp16)", and the docstring read as lossless.
    changes = {name: float((t.to(cast).float() - t).abs().max()) for name, t in original.state_dict().items()}
    largest = max(changes, key=changes.get)
    assert (
        index["rounding"]["max_abs"] == changes[largest] > 0
        and index["rounding"]["max_abs_tensor"] == largest
    )
    said = f"rounding to {dtype}: the weights changed by at most {changes[largest]:.2g} ({largest})"
    assert said in packed and f"as packed: {said}" in unpacked, (packed, unpacked)
    # Carried, so that transformers reads the unpacked checkpoint's tokenizer as the run did.
    (step,) = (tmp_path / "run" / "checkpoints").glob("step-*")
    assert (step / "tokenizer_config.json").read_text() == (detector / "tokenizer_config.json").read_text()
    assert (detector / "generator").is_dir() and not list(
        (tmp_path / "run").rglob("generator")
    )  # left behind


def test_too_many_files_and_a_tensor_beyond_fp16_are_refused(detector, tmp_path, capsys):
    assert main(["pack", str(detector), "--out", str(tmp_path / "a"), "--max-shard-mib", "0.1",
                 "--max-files", "2"]) == 2  # fmt: skip
    err = capsys.readouterr().err  # and what to pass instead
    assert "exceed --max-files 2; pass --max-files " in err and "or a larger --max-shard-mib" in err, err
    enough = err.split("pass --max-files ")[1].split(",")[0]
    assert main(["pack", str(detector), "--out", str(tmp_path / "a"), "--max-shard-mib", "0.1",
                 "--max-files", enough]) == 0  # fmt: skip
    assert len(list((tmp_path / "a").iterdir())) == int(enough)
    big = tmp_path / "big"
    big.mkdir()
    for f in detector.iterdir():
        if f.is_file():
            (big / f.name).write_bytes(f.read_bytes())
    from safetensors.torch import load_file, save_file

    weights = load_file(big / "model.safetensors")
    weights["discriminator_predictions.dense.bias"][0] = 1e6
    save_file(weights, big / "model.safetensors")
    assert main(["pack", str(big), "--out", str(tmp_path / "b")]) == 2
    assert "discriminator_predictions.dense.bias holds values beyond fp16's range" in capsys.readouterr().err
    assert HEADER_ROOM < 0.1 * 2**20


def test_a_shard_of_many_small_tensors_keeps_within_the_limit_with_its_header(detector, tmp_path, capsys):
    """A fixed 64 KiB was kept for each shard's header: 120 layers of small tensors (names of 50 characters,
    an entry of about 150 bytes each, 2,000 of them) overran it, and pack ended in an AssertionError
    traceback. Each tensor's entry is counted now, as its bytes are."""
    tok = detector  # its tokenizer files
    det = save_detector(tmp_path / "det", tok, hidden_size=16, num_attention_heads=1, intermediate_size=16,
                        embedding_size=16, num_hidden_layers=120)  # fmt: skip
    limit_mib = 0.5  # the index of 2,000 tensors takes 0.3 MiB of handoff.json
    assert main(["pack", str(det), "--out", str(tmp_path / "p"), "--max-shard-mib", str(limit_mib),
                 "--max-files", "8"]) == 0  # fmt: skip
    shards = list((tmp_path / "p").glob("*.safetensors"))
    assert len(shards) > 1 and all(f.stat().st_size <= limit_mib * 2**20 for f in shards)
    assert main(["unpack", str(tmp_path / "p"), "--out", str(tmp_path / "run")]) == 0
    original, _, _ = load_model(det)
    back = load_model(tmp_path / "run")[0].state_dict()
    for name, t in original.state_dict().items():
        assert torch.equal(back[name], t.half().float()), name
    # A shard too small for one row of a tensor and its entry: said, with what to pass.
    capsys.readouterr()
    assert main(["pack", str(det), "--out", str(tmp_path / "q"), "--max-shard-mib", "0.004"]) == 2
    err = capsys.readouterr().err
    assert ": one row of it is" in err and "pass a larger --max-shard-mib" in err, err
    # At 0.1 MiB, as found: the list of its 2,000 tensors outgrows handoff.json, and says so.
    assert (
        main(["pack", str(det), "--out", str(tmp_path / "q"), "--max-shard-mib", "0.1", "--max-files", "64"])
        == 2
    )
    err = capsys.readouterr().err
    assert "over --max-shard-mib 0.1 (its list of 1929 tensors: 0.40 MiB" in err, err


def test_weights_not_finite_are_refused_and_values_that_become_0_are_counted(detector, tmp_path, capsys):
    """NaN and infinity packed and unpacked without a word (only overflow was checked), and a value that
    fp16 flushes to 0 was not counted anywhere."""
    from safetensors.torch import load_file, save_file

    run = tmp_path / "run"
    shutil.copytree(detector, run, ignore=shutil.ignore_patterns("generator"))
    weights = load_file(detector / "model.safetensors")
    name = "electra.encoder.layer.1.output.dense.bias"
    for bad in (float("nan"), float("inf")):
        weights[name][3] = bad
        save_file(weights, run / "model.safetensors")
        capsys.readouterr()
        assert main(["pack", str(run), "--out", str(tmp_path / "p")]) == 2
        err = capsys.readouterr().err
        assert (
            f"{name} holds 1 of 64 values that are not finite (NaN or infinity): the run diverged" in err
        ), err
        assert not (tmp_path / "p").exists()
    weights[name][3] = 1e-9  # under fp16's smallest (6e-8): 0
    weights[name][4] = 0.0  # 0 already: not counted
    save_file(weights, run / "model.safetensors")
    assert main(["pack", str(run), "--out", str(tmp_path / "p")]) == 0
    rounding = json.loads((tmp_path / "p" / "handoff.json").read_text())["rounding"]
    assert (
        rounding["to_zero"] >= 1 and 0 < rounding["max_rel"] < 1
    )  # relative: of the values that stay nonzero
    nonzero = sum(int((t != 0).sum()) for t in weights.values() if t.is_floating_point())
    assert rounding["nonzero"] == nonzero
    zeroed = sum(int(((t != 0) & (t.half() == 0)).sum()) for t in weights.values() if t.is_floating_point())
    assert (
        rounding["to_zero"] == zeroed
        and f"{zeroed:,} of {nonzero:,} nonzero values became 0" in capsys.readouterr().out
    )


def test_a_full_disk_is_named_and_leaves_nothing_half_written(detector, tmp_path, capsys):
    from benchmarks.training_faults import tmpfs

    packed = tmp_path / "p"
    assert main(["pack", str(detector), "--out", str(packed)]) == 0
    weights = sum(f.stat().st_size for f in packed.glob("*.safetensors"))
    try:
        with tmpfs(tmp_path / "small-disk", 64 * 1024) as disk:  # under the fp16 shards and the fp32 run
            assert weights > 64 * 1024
            capsys.readouterr()
            for argv in (["pack", str(detector), "--out", str(disk / "p")],
                         ["unpack", str(packed), "--out", str(disk / "run")]):  # fmt: skip
                assert main(argv) == 1, argv
                err = capsys.readouterr().err
                assert f"no space left on the disk holding {disk} (mounted at {disk}" in err, err
                assert "Traceback" not in err
                assert list(disk.iterdir()) == [], argv  # no half a pack, no half a run
            (disk / "lost+found").mkdir()  # as a volume's root holds: said a mount point, not "not empty"
            for argv in (["pack", str(detector), "--out", str(disk)],  # the mount point itself
                         ["unpack", str(packed), "--out", str(disk)]):  # fmt: skip
                assert main(argv) == 2, argv
                assert f"--out {disk} is a mount point, which cannot be replaced" in capsys.readouterr().err
    except PermissionError as e:
        pytest.skip(str(e))


def carried(name: str, text: str):
    """An edit of handoff.json: the file `name` carried with `text`, and the sha256 edited with it."""
    digest = hashlib.sha256(text.encode(errors="surrogatepass")).hexdigest()
    return lambda i, _: i["files"].update({name: {"text": text, "sha256": digest}})


def swap_shard(index: dict, packed) -> None:
    """The first shard's bytes swapped for others, and handoff.json's sha256 edited with them."""
    shard = packed / index["shards"][0]["file"]
    shard.write_bytes(b"not a safetensors file")
    index["shards"][0]["sha256"] = hashlib.sha256(shard.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    "edit, said",
    [
        # A name joined to the run: it wrote /tmp/escaped.txt, outside --out.
        (carried("run/../../escaped.txt", "x"), "holds 'run/../../escaped.txt', which pack does not carry"),
        (lambda i, _: i.pop("shards"), '"shards" is not a list'),  # KeyError: 'shards'
        (lambda i, _: i["shards"][0].update(file="/etc/hostname"), '"shards" is not a list'),  # read as a shard
        (lambda i, _: i.pop("dtype"), "dtype None"),  # KeyError after the run was written
        (lambda i, _: i["tensors"][WORDS].update(parts=[]), f"tensor {WORDS}: not"),  # torch.cat([]) ValueError
        (lambda i, _: i["tensors"][WORDS].update(parts=[[i["shards"][0]["file"], "nokey"]]),
         f"tensor {WORDS}: its parts are read from the keys ['nokey'], not its own"),  # SafetensorError
        (lambda i, _: i["files"].pop("checkpoint/tokenizer.json"), '"files" lacks checkpoint/tokenizer.json'),
        (carried("checkpoint/trainer_state.json", "[]"), "checkpoint/trainer_state.json has no step"),  # AttributeError
        (carried("checkpoint/trainer_state.json", '{"step": Infinity}'), "has no step, a whole number from 0 (step inf)"),  # OverflowError
        (carried("checkpoint/trainer_state.json", "{}"), "has no step, a whole number from 0 (step None)"),  # unpacked as step 0
        (carried("checkpoint/trainer_state.json", '{"step": -1}'), "has no step, a whole number from 0 (step -1)"),  # step--0000001
        (carried("checkpoint/vocab.txt", "[PAD]\ud800"), """UTF-8 cannot encode (after ' "checkpoint/vocab.txt": {"text": "[PAD]')"""),  # UnicodeEncodeError
        (lambda i, _: i.update(rounding={"max_abs": "big"}), '"rounding" is not'),  # said by unpack: a TypeError
        (swap_shard, "does not read as safetensors"),  # SafetensorError
        # The shards' sha256 all match: it unpacked, exit 0, with the query's weights where the key's belong.
        (swap_parts(QUERY, KEY), f"tensor {KEY}: its parts are read from the keys ['{QUERY}'], not its own"),
        (lambda i, _: i["tensors"][WORDS].update(parts=[[i["shards"][0]["file"], WORDS]] * 2),
         f"tensor {WORDS}: its parts are read from the keys ['{WORDS}', '{WORDS}'], not its own ['{WORDS}#0'"),
        (lambda i, _: i["tensors"].pop(WORDS), "do not make the model its config.json describes"),  # a temp dir named
    ],
)  # fmt: skip
def test_a_handoff_json_edited_by_hand_is_refused_naming_the_field(detector, tmp_path, capsys, edit, said):
    """Every field of handoff.json was trusted: a file name with ../ in it was written outside --out, and a
    missing or mistyped field ended in a traceback (one of them after the run was written)."""
    packed = tmp_path / "deep" / "p"
    assert main(["pack", str(detector), "--out", str(packed)]) == 0
    index = json.loads((packed / "handoff.json").read_text())
    edit(index, packed)
    (packed / "handoff.json").write_text(json.dumps(index))
    capsys.readouterr()
    out = tmp_path / "deep" / "run"
    assert main(["unpack", str(packed), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert said in err and "copy handoff.json again" in err and "Traceback" not in err, err
    assert sorted(p.name for p in (tmp_path / "deep").iterdir()) == ["p"]  # no run, no temporary
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep"]  # nothing escaped


def test_a_part_said_to_be_in_another_shard_is_refused(detector, tmp_path, capsys):
    """Its key is the tensor's own (the check above passes it): the shard named does not hold it."""
    packed = tmp_path / "p"
    assert (
        main(["pack", str(detector), "--out", str(packed), "--max-shard-mib", "0.1", "--max-files", "8"]) == 0
    )
    index = json.loads((packed / "handoff.json").read_text())
    part = index["tensors"][WORDS]["parts"][0]
    part[0] = next(s["file"] for s in index["shards"] if s["file"] != part[0])
    (packed / "handoff.json").write_text(json.dumps(index))
    capsys.readouterr()
    assert main(["unpack", str(packed), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"{WORDS}: its parts in handoff.json do not read from the shards" in err, err
    assert "copy handoff.json again" in err and not (tmp_path / "run").exists()


def test_an_out_that_cannot_be_written_or_must_not_be_replaced_is_refused(detector, tmp_path, capsys):
    """A file as --out (or on its way) gave a NotADirectoryError traceback; unpack --force took the handoff's
    own directory, or the run it was packed from (optimizer, generator, data), and replaced it whole."""
    packed, run = tmp_path / "p", tmp_path / "run"
    assert main(["pack", str(detector), "--out", str(packed)]) == 0
    (tmp_path / "file").write_text("mine")
    for argv, said in [
        (["pack", str(detector), "--out", str(tmp_path / "file")], "is a file, not a directory"),
        (["unpack", str(packed), "--out", str(tmp_path / "file" / "run")], "is a file, not a directory"),
        (["unpack", str(packed), "--out", str(packed), "--force"], "holds the handoff being unpacked"),
        (["unpack", str(packed), "--out", str(tmp_path), "--force"], "holds the handoff being unpacked"),
        (["unpack", str(packed), "--out", str(detector), "--force"], "and no unpacked run (no handoff.json)"),
    ]:
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, err
    assert (packed / "handoff.json").is_file() and (detector / "generator").is_dir()
    assert main(["unpack", str(packed), "--out", str(run)]) == 0
    assert main(["unpack", str(packed), "--out", str(run), "--force"]) == 0  # an earlier unpack: replaced
    (run / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert main(["unpack", str(packed), "--out", str(run), "--force"]) == 2
    assert "holds notes.txt besides the unpacked run's own files" in capsys.readouterr().err
    assert (run / "notes.txt").read_text() == "mine"


def test_a_fine_tuned_classifier_is_refused_saying_what_to_do_instead(tmp_path, capsys):
    """It said "a ElectraForSequenceClassification; pack carries a discriminator" and exit 1: not what to do."""
    tok = train_tokenizer(tmp_path / "tok")
    classifier = save_classifier(tmp_path / "cls", tok)
    assert main(["pack", str(classifier), "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert "config.json says ElectraForSequenceClassification" in err and "finetune --init" in err, err
    assert not (tmp_path / "p").exists()


def test_an_mlm_run_packs_and_unpacks_into_a_run_fine_tuning_takes(detector, tmp_path, capsys):
    """An --objective mlm run (ElectraForMaskedLM) was refused, "give the run python -m training.pretrain
    wrote", which it was: the baseline of benchmarks/quality/electra_vs_mlm.py could not be brought home,
    though finetune --init takes it. An ELECTRA run's generator/ alone is still refused, saying what to pack."""
    from export.onnx import check_exportable
    from training.checkpoint import CheckpointError
    from training.pretraining.warmstart import resolve_source

    tok = detector  # its tokenizer files
    mlm = save_mlm_run(tmp_path / "mlm", tok)
    assert main(["pack", str(mlm), "--out", str(tmp_path / "p")]) == 0
    assert sorted(f.name for f in (tmp_path / "p").iterdir()) == [
        "handoff.json",
        "mlm-00001-of-00001.safetensors",
    ]
    assert main(["unpack", str(tmp_path / "p"), "--out", str(tmp_path / "run")]) == 0
    original, _, _ = load_model(mlm)
    back, _, ckpt = load_model(tmp_path / "run")
    assert type(back) is type(original) and ckpt.name == "step-00000003"
    for name, t in original.state_dict().items():  # the tied output layer too: tied again on load
        assert torch.equal(back.state_dict()[name], t.half().float()), name
    # What python -m training.finetune --init and python -m training.pretrain --init read first.
    classifier, _, _ = load_model(
        tmp_path / "run", "ElectraForSequenceClassification", num_labels=2, fresh_head=True
    )
    encoder = {k: v for k, v in classifier.state_dict().items() if k.startswith("electra.")}
    assert encoder and all(torch.equal(v, back.state_dict()[k]) for k, v in encoder.items())
    assert resolve_source(str(tmp_path / "run")).architecture == "ElectraForMaskedLM"
    with pytest.raises(CheckpointError, match="is an MLM run .* it trains no discriminator"):
        check_exportable(ckpt)  # as for the run it came from

    electra = save_detector(tmp_path / "det", tok, with_generator=True)
    capsys.readouterr()
    assert main(["pack", str(electra / "generator"), "--out", str(tmp_path / "g")]) == 2
    err = capsys.readouterr().err
    assert (
        "is the generator of an ELECTRA run's checkpoint" in err
        and f"pack the checkpoint above it, {electra}" in err
    )
    assert not (tmp_path / "g").exists()


def _wait_until_stopped(proc) -> None:
    """Until SIGSTOP has taken hold. kill() returns before it has: a process inside a system call (pack's
    fsync) stops only on its way out of it, so what the test saw on disk could be older than where it
    stopped. Linux's /proc/PID/stat: the state after the name, T once stopped."""
    stat = Path(f"/proc/{proc.pid}/stat")
    deadline = time.monotonic() + 30
    while proc.poll() is None and time.monotonic() < deadline:
        if stat.read_text().rpartition(")")[2].split()[0] == "T":
            return
        time.sleep(0.001)


def test_sigterm_mid_pack_leaves_nothing_beside_out(tmp_path):
    """SIGTERM (a GPU call's time running out) ended pack where it stood: a hidden directory of half the
    shards stayed beside --out. Now it stops as Ctrl-C does, removing it, and says so."""
    import signal
    import subprocess
    import sys

    tok = train_tokenizer(tmp_path / "tok")
    src = save_detector(tmp_path / "det", tok, hidden_size=256, intermediate_size=1024, num_hidden_layers=4)
    parent = tmp_path / "home"
    for _ in range(5):  # until the signal is seen to land mid-write (the write takes a tenth of a second)
        parent.mkdir()
        cmd = [sys.executable, "-m", "training.handoff", "pack", str(src), "--out", str(parent / "p"),
               "--max-shard-mib", "0.1", "--max-files", "1000"]  # fmt: skip
        proc = subprocess.Popen(cmd, cwd=Path(__file__).parents[1], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        while proc.poll() is None and not any(parent.iterdir()):
            time.sleep(0.001)
        proc.send_signal(signal.SIGSTOP)  # held where it is, to look
        _wait_until_stopped(proc)
        midway = any(parent.iterdir()) and not (parent / "p").exists()
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGCONT)
        err = proc.communicate(timeout=120)[1]
        # Exit 0: Python ran its handler only after the with-block had put the default back, the pack whole
        # by then (a loaded machine, once); that stop landed too late to show anything: try again.
        if midway and proc.returncode != 0:
            break
        shutil.rmtree(parent)
    else:
        pytest.fail("the signal never landed while the shards were written")
    seen = f"exit {proc.returncode}, {sorted(p.name for p in parent.iterdir())}, stderr: {err!r}"
    assert proc.returncode == 128 + signal.SIGTERM, seen
    assert f"stopped by SIGTERM: nothing was written at --out {parent / 'p'}" in err, seen
    assert list(parent.iterdir()) == []


@pytest.mark.slow
def test_a_run_still_training_packs_from_whole_checkpoints(tmp_path, small_corpus, small_tokenizer, capsys):
    """Packed while pretraining saved every step and kept one: the checkpoint latest named was removed
    while pack read it, and pack said it "has no tokenizer.json" (4 packs in 150). Now it reads the newer
    one, and every pack is of one whole checkpoint."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    repo = Path(__file__).parents[1]
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "training.pretrain", "--config", str(repo / "configs" / "tiny.toml"), "--out",
           str(run), "--corpus", str(small_corpus), "--tokenizer", str(small_tokenizer), "--threads", "1",
           "--max-steps", "100000", "--save-every", "1", "--keep-checkpoints", "1", "--eval-every", "100000",
           "--log-every", "1"]  # fmt: skip
    # Its log into a file: a pipe nobody reads until the end fills (64 KiB of progress bars) and stalls training.
    log = tmp_path / "pretrain.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, cwd=repo, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.time() + 120
        while (
            not (run / "checkpoints" / "latest").is_file() and proc.poll() is None and time.time() < deadline
        ):
            time.sleep(0.05)
        assert proc.poll() is None, log.read_text()[-2000:]
        steps = set()
        for n in range(300):
            out = tmp_path / f"p{n}"
            assert main(["pack", str(run), "--out", str(out)]) == 0, capsys.readouterr().err
            index = json.loads((out / "handoff.json").read_text())
            state = json.loads(index["files"]["checkpoint/trainer_state.json"]["text"])
            assert index["source"].endswith(f"step-{state['step']:08d}")  # one checkpoint's files
            assert index["files"]["run/metrics.jsonl"]["text"].endswith("\n")  # whole lines
            steps.add(state["step"])
            shutil.rmtree(out)
        assert len(steps) > 10  # packed across many saves
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)


def test_a_long_runs_metrics_are_carried_from_their_end_within_a_shards_size(detector, tmp_path, capsys):
    """handoff.json holds metrics.jsonl whole, and was never held to --max-shard-mib: a run logging every
    step for long enough made it larger than a GPU call returns (22 MiB for 20 MiB of metrics)."""
    run = tmp_path / "run"
    shutil.copytree(detector, run / "checkpoints" / "step-00000001")
    (run / "checkpoints" / "latest").write_text("step-00000001")
    lines = [json.dumps({"step": n, "split": "train", "loss": 1.0 / (n + 1)}) + "\n" for n in range(40_000)]
    (run / "metrics.jsonl").write_text("".join(lines))  # 1.9 MiB
    limit = 0.5
    assert main(["pack", str(run), "--out", str(tmp_path / "p"), "--max-shard-mib", str(limit),
                 "--max-files", "8"]) == 0  # fmt: skip
    assert "lines left out, for handoff.json to fit a shard's 0.5 MiB" in capsys.readouterr().out
    assert all(f.stat().st_size <= limit * 2**20 for f in (tmp_path / "p").iterdir())
    carried = json.loads((tmp_path / "p" / "handoff.json").read_text())["files"]["run/metrics.jsonl"]
    assert carried["lines_left_out"] > 0 and carried["text"] == "".join(lines[carried["lines_left_out"] :])
    assert main(["unpack", str(tmp_path / "p"), "--out", str(tmp_path / "back")]) == 0
    assert (tmp_path / "back" / "metrics.jsonl").read_text() == carried["text"]  # the end of the run
    (tmp_path / "train.log").write_text("x" * 300_000)  # its last 200,000 characters are carried
    assert main(["pack", str(run), "--out", str(tmp_path / "q"), "--max-shard-mib", "0.15", "--max-files", "64",
                 "--log", str(tmp_path / "train.log")]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "handoff.json would be 0.2" in err and "over --max-shard-mib 0.15 (its list of" in err, err
    assert "; its largest files: run/train.log" in err, err
    assert not (tmp_path / "q").exists()


def test_metrics_fit_at_every_shard_limit_as_much_as_fits(detector, tmp_path):
    """The lines to leave out were counted before "lines_left_out" was added to the entry, and its bytes not
    at all: about one limit in three that the metrics fit was refused ("handoff.json would be 0.50 MiB,
    over --max-shard-mib"). Now every limit packs, within it, one line short of over it."""
    run = tmp_path / "run"
    shutil.copytree(detector, run / "checkpoints" / "step-00000001")
    (run / "checkpoints" / "latest").write_text("step-00000001")
    lines = [json.dumps({"step": n, "split": "train", "loss": 1.0 / (n + 1)}) + "\n" for n in range(40_000)]
    (run / "metrics.jsonl").write_text("".join(lines))
    for n in range(40):  # a step of 3.7 KiB: about 50 lines of metrics
        limit = round(0.4 + n * 0.0036, 4)
        out = tmp_path / f"p{n}"
        assert main(["pack", str(run), "--out", str(out), "--max-shard-mib", str(limit)]) == 0, limit
        carried = json.loads((out / "handoff.json").read_text())["files"]["run/metrics.jsonl"]
        left_out = carried["lines_left_out"]
        room = int(limit * 2**20) - (out / "handoff.json").stat().st_size
        assert 0 <= room < len(json.dumps(lines[left_out - 1])), (limit, room)  # the next line did not fit
        shutil.rmtree(out)


@pytest.mark.slow
def test_an_ascii_locale_packs_and_unpacks_the_utf8_files(detector, tmp_path):
    """tokenizer.json holds non-ASCII words, and its text was read and written in the locale's encoding:
    under LC_ALL=C (PYTHONUTF8=0), a UnicodeDecodeError traceback at pack."""
    import os
    import subprocess
    import sys

    assert any(b > 127 for b in (detector / "tokenizer.json").read_bytes())  # else this proves nothing
    env = {k: v for k, v in os.environ.items() if k != "PYTHONIOENCODING"} | {
        "LC_ALL": "C",
        "PYTHONUTF8": "0",
    }
    for argv in (["pack", str(detector), "--out", str(tmp_path / "p")],
                 ["unpack", str(tmp_path / "p"), "--out", str(tmp_path / "run")]):  # fmt: skip
        done = subprocess.run([sys.executable, "-m", "training.handoff", *argv], cwd=Path(__file__).parents[1],
                              env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
    unpacked = (tmp_path / "run" / "checkpoints" / "latest").read_text()
    back = tmp_path / "run" / "checkpoints" / unpacked / "tokenizer.json"
    assert back.read_bytes() == (detector / "tokenizer.json").read_bytes()


def test_help_prints_the_usage_and_exits_0(capsys):
    """--help and -h were taken for an unknown command: "give a command", exit 2."""
    for flag in ("--help", "-h"):
        assert main([flag]) == 0
        out = capsys.readouterr().out
        assert "python -m training.handoff pack RUN --out DIR" in out and "unpack DIR --out RUN" in out, out
    assert main([]) == 2 and "give a command" in capsys.readouterr().err


def test_paths_are_saved_absolute(detector, tmp_path, monkeypatch):
    """pack_config (in handoff.json) and unpack_config.json kept the paths as typed, relative to a directory
    they do not name; a training run's config.json keeps them absolute."""
    shutil.copytree(detector, tmp_path / "det")
    (tmp_path / "train.log").write_text("done\n")
    monkeypatch.chdir(tmp_path)
    assert main(["pack", "det", "--out", "p", "--log", "train.log"]) == 0
    saved = json.loads((tmp_path / "p" / "handoff.json").read_text())["pack_config"]
    assert (saved["run"], saved["out"], saved["log"]) == tuple(
        str(tmp_path / n) for n in ("det", "p", "train.log")
    )
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    assert main(["unpack", "../p", "--out", "../run"]) == 0
    saved = json.loads((tmp_path / "run" / "unpack_config.json").read_text())
    assert saved["handoff"] == str(tmp_path / "sub" / ".." / "p") and saved["out"] == str(tmp_path / "run")


def test_a_path_that_is_not_utf8_is_refused_before_anything_is_written(detector, tmp_path, capsys):
    """A byte not UTF-8 in --out, --log or the run's path was saved in handoff.json as a lone surrogate:
    pack said nothing, and every unpack refused that handoff.json ("copy handoff.json again" could not help)."""
    import os

    odd = os.fsdecode(b"odd\xffname")  # a lone surrogate in the text, as Python reads such a name
    os.symlink(detector, tmp_path / odd)
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / odd).write_text("done\n")
    packed = tmp_path / "p"
    assert main(["pack", str(detector), "--out", str(packed)]) == 0
    for argv, flag in [
        (["pack", str(detector), "--out", str(tmp_path / odd)], "--out"),
        (
            ["pack", str(detector), "--out", str(tmp_path / "q"), "--log", str(tmp_path / "log" / odd)],
            "--log",
        ),
        (["pack", str(tmp_path / odd), "--out", str(tmp_path / "q")], "RUN"),
        (["unpack", str(packed), "--out", str(tmp_path / odd / "run")], "--out"),
        (["unpack", str(tmp_path / odd), "--out", str(tmp_path / "run")], "HANDOFF"),
    ]:
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"error: {flag} {tmp_path}/" in err and "odd\\xffname" in err, err
        assert "the path holds bytes that are not UTF-8 (b'\\xff')" in err, err
        assert "rename the file or directory that holds them" in err and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["log", odd, "p"])  # nothing written


def test_out_dot_is_refused_and_the_directory_it_names_taken(detector, tmp_path, monkeypatch, capsys):
    """`--out .` ended in "PosixPath('.') has an empty name", a traceback, for pack and unpack alike; then,
    written, it replaced the current directory whole, the shell left in a deleted one (ls empty there).
    Refused, naming a new directory to give, which is taken."""
    for argv, name in ((["pack", str(detector)], "p"), (["unpack", str(tmp_path / "p")], "run")):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        capsys.readouterr()
        assert main([*argv, "--out", "."]) == 2
        err = capsys.readouterr().err
        assert "is the current directory" in err and "left in a deleted directory" in err, err
        assert list((tmp_path / name).iterdir()) == []
        monkeypatch.chdir(tmp_path)
        assert main([*argv, "--out", name]) == 0
    assert (tmp_path / "p" / "handoff.json").is_file() and (
        tmp_path / "run" / "checkpoints" / "latest"
    ).is_file()


def test_a_handoff_of_format_1_unpacks_with_a_tokenizer_config_made_for_it(detector, tmp_path, capsys):
    """Format 1 carried no tokenizer_config.json: still read, the unpacked checkpoint getting one made from
    its tokenizer.json. A format this version does not know is refused by its format."""
    assert main(["pack", str(detector), "--out", str(tmp_path / "p")]) == 0
    index_path = tmp_path / "p" / "handoff.json"
    index = json.loads(index_path.read_text())
    assert (
        index["format"] == "electra-serve handoff 2" and "checkpoint/tokenizer_config.json" in index["files"]
    )
    del index["files"]["checkpoint/tokenizer_config.json"]
    index_path.write_text(json.dumps({**index, "format": "electra-serve handoff 1"}))
    assert main(["unpack", str(tmp_path / "p"), "--out", str(tmp_path / "run")]) == 0
    (step,) = (tmp_path / "run" / "checkpoints").glob("step-*")
    assert (step / "tokenizer_config.json").read_text() == (detector / "tokenizer_config.json").read_text()
    index_path.write_text(json.dumps({**index, "format": "electra-serve handoff 3"}))
    assert main(["unpack", str(tmp_path / "p"), "--out", str(tmp_path / "run2")]) != 0
    assert "format 'electra-serve handoff 3', expected one of" in capsys.readouterr().err


def test_a_handoff_given_where_a_checkpoint_goes_is_told_to_be_unpacked_first(detector, tmp_path, capsys):
    """export, fine-tuning, pretraining's --init and pack itself said only "holds no checkpoint"."""
    from training.checkpoint import CheckpointError, resolve_checkpoint

    assert main(["pack", str(detector), "--out", str(tmp_path / "p")]) == 0
    with pytest.raises(
        CheckpointError, match=r"is a packed handoff \(handoff.json\), not a checkpoint: unpack"
    ):
        resolve_checkpoint(tmp_path / "p", "--init")
    # Its handoff.json named instead of the directory: "DIR/handoff.json: no handoff.json" was said.
    capsys.readouterr()
    assert main(["unpack", str(tmp_path / "p" / "handoff.json"), "--out", str(tmp_path / "run")]) == 2
    assert f"is a file: give the handoff's directory, {tmp_path / 'p'}" in capsys.readouterr().err
    done = subprocess.run([sys.executable, "-m", "export", str(tmp_path / "p"), "--out", str(tmp_path / "b")],
                          cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert (
        done.returncode == 2
        and f"python -m training.handoff unpack {tmp_path / 'p'} --out RUN" in done.stderr
    )


def test_a_hugging_face_directory_of_vocab_txt_alone_packs_its_tokenizer_as_export_reads_it(
    detector, tmp_path
):
    """export and fine-tuning read such a directory (its tokenizer built from vocab.txt); pack refused it,
    "has no tokenizer.json", saying nothing of what to do."""
    from training.data.tokenizer_loading import load_tokenizer

    shutil.copytree(detector, hf := tmp_path / "hf", ignore=shutil.ignore_patterns("generator"))
    (hf / "tokenizer.json").unlink()
    assert (hf / "vocab.txt").is_file()
    assert main(["pack", str(hf), "--out", str(tmp_path / "p")]) == 0
    assert main(["unpack", str(tmp_path / "p"), "--out", str(tmp_path / "run")]) == 0
    text = "The Quick brown fox, unseen-words!"
    unpacked = load_tokenizer(tmp_path / "run" / "checkpoints" / "step-00000000")
    assert unpacked.encode(text).ids == load_tokenizer(hf).encode(text).ids
    (hf / "vocab.txt").unlink()
    assert main(["pack", str(hf), "--out", str(tmp_path / "q")]) == 2
