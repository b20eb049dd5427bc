"""The OpenAPI document says what the server enforces, so that a client generated from it, or a validator
run on it, refuses the bodies the server refuses. Litestar's generator leaves three things out or puts them
where validators skip them; they are set here, once, on the document Litestar then serves as built."""

from __future__ import annotations

import msgspec
from litestar import Litestar
from litestar.openapi.spec import Schema

from app import schemas

# A field `X | None` becomes oneOf [X, null]; msgspec's bounds of X (minItems, items, minimum, ...) land
# beside that oneOf, where they apply to null too and code generators drop them. They belong to X.
_BOUNDS = ("items", "min_items", "max_items", "minimum", "maximum")


def describe_as_enforced(app: Litestar) -> None:
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
