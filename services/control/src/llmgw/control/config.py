"""The control plane's configuration file (YAML), validated at start.

Example::

    cluster: dev
    control_id: control-1          # default: <hostname>-<pid>
    listen: 127.0.0.1:50051
    http_listen: 127.0.0.1:8081    # REST API, console, metrics; default: off
    advertise: 127.0.0.1:50051     # what agents and routers dial; default: listen
    cluster_secret_file: /etc/llmgw/secret
    etcd:
      # Every member of the etcd cluster: calls fail over between them.
      endpoints: ["10.0.0.11:2379", "10.0.0.12:2379", "10.0.0.13:2379"]
      prefix: /llmgw
      tls:                         # optional; see docs/security.md#etcd
        ca_file: /etc/llmgw/etcd/ca.crt
        cert_file: /etc/llmgw/etcd/control.crt
        key_file: /etc/llmgw/etcd/control.key
    tls: {ca_file: /etc/llmgw/tls/ca.crt, cert_file: /etc/llmgw/tls/control-1.crt,
          key_file: /etc/llmgw/tls/control-1.key}
    lease_ttl_seconds: 5
    models:
      - name: demo
        aliases: [demo-chat]
        min_replicas: 1
        profile: {engine: simulator, gpus: 1, args: {ttft-ms: "20"}}
"""

from __future__ import annotations

import os
import socket
from typing import Literal

from pydantic import Field, field_validator, model_validator

from llmgw.common.config import Document, EtcdSettings
from llmgw.common.errors import InvalidArgument
from llmgw.common.tls import TlsSettings, require

from .spec.catalog import Catalog
from .spec.evalsuite import EvalSuite
from .spec.facility import parse_domain
from .spec.federation import Federation
from .spec.model import ModelSpec
from .spec.tenancy import Quota, check_path


class Autoscaling(Document):
    # A router whose reports stop for this many of its own report intervals
    # (at least 3 s) drops out of every load sum.
    report_expiry_intervals: float = Field(default=3.0, ge=1)
    # A replica being scaled down is unpublished first; it is stopped once every
    # router has reported, at least this long after, no request in flight on it.
    drain_settle_seconds: float = Field(default=1.0, ge=0)
    # A draining replica is stopped after this long even if routers still report
    # requests on it (those streams then resume on another replica).
    drain_timeout_seconds: float = Field(default=60.0, gt=0)


