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
