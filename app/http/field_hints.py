"""What a request field takes, added to msgspec's account of a value it refused: "Invalid enum value 'x'"
and "Number out of range" named no allowed value, and an unknown field no known one, so a client's author
had to look the API up to fix a typo."""

from __future__ import annotations

import msgspec
import msgspec.inspect as mi


def allowed(kind: type[msgspec.Struct], field: str, message: str) -> str:
    """What to add to `message` (msgspec's, about `field` of a `kind` body): "" when nothing."""
    if message.startswith("Object contains unknown field") and "." not in field:
        return "; the fields are " + ", ".join(f.encode_name for f in msgspec.structs.fields(kind))
    taken = _taken(kind, field)
    if isinstance(taken, mi.LiteralType) and message.startswith("Invalid enum value"):
        return "; expected one of " + ", ".join(map(str, sorted(taken.values)))
    if isinstance(taken, mi.FloatType | mi.IntType) and message == "Number out of range":
        kind_of = "an integer" if isinstance(taken, mi.IntType) else "a number"
        limits = [f"{op} {getattr(taken, bound)}" for bound, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
                  if getattr(taken, bound) is not None]  # fmt: skip
        return f"; expected {kind_of}{' ' + ' and '.join(limits) if limits else ''}"
    return ""


def _taken(kind: type[msgspec.Struct], field: str) -> mi.Type | None:
    """The type a top-level `field` of `kind` takes, null and annotations aside; None for any other."""
    for f in mi.type_info(kind).fields:
        if f.encode_name == field:
            types = f.type.types if isinstance(f.type, mi.UnionType) else (f.type,)
            for t in types:
                while isinstance(t, mi.Metadata):
                    t = t.type
                if not isinstance(t, mi.NoneType):
                    return t
    return None
