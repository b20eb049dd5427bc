"""WikiText read as documents: one per article, detokenized so that it reads as what users send us
(``1,000``, ``role-playing``, ``game's``), not as WikiText's tokens (``1 @,@ 000``). The registry corpus
``wikitext2`` is read with :func:`iter_wikitext_articles` (training/data/corpus.py's read_corpus).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

from training.data.corpus_sources import open_text

__all__ = ["detokenize_wikitext", "iter_wikitext_articles"]

# An article title is ` = Title = ` on a line of its own between blank lines. The blank-line condition
# matters: WikiText-2 train has 29 lines such as ` = Goals ; A = ` inside statistics tables that look
# like titles but sit between text lines; with it we get the published 600 / 60 / 60 articles.
_TITLE = re.compile(r"^ = (?!=)(.*) = $")
_HEADING = re.compile(r"^ (?:= ){2,}(.*?)(?: =){2,} $")

_DETOK_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(p), r)
    for p, r in [
        (r" @([-,.])@ ", r"\1"),  # 1 @,@ 000 -> 1,000 ; role @-@ playing -> role-playing
        (r"(?<=\d) ([:/–]) (?=\d)", r"\1"),  # 4 : 24, 2 / 9, 2013 – 14: Wikipedia writes these unspaced
        (r" — ", "—"),  # so are em dashes (MOS:EMDASH); spaced en dashes between words stay spaced
        (r" (n't|'s|'re|'ve|'ll|'d|'m)\b", r"\1"),  # game 's -> game's ; do n't -> don't
        (r"(?<=s) ' (?=\w)", "' "),  # players ' goals -> players' goals (plural possessive)
        (r" ([,.;:!?%)\]}])", r"\1"),  # no space before closing punctuation
        (r"([(\[{$£€]) ", r"\1"),  # none after opening brackets and currency signs
    ]
]


def detokenize_wikitext(line: str) -> str:
    """Undo WikiText's tokenization of one line so the text looks like what users will send us.

    Pretraining on ``role @-@ playing`` would teach the model a spelling no user types, and the
    discriminator would learn that spaces before commas are normal.
    """
    # Quotes first: they are decided token by token, before punctuation rules glue tokens together.
    text = _fix_double_quotes(line.strip())
    for pattern, repl in _DETOK_RULES:
        text = pattern.sub(repl, text)
    return text


def _fix_double_quotes(text: str) -> str:
    # WikiText writes `said " hello " .`: quotes alternate open/close within a paragraph, so odd ones
    # hug the following word and even ones the preceding word. An unmatched last quote stays opening.
    if '"' not in text:
        return text
    out: list[str] = []
    opening, glue_next = True, False
    for tok in text.split(" "):
        if tok == '"' and opening:
            out.append('"')
            glue_next, opening = True, False
        elif tok == '"' and out:
            out[-1] += '"'
            opening = True
        elif glue_next:
            out[-1] += tok
            glue_next = False
        else:
            out.append(tok)
    return " ".join(out)


def iter_wikitext_articles(path: str | os.PathLike[str], *, headings: bool = False) -> Iterator[str]:
    """Yield one detokenized document per WikiText article: its title line, then its paragraphs.

    Section headers (`` = = History = = ``) are dropped by default, as BERT did for Wikipedia ("we extract
    only the text passages and ignore lists, tables, and headers"): a heading is a fragment, not a
    sentence, and ELECTRA's released checkpoints never saw them. ``headings=True`` keeps them as lines.
    """
    with open_text(Path(path)) as f:
        lines = [line.rstrip("\n") for line in f]
    article: list[str] = []
    for i, line in enumerate(lines):
        is_title = (
            _TITLE.match(line) is not None
            and (i == 0 or not lines[i - 1].strip())
            and (i + 1 == len(lines) or not lines[i + 1].strip())
        )
        if is_title:
            if article:
                yield "\n".join(article)
            article = [detokenize_wikitext(_TITLE.match(line).group(1))]  # type: ignore[union-attr]
        elif not line.strip():
            continue
        elif _HEADING.match(line):
            if headings and article:
                article.append(detokenize_wikitext(_HEADING.match(line).group(1)))  # type: ignore[union-attr]
        elif article:  # text before the first title (none in WikiText) has no article to belong to
            article.append(detokenize_wikitext(line))
    if article:
        yield "\n".join(article)