class ClusterSettings(Document):
    """The cluster's own keys: the same on every control plane, versioned in etcd (store.settings).

    A control plane's file may hold them too (:class:`ControlConfig` is these
    plus one machine's keys); the first control plane to start against an
    empty store imports them, and from then on etcd is their source.
    """

    # The leader lease's time to live: a killed leader is replaced within it.
    # Shorter fails over sooner, at more etcd traffic (one refresh per third).
    lease_ttl_seconds: int = Field(default=5, ge=2, le=60)
    # An agent silent this long (no heartbeat, no status) is unreachable. A stream
    # that ends (the agent died, its TCP connection closed) makes the node
    # unreachable at once; the timeout catches a hung agent or a silent network.
    # An unreachable node's endpoints stay published this long again (an agent
    # restart keeps its engines), then leave the routers' tables.
    node_timeout_seconds: float = Field(default=3.0, gt=0)
    # The reconcile pass runs at least this often (and at once on any event:
    # a status, a node change, a catalog change).
    reconcile_interval_seconds: float = Field(default=1.0, gt=0)
    # What Registered tells agents; capped at a third of node_timeout_seconds
    # so a node is never declared unreachable between two healthy heartbeats.
    heartbeat_interval_seconds: float = Field(default=1.0, gt=0)
    # An unreachable node's replicas still count (no double placement during a
    # blip such as an agent restart) until it has been unreachable this long;
    # then the node is lost and its replicas are rebuilt elsewhere.
    node_lost_seconds: float = Field(default=10.0, gt=0)
    # Delay before replacing a failed replica: doubles per consecutive failure
    # of the same model, up to the maximum; reset once the model is fully ready.
    failure_backoff_seconds: float = Field(default=5.0, ge=0)
    # The longest that delay grows to.
    failure_backoff_max_seconds: float = Field(default=300.0, ge=0)
    # New replicas are placed only this long after a term begins, so the agents
    # that reconnect to a new leader (or start with a fresh cluster) are all
    # registered first and replicas spread across them, not onto the first one.
    placement_settle_seconds: float = Field(default=2.0, ge=0)
    # Where a new replica goes among the nodes it fits, once replicas of the same
    # model are spread across nodes: pack (the node left with the fewest free GPUs,
    # keeping whole machines free for large models) or spread (the one left with
    # the most, spreading load over machines).
    placement_policy: Literal["pack", "spread"] = "pack"
    # A start or stop command not acknowledged by a status is re-sent after this.
    command_resend_seconds: float = Field(default=10.0, gt=0)
    # Watch history kept per stream (changes, not revisions) for resuming clients.
    watch_history: int = Field(default=1000, ge=1)
    # Scaling between scaling.min and scaling.max on the routers' load reports
    # (per-model keys are under each model's scaling).
    autoscaling: Autoscaling = Field(default_factory=Autoscaling)
    # The declared models. Like every cluster setting (docs/settings.md) this is
    # read from the file only at the first start against an empty etcd, which
    # imports it; after that the settings in etcd are the source.
    models: list[ModelSpec] = Field(default_factory=list)
    # Quotas per owner path (org, org/team or org/team/project; spec.tenancy):
    # placement refuses a replica that would exceed its owner's or any ancestor's.
    quotas: dict[str, Quota] = Field(default_factory=dict, max_length=10000)
    # Power budgets in watts per facility domain (label=value, such as
    # power-feed=a; spec.facility): placement keeps the power_watts of the GPUs
    # in use in each domain within its budget.
    power_budgets: dict[str, float] = Field(default_factory=dict, max_length=10000)
    # Peer clusters whose models this cluster offers as PEER/MODEL while they answer
    # their health checks (spec.federation, docs/federation.md). Live: no restart.
    federation: Federation = Field(default_factory=Federation)
    # Evaluation suites by name (spec.evalsuite): a model's eval_gate names one, and
    # its versions are published only once a replica scores at least min_score.
    eval_suites: dict[str, EvalSuite] = Field(default_factory=dict, max_length=1000)

    @field_validator("quotas")
    @classmethod
    def _quota_keys(cls, v: dict[str, Quota]) -> dict[str, Quota]:
        for path in v:
            check_path(path)
        return v

    @field_validator("power_budgets")
    @classmethod
    def _budget_domains(cls, v: dict[str, float]) -> dict[str, float]:
        for domain, watts in v.items():
            parse_domain(domain)
            if watts < 0:
                raise ValueError(f"power budget of {domain}: {watts} W is negative")
        return v

    @model_validator(mode="after")
    def _catalog_builds(self) -> ClusterSettings:
        # The declared models must form a valid catalog on their own.
        try:
            Catalog.from_specs(self.models, peers=self.federation.names)
        except InvalidArgument as err:
            raise ValueError(str(err)) from None
        return self


class JoinSettings(Document):
    """Agents joining with a token (docs/security.md): off unless ca_key_file is set."""

    # The cluster CA's private key (PEM, readable by this user only). Set, it
    # turns joins on: this control plane signs node certificates for agents
    # that present a join token. The CA certificate is the one in tls.ca_file
    # this key belongs to. Empty (the default): no join port; keep the CA key
    # off the machines and issue certificates with `llmgw certs issue`.
    ca_key_file: str = ""
    # host:port of the join port: server-only TLS, JoinService only (a joining
    # agent has no certificate yet). Required with ca_key_file.
    listen: str = ""
    # host:port agents are told to dial for joins (`join-token create` prints
    # it); empty: listen, with the bound port.
    advertise: str = ""
    # Days a node certificate signed for a join or a renewal is valid.
    cert_days: int = Field(default=365, ge=1, le=3650)
    # Seconds a node certificate signed for a join or a renewal is valid;
    # 0 (the default): cert_days. For short-lived node certificates that
    # agents renew (docs/security.md, rotation): at least 30.
    cert_seconds: int = Field(default=0, ge=0, le=3650 * 86400)
    # Renewals one node may ask for at once (a burst): agents renew once per
    # certificate, so more means a node misbehaving.
    renew_burst: int = Field(default=5, ge=1, le=1000)
    # Renewals per hour one node regains after its burst.
    renew_per_hour: float = Field(default=60.0, gt=0, le=36000)
    # Join attempts allowed from one peer address at once (a burst); refused
    # attempts count too, so guessing tokens is slow.
    per_peer_burst: int = Field(default=10, ge=1, le=10000)
    # Join attempts per minute one peer address regains after its burst.
    per_peer_per_minute: float = Field(default=10.0, gt=0, le=60000)
    # Join attempts allowed on this control plane at once, from everyone.
    burst: int = Field(default=50, ge=1, le=100000)
    # Join attempts per second this control plane regains after its burst.
    per_second: float = Field(default=5.0, gt=0, le=10000)

    @model_validator(mode="after")
    def _listen_given(self) -> JoinSettings:
        if self.ca_key_file and not self.listen:
            raise ValueError(
                "join.ca_key_file is set but join.listen is not: say where the join port listens"
            )
        if 0 < self.cert_seconds < 30:
            raise ValueError(
                f"join.cert_seconds is {self.cert_seconds}: at least 30 (or 0 for cert_days), so agents "
                "have time to renew"
            )
        if self.listen and not self.ca_key_file:
            raise ValueError(
                "join.listen is set but join.ca_key_file is not: joins need the CA's key to sign"
            )
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.ca_key_file)

    @property
    def lifetime_seconds(self) -> int:
        return self.cert_seconds or self.cert_days * 86400


