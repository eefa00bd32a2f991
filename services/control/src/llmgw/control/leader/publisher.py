"""Publishing: the leader writes what routers may use into etcd.

``endpoints/<replica id>`` holds a serialized ``llmgw.v1.Endpoint`` for each
READY replica, with a record, of a model in the catalog, on a ready node.
``catalog/<model name>`` holds a serialized ``llmgw.v1.ModelInfo`` per
configured model. Every control plane mirrors both prefixes and serves them
as Watch streams (watchhub), so what is written here is what routers see.

Decisions:

- The table is a pure function (:func:`endpoint_table`) of the catalog, the
  nodes, the replicas and what is already stored; the publisher only diffs
  and writes. An unchanged table is skipped by fingerprint before any diff,
  and within a changed one only the entries that differ from what is stored
  are written, so an unchanged endpoint never gets a new etcd revision and
  routers are never told about nothing.
- Replicas about to be stopped are *withheld* by the caller and the table
  synced before the stop command goes out: traffic leaves a replica before
  the replica leaves.
- An unreachable node's stored endpoints are kept for a settling window
  (the node timeout) instead of being deleted and re-added seconds later:
  a new leader does not know the nodes yet, and an agent that restarts
  leaves its engines running (they are adopted), so neither a change of
  leader nor an agent restart costs routers anything. For a new leader the
  window counts from the moment its term accepts agents (the controller
  expects the nodes then), not from its election: it never withdraws an
  endpoint merely because an agent has not yet had the chance to reach it.
  Agents reach it within about a poll interval of that moment (standbys
  name no dead leader, agents try every control plane: agent/connection),
  well inside the node timeout. If the machine really
  died, routers see connect errors for that window, which their breakers
  and pre-first-byte retries absorb; after it the endpoints are withdrawn.
- Writes go through the leader guard in batches small enough for etcd's
  per-transaction limit (128 operations by default).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Container, Iterable, Mapping
from typing import Protocol

from google.protobuf.message import DecodeError

from llmgw.common.etcd import Delete, Op, Put, Store, batches
from llmgw.v1 import endpoints_pb2

from ..decide.reconcile import Replica
from ..spec.catalog import Catalog, Model
from ..state.inventory import Node
from ..store.replicas import GuardedWriter

ENDPOINTS_PREFIX = "endpoints/"
CATALOG_PREFIX = "catalog/"
# A ComfyUI workflow file larger than this is not published (it travels in every router's catalog).
MAX_WORKFLOW_BYTES = 1024 * 1024

log = logging.getLogger("llmgw.control.leader.publisher")


class PublishMetrics(Protocol):
    def endpoint_written(self, puts: int, deletes: int) -> None: ...


def endpoint_table(
    catalog: Catalog,
    nodes: Mapping[str, Node],
    replicas: Iterable[Replica],
    stored: Mapping[str, bytes],
    withheld: Container[str],
    now: float,
    settle_seconds: float,
) -> dict[str, bytes]:
    table: dict[str, bytes] = {}
    for r in replicas:
        rec = r.record
        if r.id in withheld or rec.model not in catalog:
            continue
        node = nodes.get(rec.node)
        if node is None:
            continue
        if node.ready:
            if r.ready and r.reported is not None and r.reported.url:
                model = catalog.get(rec.model)
                declared = {a.name for a in model.spec.adapters} if model and model.spec else set()
                ep = endpoints_pb2.Endpoint(
                    id=rec.id,
                    model=rec.model,
                    url=r.reported.url.rstrip("/"),
                    served_name=r.reported.served_name or rec.served_name,
                    node=rec.node,
                    engine=rec.engine,
                    # Only adapters still declared: a removed one is unrouted before it is unloaded.
                    adapters=[a for a in r.reported.adapters if a in declared],
                )
                table[rec.id] = ep.SerializeToString(deterministic=True)
        elif (
            node.unreachable_since is not None
            and now - node.unreachable_since < settle_seconds
            and rec.id in stored
        ):
            table[rec.id] = stored[rec.id]
    return table


def fingerprint(table: Mapping[str, bytes]) -> str:
    h = hashlib.sha256()
    for key in sorted(table):
        h.update(key.encode())
        h.update(b"\x00")
        h.update(hashlib.sha256(table[key]).digest())
    return h.hexdigest()


async def _write(writer: GuardedWriter, ops: list[Op]) -> None:
    for batch in batches(ops):
        await writer.commit(batch)


class EndpointPublisher:
    def __init__(self, store: Store, writer: GuardedWriter, metrics: PublishMetrics):
        self._store = store
        self._writer = writer
        self._metrics = metrics
        self._stored: dict[str, bytes] = {}
        self._fingerprint: str | None = None

    @property
    def stored(self) -> Mapping[str, bytes]:
        return self._stored

    async def load(self) -> None:
        """Read what is published now (at the start of a term)."""
        result = await self._store.range(ENDPOINTS_PREFIX)
        self._stored = {e.key[len(ENDPOINTS_PREFIX) :]: e.value for e in result.entries}
        self._fingerprint = None

    def reset(self) -> None:
        self._stored = {}
        self._fingerprint = None

    async def sync(self, table: Mapping[str, bytes]) -> bool:
        """Make etcd hold ``table``; returns whether anything was written."""
        fp = fingerprint(table)
        if fp == self._fingerprint:
            return False
        puts = [Put(ENDPOINTS_PREFIX + k, v) for k, v in sorted(table.items()) if self._stored.get(k) != v]
        deletes = [Delete(ENDPOINTS_PREFIX + k) for k in sorted(self._stored) if k not in table]
        ops: list[Op] = [*deletes, *puts]
        if ops:
            # Whatever is written before a failure is in etcd; reload on error
            # so the next diff starts from the truth, not a guess.
            try:
                await _write(self._writer, ops)
            except Exception:
                self._fingerprint = None
                await self._reload_quietly()
                raise
            log.info(
                "published endpoints: %d total, %d written, %d removed",
                len(table),
                len(puts),
                len(deletes),
            )
            self._metrics.endpoint_written(len(puts), len(deletes))
        self._stored = dict(table)
        self._fingerprint = fp
        return bool(ops)

    async def _reload_quietly(self) -> None:
        try:
            await self.load()
        except Exception as err:  # the original error is what the caller needs to see
            log.warning("could not re-read published endpoints after a failed write: %s", err)


async def sync_catalog(
    store: Store, writer: GuardedWriter, catalog: Catalog, wall: Callable[[], float]
) -> int:
    """Write ``catalog/`` from the configured catalog; returns how many keys changed.

    A model keeps the ``created`` time it was first published with, so a
    restart or a new leader does not make every model look new.
    """
    result = await store.range(CATALOG_PREFIX)
    stored = {e.key[len(CATALOG_PREFIX) :]: e.value for e in result.entries}
    ops: list[Op] = []
    for model in catalog:
        created = int(wall())
        old = stored.get(model.name)
        if old is not None:
            try:
                prev = endpoints_pb2.ModelInfo.FromString(old)
                if prev.created:
                    created = prev.created
            except DecodeError:
                log.warning("catalog/%s does not parse; rewriting it", model.name)
        info = model_info(model, created)
        value = info.SerializeToString(deterministic=True)
        if old != value:
            ops.append(Put(CATALOG_PREFIX + model.name, value))
    ops.extend(Delete(CATALOG_PREFIX + name) for name in sorted(stored) if name not in catalog)
    if ops:
        await _write(writer, ops)
        log.info("published the catalog: %d model(s), %d key(s) changed", len(catalog), len(ops))
    return len(ops)


def model_info(model: Model, created: int) -> endpoints_pb2.ModelInfo:
    """What routers need of one catalog model: names, and how to route around it."""
    info = endpoints_pb2.ModelInfo(
        name=model.name,
        aliases=list(model.aliases),
        owned_by=model.owned_by,
        created=created,
        fallbacks=list(model.fallbacks),
        # External models have no replicas to wake.
        on_demand=model.min_replicas == 0 and not model.external,
        adapters=[a.name for a in model.spec.adapters] if model.spec is not None else [],
        apis=list(model.spec.apis) if model.spec is not None else [],
        hidden=model.hidden,
    )
    spec = model.spec
    if spec is not None and spec.comfyui is not None:
        info.comfyui.workflow = read_workflow(model.name, spec.comfyui.workflow)
        info.comfyui.checkpoint = spec.comfy_checkpoint
        info.comfyui.served_by = model.served_by
        if not info.apis:
            info.apis.append("images")
    if spec is not None and spec.canary is not None:
        info.canary.model = spec.canary.model
        info.canary.percent = spec.canary.percent
    if spec is not None and spec.external is not None:
        ext = spec.external
        info.external.url = ext.url
        info.external.api = ext.api
        info.external.model = ext.model
        info.external.api_key_file = ext.api_key_file
    if model.peer is not None:
        info.external.peer = model.peer.peer
        info.external.origin_cluster = model.peer.origin_cluster
        info.external.hop_limit = model.peer.hop_limit
    return info


def read_workflow(model: str, workflow: str) -> str:
    """A built-in's name as it is; a file's JSON, read here (routers have no such file).

    Read whenever the catalog is published (a change, or a new leader's
    first pass). A file that cannot be read, is too large or is not a JSON
    object is published as "" and logged: routers then answer that model's
    requests with an error naming the problem, rather than submitting
    something ComfyUI would refuse.
    """
    if not workflow.startswith("/"):
        return workflow
    try:
        with open(workflow, "rb") as f:
            raw = f.read(MAX_WORKFLOW_BYTES + 1)
        if len(raw) > MAX_WORKFLOW_BYTES:
            raise ValueError(f"larger than {MAX_WORKFLOW_BYTES} bytes")
        doc = json.loads(raw)
        if not isinstance(doc, dict) or not doc:
            raise ValueError("not a JSON object of nodes (export it with 'Save (API)')")
    except (OSError, ValueError) as err:
        log.warning("model %s: its ComfyUI workflow %s cannot be used: %s", model, workflow, err)
        return ""
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)
