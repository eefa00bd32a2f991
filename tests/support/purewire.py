"""Run pytest with the router's compiled wire modules loaded from their Python source.

``make setup`` compiles :data:`MODULES` (services/router/setup.py); a build
without a C compiler, or with ``LLMGW_PURE_PYTHON=1``, runs the same source
as ordinary Python. The suite runs the compiled build (what ``make setup``
and the images install); this runs chosen test files against the other one,
so both stay the same wire: ``python -m tests.support.purewire FILE...``.
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.util
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path

SETUP = Path(__file__).resolve().parents[2] / "services" / "router" / "setup.py"


def compiled_modules() -> tuple[str, ...]:
    """The modules services/router/setup.py compiles (its ``COMPILED``), as import names."""
    tree = ast.parse(SETUP.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "COMPILED" for t in node.targets):
            return tuple(f"llmgw.router.{name}" for name in ast.literal_eval(node.value))
    raise RuntimeError(f"no COMPILED in {SETUP}")


MODULES = compiled_modules()


class SourceFirst(importlib.abc.MetaPathFinder):
    """Finds :data:`MODULES` as their ``.py`` source, beside any compiled extension."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: object = None) -> ModuleSpec | None:
        if name not in MODULES or path is None:
            return None
        source = name.rpartition(".")[2] + ".py"
        for directory in path:
            candidate = Path(directory) / source
            if candidate.is_file():
                return importlib.util.spec_from_file_location(name, candidate)
        return None


def install() -> None:
    """Load :data:`MODULES` from source from now on (before anything imports them)."""
    loaded = [name for name in MODULES if name in sys.modules]
    if loaded:
        raise RuntimeError(f"already imported compiled: {loaded}")
    sys.meta_path.insert(0, SourceFirst())


def main(argv: list[str]) -> int:
    install()
    import pytest

    for name in MODULES:
        module = importlib.import_module(name)
        if module.COMPILED or not str(module.__file__).endswith(".py"):
            print(f"purewire: {name} did not load from source ({module.__file__})", file=sys.stderr)
            return 2
    return int(pytest.main(["-q", "-p", "no:cacheprovider", *argv]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
