"""Loading a tokenizer from a tokenizer.json, a vocab.txt, a Hugging Face directory or a pretraining run's
directory (load_tokenizer), normalising text as that directory's tokenizer_config.json says; and what decides
whether it lowercases (case_setting), read the same way, kept beside it so the two stay in step."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple

from tokenizers import Tokenizer, models, normalizers

from training.data.tokenizer import (
    SPECIAL_TOKENS,
    TEXT_TOKENS,
    TokenizerError,
    _add_post_processor,
    _configure,
    require_tokens,
)

__all__ = ["load_tokenizer", "vocab_normalisation"]

TOKENIZER_CONFIG = "tokenizer_config.json"

_TEXT_TOKENS_WHY = "every text is framed by [CLS] and [SEP], and a word the vocabulary lacks becomes [UNK]"


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
        # utf-8-sig: a byte-order mark an editor wrote first made "\ufeff[PAD]" the token of id 0, and the
        # file was refused as lacking [PAD].
        with open(path, encoding="utf-8-sig") as f:
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


class _Source(NamedTuple):
    """The file a tokenizer is read from, and the Hugging Face directory it was found in (None: given as a
    file, so no tokenizer_config.json speaks for it)."""

    file: Path
    directory: Path | None

    @property
    def is_json(self) -> bool:
        return self.file.suffix == ".json"  # found in a directory: its tokenizer.json, else its vocab.txt


def _source(path: str | os.PathLike[str]) -> _Source:
    """Where load_tokenizer reads `path` from: a tokenizer.json or vocab.txt given as a file; a directory's
    tokenizer.json, else its vocab.txt; a pretraining run's directory's tokenizer/ (as --init reads it).
    The one walk both load_tokenizer and case_setting take, so that what one loads the other describes."""
    p = Path(path).expanduser()
    if p.is_dir():
        for name in ("tokenizer.json", "vocab.txt"):
            if (p / name).is_file():
                return _Source(p / name, p)
        if _holds_a_tokenizer(p / "tokenizer"):
            return _source(p / "tokenizer")
        raise TokenizerError(f"{p} holds neither tokenizer.json nor vocab.txt")
    if not p.is_file():
        raise TokenizerError(
            f"no tokenizer at {p}: give a tokenizer.json, a vocab.txt or a directory with one"
        )
    return _Source(p, None)


def load_tokenizer(path: str | os.PathLike[str], *, lowercase: bool = True) -> Tokenizer:
    """Load a tokenizer.json, a vocab.txt, or a directory holding either (tokenizer.json preferred), or a
    pretraining run's directory (its tokenizer/).

    ``lowercase`` only applies to a vocab.txt (a tokenizer.json carries its own normalizer): leave it True
    for uncased vocabularies such as bert-base-uncased, set it False for cased ones. A directory's
    tokenizer_config.json, where it has one, says instead (vocab_normalisation).
    """
    src = _source(path)
    if src.is_json:
        tok = _read_tokenizer_json(src.file)
        return tok if src.directory is None else _as_config_says(tok, src.directory)
    if src.directory is None:
        return _from_vocab(src.file, lowercase)
    cfg = _json_file(src.directory / TOKENIZER_CONFIG, {})  # read once: what splits, normalises and adds
    _check_wordpiece(cfg, src.directory / TOKENIZER_CONFIG)
    return _with_added_tokens(_from_vocab(src.file, **_normalisation(cfg, lowercase)), src.directory, cfg)


def _read_tokenizer_json(p: Path) -> Tokenizer:
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
    """What decides whether load_tokenizer(path) lowercases, found by its walk (_source): a vocab.txt, alone
    or in a directory whose tokenizer_config.json has no do_lower_case, takes `lowercase` (--lowercase);
    that file's do_lower_case otherwise, and beside a tokenizer.json whose normalizer is BERT's
    (_config_decides); any other tokenizer.json, its own normalizer. No tokenizer there: --lowercase."""
    try:
        src = _source(path)
    except TokenizerError:
        return CaseSetting("--lowercase")
    config = None if src.directory is None else src.directory / TOKENIZER_CONFIG
    if src.is_json:
        norm = _json_file(src.file, {}).get("normalizer") or {}
        if _config_decides(src.directory, norm):
            return CaseSetting("do_lower_case", config)
        return CaseSetting("normalizer", src.file, norm.get("type") == "BertNormalizer")
    if config is not None and "do_lower_case" in _json_file(config, {}):
        return CaseSetting("do_lower_case", config)
    return CaseSetting("--lowercase")


def _config_decides(directory: Path | None, normalizer: dict) -> bool:
    """Whether the tokenizer_config.json of `directory` overrides its tokenizer.json's `normalizer` (its
    JSON state), as transformers reads such a directory: only a BertNormalizer, and only beside that file."""
    return (directory is not None and (directory / TOKENIZER_CONFIG).is_file()
            and normalizer.get("type") == "BertNormalizer")  # fmt: skip


def _as_config_says(tok: Tokenizer, directory: Path) -> Tokenizer:
    """`tok` (the directory's tokenizer.json) normalising text as transformers reads the directory: where it
    has a tokenizer_config.json, that file's do_lower_case, strip_accents and tokenize_chinese_chars, with
    BERT's defaults for what it leaves out, replace its BertNormalizer's (transformers rebuilds the
    normalizer so, and the model was trained on what that gives). Without one, the file as it is."""
    state = json.loads(tok.to_str()).get("normalizer") or {}
    if not _config_decides(directory, state):
        return tok
    said = vocab_normalisation(directory)
    want = {"lowercase": said["lowercase"], "strip_accents": said["strip_accents"],
            "handle_chinese_chars": said["chinese_chars"]}  # fmt: skip
    if all(state.get(k) == v for k, v in want.items()):
        return tok
    state.pop("type")
    tok.normalizer = normalizers.BertNormalizer(**{**state, **want})
    return tok
