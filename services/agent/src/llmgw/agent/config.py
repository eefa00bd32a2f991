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
from typing import Literal

from pydantic import Field, field_validator, model_validator

from llmgw.common.config import Document, split_host_port
from llmgw.common.errors import InvalidArgument
from llmgw.common.joining import check_pin
from llmgw.common.tls import TlsSettings, require

_CUDA = r"^([0-9]{1,2}\.[0-9]{1,2})?$"


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
    # CUDA compute capability of each GPU ("9.0"); NVML's replaces it. Reported only.
    compute_capability: str = Field(default="", pattern=_CUDA)


_BUILD_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"


class EngineBuild(Document):
    # The build's name on this node (a control plane names it in StartReplica): unique per kind.
    name: str = Field(pattern=_BUILD_NAME)
    # As in engines.<kind>: the program the build runs, as argv (or python/binary below).
    command: list[str] = Field(default_factory=list)
    # The build's version, matched against a profile's engine_version range.
    version: str = ""
    # vllm, sglang: the python of the environment this build is installed in.
    python: str = ""
    # llamacpp: path to this build's llama-server.
    binary: str = ""
    # The CUDA version this build was made for ("12.4"); empty: a CPU build or unknown.
    cuda: str = Field(default="", pattern=_CUDA)


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
    # The CUDA version this build was made for ("12.4"); empty: a CPU build or
    # unknown. Placement keeps a build off a node whose driver supports an older CUDA.
    cuda: str = Field(default="", pattern=_CUDA)
    # More builds of the same kind on this node (another version, another CUDA),
    # each with its own program; args and start timeout are the kind's. A
    # profile's engine_version picks among them (docs/agent.md, Engine builds).
    builds: list[EngineBuild] = Field(default_factory=list, max_length=16)

    @model_validator(mode="after")
    def _unique_builds(self) -> EngineSettings:
        names = [b.name for b in self.builds]
        if len(set(names)) != len(names):
            raise ValueError(f"engine builds {names} repeat a name")
        return self

    def build(self, name: str) -> EngineSettings:
        """The settings of build ``name`` ("": this kind's main build), args and timeout inherited."""
        if not name:
            return self
        b = next(x for x in self.builds if x.name == name)
        return EngineSettings(
            args=self.args,
            start_timeout_seconds=self.start_timeout_seconds,
            command=b.command,
            version=b.version,
            python=b.python,
            binary=b.binary,
            cuda=b.cuda,
        )


class DriverSettings(Document):
    # The NVIDIA driver's version ("550.54.15"); NVML's replaces it.
    version: str = Field(default="", max_length=64)
    # The newest CUDA version the driver supports ("12.4"); NVML's replaces it.
    cuda: str = Field(default="", pattern=_CUDA)


class UpgradeSettings(Document):
    # Directories a new agent's program must be under for `llmgw nodes upgrade`
    # to hand over to it (a release directory, a venvs directory). Empty: this
    # node refuses upgrades from the control plane.
    allowed_dirs: list[str] = Field(default_factory=list, max_length=16)
    # How the agent hands over: `exec` replaces its own process with the new
    # program (same pid, its own arguments appended); `exit` exits with code 75
    # for its service manager to start the new version (systemd:
    # RestartForceExitStatus=75, the unit pointing at the release the operator staged).
    handover: Literal["exec", "exit"] = "exec"
    # Seconds `COMMAND --version` may take when the agent checks a new version.
    check_timeout_seconds: float = Field(default=20.0, gt=0, le=300)

    @field_validator("allowed_dirs")
    @classmethod
    def _absolute(cls, v: list[str]) -> list[str]:
        for d in v:
            if not d.startswith("/"):
                raise ValueError(f"upgrade.allowed_dirs: {d!r} is not an absolute path")
        return v


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


class RenewalSettings(Document):
    """Renewing this node's certificate before it expires (agent/renewal.py, docs/security.md)."""

    # Ask the control plane for a new certificate (a new key, the same
    # identity) when a share of the current one's lifetime has passed. The
    # control plane signs only with its CA key (join.ca_key_file); a cluster
    # whose PKI renews node certificates itself (cert-manager, Vault) turns
    # this off.
    enabled: bool = True
    # The share of the lifetime (not before to not after) after which to renew.
    after: float = Field(default=0.67, ge=0.1, le=0.9)
    # A random share of the lifetime added to `after`, so nodes that joined
    # together do not renew together.
    jitter: float = Field(default=0.1, ge=0, le=0.2)
    # Seconds one renewal call may take.
    timeout_seconds: float = Field(default=10.0, gt=0, le=300)


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
    # Renewing the node certificate in the tls paths before it expires, with
    # no restart (the files are read again at each reconnect).
    renewal: RenewalSettings = Field(default_factory=RenewalSettings)
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
    # The NVIDIA driver, declared where NVML does not answer (reported; placement
    # compares a build's CUDA version with the driver's).
    driver: DriverSettings = Field(default_factory=DriverSettings)
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
    # Hand-over to a new agent version (`llmgw nodes upgrade`, docs/operations.md).
    upgrade: UpgradeSettings = Field(default_factory=UpgradeSettings)
    # debug, info, warning or error.
    log_level: str = "info"
    # host:port for Prometheus /metrics (engines' CPU and memory, GPUs); empty:
    # not served. Off by default: a new port on every node is the operator's choice.
    metrics_listen: str = ""

    @model_validator(mode="after")
    def _tls_chosen(self) -> AgentConfig:
        require(self.tls)
        if self.join.address and self.tls.plaintext:
            raise ValueError("join needs TLS: set the tls file paths the join writes to, not plaintext")
        return self

    @model_validator(mode="after")
    def _metrics_address(self) -> AgentConfig:
        if self.metrics_listen:
            host, port = split_host_port(self.metrics_listen)
            if not 0 <= port < 65536:
                raise ValueError(f"metrics_listen {self.metrics_listen!r}: port {port} is not a TCP port")
        return self
