"""Bundle integrity (issue 12, item 7): every bundle file is hash-checked at load; a broken bundle fails
alone while the others keep serving, and /ready and /models say which and why; old bundles without
per-file hashes are served with a warning."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

try:
    from app_fixtures import REPO, bundles_dir, run_server, start_app  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.app_fixtures import REPO, bundles_dir, run_server, start_app  # noqa: F401

from app.model.bundle import BundleError, read_bundle, sha256_file
from tests.unprivileged import run_python


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
        # Named or not, the broken classifier is a 503; a kind nothing broken was meant to serve stays 404.
        r = c.post("/classify", json={"text": "great"})
        assert r.status_code == 503 and "'sentiment'" in r.json()["error"]["message"], r.text
        assert s.metric("electra_bundle_broken", model="sentiment") == 1  # something to alert on
    # Where a rollout should stop at a broken bundle (deploy/deployment.yaml sets it): out of rotation.
    with run_server(models, "--no-ready-when-degraded", log_dir=tmp_path) as s, s.client() as c:
        ready = c.get("/ready")
        assert ready.status_code == 503 and ready.json()["status"] == "degraded", ready.text
        assert c.post("/detect", json={"text": "the chef cooked"}).status_code == 200  # still answers


def test_an_export_still_writing_beside_the_bundles_is_not_a_model(bundles_dir, tmp_path):
    """export fills a bundle under `.NAME.pid...` and puts one it replaces aside under a hidden name: the
    server listed the first as broken (with --no-ready-when-degraded, as deploy/ sets, never ready) and
    would have served the second as a model named after it."""
    from app.model.bundle import discover

    models = _copy(bundles_dir, tmp_path / "models")
    (models / ".new.pid4242.x1y2").mkdir()
    shutil.copy(models / "detector" / "model.onnx", models / ".new.pid4242.x1y2")  # half-written
    shutil.copytree(models / "detector", models / ".detector.old")  # a whole bundle, set aside
    bundles, broken = discover(models)
    assert sorted(b.name for b in bundles) == ["detector", "sentiment"] and broken == {}


def _truncate_and_resign(bad: Path) -> None:
    """Hashes right, graph unloadable: a manifest re-signed over a truncated model.onnx."""
    (bad / "model.onnx").write_bytes((bad / "model.onnx").read_bytes()[:1000])
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["model_sha256"] = manifest["files"]["model.onnx"] = sha256_file(bad / "model.onnx")
    (bad / "manifest.json").write_text(json.dumps(manifest))


def test_a_kind_no_bundle_was_meant_to_serve_is_404_even_beside_a_broken_one(bundles_dir, tmp_path):
    """A tampered classifier once made every /detect a 503 (retried by clients) where no detector exists."""
    models = tmp_path / "models"
    for name in ("sentiment", "tampered"):
        shutil.copytree(bundles_dir / "sentiment", models / name)
    _tamper_tokenizer(models / "tampered")
    with run_server(models, log_dir=tmp_path) as s, s.client() as c:
        r = c.post("/detect", json={"text": "the chef cooked"})
        assert r.status_code == 404 and r.json()["error"]["type"] == "unknown_model", r.text


def test_a_bundle_that_does_not_load_fails_alone(bundles_dir, tmp_path):
    """Found at load time, not by the hash check. The default detector's requests, which name no
    model, hear that it is broken (503), not that none was ever served (404)."""
    models = _copy(bundles_dir, tmp_path / "models")
    _truncate_and_resign(models / "detector")
    with run_server(models, log_dir=tmp_path) as s, s.client() as c:
        assert c.get("/ready").json()["status"] == "degraded"
        assert "loading failed" in c.get("/models").json()["broken"]["detector"]
        assert c.post("/classify", json={"text": "great"}).status_code == 200
        for named in ({"model": "detector"}, {}):
            r = c.post("/detect", json={"text": "hi", **named})
            assert r.status_code == 503 and "loading failed" in r.json()["error"]["message"], r.text
        assert "detector: loading failed; the other models are served" in s.log()


def test_a_server_whose_every_bundle_fails_to_load_stops_with_status_1(bundles_dir, tmp_path):
    """Left up with nothing to serve, it passed its liveness probe and was never ready: a replica that
    restarts nobody looks at."""
    bundle = _copy(bundles_dir, tmp_path / "models") / "detector"
    _truncate_and_resign(bundle)
    r = start_app("--models", str(bundle))
    assert r.returncode == 1, r.stderr[-3000:]
    assert "loading failed; no bundle is left to serve" in r.stderr
    assert "no bundle could be loaded: the server stops" in r.stderr


def test_nothing_servable_refuses_to_start_naming_the_file(bundles_dir, tmp_path):
    bundle = _copy(bundles_dir, tmp_path / "models") / "detector"
    _tamper_tokenizer(bundle)
    r = start_app("--models", str(bundle))
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


def _shift_load_check(bundle: Path, by: float) -> None:
    """The bundle's recorded reference outputs moved by `by`, as a CPU that computes them otherwise sees."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    expected = manifest["load_check"]["expected"]
    manifest["load_check"]["expected"] = [[min(1.0, p + by) for p in row] for row in expected]
    (bundle / "manifest.json").write_text(json.dumps(manifest))


