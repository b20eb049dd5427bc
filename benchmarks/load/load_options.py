"""The command-line options the load programs share, and the check of a server given by --url before any
load is sent to it.
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterable

from benchmarks.cli import detector_models, existing, existing_dir, positive_float, positive_ints
from benchmarks.load.loadmodels import WORK
from options import usage_exit

# Options and parsing the load programs share (load_profile, serve_compare, soak).
parse_users = positive_ints  # --users 1,16,64: each a locust run, so none may be 0 and one must be given

# The shortest locust run that measures anything. Its --run-time clock starts before the users are
# spawned, and --reset-stats drops what came before the last one (up to about a second); the CPU is
# sampled once a second inside what is left. A 2-s run measured 0.8-1.5 s, its CPU from another window.
MIN_RUN_S = 5


def run_seconds(text: str) -> float:
    """An argparse type: the seconds of one locust run, at least MIN_RUN_S."""
    value = positive_float(text)
    if value < MIN_RUN_S:
        raise argparse.ArgumentTypeError(
            f"expected at least {MIN_RUN_S} s, got {text!r}: locust measures only from the last user "
            "spawned (up to about a second in), and the CPU is sampled once a second within that"
        )
    return value


def add_common(p: argparse.ArgumentParser) -> None:
    # Checked for existence here, before any server starts; what they must hold, prepare() says.
    p.add_argument(
        "--model", default=None, type=existing, help="checkpoint, run or HF ElectraForPreTraining dir"
    )
    p.add_argument(
        "--bundle",
        default=None,
        type=detector_models,
        help="an exported detector bundle, or a models dir holding one, to serve as is",
    )
    p.add_argument("--precision", default="int8", choices=("int8", "fp32"))
    p.add_argument(
        "--data-dir", type=existing_dir, default=os.environ.get("ELECTRA_DATA_DIR"), help="WikiText-2 files"
    )
    p.add_argument("--work", default=str(WORK), help="models, sentences, locust reports")


def ours_batch_limit(server_args: str, option: str = "--server-args") -> tuple[int | None, str]:
    """Our server's most texts a request, started with `server_args` (given by `option`), and where that
    limit comes from, for batch_texts_refused."""
    from benchmarks.load.serving import max_batch_size

    limit = max_batch_size(server_args)
    if server_args.strip():
        return limit, f"--max-batch-size {limit} with {option} {server_args.strip()!r}"
    return limit, f"its default --max-batch-size; raise it with {option} '--max-batch-size N'"


def batch_texts_refused(batch_texts: int, mix: str, limits: dict[str, tuple[int | None, str]]) -> str | None:
    """Why a --batch-texts is refused before any server starts, or None: where `mix` sends batched requests,
    a server of `limits` (name: (its most texts a request, where that limit comes from); None where not
    known) that answers fewer would refuse every one of them (ours with 422 batch_too_large), and the
    report would time those refusals."""
    from benchmarks.load.mix import sends_batches

    if not sends_batches(mix):
        return None
    over = [
        (name, limit, source)
        for name, (limit, source) in limits.items()
        if limit is not None and batch_texts > limit
    ]
    if not over:
        return None
    lowest = min(limit for _, limit, _ in over)
    named = "; ".join(
        f"{name} takes at most {limit} texts a request ({source})" for name, limit, source in over
    )
    return (f"--batch-texts {batch_texts}: {named}, so every batched request would fail; give --batch-texts "
            f"{lowest} or fewer")  # fmt: skip


def refuse_batch_texts_over_ours(p: argparse.ArgumentParser, batch_texts: int, mix: str | None,
                                 server_args: str) -> None:  # fmt: skip
    """p.error where `mix` (None: the standard mix) sends batches of more texts than our server, started
    with `server_args`, takes (batch_texts_refused)."""
    from benchmarks.load.mix import STANDARD

    ours = {"our server": ours_batch_limit(server_args)}
    if refused := batch_texts_refused(batch_texts, mix or STANDARD, ours):
        p.error(refused)


def check_answers(url: str, paths: Iterable[str] = (), api_key: str | None = None) -> None:
    """Before any load on a server given by URL: GET /ready must answer 200, and one text POSTed to each
    of `paths` (with the API key, if given) 2xx, else the run would be a report of 100% failures (a
    server with --api-key answers every request without it 401). Exit 2 with what to do."""
    try:
        with urllib.request.urlopen(url + "/ready", timeout=10) as r:
            status = r.status
    except urllib.error.HTTPError as e:
        status = e.code
    except (OSError, ValueError) as e:  # refused, unknown host, timed out; a URL urllib cannot read
        reason = getattr(e, "reason", e)
        usage_exit(f"error: --url {url}: nothing answers there ({reason}); start the server, or give its URL")
    if status != 200:
        usage_exit(f"error: --url {url}: GET /ready answered {status}, not 200: the server is not ready "
                   "(still loading, or draining); wait for it, or give another URL")  # fmt: skip
    headers = {"content-type": "application/json"} | (
        {"authorization": f"Bearer {api_key}"} if api_key else {}
    )
    for path in paths:
        body = json.dumps({"text": "One sentence to check that the server answers before the load."}).encode()
        try:
            with urllib.request.urlopen(urllib.request.Request(url + path, body, headers), timeout=30):
                continue
        except urllib.error.HTTPError as e:
            status, said = e.code, e.read()[:300].decode(errors="replace")
        except OSError as e:
            usage_exit(f"error: --url {url}: POST {path} got no answer ({getattr(e, 'reason', e)})")
        if status == 401 and api_key:
            usage_exit(f"error: --url {url}: POST {path} answered 401 to the API key given: the server has "
                       "another; pass its key with --api-key (or $ELECTRA_API_KEY)")  # fmt: skip
        if status == 401:
            usage_exit(f"error: --url {url}: POST {path} answered 401: the server wants an API key; pass it "
                       "with --api-key KEY or set $ELECTRA_API_KEY")  # fmt: skip
        usage_exit(f"error: --url {url}: POST {path} answered {status} ({said}): every such request of the "
                   "load would fail; fix the server, or leave that kind out of --mix")  # fmt: skip
