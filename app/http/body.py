"""Request bodies decoded strictly, before Litestar's own (lenient) conversion sees them: a `route`'s
before_request hook. What docs/serving.md promises and Litestar alone does not give:

- Content-Type must be application/json (415 otherwise): a browser may POST text/plain cross-origin
  without a preflight, so a lenient server is open to form-post CSRF. A Content-Encoding (gzip) is 415
  too: read as it is, the body would be garbage, answered as bad UTF-8 or scored as text.
- No silent coercion: `"threshold": "0.5"` is a string, not a number (msgspec strict mode; 422).
- Duplicate keys are refused (400): `{"text": "a", "text": "b"}` means different things to different
  parsers (a proxy that checks one and a server that scores the other).
- A lone UTF-16 surrogate escape is named as such (msgspec reports some as "truncated").
- Query parameters are refused (422): `?threshold=0.9` was ignored, the answer at another threshold.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import parse_qsl

import msgspec
from litestar import Request
from litestar.utils.scope.state import ScopeState

from app.errors import AppError, ErrorType, clip
from app.http.errors import from_msgspec
from app.http.scoring import offload
from app.model.tokenization import lone_surrogate_in


def _charset(ctype: str) -> str:
    """The charset parameter of a Content-Type, lower-cased and unquoted; "" when none is given."""
    for param in ctype.split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip('"').lower()
    return ""


def strict_json(kind: type[msgspec.Struct]):
    """before_request hook: decode the body into `kind` strictly; Litestar then takes it as `data`."""
    decoder = msgspec.json.Decoder(kind, strict=True)
    quoted_keys = tuple(f'"{f.encode_name}"'.encode() for f in msgspec.structs.fields(kind))

    fields = ", ".join(f.encode_name for f in msgspec.structs.fields(kind))

    async def hook(request: Request) -> None:
        if query := request.scope.get("query_string"):
            # `POST /classify?model=mc` was answered by the default model, and `/detect?threshold=0.9` at the
            # model's own threshold, the parameters unread: refused, as an unknown field of the body is.
            names = sorted({clip(k) for k, _ in parse_qsl(query.decode("latin-1"), keep_blank_values=True)})
            msg = (f"query parameters are not read ({', '.join(names) or clip(query.decode('latin-1'))}); give "
                   f"the options in the JSON body ({fields})")  # fmt: skip
            raise AppError(ErrorType.VALIDATION, msg, field="query")
        ctype = request.headers.get("content-type", "")
        if ctype.split(";", 1)[0].strip().lower() != "application/json":
            got = f"got {clip(ctype)!r}" if ctype else "none was sent"
            msg = f"Content-Type must be application/json ({got}); the body is a JSON object"
            raise AppError(ErrorType.UNSUPPORTED_MEDIA_TYPE, msg, field="content-type")
        coding = request.headers.get("content-encoding", "identity").strip().lower()
        if coding not in ("", "identity"):  # read as it is, a compressed body would be garbage
            msg = f"Content-Encoding {clip(coding)!r} is not accepted; send the JSON body uncompressed"
            raise AppError(ErrorType.UNSUPPORTED_MEDIA_TYPE, msg, field="content-encoding")
        # A coding in Transfer-Encoding before its `chunked` (`gzip, chunked`) compresses the body as surely;
        # the HTTP layer undoes only the chunking.
        codings = [c.strip().lower() for c in request.headers.get("transfer-encoding", "").split(",")]
        if other := [c for c in codings if c not in ("", "chunked", "identity")]:
            msg = f"Transfer-Encoding {clip(', '.join(other))!r} is not accepted; send the JSON body uncompressed"
            raise AppError(ErrorType.UNSUPPORTED_MEDIA_TYPE, msg, field="transfer-encoding")
        body = await request.body()
        # RFC 8259 lets a parser skip a byte-order mark, which some Windows clients write; bulk skips it too.
        body = body.removeprefix(b"\xef\xbb\xbf")
        if not body.strip():
            raise AppError(ErrorType.VALIDATION, "request body is required (a JSON object)", field="body")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            # RFC 8259: JSON between systems is UTF-8, and a charset parameter changes nothing (an ASCII body
            # labelled us-ascii is UTF-8 too); a body that is not UTF-8 and says which it is hears what to do.
            charset = _charset(ctype)
            if charset not in ("", "utf-8", "utf8"):
                msg = f"the body is {clip(charset)}, as its Content-Type says; send JSON in UTF-8"
                raise AppError(ErrorType.UNSUPPORTED_MEDIA_TYPE, msg, field="content-type") from None
            raise  # -> 400 invalid_utf8, naming the byte
        try:
            value = decoder.decode(body)
        except msgspec.ValidationError as e:
            # msgspec checks types as it parses and stops at the first problem: a wrong type ahead of a
            # syntax error would be named instead of it. Is the body JSON at all? (The error path only.)
            try:
                msgspec.json.decode(body)
            except (
                msgspec.ValidationError
            ):  # JSON, with a number past float's range: the typed error names it
                pass
            except msgspec.DecodeError as syntax:
                raise await _said(body, text, syntax) from None
            raise from_msgspec(e, kind) from None
        except msgspec.DecodeError as e:
            raise await _said(body, text, e) from None
        if _may_repeat_a_key(body, quoted_keys):
            _refuse_duplicate_keys(body)
        ScopeState.from_scope(request.scope).json = value  # Request.json() returns this: no second parse

    return hook


async def _said(body: bytes, text: str, e: msgspec.DecodeError) -> AppError:
    """The 400 for a body msgspec could not read. Where it may hold a lone surrogate escape, that is looked
    for off the event loop for a large body: a second parse of up to a MiB, by Python's parser, costs up
    to about 100 ms, which every other request would wait behind."""
    if not _SURROGATE_ESCAPE.search(body):  # the usual malformed body: msgspec's account, no thread hop
        return from_msgspec(e)
    return await offload(lambda: _not_json(text, e), len(body))


# Where a surrogate escape may be (an escaped backslash before the letters passes too: only slower).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _not_json(text: str, e: msgspec.DecodeError) -> AppError:
    """400 invalid_json: msgspec's account of where the syntax breaks, or a lone surrogate escape named as
    such, with the field that holds it: msgspec refuses one (and reports it as "truncated" at times)
    where the body is otherwise JSON. Found in what Python's parser decoded, whose every surrogate left
    is a lone one (it joins each high-low pair into one character): a search of the raw bytes, telling
    an escaped backslash before the letters ud800 from the escape, took 130 ms for a hostile 1 MB body."""
    try:  # the body decoded as UTF-8: from bytes, Python's parser would guess the encoding (UTF-16 too)
        value = json.loads(text)
    except (ValueError, RecursionError):
        return from_msgspec(e)
    if (found := lone_surrogate_in(value)) is None:
        return from_msgspec(e)
    path, holder, at = found
    field = clip("".join(reversed(path)).removeprefix(".")) if path is not None else ""
    msg = (f"request body is not valid JSON: lone UTF-16 surrogate escape \\u{ord(holder[at]):04x} in "
           f"{field or 'a key'} at character {at} (a surrogate must come in a high-low pair)")  # fmt: skip
    return AppError(ErrorType.INVALID_JSON, msg, field=field or "body")


def _may_repeat_a_key(body: bytes, quoted_keys: tuple[bytes, ...]) -> bool:
    """False only when no key can be there twice. The body decoded into a struct that forbids unknown
    fields, so its keys are field names; without a backslash in the body every key is written as its
    name in quotes, and a key sent twice shows as a count of 2. A value equal to a field name, or any
    escape, sends the body to the full check. Saves that check's second parse of every plain body."""
    return b"\\" in body or any(body.count(k) > 1 for k in quoted_keys)


def _refuse_duplicate_keys(body: bytes) -> None:
    # Only reached by bodies that decoded into the request struct: its values hold no objects, so the
    # hook runs for the top-level object alone.
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in items:
            if key in seen:
                msg = f"request body has the key `{clip(key)}` twice; send each field once"
                raise AppError(ErrorType.INVALID_JSON, msg, field=clip(key))
            seen.add(key)
        return {}

    json.loads(body, object_pairs_hook=pairs)
