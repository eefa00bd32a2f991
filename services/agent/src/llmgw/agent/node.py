"""One node's agent, assembled from its parts, and the order it shuts down in.

:func:`run_agent` builds the inventory, launchers, supervisor and control
link from a validated :class:`AgentConfig` and runs until ``stop`` is set.
Shutdown order, deliberately: with ``stop_engines_on_exit``, engines are
stopped first, while the stream is still up, so the control plane hears
STOPPING and STOPPED at once instead of waiting for a heartbeat to lapse;
then the stream is half-closed after what is queued, and the control plane
ends it (or, after :data:`CLOSE_TIMEOUT_SECONDS`, the agent cancels it). Without it,
the stream closes and the engines keep serving (their own sessions and
process groups outlive the agent), and the next agent on the same state
directory adopts them (see :meth:`.Supervisor.adopt`), as after a kill -9.
A hand-over to another agent version (:mod:`.upgrade`) takes that second
path whatever ``stop_engines_on_exit`` says, and returns what the entry
point is to run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry

from llmgw.common.metricsport import serving

from .config import AgentConfig, WeightsSettings
from .connection import ControlLink, Outbox
from .engines import EngineLauncher, describe_builds, launchers_from_config
from .fabric import FabricTests, nccl_status
from .gpus import Driver, GpuSource, NvmlGpus, cpu_cores, discover_gpus, host_memory_bytes, node_driver
from .lifecycle import EngineHost
from .messages import NodeInfo
from .metrics import AgentCollector
from .requests import NodeRequests
from .supervisor import Supervisor
from .upgrade import Handover, Upgrader
from .weights import Hub, HuggingFaceHub, WeightsCache

log = logging.getLogger("llmgw.agent")

CLOSE_TIMEOUT_SECONDS = 2.0


def _hub(settings: WeightsSettings) -> HuggingFaceHub:
    token = Path(settings.hub_token_file).read_text().strip() if settings.hub_token_file else None
    return HuggingFaceHub(settings.hub_endpoint, token, settings.hub_timeout_seconds)


async def run_agent(
    config: AgentConfig,
    *,
    version: str,
    base_env: Mapping[str, str],
    stop: asyncio.Event,
    launchers: Mapping[str, EngineLauncher] | None = None,
    gpus: GpuSource | None = None,
    hub: Hub | None = None,
) -> Handover | None:
    """Serve as ``config.node_id``'s agent until ``stop`` is set or it hands over.

    ``base_env`` is the environment engines inherit (the entry point passes
    its own). ``launchers``, ``gpus`` and ``hub`` default to what the config declares.
    Returns the hand-over to another agent version the control plane asked
    for (:mod:`.upgrade`; the entry point carries it out), else None.
    """
    if launchers is None:
        launchers = launchers_from_config(config.engines, version)
    if gpus is None:
        gpus = discover_gpus(config.node_id, config.gpus)
    node = NodeInfo(
        node_id=config.node_id,
        address=config.advertise_host,
        version=version,
        memory_bytes=host_memory_bytes(),
        cpu_cores=cpu_cores(),
        labels=dict(config.labels),
        builds=tuple(describe_builds(config.engines, launchers)),
        driver=node_driver(gpus, Driver(config.driver.version, config.driver.cuda)),
    )
    outbox = Outbox()
    settings = config.weights
    if hub is None:
        hub = _hub(settings)
    weights = WeightsCache(
        Path(settings.dir or Path(config.state_dir) / "weights"),
        hub,
        outbox,
        settings.hub_endpoint or "the Hugging Face hub",
    )
    host = EngineHost(
        launchers=launchers,
        bind_host=config.bind_host,
        advertise_host=config.advertise_host,
        gpu_count=len(gpus.gpus()),
        probe_interval=config.probe_interval_seconds,
        stop_grace=config.stop_grace_seconds,
        hang_grace=config.hang_grace_seconds,
        base_env=base_env,
        weights=weights,
    )
    upgrader = Upgrader(config.upgrade, on_handover=stop.set)
    fabric = FabricTests(config.bind_host)
    nccl = nccl_status(len(gpus.gpus()) if isinstance(gpus, NvmlGpus) else 0)
    async with (
        contextlib.aclosing(weights),
        contextlib.aclosing(fabric),
        Supervisor(host=host, state_dir=Path(config.state_dir), listener=outbox) as supervisor,
        contextlib.AsyncExitStack() as stack,
    ):
        registry = CollectorRegistry()
        source = "nvml" if isinstance(gpus, NvmlGpus) else "declared"
        registry.register(AgentCollector(config.node_id, supervisor, gpus, source))
        await stack.enter_async_context(serving(config.metrics_listen, registry))
        # Before the first Register, so it reports adopted engines as the same replicas.
        adopted = await supervisor.adopt()
        if adopted:
            log.info("adopted %d running engine(s): %s", len(adopted), ", ".join(adopted))
        link = ControlLink(
            addresses=config.control,
            node=node,
            gpus=gpus,
            replicas=supervisor,
            outbox=outbox,
            heartbeat_interval=config.heartbeat_interval_seconds,
            requests=NodeRequests(supervisor, weights, upgrader, fabric, nccl),
            tls=config.tls,
        )
        log.info(
            "agent %s starting: control %s, engines %s, %d GPU(s)",
            config.node_id,
            ",".join(config.control),
            ",".join(sorted(launchers)) or "none",
            len(gpus.gpus()),
        )
        async with asyncio.TaskGroup() as tg:
            link_task = tg.create_task(link.run(), name="control-link")
            await stop.wait()
            if upgrader.handover is not None:
                log.info("agent %s handing over; its engines keep serving", config.node_id)
            else:
                log.info("agent %s shutting down", config.node_id)
            if config.stop_engines_on_exit and upgrader.handover is None:
                await supervisor.stop_all()
            link.close()
            done, _ = await asyncio.wait({link_task}, timeout=CLOSE_TIMEOUT_SECONDS)
            if not done:
                log.warning("control plane did not end the stream within %gs", CLOSE_TIMEOUT_SECONDS)
                link_task.cancel()
    return upgrader.handover
