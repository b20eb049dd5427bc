"""The checks of .ci/real-engines that talk HTTP or read bundles. Standard library plus numpy, onnxruntime
and tokenizers (only `triton-check` needs those, and runs in the Triton venv); one subcommand per check.

    compare URL_A URL_B KEY           /ready, /detect, /classify, /schema, / answered identically by two servers
    traffic URL KEY SECONDS           a bounded stream of requests to one server (for Prometheus to scrape)
    promql PROM_URL JOB               a real PromQL histogram_quantile over electra_request_duration_seconds
    triton-repo MODELS OUT SITE       export's Triton repository for every bundle, served by a Python model
    triton-check URL OUT MODELS       Triton: READY, config as exported, outputs == the bundle's within 1e-6
    kube-manifests DEPLOY OUT PORT KEY IMAGE
                                      deploy/'s Secret and Deployment for `podman kube play`: this run's key
                                      and image, one replica, the container port published on PORT
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

TEXTS = [
    "The chef cooked the meal, and the guests ate it slowly in the garden.",
    "The chef ate the airport.",
    "Crème brûlée at the Café — naïve façade, Ångström! I ❤️ emoji 😀 and 東京タワー",
    "a gorgeous, witty, seductive movie",
    "the plot is thin and the acting is worse.",
]


def say(msg: str) -> None:
    print(f"[real-engines] {msg}", flush=True)


def http(url: str, body: object | None = None, key: str | None = None, timeout: float = 30):
    data = None if body is None else json.dumps(body).encode()
    headers = {"content-type": "application/json"} if data else {}
    if key:
        headers["x-api-key"] = key
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_ready(url: str, key: str | None, seconds: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        try:
            if http(url, key=key, timeout=2)[0] == 200:
                return time.monotonic() - start
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} not ready after {seconds:.0f} s")


# ------------------------------------------------------------------------------------------ container
def compare(a: str, b: str, key: str) -> None:
    for url in (a, b):
        say(f"{url}/ready answered 200 after {wait_ready(url + '/ready', key, 180):.1f} s")
    bodies = [
        ("/detect", {"texts": TEXTS, "return": "both"}),
        ("/detect", {"text": TEXTS[1], "return": "words", "threshold": 0.1}),
        ("/classify", {"texts": TEXTS}),
        ("/detect", {"text": ""}),  # the error answer too
        ("/schema/openapi.json", None),  # GETs: the API document and the page, from the image's packages
        ("/", None),
    ]
    for path, body in bodies:
        (sa, ra), (sb, rb) = http(a + path, body, key), http(b + path, body, key)
        ja, jb = (ra, rb) if path == "/" else (json.loads(ra), json.loads(rb))
        if (sa, ja) != (sb, jb) or sa >= 500:
            raise SystemExit(f"{path} differs:\n  {a}: {sa} {ra[:400]!r}\n  {b}: {sb} {rb[:400]!r}")
        say(f"{path} {json.dumps(body, ensure_ascii=False)[:60]}...: both {sa}, identical ({len(ra)} bytes)")
    status, _ = http(a + "/detect", {"text": "no key"}, key=None)
    if key and status != 401:
        raise SystemExit(f"the container answered {status} without the API key, expected 401")


# ------------------------------------------------------------------------------------------ prometheus
def traffic(url: str, key: str, seconds: float) -> None:
    end, n = time.monotonic() + seconds, 0
    while time.monotonic() < end and n < 2000:
        status, _ = http(url + "/detect", {"texts": TEXTS[: 1 + n % len(TEXTS)]}, key)
        assert status == 200, status
        n += 1
        time.sleep(0.05)
    say(f"sent {n} /detect requests over {seconds:.0f} s")


def promql(prom: str, job: str) -> None:
    def query(q: str) -> list:
        status, body = http(f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": q}))
        data = json.loads(body)
        if status != 200 or data.get("status") != "success":
            raise SystemExit(f"PromQL {q!r}: {status} {body[:300]!r}")
        return data["data"]["result"]

    up = query(f'up{{job="{job}"}}')
    if not up or up[0]["value"][1] != "1":
        raise SystemExit(f"Prometheus has not scraped the server: up = {up}")
    q = (
        "histogram_quantile(0.9, sum by (le, endpoint) "
        f'(rate(electra_request_duration_seconds_bucket{{job="{job}"}}[1m])))'
    )
    for _ in range(30):  # rate() needs two scrapes that saw traffic
        rows = [r for r in query(q) if r["metric"].get("endpoint") == "/detect"]
        if rows and math.isfinite(float(rows[0]["value"][1])):
            break
        time.sleep(1)
    else:
        raise SystemExit(f"no finite p90 for /detect from {q!r}: {query(q)}")
    p90 = float(rows[0]["value"][1])
    assert 0 < p90 < 60, p90
    say(f"PromQL {q}\n[real-engines]   -> endpoint=/detect p90 = {p90 * 1000:.1f} ms; up{{job={job!r}}} = 1")


# ------------------------------------------------------------------------------------------ triton
MODEL_PY = '''"""Serves the exported model.onnx under Triton's Python backend with onnxruntime (no onnxruntime backend
is to be had here): Triton's core still parses the exported config, names, shapes and dynamic batching."""

