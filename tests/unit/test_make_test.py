"""`make test` (what .ci/run calls) runs the real-vLLM test rather than skipping it."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_make_test_installs_vllm_when_missing_and_runs_the_suite_with_it_required():
    planned = subprocess.run(
        ["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True
    ).stdout
    lines = planned.splitlines()
    install = next(i for i, line in enumerate(lines) if "scripts/install_vllm.sh" in line)
    suite = next(i for i, line in enumerate(lines) if "-m pytest" in line)
    assert install < suite, planned
    assert "LLMGW_INSTALL_VLLM=1" in lines[suite], "without it a missing venv would skip, not fail"
    assert (ROOT / ".ci" / "run").read_text().rstrip().endswith("exec make test")
