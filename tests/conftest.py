"""Fixtures shared by every test: a real etcd for the session, per-test prefixes."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.support.procs import start_etcd

pytest_plugins = ("tests.support.hangs",)

ROUTER_SOURCE = Path(__file__).resolve().parents[1] / "services" / "router" / "src" / "llmgw" / "router"


def pytest_configure(config: pytest.Config) -> None:
    """Refuse to run against a compiled router module older than its source: Python would import
    the stale build, and the tests would pass or fail for code that is no longer there."""
    stale = [
        so.name
        for so in ROUTER_SOURCE.glob("*.so")
        if (ROUTER_SOURCE / (so.name.split(".")[0] + ".py")).stat().st_mtime > so.stat().st_mtime
    ]
    if stale:
        pytest.exit(f"compiled router modules older than their source ({', '.join(stale)}): run `make setup`")


@pytest.fixture(scope="session")
def etcd_endpoint(tmp_path_factory):
    """One real etcd process for the whole run; tests isolate by key prefix."""
    base = tmp_path_factory.mktemp("etcd")
    proc, endpoint = start_etcd(base / "data", base)
    yield endpoint
    proc.stop()


@pytest.fixture
def etcd_root() -> str:
    return f"/llmgw-test/{uuid.uuid4().hex[:12]}/"


@pytest.fixture
async def etcd_store(etcd_endpoint, etcd_root):
    from llmgw.common.etcd import EtcdStore

    store = EtcdStore([etcd_endpoint], etcd_root)
    yield store
    await store.delete("", prefix=True)
    await store.close()
