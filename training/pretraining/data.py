"""The data builder of a pretraining run: tokenizer and token shards, made once by rank 0 and read by
every rank. The tokenizer is loaded here, once, and handed to whatever else needs it."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
from tokenizers import Tokenizer

import options
from training.data import derived
from training.data.batches import Batches, PackedDataset
from training.data.corpus import CorpusError, corpus_key, read_corpus
from training.data.corpus_sources import corpus_files_note, registry_shadows
from training.data.packers import RowMix
from training.data.shards import META_FILE, ShardInfo, ShardsError, build_shards, rows_digest
from training.data.tokenizer import TokenizerError, special_ids
from training.data.tokenizer_loading import CaseSetting, case_setting, load_tokenizer
from training.data.tokenizer_saving import save_tokenizer
from training.data.tokenizer_training import train_wordpiece


class Specials(NamedTuple):
    pad: int
    cls: int
    sep: int
    mask: int
    vocab_size: int


class PretrainingData(NamedTuple):
    tokenizer_dir: Path  # tokenizer.json and vocab.txt, copied into every checkpoint
    tokenizer: Tokenizer
    specials: Specials
    train: Batches  # this rank's training batches
    valid_batches: Callable[[], Batches]  # a fresh iterator each call, always in the same order
    identity: dict  # what identifies each split's rows (shards_identity), kept in every checkpoint; rank 0's


def _documents(cfg, split: str):
    """The corpus's documents, opened only when read: shards already built the same way (carried to an
    offline machine: benchmarks/gpucheck/detector.py) are reused without the corpus files being there."""
    yield from read_corpus(cfg.corpus, split, data_dir=cfg.data_dir, progress=True, **_user_options(cfg))


def _user_options(cfg) -> dict:
    """How a corpus of the user's own files is read: the JSONL key and the held-out share."""
    return {"text_field": cfg.text_field, "valid_fraction": cfg.valid_fraction}


def lowercases(tok: Tokenizer) -> bool:
    """Whether the tokenizer lowercases text, as its normaliser does (a tokenizer.json's own, or what a
    vocab.txt was loaded with)."""
    return tok.normalizer is not None and tok.normalizer.normalize_str("A") == "a"


def with_given_tokenizer(cfg):
    """With --tokenizer PATH (or --init's), the run's vocab_size and lowercase are that tokenizer's, so the
    config it prints and saves says what the model has. --vocab-size sizes a vocabulary the run trains, and
    --lowercase applies to a bare vocab.txt: a tokenizer.json has its own normaliser, and a directory's
    tokenizer_config.json says instead. A recipe file's --vocab-size gives way in silence (it sizes the
    recipe's runs that train one); a flag's, and any given --lowercase, with a note."""
    if cfg.tokenizer == "train":
        return cfg
    own = Path(cfg.out) / "tokenizer" / "tokenizer.json"  # a resume trains with the run's copy
    path = own if cfg.resume and own.is_file() else cfg.tokenizer
    tok = load_tokenizer(path, lowercase=cfg.lowercase)
    given = options.sources(cfg)
    lowercase = lowercases(tok)
    size = cfg.vocab_size if cfg.init else tok.get_vocab_size()  # --init's size came with its shape
    if size != cfg.vocab_size and given.get("vocab_size") == "--vocab-size":
        options.say_once(f"note: --vocab-size {cfg.vocab_size} sizes a vocabulary the run trains; --tokenizer "
                         f"{cfg.tokenizer} has {size} tokens, which the model takes")  # fmt: skip
    if lowercase != cfg.lowercase and given.get("lowercase") not in (None, "the saved config"):
        options.say_once(f"note: {given['lowercase']} sets lowercase {str(cfg.lowercase).lower()}, which is not "
                         f"used: the tokenizer {path} {'lowercases' if lowercase else 'keeps case'} as "
                         f"{case_setting(path).says()} says, and the run follows it")  # fmt: skip
    return options.replace(cfg, lowercase=lowercase, vocab_size=size)


