"""The agent's configuration file (YAML), validated at start.

GPUs come from NVML when a driver is present; otherwise from ``gpus`` here
(a simulated or CPU fleet). Example::

    # Unique node name; default the host name.
    node_id: node-a
    # Control-plane addresses (host:port); a standby redirects to the leader.
    control: ["127.0.0.1:50051"]
    # Mutual TLS to the control planes: a node certificate naming this node_id and
    # advertise_host (`llmgw certs issue node node-a --host 10.0.0.5`).
    tls: {ca_file: /etc/llmgw/tls/ca.crt, cert_file: /etc/llmgw/tls/node-node-a.crt,
          key_file: /etc/llmgw/tls/node-node-a.key}
    # Host or IP routers use to reach this node's engines.
    advertise_host: 127.0.0.1      # where routers reach this node's engines
    # Engine logs and pid files, per replica.
    state_dir: /var/lib/llmgw-agent
    # Node labels, matched by profiles' node selectors.
    labels: {zone: lab}
    # Declared GPUs, for simulated or CPU fleets.
    gpus:
      - {count: 2, name: "Simulated H100", memory_gb: 80}
    # Engine kinds this node runs, by kind, with their defaults.
    engines:
      simulator: {args: {ttft-ms: "30", itl-ms: "5"}}
      vllm: {python: /opt/vllm/bin/python, start_timeout_seconds: 600}
      llamacpp: {binary: /opt/llama.cpp/bin/llama-server}

An engine whose install (``python`` or ``binary``) is missing is left out
of what the node reports, with a warning: the control plane then places
nothing of that kind here. See docs/agent.md.
"""

from __future__ import annotations

import socket

from pydantic import Field, model_validator

from llmgw.common.config import Document
from llmgw.common.errors import InvalidArgument
from llmgw.common.joining import check_pin
from llmgw.common.tls import TlsSettings, require


class GpuGroup(Document):
    # GPUs in this group.
    count: int = Field(default=1, ge=1, le=64)
    # Model name reported for each GPU.
    name: str = "Simulated GPU"
    # Memory per GPU, in GB.
    memory_gb: float = Field(default=80.0, gt=0)
    # Power each GPU draws at most, in watts: what the control plane's power
    # budgets per domain count (0: not counted). NVML's power limit replaces it.
    power_watts: float = Field(default=0.0, ge=0, le=10000)


class EngineSettings(Document):
    # Default engine flags (without --), overridden by the catalog profile's.
    args: dict[str, str] = Field(default_factory=dict)
    # Seconds from process start until /health must answer.
    start_timeout_seconds: float = Field(default=120.0, gt=0)
    # The program the launcher runs, as argv, when not its built-in one (the
    # simulator's is [<this python>, -m, llmgw.agent.simulator]): a pinned
    # build, a wrapper script, or a test engine. The launcher still appends
    # the flags it owns (host, port, served name, key) and the engine args.
    command: list[str] = Field(default_factory=list)
    # Version reported in Register.engines; empty means the launcher's own
    # answer (the simulator ships with the agent, so the agent's version; a
    # python engine's is asked of its python once at start).
    version: str = ""
    # vllm, sglang: the python of the environment the engine is installed in.
    python: str = ""
    # llamacpp: path to llama.cpp's llama-server.
    binary: str = ""


class WeightsSettings(Document):
    # The weights cache; empty means <state_dir>/weights. Hub sources
    # (hf://ORG/NAME[@REVISION]) are fetched under it; local paths are used in place.
    dir: str = ""
    # The Hugging Face hub (or a mirror) to fetch from; empty means
    # huggingface_hub's default (https://huggingface.co, or $HF_ENDPOINT).
    hub_endpoint: str = ""
    # A file holding the hub token, for gated or private repositories.
    hub_token_file: str = ""
    # Seconds a hub request may take before the fetch fails.
    hub_timeout_seconds: float = Field(default=10.0, gt=0)


