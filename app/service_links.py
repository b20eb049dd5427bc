"""Kubernetes service links: the variables a Service of the pod's namespace sets in every container, told
apart from settings that share their prefix (app/settings.py warns of the one and ignores the other)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping

# Kubernetes gives every container, for each Service of its namespace (enableServiceLinks, on by default),
# variables named after the Service: a Service `electra-serve` sets ELECTRA_SERVE_SERVICE_HOST,
# ELECTRA_SERVE_PORT=tcp://10.0.0.1:80, ELECTRA_SERVE_PORT_80_TCP_ADDR... which share the settings' prefix.
# Each is told by its name and value together, and only beside its Service's *_SERVICE_HOST (the kubelet
# always sets that one), so a typo of a setting (ELECTRA_SERVE_PORT=8000) still gets its warning.
_LINK_URL = re.compile(r"(tcp|udp|sctp)://\S+:(\d+)")
_LINK_NAMES = re.compile(r"SERVICE_PORT(_\w+)?|PORT|PORT_(\d+)_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?")


def service_links(env: Mapping[str, str], prefix: str) -> set[str]:
    """The variables in `env` named with `prefix` (ELECTRA_) that are Kubernetes service links (see above),
    not settings."""
    services = {k.removesuffix("_SERVICE_HOST") for k, v in env.items()
                if k.startswith(prefix) and k.endswith("_SERVICE_HOST") and _is_address(v)}  # fmt: skip
    links = {f"{svc}_SERVICE_HOST" for svc in services}
    for key, value in env.items():
        for svc in services:
            match = _LINK_NAMES.fullmatch(key.removeprefix(svc + "_")) if key.startswith(svc + "_") else None
            if match is None:
                continue
            port, proto, part = match.group(2), match.group(3), match.group(4)
            if match.group(0).startswith("SERVICE_PORT"):
                ok = value.isdigit()
            elif part == "_PROTO":
                ok = value == proto.lower()
            elif part == "_PORT":
                ok = value == port
            elif part == "_ADDR":
                ok = _is_address(value)
            else:  # SVC_PORT or SVC_PORT_<n>_<PROTO>: proto://address:port
                url = _LINK_URL.fullmatch(value)
                ok = url is not None and (
                    proto is None or (url.group(1) == proto.lower() and url.group(2) == port)
                )
            if ok:
                links.add(key)
    return links


def _is_address(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True
