"""``llmgw-agent``: the entry point. It only wires: flags, config, logging, signals.

    llmgw-agent --config agent.yaml [--node-id ID] [--control HOST:PORT ...] [--state-dir DIR]
                [--advertise-host HOST]
    llmgw-agent --version

Flags override the file. A node with ``join.address`` and no certificate
file yet joins first (:mod:`.enroll`), with the token from
``$LLMGW_JOIN_TOKEN`` or ``join.token_file``; refused, it exits 1.
SIGTERM or SIGINT shuts down gracefully (see :mod:`.node` for the order)
and exits 0; an invalid configuration exits 2 with a message naming what
to fix. A hand-over to another agent version (:mod:`.upgrade`) is carried
out here, once everything has stopped: exec of the new program with this
process's own arguments, or exit :data:`~.upgrade.HANDOVER_EXIT_CODE` for
the service manager.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Mapping
from importlib import metadata

from llmgw.common.config import load_config, parse_config
from llmgw.common.errors import InvalidArgument
from llmgw.common.joining import JoinRefused
from llmgw.common.stopping import stop_on_signals
from llmgw.common.tasks import cancel_and_wait
from llmgw.common.telemetry import setup_logging, setup_tracing

from .config import AgentConfig
from .engines import EngineLauncher, launchers_from_config
from .enroll import enroll, needs_join
from .node import CLOSE_TIMEOUT_SECONDS, run_agent
from .renewal import renew_forever, wanted
from .upgrade import HANDOVER_EXIT_CODE, Handover

log = logging.getLogger("llmgw.agent")


def _parser(version: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmgw-agent", description="llmgw node agent")
    # What a node checks before it hands over to a staged release (upgrade.py).
    p.add_argument("--version", action="version", version=f"llmgw-agent {version}")
    p.add_argument("--config", required=True, help="agent configuration file (YAML)")
    p.add_argument("--node-id", help="this node's id (overrides node_id)")
    p.add_argument(
        "--control",
        action="append",
        metavar="HOST:PORT",
        help="control plane address; repeat for several (overrides control)",
    )
    p.add_argument("--state-dir", help="where engine logs live (overrides state_dir)")
    # One config file serves every node of a DaemonSet; the pod's own address
    # comes from the command line (Kubernetes expands $(POD_IP) in args).
    p.add_argument(
        "--advertise-host",
        metavar="HOST",
        help="host or IP routers reach this node's engines at (overrides advertise_host)",
    )
    return p


def _version() -> str:
    try:
        return metadata.version("llmgw-agent")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _config(args: argparse.Namespace) -> AgentConfig:
    config = load_config(args.config, AgentConfig)
    overrides = {
        key: value
        for key, value in (
            ("node_id", args.node_id),
            ("control", args.control),
            ("state_dir", args.state_dir),
            ("advertise_host", args.advertise_host),
        )
        if value
    }
    if not overrides:
        return config
    # Validate again, so a flag is held to the same rules as the file.
    return parse_config({**config.model_dump(), **overrides}, AgentConfig, "flags")


async def _serve(
    config: AgentConfig, version: str, launchers: Mapping[str, EngineLauncher]
) -> Handover | None:
    stop = asyncio.Event()
    # Its engines get stop_grace_seconds (in parallel), then the control stream CLOSE_TIMEOUT_SECONDS.
    stop_on_signals(stop, role="agent", grace_seconds=config.stop_grace_seconds + CLOSE_TIMEOUT_SECONDS)
    renewer = (
        asyncio.create_task(renew_forever(config), name="certificate renewal") if wanted(config) else None
    )
    try:
        return await run_agent(
            config, version=version, base_env=dict(os.environ), stop=stop, launchers=launchers
        )
    finally:
        if renewer is not None:
            await cancel_and_wait(renewer)


def main(argv: list[str] | None = None, version: str | None = None) -> int:
    """Run the agent; ``version`` is the package's unless a release's own entry script names it."""
    own_args = list(sys.argv[1:] if argv is None else argv)
    version = version or _version()
    args = _parser(version).parse_args(own_args)
    try:
        config = _config(args)
        launchers = launchers_from_config(config.engines, version)
    except InvalidArgument as err:
        print(f"llmgw-agent: {err}", file=sys.stderr)
        return 2
    setup_logging("llmgw.agent", config.log_level)
    if needs_join(config):
        try:
            log.info("%s", enroll(config, os.environ))
        except InvalidArgument as err:
            print(f"llmgw-agent: {err}", file=sys.stderr)
            return 2
        except JoinRefused as err:
            print(f"llmgw-agent: could not join: {err}", file=sys.stderr)
            return 1
    setup_tracing("agent", config.node_id)
    handover = asyncio.run(_serve(config, version, launchers))
    if handover is None:
        return 0
    if handover.mode == "exit":
        return HANDOVER_EXIT_CODE
    logging.shutdown()
    # The same arguments (config, node id, flags), so the new agent is the same node.
    os.execv(handover.command[0], [*handover.command, *own_args])


if __name__ == "__main__":
    sys.exit(main())
