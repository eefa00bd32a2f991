"""Client API keys: created, listed and revoked through KeyService, stored hashed in etcd.

``keys/<id>`` holds a serialized ``llmgw.v1.ApiKey`` (hash and metadata,
never the secret); ``key-names/<name>`` maps a key's unique name to its id.
Every control plane mirrors ``keys/`` in a watch hub and serves it to
routers as ``KeyTableService.Watch``, so a key created or revoked on any
control plane reaches every router within a watch round trip.

Decisions:

- The secret is ``sk-llmgw-`` and 43 URL-safe characters (256 random bits).
  It is returned by CreateKey once; etcd holds its SHA-256, which routers
  look a presented key up by. A plain hash is enough for a random 256-bit
  secret (nothing to brute-force), and keeps the router's lookup to one
  hash and one dict access.
- Revoking deletes both records: a revoked key is simply not in the table.
- Any control plane accepts changes (they are etcd writes, not placement).
  A create is one transaction guarded on the name being free and the id
  unused, so two operators creating the same name cannot both succeed.
- Input is validated whole before anything is written; a bad request is
  INVALID_ARGUMENT naming the field and what is allowed. Models must be in
  the catalog in force (names or aliases), which catches typos; a key that
  names a model removed later simply cannot use it.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Callable
from typing import Protocol

import grpc
from google.protobuf.message import DecodeError
from pydantic import Field, ValidationError

from llmgw.common.config import Document, format_validation_error
from llmgw.common.errors import Conflict, InvalidArgument, LlmgwError, NotFound, abort_with, excerpt
from llmgw.common.etcd import Delete, ModRevisionIs, Put, Store
from llmgw.common.keys import CLIENT_KEY_PREFIX, client_key_hash
from llmgw.v1 import keys_pb2, keys_pb2_grpc

log = logging.getLogger("llmgw.control.api.keys")

PREFIX = "keys/"
NAMES_PREFIX = "key-names/"
# Characters of the secret kept (after the fixed prefix) to recognise a key.
SHOWN_CHARS = 6
MAX_LIMIT = 10**12
MAX_TTL_SECONDS = 10 * 366 * 24 * 3600


class ModelResolver(Protocol):
    @property
    def names(self) -> list[str]: ...
    def resolve(self, name_or_alias: str): ...


class KeyRequest(Document):
    """A CreateKeyRequest, checked: what may be written."""

    name: str = Field(default="", pattern=r"^$|^[A-Za-z0-9][A-Za-z0-9._@-]{0,62}$")
    owner: str = Field(default="", max_length=200)
    models: list[str] = Field(default_factory=list, max_length=1000)
    requests_per_minute: int = Field(default=0, ge=0, le=MAX_LIMIT)
    tokens_per_minute: int = Field(default=0, ge=0, le=MAX_LIMIT)
    ttl_seconds: int = Field(default=0, ge=0, le=MAX_TTL_SECONDS)


def parse_request(request: keys_pb2.CreateKeyRequest, catalog: ModelResolver) -> KeyRequest:
    try:
        checked = KeyRequest(
            name=request.name,
            owner=request.owner,
            models=list(request.models),
            requests_per_minute=request.requests_per_minute,
            tokens_per_minute=request.tokens_per_minute,
            ttl_seconds=request.ttl_seconds,
        )
    except ValidationError as err:
        raise InvalidArgument(
            format_validation_error(err, "key")
            + "\n(name: letters, digits and . _ @ -, up to 63; limits and ttl_seconds: 0 or more, 0 = none)"
        ) from None
    unknown = [m for m in checked.models if catalog.resolve(m) is None]
    if unknown:
        known = ", ".join(catalog.names) or "none"
        raise InvalidArgument(
            f"key: model(s) {', '.join(map(repr, unknown))} are not in the catalog (known: {known}); "
            "name models by their names or aliases, or leave models empty to allow every model"
        )
    return checked


def public(key: keys_pb2.ApiKey) -> keys_pb2.ApiKey:
    """The record as shown to people: without the hash."""
    out = keys_pb2.ApiKey()
    out.CopyFrom(key)
    out.hash = ""
    return out


class KeyStore:
    """The stored keys: create, list, revoke. Every method is one etcd round trip or two."""

    def __init__(self, store: Store, wall: Callable[[], float] = time.time):
        self._store = store
        self._wall = wall

    async def create(self, checked: KeyRequest) -> tuple[keys_pb2.ApiKey, str]:
        secret = CLIENT_KEY_PREFIX + secrets.token_urlsafe(32)
        key_id = "k-" + secrets.token_hex(6)
        now = int(self._wall())
        key = keys_pb2.ApiKey(
            id=key_id,
            name=checked.name,
            owner=checked.owner,
            prefix=secret[: len(CLIENT_KEY_PREFIX) + SHOWN_CHARS],
            hash=client_key_hash(secret),
            models=checked.models,
            requests_per_minute=checked.requests_per_minute,
            tokens_per_minute=checked.tokens_per_minute,
            created=now,
            expires=now + checked.ttl_seconds if checked.ttl_seconds else 0,
        )
        conditions = [ModRevisionIs(PREFIX + key_id, 0)]
        ops: list[Put | Delete] = [Put(PREFIX + key_id, key.SerializeToString())]
        if checked.name:
            conditions.append(ModRevisionIs(NAMES_PREFIX + checked.name, 0))
            ops.append(Put(NAMES_PREFIX + checked.name, key_id.encode()))
        result = await self._store.commit(conditions, ops)
        if not result.succeeded:
            if checked.name and await self._store.get(NAMES_PREFIX + checked.name) is not None:
                raise InvalidArgument(
                    f"key: name {checked.name!r} is taken by another key; choose another name "
                    "or revoke that key first"
                )
            raise Conflict("key: the generated id collided; retry")
        return key, secret

    async def list(self) -> list[keys_pb2.ApiKey]:
        result = await self._store.range(PREFIX)
        out = []
        for entry in result.entries:
            try:
                out.append(keys_pb2.ApiKey.FromString(entry.value))
            except DecodeError:
                log.warning("%s does not parse; skipped", entry.key)
        return sorted(out, key=lambda k: (k.created, k.id))

    async def revoke(self, id_or_name: str) -> keys_pb2.ApiKey:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,62}", id_or_name):
            raise InvalidArgument(f"revoke: {excerpt(id_or_name)} is neither a key id (k-...) nor a key name")
        key_id = id_or_name
        if not id_or_name.startswith("k-"):
            named = await self._store.get(NAMES_PREFIX + id_or_name)
            if named is None:
                raise NotFound(f"no key has the name {excerpt(id_or_name)}; `llmgw keys list` shows the keys")
            key_id = named.value.decode()
        entry = await self._store.get(PREFIX + key_id)
        if entry is None:
            raise NotFound(f"no key has the id {excerpt(key_id)}; `llmgw keys list` shows the keys")
        key = keys_pb2.ApiKey.FromString(entry.value)
        ops: list[Put | Delete] = [Delete(PREFIX + key_id)]
        if key.name:
            ops.append(Delete(NAMES_PREFIX + key.name))
        result = await self._store.commit([ModRevisionIs(PREFIX + key_id, entry.mod_revision)], ops)
        if not result.succeeded:
            raise Conflict(f"key {key_id} changed while it was being revoked; retry")
        return key


class KeyServicer(keys_pb2_grpc.KeyServiceServicer):
    def __init__(self, keys: KeyStore, catalog: Callable[[], ModelResolver]):
        self._keys = keys
        self._catalog = catalog

    async def CreateKey(  # noqa: N802 - gRPC method name
        self, request: keys_pb2.CreateKeyRequest, context: grpc.aio.ServicerContext
    ) -> keys_pb2.CreateKeyResponse:
        try:
            key, secret = await self._keys.create(parse_request(request, self._catalog()))
        except LlmgwError as err:
            await abort_with(context, err)
        log.info("key %s (%s) created", key.id, key.name or "unnamed")
        return keys_pb2.CreateKeyResponse(key=public(key), secret=secret)

    async def ListKeys(  # noqa: N802 - gRPC method name
        self, request: keys_pb2.ListKeysRequest, context: grpc.aio.ServicerContext
    ) -> keys_pb2.ListKeysResponse:
        try:
            keys = await self._keys.list()
        except LlmgwError as err:
            await abort_with(context, err)
        return keys_pb2.ListKeysResponse(keys=[public(k) for k in keys])

    async def RevokeKey(  # noqa: N802 - gRPC method name
        self, request: keys_pb2.RevokeKeyRequest, context: grpc.aio.ServicerContext
    ) -> keys_pb2.RevokeKeyResponse:
        try:
            key = await self._keys.revoke(request.key)
        except LlmgwError as err:
            await abort_with(context, err)
        log.info("key %s (%s) revoked", key.id, key.name or "unnamed")
        return keys_pb2.RevokeKeyResponse(key=public(key))
