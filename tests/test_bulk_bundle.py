"""One job, one bundle: a worker that reads another bundle than the driver did (the directory swapped under
--models as the job ran, then a worker restarted) fails its parts instead of mixing two models' rows in
scores/, and a resume whose bundle differs in any file (manifest.json's max_length, tokenizer.json), not
only model.onnx, is refused as other settings are."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import threading
from pathlib import Path

import pytest
from bulk_helpers import MODELS, run_bulk, write_jsonl

import app
from app.model.bundle import ROW_SETTINGS, BundleError, read_bundle
from bulk.config import resolve
from bulk.fingerprint import BUNDLE_FILES, JobError, read_fingerprint

DOCS = ["The cat sat on the mat.", "A second document, of a few more words than the first one."]


def _models(tmp_path: Path) -> Path:
    """A --models holding a copy of the shipped detector, free to be changed."""
    models = tmp_path / "models"
    shutil.copytree(MODELS / "detector", models / "detector")
    return models


def _swap_for_the_classifier(models: Path) -> None:
    """The detector's directory replaced by the sentiment bundle, as `mv` or a sync would."""
    shutil.rmtree(models / "detector")
    shutil.copytree(MODELS / "sentiment", models / "detector")


def _cfg(tmp_path: Path, models: Path, src: Path | None = None):
    src = src or write_jsonl(tmp_path / "in" / "a.jsonl", DOCS)
    return resolve([str(src), "--out", str(tmp_path / "out"), "--model", "detector", "--models", str(models),
                    "--threads", "1", "--workers", "1"])  # fmt: skip


def test_a_scorer_whose_bundle_is_not_the_jobs_refuses_it_naming_both_sha256(tmp_path):
    from bulk.shard import Scorer

    models = _models(tmp_path)
    cfg = _cfg(tmp_path, models)
    at_start = read_bundle(cfg.bundle_dir).sha256_as_read
    assert set(at_start) == {"model.onnx", "tokenizer.json", ROW_SETTINGS}
    _swap_for_the_classifier(models)
    now = read_bundle(cfg.bundle_dir).sha256_as_read
    with pytest.raises(BundleError) as refused:
        Scorer(cfg, at_start)
    said = str(refused.value)
    assert "changed since the job started" in said and "Restore that bundle" in said and "new --out" in said
    for name in ("model.onnx", ROW_SETTINGS):  # the tokenizer is the same file in both bundles
        assert f"{name}: sha256 {at_start[name]} at the job's start, {now[name]} now" in said, said
    assert "tokenizer.json" not in said


def test_a_local_worker_that_loads_another_bundle_fails_its_parts_and_scores_none(tmp_path):
    """The reviewer's case, a worker (re)started once the bundle was swapped: its parts fail by name, and
    nothing of the classifier's reaches the job (before, it scored them with the classifier: exit 0)."""
    from bulk import local
    from bulk.inputs import shards
    from bulk.parts import plan

    models = _models(tmp_path)
    src = tmp_path / "in"
    for name in ("a", "b"):
        write_jsonl(src / f"{name}.jsonl", DOCS)
    cfg = _cfg(tmp_path, models, src)
    at_start = read_bundle(cfg.bundle_dir).sha256_as_read
    _swap_for_the_classifier(models)
    parts, _ = plan(*shards(str(src), "auto")[:2], "auto", 1 << 20)
    results: list[dict] = []
    local.run(parts, cfg, at_start, lambda r: results.append(r) and False, lambda *a: None, lambda: False)
    assert sorted(r["part"] for r in results) == ["a.jsonl#0", "b.jsonl#0"]
    for r in results:
        assert "output" not in r and "changed since the job started" in r["error"], r
        assert at_start["model.onnx"] in r["error"] and "Restore that bundle" in r["error"]
    assert not list((tmp_path / "out").glob("**/*.parquet"))  # not even under a temporary name


def test_a_ray_actor_that_loads_another_bundle_fails_its_parts(tmp_path):
    """The actor class Ray Data runs (restarted by Ray after its worker died), run here without Ray."""
    from bulk.inputs import shards
    from bulk.parts import plan
    from bulk.ray_actor import ScoreParts
    from options import as_dict

    models = _models(tmp_path)
    cfg = _cfg(tmp_path, models)
    at_start = read_bundle(cfg.bundle_dir).sha256_as_read
    _swap_for_the_classifier(models)
    parts, _ = plan(*shards(cfg.input, "auto")[:2], "auto", 1 << 20)
    actor = ScoreParts(as_dict(cfg), at_start)
    (result,) = [json.loads(r) for r in actor({"part": [json.dumps(p.__dict__) for p in parts]})["result"]]
    assert "output" not in result and "changed since the job started" in result["error"], result