class JoinSettings(Document):
    """Joining with a token when this node has no certificate yet (docs/security.md)."""

    # The control plane's join port (host:port), as `llmgw nodes join-token
    # create` prints it. Set, the agent joins at start when tls.cert_file does
    # not exist yet, and writes the key, certificate and CA to the tls paths.
    address: str = ""
    # File holding the join token (readable by this user only); or the
    # environment variable LLMGW_JOIN_TOKEN. Never on the command line.
    token_file: str = ""
    # The cluster CA's hash, sha256:<64 hex digits> (printed with the token):
    # the agent sends its token only to a server whose certificate chains to it.
    ca_cert_hash: str = ""
    # Seconds to keep trying while the join port is unreachable or busy.
    timeout_seconds: float = Field(default=300.0, gt=0)

    @model_validator(mode="after")
    def _complete(self) -> JoinSettings:
        if self.address and not self.ca_cert_hash:
            raise ValueError(
                "join.address is set but join.ca_cert_hash is not: without the CA's hash the agent "
                "cannot tell the cluster from an impostor (`llmgw nodes join-token create` prints it)"
            )
        if self.ca_cert_hash:
            try:
                check_pin(self.ca_cert_hash)
            except InvalidArgument as err:
                raise ValueError(str(err)) from None
        return self


class AgentConfig(Document):
    # This node's name in the cluster (default: the host name); unique per node.
    node_id: str = Field(default_factory=socket.gethostname, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    # Control-plane addresses (host:port); the agent tries them in turn and
    # follows a standby's pointer to the leader.
    control: list[str] = Field(min_length=1)
    # Mutual TLS to the control planes (common/tls.py): the CA, this node's
    # certificate and key, read again at each reconnect. The certificate names
    # this node_id (llmgw://node/<node_id>) and, as IP or DNS names, every host
    # its engine URLs use (advertise_host): the control plane refuses others.
    # Required, unless `plaintext: true` (development only).
    tls: TlsSettings = Field(default_factory=TlsSettings)
    # Joining with a token, for a node that has no certificate yet: the tls
    # paths above are where the join writes the key, certificate and CA.
    join: JoinSettings = Field(default_factory=JoinSettings)
    # The host routers use to reach this node's engines (in published URLs).
    advertise_host: str = "127.0.0.1"
    # Engines listen on this address.
    bind_host: str = "127.0.0.1"
    # Where replica directories (logs, state files) live; engines are adopted
    # from it after an agent restart, so keep it across restarts.
    state_dir: str = "/var/lib/llmgw-agent"
    # Labels reported with the node, matched by profiles' node selectors.
    labels: dict[str, str] = Field(default_factory=dict)
    # Declared GPUs, used when NVML finds no driver (simulated and CPU fleets).
    gpus: list[GpuGroup] = Field(default_factory=list)
    # The engines this node can run and how each is installed (its Python or
    # binary); the node reports them with their versions.
    engines: dict[str, EngineSettings] = Field(default_factory=lambda: {"simulator": EngineSettings()})
    # Seconds between heartbeats, unless the control plane asks for another interval.
    heartbeat_interval_seconds: float = Field(default=2.0, gt=0)
    # Health-probe period while an engine starts and while it serves.
    probe_interval_seconds: float = Field(default=0.5, gt=0)
    # A serving engine whose /health goes unanswered is withdrawn at once and,
    # after this many seconds still silent, killed and replaced.
    hang_grace_seconds: float = Field(default=30.0, gt=0)
    # Seconds between SIGTERM and SIGKILL when stopping an engine.
    stop_grace_seconds: float = Field(default=10.0, ge=0)
    # On a graceful agent shutdown, stop the engines it runs too.
    stop_engines_on_exit: bool = True
    # The node's weights cache (see docs/agent.md, Weights).
    weights: WeightsSettings = Field(default_factory=WeightsSettings)
    # debug, info, warning or error.
    log_level: str = "info"

    @model_validator(mode="after")
    def _tls_chosen(self) -> AgentConfig:
        require(self.tls)
        if self.join.address and self.tls.plaintext:
            raise ValueError("join needs TLS: set the tls file paths the join writes to, not plaintext")
        return self
