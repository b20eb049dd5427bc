"""Request and response bodies. msgspec validates types and ranges on decode; rules that need the
settings (batch limit) or more than one field live in `check_*` below, raising AppError with the field."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from app.errors import AppError, ErrorType
from app.model.tokenization import is_blank

# Litestar's OpenAPI generator drops a bound that is 0 (it tests the value's truth) and the constraints of
# a list's items: `extra` restates them for the document; msgspec enforces the Meta's own.
Threshold = Annotated[
    float,
    msgspec.Meta(ge=0.0, le=1.0, description="flag words with prob >= threshold",
                 extra_json_schema={"extra": {"minimum": 0.0}}),
]  # fmt: skip
TopK = Annotated[
    int, msgspec.Meta(ge=1, description="return the k most probable labels (classification models only)")
]
Pair = Annotated[list[str], msgspec.Meta(min_length=2, max_length=2, description="[text, text_pair]")]
# The per-request maximum is a setting (max_batch_size), checked in check_inputs, not in the schema.
Texts = Annotated[list[str], msgspec.Meta(min_length=1, description="a batch of texts")]
_PAIR_SCHEMA = {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2,
                "description": "[text, text_pair]"}  # fmt: skip
Pairs = Annotated[
    list[Pair],
    msgspec.Meta(
        min_length=1,
        description="a batch of text pairs",
        extra_json_schema={"extra": {"items": _PAIR_SCHEMA}},
    ),
]


def _doc(text: str) -> msgspec.Meta:
    return msgspec.Meta(description=text)


class DetectRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Exactly one of `text` and `texts`."""

    text: Annotated[str, _doc("one text")] | None = None
    texts: Texts | None = None
    model: (
        Annotated[
            str, _doc("a detector from GET /models; default: --default-detector, else the first by name")
        ]
        | None
    ) = None
    threshold: Annotated[Threshold, _doc("default: the model's own (GET /models)")] | None = None
    # null as the default, as `threshold` and `model` take it (a client that always sends every field).
    return_: (
        Annotated[Literal["tokens", "words", "both"], _doc("which lists to return; default both")] | None
    ) = msgspec.field(default="both", name="return")


class ClassifyRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Exactly one of `text`, `texts` and `pairs`."""

    text: Annotated[str, _doc("one text")] | None = None
    texts: Texts | None = None
    pairs: Pairs | None = None
    model: (
        Annotated[
            str, _doc("a classifier from GET /models; default: --default-classifier, else the first by name")
        ]
        | None
    ) = None
    top_k: TopK | None = None


# Each request gives exactly one of these (check_inputs); the OpenAPI document says so (app/http/openapi.py).
INPUT_FIELDS = {"DetectRequest": ("text", "texts"), "ClassifyRequest": ("text", "texts", "pairs")}

Start = Annotated[
    int, _doc("character offset (Python str index: code points) into the input; input[start:end]")
]
End = Annotated[int, _doc("end offset, exclusive")]
Prob = Annotated[float, _doc("probability that it was replaced")]


class Token(msgspec.Struct):
    """Tokens come in order of `start`, which never goes back, but they need not be disjoint: several may
    share a character's offsets (the pieces of a Hangul syllable, or of what a normalizer expands one
    character to), and so overlap. Words never share a character."""

    text: Annotated[str, _doc("input[start:end]: the surface form, case and accents as sent")]
    token: Annotated[str, _doc('the vocabulary piece ("##ing", "[UNK]")')]
    start: Start
    end: End
    prob: Prob
    word: Annotated[int, _doc("index into `words`")]


class Word(msgspec.Struct):
    text: str
    start: Start
    end: End
    prob: Annotated[float, _doc("max over the word's tokens")]
    tokens: Annotated[list[int], _doc("indices into `tokens`")]


class Span(msgspec.Struct):
    text: str
    start: Start
    end: End
    prob: float


class Summary(msgspec.Struct):
    max_prob: Annotated[float, _doc("max token probability (0 when the text has no tokens)")]
    mean_prob: Annotated[float, _doc("mean token probability")]
    replaced_fraction: Annotated[
        float,
        _doc(
            "spans divided by the number of words; words with no letter or digit (punctuation, symbols, emoji) are left out of both (0 when none is left)"
        ),
    ]
    spans: Annotated[
        list[Span], _doc("the words with prob >= threshold that have a letter or digit, in order")
    ]
    num_tokens: int
    num_words: int
    windows: Annotated[int, _doc("model windows scored (> 1 when the text is longer than max_length)")]


class DetectResult(msgspec.Struct, omit_defaults=True):
    summary: Summary
    tokens: list[Token] | None = None  # special tokens never appear
    words: list[Word] | None = None


class DetectResponse(msgspec.Struct):
    model: str
    threshold: float
    results: Annotated[list[DetectResult], _doc("one per input text, in order")]


class LabelScore(msgspec.Struct):
    label: str
    score: float


class ClassifyResult(msgspec.Struct, omit_defaults=True):
    label: Annotated[str, _doc("the most probable label (a regression model: the name of its target)")]
    score: Annotated[float, _doc("that label's probability (a regression model: the predicted value)")]
    probs: Annotated[dict[str, float], _doc("every label of the manifest (the raw value for regression)")]
    truncated: Annotated[bool, _doc("the input was longer than max_length and was cut to fit")]
    top_k: Annotated[list[LabelScore], _doc("the top_k labels, most probable first")] | None = None


class ClassifyResponse(msgspec.Struct):
    model: str
    results: list[ClassifyResult]


class ModelInfo(msgspec.Struct):
    name: str
    kind: str
    labels: list[str]
    problem_type: str | None
    precision: str
    max_length: int
    sha256: str
    files_sha256: Annotated[dict[str, str], _doc("every bundle file whose sha256 was checked at load")]
    warnings: Annotated[list[str], _doc("e.g. an old bundle whose tokenizer.json is not hash-checked")]
    inputs: list[str]
    provenance: dict[str, object]  # source, created_at, versions, parity, optimizations from the manifest
    default: bool  # picked when a request names no model
    trained_on: Annotated[
        str | None,
        _doc("classifiers: `texts` or `pairs`, what the model was fine-tuned on (`texts` too for a model of "
             "one token type) and what /classify takes; null: not recorded (an imported model), either is taken"),
    ] = None  # fmt: skip
    threshold: Annotated[float | None, _doc("detectors: the threshold a request without one gets")] = None
    calibrated: Annotated[
        bool | None, _doc("detectors: probabilities calibrated at export (see `calibration`)")
    ] = None
    calibration: Annotated[
        dict[str, object] | None,
        _doc("detectors: how the probabilities were calibrated and the default threshold chosen, or why not"),
    ] = None
    load_check: Annotated[
        dict[str, object] | None,
        _doc(
            "the bundle's check inputs run at load on this machine: p99 and max deviation from the reference "
            "the export computed, the gate, within_gate, and this CPU's int8 kernel path"
        ),
    ] = None


_FAILING = "served bundles whose engine fails (runs in a row and /ready's probe), by name, with the error"


class ModelsResponse(msgspec.Struct):
    models: list[ModelInfo]
    broken: Annotated[dict[str, str], _doc("bundles not served, by name, with the reason")] = msgspec.field(
        default_factory=dict
    )
    failing: Annotated[dict[str, str], _doc(_FAILING)] = msgspec.field(default_factory=dict)


class Status(msgspec.Struct):
    status: str
    detail: str | None = None
    broken: Annotated[dict[str, str] | None, _doc("bundles not served, by name, with the reason")] = None
    failing: Annotated[dict[str, str] | None, _doc(_FAILING)] = None


class ErrorDetail(msgspec.Struct):
    type: str
    message: str
    field: str | None


class ErrorBody(msgspec.Struct):
    error: ErrorDetail


def check_inputs(max_batch: int, text: str | None, texts: list[str] | None, pairs=None, *, pairs_ok=False):
    """Exactly one of text/texts(/pairs), within the batch limit, no empty or blank text.

    Returns (field name, items): items are strings, or [a, b] lists for pairs."""
    fields = INPUT_FIELDS["ClassifyRequest" if pairs_ok else "DetectRequest"]
    values = {"text": text, "texts": texts, "pairs": pairs}
    given = [n for n in fields if values[n] is not None]
    if len(given) != 1:
        what = "none given" if not given else f"got {' and '.join(given)}"
        names = " or ".join(f"`{n}`" for n in fields)
        raise AppError(
            ErrorType.VALIDATION, f"send exactly one of {names}: {what}", field=given[-1] if given else "text"
        )
    field = given[0]
    items = [text] if field == "text" else values[field]
    if not items:
        raise AppError(
            ErrorType.VALIDATION, f"`{field}` is an empty list: send at least one item", field=field
        )
    if len(items) > max_batch:
        msg = (f"`{field}` has {len(items)} items; the limit is {max_batch} per request (--max-batch-size, "
               "ELECTRA_MAX_BATCH_SIZE): split the batch, or raise the limit")  # fmt: skip
        raise AppError(ErrorType.BATCH_TOO_LARGE, msg, field=field)
    for i, item in enumerate(items):
        parts = item if field == "pairs" else [item]
        for j, s in enumerate(parts):
            if is_blank(s):
                msg = ("text is empty, or holds only what the tokenizer drops (white space, control, zero-width or "
                       "private-use characters, U+FFFD, or accents alone for an uncased model)")  # fmt: skip
                raise AppError(ErrorType.EMPTY_TEXT, msg, field=item_field(field, i, j))
    return field, items


def item_field(field: str, i: int, j: int | None) -> str:
    """Where item i (pair half j) is in the request: "text", "texts[3]", "pairs[3][1]"."""
    return {"text": "text", "texts": f"texts[{i}]", "pairs": f"pairs[{i}][{j}]"}[field]
