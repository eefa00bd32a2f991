"""Entry point: ``llmgw-control --config FILE [--listen] [--advertise] [--control-id]``.

Only wiring: read and validate the configuration (flags override the file,
then the whole document is validated again), set up logging and tracing,
read the cluster secret and the admin token, open etcd, run the control
plane until SIGTERM or SIGINT, and exit 0 after a graceful stop. A
configuration problem exits 2 with the message that says what to fix.

When a cluster setting that is read only at start changes, the control
plane stops gracefully and this process replaces itself with a fresh one
(``exec``: same PID, same arguments), so no supervisor is needed for it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from prometheus_client import CollectorRegistry

from llmgw.common import metricsport
from llmgw.common.config import load_config, parse_config
from llmgw.common.errors import InvalidArgument
from llmgw.common.etcd import EtcdStore
from llmgw.common.keys import read_secret
from llmgw.common.stopping import stop_on_signals
from llmgw.common.telemetry import setup_logging, setup_tracing

from .api.auth import read_token
from .config import ControlConfig
from .controlplane import ControlPlane

log = logging.getLogger("llmgw.control")


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="llmgw-control", description="llmgw control plane")
    p.add_argument("--config", required=True, help="YAML configuration file")
    p.add_argument("--listen", help="host:port to serve gRPC on (overrides the file)")
    p.add_argument("--advertise", help="host:port agents and routers dial (overrides the file)")
    p.add_argument("--http-listen", help="host:port of the REST API and console (overrides the file)")
    p.add_argument("--control-id", help="this control plane's id (overrides the file)")
    return p.parse_args(argv)


def _config(args: argparse.Namespace) -> ControlConfig:
    config = load_config(args.config, ControlConfig)
    overrides = {
        k: v
        for k, v in {
            "listen": args.listen,
            "advertise": args.advertise,
            "control_id": args.control_id,
            "http_listen": args.http_listen,
        }.items()
        if v is not None
    }
    if not overrides:
        return config
    return parse_config({**config.model_dump(), **overrides}, ControlConfig, args.config)


async def _serve(config: ControlConfig, secret: bytes, admin_token: str, source: str) -> bool:
    """Run until stopped; True when the control plane asked to be restarted."""
    registry = CollectorRegistry()
    store = EtcdStore.from_settings(config.etcd, config.etcd_root)
    stop = asyncio.Event()
    stop_on_signals(stop, role="control plane", grace_seconds=config.shutdown_grace_seconds)
    try:
        async with metricsport.serving(config.metrics_listen, registry):
            plane = ControlPlane(
                config, store, secret, admin_token=admin_token, source=source, registry=registry
            )
            await plane.run(stop)
            return plane.restart_requested
    finally:
        await store.close()


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    try:
        config = _config(args)
    except InvalidArgument as err:
        print(err, file=sys.stderr)
        return 2
    setup_logging("llmgw.control", config.log_level)
    setup_tracing("control", config.control_id)
    try:
        secret = read_secret(config.cluster_secret_file)
        token = read_token(config.admin_token_file) if config.admin_token_file else ""
        restart = asyncio.run(_serve(config, secret, token, args.config))
    except InvalidArgument as err:
        log.error("%s", err)
        return 2
    if restart:
        log.info("restarting to apply the new cluster settings")
        logging.shutdown()
        os.execv(sys.executable, [sys.executable, "-m", "llmgw.control.main", *sys.argv[1:]])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
