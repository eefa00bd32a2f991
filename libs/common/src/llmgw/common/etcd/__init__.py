"""The store: the one small interface llmgw has to etcd, and its implementations.

Everything durable lives under one prefix per cluster (``/llmgw/<cluster>/``);
a :class:`Store` is bound to that prefix and speaks in keys relative to it.
The interface is deliberately narrow (get, range, guarded transactions,
leases, watch) so the client behind it can be swapped: :class:`EtcdStore`
talks to a real etcd cluster (every listed member, failing over between
them: see ``members.py``); :class:`MemoryStore` is a genuine in-memory
implementation with the same revision semantics, for unit tests.

Guarantees every implementation keeps:

- Revisions are the store's global revision: every write bumps it, and a
  watch delivers each change exactly once, in revision order.
- ``commit`` is all-or-nothing; its conditions compare against the state at
  the moment it applies (a missing key has mod_revision 0).
- ``watch(prefix, start_revision)`` raises :class:`Compacted` when history
  before ``start_revision`` is gone; callers then re-read with ``range``.
- A call that fails raises :class:`~llmgw.common.errors.Unavailable`. A
  failed write may still have happened (its answer was lost): callers make
  writes idempotent or guard them, and re-read after a failure.

Layout: ``contract`` (the types and the Protocol), ``members`` (connections
to every etcd member and the failover between them), ``client``
(:class:`EtcdStore`), ``memory`` (:class:`MemoryStore`).
"""

from .client import EtcdStore
from .contract import (
    ETCD_MAX_TXN_OPS,
    Compacted,
    Condition,
    Delete,
    Entry,
    Event,
    ModRevisionIs,
    Op,
    Put,
    RangeResult,
    Store,
    TxnResult,
    ValueIs,
    WatchBatch,
    batches,
)
from .memory import MemoryStore

__all__ = [
    "ETCD_MAX_TXN_OPS",
    "Compacted",
    "Condition",
    "Delete",
    "Entry",
    "EtcdStore",
    "Event",
    "MemoryStore",
    "ModRevisionIs",
    "Op",
    "Put",
    "RangeResult",
    "Store",
    "TxnResult",
    "ValueIs",
    "WatchBatch",
    "batches",
]
