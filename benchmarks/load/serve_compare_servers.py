"""The servers serve_compare runs: which it knows, how each is started (with its own flags, from its own
checkout for ours-variant), how the report describes it, and what each costs idle.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.load import serving
from benchmarks.load.loadmodels import REPO

SERVERS = ("ours", "unbatched", "transformers", *serving.PEERS)
VARIANT = "ours-variant"  # --variant-args: our server with other flags, measured in the same rounds


def launch(kind: str, args, bundle: Path, hf: Path | None):
    """(port -> command line, directory to run in) of one server: 'ours-variant' runs our server with
    --variant-args from --variant-checkout (its `python -m app` is that checkout's code), the peers with
    their --*-args, every other server with --server-args from this repository. Both phases start their
    servers through this, so that each measures the same code with the same flags."""
    variant = kind == VARIANT
    if variant:
        flags = (args.variant_args or "").split()
    else:
        flags = {"litserve": args.litserve_args, "mosec": args.mosec_args}.get(kind, args.server_args).split()
    cwd = Path(args.variant_checkout) if variant and args.variant_checkout else REPO

    def argv_for(port: int) -> list[str]:
        return serving.command("ours" if variant else kind, port, models_dir=bundle, bundle=bundle, hf_dir=hf,
                          extra=flags)  # fmt: skip

    return argv_for, cwd


def batch_limits(args) -> dict[str, tuple[int | None, str]]:
    """Each server's most texts a request and where that comes from (load_options.batch_texts_refused):
    ours and ours-variant as their flags resolve here, the baselines' own limit. None for an
    ours-variant run from --variant-checkout (that checkout's code is not read here) and for the peers
    (they take one text a request: --mix refuses detect_batch with them)."""
    from benchmarks.load import load_options
    from benchmarks.load.baselines.common import MAX_TEXTS

    out = {}
    for kind in args.servers:
        if kind == "ours":
            out[kind] = load_options.ours_batch_limit(args.server_args)
        elif kind == VARIANT and not args.variant_checkout:
            out[kind] = load_options.ours_batch_limit(args.variant_args or "", "--variant-args")
        elif kind in ("unbatched", "transformers"):
            out[kind] = (MAX_TEXTS, "benchmarks/load/baselines/common.py")
    return out


def idle_cpu(servers: dict[str, serving.Server]) -> dict[str, float]:
    """Each server's CPU while nobody sends it anything, measured alone (the others paused)."""
    out = {}
    for kind, server in servers.items():
        for other, s in servers.items():
            serving.pause(s, paused=other != kind)
        out[kind] = serving.idle_cpu(server)
    for s in servers.values():
        serving.pause(s, paused=False)
    return out


def describe(kind: str, args) -> str:
    if kind == VARIANT and args.variant_checkout:
        return f"{serving.SERVERS['ours']}, the code of {args.variant_checkout} ({args.variant_args or 'same flags'})"
    if kind == VARIANT:
        return f"{serving.SERVERS['ours']}, with {args.variant_args} ({args.server_args or 'no other flags'} for ours)"
    if kind in serving.PEERS:
        from importlib.metadata import version

        from benchmarks.load.baselines.common import peer_settings

        flags = getattr(args, f"{kind}_args")
        resolved = ", ".join(f"{k} {v}" for k, v in peer_settings(kind, flags.split()).items())
        return f"{serving.SERVERS[kind]}; {kind} {version(kind)}, {flags or 'no flags'}: {resolved}"
    return serving.SERVERS[kind]
