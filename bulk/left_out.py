"""What a directory or glob INPUT leaves out and a run names in a note (`LeftOut`): the directories a glob
matches, CSVs, Arrow files, files of no suffix or a numbered one, Parquet files under --format jsonl or
text, files that are not Parquet under --format parquet, other jobs' --out directories and links to listed
files; the notes themselves (`left_out_notes`), and `listed`, the short list of names they and the job's
other messages give."""

from __future__ import annotations

from dataclasses import dataclass, field


def listed(names: list[str], most: int = 5) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


# Each list of LeftOut that a run names in a note: what its entries are (one, several), why INPUT left
# them out, and what scores them. Listed in the order the notes are said.
_NOTES = (
    ("dirs", "directory the glob matches", "directories the glob matches",
     "as a glob takes the files it matches, not what lies under a directory it matches",
     "To take what is under them, give {globs}, or a directory itself as INPUT"),
    ("csvs", "CSV file(s)", "CSV file(s)", "as bulk does not read CSV",
     "To score one, convert it to Parquet (name the CSV as INPUT and bulk prints the one-line conversion): give "
     "the .parquet as INPUT, or write it under INPUT and the next run takes it"),
    ("arrows", "Arrow (or save_to_disk) file(s)", "Arrow (or save_to_disk) file(s)",
     "as bulk does not read Arrow IPC or Feather (a Hugging Face save_to_disk folder's state.json, "
     "dataset_info.json and dataset_dict.json are its metadata, not documents, and left out wherever they are)",
     "To score the Arrow files, convert them to Parquet (name one as INPUT and bulk prints the one-line "
     "conversion; a save_to_disk folder whole: datasets.load_from_disk(DIR).to_parquet(FILE)): give the .parquet "
     "as INPUT, or write it under INPUT and the next run takes it; the metadata stays left out"),
    ("bare", "file(s) of no suffix or a numbered one", "file(s) of no suffix or a numbered one",
     "as a directory takes its files by their suffix (.jsonl, .json, .ndjson, .parquet, .txt, in any case)",
     "To score them as JSON Lines, as a glob or a name reads such a file, give a glob that matches them as "
     "INPUT (DIR/part-*), or --format jsonl to read every file under the directory so"),
    ("parquets", "Parquet file(s)", "Parquet file(s)", "as --format reads every file as it says, and these are Parquet",
     "To score them, give them to a job of their own with --format parquet"),
    ("not_parquets", "file(s)", "file(s)", "as --format parquet reads every file as Parquet, and these are not",
     "To score them, give them to a job of their own without --format (or with --format jsonl or text)"),
    ("jobs", "directory", "directories", "as each holds a bulk job's outputs (its job.json)",
     "To score a file there, move it out of that directory"),
    ("links", "linked file(s)", "linked file(s)",
     "as each leads to a file INPUT lists under its own name, which is scored once, under that name",
     "Rows an earlier run scored under a link's name stay in scores/ but are not counted"),
)  # fmt: skip


@dataclass
class LeftOut:
    """What a directory or glob INPUT leaves out and a run names in a note (_NOTES): the directories a glob
    matches, CSVs, Arrow files, files of no suffix or a numbered one, Parquet files under --format jsonl or
    text, files not Parquet under --format parquet, other jobs' --out directories and links to listed files,
    relative to the input root, sorted."""

    dirs: list[str] = field(default_factory=list)  # that a glob matches
    dirs_globs: str = ""  # for `dirs`: the globs that take what is under them too
    csvs: list[str] = field(default_factory=list)
    arrows: list[str] = field(default_factory=list)  # and save_to_disk folders' metadata
    parquets: list[str] = field(default_factory=list)
    not_parquets: list[str] = field(default_factory=list)  # under --format parquet
    bare: list[str] = field(default_factory=list)  # of no suffix or a numbered one: part-00000
    jobs: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)


def left_out_notes(left: LeftOut) -> list[str]:
    """The notes a run prints of what INPUT left out (and a refusal for no input adds): for each kind, how
    many, why, which, and what scores them."""
    return [
        f"{len(names)} {one if len(names) == 1 else many} under INPUT left out, {why}: {listed(names)}. "
        + todo.format(globs=left.dirs_globs)
        for kind, one, many, why, todo in _NOTES
        if (names := getattr(left, kind))
    ]
