"""A text as typed, read as text: the control tokens' spellings ("[SEP]", "[MASK]") in it are characters,
while a model's own added special tokens ("[URL]", "@USER") are one token each, as transformers reads them.
One reading for every side: the server (app/model/tokenization.py), fine-tuning, pretraining's shards and
export's held-out check, so the served ids are the trained ones. Needs `tokenizers` only."""

from __future__ import annotations

import json

from tokenizers import Tokenizer

__all__ = ["CONTROL_TOKENS", "reading_typed_text"]

# The tokens that frame, pad and mask a model's rows (training.data.tokenizer.SPECIAL_TOKENS, the same
# five): typed by a client they are text, or a text could end a row early or pose as padding.
CONTROL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def reading_typed_text(tok: Tokenizer) -> Tokenizer:
    """A copy of `tok` that reads the control tokens typed in a text as text (`encode_special_tokens`),
    and matches its other special tokens as one token each, their ids and flags otherwise unchanged.
    `encode_special_tokens` reads every special token as text: "read [URL] now" became "[", "UR", "L", "]"
    where transformers, and so the model's training, gives [URL]'s one id. Those tokens are made plain
    added tokens here, which it leaves matched: a bundle written with them special (as transformers and
    export write them) is read right at load."""
    state = json.loads(tok.to_str())
    own = [a for a in state.get("added_tokens") or [] if a["special"] and a["content"] not in CONTROL_TOKENS]
    for a in own:
        a["special"] = False
    copy = Tokenizer.from_str(json.dumps(state))
    copy.encode_special_tokens = True
    return copy
