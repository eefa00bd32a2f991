"""AdminService: the operator's read API, answered from this process's memory.

Every control plane serves it. Live fleet state (nodes, reported replica
states, placement messages) lives only on the leader. A standby answers
what etcd holds and says where the rest is: ``ListReplicas`` lists the
replica records from etcd, ready when the replica is published (every
control plane mirrors ``endpoints/``), each message naming the leader;
``ListNodes`` is UNAVAILABLE with the leader's id and address (nodes are
soft state, rebuilt from the agents, never written to etcd).

Bad input gets a status that says what to fix (an unknown model filter is
NOT_FOUND naming the known models), never an empty answer that looks like
"nothing runs".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc

from llmgw.common.errors import LlmgwError, NotFound, Unavailable, abort_with, excerpt
from llmgw.common.etcd import RangeResult
from llmgw.v1 import admin_pb2, admin_pb2_grpc, agent_pb2, endpoints_pb2

from ..decide.autoscale import ModelScale
from ..decide.reconcile import Backoff, Replica
from ..leader.leadership import LeaderInfo, Term
from ..spec.catalog import Catalog
from ..state.inventory import Node
from ..state.traffic import ZERO
from ..state.usage import Demand, RoutersView
from ..store.models import RuntimeModels, encode, parse_document
from ..store.replicas import PREFIX as REPLICAS_PREFIX
from ..store.replicas import ReplicaRecord

log = logging.getLogger("llmgw.control.api.admin")


class FleetView(Protocol):
    @property
    def catalog(self) -> Catalog: ...
    def nodes(self) -> list[Node]: ...
    def replicas(self) -> list[Replica]: ...
    @property
    def placement_messages(self) -> Mapping[str, str]: ...
    def used_gpus(self, node: Node) -> set[int]: ...
    @property
    def backoffs(self) -> Mapping[str, Backoff]: ...
    @property
    def now(self) -> float: ...
    def scaling(self, model: str) -> ModelScale | None: ...
    def lifecycle(self, model_name: str) -> tuple[str, str]: ...


class LeaderReader(Protocol):
    @property
    def is_leader(self) -> bool: ...
    @property
    def term(self) -> Term | None: ...
    @property
    def known_leader(self) -> LeaderInfo | None: ...
    async def leader(self) -> LeaderInfo | None: ...


class Mirror(Protocol):
    @property
    def revision(self) -> int: ...
    @property
    def items(self) -> Mapping[str, bytes]: ...


class RecordReader(Protocol):
    async def range(self, prefix: str) -> RangeResult: ...


class RouterReports(Protocol):
    def routers_view(self, catalog: Catalog, now: float) -> RoutersView: ...


class SettingsState(Protocol):
    @property
    def settings_version(self) -> int: ...
    @property
    def restart_pending(self) -> list[str]: ...


class AdminServicer(admin_pb2_grpc.AdminServiceServicer):
    def __init__(
        self,
        cluster: str,
        control_id: str,
        fleet: FleetView,
        leadership: LeaderReader,
        endpoints: Mirror,
        clock: Callable[[], float],
        models: RuntimeModels,
        records: RecordReader,
        settings: SettingsState | None = None,
        routers: RouterReports | None = None,
    ):
        self._cluster = cluster
        self._id = control_id
        self._fleet = fleet
        self._leadership = leadership
        self._endpoints = endpoints
        self._clock = clock
        self._models = models
        self._records = records
        self._settings = settings
        self._routers = routers

    async def GetClusterStatus(  # noqa: N802 - gRPC method name
        self, request: admin_pb2.GetClusterStatusRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ClusterStatus:
        leader = await self._leader()
        # Whether this process leads, and who leads, from one moment: the read
        # above may have started before this process won and come back empty.
        term = self._leadership.term
        if term is not None:
            leader = term.info
        replicas: Sequence[Replica | _Stored] = []
        try:
            replicas = await self._replicas(leading=term is not None)
        except Unavailable as err:
            log.warning("cluster status: etcd did not answer, no replica counts: %s", err)
        return admin_pb2.ClusterStatus(
            cluster=self._cluster,
            control_id=self._id,
            leader=term is not None,
            leader_id=leader.id if leader else "",
            leader_address=leader.address if leader else "",
            nodes=len(self._fleet.nodes()),
            models=len(self._fleet.catalog),
            replicas=len(replicas),
            ready_replicas=sum(r.ready for r in replicas),
            endpoint_revision=self._endpoints.revision,
            placement_problems=[f"{m}: {msg}" for m, msg in sorted(self._fleet.placement_messages.items())],
            settings_version=self._settings.settings_version if self._settings else 0,
            restart_pending=self._settings.restart_pending if self._settings else [],
        )

    async def ListModels(  # noqa: N802 - gRPC method name
        self, request: admin_pb2.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListModelsResponse:
        try:
            replicas = await self._replicas(leading=self._leadership.is_leader)
        except Unavailable as err:
            await abort_with(context, err)
        messages = self._fleet.placement_messages
        out = []
        for m in self._fleet.catalog:
            mine = [r for r in replicas if r.record.model == m.name]
            scale = self._fleet.scaling(m.name)
            rollout, gate = self._fleet.lifecycle(m.name)
            out.append(
                admin_pb2.ModelStatus(
                    name=m.name,
                    aliases=list(m.aliases),
                    engine=m.engine,
                    gpus=m.gpus,
                    min_replicas=m.min_replicas,
                    replicas=len(mine),
                    ready_replicas=sum(r.ready for r in mine),
                    placement_message=messages.get(m.name, ""),
                    origin=m.origin,
                    capacity_class=m.spec.capacity_class if m.spec else "standard",
                    max_replicas=m.max_replicas,
                    fallbacks=list(m.fallbacks),
                    canary=m.spec.canary.model if m.spec and m.spec.canary else "",
                    canary_percent=m.spec.canary.percent if m.spec and m.spec.canary else 0.0,
                    desired_replicas=scale.desired if scale is not None else None,
                    scaling_reason=scale.reason if scale is not None else "",
                    rollout=rollout,
                    eval_gate=gate,
                )
            )
        return admin_pb2.ListModelsResponse(models=out)

    async def _leader(self) -> LeaderInfo | None:
        """The leader as etcd says now, or the last one seen while etcd does not answer."""
        try:
            return await self._leadership.leader()
        except Unavailable as err:
            log.warning("etcd did not answer, using the last known leader: %s", err)
            return self._leadership.known_leader

    async def _where_is_the_leader(self) -> str:
        leader = await self._leader()
        if leader is None:
            return "no control plane leads right now; ask again in a few seconds"
        return f"the leader is {leader.id} at {leader.address} (ask it: --control {leader.address})"

    async def ListNodes(  # noqa: N802 - gRPC method name
        self, request: admin_pb2.ListNodesRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListNodesResponse:
        if not self._leadership.is_leader:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"{self._id} is a standby; nodes are known only to the leader: "
                + await self._where_is_the_leader(),
            )
        now = self._clock()
        out = []
        for n in self._fleet.nodes():
            out.append(
                admin_pb2.NodeStatus(
                    node_id=n.id,
                    address=n.address,
                    state=n.status,
                    gpus=[g.to_proto() for g in n.gpus],
                    used_gpu_indices=sorted(self._fleet.used_gpus(n)),
                    labels=dict(n.labels),
                    engines=[e.to_proto() for e in n.engines],
                    driver_version=n.driver_version,
                    cuda_version=n.cuda_version,
                    last_seen_seconds_ago=max(0.0, now - n.last_seen),
                    held=n.held,
                    hold_reason=n.hold_reason,
                    memory_bytes=n.memory_bytes,
                    cpu_cores=n.cpu_cores,
                    version=n.version,
                )
            )
        return admin_pb2.ListNodesResponse(nodes=out)

    async def ListRouters(  # noqa: N802 - gRPC method name
        self, request: admin_pb2.ListRoutersRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListRoutersResponse:
        if not self._leadership.is_leader or self._routers is None:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"{self._id} is a standby; routers report to the leader only: "
                + await self._where_is_the_leader(),
            )
        assert self._routers is not None  # abort raised otherwise
        view = self._routers.routers_view(self._fleet.catalog, self._clock())
        models = sorted(set(view.demand) | set(view.rates))
        zero = Demand()
        return admin_pb2.ListRoutersResponse(
            routers=[
                admin_pb2.RouterStatus(
                    router_id=r.router,
                    last_report_seconds_ago=r.age,
                    interval_seconds=r.interval,
                    in_flight=r.in_flight,
                    pending=r.pending,
                    requests=int(r.totals.requests),
                    client_errors=int(r.totals.client_errors),
                    server_errors=int(r.totals.server_errors),
                    requests_per_second=r.rates.requests,
                    client_errors_per_second=r.rates.client_errors,
                    server_errors_per_second=r.rates.server_errors,
                    window_seconds=r.window,
                )
                for r in view.routers
            ],
            models=[
                admin_pb2.ModelTrafficStatus(
                    model=m,
                    load=view.demand.get(m, zero).load,
                    pending=view.demand.get(m, zero).pending,
                    requests_per_second=view.rates.get(m, ZERO).requests,
                    client_errors_per_second=view.rates.get(m, ZERO).client_errors,
                    server_errors_per_second=view.rates.get(m, ZERO).server_errors,
                )
                for m in models
            ],
            window_seconds=view.window,
        )

    async def ListReplicas(  # noqa: N802 - gRPC method name
        self, request: admin_pb2.ListReplicasRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListReplicasResponse:
        try:
            replicas = await self._replicas(leading=self._leadership.is_leader)
        except Unavailable as err:
            await abort_with(context, err)
        wanted = request.model
        if wanted:
            model = self._fleet.catalog.resolve(wanted)
            if model is not None:
                wanted = model.name
            elif not any(r.record.model == wanted for r in replicas):
                known = ", ".join(self._fleet.catalog.names) or "none"
                await abort_with(
                    context,
                    NotFound(
                        f"model {excerpt(request.model)} is not in the catalog (known models: {known}); "
                        "leave the filter empty to list every replica"
                    ),
                )
        out = []
        for r in replicas:
            rec = r.record
            if wanted and rec.model != wanted:
                continue
            out.append(self._replica_info(r))
        now = self._fleet.now
        failures = [
            admin_pb2.ReplicaFailure(
                model=name,
                replica_id=b.replica_id,
                node_id=b.node,
                failures=b.failures,
                retry_in_seconds=max(0.0, b.retry_at - now),
                last_error=b.last_error,
            )
            for name, b in sorted(self._fleet.backoffs.items())
            if not wanted or name == wanted
        ]
        return admin_pb2.ListReplicasResponse(replicas=out, failures=failures)

    async def _replicas(self, *, leading: bool) -> Sequence[Replica | _Stored]:
        """The leader's live view, or on a standby the records in etcd (raises Unavailable)."""
        if leading:
            return self._fleet.replicas()
        return await self._stored_replicas()

    def _replica_info(self, r: Replica | _Stored) -> admin_pb2.ReplicaInfo:
        rec = r.record
        if isinstance(r, _Stored):
            return admin_pb2.ReplicaInfo(
                replica_id=rec.id,
                model=rec.model,
                node_id=rec.node,
                state=agent_pb2.REPLICA_STATE_READY if r.url else agent_pb2.REPLICA_STATE_UNSPECIFIED,
                url=r.url,
                gpu_indices=list(rec.gpu_indices),
                message=r.message,
                engine=rec.engine,
            )
        rep = r.reported
        return admin_pb2.ReplicaInfo(
            replica_id=rec.id,
            model=rec.model,
            node_id=rec.node,
            state=r.state,
            url=rep.url if rep else "",
            gpu_indices=list(rec.gpu_indices),
            message=rep.message if rep else "",
            engine=rec.engine,
        )

    async def _stored_replicas(self) -> list[_Stored]:
        """On a standby: the leader's replica records from etcd, ready when published.

        Raises Unavailable when etcd does not answer.
        """
        try:
            result = await self._records.range(REPLICAS_PREFIX)
        except Unavailable as err:
            raise Unavailable(f"{self._id} is a standby and etcd failed: {err}") from err
        where = "standby view from etcd; " + await self._where_is_the_leader()
        published = self._endpoints.items
        out = []
        for e in result.entries:
            try:
                rec = ReplicaRecord.from_json(e.value)
            except ValueError:
                continue
            url = ""
            if rec.id in published:
                url = endpoints_pb2.Endpoint.FromString(published[rec.id]).url
            out.append(_Stored(rec, url, where))
        return sorted(out, key=lambda r: r.record.id)

    # -- models added at runtime ---------------------------------------------------

    async def GetModel(  # noqa: N802 - gRPC method name
        self, request: admin_pb2.GetModelRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ModelDocument:
        model = self._fleet.catalog.resolve(request.name)
        if model is None or model.spec is None:
            known = ", ".join(self._fleet.catalog.names) or "none"
            await abort_with(
                context, NotFound(f"model {excerpt(request.name)} is not in the catalog (known: {known})")
            )
        revision = 0
        if model.origin == "runtime":
            try:
                revision = await self._models.revision(model.name)
            except LlmgwError as err:
                await abort_with(context, err)
        return _document(model.spec, model.origin, revision)

    async def AddModel(  # noqa: N802 - gRPC method name
        self, request: admin_pb2.PutModelRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ModelDocument:
        return await self._put(request, context, replace=False)

    async def UpdateModel(  # noqa: N802 - gRPC method name
        self, request: admin_pb2.PutModelRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ModelDocument:
        return await self._put(request, context, replace=True)

    async def _put(
        self, request: admin_pb2.PutModelRequest, context: grpc.aio.ServicerContext, *, replace: bool
    ) -> admin_pb2.ModelDocument:
        try:
            spec = parse_document(request.document, "model document")
            await self._models.put(spec, replace=replace, if_revision=request.if_revision)
            revision = await self._models.revision(spec.name)
        except LlmgwError as err:
            await abort_with(context, err)
        log.info("model %s %s at runtime", spec.name, "changed" if replace else "added")
        return _document(spec, "runtime", revision)

    async def RemoveModel(  # noqa: N802 - gRPC method name
        self, request: admin_pb2.RemoveModelRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.RemoveModelResponse:
        try:
            await self._models.remove(request.name)
        except LlmgwError as err:
            await abort_with(context, err)
        log.info("model %s removed at runtime", request.name)
        return admin_pb2.RemoveModelResponse()


@dataclass(frozen=True)
class _Stored:
    """A replica as a standby knows it: the record, and the URL if published."""

    record: ReplicaRecord
    url: str
    message: str

    @property
    def ready(self) -> bool:
        return bool(self.url)


def _document(spec, origin: str, revision: int = 0) -> admin_pb2.ModelDocument:
    return admin_pb2.ModelDocument(
        name=spec.name, document=encode(spec).decode(), origin=origin, revision=revision
    )
