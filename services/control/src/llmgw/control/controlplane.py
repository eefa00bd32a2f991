"""One control plane, assembled: the object main runs and tests start in-process.

Wiring only, no policy. One gRPC server carries AgentService,
EndpointService, CatalogService, AdminService, SettingsService, NodeService,
PlacementService, OwnerService, NodeAdminService, UsageService (routers' load reports,
:mod:`llmgw.control.api.usage`), and KeyService, KeyTableService and QuotaService (client
keys, :mod:`llmgw.control.api.keys` and :mod:`llmgw.control.api.quota`), plus health and reflection from
GrpcServer, on mutual TLS (``tls`` of the config) behind the
authorization interceptor (:mod:`llmgw.control.api.auth`: which role may
call which method; the admin token is one way to be admin).
The fleet metrics collector (:mod:`llmgw.control.leader.fleetmetrics`) is
registered on the same registry as the control plane's counters.
Before serving, the cluster settings are read from etcd (or imported from
the file into an empty store) and put in force. Then tasks run under one
TaskGroup: the three watch hubs (endpoints, catalog, keys; every control
plane), the leadership loop, the controller (which acts only while this
process leads), the followers of models added at runtime, of node overrides
(holds, labels), of domain holds and of the settings -- every control plane, so the catalog,
holds and settings in force are the same everywhere and a standby that
takes over needs no reload -- and the restarter, which stops this process
gracefully when a setting that is read only at start changes (main then
starts it again).

Shutdown order, and why: health goes NOT_SERVING (balancers stop sending),
leadership is resigned (the lease is revoked, so a standby takes over at
once instead of after a TTL; the controller closes agent streams and they
reconnect there), watch streams are ended (routers reconnect to another
control plane), then the server stops with a grace period for what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from llmgw.common.config import split_host_port
from llmgw.common.errors import InvalidArgument, Unavailable
from llmgw.common.etcd import Store
from llmgw.common.grpcserver import GrpcServer
from llmgw.common.pki import ca_pin, load_certs
from llmgw.common.tls import join_port_credentials
from llmgw.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    agent_pb2,
    agent_pb2_grpc,
    endpoints_pb2,
    endpoints_pb2_grpc,
    fabric_pb2,
    fabric_pb2_grpc,
    federation_pb2,
    federation_pb2_grpc,
    keys_pb2,
    keys_pb2_grpc,
    nodeadmin_pb2,
    nodeadmin_pb2_grpc,
    nodes_pb2,
    nodes_pb2_grpc,
    owners_pb2,
    owners_pb2_grpc,
    settings_pb2,
    settings_pb2_grpc,
    trust_pb2,
    trust_pb2_grpc,
    usage_pb2,
    usage_pb2_grpc,
)

from .api.admin import AdminServicer
from .api.agents import AgentServicer, AgentSessions
from .api.auth import Authorizer
from .api.fabric import FabricServicer
from .api.federation import FederationServicer
from .api.join import MAX_MESSAGE_BYTES as JOIN_MAX_MESSAGE_BYTES
from .api.join import (
    CertificateAuthority,
    CertificateServicer,
    JoinGate,
    JoinLimits,
    JoinServicer,
    JoinTokenServicer,
)
from .api.keys import PREFIX as KEYS_PREFIX
from .api.keys import KeyServicer, KeyStore
from .api.nodeadmin import NodeAdminServicer
from .api.nodes import NodeServicer, PlacementServicer
from .api.owners import OwnerServicer
from .api.quota import QuotaServicer
from .api.renewal import RenewalServicer, RenewLimits
from .api.revocation import Enforcer
from .api.settings import SettingsServicer
from .api.usage import UsageServicer
from .api.watches import CatalogWatchServicer, EndpointWatchServicer, KeyWatchServicer
from .config import ClusterSettings, ControlConfig
from .http.app import HttpApp, HttpServer
from .http.session import Sessions
from .http.transcode import Dispatcher
from .leader import fleetmetrics
from .leader.controller import Controller, ControllerSettings
from .leader.federation import HttpPeerCheck, PeerChecker, PeerCollector
from .leader.leadership import Leadership
from .leader.publisher import CATALOG_PREFIX, ENDPOINTS_PREFIX
from .leader.scaler import Scaler, ScalerSettings
from .metrics import AutoscaleMetrics, ControlMetrics
from .spec.catalog import Catalog
from .spec.loadcheck import LoadCheck
from .state.usage import UsageBook
from .store.domainholds import DomainHolds
from .store.fabric import FabricResults
from .store.models import RuntimeModels
from .store.nodeoverrides import NodeOverrides
from .store.settings import SettingsStore, restart_keys
from .store.trust import JoinTokens, Revocations
from .store.watchhub import WatchHub

log = logging.getLogger("llmgw.control")


def _service(module, name: str) -> str:
    return module.DESCRIPTOR.services_by_name[name].full_name


def scaler_settings(s: ClusterSettings) -> ScalerSettings:
    return ScalerSettings(s.autoscaling.drain_settle_seconds, s.autoscaling.drain_timeout_seconds)


def controller_settings(s: ClusterSettings) -> ControllerSettings:
    """The controller's timings from the file or the cluster settings (same key names)."""
    return ControllerSettings(
        node_timeout_seconds=s.node_timeout_seconds,
        node_lost_seconds=s.node_lost_seconds,
        reconcile_interval_seconds=s.reconcile_interval_seconds,
        failure_backoff_seconds=s.failure_backoff_seconds,
        failure_backoff_max_seconds=s.failure_backoff_max_seconds,
        command_resend_seconds=s.command_resend_seconds,
        placement_settle_seconds=s.placement_settle_seconds,
        placement_policy=s.placement_policy,
        quotas=dict(s.quotas),
        power_budgets=dict(s.power_budgets),
        eval_suites=dict(s.eval_suites),
        ready_timeout_seconds=float(s.lease_ttl_seconds),
    )


