"""The control plane's layers import one way only (llmgw.control's package docstring)."""

import ast
from pathlib import Path

import llmgw.control

ROOT = Path(llmgw.control.__file__).parent

# What each layer (a package, or a top-level module) may import besides itself.
ALLOWED = {
    "spec": set(),
    "state": {"spec"},
    "store": {"spec", "state", "config"},
    "decide": {"spec", "state", "store"},
    "leader": {"spec", "state", "store", "decide", "config", "metrics"},
    "api": {"spec", "state", "store", "decide", "leader", "config", "metrics"},
    # The HTTP port sits at the api layer, beside it: it gets the servicers and
    # interceptors from the wiring, and imports no servicer module.
    "http": {"spec", "state", "store", "decide", "leader", "config", "metrics"},
    "config": {"spec"},
    "metrics": set(),
}


def _layer_of(parts: tuple[str, ...]) -> str:
    return parts[0]


def _imports(path: Path) -> list[tuple[str, ...]]:
    """The llmgw.control modules `path` imports, as parts below llmgw.control."""
    here = path.relative_to(ROOT).with_suffix("").parts
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(here[: len(here) - node.level])
                target = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.startswith("llmgw.control."):
                target = node.module.split(".")[2:]
            else:
                continue
            out.append(tuple(target) or (node.names[0].name,))
        elif isinstance(node, ast.Import):
            out += [tuple(a.name.split(".")[2:]) for a in node.names if a.name.startswith("llmgw.control.")]
    return out


def test_every_import_goes_down_the_layers():
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        layer = _layer_of(path.relative_to(ROOT).with_suffix("").parts)
        if layer not in ALLOWED:  # main, controlplane, __init__: the wiring may import anything
            continue
        for target in _imports(path):
            other = _layer_of(target)
            if other != layer and other not in ALLOWED[layer]:
                wrong.append(f"{path.relative_to(ROOT)} imports {'.'.join(target)}")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_the_check_sees_a_wrong_import():
    # The walk above must resolve relative imports, or it would pass vacuously.
    assert ("decide", "placement") in _imports(ROOT / "decide" / "reconcile.py")
    assert ("spec", "catalog") in _imports(ROOT / "store" / "models.py")