class ControlConfig(ClusterSettings):
    """One control plane's file: the cluster settings plus what is this machine's own."""

    # The cluster's name, the same for all its control planes: its state lives
    # under <etcd.prefix>/<cluster>/ in etcd, so clusters can share one etcd.
    cluster: str = Field(default="default", pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    # This control plane's name, unique in the cluster (leader records, logs).
    control_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    # host:port the gRPC server binds (agents, routers, admin clients).
    listen: str = "127.0.0.1:50051"
    # host:port agents and routers are told to dial to reach this control plane
    # (redirects to the leader); empty: the bound address.
    advertise: str = ""
    # File holding the cluster secret that engine keys derive from (HMAC of the
    # secret and the replica id); the same file for control planes and routers.
    cluster_secret_file: str
    # The etcd cluster and the key prefix this cluster's state lives under.
    etcd: EtcdSettings = Field(default_factory=EtcdSettings)
    # Mutual TLS of the gRPC port (common/tls.py): the CA, this control plane's
    # certificate (`llmgw certs issue control ID`) and key, re-read when they
    # change. Required, unless `plaintext: true` (development only: no
    # identities, a warning at every start).
    tls: TlsSettings = Field(default_factory=TlsSettings)
    # Joining with a token, for clusters without their own PKI: off unless
    # ca_key_file is given (JoinSettings).
    join: JoinSettings = Field(default_factory=JoinSettings)
    # File holding the admin token: a caller that sends `authorization: Bearer
    # TOKEN` is admin, as one with an admin certificate is (api/auth.py says
    # who may call what). Empty: only admin certificates are admin (in
    # plaintext mode: everyone, with a warning at every start).
    admin_token_file: str = ""
    # Seconds in-flight calls get on shutdown before they are cancelled.
    shutdown_grace_seconds: float = Field(default=5.0, ge=0)
    # The load check (llmgw.control.spec.loadcheck) refuses a weights or adapter path
    # that does not exist on this host; false where this host does not see the nodes'
    # model storage (the check then notes such paths as not checked).
    load_check_paths: bool = True
    # host:port for Prometheus /metrics; empty: not served.
    metrics_listen: str = ""
    # host:port of the HTTP port (leader and standby alike): the admin REST API
    # (/api/v1, /openapi.json), the web console (/) and /metrics, all behind the
    # admin token (docs/console.md). Empty: not served. `llmgw up` serves it on
    # 127.0.0.1:8081, compose.yaml on port 8081.
    http_listen: str = ""
    # debug, info, warning or error.
    log_level: str = "info"

    @model_validator(mode="after")
    def _tls_chosen(self) -> ControlConfig:
        require(self.tls)
        if self.join.enabled and self.tls.plaintext:
            raise ValueError("join needs TLS: a joining agent pins the CA of tls.ca_file (not plaintext)")
        return self

    @property
    def advertise_address(self) -> str:
        return self.advertise or self.listen

    @property
    def etcd_root(self) -> str:
        return f"{self.etcd.prefix.rstrip('/')}/{self.cluster}/"
