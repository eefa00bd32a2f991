"""The readiness probe: what makes a STARTING replica READY.

Both must hold: ``GET /health`` answers 200, and ``GET /v1/models`` (with
the replica's key) lists the served name. /health alone is not enough: vLLM
and SGLang answer it before the model is registered under its name, and a
router sending traffic then would get 404s. An adopted engine whose key has
not been sent again yet is probed on /health alone (/v1/models would refuse
the agent), which every supported engine serves without a key.

ComfyUI (engine ``comfyui``) has neither path, nor served names: it is
ready when ``GET /system_stats`` answers 200, which it does once its nodes
are loaded and its queue runs; that path is also its health check.
"""

from __future__ import annotations

import aiohttp

COMFYUI = "comfyui"


def health_path(engine: str) -> str:
    """The path a serving engine of this kind answers 200 on while healthy."""
    return "/system_stats" if engine == COMFYUI else "/health"


async def probe_engine(
    http: aiohttp.ClientSession, base: str, served_name: str, key: str, engine: str = ""
) -> str:
    """ "" when the engine at ``base`` is ready; otherwise why not, in a few words."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if engine == COMFYUI:
        try:
            async with http.get(f"{base}/system_stats", headers=headers) as resp:
                return "" if resp.status == 200 else f"GET /system_stats answered {resp.status}"
        except (aiohttp.ClientError, TimeoutError) as err:
            return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    try:
        async with http.get(f"{base}/health", headers=headers) as resp:
            if resp.status != 200:
                return f"GET /health answered {resp.status}"
        if not key:
            return ""
        async with http.get(f"{base}/v1/models", headers=headers) as resp:
            if resp.status != 200:
                return f"GET /v1/models answered {resp.status}"
            body = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as err:
        return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    models = body.get("data") if isinstance(body, dict) else None
    served = [m.get("id") for m in models if isinstance(m, dict)] if isinstance(models, list) else []
    if served_name not in served:
        return f"/v1/models lists {served}, not {served_name!r}"
    return ""
