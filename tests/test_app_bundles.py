"""Bundle integrity (issue 12, item 7): every bundle file is hash-checked at load; a broken bundle fails
alone while the others keep serving, and /ready and /models say which and why; old bundles without
per-file hashes are served with a warning."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    from app_fixtures import REPO, app_env, bundles_dir, run_server  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.app_fixtures import REPO, app_env, bundles_dir, run_server  # noqa: F401

from app.bundle import BundleError, read_bundle, sha256_file


def _copy(bundles_dir: Path, dst: Path) -> Path:
    for name in ("detector", "sentiment"):
        shutil.copytree(bundles_dir / name, dst / name)
    return dst


def _tamper_tokenizer(bundle: Path) -> None:
    tok = json.loads((bundle / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[10:12]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # still a valid tokenizer: only the hash can tell
    (bundle / "tokenizer.json").write_text(json.dumps(tok))


def test_export_records_the_sha256_of_every_file(bundles_dir):
    for name in ("detector", "sentiment"):
        manifest = json.loads((bundles_dir / name / "manifest.json").read_text())
        assert manifest["files"] == {
            f: sha256_file(bundles_dir / name / f) for f in ("model.onnx", "tokenizer.json")
        }
        assert manifest["model_sha256"] == manifest["files"]["model.onnx"]  # older servers read this one


def test_an_altered_tokenizer_is_caught_by_the_reader_export_also_uses(bundles_dir, tmp_path):
    from export.bundle_writer import verify_bundle  # export's check is the server's reader

    bundle = _copy(bundles_dir, tmp_path) / "detector"
    _tamper_tokenizer(bundle)
    for check in (read_bundle, verify_bundle):
        with pytest.raises(BundleError, match="tokenizer.json does not match its manifest"):
            check(bundle)


def test_a_broken_bundle_fails_alone(bundles_dir, tmp_path):
    models = _copy(bundles_dir, tmp_path / "models")
    _tamper_tokenizer(models / "sentiment")
    with run_server(models, log_dir=tmp_path) as s, s.client() as c:
        ready = c.get("/ready")
        assert ready.status_code == 200, ready.text  # the detector serves: keep routing traffic here
        body = ready.json()
        assert body["status"] == "degraded" and "sentiment" in body["detail"]
        assert "tokenizer.json does not match its manifest" in body["broken"]["sentiment"]
        listed = c.get("/models").json()
        assert [m["name"] for m in listed["models"]] == ["detector"]
        assert "tokenizer.json" in listed["broken"]["sentiment"]
        assert set(listed["models"][0]["files_sha256"]) == {"model.onnx", "tokenizer.json"}
        assert c.post("/detect", json={"text": "the chef cooked"}).status_code == 200
        r = c.post("/classify", json={"text": "great", "model": "sentiment"})
        assert r.status_code == 503 and "broken" in r.json()["error"]["message"]
        assert "tokenizer.json" in r.json()["error"]["message"]


def test_a_bundle_that_does_not_load_fails_alone(bundles_dir, tmp_path):
    """Hashes right, graph unloadable (a manifest re-signed over a truncated file): found at load time."""
    models = _copy(bundles_dir, tmp_path / "models")
    bad = models / "detector"
    (bad / "model.onnx").write_bytes((bad / "model.onnx").read_bytes()[:1000])
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["model_sha256"] = manifest["files"]["model.onnx"] = sha256_file(bad / "model.onnx")
    (bad / "manifest.json").write_text(json.dumps(manifest))
    with run_server(models, log_dir=tmp_path) as s, s.client() as c:
        assert c.get("/ready").json()["status"] == "degraded"
        assert "loading failed" in c.get("/models").json()["broken"]["detector"]
        assert c.post("/classify", json={"text": "great"}).status_code == 200
        r = c.post("/detect", json={"text": "hi", "model": "detector"})
        assert r.status_code == 503 and "loading failed" in r.json()["error"]["message"]


def test_nothing_servable_refuses_to_start_naming_the_file(bundles_dir, tmp_path):
    bundle = _copy(bundles_dir, tmp_path / "models") / "detector"
    _tamper_tokenizer(bundle)
    r = subprocess.run(
        [sys.executable, "-m", "app", "--models", str(bundle)], cwd=REPO, env=app_env(),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2
    assert str(bundle / "tokenizer.json") in r.stderr and "export the bundle again" in r.stderr


def test_an_old_bundle_without_file_hashes_is_served_with_a_warning(bundles_dir, tmp_path):
    models = _copy(bundles_dir, tmp_path / "models")
    manifest = json.loads((models / "detector" / "manifest.json").read_text())
    del manifest["files"]
    (models / "detector" / "manifest.json").write_text(json.dumps(manifest))
    with run_server(models, log_dir=tmp_path) as s, s.client() as c:
        assert c.get("/ready").json()["status"] == "ready"
        info = {m["name"]: m for m in c.get("/models").json()["models"]}
        assert info["detector"]["files_sha256"] == {"model.onnx": manifest["model_sha256"]}
        assert "export it again" in info["detector"]["warnings"][0]
        assert info["sentiment"]["warnings"] == []
        assert c.post("/detect", json={"text": "the chef cooked"}).status_code == 200
        assert "tokenizer.json is not checked" in s.log()
