"""Fixtures shared by every test: a real etcd for the session, per-test prefixes."""

from __future__ import annotations

import uuid

import pytest

from tests.support.procs import start_etcd


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
