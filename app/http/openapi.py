"""The OpenAPI document says what the server enforces, so that a client generated from it, or a validator
run on it, refuses the bodies the server refuses, and expects the answers the server gives. Litestar's
generator leaves some things out or puts them where validators skip them; they are set here, once, on the
document Litestar then serves as built."""

from __future__ import annotations

import msgspec
from litestar import Litestar
from litestar.openapi.spec import OpenAPIHeader, OpenAPIMediaType, OpenAPIResponse, Reference, Schema

from app import schemas
from app.errors import STATUS, ErrorType
from app.http.scoring import STAGES

# A field `X | None` becomes oneOf [X, null]; msgspec's bounds of X (minItems, items, minimum, ...) land
# beside that oneOf, where they apply to null too and code generators drop them. They belong to X.
_BOUNDS = ("items", "min_items", "max_items", "minimum", "maximum")


def describe_as_enforced(app: Litestar) -> None:
    _describe_bodies(app)
    _describe_answers(app)


def _describe_bodies(app: Litestar) -> None:
    for name, schema in (app.openapi_schema.components.schemas or {}).items():
        struct = getattr(schemas, name, None)
        if not (isinstance(struct, type) and issubclass(struct, msgspec.Struct)):
            continue
        if struct.__struct_config__.forbid_unknown_fields:
            schema.additional_properties = False  # unknown fields are refused (422)
        for prop in (schema.properties or {}).values():
            if isinstance(prop, Schema):
                _bounds_into_the_value(prop)
        inputs = schemas.INPUT_FIELDS.get(name)
        if inputs:
            schema.one_of = [_only(field, inputs) for field in inputs]


def _bounds_into_the_value(prop: Schema) -> None:
    values = [s for s in prop.one_of or () if isinstance(s, Schema) and s.type != "null"]
    if len(values) != 1:
        return
    for bound in _BOUNDS:
        if getattr(prop, bound) is not None:
            setattr(values[0], bound, getattr(prop, bound))
            setattr(prop, bound, None)


def _only(field: str, inputs: tuple[str, ...]) -> Schema:
    """Bodies that give `field` and none of the other inputs (absent or null, as check_inputs reads them)."""
    others = {other: Schema(type="null") for other in inputs if other != field}
    return Schema(required=[field], properties={field: Schema(schema_not=Schema(type="null")), **others})


# The HTTP layer refuses these on any path, before routing (app/http/protocol.py, app/http/host.py).
_ANY_PATH = (ErrorType.INVALID_HTTP, ErrorType.READ_TIMEOUT, ErrorType.HEADERS_TOO_LARGE)
# A client that honours retry-after backs off as the server asks; those answers carry it.
_RETRY_AFTER = {STATUS[ErrorType.OVERLOADED], STATUS[ErrorType.UNAVAILABLE]}
_ERROR_BODY = "#/components/schemas/ErrorBody"
_TIMED = ("/detect", "/classify")  # answers with each stage's time (app/http/scoring.py Timings)
_HEADERS = {
    "x-request-id": ("string", "The client's x-request-id when it is a plain token (letters, digits, ._:-, up "
                     "to 128), else a new one. The server's log lines about the request name it. On every "
                     "answer; a new one on those given before the request's headers were read whole "
                     "(invalid_http, read_timeout, headers_too_large)."),
    "retry-after": ("integer", "Seconds to wait before retrying, on the answers where waiting helps (a full "
                    "queue, a model loading, a server draining)."),
    "www-authenticate": ("string", "`Bearer`: the API key goes in `authorization: Bearer KEY` (or x-api-key)."),
    **{f"x-{stage}-time": ("string", f"Milliseconds spent on {stage}, as a decimal.")
       for stage in STAGES},
}  # fmt: skip


def _describe_answers(app: Litestar) -> None:
    document = app.openapi_schema
    document.components.headers = {
        name: OpenAPIHeader(schema=Schema(type=kind), description=text)
        for name, (kind, text) in _HEADERS.items()
    }
    for path, item in (document.paths or {}).items():
        for method in ("get", "head", "post"):
            operation = getattr(item, method, None)
            if operation is not None and operation.responses is not None:
                _describe_operation(operation.responses, timed=path in _TIMED)
                operation.responses = dict(sorted(operation.responses.items()))


def _describe_operation(responses: dict, timed: bool) -> None:
    for e in _ANY_PATH:  # the answers the HTTP layer gives on any path: no route documents them
        _add_error(responses, STATUS[e], e.value)
    for code, answer in responses.items():
        if not isinstance(answer, OpenAPIResponse):
            continue
        names = ["x-request-id"]
        if int(code) in _RETRY_AFTER and _is_error_body(answer):
            names.append("retry-after")
        if int(code) == STATUS[ErrorType.UNAUTHORIZED]:
            names.append("www-authenticate")
        if timed and code == "200":
            names += [f"x-{stage}-time" for stage in STAGES]
        answer.headers = {
            **(answer.headers or {}),
            **{n: Reference(ref=f"#/components/headers/{n}") for n in names},
        }


def _add_error(responses: dict, status: int, error: str) -> str | None:
    """Adds `error` to the answer for `status`, making that answer (the one error shape) if there is none;
    the status made, or None."""
    answer = responses.get(str(status))
    if isinstance(answer, OpenAPIResponse) and _is_error_body(answer):
        # A route's own may list it already (read_timeout: a body read too slowly), and it read twice.
        if error not in answer.description.split(": ", 1)[-1].split(", "):
            answer.description += ", " + error
    elif answer is None:
        body = OpenAPIMediaType(schema=Reference(ref=_ERROR_BODY))
        responses[str(status)] = OpenAPIResponse(
            description="error types: " + error, content={"application/json": body}
        )
        return str(status)
    return None


def _is_error_body(answer: OpenAPIResponse) -> bool:
    media = (answer.content or {}).get("application/json")
    return media is not None and isinstance(media.schema, Reference) and media.schema.ref == _ERROR_BODY
