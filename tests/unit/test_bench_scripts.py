"""Every benchmark still starts: its imports resolve and it parses its arguments.

Benchmarks run by hand, not in the suite, so a module they import can be
deleted without any test noticing (two did, once). ``--help`` imports the
whole script and exits before measuring anything.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if 'if __name__ == "__main__"' in p.read_text())


def test_there_are_benchmarks_to_check():
    assert len(SCRIPTS) >= 10, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_benchmark_starts(script: Path):
    out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage:" in out.stdout
