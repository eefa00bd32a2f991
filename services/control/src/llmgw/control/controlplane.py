"""One control plane, assembled: the object main runs and tests start in-process.

Wiring only, no policy. One gRPC server carries AgentService,
EndpointService, CatalogService, AdminService and UsageService (plus health
and reflection from GrpcServer), NodeService, PlacementService and
NodeAdminService. Six tasks run under one TaskGroup: the two watch hubs
(every control plane), the
leadership loop, the controller (which acts only while this process leads),
and the followers of models added at runtime and of node overrides (holds,
labels) -- every control plane, so the catalog and holds in force are the
same everywhere and a standby that takes over needs no reload.

Shutdown order, and why: health goes NOT_SERVING (balancers stop sending),
leadership is resigned (the lease is revoked, so a standby takes over at
once instead of after a TTL; the controller closes agent streams and they
reconnect there), watch streams are ended (routers reconnect to another
control plane), then the server stops with a grace period for what is left.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from llmgw.common.config import split_host_port
from llmgw.common.etcd import Store
from llmgw.common.grpcserver import GrpcServer
from llmgw.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    agent_pb2,
    agent_pb2_grpc,
    endpoints_pb2,
    endpoints_pb2_grpc,
    nodeadmin_pb2,
    nodeadmin_pb2_grpc,
    nodes_pb2,
    nodes_pb2_grpc,
    usage_pb2,
    usage_pb2_grpc,
)

from .admin import AdminServicer
from .agents import AgentServicer, AgentSessions
from .catalog import Catalog
from .config import ControlConfig
from .controller import Controller, ControllerSettings
from .leadership import Leadership
from .metrics import AutoscaleMetrics, ControlMetrics
from .models import RuntimeModels
from .nodeadmin import NodeAdminServicer
from .nodeapi import NodeServicer, PlacementServicer
from .nodeoverrides import NodeOverrides
from .publisher import CATALOG_PREFIX, ENDPOINTS_PREFIX
from .reports import UsageServicer
from .scaler import Scaler, ScalerSettings
from .usage import UsageBook
from .watches import CatalogWatchServicer, EndpointWatchServicer
from .watchhub import WatchHub

log = logging.getLogger("llmgw.control")


def _service(module, name: str) -> str:
    return module.DESCRIPTOR.services_by_name[name].full_name


class ControlPlane:
    def __init__(
        self,
        config: ControlConfig,
        store: Store,
        secret: bytes,
        *,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ):
        self.config = config
        self.metrics = ControlMetrics(registry if registry is not None else CollectorRegistry())
        catalog = Catalog.from_specs(config.models)
        self.models = RuntimeModels(store, config.models)
        self.overrides = NodeOverrides(store, wall)
        self.leadership = Leadership(
            store, config.control_id, config.lease_ttl_seconds, clock=clock, wall=wall
        )
        self.sessions = AgentSessions(self.metrics.agents)
        scaling = config.autoscaling
        self.scaler = Scaler(
            UsageBook(scaling.report_expiry_intervals),
            lambda: self.controller.notify(),
            ScalerSettings(scaling.drain_settle_seconds, scaling.drain_timeout_seconds),
            AutoscaleMetrics(self.metrics.registry),
        )
        self.controller = Controller(
            store,
            self.leadership,
            catalog,
            self.sessions,
            secret,
            self.metrics,
            ControllerSettings(
                node_timeout_seconds=config.node_timeout_seconds,
                node_lost_seconds=config.node_lost_seconds,
                reconcile_interval_seconds=config.reconcile_interval_seconds,
                failure_backoff_seconds=config.failure_backoff_seconds,
                failure_backoff_max_seconds=config.failure_backoff_max_seconds,
                command_resend_seconds=config.command_resend_seconds,
                placement_settle_seconds=config.placement_settle_seconds,
                placement_policy=config.placement_policy,
                ready_timeout_seconds=float(config.lease_ttl_seconds),
            ),
            clock=clock,
            wall=wall,
            scaler=self.scaler,
        )
        self.endpoints = WatchHub(store, ENDPOINTS_PREFIX, "endpoints", self.metrics, config.watch_history)
        self.catalog_hub = WatchHub(store, CATALOG_PREFIX, "catalog", self.metrics, config.watch_history)
        heartbeat = min(config.heartbeat_interval_seconds, config.node_timeout_seconds / 3)
        self.server = GrpcServer(
            config.listen,
            [
                (
                    agent_pb2_grpc.add_AgentServiceServicer_to_server,
                    AgentServicer(
                        config.control_id,
                        self.leadership,
                        self.controller,
                        self.sessions,
                        heartbeat,
                    ),
                    _service(agent_pb2, "AgentService"),
                ),
                (
                    endpoints_pb2_grpc.add_EndpointServiceServicer_to_server,
                    EndpointWatchServicer(self.endpoints, self.metrics.watchers),
                    _service(endpoints_pb2, "EndpointService"),
                ),
                (
                    endpoints_pb2_grpc.add_CatalogServiceServicer_to_server,
                    CatalogWatchServicer(self.catalog_hub, self.metrics.watchers),
                    _service(endpoints_pb2, "CatalogService"),
                ),
                (
                    admin_pb2_grpc.add_AdminServiceServicer_to_server,
                    AdminServicer(
                        config.cluster,
                        config.control_id,
                        self.controller,
                        self.leadership,
                        self.endpoints,
                        clock,
                        self.models,
                    ),
                    _service(admin_pb2, "AdminService"),
                ),
                (
                    nodes_pb2_grpc.add_NodeServiceServicer_to_server,
                    NodeServicer(self.overrides),
                    _service(nodes_pb2, "NodeService"),
                ),
                (
                    nodes_pb2_grpc.add_PlacementServiceServicer_to_server,
                    PlacementServicer(self.controller, self.leadership),
                    _service(nodes_pb2, "PlacementService"),
                ),
                (
                    nodeadmin_pb2_grpc.add_NodeAdminServiceServicer_to_server,
                    NodeAdminServicer(self.controller, self.sessions, self.leadership),
                    _service(nodeadmin_pb2, "NodeAdminService"),
                ),
                (
                    usage_pb2_grpc.add_UsageServiceServicer_to_server,
                    UsageServicer(lambda: self.controller.accepting, self.leadership, self.scaler, clock),
                    _service(usage_pb2, "UsageService"),
                ),
            ],
        )
        host, _ = split_host_port(config.listen)
        if host in ("0.0.0.0", "::"):
            host = socket.gethostname()
        # The actual port, so a listen address with port 0 advertises what was bound.
        self.address = config.advertise or f"{host}:{self.server.port}"

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then shut down gracefully."""
        await self.server.start()
        log.info(
            "control plane %s of cluster %s serving on port %d, advertised as %s; %d model(s)",
            self.config.control_id,
            self.config.cluster,
            self.server.port,
            self.address,
            len(self.controller.catalog),
        )
        try:
            async with asyncio.TaskGroup() as tg:
                tasks = [
                    tg.create_task(self.endpoints.run(), name="watch-endpoints"),
                    tg.create_task(self.catalog_hub.run(), name="watch-catalog"),
                    tg.create_task(self.leadership.run(self.address), name="leadership"),
                    tg.create_task(self.controller.run(), name="controller"),
                    tg.create_task(self.models.follow(self.controller.replace_catalog), name="models"),
                    tg.create_task(
                        self.overrides.follow(self.controller.replace_overrides), name="node-overrides"
                    ),
                ]
                await stop.wait()
                await self._drain()
                for t in tasks:
                    t.cancel()
        finally:
            await self.server.stop(0)
        log.info("control plane %s stopped", self.config.control_id)

    async def _drain(self) -> None:
        log.info("control plane %s shutting down", self.config.control_id)
        await self.server.health.enter_graceful_shutdown()
        await self.leadership.resign()
        # Let the controller see the end of its term and close agent streams.
        await asyncio.sleep(0)
        await self.endpoints.close()
        await self.catalog_hub.close()
        await self.server.stop(self.config.shutdown_grace_seconds)
