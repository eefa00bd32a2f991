"""A tiny engine for the agent's tests, run as ``python fake_engine.py``.

It speaks just enough of an engine for the supervisor: ``GET /health`` and
``GET /v1/models`` (listing ``--served-model-name``), the latter refusing any
request without ``Authorization: Bearer $VLLM_API_KEY``, plus ``GET /debug``
telling what it was started with (its CUDA_VISIBLE_DEVICES, its extra
flags, its pid and its child's). The agent's tests run it through the
simulator launcher with ``engines.simulator.command`` (the launcher seam),
so they do not depend on the real simulator.

Behaviours a test asks for with flags:
  --fail-at-start      print an error and exit 3 before listening
  --exit-after S       exit with code 7, S seconds after it started serving
  --never-ready        /health answers 503 forever
  --other-name         /v1/models lists another model than --served-model-name
  --ignore-sigterm     SIGTERM does nothing (the agent must SIGKILL)
  --spawn-child        start a sleeping child in the same process group
Unknown flags are accepted and reported by /debug.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys

from aiohttp import web


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--served-model-name", required=True)
    # As vLLM: the key comes from the environment (the agent never puts it on argv).
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"))
    p.add_argument("--fail-at-start", action="store_true")
    p.add_argument("--exit-after", type=float)
    p.add_argument("--never-ready", action="store_true")
    p.add_argument("--other-name", action="store_true")
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--spawn-child", action="store_true")
    args, extra = p.parse_known_args()

    cuda = os.environ.get("CUDA_VISIBLE_DEVICES")
    print(f"fake engine pid={os.getpid()} CUDA_VISIBLE_DEVICES={cuda} extra={extra}", flush=True)
    if args.fail_at_start:
        print("fatal: cannot load weights for the model (fake engine told to fail)", flush=True)
        sys.exit(3)
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = None
    if args.spawn_child:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])

    @web.middleware
    async def require_key(request: web.Request, handler):
        # /health is open, as in vLLM, SGLang and llama.cpp: adoption probes it without the key.
        if request.path != "/health" and request.headers.get("Authorization") != f"Bearer {args.api_key}":
            return web.json_response({"error": "missing or wrong engine key"}, status=401)
        return await handler(request)

    async def health(request: web.Request) -> web.Response:
        return web.Response(status=503 if args.never_ready else 200)

    async def models(request: web.Request) -> web.Response:
        served = "some-other-model" if args.other_name else args.served_model_name
        return web.json_response({"object": "list", "data": [{"id": served}]})

    async def debug(request: web.Request) -> web.Response:
        return web.json_response(
            {"cuda": cuda, "extra": extra, "pid": os.getpid(), "child": child.pid if child else 0}
        )

    async def exit_later(app: web.Application) -> None:
        if args.exit_after is not None:
            asyncio.get_running_loop().call_later(args.exit_after, _exit_on_purpose)

    app = web.Application(middlewares=[require_key])
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/debug", debug)
    app.on_startup.append(exit_later)
    web.run_app(app, host=args.host, port=args.port, print=None, handle_signals=False)


def _exit_on_purpose() -> None:
    print("fake engine exiting on purpose with code 7", flush=True)
    os._exit(7)


if __name__ == "__main__":
    main()
