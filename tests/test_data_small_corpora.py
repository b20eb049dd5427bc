"""What a run on little text, or on a vocabulary that does not fit it, is told: cheap, on shards of a few
documents and a tokenizer trained on them in well under a second."""

from __future__ import annotations

import pytest

from training.data.batches import Batches, PackedDataset
from training.data.shards import ShardsError, build_shards
from training.data.tokenizer import special_ids
from training.data.tokenizer_loading import load_tokenizer
from training.data.tokenizer_saving import save_tokenizer
from training.data.tokenizer_training import train_wordpiece

TEXTS = [f"document {i}: the quick brown fox jumps over the lazy dog number {i}." for i in range(12)]


@pytest.fixture(scope="module")
def tokenizer():
    return train_wordpiece(TEXTS, vocab_size=200)


@pytest.fixture(scope="module")
def few_rows(tokenizer, tmp_path_factory) -> PackedDataset:
    out = tmp_path_factory.mktemp("few") / "train"
    build_shards(TEXTS[:1], tokenizer, 64, out)  # one row
    return PackedDataset(out)


def test_a_corpus_smaller_than_a_batch_at_batch_size_1_is_told_fewer_processes(few_rows):
    """Under torchrun with 2 processes, --batch-size 1 was told to "use a smaller --batch-size": there is
    none. Fewer processes make the global batch smaller."""
    assert len(few_rows) == 1
    with pytest.raises(ShardsError) as e:
        Batches(few_rows, 1, seed=0, rank=0, world_size=2)
    assert "--batch-size 1 x 2 process(es)): use fewer processes (torchrun --nproc_per_node), a smaller --seq-len, " \
           "or more text" in str(e.value)  # fmt: skip
    assert "smaller --batch-size" not in str(e.value)


def test_an_uncased_vocabulary_kept_cased_is_warned_of_by_its_share_of_unk(tokenizer, tmp_path):
    """bert-base-uncased's vocab.txt with --lowercase false trained on 14.7% [UNK]s (0.03% lowercased), in
    silence: every capitalised word is one."""
    from training.pretraining.data import unk_share, unk_warning

    save_tokenizer(tokenizer, tmp_path / "uncased")  # trained lowercased: no capital letter in it
    text = [t.capitalize().replace("quick brown fox", "Quick Brown Fox") for t in TEXTS]
    shares = {}
    for lowercase in (True, False):
        tok = load_tokenizer(tmp_path / "uncased" / "vocab.txt", lowercase=lowercase)
        info = build_shards(text, tok, 64, tmp_path / f"lowercase-{lowercase}")
        shares[lowercase] = unk_share(info, special_ids(tok).unk)
        said = unk_warning(shares[lowercase], tok)
        if lowercase:
            assert shares[lowercase] == 0.0 and said is None
        else:
            assert 0.1 < shares[lowercase] < 0.5, shares
            assert said.startswith(
                f"warning: {shares[lowercase]:.1%} of the training text's tokens are [UNK]"
            )
            assert "the tokenizer keeps case but the vocabulary has no capital letters" in said
            assert "give --lowercase true" in said


def test_a_word_too_long_for_wordpiece_is_left_out_of_the_vocabulary(tokenizer, capsys):
    """A word over 100 characters is [UNK] whole to the tokenizer, yet it went to the trainer, whose time
    grows with its length squared: a 400k-character hex dump took 105 s, deaf to Ctrl-C. Its pieces were
    taken into the vocabulary besides, tokens no text would ever be split into."""
    import random

    dump = "".join(random.Random(0).choices("0123456789abcdef", k=3000))
    with_dump = train_wordpiece([*TEXTS, f"digest {dump}"], vocab_size=200, show_progress=True)
    without = train_wordpiece([*TEXTS, "digest"], vocab_size=200)
    assert with_dump.get_vocab() == without.get_vocab()
    assert "1 distinct word(s) over 100 characters (the longest 3,000" in capsys.readouterr().err
    assert with_dump.encode(f"fox {dump}").tokens == ["[CLS]", "fox", "[UNK]", "[SEP]"]


def _vocabulary(lines: list[str], cased: bool) -> list[str]:
    """A vocabulary that fits real text one way: uncased, a WordPiece trained on it lowercased; cased, the
    text's own words as written (no pieces: a word seen only capitalised has no lowercase token)."""
    from tokenizers import pre_tokenizers

    if not cased:
        tok = train_wordpiece(lines, vocab_size=1000, lowercase=True)
        return [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    split = pre_tokenizers.BertPreTokenizer()
    words = {w for line in lines for w, _ in split.pre_tokenize_str(line)}
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted(words)]


