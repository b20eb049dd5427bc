"""Which method of a refused request line the HTTP parser did not know: a well-formed one (FOO, RFC 9110's
token) got "could not be parsed", as if the request were garbled."""

from __future__ import annotations

import re

import httptools

# A method longer than this is not named (llhttp's own are 11 bytes at most).
METHOD_SEEN = 40
_TOKEN = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]{1,32}) ")


class _Ignore:
    """A parser's callbacks: none needed."""


def unknown_method(line_start: bytes) -> str | None:
    """The method that begins `line_start` (a request's first bytes) where it is a well-formed token the
    parser refuses as a method; None for any other refusal."""
    found = _TOKEN.match(line_start)
    if found is None:
        return None
    try:
        httptools.HttpRequestParser(_Ignore()).feed_data(found.group(1) + b" / HTTP/1.1\r\nhost: x\r\n\r\n")
    except httptools.HttpParserInvalidMethodError:
        return found.group(1).decode("ascii")
    except httptools.HttpParserError:
        return None
    return None
