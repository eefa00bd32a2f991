"""The control plane's configuration file (YAML), validated at start.

Example::

    cluster: dev
    control_id: control-1          # default: <hostname>-<pid>
    listen: 127.0.0.1:50051
    advertise: 127.0.0.1:50051     # what agents and routers dial; default: listen
    cluster_secret_file: /etc/llmgw/secret
    etcd: {endpoints: ["127.0.0.1:2379"], prefix: /llmgw}
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

from pydantic import Field, field_validator, model_validator

from llmgw.common.config import Document, EtcdSettings

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$"


class Profile(Document):
    engine: str = Field(description="engine kind an agent must offer: simulator, vllm, ...")
    gpus: int = Field(default=1, ge=0, le=64, description="GPUs per replica")
    args: dict[str, str] = Field(
        default_factory=dict, description="engine flags without the leading --, name -> value"
    )


class ModelSpec(Document):
    name: str = Field(pattern=NAME_PATTERN)
    aliases: list[str] = Field(default_factory=list)
    min_replicas: int = Field(default=1, ge=0, le=1024)
    profile: Profile
    owned_by: str = "llmgw"

    @field_validator("aliases")
    @classmethod
    def _aliases_are_names(cls, v: list[str]) -> list[str]:
        import re

        for a in v:
            if not re.match(NAME_PATTERN, a):
                raise ValueError(f"alias {a!r} is not a valid model name")
        return v


class ControlConfig(Document):
    cluster: str = Field(default="default", pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    control_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    listen: str = "127.0.0.1:50051"
    advertise: str = ""
    cluster_secret_file: str
    etcd: EtcdSettings = Field(default_factory=EtcdSettings)
    lease_ttl_seconds: int = Field(default=5, ge=2, le=60)
    # An agent silent this long is unreachable; its replicas stop being published.
    node_timeout_seconds: float = Field(default=10.0, gt=0)
    reconcile_interval_seconds: float = Field(default=1.0, gt=0)
    # What Registered tells agents; capped at a third of node_timeout_seconds
    # so a node is never declared unreachable between two healthy heartbeats.
    heartbeat_interval_seconds: float = Field(default=2.0, gt=0)
    # An unreachable node's replicas still count (no double placement during a
    # blip) until it has been unreachable this long; then they are rebuilt elsewhere.
    node_lost_seconds: float = Field(default=30.0, gt=0)
    # Delay before replacing a failed replica: doubles per consecutive failure
    # of the same model, up to the maximum; reset once the model is fully ready.
    failure_backoff_seconds: float = Field(default=5.0, ge=0)
    # The longest that delay grows to.
    failure_backoff_max_seconds: float = Field(default=300.0, ge=0)
    # New replicas are placed only this long after a term begins, so the agents
    # that reconnect to a new leader (or start with a fresh cluster) are all
    # registered first and replicas spread across them, not onto the first one.
    placement_settle_seconds: float = Field(default=2.0, ge=0)
    # A start or stop command not acknowledged by a status is re-sent after this.
    command_resend_seconds: float = Field(default=10.0, gt=0)
    # Watch history kept per stream (changes, not revisions) for resuming clients.
    watch_history: int = Field(default=1000, ge=1)
    # Seconds in-flight calls get on shutdown before they are cancelled.
    shutdown_grace_seconds: float = Field(default=5.0, ge=0)
    # host:port for Prometheus /metrics; empty: not served.
    metrics_listen: str = ""
    models: list[ModelSpec] = Field(default_factory=list)
    log_level: str = "info"

    @model_validator(mode="after")
    def _unique_names(self) -> ControlConfig:
        seen: dict[str, str] = {}
        for m in self.models:
            for n in [m.name, *m.aliases]:
                if n in seen:
                    raise ValueError(
                        f"model name or alias {n!r} is used by both {seen[n]!r} and {m.name!r}; "
                        "names and aliases must be unique across models"
                    )
                seen[n] = m.name
        return self

    @property
    def advertise_address(self) -> str:
        return self.advertise or self.listen

    @property
    def etcd_root(self) -> str:
        return f"{self.etcd.prefix.rstrip('/')}/{self.cluster}/"
