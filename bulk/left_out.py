"""What a directory or glob INPUT leaves out and a run names in a note (`LeftOut`): CSVs, Parquet files under
--format jsonl or text, files that are not Parquet under --format parquet, other jobs' --out directories and
links to listed files; the notes themselves (`left_out_notes`), and `listed`, the short list of names they and
the job's other messages give."""

from __future__ import annotations

from dataclasses import dataclass, field


def listed(names: list[str], most: int = 5) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def csv_note(names: list[str]) -> str:
    """What a run says of the CSVs a directory INPUT left out: which, and how to have them scored."""
    return (f"{len(names)} CSV file(s) under INPUT left out, as bulk does not read CSV: {listed(names)}. To "
            "score one, convert it to Parquet (name the CSV as INPUT and bulk prints the one-line conversion): "
            "give the .parquet as INPUT, or write it under INPUT and the next run takes it")  # fmt: skip


def jobs_note(names: list[str]) -> str:
    """What a run says of the directories under INPUT it left out as other jobs' outputs."""
    return (f"{len(names)} director{'y' if len(names) == 1 else 'ies'} under INPUT left out, as each holds a bulk "
            f"job's outputs (its job.json): {listed(names)}. To score a file there, move it out of that "
            "directory")  # fmt: skip


def parquet_note(names: list[str]) -> str:
    """What a run says of the Parquet files a directory INPUT left out under --format jsonl or text."""
    return (f"{len(names)} Parquet file(s) under INPUT left out, as --format reads every file as it says, and "
            f"these are Parquet: {listed(names)}. To score them, give them to a job of their own with --format "
            "parquet")  # fmt: skip


def not_parquet_note(names: list[str]) -> str:
    """What a run says of the files a directory INPUT left out under --format parquet, not being Parquet."""
    return (f"{len(names)} file(s) under INPUT left out, as --format parquet reads every file as Parquet, and "
            f"these are not: {listed(names)}. To score them, give them to a job of their own without --format "
            "(or with --format jsonl or text)")  # fmt: skip


def links_note(names: list[str]) -> str:
    """What a run says of the linked files it left out as duplicates of shards listed under their own names."""
    return (f"{len(names)} linked file(s) under INPUT left out, as each leads to a file INPUT lists under its own "
            f"name, which is scored once, under that name: {listed(names)}. Rows an earlier run scored under a "
            "link's name stay in scores/ but are not counted")  # fmt: skip


@dataclass
class LeftOut:
    """What a directory or glob INPUT leaves out and a run names in a note: CSVs (`csv_note`), Parquet files
    under --format jsonl or text (`parquet_note`), other jobs' --out directories (`jobs_note`) and links to
    listed files (`links_note`), relative to the input root, sorted."""

    csvs: list[str] = field(default_factory=list)
    parquets: list[str] = field(default_factory=list)
    not_parquets: list[str] = field(default_factory=list)  # under --format parquet (`not_parquet_note`)
    jobs: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)


def left_out_notes(left: LeftOut) -> list[str]:
    """The notes a run prints of what INPUT left out (and a refusal for no input adds)."""
    return (
        ([csv_note(left.csvs)] if left.csvs else [])
        + ([parquet_note(left.parquets)] if left.parquets else [])
        + ([not_parquet_note(left.not_parquets)] if left.not_parquets else [])
        + ([jobs_note(left.jobs)] if left.jobs else [])
        + ([links_note(left.links)] if left.links else [])
    )