import json
import os
import sys

# The stub's Python does not see PYTHONPATH: the venv holding numpy and onnxruntime is named beside us.
with open(os.path.join(os.path.dirname(__file__), "site-packages.txt")) as f:
    sys.path[:0] = f.read().split()

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        self.session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        self.inputs = [i["name"] for i in config["input"]]
        self.output = config["output"][0]["name"]

    def execute(self, requests):
        feeds = [{n: pb_utils.get_input_tensor_by_name(r, n).as_numpy() for n in self.inputs} for r in requests]
        self.batches = getattr(self, "batches", 0) + 1
        # The dynamic batcher joins requests of equal shape: run them as one batch, as the onnxruntime
        # backend would.
        if len({f[self.inputs[0]].shape for f in feeds}) == 1:
            out = self.session.run([self.output], {n: np.concatenate([f[n] for f in feeds]) for n in self.inputs})[0]
            sizes = np.cumsum([f[self.inputs[0]].shape[0] for f in feeds])[:-1]
            parts = np.split(out, sizes)
        else:
            parts = [self.session.run([self.output], f)[0] for f in feeds]
        return [pb_utils.InferenceResponse([pb_utils.Tensor(self.output, p)]) for p in parts]
'''


def triton_repo(models: str, out: str, site_packages: str) -> None:
    """export.bundle_writer.write_triton (what `python -m export --triton` writes) for every bundle, then the one
    line Triton cannot run here, the onnxruntime platform, swapped for the Python backend."""
    from export.bundle_writer import write_triton

    out_dir = Path(out)
    shutil.rmtree(out_dir, ignore_errors=True)
    for bundle in sorted(p.parent for p in Path(models).glob("*/manifest.json")):
        manifest = json.loads((bundle / "manifest.json").read_text())
        model_dir = write_triton(out_dir, bundle.name, bundle, manifest)
        config = (model_dir / "config.pbtxt").read_text()
        (model_dir / "config.exported.pbtxt").write_text(config)
        assert 'platform: "onnxruntime_onnx"' in config, config
        config = config.replace('platform: "onnxruntime_onnx"', 'backend: "python"')
        (model_dir / "config.pbtxt").write_text(config)
        (model_dir / "1" / "model.py").write_text(MODEL_PY)
        (model_dir / "1" / "site-packages.txt").write_text(site_packages + "\n")
        say(f"triton repository: {model_dir} ({manifest['kind']}, {manifest['precision']})")


def triton_check(url: str, repo: str, models: str) -> None:
    import onnxruntime as ort

    wait_ready(url + "/v2/health/ready", None, 180)
    for model_dir in sorted(p.parent for p in Path(repo).glob("*/config.pbtxt")):
        name, bundle = model_dir.name, Path(models) / model_dir.name
        manifest = json.loads((bundle / "manifest.json").read_text())
        session = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
        _check_triton_config(url, name, manifest, session)
        _check_triton_outputs(url, name, bundle, manifest, session)


def _check_triton_config(url: str, name: str, manifest: dict, session) -> None:
    """Triton's view of the model: READY, and its inputs, outputs and batching as the export wrote them."""
    status, _ = http(f"{url}/v2/models/{name}/ready")
    if status != 200:
        raise SystemExit(f"Triton model {name} not READY ({status})")
    status, body = http(f"{url}/v2/models/{name}/config")
    cfg = json.loads(body)
    want_out = [-1] if manifest["kind"] == "detector" else [len(manifest["labels"])]
    checks = {
        "input names = manifest = ONNX graph": [i["name"] for i in cfg["input"]]
        == manifest["inputs"]
        == [i.name for i in session.get_inputs()],
        "input dims [-1], INT64": all(
            i["dims"] == [-1] and i["data_type"] == "TYPE_INT64" for i in cfg["input"]
        ),
        "output name = manifest = ONNX graph": [o["name"] for o in cfg["output"]]
        == [manifest["output"]]
        == [o.name for o in session.get_outputs()],
        f"output dims {want_out}": [int(d) for d in cfg["output"][0]["dims"]] == want_out,
        "max_batch_size 64": cfg["max_batch_size"] == 64,
        "dynamic_batching": "dynamic_batching" in cfg,
    }
    bad = [k for k, ok in checks.items() if not ok]
    if bad:
        raise SystemExit(f"Triton's view of {name} fails: {bad}\n{json.dumps(cfg, indent=1)[:2000]}")
    say(f"Triton model {name}: READY; config as exported: {', '.join(checks)}")


def _feed(bundle: Path, manifest: dict) -> dict:
    """TEXTS through the bundle's tokenizer, padded to one batch."""
    import numpy as np
    from tokenizers import Tokenizer

    enc = Tokenizer.from_file(str(bundle / "tokenizer.json")).encode_batch(TEXTS)
    length = max(len(e.ids) for e in enc)
    feed = {
        "input_ids": np.array([e.ids + [0] * (length - len(e.ids)) for e in enc], np.int64),
        "attention_mask": np.array([[1] * len(e.ids) + [0] * (length - len(e.ids)) for e in enc], np.int64),
        "token_type_ids": np.zeros((len(enc), length), np.int64),
    }
    return {n: feed[n] for n in manifest["inputs"]}


def _check_triton_outputs(url: str, name: str, bundle: Path, manifest: dict, session) -> None:
    """Triton's outputs equal the bundle's under onnxruntime: one request of all rows, each row alone,
    and concurrent single-row requests joined by the dynamic batcher."""
    import numpy as np

    feed = _feed(bundle, manifest)
    n_rows = len(next(iter(feed.values())))

    def infer(rows: slice) -> np.ndarray:
        inputs = [{"name": n, "shape": list(v[rows].shape), "datatype": "INT64", "data": v[rows].ravel().tolist()}
                  for n, v in feed.items()]  # fmt: skip
        status, body = http(f"{url}/v2/models/{name}/infer", {"inputs": inputs}, timeout=120)
        if status != 200:
            raise SystemExit(f"Triton infer on {name}: {status} {body[:300]!r}")
        out = json.loads(body)["outputs"][0]
        return np.array(out["data"], np.float32).reshape(out["shape"])

    reference = session.run([manifest["output"]], feed)[0]
    whole = infer(slice(None))
    diff = float(np.abs(whole - reference).max())
    # Each row alone, one request after another: the same as onnxruntime on that row alone.
    alone = [
        session.run([manifest["output"]], {n: v[i : i + 1] for n, v in feed.items()})[0]
        for i in range(n_rows)
    ]
    diff_alone = max(float(np.abs(infer(slice(i, i + 1)) - alone[i]).max()) for i in range(n_rows))
    if not (diff <= 1e-6 and diff_alone <= 1e-6):
        raise SystemExit(f"{name}: Triton vs the bundle differ by {diff:.2e} / {diff_alone:.2e} (> 1e-6)")
    say(
        f"Triton model {name}: outputs {list(whole.shape)} match the bundle under onnxruntime within 1e-6: "
        f"max |diff| {diff:.1e} (one request of {n_rows} rows), {diff_alone:.1e} (each row alone)"
    )
    # All rows at once as single-row requests: the dynamic batcher joins them (fewer executions than
    # inferences). A dynamically quantized int8 model scores a row a little differently beside other
    # rows (activation scales per batch), so this part is reported, not held to 1e-6.
    before = stats(url, name)
    for _ in range(3):
        with ThreadPoolExecutor(n_rows) as pool:
            rows = list(pool.map(lambda i: infer(slice(i, i + 1)), range(n_rows)))
    after = stats(url, name)
    joined = float(np.abs(np.concatenate(rows) - np.concatenate(alone)).max())
    say(
        f"Triton model {name}: dynamic batching: {after[0] - before[0]} concurrent single-row inferences "
        f"ran in {after[1] - before[1]} executions; max |diff| to each row alone {joined:.1e}"
    )


# ------------------------------------------------------------------------------------------ kubernetes
def kube_manifests(deploy: str, out: str, port: str, key: str, image: str) -> None:
    """What `podman kube play` runs of deploy/: the Deployment as it is, but for the values a cluster
    would supply (the registry's image, one replica) and a host port to reach the pod by (there is no
    Service without a cluster). The Secret goes to OUT.secret.json for `podman secret create`: podman
    4.3 resolves a secretKeyRef only from a podman secret holding JSON {key: base64 value}, which its
    own play of a Secret manifest does not write. PyYAML: in the test venv (scripts/test)."""
    import base64

    import yaml

    secret = yaml.safe_load((Path(deploy) / "secret" / "secret.yaml").read_text())
    data = {k: base64.b64encode(key.encode()).decode() for k in secret["stringData"]}
    Path(out + ".secret.json").write_text(json.dumps(data))
    deployment = yaml.safe_load((Path(deploy) / "deployment.yaml").read_text())
    deployment["spec"]["replicas"] = 1
    # A scheduler's field; podman places the one pod on this machine.
    deployment["spec"]["template"]["spec"].pop("topologySpreadConstraints", None)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    container["image"] = image
    container["ports"][0]["hostPort"] = int(port)
    Path(out).write_text(yaml.safe_dump(deployment, sort_keys=False))
    say(
        f"wrote {out} (deploy/deployment.yaml, image {image}, host port {port}) and its secret ({secret['metadata']['name']})"
    )


def stats(url: str, name: str) -> tuple[int, int]:
    body = json.loads(http(f"{url}/v2/models/{name}/stats")[1])["model_stats"][0]
    return int(body["inference_count"]), int(body["execution_count"])


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {
        "compare": lambda: compare(*args),
        "traffic": lambda: traffic(args[0], args[1], float(args[2])),
        "promql": lambda: promql(*args),
        "triton-repo": lambda: triton_repo(*args),
        "triton-check": lambda: triton_check(*args),
        "kube-manifests": lambda: kube_manifests(*args),
    }[cmd]()
