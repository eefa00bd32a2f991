"""Client API keys in the control plane: stored hashed, shown once, refused whole on bad
input (nothing written), unique names, revoke by id or name; and the leader's quota ledger."""

from __future__ import annotations

import pytest

from llmgw.common.errors import InvalidArgument, NotFound
from llmgw.common.etcd import MemoryStore
from llmgw.common.keys import CLIENT_KEY_PREFIX, client_key_hash
from llmgw.control.api.keys import NAMES_PREFIX, PREFIX, KeyStore, parse_request
from llmgw.control.api.quota import QuotaLedger
from llmgw.control.spec.catalog import Catalog
from llmgw.control.store.models import parse_document
from llmgw.v1 import keys_pb2

CATALOG = Catalog.from_specs(
    [parse_document('{"name": "demo", "aliases": ["demo-chat"], "profile": {"engine": "simulator"}}', "d")]
)


def request(**kw) -> keys_pb2.CreateKeyRequest:
    return keys_pb2.CreateKeyRequest(**kw)


async def test_create_stores_only_the_hash_and_returns_the_secret_once():
    store = MemoryStore()
    keys = KeyStore(store, wall=lambda: 1000.0)
    checked = parse_request(request(name="team-a", models=["demo-chat"], requests_per_minute=60), CATALOG)
    key, secret = await keys.create(checked)
    assert secret.startswith(CLIENT_KEY_PREFIX) and len(secret) > 40
    stored = (await store.range(PREFIX)).entries
    assert len(stored) == 1
    assert secret.encode() not in stored[0].value
    record = keys_pb2.ApiKey.FromString(stored[0].value)
    assert record.hash == client_key_hash(secret)
    assert record.prefix == secret[: len(record.prefix)] and len(record.prefix) < 20
    assert list(record.models) == ["demo-chat"] and record.requests_per_minute == 60
    assert record.created == 1000 and record.expires == 0
    assert key.id == record.id


async def test_a_ttl_sets_the_expiry():
    keys = KeyStore(MemoryStore(), wall=lambda: 1000.0)
    key, _ = await keys.create(parse_request(request(ttl_seconds=60), CATALOG))
    assert key.expires == 1060


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"requests_per_minute": -1}, "requests_per_minute"),
        ({"tokens_per_minute": -5}, "tokens_per_minute"),
        ({"ttl_seconds": -1}, "ttl_seconds"),
        ({"name": "has space"}, "name"),
        ({"models": ["ghost"]}, "'ghost' are not in the catalog (known: demo)"),
    ],
)
async def test_bad_input_is_invalid_argument_naming_the_field(bad, says):
    with pytest.raises(InvalidArgument, match=says.replace("(", r"\(").replace(")", r"\)")):
        parse_request(request(**bad), CATALOG)


async def test_a_taken_name_is_refused_and_nothing_more_is_written():
    store = MemoryStore()
    keys = KeyStore(store)
    await keys.create(parse_request(request(name="dup"), CATALOG))
    before = await store.range("")
    with pytest.raises(InvalidArgument, match="name 'dup' is taken"):
        await keys.create(parse_request(request(name="dup"), CATALOG))
    after = await store.range("")
    assert after.revision == before.revision and len(after.entries) == len(before.entries)


async def test_revoke_by_name_or_id_deletes_the_key_and_frees_the_name():
    store = MemoryStore()
    keys = KeyStore(store)
    a, _ = await keys.create(parse_request(request(name="a"), CATALOG))
    b, _ = await keys.create(parse_request(request(), CATALOG))
    assert (await keys.revoke("a")).id == a.id
    assert (await keys.revoke(b.id)).id == b.id
    assert (await store.range(PREFIX)).entries == []
    assert (await store.range(NAMES_PREFIX)).entries == []
    await keys.create(parse_request(request(name="a"), CATALOG))


async def test_revoking_an_unknown_key_is_not_found_and_a_malformed_one_invalid():
    keys = KeyStore(MemoryStore())
    with pytest.raises(NotFound, match="llmgw keys list"):
        await keys.revoke("k-000000000000")
    with pytest.raises(NotFound):
        await keys.revoke("nobody")
    with pytest.raises(InvalidArgument):
        await keys.revoke("../etc")


class _Items:
    def __init__(self) -> None:
        self.items: dict[str, bytes] = {}


def test_the_ledger_grants_what_is_left_after_others_unspent_grants_and_forgets_full_keys():
    keys = _Items()
    keys.items["k-1"] = keys_pb2.ApiKey(id="k-1", requests_per_minute=60).SerializeToString()
    ledger = QuotaLedger(keys)
    ledger.join(1)
    ledger.join(2)
    usage = [keys_pb2.KeyUsage(key_id="k-1", requests=10), keys_pb2.KeyUsage(key_id="k-x", requests=5)]
    ledger.apply(1, usage, 0.0)
    # Router 2 still holds its implicit 30 of the full bucket; 50 - 30 left, halved.
    assert [(b.key_id, b.requests) for b in ledger.view(1, 0.0)] == [("k-1", 10.0)]
    # Router 1 now holds 10: router 2 gets (50 - 10) / 2.
    assert ledger.view(2, 0.0)[0].requests == pytest.approx(20.0)
    assert ledger.view(1, 10.0) == [], "refilled: forgotten"
    ledger.apply(1, [keys_pb2.KeyUsage(key_id="k-1", requests=10)], 30.0)
    del keys.items["k-1"]
    assert ledger.view(1, 30.0) == [], "revoked: dropped"
