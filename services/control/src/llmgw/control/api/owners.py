"""OwnerService: what each owner scope holds against its quotas, and its GPU-hours.

Translates the leader's state: holdings come from :class:`~llmgw.control.decide.tenancy.Ledger`
(the same count placement enforces quotas with, so ``llmgw usage`` and a
refusal never disagree), GPU-hours from the controller's term-long
integration (:mod:`llmgw.control.state.gpuhours`). A scope's figures include
every scope under it; its ``models`` list only the models it owns itself.
A standby knows no fleet and answers FAILED_PRECONDITION naming the leader,
like PlacementService.

Requests and tokens are the client keys' (a key's ``owner``, when it is an
owner path), from the routers' quota reports (:mod:`..state.ownerrequests`):
who consumed, where GPU-hours are who runs. Both roll up the tree the same
way; ``requested`` lists exactly the scope's own keys' use by model.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Protocol

import grpc

from llmgw.v1 import owners_pb2, owners_pb2_grpc

from ..decide.reconcile import Replica
from ..decide.tenancy import Ledger
from ..spec.catalog import Catalog
from ..spec.tenancy import Quota, scopes
from ..state.gpuhours import GpuHours
from ..state.inventory import Node
from ..state.ownerrequests import HISTORY_SECONDS, OwnerRequests
from .nodes import LeaderReader, abort_unless_leading


class OwnerView(Protocol):
    @property
    def accepting(self) -> bool: ...
    @property
    def catalog(self) -> Catalog: ...
    @property
    def gpu_hours(self) -> GpuHours: ...
    def nodes(self) -> list[Node]: ...
    def replicas(self) -> list[Replica]: ...
    def quotas(self) -> Mapping[str, Quota]: ...


def _under(scope: str, owner: str) -> bool:
    return not owner or scope == owner or scope.startswith(owner + "/")


class OwnerServicer(owners_pb2_grpc.OwnerServiceServicer):
    def __init__(
        self,
        view: OwnerView,
        leadership: LeaderReader,
        requests: OwnerRequests | None = None,
        term: Callable[[], object | None] = lambda: None,
        wall: Callable[[], float] = time.time,
    ):
        self._view = view
        self._leadership = leadership
        self._requests = requests if requests is not None else OwnerRequests()
        self._term = term
        self._wall = wall

    async def ListOwnerUsage(  # noqa: N802 - gRPC method name
        self, request: owners_pb2.ListOwnerUsageRequest, context: grpc.aio.ServicerContext
    ) -> owners_pb2.ListOwnerUsageResponse:
        view = self._view
        await abort_unless_leading(self._leadership, context, view.accepting)
        period = request.period_seconds
        if not 0 <= period <= HISTORY_SECONDS:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"period_seconds must be 0 (the whole term) to {HISTORY_SECONDS} (a day), not {period:g}",
            )
        wall = self._wall()
        book = self._requests.term(self._term(), wall)
        consumed: dict[str, list[int]] = {}
        requested: dict[str, list[owners_pb2.ModelRequests]] = {}
        for (owner, name), (n, tokens) in sorted(book.over(period, wall).items()):
            requested.setdefault(owner, []).append(
                owners_pb2.ModelRequests(model=name, requests=n, tokens=tokens)
            )
            for scope in scopes(owner):
                tally = consumed.setdefault(scope, [0, 0])
                tally[0] += n
                tally[1] += tokens
        catalog, quotas, replicas = view.catalog, view.quotas(), view.replicas()
        ledger = Ledger(quotas, catalog, {n.id: n for n in view.nodes()}, [r.record for r in replicas])
        per_model_replicas: Counter[str] = Counter(r.record.model for r in replicas)
        per_model_gpus: Counter[str] = Counter()
        for r in replicas:
            per_model_gpus[r.record.model] += len(r.record.gpu_indices)
        hours: dict[str, float] = {}
        own: dict[str, list[owners_pb2.ModelUsage]] = {}
        for model in sorted(catalog, key=lambda m: m.name):
            if not model.owner:
                continue
            used = owners_pb2.ModelUsage(
                model=model.name,
                replicas=per_model_replicas[model.name],
                gpus=per_model_gpus[model.name],
                gpu_hours=view.gpu_hours.hours(model.name),
            )
            own.setdefault(model.owner, []).append(used)
            for scope in scopes(model.owner):
                hours[scope] = hours.get(scope, 0.0) + used.gpu_hours
        out = []
        for scope in sorted({*ledger.use, *quotas, *own, *hours, *consumed}):
            if not _under(scope, request.owner):
                continue
            u, q = ledger.usage(scope), quotas.get(scope, Quota())
            out.append(
                owners_pb2.OwnerUsage(
                    owner=scope,
                    replicas=u.replicas,
                    gpus=u.gpus,
                    gpu_memory_bytes=u.gpu_memory_bytes,
                    gpu_hours=hours.get(scope, 0.0),
                    quota_replicas=q.replicas,
                    quota_gpus=q.gpus,
                    quota_gpu_memory_gb=q.gpu_memory_gb,
                    quota_requests_per_minute=q.requests_per_minute,
                    quota_tokens_per_minute=q.tokens_per_minute,
                    models=own.get(scope, []),
                    requests=consumed.get(scope, [0, 0])[0],
                    tokens=consumed.get(scope, [0, 0])[1],
                    requested=requested.get(scope, []),
                )
            )
        since = max(book.since, wall - period) if period else book.since
        return owners_pb2.ListOwnerUsageResponse(owners=out, since=view.gpu_hours.since, requests_since=since)
