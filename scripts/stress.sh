#!/usr/bin/env bash
# The whole test suite beside two busy processes, one pinned to each of the first
# two cores: a test that passes only on an idle machine is a bug to find, not a
# flake to rerun. RUNS=N repeats the suite N times in a row (default 3) and stops
# at the first failure. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${RUNS:-3}
busy=()
stop_busy() {
  for pid in "${busy[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop_busy EXIT

cores=$(nproc)
for core in 0 1; do
  [ "$core" -lt "$cores" ] || core=0
  taskset -c "$core" python3 -c 'while True: pass' &
  busy+=("$!")
done

for i in $(seq 1 "$runs"); do
  echo "test-stress: run $i of $runs beside ${#busy[@]} busy processes"
  LLMGW_INSTALL_VLLM=1 .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
done
echo "test-stress: $runs runs in a row passed"
