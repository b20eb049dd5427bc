"""A model's own added special tokens ("[URL]", "@USER") typed in a text are one token, as transformers
reads them, in the server, fine-tuning and pretraining's shards alike; the control tokens typed ("[SEP]",
"[MASK]") stay text there."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer

from app.model.tokenization import TextTokenizer
from training.finetuning.batches import encode, typed_special_tokens
from training.finetuning.data import Example

# The committed detector's tokenizer: BERT's uncased WordPiece.
TOKENIZER = Path(__file__).resolve().parent.parent / "models" / "detector" / "tokenizer.json"


@pytest.fixture(scope="module")
def with_url(tmp_path_factory) -> Path:
    """The tokenizer.json with [URL] and @USER added special, as transformers saves a model's
    additional_special_tokens, and as export wrote them into a bundle (special true, not normalized)."""
    tok = Tokenizer.from_file(str(TOKENIZER))
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in ("[URL]", "@USER")])
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def test_a_models_own_special_tokens_are_one_token_when_served_and_control_tokens_stay_text(with_url):
    """encode_special_tokens read every special token as text: "read [URL] now" was served as "[", "ur",
    "##l", "]", where transformers gives [URL]'s one id, the input the model was trained on."""
    from transformers import PreTrainedTokenizerFast

    text = "read [URL] now @USER"
    theirs = PreTrainedTokenizerFast(tokenizer_file=str(with_url))(text)["input_ids"]
    url, user = (Tokenizer.from_file(str(with_url)).token_to_id(t) for t in ("[URL]", "@USER"))
    assert url in theirs and user in theirs

    served = TextTokenizer(with_url, 64, 0)
    enc = served.encode_detect([text + " [SEP] [MASK]"])[0]
    # Text the user wrote: a token of its own in /detect, with its offsets (and so a probability).
    assert enc.tokens[:4] == ["read", "[URL]", "now", "@USER"] and enc.offsets[1] == (5, 10), enc.tokens
    assert enc.tokens[4:] == ["[", "sep", "]", "[", "mask", "]"], enc.tokens
    assert served.encode_classify([text])[0].row.ids.tolist() == theirs
    assert enc.rows[0].ids[:5].tolist() == theirs[:-1]  # [CLS] read [URL] now @USER

    # Fine-tuning reads them so too, and counts only the control tokens as typed text.
    tok = Tokenizer.from_file(str(with_url))
    assert encode(tok, [Example(text, None, 0)], 64)[0].ids == theirs
    examples = [Example("a [URL] b", None, 0), Example("a [SEP] b", None, 0)]
    assert typed_special_tokens(tok, examples) == (1, ["[SEP]"])
