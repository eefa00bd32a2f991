"""The router's wire modules as built: compiled by ``make setup``, and the same wire as pure Python.

services/router/setup.py compiles the modules its ``COMPILED`` names with
Cython (the connections, the stream writer, the upstream pool); what the
suite and the benchmarks run must be that build (what the images install), and the source must
still run as ordinary Python (a build without a C compiler).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.router.main import COMPILED_MODULES, request_path_build
from tests.support.purewire import MODULES

ROOT = Path(__file__).resolve().parents[3]


def test_the_router_knows_which_modules_setup_compiles():
    assert tuple(module.__name__ for module in COMPILED_MODULES) == MODULES


@pytest.mark.skipif(bool(os.environ.get("LLMGW_PURE_PYTHON")), reason="built pure Python on purpose")
def test_make_setup_compiled_the_wire_modules():
    for name in MODULES:
        module = importlib.import_module(name)
        assert module.COMPILED, f"{name} runs as pure Python: {module.__file__}"
        assert not str(module.__file__).endswith(".py")
    assert request_path_build() == "request path compiled"


def test_the_wire_as_pure_python_passes_the_wire_tests():
    # The property tests of both parsers, the front's conformance suite and rules, the misbehaving
    # engines, the upstream client, the token and affinity scans, run against the modules loaded
    # from source.
    files = [
        "tests/unit/router/test_wire_properties.py",
        "tests/unit/router/test_front_conformance.py",
        "tests/unit/router/test_engine_misbehaving.py",
        "tests/unit/router/test_upstream.py",
        "tests/unit/router/test_tokens.py",
        "tests/unit/router/test_affinity.py",
        "tests/unit/router/test_front.py",
    ]
    run = subprocess.run(
        [sys.executable, "-m", "tests.support.purewire", *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " passed" in run.stdout
