"""A detector's default threshold (issue 21): read from its bundle's manifest, shown in /models, used by a
request that names none; a request's own threshold still wins; a bundle exported before calibration
keeps 0.5 and says so. Punctuation is never a span."""

from __future__ import annotations

import json
import shutil

try:
    from app_fixtures import bundles_dir, run_server  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.app_fixtures import bundles_dir, run_server  # noqa: F401

TEXT = "The chef ate the airport, and then the moon sang loudly!"


def _calibrated_copy(bundles_dir, dst, threshold: float):
    """The fixture detector as a calibrated export leaves it: `threshold` and `calibration` in the
    manifest (the manifest is not among the hashed files: it vouches for them)."""
    shutil.copytree(bundles_dir / "detector", dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest["threshold"] = threshold
    manifest["calibration"] = {"method": "platt", "scale": 1.0, "bias": 0.0, "operating_point": "test"}
    (dst / "manifest.json").write_text(json.dumps(manifest))


def test_default_threshold_comes_from_the_manifest(bundles_dir, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    shutil.copytree(bundles_dir / "detector", models / "old")  # exported without calibration
    # The fixture's random weights give probabilities around 0.5; a threshold in their spread.
    with run_server(models, log_dir=tmp_path) as s, s.client() as c:
        probs = sorted(
            w["prob"] for w in c.post("/detect", json={"text": TEXT}).json()["results"][0]["words"]
        )
    threshold = round(probs[len(probs) // 2], 3)
    _calibrated_copy(bundles_dir, models / "new", threshold)

    with run_server(models, log_dir=tmp_path) as s, s.client() as c:
        info = {m["name"]: m for m in c.get("/models").json()["models"]}
        assert info["new"]["threshold"] == threshold and info["new"]["calibrated"] is True
        assert info["new"]["calibration"]["method"] == "platt"
        assert info["old"]["threshold"] == 0.5 and info["old"]["calibrated"] is False
        assert "not calibrated" in info["old"]["calibration"]["note"]

        default = c.post("/detect", json={"text": TEXT, "model": "new"}).json()
        assert default["threshold"] == threshold
        explicit = c.post("/detect", json={"text": TEXT, "model": "new", "threshold": threshold}).json()
        assert default["results"] == explicit["results"]
        words = default["results"][0]["words"]
        spans = default["results"][0]["summary"]["spans"]
        expected = [
            w["text"] for w in words if w["prob"] >= threshold and any(ch.isalnum() for ch in w["text"])
        ]
        assert [sp["text"] for sp in spans] == expected and expected
        # Punctuation keeps its probability but is never a span.
        assert any(not w["text"].isalnum() for w in words)
        assert all(any(ch.isalnum() for ch in sp["text"]) for sp in spans)
        everything = c.post("/detect", json={"text": TEXT, "model": "new", "threshold": 0.0}).json()
        assert len(everything["results"][0]["summary"]["spans"]) == sum(
            any(ch.isalnum() for ch in w["text"]) for w in words
        )

        old = c.post("/detect", json={"text": TEXT, "model": "old"}).json()
        assert old["threshold"] == 0.5
