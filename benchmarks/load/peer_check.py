"""Before any timing: a peer server must answer what ours answers. For the same texts, the per-token
probabilities of each peer (its `{"results": [{"tokens", "probs"}]}`) against ours (`/detect`,
`"return": "tokens"`): sent one at a time (each alone in its batch), and all at once from many
connections (so the peer's dynamic batching pads them together). Same tokens, and probabilities within
`tolerance`; also the size of one answer, which differs by design (ours carries offsets and words)."""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def post(url: str, body: dict) -> tuple[dict, int]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        raw = r.read()
    return json.loads(raw), len(raw)


def ours_tokens(url: str, texts: list[str]) -> list[tuple[list[str], list[float]]]:
    body, _ = post(url + "/detect", {"texts": texts, "return": "tokens"})
    return [([t["token"] for t in r["tokens"]], [t["prob"] for t in r["tokens"]]) for r in body["results"]]


def peer_tokens(url: str, text: str) -> tuple[list[str], list[float]]:
    body, _ = post(url + "/detect", {"text": text})
    (r,) = body["results"]
    return r["tokens"], r["probs"]


def check(peer_url: str, ours_url: str, texts: list[str], tolerance: float = 1e-4) -> dict:
    """Raises SystemExit naming the first text that differs; returns the figures of the check."""
    want = ours_tokens(ours_url, texts)
    alone = [peer_tokens(peer_url, t) for t in texts]
    with ThreadPoolExecutor(len(texts)) as pool:
        together = list(pool.map(lambda t: peer_tokens(peer_url, t), texts))
    worst = {"alone": 0.0, "batched": 0.0}
    for how, got in (("alone", alone), ("batched", together)):
        for text, (tokens, probs), (w_tokens, w_probs) in zip(texts, got, want, strict=True):
            if tokens != w_tokens:
                raise SystemExit(
                    f"{peer_url} ({how}) tokenizes {text!r} differently: {tokens} vs ours {w_tokens}"
                )
            diff = max(abs(a - b) for a, b in zip(probs, w_probs, strict=True))
            if diff > tolerance:
                raise SystemExit(f"{peer_url} ({how}) differs from ours by {diff:.2g} on {text!r}")
            worst[how] = max(worst[how], diff)
    return {
        "texts": len(texts),
        "max_abs_diff_alone": worst["alone"],
        "max_abs_diff_batched": worst["batched"],
        "tolerance": tolerance,
        "response_bytes_one_text": post(peer_url + "/detect", {"text": texts[0]})[1],
        "ours_response_bytes_one_text": post(ours_url + "/detect", {"text": texts[0]})[1],
    }
