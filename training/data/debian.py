"""Registry files that ship in a Debian package (training/data/registry.py): fetched with apt-get download,
read from the package's data.tar without installing it."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

from training.data.registry import ChecksumError, DatasetEntry, DownloadError, download_hint


def download_deb(entry: DatasetEntry, dest: Path, searched: Path | None = None) -> Path:
    """Run ``apt-get download`` for the entry's pinned Debian package into ``dest``; return the .deb.
    ``searched`` is the data dir that lacked the file, for the message."""
    lead, hint = download_hint(entry, searched)
    hint += (
        f"; it is {entry.member} inside Debian's {entry.package} {entry.version} (on Debian, `apt-get update` "
        "first if apt-get cannot find it)"
    )
    try:
        proc = subprocess.run(["apt-get", "download", "-q", entry.requirement], cwd=dest, capture_output=True,
                              text=True, check=False)  # fmt: skip
    except OSError as e:
        raise DownloadError(f"{lead}cannot run apt-get to download {entry.requirement} ({e}); {hint}") from e
    debs = sorted(dest.glob("*.deb"))
    if proc.returncode != 0 or len(debs) != 1:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise DownloadError(
            f"{lead}could not download {entry.requirement} from Debian: {hint}.\napt-get said:\n{tail}"
        )
    return debs[0]


def data_tar(path: Path) -> tarfile.TarFile:
    """The data.tar of a .deb: an ar archive (an 8-byte magic, then members behind 60-byte headers)."""
    blob = path.read_bytes()
    pos = 8
    while pos + 60 <= len(blob):
        name, size = blob[pos : pos + 16].decode().strip().rstrip("/"), int(blob[pos + 48 : pos + 58])
        if name.startswith("data.tar"):
            return tarfile.open(fileobj=io.BytesIO(blob[pos + 60 : pos + 60 + size]))
        pos += 60 + size + (size % 2)  # members start on even offsets
    raise ChecksumError(f"{path.name} holds no data.tar: not a Debian package")
