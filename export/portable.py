"""The paths of the exporting machine, cut from what travels with a bundle (its manifest): they mean nothing
where the bundle is served."""

from __future__ import annotations

import os
import re
from pathlib import Path


def portable(value):
    """A manifest travels with its bundle: an absolute path of the exporting machine means nothing there.
    Paths under the working directory (not / itself) are kept relative to it (runs/detector/...), others by their
    last three parts after ".../" (so that they do not read as relative); keys too (calibration's
    sentence counts by source), and paths of this machine inside a sentence ("10% of /home/me/train.csv
    (seed 1)", as a fine-tuning run names the dev share it held out). The model's class names are data,
    answered by /classify as they are, however much one reads as a path ("/r/politics"); everything else
    passes through."""
    if isinstance(value, dict):
        return {portable(k): v if k in _CLASS_NAMES else portable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [portable(v) for v in value]
    if isinstance(value, str) and value.startswith("/"):
        return _portable_path(value)
    if isinstance(value, str):
        return _PATH_IN_SENTENCE.sub(_cut_if_here, value)
    return value


_CLASS_NAMES = frozenset({"labels", "id2label", "label2id", "positive_label"})
# An absolute path of two parts or more after a space or "(" (not a URL's), up to white space or a
# parenthesis; the punctuation a sentence puts after it ("rows of /data/x.txt, each ...") is left out in
# _cut_if_here (a lookahead for it here made the match quadratic). A path holding a space is cut at its
# first part's end: the words after it are left, none of them absolute.
_PATH_IN_SENTENCE = re.compile(r"(?<![^\s(])/[^\s()/]+(?:/[^\s()/]*)+")


def _cut_if_here(match: re.Match) -> str:
    """A path, cut: one of this machine, or one that reads as a file's (three parts, or a file name with an
    extension: another machine's, a run's made on the GPU machine); as it is otherwise ("POST /detect and
    /v1/models" in a warning)."""
    path = match.group().rstrip(",.;:")
    after = match.group()[len(path) :]
    parts = Path(path).parts[1:]
    if parts and (os.path.exists(path) or len(parts) >= 3 or re.search(r"\.\w+$", parts[-1])):
        return _portable_path(path) + after
    return match.group()


def _portable_path(value: str) -> str:
    path, cwd = Path(value), Path.cwd()
    # Every path is under "/": relative to it, a path would read as relative to wherever it is read.
    if cwd != Path(cwd.anchor) and path.is_relative_to(cwd):
        return str(path.relative_to(cwd))
    return str(Path("...", *path.parts[1:][-3:]))  # parts[0] is the root "/"
