"""Runtime models: validated against the whole next catalog, guarded writes, declared models win."""

from __future__ import annotations

import asyncio
import json

import pytest

from llmgw.common.errors import Conflict, FailedPrecondition, InvalidArgument, NotFound
from llmgw.common.etcd import MemoryStore, ModRevisionIs, Put
from llmgw.control.store.models import PREFIX, RuntimeModels, parse_document

DECLARED = [
    parse_document('{"name": "demo", "aliases": ["demo-chat"], "profile": {"engine": "simulator"}}', "d")
]


def doc(name: str, **kw) -> str:
    return json.dumps({"name": name, "profile": {"engine": "simulator"}, **kw})


async def test_add_then_remove_changes_the_catalog_and_the_store():
    store = MemoryStore()
    models = RuntimeModels(store, DECLARED)
    cat = await models.put(parse_document(doc("extra", fallbacks=["demo-chat"]), "x"), replace=False)
    assert cat.names == ["demo", "extra"]
    loaded = await models.load()
    assert loaded.catalog.get("extra").origin == "runtime"
    assert loaded.catalog.get("demo").origin == "declared"
    await models.remove("extra")
    assert (await models.load()).catalog.names == ["demo"]
    assert (await store.range(PREFIX)).entries == []


async def test_an_invalid_add_is_refused_and_leaves_no_trace():
    store = MemoryStore()
    models = RuntimeModels(store, DECLARED)
    before = (await store.range("")).revision
    with pytest.raises(InvalidArgument, match="falls back to 'ghost'"):
        await models.put(parse_document(doc("bad", fallbacks=["ghost"]), "x"), replace=False)
    with pytest.raises(InvalidArgument, match="scaling.max"):
        parse_document(doc("bad", scaling={"min": 2, "max": 1}), "x")
    result = await store.range("")
    assert result.entries == [] and result.revision == before


@pytest.mark.parametrize("name, aliases", [("demo", []), ("other", ["demo-chat"])])
async def test_declared_models_cannot_be_added_changed_or_removed(name, aliases):
    models = RuntimeModels(MemoryStore(), DECLARED)
    with pytest.raises(FailedPrecondition, match="declared in the cluster settings"):
        await models.put(parse_document(doc(name, aliases=aliases), "x"), replace=True)
    with pytest.raises(FailedPrecondition, match="llmgw settings edit"):
        await models.remove("demo")


async def test_add_twice_is_refused_and_update_of_a_missing_model_too():
    models = RuntimeModels(MemoryStore(), DECLARED)
    await models.put(parse_document(doc("x"), "x"), replace=False)
    with pytest.raises(FailedPrecondition, match="already exists"):
        await models.put(parse_document(doc("x"), "x"), replace=False)
    with pytest.raises(NotFound, match="add it first"):
        await models.put(parse_document(doc("y"), "y"), replace=True)
    await models.put(parse_document(doc("x", min_replicas=3), "x"), replace=True)
    assert (await models.load()).catalog.get("x").min_replicas == 3


async def test_a_change_built_from_a_stale_version_is_aborted():
    store = MemoryStore()
    models = RuntimeModels(store, DECLARED)
    stale = await models.load()
    await models.put(parse_document(doc("a"), "a"), replace=False)
    with pytest.raises(Conflict, match="retry"):
        await models._commit(stale.version, ModRevisionIs(PREFIX + "b", 0), Put(PREFIX + "b", b"{}"))


async def test_a_stored_model_that_no_longer_validates_is_skipped_with_a_warning(caplog):
    store = MemoryStore()
    await store.put(PREFIX + "broken", b'{"name": "broken", "profile": {"engine": "x"}, "future_field": 1}')
    await store.put(PREFIX + "clash", doc("clash", aliases=["demo"]).encode())
    await store.put(PREFIX + "fine", doc("fine").encode())
    loaded = await RuntimeModels(store, DECLARED).load()
    assert loaded.catalog.names == ["demo", "fine"]
    assert len(loaded.skipped) == 2
    assert "stored model skipped" in caplog.text


async def test_follow_applies_each_change():
    store = MemoryStore()
    models = RuntimeModels(store, DECLARED)
    seen: list[list[str]] = []
    changed = asyncio.Event()

    def apply(cat):
        seen.append(cat.names)
        changed.set()

    task = asyncio.create_task(models.follow(apply))
    try:
        await asyncio.wait_for(changed.wait(), 2)
        changed.clear()
        await models.put(parse_document(doc("late"), "late"), replace=False)
        await asyncio.wait_for(changed.wait(), 2)
    finally:
        task.cancel()
    assert seen == [["demo"], ["demo", "late"]]


def test_oversized_and_malformed_documents_are_refused_clearly():
    with pytest.raises(InvalidArgument, match="the limit is"):
        parse_document("x" * 100_000, "big")
    with pytest.raises(InvalidArgument, match="is a mapping"):
        parse_document("[1, 2]", "list")
    with pytest.raises(InvalidArgument, match="not valid JSON or YAML"):
        parse_document("{name: [", "broken")


async def test_stored_models_may_fall_back_to_each_other_in_any_key_order():
    store = MemoryStore()
    await store.put(PREFIX + "a", doc("a", fallbacks=["b"]).encode())
    await store.put(PREFIX + "b", doc("b").encode())
    await store.put(PREFIX + "c", doc("c", fallbacks=["gone"]).encode())
    loaded = await RuntimeModels(store, DECLARED).load()
    assert loaded.catalog.names == ["a", "b", "demo"]
    assert [s.split(":")[0] for s in loaded.skipped] == ["c"]


async def test_an_update_made_from_an_older_read_of_the_model_is_aborted():
    models = RuntimeModels(MemoryStore(), DECLARED)
    await models.put(parse_document(doc("x"), "x"), replace=False)
    read = await models.revision("x")
    await models.put(parse_document(doc("x", aliases=["y"]), "x"), replace=True, if_revision=read)
    with pytest.raises(Conflict, match="changed since it was read"):
        await models.put(parse_document(doc("x", aliases=["z"]), "x"), replace=True, if_revision=read)
    assert (await models.load()).catalog.get("x").aliases == ("y",)
