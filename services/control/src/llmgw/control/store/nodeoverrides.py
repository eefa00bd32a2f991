"""What operators set on nodes (holds, labels), kept in etcd and followed by every control plane.

``node-overrides/<node>`` holds one JSON :class:`OverrideDocument`; a node
with neither a hold nor a label has no key. Decisions:

- etcd, not the leader's memory: a hold outlives the leader that took it.
  Every control plane follows the prefix (as it follows runtime models),
  so a standby that takes over already has every hold in force before its
  first reconcile pass, and nothing is drained or placed by mistake in
  between.
- Any control plane accepts a change (an etcd write, not placement). Each
  change is a read-modify-write guarded by the key's mod revision, so two
  operators labelling one node at once cannot lose each other's labels:
  the second gets ABORTED and retries.
- A node need not be registered to be held or labelled: an operator can
  hold a machine before its agent first connects. The id is checked
  against the agent's node-id pattern, so a typo that cannot be a node is
  refused.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from pydantic import Field, ValidationError

from llmgw.common.config import Document
from llmgw.common.errors import Conflict, InvalidArgument, excerpt
from llmgw.common.etcd import Compacted, Delete, ModRevisionIs, Put, Store

from ..state.inventory import NodeOverride

log = logging.getLogger("llmgw.control.store.nodeoverrides")

PREFIX = "node-overrides/"
# The agent's node_id pattern (agent config).
NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
LABEL_KEY = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$")
MAX_REASON = 256
MAX_LABELS = 64


class OverrideDocument(Document):
    held: bool = False
    hold_reason: str = Field(default="", max_length=MAX_REASON)
    # Wall-clock seconds when the hold began.
    held_since: float = 0.0
    labels: dict[str, str] = Field(default_factory=dict)

    def override(self) -> NodeOverride:
        return NodeOverride(self.held, self.hold_reason, MappingProxyType(dict(self.labels)))

    @property
    def empty(self) -> bool:
        return not self.held and not self.labels


def check_node_id(node_id: str) -> None:
    if not NODE_ID.match(node_id):
        raise InvalidArgument(
            f"node id {excerpt(node_id)} is not valid: 1-63 letters, digits and '._-', starting with a "
            "letter or digit (as in the agent's node_id)"
        )


def check_labels(labels: Mapping[str, str], remove: Sequence[str] = ()) -> None:
    for key in [*labels, *remove]:
        if not LABEL_KEY.match(key):
            raise InvalidArgument(
                f"label key {excerpt(key)} is not valid: 1-63 letters, digits and '._/-', starting and "
                "ending with a letter or digit"
            )
    for key, value in labels.items():
        if not LABEL_VALUE.match(value):
            raise InvalidArgument(
                f"label {key}={excerpt(value)}: a value is at most 63 letters, digits and "
                "'._-', starting and ending with a letter or digit (or empty)"
            )
    both = sorted(set(labels) & set(remove))
    if both:
        raise InvalidArgument(f"label(s) {both} are both set and removed; give each once")


class NodeOverrides:
    """Reads, changes and follows ``node-overrides/``."""

    def __init__(self, store: Store, wall: Callable[[], float] = time.time):
        self._store = store
        self._wall = wall

    async def load(self) -> tuple[dict[str, OverrideDocument], int]:
        """Every stored override by node, and the store revision of the read."""
        result = await self._store.range(PREFIX)
        out: dict[str, OverrideDocument] = {}
        for e in result.entries:
            node = e.key.removeprefix(PREFIX)
            try:
                out[node] = OverrideDocument.model_validate_json(e.value)
            except ValidationError as err:
                log.warning("skipping the stored override of node %s: %s", node, err)
        return out, result.revision

    async def get(self, node_id: str) -> OverrideDocument:
        check_node_id(node_id)
        entry = await self._store.get(PREFIX + node_id)
        return OverrideDocument.model_validate_json(entry.value) if entry else OverrideDocument()

    async def hold(self, node_id: str, reason: str) -> OverrideDocument:
        if len(reason) > MAX_REASON:
            raise InvalidArgument(
                f"a hold reason is at most {MAX_REASON} characters; this one has {len(reason)}"
            )

        def change(doc: OverrideDocument) -> OverrideDocument:
            since = doc.held_since if doc.held else self._wall()
            return doc.model_copy(update={"held": True, "hold_reason": reason, "held_since": since})

        return await self._change(node_id, change)

    async def release(self, node_id: str) -> OverrideDocument:
        return await self._change(
            node_id, lambda d: d.model_copy(update={"held": False, "hold_reason": "", "held_since": 0.0})
        )

    async def label(self, node_id: str, set_: Mapping[str, str], remove: Sequence[str]) -> OverrideDocument:
        check_labels(set_, remove)

        def change(doc: OverrideDocument) -> OverrideDocument:
            labels = {k: v for k, v in doc.labels.items() if k not in remove}
            labels.update(set_)
            if len(labels) > MAX_LABELS:
                raise InvalidArgument(f"a node carries at most {MAX_LABELS} operator labels")
            return doc.model_copy(update={"labels": labels})

        return await self._change(node_id, change)

    async def _change(
        self, node_id: str, change: Callable[[OverrideDocument], OverrideDocument]
    ) -> OverrideDocument:
        check_node_id(node_id)
        key = PREFIX + node_id
        entry = await self._store.get(key)
        current = OverrideDocument.model_validate_json(entry.value) if entry else OverrideDocument()
        new = change(current)
        op = Delete(key) if new.empty else Put(key, json.dumps(new.model_dump(), sort_keys=True).encode())
        result = await self._store.commit([ModRevisionIs(key, entry.mod_revision if entry else 0)], [op])
        if not result.succeeded:
            raise Conflict(f"node {node_id}'s overrides changed while this change was made; retry it")
        return new

    async def follow(
        self, apply: Callable[[Mapping[str, NodeOverride]], None], retry_seconds: float = 1.0
    ) -> None:
        """Call ``apply`` with every override in force, at start and after each change (cancel to stop)."""
        while True:
            try:
                docs, revision = await self.load()
                apply({n: d.override() for n, d in docs.items()})
                async for _ in self._store.watch(PREFIX, revision + 1):
                    docs, _ = await self.load()
                    apply({n: d.override() for n, d in docs.items()})
            except asyncio.CancelledError:
                raise
            except Compacted:
                continue
            except Exception as err:  # etcd away: keep what is in force, try again
                log.warning("following node overrides failed (%s); retrying", err)
                await asyncio.sleep(retry_seconds)