def _tokenizer_as(layout: str, vocab: list[str], lowercase: bool, d) -> str:
    """A tokenizer that lowercases (`lowercase`) by the setting `layout` names, laid out under `d` as a user
    gives it; its path as --tokenizer (or --init's) gives it."""
    import json

    d.mkdir()
    (d / "vocab.txt").write_text("".join(f"{t}\n" for t in vocab))
    if layout == "vocab.txt":
        return str(d / "vocab.txt")
    if layout == "directory of vocab.txt":
        return str(d)
    if layout == "vocab.txt with do_lower_case":
        (d / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": lowercase}))
        return str(d)
    save_tokenizer(load_tokenizer(d / "vocab.txt", lowercase=lowercase), d)  # with tokenizer_config.json
    if layout == "tokenizer.json with do_lower_case":  # a Hugging Face directory: the reviewer's case
        return str(d)
    (d / "tokenizer_config.json").unlink()
    if layout == "directory of tokenizer.json":
        return str(d)
    if layout == "tokenizer.json":
        return str(d / "tokenizer.json")
    assert layout == "tokenizer.json, another normalizer"
    raw = json.loads((d / "tokenizer.json").read_text())
    steps = [{"type": "NFC"}] + ([{"type": "Lowercase"}] if lowercase else [])
    raw["normalizer"] = {"type": "Sequence", "normalizers": steps}
    (d / "tokenizer.json").write_text(json.dumps(raw))
    return str(d / "tokenizer.json")


def _follow(advice: str, lowercase: bool) -> bool:
    """Does what an [UNK] warning's advice says, as a user would: --lowercase (the value it gives, returned),
    or the file it names, edited as it says."""
    import json
    import re
    from pathlib import Path

    if m := re.search(r"give --lowercase (true|false)$", advice):
        return m[1] == "true"
    if m := re.search(r'set "do_lower_case": (true|false) in (\S+)$', advice):
        raw = json.loads(Path(m[2]).read_text())
        Path(m[2]).write_text(json.dumps({**raw, "do_lower_case": m[1] == "true"}))
        return lowercase
    if m := re.search(r'set "lowercase": (true|false) in the "normalizer" of (\S+)$', advice):
        raw = json.loads(Path(m[2]).read_text())
        raw["normalizer"]["lowercase"] = m[1] == "true"
        Path(m[2]).write_text(json.dumps(raw))
        return lowercase
    m = re.search(r'give (\S+) a "normalizer" that lowercases \(a Lowercase step\)$', advice)
    if m:
        raw = json.loads(Path(m[1]).read_text())
        raw["normalizer"]["normalizers"].append({"type": "Lowercase"})
        Path(m[1]).write_text(json.dumps(raw))
        return lowercase
    m = re.search(r'take the lowercasing out of the "normalizer" of (\S+)$', advice)
    assert m, advice
    raw = json.loads(Path(m[1]).read_text())
    raw["normalizer"]["normalizers"] = [
        s for s in raw["normalizer"]["normalizers"] if s["type"] != "Lowercase"
    ]
    Path(m[1]).write_text(json.dumps(raw))
    return lowercase


LAYOUTS = ["vocab.txt", "directory of vocab.txt", "vocab.txt with do_lower_case", "tokenizer.json with do_lower_case",
           "directory of tokenizer.json", "tokenizer.json", "tokenizer.json, another normalizer"]  # fmt: skip


@pytest.mark.parametrize("cased", [False, True], ids=["uncased vocabulary", "cased vocabulary"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_unk_warnings_advice_is_what_decides_the_tokenizers_case_and_following_it_ends_the_warning(
    layout, cased, tmp_path
):
    """A Hugging Face directory whose tokenizer_config.json said do_lower_case false over an uncased vocabulary
    was told "give --lowercase true", which the run then noted as not used, and warned again: --lowercase
    applies to a vocab.txt alone. Each layout is told what decides its case, and doing so ends the warning
    (the tokenizer loaded as a run loads it: load_tokenizer(path, lowercase=--lowercase))."""
    from tests.helpers_models import text_lines
    from training.pretraining.data import unk_share, unk_warning

    lines = text_lines(300)
    source = _tokenizer_as(layout, _vocabulary(lines, cased), lowercase=cased, d=tmp_path / "tok")
    lowercase = cased  # --lowercase, the option's value, as wrong as the files (it applies to vocab.txt)
    for attempt in ("warned", "followed"):
        tok = load_tokenizer(source, lowercase=lowercase)
        info = build_shards(lines, tok, 64, tmp_path / attempt)
        share = unk_share(info, special_ids(tok).unk)
        said = unk_warning(share, tok, source)
        if attempt == "followed":
            assert said is None and share < 0.01, (share, said)
            break
        assert said is not None and share > 0.01, share
        assert ("the tokenizer lowercases but the vocabulary is cased" if cased else
                "the tokenizer keeps case but the vocabulary has no capital letters") in said  # fmt: skip
        assert ("--lowercase" in said) == (layout in ("vocab.txt", "directory of vocab.txt")), said
        lowercase = _follow(said, lowercase)
        resumed = unk_warning(share, tok, source, resume=True)  # the run's own tokenizer: a new run
        assert resumed.startswith(said) and resumed.endswith(": a resume keeps the run's own tokenizer")
        assert "start a new run (another --out)" in resumed or "to a new run (another --out)" in resumed
