"""Every entry point declares its options once (options/) and keeps what its --help says: the help is
generated from the declarations, says nothing twice, and each promise it makes is run: the default
shown is the default, a flag, its environment variable and a TOML key give the same value, the allowed
values are accepted and nothing else, and a switch is a switch."""

import dataclasses
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest

import options
from app.settings import Settings
from bulk.config import BulkConfig
from export.config import ExportConfig
from export.recover import RecoverConfig
from training.data.corpus_sources import JSONL_SUFFIXES, REGISTRY_CORPORA, TEXT_SUFFIXES
from training.finetuning.config import FinetuneConfig
from training.finetuning.sets import LABELLED_SETS
from training.pretraining.config import PretrainConfig

REPO = Path(__file__).resolve().parent.parent
# Each program with the options it cannot run without.
PROGRAMS = {
    "training.pretrain": (PretrainConfig, []),
    "training.finetune": (FinetuneConfig, ["--init", "runs/x", "--out", "runs/y", "--task", "trec"]),
    "export": (ExportConfig, ["runs/x", "--out", "bundles/y"]),
    "export.recover": (RecoverConfig, ["models/detector", "--out", "runs/y"]),
    "app": (Settings, []),
    "bulk": (BulkConfig, ["corpus.jsonl", "--out", "scores", "--model", "detector"]),
}


@functools.cache  # each program's --help starts a Python once in this file, not once per test
def help_text(module: str) -> str:
    env = {**os.environ, "COLUMNS": "2000"}  # no wrapping: argparse would break words at their hyphens
    out = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    return " ".join(out.stdout.split())


@pytest.mark.parametrize("module", PROGRAMS)
def test_help_is_generated_from_each_declaration_once(module):
    cls, _ = PROGRAMS[module]
    shown = help_text(module)
    for f in dataclasses.fields(cls):
        line = " ".join(options.help_line(f).split())
        assert options.spec_of(f).help.strip(), f"{module} {f.name} has no description"
        assert line in shown, f"{module} --help does not show {f.name} as declared: {line!r}"
        words = re.findall(r"[\w'-]+", line.lower())
        runs = [" ".join(words[i : i + 4]) for i in range(len(words) - 3)]
        repeated = {r for r in runs if runs.count(r) > 1}
        assert not repeated, f"{module} {f.name}: help says {sorted(repeated)} twice: {line!r}"
        assert line.count("default") <= 1, f"{module} {f.name}: two defaults in {line!r}"


def _candidates(f: dataclasses.Field, kind, default, tmp_path: Path) -> list:
    """Values other than the default a user might give, as text, most ordinary first."""
    spec = options.spec_of(f)
    if spec.choices:
        return [str(c) for c in spec.choices if c != default]
    if kind is bool:
        return [str(not default).lower()]
    if kind is int:
        base = default or 0
        return [str(v) for v in (base * 2, base + 1, 1, 2, 8) if v != default]
    if kind is float:
        base = default or 0.0
        return [str(v) for v in (base / 2, base * 2, 0.5, 1.0, 2.0) if v != default]
    if kind is tuple:
        return ["https://a.example,https://b.example"]
    return ["news", str(tmp_path), "x,y"]  # text: a registry corpus, a path that exists, anything


def _given(module: str, f: dataclasses.Field, tmp_path: Path):
    """A value of `f` that resolves through its flag and differs from the default, with that value."""
    cls, required = PROGRAMS[module]
    kind = options._kind(typing.get_type_hints(cls)[f.name])
    default = options.default_of(f)
    for text in _candidates(f, kind, default, tmp_path):
        try:
            cfg = options.resolve(cls, [*required, options.flag(f.name), text], env={})
        except options.ConfigError:
            continue
        if getattr(cfg, f.name) != default:
            return text, getattr(cfg, f.name)
    return None


