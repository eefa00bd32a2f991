#!/usr/bin/env bash
# Install the peer routers the benchmark compares llmgw against, each into
# its own venv, idempotently:
#
#   scripts/install_peers.sh [DIR]      (default: .llmgw/peers)
#
#   DIR/vllm-router   vllm-router (the Rust router of vLLM's production stack; pip wheel)
#   DIR/litellm       LiteLLM proxy (litellm[proxy])
#
# Peers are benchmark-only: they never go into the project's .venv, and
# nothing in llmgw imports them. bench/router_peers.py calls this script.
# A venv whose package is already at the wanted version is left alone.
# Environment: PYTHON (creates the venvs, default python3),
# VLLM_ROUTER_VERSION (default 0.1.17), LITELLM_VERSION (default 1.108.7,
# the newest whose proxy extra installs), PIP_ARGS (extra pip arguments).
set -euo pipefail
DIR=$(realpath -m "${1:-$(dirname "$0")/../.llmgw/peers}")
PYTHON=${PYTHON:-python3}
VLLM_ROUTER_VERSION=${VLLM_ROUTER_VERSION:-0.1.17}
LITELLM_VERSION=${LITELLM_VERSION:-1.108.7}

# pip warns once per package about configured local indexes that lack it;
# those lines say nothing about this install, so they are dropped.
quiet() { "$@" 2>&1 | { grep -v '^WARNING: Location .* is ignored' || true; }; }

# install NAME DIST VERSION REQUIREMENT
install() {
  local venv="$DIR/$1" dist=$2 version=$3 requirement=$4
  if [ -x "$venv/bin/python" ] &&
    [ "$("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('$dist'))" 2>/dev/null)" = "$version" ]; then
    echo "install_peers: $dist $version already in $venv"
    return
  fi
  local start
  start=$(date +%s)
  echo "install_peers: installing $requirement into $venv"
  [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
  # shellcheck disable=SC2086  # PIP_ARGS is a list of words on purpose
  quiet "$venv/bin/python" -m pip install -q --disable-pip-version-check ${PIP_ARGS:-} "$requirement"
  echo "install_peers: $dist ready in $venv ($(( $(date +%s) - start )) s)"
}

install vllm-router vllm-router "$VLLM_ROUTER_VERSION" "vllm-router==$VLLM_ROUTER_VERSION"
install litellm litellm "$LITELLM_VERSION" "litellm[proxy]==$LITELLM_VERSION"