def test_a_resume_with_another_manifest_json_is_refused_naming_the_file(tmp_path):
    """Same model.onnx, max_length 512 -> 128: the first run's rows had one window where the resume's
    would have several. Refused (exit 2), naming manifest.json and how to go on; --out left as it was."""
    models = _models(tmp_path)
    src = write_jsonl(tmp_path / "in" / "x.jsonl", DOCS)
    out = tmp_path / "out"
    flags = ("--models", str(models), "--workers", "1")
    first = run_bulk(src.parent, out, "detector", *flags, timeout=120)
    assert first.returncode == 0, first.stderr[-2000:]
    job = json.loads((out / "job.json").read_text())
    assert job[BUNDLE_FILES] == read_bundle(models / "detector").sha256_as_read
    manifest = models / "detector" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"max_length": 512', '"max_length": 128', 1))
    write_jsonl(tmp_path / "in" / "y.jsonl", DOCS)
    files = lambda: {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"}  # noqa: E731
    before = files()  # but the lock, which holds the pid of the run holding --out

    again = run_bulk(src.parent, out, "detector", *flags, timeout=120)
    assert again.returncode == 2, again.stderr[-2000:]
    assert "the bundle's files differ: manifest.json's row settings (sha256 " in again.stderr, again.stderr
    assert "model.onnx" not in again.stderr.split("other settings")[1].split("resuming")[0]
    assert f"Restore the bundle {models / 'detector'} as it was, use another --out" in again.stderr
    assert files() == before


def test_a_manifest_that_differs_only_in_what_an_export_again_changes_is_the_same_bundle(tmp_path):
    """The same checkpoint exported again writes another date, versions and checks into manifest.json, and
    every answer the same: a job resumed on it, or a worker reading it, goes on."""
    models = _models(tmp_path)
    before = read_bundle(models / "detector").sha256_as_read
    manifest = models / "detector" / "manifest.json"
    again = json.loads(manifest.read_text()) | {
        "created_at": "2030-01-01T00:00:00Z",
        "versions": {"onnx": "9"},
    }
    manifest.write_text(json.dumps(again | {"parity": {}, "load_check": None}))
    assert read_bundle(models / "detector").sha256_as_read == before
    manifest.write_text(json.dumps(again | {"threshold": 0.9}))  # the spans' default: another bundle
    assert read_bundle(models / "detector").sha256_as_read != before


def test_a_job_json_of_before_resumes_on_model_onnx_alone_then_holds_every_files_sha256(tmp_path):
    """A job.json that recorded model.onnx's sha256 alone is compared on that: its resume is accepted and
    job.json then records every file, so that a later resume with another tokenizer.json is refused."""
    models = _models(tmp_path)
    cfg = _cfg(tmp_path, models)
    bundle = read_bundle(cfg.bundle_dir)
    sha, files = bundle.manifest.model_sha256, bundle.sha256_as_read
    cfg.out.mkdir()
    old = {**json.loads(json.dumps(cfg.fingerprint())), "bundle_sha256": sha, "version": app.__version__,
           "part_bytes": 4096, "parquet_parts": "rows", "input_root": str(tmp_path / "in")}  # fmt: skip
    (cfg.out / "job.json").write_text(json.dumps(old))
    (cfg.out / "manifest.jsonl").write_text("{}\n")  # a finished part: other settings are refused, not new
    threshold = bundle.manifest.threshold

    part_bytes, _, pending = read_fingerprint(cfg, sha, None, threshold, files)
    assert part_bytes == 4096 and pending is not None and pending[BUNDLE_FILES] == files
    (cfg.out / "job.json").write_text(json.dumps(pending))

    other = files | {"tokenizer.json": "0" * 64}
    with pytest.raises(JobError) as refused:
        read_fingerprint(cfg, sha, None, threshold, other)
    said = str(refused.value)
    assert (
        f"the bundle's files differ: tokenizer.json (sha256 {files['tokenizer.json']} then, {'0' * 64} now)"
        in said
    )
    assert "manifest.json" not in said and "Restore the bundle" in said


def _ray_join_error(inner: str) -> ConnectionError:
    """What ray.init 2.60 raises: one ConnectionError, whatever went wrong, from the RuntimeError that holds
    the last attempt's traceback as text."""
    try:
        try:
            raise RuntimeError(f"Failed to connect to GCS. Last connection error: Traceback ...\n{inner}\n")
        except RuntimeError as e:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379") from e
    except ConnectionError as e:
        return e


def test_a_join_that_fails_names_the_token_only_for_an_authentication_error(monkeypatch):
    """The authentication hint was given only without RAY_AUTH_TOKEN: a wrong one got no hint at all; then
    it was given with a token set whatever the error, an address that is no head's (a node manager's port)
    told to compare tokens. Ray's error says which (its chained AuthenticationError, or another)."""
    from bulk.ray_cluster import _join_failed

    refused = _ray_join_error("ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: Authentication "
                              "token is missing or incorrect")  # fmt: skip
    not_a_head = _ray_join_error("ray.exceptions.RpcError: RPC error: ")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "not-the-clusters")
    said = _join_failed("10.0.0.1:6379", refused)
    assert (
        "the cluster refused the job's token (RAY_AUTH_TOKEN, set here): it may not be this cluster's" in said
    )
    for token in ("not-the-clusters", None):
        if token is None:
            monkeypatch.delenv("RAY_AUTH_TOKEN")
        said = _join_failed("10.0.0.1:6379", not_a_head)
        assert "10.0.0.1:6379 answers, but not as a Ray cluster's head (its GCS server)" in said, said
        assert "the address `ray start --head` printed" in said and "token" not in said.lower(), said
    said = _join_failed("10.0.0.1:6379", refused)
    assert "give the job the cluster's token" in said and "may not be" not in said


