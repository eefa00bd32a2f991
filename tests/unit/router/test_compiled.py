"""The router's wire modules as built: compiled by ``make setup``, and the same wire as pure Python.

services/router/setup.py compiles :mod:`llmgw.router.upstream_wire` and
:mod:`llmgw.router.frontconn` with Cython; what the suite and the benchmarks
run must be that build (what the images install), and the source must
still run as ordinary Python (a build without a C compiler).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.router import frontconn, upstream_wire
from llmgw.router.main import request_path_build

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(bool(os.environ.get("LLMGW_PURE_PYTHON")), reason="built pure Python on purpose")
def test_make_setup_compiled_the_wire_modules():
    for module in (upstream_wire, frontconn):
        assert module.COMPILED, f"{module.__name__} runs as pure Python: {module.__file__}"
        assert not str(module.__file__).endswith(".py")
    assert request_path_build() == "request path compiled"


def test_the_wire_as_pure_python_passes_the_wire_tests():
    # The property tests of both parsers, the front's conformance suite and the misbehaving
    # engines, run against the modules loaded from source.
    files = [
        "tests/unit/router/test_wire_properties.py",
        "tests/unit/router/test_front_conformance.py",
        "tests/unit/router/test_engine_misbehaving.py",
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
