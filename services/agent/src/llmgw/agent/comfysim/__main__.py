"""``python -m llmgw.agent.comfysim``: the ComfyUI simulator's entry point, wiring only.

Flags are ComfyUI's where ComfyUI has them (``--listen``, ``--port``,
``--extra-model-paths-config``, ``--cpu``), since the agent launches the
simulator and a real ComfyUI from one template; the simulator's own
(``--job-seconds``, ``--steps``, ``--fail-marker``) are engine args of the
node's ``engines.comfyui.args`` or the profile. Prints ``comfyui simulator
listening on http://HOST:PORT`` once serving; SIGTERM or SIGINT stops it
and it exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from collections.abc import Sequence

from aiohttp import web

from llmgw.common import httpserve
from llmgw.common.telemetry import setup_logging

from .app import ComfySettings, build_app, read_model_paths

KEY_ENV = "LLMGW_ENGINE_KEY"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m llmgw.agent.comfysim", description=__doc__)
    p.add_argument("--listen", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8188)
    p.add_argument("--extra-model-paths-config", default="", help="ComfyUI's extra_model_paths.yaml")
    p.add_argument("--cpu", action="store_true", help="accepted (the simulator always runs on the CPU)")
    p.add_argument("--job-seconds", type=float, default=1.0, help="seconds one job runs")
    p.add_argument("--steps", type=int, default=4, help="progress events per job")
    p.add_argument("--fail-marker", default="", help="a job whose workflow contains this fails")
    return p


def parse(argv: Sequence[str] | None = None) -> ComfySettings:
    p = _parser()
    a = p.parse_args(argv)
    if a.job_seconds < 0 or a.steps < 1:
        p.error("--job-seconds must be >= 0 and --steps >= 1")
    checkpoints: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    if a.extra_model_paths_config:
        try:
            checkpoints, nodes = read_model_paths(a.extra_model_paths_config)
        except (OSError, ValueError) as err:
            p.error(f"--extra-model-paths-config: {err}")
    return ComfySettings(
        host=a.listen,
        port=a.port,
        job_seconds=a.job_seconds,
        steps=a.steps,
        checkpoint_dirs=checkpoints,
        custom_node_dirs=nodes,
        fail_marker=a.fail_marker,
        api_key=os.environ.get(KEY_ENV, ""),
    )


async def serve(settings: ComfySettings) -> None:
    runner = web.AppRunner(build_app(settings), handler_cancellation=True, access_log=None)
    await runner.setup()
    listener = None
    try:
        listener = await httpserve.listen(runner, settings.host, settings.port, _malformed)
        port = httpserve.bound_port(listener)
        print(f"comfyui simulator listening on http://{settings.host}:{port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        if listener is not None:
            listener.close()
        await runner.cleanup()


def _malformed(status: int, message: str) -> web.Response:
    """Bytes aiohttp cannot parse, answered as the simulator's other refusals are."""
    return web.json_response({"error": {"type": "invalid_request", "message": message}}, status=status)


def main(argv: Sequence[str] | None = None) -> None:
    setup_logging("comfysim")
    asyncio.run(serve(parse(argv)))


if __name__ == "__main__":
    main()