@pytest.mark.parametrize("wants_client_certificate", [False, True])  # Ray's TLS wants one from every client
def test_a_ray_address_answering_with_tls_says_to_give_the_job_the_clusters_tls_settings(
    tmp_path, monkeypatch, wants_client_certificate
):
    """A head run with RAY_USE_TLS, joined without it: the server closes on the job's hello, and the job
    said it was no head's port, sending its user after another address."""
    import ssl

    from bulk.ray_cluster import JoinError, _check_reachable

    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(tmp_path / "k.pem"),
                    "-out", str(tmp_path / "c.pem"), "-days", "1", "-subj", "/CN=127.0.0.2"],
                   check=True, capture_output=True, timeout=60)  # fmt: skip
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    if wants_client_certificate:
        tls.verify_mode = ssl.CERT_REQUIRED
        tls.load_verify_locations(tmp_path / "c.pem")
    server = socket.create_server(("127.0.0.2", 0))

    def answer() -> None:  # each connection, as a TLS server does, until the test closes it
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                with conn, contextlib.suppress(ssl.SSLError, OSError):
                    tls.wrap_socket(conn, server_side=True)

    threading.Thread(target=answer, daemon=True).start()
    address = f"127.0.0.2:{server.getsockname()[1]}"
    monkeypatch.delenv("RAY_USE_TLS", raising=False)
    with server, pytest.raises(JoinError, match=rf"^{address} \(--ray\) answers with TLS, and the job has no "
                                                 "RAY_USE_TLS: give it the cluster's TLS settings"):  # fmt: skip
        _check_reachable(address, f"{address} (--ray)")


def _finished_job(tmp_path: Path, cfg, line: dict) -> None:
    """--out holding `cfg`'s job.json and one finished part's manifest line."""
    bundle = read_bundle(cfg.bundle_dir)
    _, _, pending = read_fingerprint(cfg, bundle.manifest.model_sha256, tmp_path / "in",
                                     bundle.manifest.threshold, bundle.sha256_as_read)  # fmt: skip
    cfg.out.mkdir()
    (cfg.out / "job.json").write_text(json.dumps(pending | {"part_bytes": 4096}))
    (cfg.out / "manifest.jsonl").write_text(json.dumps(line) + "\n")


def _refusal(cfg) -> str:
    bundle = read_bundle(cfg.bundle_dir)
    with pytest.raises(JobError) as refused:
        own = bundle.manifest.threshold if bundle.manifest.kind == "detector" else None
        read_fingerprint(cfg, bundle.manifest.model_sha256, None, own, bundle.sha256_as_read)
    return str(refused.value)


def test_an_out_holding_another_job_says_so_first_not_to_restore_a_bundle(tmp_path):
    """A sentiment job on corpus B given the --out of a detector job on corpus A was told two sha256 pairs
    and to restore the bundle as it was, though nothing had changed: the user picked another model."""
    _finished_job(tmp_path, _cfg(tmp_path, MODELS), {"part": "a.jsonl#0", "rows": 3, "rejects": 0})
    b = write_jsonl(tmp_path / "b" / "b.jsonl", DOCS)
    cfg = resolve([str(b), "--out", str(tmp_path / "out"), "--model", "sentiment", "--models", str(MODELS)])
    said = _refusal(cfg)
    assert said.startswith(f"{cfg.out} holds another job (detector on {tmp_path / 'in' / 'a.jsonl'}), not this "
                           f"one (sentiment on {b}): use a new --out"), said  # fmt: skip
    assert "Restore" not in said and "sha256" not in said


def test_an_out_whose_job_rejected_every_document_says_it_scored_none(tmp_path):
    """Every document rejected for --text-field, the rerun with the right field on the same --out was told
    only 'other settings (text_field ...)'."""
    _finished_job(tmp_path, _cfg(tmp_path, MODELS), {"part": "a.jsonl#0", "rows": 0, "rejects": 3})
    cfg = resolve([str(tmp_path / "in" / "a.jsonl"), "--out", str(tmp_path / "out"), "--model", "detector",
                   "--models", str(MODELS), "--text-field", "review"])  # fmt: skip
    said = _refusal(cfg)
    assert said == (f"{cfg.out} holds a job with other settings (text_field: 'text' then, 'review' now) that scored "
                    "no document: each was rejected (rejects.jsonl says why). Its files are left as they are; use "
                    "a new --out, or remove that directory to start again")  # fmt: skip