@pytest.mark.parametrize("module", PROGRAMS)
def test_every_promise_of_the_help_is_kept(module, tmp_path):
    cls, required = PROGRAMS[module]
    defaults = options.resolve(cls, required, env={})
    changed, settable = 0, 0
    for f in dataclasses.fields(cls):
        spec = options.spec_of(f)
        if spec.positional or options.flag(f.name) in required:
            continue
        settable += 1
        assert getattr(defaults, f.name) == options.default_of(f), f"{module} {f.name}: not the default shown"
        if spec.choices:
            for value in spec.choices:  # every allowed value is accepted ...
                assert (
                    getattr(
                        options.resolve(cls, [*required, options.flag(f.name), str(value)], env={}), f.name
                    )
                    == value
                )
            with pytest.raises(
                options.ConfigError, match=re.escape(options.flag(f.name))
            ):  # ... and only those
                options.resolve(cls, [*required, options.flag(f.name), "no-such-value"], env={})
        found = _given(module, f, tmp_path)
        if found is None:
            continue
        text, value = found
        changed += 1
        if spec.env:  # the variable resolves as the flag does
            assert getattr(options.resolve(cls, required, env={spec.env: text}), f.name) == value
        toml = tmp_path / f"{f.name}.toml"  # and so does the TOML key
        toml.write_text(f"{f.name} = {_toml_value(value)}\n")
        assert getattr(options.resolve(cls, [*required, "--config", str(toml)], env={}), f.name) == value
        if isinstance(value, bool):  # a switch
            assert getattr(options.resolve(cls, [*required, options.flag(f.name)], env={}), f.name) is True
            assert (
                getattr(options.resolve(cls, [*required, "--no-" + f.name.replace("_", "-")], env={}), f.name)
                is False
            )
    assert changed >= settable / 2, f"{module}: too few options could be set to test"


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(f'"{v}"' for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\") + '"'


@pytest.mark.parametrize("module", PROGRAMS)
def test_unknown_and_ill_typed_options_fail_naming_them(module, tmp_path):
    cls, required = PROGRAMS[module]
    with pytest.raises(options.ConfigError, match="--no-such-option"):
        options.resolve(cls, [*required, "--no-such-option", "1"], env={})
    toml = tmp_path / "c.toml"
    toml.write_text("no_such_option = 1\n")
    with pytest.raises(options.ConfigError, match="unknown option 'no_such_option'"):
        options.resolve(cls, [*required, "--config", str(toml)], env={})
    hints = typing.get_type_hints(cls)
    number = (
        next(f.name for f in dataclasses.fields(cls) if options._kind(hints[f.name]) in (int, float))
        if module != "export.recover"
        else None
    )
    if number:
        with pytest.raises(options.ConfigError, match=re.escape(options.flag(number)) + ": expected"):
            options.resolve(cls, [*required, options.flag(number), "many"], env={})


@pytest.mark.parametrize("module", PROGRAMS)
def test_a_mistyped_flag_is_told_the_closest_and_a_strange_one_the_help(module):
    """An unknown flag got argparse's bare "unrecognized arguments: --max-step 10", where a TOML key that
    is unknown gets "did you mean"."""
    cls, required = PROGRAMS[module]
    for f in dataclasses.fields(cls):
        if options.spec_of(f).positional or "_" not in f.name:
            continue
        meant = options.flag(f.name)  # a long one, missing its last letter
        near = f"{meant[:-1]}: did you mean (--[a-z-]+ or )*{re.escape(meant)}[? ]"  # among the closest
        with pytest.raises(options.ConfigError, match=near):
            options.resolve(cls, [*required, meant[:-1], "1"], env={})
    # --bogus is like no flag: measured with the "--" every flag has, it was "did you mean --out?".
    for stray in (["--qqqqqq", "1"], ["--bogus"], ["stray"], ["--", "-x"]):  # "--" is no flag to match
        with pytest.raises(options.ConfigError, match=f"python -m {module} --help lists the options"):
            options.resolve(cls, [*required, *stray], env={}, prog=f"python -m {module}")
    switch = next((f.name for f in dataclasses.fields(cls) if f.type in (bool, "bool")), None)
    if switch:  # its --no- form misspelled: that form, not the switch, which means the opposite
        no = "--no-" + switch.replace("_", "-")
        with pytest.raises(options.ConfigError, match=f"{no}x: did you mean {re.escape(no)}[? ]"):
            options.resolve(cls, [*required, no + "x"], env={})


def test_finetune_max_steps_says_how_to_make_a_quick_run():
    """--max-steps, a natural thing to try (pretraining has it), was refused with nothing about what fine-tuning
    takes instead; its closest spelling, --max-seq-len, shortens the texts, not the run."""
    cls, required = PROGRAMS["training.finetune"]
    # Spelled otherwise, the hint all the same (looked up as typed, --max_steps got "--help lists the options").
    for spelled in ("--max_steps", "--maxsteps", "--Max-Steps"):
        with pytest.raises(options.ConfigError, match=f"{spelled}: fine-tuning counts --epochs"):
            options.resolve(cls, [*required, spelled, "10"], env={})
    with pytest.raises(options.ConfigError) as refused:
        options.resolve(cls, [*required, "--max-steps", "10"], env={})
    said = str(refused.value)
    assert "--epochs 1" in said and "--max-seq-len" not in said, said
    named = re.findall(r"--[a-z-]+", said.split("(", 1)[1])
    known = {options.flag(f.name) for f in dataclasses.fields(cls)}
    assert set(named) - {"--max-steps"} <= known, named  # the quick run it gives can be run
    options.resolve(cls, [*required, *said.split("give ", 1)[1].rstrip(")").split()], env={})


@pytest.mark.parametrize("module", PROGRAMS)
def test_an_optional_number_is_unset_by_none_from_a_flag_or_a_file(module, tmp_path):
    """--threads' help says "0 or none: every core", and --threads none answered "expected int, got 'none'"."""
    cls, required = PROGRAMS[module]
    hints = typing.get_type_hints(cls)
    unsettable = [f.name for f in dataclasses.fields(cls)
                  if options._optional(hints[f.name]) and options._kind(hints[f.name]) in (int, float)]  # fmt: skip
    for name in unsettable:
        toml = tmp_path / f"{name}.toml"
        toml.write_text(f'{name} = "None"\n')
        for args in ([options.flag(name), "none"], ["--config", str(toml)]):
            assert getattr(options.resolve(cls, [*required, *args], env={}), name) is None, (name, args)
    if module == "training.pretrain":
        assert "threads" in unsettable and "(0 or none: every core)" in help_text(module)
        with pytest.raises(options.ConfigError, match="--threads: expected int, got 'nones'"):
            options.resolve(cls, ["--threads", "nones"], env={})


# Run as `python -m MODULE ARGS`, then tells how it ended and whether torch was imported.
PROBE = """import runpy, sys
module, sys.argv[1:] = sys.argv[1], sys.argv[2:]
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
except SystemExit as e:
    print(f"exit {e.code!r}", file=sys.stderr)
print("torch" in sys.modules)
"""


@pytest.mark.parametrize("module", PROGRAMS)
def test_help_and_a_mistyped_flag_answer_before_torch_loads(module):
    """Importing torch costs seconds; --help and a typo in a flag must not wait for it."""
    _, required = PROGRAMS[module]
    for args, ends in ((["--help"], "exit 0"), ([*required, "--no-such-option", "1"], "--no-such-option")):
        done = subprocess.run([sys.executable, "-c", PROBE, module, *args], cwd=REPO, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert done.stdout.strip().splitlines()[-1:] == ["False"], (module, args, done.stderr[-2000:])
        assert ends in done.stderr, (module, args, done.stderr[-2000:])
        assert args == ["--help"] or not re.search(r"^exit (0|None)$", done.stderr, re.M), done.stderr[-2000:]


@pytest.mark.parametrize(
    "module, args, said",
    [("training.pretrain", ["--corpus", "wikitext3"], "--corpus 'wikitext3': neither a registry corpus"),
     ("training.finetune", ["--init", "runs/x", "--task", "trec"], "--out: required")],
)  # fmt: skip
def test_a_value_the_options_refuse_answers_before_torch_loads(module, args, said):
    """A wrong value, not only a wrong flag, answers in a fraction of a second."""
    done = subprocess.run([sys.executable, "-c", PROBE, module, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.stdout.strip().splitlines()[-1:] == ["False"], done.stderr[-2000:]
    # Printed as "error: ...", and exit status 2: a usage error's, as argparse's.
    assert said in done.stderr and re.search(r"^error: ", done.stderr, re.M), done.stderr[-2000:]
    assert re.search(r"^exit 2$", done.stderr, re.M), done.stderr[-2000:]


def test_an_out_that_decides_the_refusal_alone_answers_before_torch_loads(tmp_path):
    """A --resume with nothing to go on from, a new run into one that holds a run (or another's files, or
    the corpus it reads), said at once: pretraining's set-up and the tuner said the same after torch had
    loaded (3 s and 1.5 s of a core)."""
    pretraining, corpus, empty = tmp_path / "pretraining", tmp_path / "corpus", tmp_path / "empty"
    (pretraining / "checkpoints").mkdir(parents=True)
    (pretraining / "checkpoints" / "latest").write_text("step-00000004")
    corpus.mkdir()
    (corpus / "a.txt").write_text("text\n")
    empty.mkdir()
    stopped, unreadable = tmp_path / "stopped", tmp_path / "unreadable"
    for run, settings in ((stopped, '{"init": "x"}'), (unreadable, "{bad")):
        (run / "resume").mkdir(parents=True)
        (run / "resume" / "state.json").write_text("{}")
        (run / "finetune_config.json").write_text(settings)
    new = ["--corpus", "wikitext2", "--tokenizer", "train"]
    start = ["--init", str(tmp_path), "--task", "sms_spam"]
    for module, args, said in [
        ("training.pretrain", [*new, "--out", str(pretraining)], "already holds a run; pass --resume"),
        ("training.pretrain", ["--out", str(tmp_path / "nowhere"), "--resume"], "does not exist; give the --out"),
        ("training.pretrain", ["--out", str(empty), "--resume"], "has no checkpoint yet; drop --resume"),
        # Not "drop --resume": a new run there is refused for those files.
        ("training.pretrain", ["--out", str(corpus), "--resume"], "holds a.txt, not a pretraining run's files; give the --out of the run"),
        ("training.pretrain", ["--out", str(corpus / "a.txt"), "--resume"], "a.txt is a file; give the --out of the run"),
        ("training.pretrain", ["--corpus", str(corpus), "--out", str(corpus / "run")], "inside the corpus directory"),
        ("training.pretrain", [*new, "--out", str(corpus)], "holds a.txt, not a pretraining run's files"),
        ("training.finetune", [*start, "--out", str(stopped)], "its run was stopped: pass --resume"),
        ("training.finetune", [*start, "--out", str(pretraining)], "is a pretraining run (checkpoints/latest)"),
        ("training.finetune", ["--out", str(empty), "--resume"], "holds no fine-tuning run"),
        ("training.finetune", ["--out", str(unreadable), "--resume"], "finetune_config.json does not read"),
    ]:  # fmt: skip
        done = subprocess.run([sys.executable, "-c", PROBE, module, *args], cwd=REPO, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert done.stdout.strip().splitlines()[-1:] == ["False"], (module, args, done.stderr[-2000:])
        assert said in done.stderr and re.search(r"^exit 2$", done.stderr, re.M), (module, args, done.stderr[-2000:])  # fmt: skip


def test_config_names_the_file_each_command_saves_and_a_models_config_json_is_refused_naming_it(
    tiny_init, tmp_path
):
    """--config's help said "the JSON of the options a run saved (its config.json)" for every command: a
    fine-tuning run's config.json is its model's (Hugging Face's), and given as --config it failed on
    "unknown option 'architectures'"; the server saves no options at all."""
    assert "or the finetune_config.json a run of this command saved" in help_text("training.finetune")
    assert "or the config.json a run of this command saved" in help_text("training.pretrain")
    assert "or the export_config.json a run of this command saved" in help_text("export")
    assert "--config FILE options from a TOML file; flags given here override it" in help_text("app")
    out = tmp_path / "finetuned"  # as a fine-tuning run leaves it: the model's config.json beside the options
    out.mkdir()
    shutil.copy(tiny_init / "config.json", out)
    (out / FinetuneConfig.SAVED_AS).write_text("{}")
    with pytest.raises(options.ConfigError) as refused:
        options.resolve(FinetuneConfig, ["--config", str(out / "config.json")], env={})
    assert str(refused.value) == (
        f"--config {out / 'config.json'}: a model's config.json (Hugging Face's: architectures "
        f"['ElectraForPreTraining']), not the options a run saved: give {out / 'finetune_config.json'}, that "
        "run's options; to start from that model, give its directory as --init"
    )


def test_a_runs_saved_options_given_to_another_command_say_whose_file_they_may_be(tmp_path):
    """training.pretrain --config RUN/finetune_config.json (or bulk's config.json) said only "unknown option
    'overwrite'" and listed pretraining's options; a recipe of this command with a slip is not told so."""
    pretrained = tmp_path / "pretrained"
    pretrained.mkdir()
    options.save(
        options.resolve(PretrainConfig, ["--out", str(pretrained)], env={}), pretrained / "config.json"
    )
    finetuned = tmp_path / FinetuneConfig.SAVED_AS
    finetuned.write_text(
        json.dumps({"task": "trec", "init": "x", "epochs": 3, "overwrite": False, "patience": 2})
    )
    for cls, saved in ((PretrainConfig, finetuned), (FinetuneConfig, pretrained / "config.json")):
        with pytest.raises(options.ConfigError) as refused:
            options.resolve(cls, ["--config", str(saved)], env={})
        assert re.search(rf"^{re.escape(str(saved))}: unknown option '\w+'( \(did you mean '\w+'\?\))?; \d+ of its \d+ "
                         rf"keys are not this command's options: is it another command's saved options\? \(this one "
                         rf"saves {cls.SAVED_AS}\); known options: ", str(refused.value)), str(refused.value)  # fmt: skip
    recipe = tmp_path / "recipe.json"  # one slip in a recipe of this command's: no such guess
    recipe.write_text(json.dumps({"max_step": 10, "lr": 1e-3, "batch_size": 8}))
    with pytest.raises(
        options.ConfigError, match=r"unknown option 'max_step' \(did you mean 'max_steps'\?\); known"
    ):
        options.resolve(PretrainConfig, ["--config", str(recipe)], env={})


def test_a_tilde_in_a_path_is_the_home_directory_wherever_it_is_given(tmp_path, monkeypatch):
    """`out = "~/x"` in a --config file, `--out=~/x` (no shell expands after =) and a quoted
    ELECTRA_MODELS_DIR='~/models' were a directory named ~ in the current one; training expanded ~, bulk,
    export and the server did not."""
    from bulk.config import resolve as bulk_resolve
    from export.__main__ import resolve as export_resolve

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "home"
    settings = options.resolve(Settings, [], env={"ELECTRA_MODELS_DIR": "~/models"}, config_file=False)
    assert settings.models_dir == home / "models"
    toml = tmp_path / "b.toml"
    toml.write_text('out = "~/scores"\nmodel = "sentiment"\n')
    cfg = bulk_resolve(["~/corpus/**/", "--config", str(toml), "--models=~/models"])
    assert (cfg.input, cfg.out, cfg.models_dir) == (f"{home}/corpus/**/", home / "scores", home / "models")
    with pytest.raises(
        options.ConfigError, match=r"--out ~no-such-user-here/x: there is no user 'no-such-user-here'"
    ):
        bulk_resolve(["in.jsonl", "--out=~no-such-user-here/x", "--model", "m"])
    from training.finetuning.config import FinetuneConfig

    tuned = options.resolve(FinetuneConfig, ["--out=~/ft", "--init", "x", "--task", "trec"], env={})
    assert tuned.out == str(home / "ft")  # was ./~/ft: fine-tuning kept --out as typed
    named_so = tmp_path / "~no-such-user-here" / "x"  # a directory named so: by its absolute path
    assert bulk_resolve(["in.jsonl", f"--out={named_so}", "--model", "m"]).out == named_so
    exported = export_resolve([str(tmp_path / "ckpt"), "--out=~/bundle", "--triton=~/triton"])
    assert (exported.out, exported.triton) == (str(home / "bundle"), str(home / "triton"))
    assert not (tmp_path / "~").exists()


def test_choice_options_list_their_values():
    pretrain, finetune = help_text("training.pretrain"), help_text("training.finetune")
    assert all(name in pretrain for name in REGISTRY_CORPORA)
    assert all(name in finetune for name in LABELLED_SETS)


def test_the_readme_names_every_kind_of_corpus_file_read():
    """.txt.gz and .jsonl.gz corpora were read, and the README's Data section named only .txt and .jsonl."""
    data = (REPO / "README.md").read_text().split("- **Data.**")[1].split("- **")[0]
    assert all(f"`{suffix}`" in data for suffix in TEXT_SUFFIXES + JSONL_SUFFIXES)
    assert "or a path (.txt, .jsonl, either .gz, a dir of them)" in help_text("training.pretrain")


def test_unknown_corpus_is_a_message(tmp_path):
    cmd = [sys.executable, "-m", "training.pretrain", "--corpus", "wikitext3", "--out", str(tmp_path / "r")]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert (
        "--corpus 'wikitext3': neither a registry corpus (wikitext2, news, wordnet, chat, gcide, "
        "wordnet_glosses, trec, commons)" in out.stderr
    )


def test_a_negative_value_in_scientific_notation_is_read_as_the_value():
    """argparse took `-1e-3` for a flag: `--lr -1e-3` answered "expected one argument", not what is wrong."""
    with pytest.raises(options.ConfigError, match="--lr: must be positive, got -0.001"):
        options.resolve(PretrainConfig, ["--lr", "-1e-3"])
    assert options.resolve(Settings, ["--memory-limit-mb", "-1"]).memory_limit_mb == -1  # as before


@pytest.mark.parametrize(
    "module, args",
    [("training.pretrain", ["--config", "configs/tiny.toml"]),
     ("training.finetune", ["--init", "models", "--task", "trec"])],
)  # fmt: skip
def test_without_the_training_install_training_says_how_to_install_it(module, args, tmp_path):
    """scripts/serve's .venv is the serving install: training there ended in a ModuleNotFoundError
    traceback (exit 1)."""
    blocked = "import sys; sys.modules['torch'] = None\n" + PROBE  # `import torch` fails, as without it
    argv = [*args, "--out", str(tmp_path / "run")]
    done = subprocess.run([sys.executable, "-c", blocked, module, *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert "error: torch is not installed, and this command needs the training install" in done.stderr, (
        done.stderr
    )
    assert re.search(r"^exit 2$", done.stderr, re.M) and "Traceback" not in done.stderr, done.stderr[-2000:]


def test_bulk_own_ray_answers_help_on_stdout_with_exit_0():
    """docs/bulk.md names `python -m bulk.own_ray DIR`; its --help printed the usage as an error (exit 2)."""
    import contextlib
    import io

    from bulk.own_ray import main as own_ray

    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        assert own_ray(["--help"]) == 0
    assert said.getvalue().startswith("usage: python -m bulk.own_ray DIR")
    with contextlib.redirect_stderr(io.StringIO()):
        assert own_ray([]) == 2 and own_ray(["--bogus"]) == 2  # no DIR, or a flag it has not: still refused
