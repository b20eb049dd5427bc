"""Where each option `resolve` was given came from (`sources`: its flag, a --config file, a variable or
the saved config), kept beside the resolved instance rather than in it, and carried over by `replace`."""

from __future__ import annotations

import dataclasses
import weakref


def _remember(cfg, given: dict[str, str]) -> None:
    key = id(cfg)  # kept beside the instance, not in it: its __dict__ is saved as the run's config
    _SOURCES[key] = (weakref.ref(cfg, lambda _, key=key: _SOURCES.pop(key, None)), given)


def replace(cfg, **changes):
    """dataclasses.replace that keeps where each option came from (`sources`)."""
    new = dataclasses.replace(cfg, **changes)
    _remember(new, dict(sources(cfg)))
    return new


_SOURCES: dict[int, tuple[weakref.ref, dict[str, str]]] = {}


def sources(cfg) -> dict[str, str]:
    """Where each option `resolve` was given came from: its flag (`--hidden-size`), a --config file's
    path, an environment variable's name or "the saved config"; options left at their default are not
    there. Only the instance `resolve` returned has them, and one `replace` made of it (dataclasses.replace
    makes one without)."""
    ref, given = _SOURCES.get(id(cfg), (None, {}))
    return given if ref is not None and ref() is cfg else {}