def corpus_tokenizer(corpus: str, vocab_size: int, lowercase: bool, data_dir: str | None,
                     **user_options) -> Tokenizer:  # fmt: skip
    """A WordPiece vocabulary trained on the corpus's train split; for a registry corpus, the one an
    earlier run trained with the same options when the machine's cache has it (training/data/derived.py)."""

    def train() -> Tokenizer:
        print(f"training a {vocab_size}-token WordPiece vocabulary on {corpus} ...", flush=True)
        docs = read_corpus(corpus, "train", data_dir=data_dir, progress=True, **user_options)
        return train_wordpiece(docs, vocab_size=vocab_size, lowercase=lowercase, show_progress=True)

    return derived.trained_tokenizer(corpus, vocab_size, lowercase, train)


def _shards(cfg, split: str, tok: Tokenizer, out: Path, mix: RowMix | None) -> ShardInfo:
    # A resume trains on the run's own shards; a new start on its corpus, not on what a start that failed
    # in this --out left from another one.
    source = None if cfg.resume else corpus_key(cfg.corpus, split, **_user_options(cfg))

    def build(directory: Path) -> ShardInfo:
        return build_shards(_documents(cfg, split), tok, cfg.seq_len, directory, desc=f"tokenizing {split}",
                            mix=mix, source=source)  # fmt: skip

    return derived.shards(
        cfg.corpus, split, tok, cfg.seq_len, mix.describe() if mix else "packed", out, build
    )


def shards_identity(info: ShardInfo) -> dict:
    """What a checkpoint records of a split's shards: a resume that makes them again (its data/ deleted)
    must make the same rows, not rows of a corpus edited since."""
    return {"digest": rows_digest(info), "rows": info.rows, "tokens": info.tokens}


def build_data(cfg, run: Path, env, trained_on: dict | None = None) -> PretrainingData:
    """Tokenizer (trained, given or the run's own on a resume) and the train/valid shards under `run`;
    rank 0 makes them while the others wait. `trained_on`: a resumed run's shards_identity of each
    split, as its checkpoint recorded it (None: not recorded, or a new run)."""
    tok_dir = run / "tokenizer"
    grouped = cfg.rows == "requests"
    mix = RowMix(cfg.sentence_rows, cfg.few_sentence_rows, cfg.seed) if grouped else None
    failure, identity = None, {}
    if env.main:
        try:
            identity = _tokenizer_and_shards(cfg, run, env, tok_dir, mix, trained_on)
        except Exception as e:  # said by setup; the other ranks stop too, not wait at the barrier for ever
            failure = e
    # The others wait here for as long as rank 0 takes, until it has written what they read: a barrier too.
    if env.rank_0_failed(failure is not None):
        if failure is not None:
            raise failure
        env.exit_behind_rank_0(1)  # rank 0 says why
    env.stop_together(_unseen_by(env, tok_dir, run), options.EXIT_USAGE)
    tok = load_tokenizer(tok_dir / "tokenizer.json")
    ids = special_ids(tok)
    specials = Specials(ids.pad, ids.cls, ids.sep, ids.mask, tok.get_vocab_size())
    train = Batches(PackedDataset(run / "data" / "train"), cfg.batch_size, cfg.seed, env.rank, env.world,
                    group_by_length=grouped)  # fmt: skip
    valid = PackedDataset(run / "data" / "valid")

    def valid_batches() -> Batches:  # global batches on every rank: evaluate gives each rank its share
        return Batches(
            valid, min(cfg.batch_size * env.world, len(valid)), cfg.seed, 0, 1, group_by_length=grouped
        )

    return PretrainingData(tok_dir, tok, specials, train, valid_batches, identity)


def _unseen_by(env, tok_dir: Path, run: Path) -> str | None:
    """The refusal where a process cannot see what rank 0 wrote (None where every one can), for rank 0 to
    say: every rank reads --out, on another node only through storage they share."""
    missing = [p for p in (tok_dir / "tokenizer.json", run / "data" / "train") if not p.exists()]
    unseen = env.gather(str(missing[0]) if missing else None)
    blind = [str(rank) for rank, path in enumerate(unseen) if path]
    if not blind:
        return None
    who = f"process {blind[0]}" if len(blind) == 1 else f"processes {', '.join(blind)}"
    return (f"error: {who} cannot see {next(p for p in unseen if p)}, which process 0 wrote: every process of a run "
            "reads --out, so on several machines it must be on storage they all mount (a shared filesystem); "
            "give such a --out")  # fmt: skip


