"""Cluster settings: versions in the store, import once, invalid refused, bad stored versions skipped."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from llmgw.common.errors import Conflict, InvalidArgument, NotFound
from llmgw.common.etcd import MemoryStore, Put
from llmgw.control.config import ControlConfig
from llmgw.control.store.settings import HEAD, VERSIONS, SettingsStore, Version

DEMO = {"name": "demo", "profile": {"engine": "simulator"}}


def config(**kw) -> ControlConfig:
    return ControlConfig(cluster_secret_file="/dev/null", tls={"plaintext": True}, **kw)


def wall() -> float:
    return 1700000000.0


async def test_first_start_imports_the_files_cluster_keys_only():
    store = MemoryStore()
    settings = SettingsStore(store, wall)
    got = await settings.start(config(node_lost_seconds=7, models=[DEMO], listen="0.0.0.0:1"), "c.yaml")
    assert got.node_lost_seconds == 7 and [m.name for m in got.models] == ["demo"]
    v1 = await settings.get(0)
    assert v1.number == 1 and v1.author == "import from c.yaml"
    # Only what the file set, and nothing one machine owns.
    assert set(v1.document) == {"node_lost_seconds", "models"}
    assert settings.in_force.version == 1


async def test_later_starts_ignore_the_files_cluster_keys_and_say_so(caplog):
    store = MemoryStore()
    await SettingsStore(store, wall).start(config(node_lost_seconds=7), "a.yaml")
    caplog.set_level(logging.WARNING)
    got = await SettingsStore(store, wall).start(config(node_lost_seconds=99, models=[DEMO]), "b.yaml")
    assert got.node_lost_seconds == 7 and got.models == []
    assert "b.yaml sets models, node_lost_seconds: these are cluster settings" in caplog.text
    assert "ignored" in caplog.text


async def test_each_change_is_a_new_version_with_who_when_why():
    store = MemoryStore()
    settings = SettingsStore(store, wall)
    await settings.start(config(), "c.yaml")
    v2 = await settings.put({"node_lost_seconds": 20}, if_version=1, author="ann", reason="slow network")
    v3 = await settings.rollback(1, if_version=2, author="bob", reason="too slow")
    assert (v2.number, v2.author, v2.reason, v2.created_at) == (2, "ann", "slow network", wall())
    assert v3.number == 3 and v3.document == {} and v3.reason == "rollback to version 1: too slow"
    assert [v.number for v in await settings.versions()] == [3, 2, 1]


async def test_an_invalid_document_is_refused_and_nothing_is_written():
    store = MemoryStore()
    settings = SettingsStore(store, wall)
    await settings.start(config(), "c.yaml")
    before = await store.range("")
    bad = [
        ({"node_lost_seconds": -1}, "node_lost_seconds"),
        ({"listen": "0.0.0.0:1"}, "listen is not a cluster setting"),
        ({"models": [DEMO, {**DEMO, "fallbacks": ["ghost"]}]}, "problem"),
        ({"models": [{**DEMO, "fallbacks": ["ghost"]}]}, "falls back to 'ghost'"),
    ]
    for document, message in bad:
        with pytest.raises(InvalidArgument, match=message):
            await settings.put(document, if_version=0, author="a", reason="r")
    after = await store.range("")
    assert after.revision == before.revision and after.entries == before.entries


async def test_a_change_made_from_an_older_version_is_aborted():
    settings = SettingsStore(MemoryStore(), wall)
    await settings.start(config(), "c.yaml")
    await settings.put({"node_lost_seconds": 20}, if_version=1, author="a", reason="")
    with pytest.raises(Conflict, match="made from version 1, the newest is 2"):
        await settings.put({"node_lost_seconds": 30}, if_version=1, author="b", reason="")


async def test_rollback_to_a_missing_version_is_not_found():
    settings = SettingsStore(MemoryStore(), wall)
    await settings.start(config(), "c.yaml")
    with pytest.raises(NotFound, match="version 9 does not exist"):
        await settings.rollback(9, if_version=0, author="a", reason="")


async def _store_raw(store: MemoryStore, number: int, document: dict) -> None:
    record = Version(number, document, "newer control plane", wall(), "").to_json()
    await store.commit(
        [], [Put(f"{VERSIONS}{number:012d}", record), Put(HEAD, json.dumps({"version": number}).encode())]
    )


async def test_at_start_the_newest_version_that_loads_is_used(caplog):
    store = MemoryStore()
    await SettingsStore(store, wall).start(config(node_lost_seconds=7), "a.yaml")
    await _store_raw(store, 2, {"node_lost_seconds": 8})
    await _store_raw(store, 3, {"a_key_from_the_future": 1})
    settings = SettingsStore(store, wall)
    got = await settings.start(config(), "b.yaml")
    assert got.node_lost_seconds == 8 and settings.in_force.version == 2
    assert 3 in settings.in_force.refused
    assert "settings version 3 does not load here" in caplog.text


async def test_follow_applies_newer_versions_and_skips_one_that_does_not_load():
    store = MemoryStore()
    settings = SettingsStore(store, wall)
    await settings.start(config(), "a.yaml")
    applied: asyncio.Queue = asyncio.Queue()

    async def apply(number, s):
        applied.put_nowait((number, s.node_lost_seconds))

    task = asyncio.create_task(settings.follow(apply))
    try:
        await SettingsStore(store, wall).put({"node_lost_seconds": 4}, if_version=0, author="a", reason="")
        assert await asyncio.wait_for(applied.get(), 3) == (2, 4)
        await _store_raw(store, 3, {"node_lost_seconds": "not a number"})
        await _store_raw(store, 4, {"node_lost_seconds": 6})
        assert await asyncio.wait_for(applied.get(), 3) == (4, 6)
        assert settings.in_force.version == 4
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_failing_apply_is_retried_not_fatal():
    store = MemoryStore()
    settings = SettingsStore(store, wall)
    await settings.start(config(), "a.yaml")
    calls: list[int] = []
    done = asyncio.Event()

    async def apply(number, s):
        calls.append(number)
        if len(calls) == 1:
            raise RuntimeError("a bug in applying")
        done.set()

    task = asyncio.create_task(settings.follow(apply, retry_seconds=0.01))
    try:
        await SettingsStore(store, wall).put({"node_lost_seconds": 4}, if_version=0, author="a", reason="")
        await asyncio.wait_for(done.wait(), 3)
        assert calls == [2, 2] and settings.in_force.version == 2
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
