"""Compressed shards: gzip, bzip2 and xz files of JSONL or text, read as what they hold with the standard
library (corpora are shipped so). A compressed stream cannot be entered at a byte offset, so such a shard
is one part, read from its start (parts.plan), and its progress is counted in compressed bytes: the size
it was planned with. Other compressions have no reader in the standard library and fail by name."""

from __future__ import annotations

import bz2
import gzip
import lzma
import shlex
import zlib
from pathlib import Path
from typing import BinaryIO


def _gunzipped(raw: BinaryIO) -> gzip.GzipFile:
    """gzip's reader over `raw`, refusing a file of no bytes: GzipFile reads it as an empty stream (bz2 and
    lzma call it cut short), so a download that failed to a 0-byte .jsonl.gz was a finished shard of no rows,
    and the real file put in its place was refused as INPUT changed."""
    at = raw.tell()
    if not raw.read(1):
        raise gzip.BadGzipFile("an empty file, 0 bytes: not even a gzip header")
    raw.seek(at)
    return gzip.GzipFile(fileobj=raw, mode="rb")


# Suffix -> (its name, which is also its command-line tool's, a reader over an open binary file). Each reader
# leaves the file it is given open, so that the shard is checked (reading._check_unchanged) on the file
# actually read.
READERS = {
    ".gz": ("gzip", _gunzipped),
    ".bz2": ("bzip2", bz2.BZ2File),
    ".xz": ("xz", lzma.LZMAFile),
}
NOT_READ = (".zst", ".zstd", ".lz4", ".zip")  # no reader in the standard library
COMPRESSED = tuple(READERS) + NOT_READ
# What a damaged or cut-short stream raises: EOFError (ended before its end marker), gzip.BadGzipFile and
# bz2's "Invalid data stream" (OSError), lzma.LZMAError, zlib.error (a deflate block that is not one).
STREAM_ERRORS = (EOFError, OSError, lzma.LZMAError, zlib.error)


def damaged(e: BaseException) -> bool:
    """Whether `e` (one of STREAM_ERRORS) says the stream is damaged, not that the disk failed: an OSError of
    the system (EIO, ESTALE: it carries an errno) is said as itself, not as a file cut short."""
    return not (isinstance(e, OSError) and e.errno is not None)


def compression(path: Path | str) -> str | None:
    """The suffix of the compression a shard is read through (.gz, .bz2, .xz), or None: read as it is."""
    suffix = Path(path).suffix.lower()
    return suffix if suffix in READERS else None


def decompressed(suffix: str, raw: BinaryIO) -> BinaryIO:
    """What `raw` (open at its start) holds, read through the reader of `suffix`."""
    return READERS[suffix][1](raw)


class BrokenStream(Exception):
    """A compressed shard does not decompress to its end: its part fails, naming the file."""


def broken_stream(path: str, suffix: str, e: BaseException) -> str:
    """Why a compressed shard's part (or its planning) failed: the file, and how to test it."""
    return (f"{path} does not read as {READERS[suffix][0]} to its end ({type(e).__name__}: {e}): a file cut short "
            "(a copy or download that stopped) or damaged; none of its documents is recorded. Test it with "
            f"`{READERS[suffix][0]} -t {shlex.quote(path)}`, replace it, then run the same command again")  # fmt: skip