def _tokenizer_and_shards(cfg, run: Path, env, tok_dir: Path, mix, trained_on: dict | None) -> dict:
    """Rank 0's part of build_data: the tokenizer saved in the run, and the train/valid shards; their
    shards_identity, taken once per split (shards older than the digest field hash all of tokens.bin)."""
    identity, changed = {}, None
    if note := corpus_files_note(cfg.corpus):
        print(f"corpus: {note}", flush=True)
    if note := registry_shadows(cfg.corpus, cfg.out):
        print(f"note: {note}", file=sys.stderr, flush=True)
    # The run's own tokenizer on a resume; a new run makes it as its options say, whatever a start that
    # failed before its first checkpoint left there (another corpus's, or another --vocab-size's).
    if cfg.resume and (tok_dir / "tokenizer.json").is_file():
        tok = load_tokenizer(tok_dir / "tokenizer.json")
    elif cfg.tokenizer == "train":
        tok = corpus_tokenizer(cfg.corpus, cfg.vocab_size, cfg.lowercase, cfg.data_dir, **_user_options(cfg))
    else:
        tok = load_tokenizer(cfg.tokenizer, lowercase=cfg.lowercase)
        # Loading asks only what tokenizing needs; pretraining needs [PAD] and [MASK] too.
        special_ids(tok, cfg.tokenizer)
    if cfg.tokenizer == "train" and not cfg.resume and tok.get_vocab_size() > cfg.vocab_size:
        print(f"note: the trained vocabulary holds {tok.get_vocab_size()} tokens, more than --vocab-size {cfg.vocab_size}: "
              "WordPiece keeps every character the corpus uses; the model takes them all", file=sys.stderr, flush=True)  # fmt: skip
    if cfg.tokenizer == "train" and not cfg.resume and tok.get_vocab_size() < cfg.vocab_size:
        # Said here, once: the options printed at start and saved keep the size asked for, and only the
        # as_run line showed the model's.
        print(f"note: the trained vocabulary holds {tok.get_vocab_size()} tokens, fewer than --vocab-size {cfg.vocab_size}: "
              "the corpus has too few distinct words for more (WordPiece makes tokens of the pieces a corpus repeats, "
              f"and ran out of them); the model takes {tok.get_vocab_size()} (as_run's vocab_size in config.json), and a larger "
              "corpus gives more", file=sys.stderr, flush=True)  # fmt: skip
    save_tokenizer(tok, tok_dir)
    for split in ("train", "valid"):
        made = not (run / "data" / split / META_FILE).is_file()
        info = _shards(cfg, split, tok, run / "data" / split, mix)
        identity[split] = shards_identity(info)
        if cfg.resume and not made and not changed and (changed := _corpus_changed(cfg, split, info)):
            print(changed, file=sys.stderr, flush=True)
        if trained_on and split in trained_on:
            _check_same_rows(cfg, run / "data" / split, identity[split], trained_on[split], made)
        # The text a run learns from, and how many times the schedule shows it each token.
        unk = unk_share(info, special_ids(tok).unk) if split == "train" else None
        print(f"{split} data: {info.tokens:,} tokens of text in {info.rows:,} rows from {info.documents:,} "
              f"documents ({cfg.corpus})" + (f"; [UNK]: {unk:.2%} of them" if unk is not None else ""),
              flush=True)  # fmt: skip
        source = None if cfg.tokenizer == "train" else cfg.tokenizer
        if unk is not None and (warning := unk_warning(unk, tok, source, cfg.resume)):
            print(warning, file=sys.stderr, flush=True)
        if split == "train" and info.tokens:
            seen = cfg.max_steps * cfg.batch_size * cfg.grad_accum * env.world * info.tokens / info.rows
            times = f"{seen / info.tokens:.2g}" if seen < 10 * info.tokens else f"{seen / info.tokens:,.0f}"
            print(f"the schedule's {cfg.max_steps:,} steps see about {seen:,.0f} of them: each about {times} "
                  "times (--max-minutes may stop it sooner)", flush=True)  # fmt: skip
    return identity


# A vocabulary made for the text leaves a few [UNK]s in ten thousand tokens (0.03% on WikiText-2 with
# bert-base-uncased); one that does not fit it (a cased text through an uncased vocabulary kept cased),
# many times more, and the model learns little from a word it sees as [UNK].
UNK_WARN_SHARE = 0.01


def unk_share(info: ShardInfo, unk: int) -> float:
    """The share of the shards' text tokens that are [UNK] (read in blocks: flat memory)."""
    ds, count = PackedDataset(info.path), 0
    for start in range(0, len(ds), 65536):
        count += int(np.count_nonzero(ds[start : start + 65536] == unk))
    return count / info.tokens if info.tokens else 0.0


