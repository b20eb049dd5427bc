"""BERT-style WordPiece tokenizers with the `tokenizers` library: train one, or load a vocab.txt / JSON.

The tokenizer.json written here is what the server loads (docs/formats.md), so two properties are
contracts, not details:

* the post-processor adds ``[CLS] ... [SEP]`` (pairs: ``[CLS] A [SEP] B [SEP]`` with type ids 0/1), so
  the server and training add special tokens the same way;
* offsets index the *original* string (the normalizer's lowercasing and accent stripping are tracked by
  `tokenizers` alignments), which is how the server maps per-token probabilities back to characters.

Padding and truncation are deliberately not stored in the file: they are decisions of whoever batches.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from training.errors import write_text_atomically

__all__ = [
    "SPECIAL_TOKENS",
    "TEXT_TOKENS",
    "SpecialIds",
    "TokenizerError",
    "load_tokenizer",
    "require_tokens",
    "save_tokenizer",
    "special_ids",
    "tokenizer_sha256",
    "train_wordpiece",
    "transformers_config",
    "transformers_reads_otherwise",
    "vocab_normalisation",
    "write_tokenizer_config",
]

# The order gives a trained vocab [PAD]=0 .. [MASK]=4. [PAD]=0 matches BERT (and pad_token_id=0 in
# ElectraConfig); the others sit at 100..103 in Google's vocab, which is fine: we always look them up.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# What tokenizing a text needs at all: words the vocabulary lacks become [UNK], each text is framed
# [CLS] ... [SEP]. Export and the server need no more (they pad with id 0 where [PAD] is missing), so a
# model whose vocabulary has no [MASK] can be exported; pretraining needs every SPECIAL_TOKENS entry.
TEXT_TOKENS = ("[UNK]", "[CLS]", "[SEP]")


class TokenizerError(ValueError):
    """A tokenizer file that cannot be used as a BERT-style WordPiece tokenizer."""


class SpecialIds(NamedTuple):
    pad: int
    unk: int
    cls: int
    sep: int
    mask: int


def _configure(
    tok: Tokenizer, lowercase: bool, strip_accents: bool | None = None, chinese_chars: bool = True
) -> Tokenizer:
    # strip_accents=None follows `lowercase`, as in BERT: uncased vocabularies were built on
    # accent-stripped text, cased ones were not.
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=chinese_chars, strip_accents=strip_accents, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def _add_post_processor(tok: Tokenizer) -> Tokenizer:
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return tok


# WordPiece's max_input_chars_per_word, the tokenizers default every tokenizer made here keeps (BERT's).
MAX_WORD_CHARS = 100


def train_wordpiece(
    texts: Iterable[str],
    vocab_size: int = 30522,
    lowercase: bool = True,
    *,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
    show_progress: bool = False,
) -> Tokenizer:
    """Train a WordPiece vocabulary on ``texts`` (documents or lines; any iterable of str).

    ``vocab_size`` defaults to BERT's 30,522. ``limit_alphabet`` keeps the 1,000 most frequent
    characters as in BERT's tokenizer trainer, so a stray rare glyph becomes [UNK] rather than taking a
    vocabulary slot.

    The result is a function of the text and the options alone, byte for byte across processes (the
    comments below say how); shards and checkpoints still record :func:`tokenizer_sha256`.
    """
    if vocab_size <= len(SPECIAL_TOKENS):
        raise TokenizerError(
            f"vocab_size must exceed the {len(SPECIAL_TOKENS)} special tokens, got {vocab_size}"
        )
    tok = _configure(Tokenizer(models.WordPiece(unk_token="[UNK]")), lowercase)
    words = _count_words(tok, texts, show_progress)
    # A word longer than WordPiece's max_input_chars_per_word is [UNK] whole in the tokenizer made here, so
    # it can give the vocabulary nothing; the trainer's time grows with its length squared (one 400k-character
    # hex dump: 105 s, deaf to Ctrl-C inside Rust; a 3 MB one, hours).
    long_words = [w for w in words if len(w) > MAX_WORD_CHARS]
    for w in long_words:
        del words[w]
    if long_words and show_progress:
        print(f"note: {len(long_words):,} distinct word(s) over {MAX_WORD_CHARS} characters (the longest "
              f"{max(map(len, long_words)):,}: a hash, a hex or base64 dump?) left out of the vocabulary: "
              "the tokenizer reads each as [UNK]", file=sys.stderr, flush=True)  # fmt: skip
    # limit_alphabet's own cut sorts equal counts in hash order: cut here (ties by code point) and
    # hand the trainer exactly the kept characters.
    chars: Counter[str] = Counter()
    for word, n in words.items():
        for c in word:
            chars[c] += n
    alphabet = sorted(sorted(chars, key=lambda c: (-chars[c], c))[:limit_alphabet])
    # The trainer numbers "##c" in the order it meets c inside a word while walking a hash map, and
    # equal-count merges are then taken in id order, so those ids decide which merges (hence which
    # tokens) win. Listing every "##c" it would create up front, sorted, fixes their ids; listing the
    # alphabet before them keeps its usual ids (and word-initial pairs first among ties).
    kept = set(alphabet)
    suffixes = sorted({"##" + c for word in words for c in word[1:] if c in kept})
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[*SPECIAL_TOKENS, *alphabet, *suffixes],
        limit_alphabet=len(alphabet),
        initial_alphabet=alphabet,
        continuing_subword_prefix="##",
        # The trainer's own bars (Rust's): on a terminal only, where they redraw in place.
        show_progress=show_progress and sys.stderr.isatty(),
    )
    # Train on the words themselves (already normalized and split by `tok`) so that the suffixes
    # above are computed from exactly what the trainer sees.
    counter = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    counter.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    counter.train_from_iterator((" ".join([w] * n) for w, n in words.items()), trainer=trainer)
    vocab = counter.get_vocab(with_added_tokens=False)
    stray = {t for t in vocab if t.startswith("##") and len(t) == 3} - set(suffixes)
    assert not stray, f"the trainer made suffixes not listed up front: {sorted(stray)[:5]}"
    # Rebuild with only the real special tokens registered as such (the others were listed as
    # "special" just to number them), as _from_vocab does for a vocab.txt.
    tok.model = models.WordPiece(vocab=vocab, unk_token="[UNK]", continuing_subword_prefix="##")
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return _add_post_processor(tok)


def _count_words(tok: Tokenizer, texts: Iterable[str], show_progress: bool) -> Counter[str]:
    """How often each word occurs once ``tok`` has normalized and pre-tokenized ``texts``, as the
    trainer counts them, but in Python: the trainer's own count is a hash map whose (per-process
    random) order decides ids and ties, see :func:`train_wordpiece`. The pass over the corpus: the
    longest part of training a vocabulary."""
    from training.progress import progress_bar, started

    normalize, split = tok.normalizer.normalize_str, tok.pre_tokenizer.pre_tokenize_str
    words: Counter[str] = Counter()
    texts = started(texts) if show_progress else texts
    with progress_bar(desc="counting words for the vocabulary", unit="doc", disable=not show_progress) as bar:
        for text in texts:
            words.update(w for w, _ in split(normalize(text)))
            bar.update(1)
    return words


def _readable(path: Path) -> None:
    """TokenizerError naming `path` where it cannot be opened: the readers' own errors took an unreadable
    file for a malformed one ("is not a tokenizers tokenizer.json (Permission denied)") or a traceback."""
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise TokenizerError(f"{path} cannot be read ({e.strerror or e}); make it readable, or give another "
                             "tokenizer") from None  # fmt: skip


def _from_vocab(path: Path, lowercase: bool, strip_accents: bool | None = None, chinese_chars: bool = True):
    _readable(path)
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.rstrip("\r\n") for line in f]
    except UnicodeDecodeError as e:  # a ValueError, but one that names neither the file nor what to do
        # Its offset is within the chunk the reader decoded (8 KB), not the file: decoded whole, it is.
        data, bad = path.read_bytes(), e
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as whole:
            bad = whole
        line = data[: bad.start].count(b"\n") + 1
        raise TokenizerError(f"{path} is not UTF-8 (line {line}, byte {bad.start}: {bad.reason}); save it as UTF-8, "
                             "as Hugging Face writes vocab.txt") from None  # fmt: skip
    # A token's id is its line number, and a token listed twice takes its last line, as Hugging Face's
    # load_vocab reads the file: the model's embedding rows follow those ids. The line left behind keeps
    # its id under a name no text can produce (white space splits it), so the ids stay contiguous.
    vocab = {token: i for i, token in enumerate(lines)}
    for i, token in enumerate(lines):
        if vocab[token] != i:
            vocab[f"[vocab.txt line {i + 1}, repeated on line {vocab[token] + 1}]"] = i
    model = models.WordPiece(vocab=vocab, unk_token="[UNK]", continuing_subword_prefix="##")
    tok = _configure(Tokenizer(model), lowercase, strip_accents, chinese_chars)
    require_tokens(tok, TEXT_TOKENS, path, _TEXT_TOKENS_WHY)
    # Registering them as special (ids unchanged, they are in the vocab) makes "[MASK]" in text one
    # token and lets decode() skip them, as the trainer does for a vocabulary it builds. Only those the
    # vocabulary has: registering a missing one would add it under a new id, a row the model lacks.
    tok.add_special_tokens([t for t in SPECIAL_TOKENS if t in vocab])
    return _add_post_processor(tok)


def _json_file(path: Path, default):
    """A JSON file of a Hugging Face directory, `default` where it is absent; a TokenizerError naming it."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else default
    except (ValueError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{path} does not read as JSON ({e})") from None
    except OSError as e:
        raise TokenizerError(f"{path} cannot be read ({e.strerror or e}); make it readable") from None
    if not isinstance(raw, dict):
        raise TokenizerError(f"{path} is not a JSON object")
    return raw


# The tokenizers a directory's vocab.txt is rebuilt as: BERT's WordPiece, after its splitting at white space
# and punctuation. transformers' ELECTRA tokenizers are BERT's under another name.
_WORDPIECE_CLASSES = ("BertTokenizer", "BertTokenizerFast", "ElectraTokenizer", "ElectraTokenizerFast")
_SAVE_TOKENIZER_JSON = ("save the model's own tokenizer as a tokenizer.json beside it (python -c \"from transformers "
                        "import AutoTokenizer; AutoTokenizer.from_pretrained('DIR').save_pretrained('DIR')\", where "
                        "its tokenizer has a fast version) and export again; a model whose tokenizer has none "
                        "cannot be exported")  # fmt: skip


def _check_wordpiece(cfg: dict, cfg_file: Path) -> None:
    """A TokenizerError where the directory's tokenizer_config.json (`cfg`, read from `cfg_file`) says its
    vocab.txt is not read as BERT reads one: built as BERT's, the bundle's tokenizer would split text
    otherwise than the model was trained on, and nothing downstream would notice."""
    cls = cfg.get("tokenizer_class")
    if cls is not None and cls not in _WORDPIECE_CLASSES:
        raise TokenizerError(f"{cfg_file}: tokenizer_class is {cls!r}, which does not tokenize as BERT's WordPiece "
                             f"({', '.join(_WORDPIECE_CLASSES)}), the only tokenizer a vocab.txt is read as here; "
                             f"{_SAVE_TOKENIZER_JSON}")  # fmt: skip
    if cfg.get("do_basic_tokenize", True) is False:
        raise TokenizerError(f"{cfg_file}: do_basic_tokenize is false, so the model's texts were not split at white "
                             "space and punctuation before WordPiece, as a tokenizer read from vocab.txt here "
                             f"always splits them; {_SAVE_TOKENIZER_JSON}")  # fmt: skip


class _Added(NamedTuple):
    token: object  # tokenizers.AddedToken
    id: int | None  # as the file gives it; None: the next free id
    where: str  # the file and key, for an error


def _added_tokens(directory: Path, cfg: dict) -> list[_Added]:
    """The tokens a Hugging Face directory adds to its vocab.txt, as transformers reads them: its
    tokenizer_config.json's added_tokens_decoder (every added token, with its id and flags) where it has one,
    else added_tokens.json (token: id; matched after normalisation, as transformers adds them); and the
    additional special tokens of tokenizer_config.json (`cfg`, as read) and special_tokens_map.json (matched
    as typed)."""
    from tokenizers import AddedToken

    cfg_file, map_file, json_file = (directory / n for n in ("tokenizer_config.json", "special_tokens_map.json",
                                                             "added_tokens.json"))  # fmt: skip
    flags = ("single_word", "lstrip", "rstrip", "normalized", "special")
    added: dict[str, _Added] = {}
    decoder = cfg.get("added_tokens_decoder")
    if decoder:
        where = f"{cfg_file}'s added_tokens_decoder"
        try:
            for i, entry in decoder.items():
                kw = {k: bool(entry[k]) for k in flags if k in entry}
                added[entry["content"]] = _Added(AddedToken(entry["content"], **kw), int(i), where)
        except (AttributeError, KeyError, TypeError, ValueError):
            raise TokenizerError(f"{where} is not id: {{\"content\": TOKEN, ...}} entries; restore it from the "
                                 "model's source") from None  # fmt: skip
    else:
        for token, i in _json_file(json_file, {}).items():
            if not isinstance(token, str) or not isinstance(i, int):
                raise TokenizerError(f"{json_file}: {token!r}: {i!r} is not a token and its id; restore it from "
                                     "the model's source")  # fmt: skip
            added[token] = _Added(AddedToken(token, normalized=True, special=False), i, str(json_file))
    for file, said in ((cfg_file, cfg), (map_file, _json_file(map_file, {}))):
        for key in ("additional_special_tokens", "extra_special_tokens"):
            listed = said.get(key) or []
            for entry in listed.values() if isinstance(listed, dict) else listed:
                token = entry.get("content") if isinstance(entry, dict) else entry
                if not isinstance(token, str):
                    raise TokenizerError(f"{file}: {key} holds {entry!r}, not a token; restore it from the model's "
                                         "source")  # fmt: skip
                known = added.get(token)
                added[token] = _Added(AddedToken(token, normalized=False, special=True),
                                      known.id if known else None, f"{file}'s {key}")  # fmt: skip
    return sorted(added.values(), key=lambda a: (a.id is None, a.id or 0))


def _with_added_tokens(tok: Tokenizer, directory: Path, cfg: dict) -> Tokenizer:
    """`tok` (the directory's vocab.txt) with the tokens it adds (_added_tokens) under the ids the model's
    embedding rows follow. A token of the vocabulary keeps its id; a new one takes the next, in id order, as
    transformers gives them: where a file says otherwise, no tokenizer built here would match the model."""
    for a in _added_tokens(directory, cfg):
        (tok.add_special_tokens if a.token.special else tok.add_tokens)([a.token])
        got = tok.token_to_id(a.token.content)
        if a.id is not None and got != a.id:
            raise TokenizerError(f"{a.where} gives {a.token.content!r} the id {a.id}, but read with "
                                 f"{directory / 'vocab.txt'} it takes {got} (a token of the vocabulary keeps its "
                                 "line, an added one the next free id, in id order); correct the id, or "
                                 f"{_SAVE_TOKENIZER_JSON}")  # fmt: skip
    return tok


def vocab_normalisation(directory: Path, lowercase: bool = True) -> dict:
    """How a Hugging Face directory normalises text (its vocab.txt, or its tokenizer.json's BertNormalizer
    where a tokenizer_config.json is beside it): its tokenizer_config.json's do_lower_case, strip_accents and tokenize_chinese_chars, as transformers reads
    them (BERT's defaults where it says nothing: `lowercase`, accents stripped with lowercasing, CJK
    characters split apart)."""
    return _normalisation(_json_file(directory / "tokenizer_config.json", {}), lowercase)


def _normalisation(cfg: dict, lowercase: bool) -> dict:
    strip = cfg.get("strip_accents")
    return {
        "lowercase": bool(cfg.get("do_lower_case", lowercase)),
        "strip_accents": None if strip is None else bool(strip),
        "chinese_chars": bool(cfg.get("tokenize_chinese_chars", True)),
    }


def load_tokenizer(path: str | os.PathLike[str], *, lowercase: bool = True) -> Tokenizer:
    """Load a tokenizer.json, a vocab.txt, or a directory holding either (tokenizer.json preferred), or a
    pretraining run's directory (its tokenizer/).

    ``lowercase`` only applies to a vocab.txt (a tokenizer.json carries its own normalizer): leave it True
    for uncased vocabularies such as bert-base-uncased, set it False for cased ones. A directory's
    tokenizer_config.json, where it has one, says instead (vocab_normalisation).
    """
    p = Path(path).expanduser()
    if p.is_dir():
        if (p / "tokenizer.json").is_file():
            return _as_config_says(load_tokenizer(p / "tokenizer.json"), p)
        if (p / "vocab.txt").is_file():
            cfg = _json_file(p / "tokenizer_config.json", {})  # read once: what splits, normalises and adds
            _check_wordpiece(cfg, p / "tokenizer_config.json")
            return _with_added_tokens(_from_vocab(p / "vocab.txt", **_normalisation(cfg, lowercase)), p, cfg)
        if _holds_a_tokenizer(
            p / "tokenizer"
        ):  # a pretraining run's directory: its tokenizer/ (as --init reads it)
            return load_tokenizer(p / "tokenizer", lowercase=lowercase)
        raise TokenizerError(f"{p} holds neither tokenizer.json nor vocab.txt")
    if not p.is_file():
        raise TokenizerError(
            f"no tokenizer at {p}: give a tokenizer.json, a vocab.txt or a directory with one"
        )
    if p.suffix == ".json":
        _readable(p)
        try:
            tok = Tokenizer.from_file(str(p))
        except Exception as e:  # tokenizers raises a bare Exception on malformed files
            raise TokenizerError(f"{p} is not a `tokenizers` tokenizer.json ({e})") from e
        require_tokens(tok, TEXT_TOKENS, p, _TEXT_TOKENS_WHY)  # at load time, naming the file
        # Hugging Face tokenizer.json files often carry truncation and fixed padding (all-MiniLM-L6-v2's
        # pads and cuts every text to 128): corpus tokenization and the server need neither.
        tok.no_truncation()
        tok.no_padding()
        if tok.post_processor is None:  # transformers' BERT tokenizers add [CLS] and [SEP] without one
            _add_post_processor(tok)
        return tok
    return _from_vocab(p, lowercase)


def _holds_a_tokenizer(directory: Path) -> bool:
    return (directory / "tokenizer.json").is_file() or (directory / "vocab.txt").is_file()


class CaseSetting(NamedTuple):
    """What decides whether load_tokenizer(path) lowercases text: "--lowercase" (its `lowercase` argument),
    "do_lower_case" (a tokenizer_config.json's, `file`) or "normalizer" (a tokenizer.json's own, `file`)."""

    by: str
    file: Path | None = None
    bert: bool = True  # for "normalizer": a BertNormalizer, whose "lowercase" field says it

    def says(self) -> str:
        """Where the setting is, for a sentence ("as ... says")."""
        if self.by == "--lowercase":
            return "--lowercase"
        if self.by == "do_lower_case":
            return f'"do_lower_case" in {self.file}'
        return f'the "normalizer" of {self.file}' + (' (its "lowercase")' if self.bert else "")

    def advice(self, lowercase: bool) -> str:
        """What to change for the tokenizer to lowercase text (`lowercase`) or to keep its case."""
        value = "true" if lowercase else "false"
        if self.by == "--lowercase":
            return f"give --lowercase {value}"
        if self.by == "do_lower_case":
            return f'set "do_lower_case": {value} in {self.file}'
        if self.bert:
            return f'set "lowercase": {value} in the "normalizer" of {self.file}'
        return (f'give {self.file} a "normalizer" that lowercases (a Lowercase step)' if lowercase else
                f'take the lowercasing out of the "normalizer" of {self.file}')  # fmt: skip


def case_setting(path: str | os.PathLike[str]) -> CaseSetting:
    """What decides whether load_tokenizer(path) lowercases, read the way it reads `path` (keep the two in
    step): a vocab.txt, alone or in a directory whose tokenizer_config.json has no do_lower_case, takes
    `lowercase` (--lowercase); that file's do_lower_case otherwise, and beside a tokenizer.json whose
    normalizer is BERT's (_as_config_says); any other tokenizer.json, its own normalizer."""
    p = Path(path).expanduser()
    if p.is_dir():
        config = p / TOKENIZER_CONFIG
        if (p / "tokenizer.json").is_file():
            norm = _json_file(p / "tokenizer.json", {}).get("normalizer") or {}
            if config.is_file() and norm.get("type") == "BertNormalizer":
                return CaseSetting("do_lower_case", config)
            return CaseSetting("normalizer", p / "tokenizer.json", norm.get("type") == "BertNormalizer")
        if (p / "vocab.txt").is_file():
            said = "do_lower_case" in _json_file(config, {})
            return CaseSetting("do_lower_case", config) if said else CaseSetting("--lowercase")
        if _holds_a_tokenizer(p / "tokenizer"):
            return case_setting(p / "tokenizer")
    if p.suffix == ".json":
        norm = _json_file(p, {}).get("normalizer") or {}
        return CaseSetting("normalizer", p, norm.get("type") == "BertNormalizer")
    return CaseSetting("--lowercase")


def _as_config_says(tok: Tokenizer, directory: Path) -> Tokenizer:
    """`tok` (the directory's tokenizer.json) normalising text as transformers reads the directory: where it
    has a tokenizer_config.json, that file's do_lower_case, strip_accents and tokenize_chinese_chars, with
    BERT's defaults for what it leaves out, replace its BertNormalizer's (transformers rebuilds the
    normalizer so, and the model was trained on what that gives). Without one, the file as it is."""
    state = json.loads(tok.to_str()).get("normalizer") or {}
    if not (directory / "tokenizer_config.json").is_file() or state.get("type") != "BertNormalizer":
        return tok
    said = vocab_normalisation(directory)
    want = {"lowercase": said["lowercase"], "strip_accents": said["strip_accents"],
            "handle_chinese_chars": said["chinese_chars"]}  # fmt: skip
    if all(state.get(k) == v for k, v in want.items()):
        return tok
    state.pop("type")
    tok.normalizer = normalizers.BertNormalizer(**{**state, **want})
    return tok


def transformers_reads_otherwise(directory: Path) -> str | None:
    """What transformers does otherwise with a directory's tokenizer.json than training does, or None. With no
    tokenizer_config.json beside it, training takes the file as it is (our checkpoints saved before they
    carried one, cased ones included, were trained so), while transformers reads it as BERT's tokenizer with
    BERT's defaults (lowercased, accents stripped, CJK characters split), whatever the file's normalizer."""
    if not (directory / "tokenizer.json").is_file() or (directory / TOKENIZER_CONFIG).is_file():
        return None
    norm = json.loads(load_tokenizer(directory / "tokenizer.json").to_str()).get("normalizer") or {}
    if norm.get("type") != "BertNormalizer":
        return None
    keeps = []
    if not norm["lowercase"]:
        keeps.append("case")
    strips = norm["lowercase"] if norm["strip_accents"] is None else norm["strip_accents"]
    if not strips:
        keeps.append("accents")
    if not norm["handle_chinese_chars"]:
        keeps.append("CJK characters unsplit")
    if not keeps:
        return None
    cfg = _config_fields(norm)
    return (f"tokenizer.json keeps {' and '.join(keeps)}, and no tokenizer_config.json is beside it: the bundle "
            "tokenizes as the file says (as training read it), while transformers' AutoTokenizer reads that "
            "directory with BERT's defaults (lowercased, accents stripped), so its ids differ from the bundle's "
            "on such text. If the model was trained on the file as it is (our checkpoints saved before they "
            f"carried a tokenizer_config.json), the bundle is right: write a tokenizer_config.json of {json.dumps(cfg)} "
            "beside it for transformers to agree; if it was trained lowercased, write one with do_lower_case "
            "true and export again")  # fmt: skip


TOKENIZER_CONFIG = "tokenizer_config.json"
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", TOKENIZER_CONFIG)  # what save_tokenizer writes


def fits_model(tokens: int, vocab_size: int) -> bool:
    """Whether a tokenizer of `tokens` can be a model's of `vocab_size` rows: not more (ids past the rows
    index nothing), and not under half (another model's, or one built wrongly: most words would be
    [UNK]); a vocabulary padded to a round size, or a few added tokens, fits."""
    return vocab_size // 2 <= tokens <= vocab_size


def copy_tokenizer(source: Path, directory: Path) -> None:
    """A saved tokenizer's files from `source` into `directory` (which must exist), as they are: every
    checkpoint carries its own, since its embedding rows are indexed by the tokenizer's ids. A tokenizer saved
    before tokenizer_config.json was written (a run resumed) gets one made from its tokenizer.json."""
    for name in TOKENIZER_FILES:
        if name == TOKENIZER_CONFIG and not (source / name).is_file():
            write_tokenizer_config(load_tokenizer(source / "tokenizer.json"), directory)
            continue
        (directory / name).write_bytes((source / name).read_bytes())


def save_tokenizer(tok: Tokenizer, directory: str | os.PathLike[str]) -> Path:
    """Write ``tokenizer.json``, ``vocab.txt`` and ``tokenizer_config.json`` into ``directory`` (created if
    needed); return it."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    vocab = tok.get_vocab(with_added_tokens=True)
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    # vocab.txt encodes ids as line numbers, so the ids must be exactly 0..n-1.
    assert [i for _, i in by_id] == list(range(len(by_id))), "vocabulary ids are not contiguous"
    # Each file whole or not at all: every rank, and a resume, reads what rank 0 wrote here.
    write_text_atomically(d / "tokenizer.json", tok.to_str(pretty=True))
    write_text_atomically(d / "vocab.txt", "".join(f"{t}\n" for t, _ in by_id))
    write_tokenizer_config(tok, d)
    return d


def write_tokenizer_config(tok: Tokenizer, directory: Path) -> None:
    """``tokenizer_config.json`` for `tok` in `directory`: without one, transformers reads a directory whose
    config.json is ELECTRA's with BERT's tokenizer and do_lower_case true, rebuilding the normalizer, so a
    cased tokenizer.json came out lowercased there and a checkpoint did not load in transformers unchanged."""
    write_text_atomically(directory / TOKENIZER_CONFIG, json.dumps(transformers_config(tok), indent=2) + "\n")


# BERT's tokens under transformers' names for them: what its tokenizers pad, mask and frame texts with.
_SPECIAL_NAMES = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                  "mask_token": "[MASK]"}  # fmt: skip


def transformers_config(tok: Tokenizer) -> dict:
    """What a tokenizer_config.json says for AutoTokenizer to give `tok`'s ids. transformers' ElectraTokenizer
    rebuilds BERT's tokenizer from the vocabulary and the normalisation said here, so it is named only for a
    tokenizer of that shape; any other is named PreTrainedTokenizerFast, which takes tokenizer.json as it is.
    The normalisation is written either way: our own reader (_as_config_says) follows it."""
    state = json.loads(tok.to_str())
    norm = state.get("normalizer") or {}
    said = _config_fields(norm) if norm.get("type") == "BertNormalizer" else {}
    specials = {name: t for name, t in _SPECIAL_NAMES.items() if tok.token_to_id(t) is not None}
    cls = "ElectraTokenizer" if said and _bert_shaped(state) else "PreTrainedTokenizerFast"
    return {"tokenizer_class": cls, **said, **specials}


def _config_fields(norm: dict) -> dict:
    """A BertNormalizer's settings (its JSON state) under tokenizer_config.json's names for them."""
    return {"do_lower_case": norm["lowercase"], "strip_accents": norm["strip_accents"],
            "tokenize_chinese_chars": norm["handle_chinese_chars"]}  # fmt: skip


def _bert_shaped(state: dict) -> bool:
    """Whether a tokenizer (its JSON `state`) is what transformers' BertTokenizer builds from its vocabulary:
    BertNormalizer cleaning text, BERT's pre-tokenizer, WordPiece with its defaults, no tokens added beyond
    the vocabulary and no other special tokens."""
    model = state.get("model") or {}
    vocab = model.get("vocab") or {}
    return (
        state["normalizer"].get("clean_text") is True
        and (state.get("pre_tokenizer") or {}).get("type") == "BertPreTokenizer"
        and model.get("type") == "WordPiece"
        and model.get("unk_token") == "[UNK]"
        and model.get("continuing_subword_prefix") == "##"
        and model.get("max_input_chars_per_word") == 100
        and all(
            a["content"] in vocab and a["content"] in _SPECIAL_NAMES.values()
            for a in state.get("added_tokens", [])
        )
    )


_TEXT_TOKENS_WHY = "every text is framed by [CLS] and [SEP], and a word the vocabulary lacks becomes [UNK]"


def require_tokens(
    tok: Tokenizer, tokens: Iterable[str], where: str | os.PathLike[str] | None, why: str
) -> list[int]:
    """The ids of `tokens`, or a TokenizerError naming `where` (the tokenizer's file), what lacks, `why` it is
    needed and how to add it."""
    tokens = list(tokens)
    ids = [tok.token_to_id(t) for t in tokens]
    missing = [t for t, i in zip(tokens, ids, strict=True) if i is None]
    if missing:
        raise TokenizerError(
            f"{where or 'the tokenizer'} lacks the special token(s) {', '.join(missing)}, needed because {why}: "
            "add them to its vocabulary (a line each in vocab.txt; in a tokenizer.json, in model.vocab and "
            "added_tokens), in place of unused entries such as [unused0] where a model's embedding rows follow "
            "its ids, or give a tokenizer that has them"
        )
    return ids


def special_ids(tok: Tokenizer, where: str | os.PathLike[str] | None = None) -> SpecialIds:
    """All of SPECIAL_TOKENS' ids: pretraining's needs (`where`: the tokenizer's file, for the error)."""
    why = "pretraining masks words with [MASK], pads rows with [PAD] and frames texts by [CLS] and [SEP]"
    return SpecialIds(*require_tokens(tok, SPECIAL_TOKENS, where, why))


def punctuation_ids(tok: Tokenizer) -> list[int]:
    """Vocabulary entries with no letter and no digit (".", "##,", "--"), special tokens excluded: what
    a detector that flags words, never punctuation, need not be trained to flag."""
    specials = {tok.token_to_id(t) for t in SPECIAL_TOKENS}
    return sorted(
        i for t, i in tok.get_vocab().items() if i not in specials and not any(c.isalnum() for c in t)
    )


def tokenizer_sha256(tok: Tokenizer) -> str:
    """A fingerprint of everything that decides ids (vocab, normalizer, ...): shards and checkpoints
    record it so data tokenized with one tokenizer is never fed to a model trained with another."""
    return hashlib.sha256(tok.to_str().encode("utf-8")).hexdigest()
