"""app/'s layers import downwards only (app/__init__.py): model/ knows nothing of scheduling or HTTP,
scheduling/ nothing of HTTP."""

import ast
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "app"
BELOW = {"model": set(), "scheduling": {"model"}, "http": {"model", "scheduling"}}


def imported_layers(path: Path) -> set[str]:
    layers = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "app" and len(parts) > 1 and parts[1] in BELOW:
                layers.add(parts[1])
    return layers


def test_each_layer_imports_only_the_layers_below_it():
    wrong = []
    for layer, allowed in BELOW.items():
        files = sorted((APP / layer).glob("*.py"))
        assert files, f"app/{layer}/ is empty"
        for path in files:
            above = imported_layers(path) - allowed - {layer}
            if above:
                wrong.append(f"app/{layer}/{path.name} imports app.{', app.'.join(sorted(above))}")
    assert not wrong, wrong


BULK = APP.parent / "bulk"


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return names


def test_bulk_scores_through_app_model_and_nothing_of_http_or_scheduling():
    """bulk/ is a fourth program on the bundle: it shares app/model/ with the server (so a document gets
    the server's numbers) and never goes through HTTP or the scheduler; nor does app/ know of bulk/."""
    files = sorted(BULK.glob("*.py"))
    assert files, "bulk/ is empty"
    wrong = [f"bulk/{p.name} imports app.{', app.'.join(sorted(imported_layers(p) - {'model'}))}"
             for p in files if imported_layers(p) - {"model"}]  # fmt: skip
    assert not wrong, wrong
    assert any("model" in imported_layers(p) for p in files)
    for path in APP.rglob("*.py"):
        assert not any(m.split(".")[0] == "bulk" for m in imported_modules(path)), path
    # The shard function knows nothing of Ray: only the Ray runner, its actor, its reports and its cluster module
    # import it.
    for p in files:
        ray = any(m.split(".")[0] == "ray" for m in imported_modules(p))
        assert ray == (p.name in ("on_ray.py", "ray_actor.py", "ray_reports.py", "ray_cluster.py")), (
            f"bulk/{p.name}: ray: {ray}"
        )


def test_the_server_loads_neither_ray_nor_pyarrow():
    """They come with the `bulk` extra only: the serving install has neither, so the server must not need them."""
    import subprocess
    import sys

    code = ("import sys, app.http.server, app.__main__; "
            "bad = [m for m in ('ray', 'pyarrow', 'bulk') if m in sys.modules]; assert not bad, bad")  # fmt: skip
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=APP.parent, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr


def test_the_model_layer_and_bulk_load_no_web_framework():
    """app/model/ is what bulk/ and export/ share with the server: importing it, or any of bulk/, must not
    pull in Litestar, HTTP or the scheduler (the error shape lives in app/errors.py, Litestar's side of it
    in app/http/errors.py)."""
    import subprocess
    import sys

    code = ("import importlib, pkgutil, sys, app.model, bulk\n"
            "for package in (app.model, bulk):\n"
            "    for m in pkgutil.iter_modules(package.__path__):\n"
            "        importlib.import_module(f'{package.__name__}.{m.name}')\n"
            "bad = [m for m in ('litestar', 'app.http', 'app.scheduling') if m in sys.modules]; assert not bad, bad")  # fmt: skip
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=APP.parent, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr


def test_onnx_runtime_telemetry_is_off_unless_the_user_turns_it_on(tmp_path):
    """ONNX Runtime 1.29 on sends usage telemetry from Linux and keeps a device id under $HOME/.cache: a
    server in a cluster looked up mobile.events.data.microsoft.com at every start."""
    import subprocess
    import sys

    code = ("import app.model.engine, onnxruntime; "
            "onnxruntime.InferenceSession('models/detector/model.onnx', providers=['CPUExecutionProvider'])")  # fmt: skip
    env = {k: v for k, v in __import__("os").environ.items() if k != "ORT_DISABLE_TELEMETRY"}
    r = subprocess.run([sys.executable, "-c", code], cwd=APP.parent, env={**env, "HOME": str(tmp_path)},
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / ".cache" / "Microsoft").exists()