def unk_warning(share: float, tok: Tokenizer, source: str | None = None, resume: bool = False) -> str | None:
    """What to do where a share over UNK_WARN_SHARE of the training text is [UNK] (None below it), naming the
    likely cause: a vocabulary cased one way and text normalised the other. `source`: the tokenizer's path
    as given (--tokenizer, or --init's; None: trained, or a vocab.txt), for the advice to name what decides
    its case there (--lowercase, a tokenizer_config.json's do_lower_case or a tokenizer.json's normalizer);
    `resume`: a resume, which keeps the run's own tokenizer, so the change is for a new run."""
    if share <= UNK_WARN_SHARE:
        return None
    words = [
        t for t in tok.get_vocab() if not (t.startswith("[") and t.endswith("]")) and any(map(str.isalpha, t))
    ]
    cased = sum(any(map(str.isupper, t)) for t in words) > 0.01 * len(words)
    said = (
        f"warning: {share:.1%} of the training text's tokens are [UNK], words its vocabulary has no token for"
    )
    if lowercases(tok) == cased:
        try:  # on a resume the file given at the start may have moved since: the advice is a guess then
            setting = case_setting(source) if source else CaseSetting("--lowercase")
        except TokenizerError:
            setting = CaseSetting("--lowercase")
        fix = setting.advice(lowercase=not cased)
        if resume:  # the run's tokenizer and shards stay as they are: --lowercase is refused, an edit unread
            fix += (" to a new run (another --out)" if setting.by == "--lowercase" else
                    ", then start a new run (another --out)") + ": a resume keeps the run's own tokenizer"  # fmt: skip
        if cased:
            return (f"{said}: the tokenizer lowercases but the vocabulary is cased (such as bert-base-cased): "
                    f"{fix}")  # fmt: skip
        return (f"{said}: the tokenizer keeps case but the vocabulary has no capital letters (an uncased one, such "
                f"as bert-base-uncased): {fix}")  # fmt: skip
    return (f"{said}: it was made for other text (another language or script?): give a vocabulary made for "
            "this corpus, or train one on it (--tokenizer train)")  # fmt: skip


def _corpus_changed(cfg, split: str, info: ShardInfo) -> str | None:
    """A resume's note where the --corpus files are not what the run's shards of `split` were built from (their
    source: corpus_key, the files' paths, sizes and modification times): the run goes on with the shards it
    stored, as it started, and only a new run reads the corpus as it is now. None where they are the same, the
    shards predate the record, or the files cannot be looked at (gone: the shards are all a resume needs)."""
    if not info.source:
        return None
    try:
        now = corpus_key(cfg.corpus, split, **_user_options(cfg))
    except (CorpusError, OSError):
        return None
    if now == info.source:
        return None
    return (f"note: --resume: the corpus files ({cfg.corpus}) changed since the run built its shards (other files, "
            f"or a size or modification time differs); the run keeps training on its stored shards "
            f"({Path(info.path).parent}), as it started: to train on the changed corpus, start a new run with "
            "another --out")  # fmt: skip


def _check_same_rows(cfg, directory: Path, now: dict, then: dict, made: bool) -> None:
    """A resume's shards (`now`, their shards_identity) against what its checkpoint recorded of the run's
    (`then`): made again from a corpus edited since, they would continue the run on other text (in
    silence, where the rows came out as many)."""
    if now["digest"] == then.get("digest"):
        return
    has = f"{now['rows']:,} rows ({now['tokens']:,} tokens of text)"
    was = f"{then.get('rows', 0):,} rows ({then.get('tokens', 0):,})"
    if made:  # not left as if they were the run's: the next resume makes them again from the corpus
        shutil.rmtree(directory, ignore_errors=True)
        raise ShardsError(f"--resume: the corpus changed since the run started: {cfg.corpus} now makes {has} of "
                          f"{directory.name} data where the run trained on {was}. Restore it as it was and resume "
                          "again (its data is made again from it), or start a new run with another --out")  # fmt: skip
    raise ShardsError(f"--resume: {directory} holds {has}, not the {was} the run trained on: delete it, restore the "
                      f"corpus the run started with ({cfg.corpus}) and resume again")  # fmt: skip