def heartbeat_seconds(s) -> float:
    # Capped at a third of the node timeout, so a node is never declared
    # unreachable between two healthy heartbeats.
    return min(s.heartbeat_interval_seconds, s.node_timeout_seconds / 3)


class ControlPlane:
    def __init__(
        self,
        config: ControlConfig,
        store: Store,
        secret: bytes,
        *,
        admin_token: str = "",
        source: str = "the configuration file",
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ):
        self.config = config
        self._source = source
        self.settings = SettingsStore(store, wall)
        self.restart_pending: list[str] = []
        self.restart_requested = False
        self._restart = asyncio.Event()
        self._started_with: ClusterSettings | None = None
        self.metrics = ControlMetrics(registry if registry is not None else CollectorRegistry())
        peers = config.federation.names
        catalog = Catalog.from_specs(config.models, peers=peers)
        self.models = RuntimeModels(
            store, config.models, check=LoadCheck(paths=config.load_check_paths).check, peers=peers
        )
        self.overrides = NodeOverrides(store, wall)
        self.domain_holds = DomainHolds(store, wall)
        self.leadership = Leadership(
            store, config.control_id, config.lease_ttl_seconds, clock=clock, wall=wall
        )
        self.sessions = AgentSessions(self.metrics.agents)
        scaling = config.autoscaling
        self.scaler = Scaler(
            UsageBook(scaling.report_expiry_intervals),
            lambda: self.controller.notify(),
            scaler_settings(config),
            AutoscaleMetrics(self.metrics.registry),
        )
        self.controller = Controller(
            store,
            self.leadership,
            catalog,
            self.sessions,
            secret,
            self.metrics,
            controller_settings(config),
            clock=clock,
            wall=wall,
            scaler=self.scaler,
        )
        self.peer_check = HttpPeerCheck()
        self.federation = PeerChecker(
            self.peer_check, self.controller, config.cluster, config.federation, wall=wall
        )
        self.metrics.registry.register(PeerCollector(self.federation))
        fleetmetrics.register(self.metrics.registry, self.controller, lambda: self.settings_version)
        self.endpoints = WatchHub(store, ENDPOINTS_PREFIX, "endpoints", self.metrics, config.watch_history)
        self.catalog_hub = WatchHub(store, CATALOG_PREFIX, "catalog", self.metrics, config.watch_history)
        self.keys_hub = WatchHub(store, KEYS_PREFIX, "keys", self.metrics, config.watch_history)
        self.quota = QuotaServicer(self.keys_hub, self.leadership, clock, self._owner_budgets, wall=wall)
        self.metrics.registry.register(
            fleetmetrics.OwnerRequestsCollector(self.quota.owner_requests, lambda: self.leadership.term, wall)
        )
        self.agents = AgentServicer(
            config.control_id, self.leadership, self.controller, self.sessions, heartbeat_seconds(config)
        )
        self.enforcer = Enforcer()
        self.join_tokens = JoinTokens(store, wall)
        self.revocations = Revocations(store, wall)
        self.join_server = self._join_server(config, wall)
        self.server = GrpcServer(
            config.listen,
            [
                (
                    agent_pb2_grpc.add_AgentServiceServicer_to_server,
                    self.agents,
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
                        store,
                        self,
                        self.scaler,
                    ),
                    _service(admin_pb2, "AdminService"),
                ),
                (
                    nodes_pb2_grpc.add_NodeServiceServicer_to_server,
                    NodeServicer(self.overrides, self.domain_holds, self.controller.nodes),
                    _service(nodes_pb2, "NodeService"),
                ),
                (
                    nodes_pb2_grpc.add_PlacementServiceServicer_to_server,
                    PlacementServicer(self.controller, self.leadership),
                    _service(nodes_pb2, "PlacementService"),
                ),
                (
                    owners_pb2_grpc.add_OwnerServiceServicer_to_server,
                    OwnerServicer(
                        self.controller,
                        self.leadership,
                        self.quota.owner_requests,
                        lambda: self.leadership.term,
                        wall,
                    ),
                    _service(owners_pb2, "OwnerService"),
                ),
                (
                    nodeadmin_pb2_grpc.add_NodeAdminServiceServicer_to_server,
                    NodeAdminServicer(self.controller, self.sessions, self.leadership),
                    _service(nodeadmin_pb2, "NodeAdminService"),
                ),
                (
                    fabric_pb2_grpc.add_FabricServiceServicer_to_server,
                    FabricServicer(
                        self.controller, self.sessions, self.leadership, FabricResults(store), wall
                    ),
                    _service(fabric_pb2, "FabricService"),
                ),
                (
                    settings_pb2_grpc.add_SettingsServiceServicer_to_server,
                    SettingsServicer(self.settings, self),
                    _service(settings_pb2, "SettingsService"),
                ),
                (
                    keys_pb2_grpc.add_KeyServiceServicer_to_server,
                    KeyServicer(KeyStore(store, wall), lambda: self.controller.catalog),
                    _service(keys_pb2, "KeyService"),
                ),
                (
                    keys_pb2_grpc.add_KeyTableServiceServicer_to_server,
                    KeyWatchServicer(self.keys_hub, self.metrics.watchers),
                    _service(keys_pb2, "KeyTableService"),
                ),
                (
                    keys_pb2_grpc.add_QuotaServiceServicer_to_server,
                    self.quota,
                    _service(keys_pb2, "QuotaService"),
                ),
                (
                    federation_pb2_grpc.add_FederationServiceServicer_to_server,
                    FederationServicer(self.federation, self.controller, self.settings),
                    _service(federation_pb2, "FederationService"),
                ),
                (
                    trust_pb2_grpc.add_JoinTokenServiceServicer_to_server,
                    JoinTokenServicer(self.join_tokens, self._ca_pin, self.join_address, wall),
                    _service(trust_pb2, "JoinTokenService"),
                ),
                (
                    trust_pb2_grpc.add_RenewalServiceServicer_to_server,
                    RenewalServicer(
                        self.ca,
                        self.join_tokens,
                        lambda: self.enforcer.revocations,
                        RenewLimits(config.join.renew_burst, config.join.renew_per_hour),
                        config.join.lifetime_seconds,
                        wall,
                    ),
                    _service(trust_pb2, "RenewalService"),
                ),
                (
                    trust_pb2_grpc.add_CertificateServiceServicer_to_server,
                    CertificateServicer(
                        self.revocations, self.join_tokens, lambda: self.enforcer.revocations
                    ),
                    _service(trust_pb2, "CertificateService"),
                ),
                (
                    usage_pb2_grpc.add_UsageServiceServicer_to_server,
                    UsageServicer(lambda: self.controller.accepting, self.leadership, self.scaler, clock),
                    _service(usage_pb2, "UsageService"),
                ),
            ],
            [Authorizer(admin_token, plaintext=config.tls.plaintext, enforcer=self.enforcer)],
            tls=config.tls,
        )
        # The HTTP port calls the same servicers through the same interceptors.
        self.http = (
            HttpServer(
                config.http_listen,
                HttpApp(
                    Dispatcher(self.server.registrations, self.server.interceptors),
                    Sessions(admin_token, wall),
                    self.metrics.registry,
                    [self.endpoints, self.catalog_hub, self.keys_hub],
                ),
                config.shutdown_grace_seconds,
            )
            if config.http_listen
            else None
        )
        if config.tls.plaintext:
            log.warning(
                "tls.plaintext is true: DEVELOPMENT ONLY. Nothing on %s is encrypted and no caller's "
                "identity is checked: anyone who reaches it may act as any node or router%s",
                config.listen,
                "" if admin_token else ", and as admin (no admin_token_file either)",
            )
        host, _ = split_host_port(config.listen)
        if host in ("0.0.0.0", "::"):
            host = socket.gethostname()
        # The actual port, so a listen address with port 0 advertises what was bound.
        self.address = config.advertise or f"{host}:{self.server.port}"

    def _join_server(self, config: ControlConfig, wall: Callable[[], float]) -> GrpcServer | None:
        """The join port (api/join.py), when this control plane holds the CA key; else None."""
        self.join_address = ""
        # The CA that signs joins and renewals (api/renewal.py); None: neither.
        self.ca: CertificateAuthority | None = None
        if not config.join.enabled:
            return None
        join = config.join
        ca = self.ca = CertificateAuthority(join.ca_key_file, config.tls.ca_file)
        servicer = JoinServicer(
            ca,
            self.join_tokens,
            lambda: self.enforcer.revocations,
            self.sessions.connected,
            JoinLimits(join.per_peer_burst, join.per_peer_per_minute, join.burst, join.per_second),
            join.lifetime_seconds,
            wall,
        )
        server = GrpcServer(
            join.listen,
            [
                (
                    trust_pb2_grpc.add_JoinServiceServicer_to_server,
                    servicer,
                    _service(trust_pb2, "JoinService"),
                )
            ],
            [JoinGate()],
            credentials=join_port_credentials(config.tls),
            max_message_bytes=JOIN_MAX_MESSAGE_BYTES,
            maximum_concurrent_rpcs=16,
            options=[
                # Callers without a certificate: no lingering handshakes or connections.
                ("grpc.server_handshake_timeout_ms", 10_000),
                ("grpc.max_connection_idle_ms", 30_000),
                ("grpc.max_connection_age_ms", 60_000),
                ("grpc.max_connection_age_grace_ms", 5_000),
            ],
        )
        host, _ = split_host_port(join.listen)
        if host in ("0.0.0.0", "::"):
            host = socket.gethostname()
        self.join_address = join.advertise or f"{host}:{server.port}"
        return server

    def _ca_pin(self) -> str:
        """The pin of the cluster CA (the first of tls.ca_file): what a joining agent checks."""
        if self.config.tls.plaintext:
            return ""
        try:
            with open(self.config.tls.ca_file, "rb") as fh:
                return ca_pin(load_certs(fh.read())[0])
        except (OSError, IndexError, InvalidArgument):
            return ""

    def _owner_budgets(self) -> dict[str, tuple[int, int]]:
        """Owner path -> (requests, tokens) per minute, for the scopes with a request or token quota."""
        return {
            path: (q.requests_per_minute or 0, q.tokens_per_minute or 0)
            for path, q in self.controller.quotas().items()
            if q.requests_per_minute or q.tokens_per_minute
        }

    @property
    def settings_version(self) -> int:
        """The cluster-settings version in force here (0 before etcd was read)."""
        return self.settings.in_force.version

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then shut down gracefully.

        Also returns, with ``restart_requested`` set, when a setting read only
        at start changed: whoever runs this starts the process again.
        """
        if not await self._start_settings(stop):
            return
        await self.server.start()
        if self.join_server is not None:
            await self.join_server.start()
            log.info("join port on %d (advertised as %s)", self.join_server.port, self.join_address)
        if self.http is not None:
            await self.http.start()
            log.info("HTTP API and console on port %d", self.http.port)
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
                    tg.create_task(self.keys_hub.run(), name="watch-keys"),
                    tg.create_task(self.leadership.run(self.address), name="leadership"),
                    tg.create_task(self.controller.run(), name="controller"),
                    tg.create_task(self.models.follow(self.controller.replace_catalog), name="models"),
                    tg.create_task(
                        self.overrides.follow(self.controller.replace_overrides), name="node-overrides"
                    ),
                    tg.create_task(
                        self.domain_holds.follow(self.controller.replace_domain_holds), name="domain-holds"
                    ),
                    tg.create_task(self.settings.follow(self._apply_settings), name="settings"),
                    tg.create_task(self.federation.run(), name="federation"),
                    tg.create_task(self.revocations.follow(self.enforcer.apply), name="revocations"),
                    tg.create_task(self._restart_when_asked(stop), name="restarter"),
                ]
                await stop.wait()
                await self._drain()
                for t in tasks:
                    t.cancel()
        finally:
            if self.http is not None:
                await self.http.stop()
            if self.join_server is not None:
                await self.join_server.stop(0)
            await self.server.stop(0)
            await self.peer_check.close()
        log.info("control plane %s stopped", self.config.control_id)

    async def _start_settings(self, stop: asyncio.Event) -> bool:
        """Put the stored settings in force before serving; False if stopped first."""
        while not stop.is_set():
            try:
                settings = await self.settings.start(self.config, self._source)
                break
            except Unavailable as err:
                log.warning("cannot read the cluster settings from etcd yet (%s); retrying", err)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await stop.wait()
        else:
            return False
        self._started_with = settings
        # Read once per process: set before anything runs.
        self.leadership.configure(settings.lease_ttl_seconds)
        self.endpoints.set_history_limit(settings.watch_history)
        self.catalog_hub.set_history_limit(settings.watch_history)
        self.keys_hub.set_history_limit(settings.watch_history)
        try:
            await self._apply_settings(self.settings.in_force.version, settings)
        except Unavailable as err:
            log.warning("could not load the runtime models yet (%s); the follower will", err)
        return True

    async def _apply_settings(self, version: int, settings: ClusterSettings) -> None:
        """Put a settings version in force: live where possible, else ask for a restart."""
        self.controller.apply_settings(controller_settings(settings))
        self.agents.heartbeat_interval_seconds = heartbeat_seconds(settings)
        self.scaler.configure(scaler_settings(settings), settings.autoscaling.report_expiry_intervals)
        self.models.declare(settings.models, settings.federation.names)
        self.federation.configure(settings.federation)
        self.controller.replace_catalog((await self.models.load()).catalog)
        pending = restart_keys(self._started_with, settings) if self._started_with else []
        if pending and not self.restart_pending:
            log.warning(
                "settings version %d changes %s, read only at start: restarting this control plane",
                version,
                ", ".join(pending),
            )
            self._restart.set()
        self.restart_pending = pending

    async def _restart_when_asked(self, stop: asyncio.Event) -> None:
        await self._restart.wait()
        if self.leadership.is_leader:
            # Standbys restart at once; the leader waits for them to be back,
            # so leadership moves once, to a control plane with the new settings.
            delay = 3.0 * self.leadership.ttl_seconds
            log.info("leader: restarting in %.0fs, after the standbys", delay)
            await asyncio.sleep(delay)
        self.restart_requested = True
        stop.set()

    async def _drain(self) -> None:
        log.info("control plane %s shutting down", self.config.control_id)
        await self.server.health.enter_graceful_shutdown()
        await self.leadership.resign()
        # Let the controller see the end of its term and close agent streams.
        await asyncio.sleep(0)
        await self.endpoints.close()
        await self.catalog_hub.close()
        await self.keys_hub.close()
        await self.server.stop(self.config.shutdown_grace_seconds)
