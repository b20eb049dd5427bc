"""What a --config file gives: its options read (_config_file: TOML, or the JSON of a run's saved
options less what was that run's own), a model's config.json given in its place refused with what to give
instead (_model_config_given), and a path the file saved shortened as ".../" (a bundle's
export_config.json) refused where it would be read (_check_no_shortened_paths at resolve,
check_shortened where an entry point decides later). The package's resolve is its only caller, apart from
the entry points that call check_shortened and shortened_path as options.X.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from collections.abc import Sequence
from pathlib import Path

from options.declarations import flag, saved_as, spec_of
from options.errors import ConfigError
from options.provenance import sources


def _check_no_shortened_paths(
    values: dict, given: dict, fields: dict, config: str | None, later: Sequence[str] = ()
) -> None:
    """A bundle's export_config.json written before its paths were saved absolute (export/config.py
    PATH_OPTIONS) holds each path outside the directory the export ran in as ".../" and its last three
    parts: replayed from that file, it would fail later as a directory that does not exist. All of them are
    named in one error (one a run, a user gave CHECKPOINT, then --data-dir, then --calibration-text). The
    options the dataclass names in its SHORTENED_CHECKED_LATER are the entry point's to check
    (check_shortened), once it knows whether it reads them: an old classifier bundle's file kept a
    calibration text it never read; they are named here too, as what to give where it is read."""
    shortened = [n for n, v in values.items() if given.get(n) == config and shortened_path(v)]
    now = [n for n in shortened if n not in later]
    if now:
        maybe = [n for n in shortened if n in later]
        raise ConfigError(_shortened_said(config, now, values, fields, maybe))


def check_shortened(cfg, names: Sequence[str]) -> None:
    """_check_no_shortened_paths for `names`, on a resolved config: the options of a --config file an entry
    point found it reads after all."""
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    given = sources(cfg)
    values = {n: getattr(cfg, n) for n in names}
    found = [n for n in names if given.get(n) not in (None, flag(n)) and shortened_path(values[n])]
    if found:
        raise ConfigError(_shortened_said(given[found[0]], found, values, fields))


def shortened_path(value) -> bool:
    """A path as a bundle's export_config.json saved one from outside its export's directory."""
    return isinstance(value, str) and value.startswith(".../")


def _shortened_said(
    config: str, names: list[str], values: dict, fields: dict, maybe: Sequence[str] = ()
) -> str:
    def shown(name: str) -> str:
        return name.upper() if spec_of(fields[name]).positional else flag(name)

    listed = ", ".join(f"{n} is {values[n]!r}" for n in [*names, *maybe])
    what = (
        ", a path shortened where it was saved"
        if len(names) + len(maybe) == 1
        else ": paths shortened where they were saved"
    )
    where_read = f" (and {' and '.join(map(shown, maybe))}, where this export reads it)" if maybe else ""
    return (f"--config {config}: {listed}{what} (a bundle exported before paths were saved whole kept no absolute "
            f"path of the machine that wrote it): give {' and '.join(map(shown, names))} on the command line"
            f"{where_read}")  # fmt: skip


def _config_file(path: Path, cls) -> tuple[dict, dict]:
    """The options of a --config file: TOML, or (a name ending in .json) the options a run saved, less
    what was that run's own (module docstring; returned apart: its out, say); a null there leaves the option
    unset, as it was saved."""
    if path.is_dir():
        saved = f" or a run's saved {saved_as(cls)}" if saved_as(cls) else ""
        raise ConfigError(f"--config: {path} is a directory; give a TOML file (configs/*.toml){saved}")
    if not path.is_file():
        raise ConfigError(f"--config: {path} does not exist")
    saved = path.suffix.lower() == ".json"
    kind = "JSON" if saved else "TOML"
    try:
        text = path.read_text(encoding="utf-8")
        raw = json.loads(text) if saved else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        hint = "; a run's saved options end in .json" if not saved and text.lstrip().startswith("{") else ""
        raise ConfigError(f"--config {path}: not valid {kind} ({e}){hint}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"--config {path}: not UTF-8 (byte offset {e.start}), as {kind} must be") from None
    except OSError as e:
        raise ConfigError(f"--config {path}: cannot be read ({e.strerror or e})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"--config {path}: holds no options (a JSON object of them, as a run saves)")
    if not saved:
        return raw, {}
    if "architectures" in raw and "architectures" not in {f.name for f in dataclasses.fields(cls)}:
        raise ConfigError(_model_config_given(path, raw, cls))
    # `as_run` is what the options came to where that run ran; --out and the like are where it wrote.
    own = ("as_run", *getattr(cls, "RUN_ONLY", ()))
    return {k: v for k, v in raw.items() if k not in own and v is not None}, {
        k: raw[k] for k in own if k in raw
    }


def _model_config_given(path: Path, raw: dict, cls) -> str:
    """What to give instead of a model's config.json (Hugging Face's, naming its architectures): it sits
    beside the options file in a fine-tuning run's --out, and in a pretraining run's checkpoints, and read
    as options it failed on its first key ("unknown option 'architectures'")."""
    said = (
        f"--config {path}: a model's config.json (Hugging Face's: architectures {raw['architectures']}), not "
    )
    saved = saved_as(cls)
    if saved == "":  # the command saves no options
        return said + "options: give a TOML file"
    # Beside it (a fine-tuning run's --out), or in the run directory of a pretraining checkpoint's
    # (RUN/checkpoints/step-N/config.json); named as the user did (abspath keeps links).
    here = Path(os.path.abspath(path)).parent
    places = [here, here.parent.parent] if here.parent.name == "checkpoints" else [here]
    near = saved and next((d / saved for d in places
                           if (d / saved).is_file() and (d / saved).resolve() != path.resolve()), None)  # fmt: skip
    instead = (f"give {near}, that run's options" if near else f"give the {saved} a run of this command saved"
               if saved else "give the JSON of the options a run of this command saved")  # fmt: skip
    fields = {f.name: f for f in dataclasses.fields(cls)}
    model = next((n.upper() if spec_of(fields[n]).positional else flag(n)
                  for n in ("init", "checkpoint") if n in fields), None)  # fmt: skip
    start = f"; to start from that model, give its directory as {model}" if model else ""
    return f"{said}the options a run saved: {instead}{start}"
