# The two commands of the README:
#   make up     set up, then run a local cluster (etcd, control, router, 2 agents, demo model)
#   make test   set up, then run the whole test suite
.PHONY: setup up test lint proto bench clean

setup:
	@scripts/setup.sh

up: setup
	.venv/bin/llmgw up

test: setup
	.venv/bin/python -m pytest

lint: setup
	.venv/bin/ruff check .

proto: setup
	.venv/bin/python scripts/gen_proto.py

bench: setup
	.venv/bin/python bench/router_overhead.py

clean:
	rm -rf .venv .llmgw