def _edit_inputs(bundle: Path, manifest_inputs: list[str], check_inputs) -> None:
    """The manifest's `inputs` and its load-time check's rows changed; the graph keeps what it takes."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["inputs"] = manifest_inputs
    manifest["load_check"]["inputs"] = check_inputs(manifest["load_check"]["inputs"])
    (bundle / "manifest.json").write_text(json.dumps(manifest))


def test_the_load_time_check_is_reported_in_models_and_metrics(bundles_dir, tmp_path):
    models = _copy(bundles_dir, tmp_path / "models")
    # Manifests whose inputs are not the graph's: the check fed what the manifest listed (and failed the
    # bundle at load), while the engine serves what the graph takes. One leaves out an input the graph
    # takes, its check rows too (zeros, for a text); one lists an input the graph lacks, with rows for it.
    _edit_inputs(models / "detector", ["input_ids", "attention_mask"],
                 lambda rows: {k: v for k, v in rows.items() if k != "token_type_ids"})  # fmt: skip
    _edit_inputs(models / "sentiment", ["input_ids", "attention_mask", "token_type_ids", "position_ids"],
                 lambda rows: {**rows, "position_ids": rows["input_ids"]})  # fmt: skip
    with run_server(models, log_dir=tmp_path) as s, s.client() as c:
        assert c.get("/ready").json()["status"] == "ready"
        info = {m["name"]: m for m in c.get("/models").json()["models"]}
        for name in ("detector", "sentiment"):
            check = info[name]["load_check"]
            assert check["within_gate"] and check["max"] <= check["gate"]["max"], check
            assert check["machine"]["int8_kernel_path"] and check["values"] > 0
            assert s.metric("electra_load_check_within_gate", model=name) == 1.0
            assert s.metric("electra_load_check_deviation", model=name, stat="max") == pytest.approx(
                check["max"]
            )
        assert c.post("/detect", json={"text": "the chef cooked"}).status_code == 200
        assert c.post("/classify", json={"text": "great"}).status_code == 200


def test_a_bundle_off_its_gate_on_this_cpu_is_refused_or_served_with_a_warning(bundles_dir, tmp_path):
    models = _copy(bundles_dir, tmp_path / "models")
    _shift_load_check(models / "detector", 0.3)
    with run_server(models, log_dir=tmp_path) as s, s.client() as c:  # the default: refuse
        broken = c.get("/models").json()["broken"]["detector"]
        assert "from the bundle's reference" in broken and "not served" in broken, broken
        assert "--load-check warn" in broken  # says what to do
        assert c.get("/ready").json()["status"] == "degraded"
        assert c.post("/classify", json={"text": "great"}).status_code == 200  # the other bundle serves
    with run_server(models, "--load-check", "warn", log_dir=tmp_path) as s, s.client() as c:
        check = {m["name"]: m for m in c.get("/models").json()["models"]}["detector"]["load_check"]
        assert not check["within_gate"] and check["max"] >= 0.29, check
        assert s.metric("electra_load_check_within_gate", model="detector") == 0.0
        assert c.post("/detect", json={"text": "the chef cooked"}).status_code == 200
        assert "served anyway (--load-check warn)" in s.log()


def test_bundles_are_named_as_listed_and_what_cannot_be_read_fails_alone(bundles_dir, tmp_path):
    """Two links to directories of one name were one bundle, the other dropped without a word; a bundle
    copied without its manifest was skipped in silence; a file the server's user cannot read stopped the
    whole server with a traceback. The lost+found of a volume mounted at --models is no bundle."""
    from app.model.bundle import discover

    models = tmp_path / "models"
    models.mkdir()
    for name, target in (("a", "detector"), ("b", "sentiment")):
        real = tmp_path / f"real-{name}" / "model"  # both targets are directories called "model"
        shutil.copytree(bundles_dir / target, real)
        (models / name).symlink_to(real)
    (models / "partial").mkdir()
    shutil.copyfile(bundles_dir / "sentiment" / "model.onnx", models / "partial" / "model.onnx")
    (models / "lost+found").mkdir()
    (models / "README.md").write_text("bundles live here")
    bundles, broken = discover(models)
    assert [b.name for b in bundles] == ["a", "b"]
    assert list(broken) == ["partial"] and "no manifest.json" in broken["partial"]
    # Unreadable files, as the image's unprivileged user meets them (root reads anything: drop that).
    shutil.copytree(bundles_dir / "sentiment", models / "private")
    (models / "private" / "model.onnx").chmod(0o000)
    (models / "sealed").mkdir(mode=0o000)
    code = "import json, sys; from app.model.bundle import discover; print(json.dumps(discover(__import__('pathlib').Path(sys.argv[1]))[1]))"
    done = run_python(code, str(models))
    (models / "sealed").chmod(0o755)
    assert done.returncode == 0, done.stderr
    broken = json.loads(done.stdout)
    assert sorted(broken) == ["partial", "private", "sealed"], broken
    assert "model.onnx: cannot be read (Permission denied)" in broken["private"]
    assert "cannot be read" in broken["sealed"]


def test_a_bundle_too_long_for_the_batch_budget_fails_alone(bundles_dir, tmp_path):
    from app.metrics import Metrics
    from app.model.bundle import discover
    from app.scheduling.registry import Registry
    from app.settings import Settings, SettingsError

    models = _copy(bundles_dir, tmp_path / "models")
    manifest = json.loads((models / "sentiment" / "manifest.json").read_text())
    manifest["max_length"] = 8192  # not hashed: the manifest is what vouches for the rest
    (models / "sentiment" / "manifest.json").write_text(json.dumps(manifest))
    bundles, broken = discover(models)
    registry = Registry(bundles, Settings.from_sources([], env={})[0], Metrics(), broken)
    assert list(registry.bundles) == ["detector"]
    assert "is smaller than one row of 'sentiment' (max_length 8192)" in registry.broken["sentiment"]
    with pytest.raises(SettingsError, match="no bundle can be served"):
        Registry(
            [b for b in bundles if b.name == "sentiment"], Settings.from_sources([], env={})[0], Metrics()
        )


def test_a_window_stride_past_half_a_window_is_said_at_load(bundles_dir, tmp_path):
    """It was cut to half a window in silence; and said of classifiers too, which never use windows."""
    with run_server(bundles_dir, "--window-stride", "600", log_dir=tmp_path) as s:
        assert "detector: --window-stride 600 is more than half its window" in s.log()
        assert "sentiment: --window-stride" not in s.log()


def test_models_lists_a_quantized_bundles_long_vectors_by_count():
    """The shipped int8 detector's per-channel smoothing vectors made /models 790 kB, fetched by the page
    on every load; manifest.json keeps them."""
    import msgspec

    from app.model.bundle import discover
    from app.model.catalog import describe

    bundles, _ = discover(REPO / "models")
    listed = msgspec.json.encode(describe({b.name: b for b in bundles}, {"detector", "sentiment"}))
    assert len(listed) < 100_000, len(listed)
    assert b"numbers (in the bundle's manifest.json)" in listed


@pytest.mark.slow
def test_a_request_naming_no_model_goes_to_the_default_the_operator_set(bundles_dir, tmp_path):
    """The first bundle by name was the only rule: a classifier of one's own named "mysent" beside the shipped
    "sentiment" took every /classify that named no model. --default-classifier (and --default-detector)
    say which; one that is not served stops the start, naming what is."""
    models = tmp_path / "models"
    models.mkdir()
    for name, bundle in (("detector", "detector"), ("sentiment", "sentiment"), ("mysent", "sentiment")):
        (models / name).symlink_to(bundles_dir / bundle)
    # Empty (ELECTRA_DEFAULT_CLASSIFIER= from a template) is unset: the first by name.
    with run_server(models, "--default-classifier", "", log_dir=tmp_path) as s, s.client() as c:
        assert c.post("/classify", json={"text": "a fine film"}).json()["model"] == "mysent"  # by name
    flags = ("--default-classifier", "sentiment")
    with run_server(models, *flags, log_dir=tmp_path) as s, s.client() as c:
        assert c.post("/classify", json={"text": "a fine film"}).json()["model"] == "sentiment"
        assert c.post("/detect", json={"text": "a fine film"}).json()["model"] == "detector"
        defaults = {m["name"]: m["default"] for m in c.get("/models").json()["models"]}
        assert defaults == {"detector": True, "mysent": False, "sentiment": True}
    r = start_app("--models", str(models), "--default-classifier", "detector")
    assert r.returncode == 2, r.stderr[-2000:]
    assert (
        f"--default-classifier 'detector': a detector, not a classifier; the classifiers in the models directory "
        f"{models}: mysent, sentiment" in r.stderr
    )
    r = start_app("--models", str(models), "--default-detector", "nope")
    assert (
        r.returncode == 2
        and f"--default-detector 'nope': no bundle of that name; the detectors in the models directory {models}: detector"
        in r.stderr
    ), r.stderr[-2000:]


def test_a_training_run_among_the_models_is_named_one_with_its_export(tmp_path):
    """`--models runs`: a fine-tuning run (its tokenizer.json) was "no manifest.json beside its files (copied
    in part?)", a pretraining run went unmentioned. Each is said to be a run, with the export that makes its
    bundle; beside bundles it is not a broken one (/ready stays ok)."""
    from app.model.bundle import discover

    runs = tmp_path / "runs"
    (runs / "sent").mkdir(parents=True)
    for name in ("finetune_config.json", "metrics.jsonl", "tokenizer.json"):
        (runs / "sent" / name).write_text("{}")
    (runs / "long" / "checkpoints").mkdir(parents=True)
    (runs / "long" / "checkpoints" / "latest").write_text("step-00000100")
    (runs / "ckpt").mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (runs / "ckpt" / name).write_text("{}")
    with pytest.raises(BundleError) as refused:
        discover(runs)
    assert str(refused.value).splitlines() == [
        f"{runs / what} is {kind}, not a bundle: export it (python -m export {runs / what} --out "
        f"{runs / what}-bundle) and restart the server on the same --models {runs}, which serves it beside the "
        f"others; or move the run out of {runs}"
        for what, kind in (
            ("ckpt", "a checkpoint"),
            ("long", "a pretraining run"),
            ("sent", "a fine-tuning run"),
        )
    ]
    with pytest.raises(BundleError) as alone:
        discover(runs / "sent")
    assert str(alone.value) == (f"{runs / 'sent'} is a fine-tuning run, not a bundle: export it (python -m export "
                                f"{runs / 'sent'} --out {runs / 'bundles' / 'sent'}) and serve its bundle "
                                f"(--models {runs / 'bundles'})")  # fmt: skip
    (runs / "detector").symlink_to(REPO / "models" / "detector")
    bundles, broken = discover(runs)
    assert [b.name for b in bundles] == ["detector"] and broken == {}


def test_a_runs_export_goes_beside_the_served_bundles_under_a_new_name(tmp_path, caplog):
    """`--models bundles` with a run at bundles/ft-run was told `--out bundles/ft-run` (the run itself:
    refused) and `--models bundles`; with `--models models`, to serve --models bundles, which would stop
    the bundles in models/ being served. The bundle goes beside the served ones, under a new name, quoted."""
    from app.model.bundle import discover

    models = tmp_path / "my models"
    (models / "ft-run").mkdir(parents=True)
    (models / "ft-run" / "finetune_config.json").write_text("{}")
    (models / "ft-run-bundle").mkdir()  # taken: the next name
    (models / "detector").symlink_to(REPO / "models" / "detector")
    with caplog.at_level("WARNING"):
        assert [b.name for b in discover(models)[0]] == ["detector"]
    q = f"'{models}"
    assert (f"{models / 'ft-run'} is a fine-tuning run, not a bundle: export it (python -m export {q}/ft-run' "
            f"--out {q}/ft-run-bundle-2') and restart the server on the same --models {q}', which serves it beside "
            f"the others; or move the run out of {models}") in caplog.text  # fmt: skip


def test_a_checkpoints_directory_beside_bundles_is_no_run(tmp_path):
    """A checkpoints/ sub-directory directly in --models (even empty, beside valid bundles) made the models
    directory itself "a pretraining run, not a bundle", and the server refused to start."""
    from app.model.bundle import discover, training_run

    models = tmp_path / "m2"
    (models / "checkpoints").mkdir(parents=True)
    (models / "detector").symlink_to(REPO / "models" / "detector")
    assert training_run(models) is None  # an empty checkpoints/ is no run's
    assert [b.name for b in discover(models)[0]] == ["detector"]
    (models / "checkpoints" / "latest").write_text("step-00000100")  # a run's shape, but bundles beside it
    assert training_run(models) == "a pretraining run"
    assert [b.name for b in discover(models)[0]] == ["detector"]
    (models / "detector").unlink()
    with pytest.raises(BundleError, match=f"^{models} is a pretraining run, not a bundle"):
        discover(models)
    (models / "checkpoints" / "latest").unlink()
    (models / "checkpoints" / "step-00000100").mkdir()
    assert training_run(models) is None  # a step directory without its config.json is none either
    (models / "checkpoints" / "step-00000100" / "config.json").write_text("{}")
    assert training_run(models) == "a pretraining run"
    assert training_run(tmp_path) is None
    (tmp_path / "config.json").write_text(
        '{"objective": "electra", "max_steps": 10}'
    )  # before its first save
    assert training_run(tmp_path) == "a pretraining run"


def test_models_dot_inside_a_run_names_the_runs_bundle_by_its_directory(tmp_path, monkeypatch):
    """`--models .` from inside a run suggested --out bundles (the folder itself: Path('.').name is '')."""
    from app.model.bundle import BundleError, discover

    run = tmp_path / "pt"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "latest").write_text("step-00000010")
    monkeypatch.chdir(run)
    out, where = re.escape(str(tmp_path / "bundles" / "pt")), re.escape(str(tmp_path / "bundles"))
    with pytest.raises(BundleError, match=rf"--out {out}\) and serve its bundle \(--models {where}\)"):
        discover(Path("."))
    monkeypatch.chdir(run / "checkpoints")
    with pytest.raises(BundleError, match=rf"--out {out}\)"):
        discover(Path(".."))


def test_a_classifier_whose_manifest_names_other_than_its_outputs_fails_alone_and_bulk_refuses_it(
    bundles_dir, tmp_path
):
    """labels ["neg", "neu", "pos"] over a model of two outputs (a manifest edited by hand, which no hash
    covers) was served: /classify answered LABEL_0 and LABEL_1, names /models never listed, and bulk
    failed every part with a bare KeyError: 'neg'."""
    from bulk_helpers import run_bulk, write_jsonl

    models = _copy(bundles_dir, tmp_path / "models")
    manifest = json.loads((models / "sentiment" / "manifest.json").read_text())
    manifest["labels"] = ["neg", "neu", "pos"]
    (models / "sentiment" / "manifest.json").write_text(json.dumps(manifest))
    says = "`labels` names 3 output(s) (neg, neu, pos) and the model gives 2"
    with run_server(models, log_dir=tmp_path) as s, s.client() as c:
        assert says in c.get("/models").json()["broken"]["sentiment"]
        r = c.post("/classify", json={"text": "a great film"})
        assert r.status_code == 503 and says in r.json()["error"]["message"], r.text
        assert c.post("/detect", json={"text": "the chef cooked"}).status_code == 200
    corpus = write_jsonl(tmp_path / "c.jsonl", ["a great film"])
    refused = run_bulk(corpus, tmp_path / "out", "sentiment", "--models", str(models))
    assert refused.returncode == 2 and says in refused.stderr and not (tmp_path / "out").exists(), (
        refused.stderr
    )
