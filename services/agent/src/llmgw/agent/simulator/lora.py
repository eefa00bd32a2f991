"""LoRA adapters in the simulator, as vLLM serves them.

vLLM's behaviour, copied where a client or the agent can see it:

- ``--enable-lora`` switches adapters on; ``--lora-modules NAME=PATH ...``
  loads some at start; ``--max-loras`` and ``--max-lora-rank`` are accepted
  (vLLM's ``max_loras`` bounds adapters *in one batch*, not adapters
  loaded, so neither refuses a load here either).
- ``POST /v1/load_lora_adapter {lora_name, lora_path}`` and
  ``/v1/unload_lora_adapter {lora_name}`` exist only when the environment
  has ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` set to a true value (else 404,
  as vLLM registers no route). Loading a name already loaded is a 400;
  unloading one not loaded is a 404; a path that is not a directory with an
  ``adapter_config.json`` is a 400 (vLLM cannot read it either).
- ``/v1/models`` lists each adapter with the base model as ``parent`` and
  its path as ``root``; a request naming an adapter is served and its
  answer's ``model`` is the adapter's name: that is how a client (and a
  test) sees which adapter answered.
"""

from __future__ import annotations

import os
from pathlib import Path

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from llmgw.common.errors import InvalidArgument, NotFound

RUNTIME_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def runtime_updating_allowed(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    return environ.get(RUNTIME_ENV, "").strip().lower() in ("1", "true", "yes")


class _Load(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: str = Field(min_length=1, max_length=256)
    lora_path: str = Field(min_length=1, max_length=4096)


class _Unload(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: str = Field(min_length=1, max_length=256)


def parse_module(text: str) -> tuple[str, str]:
    """``NAME=PATH`` as (name, path)."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise InvalidArgument(f"--lora-modules entry {text!r} is not NAME=PATH")
    return name, path


def _check_path(path: str) -> None:
    if not (Path(path) / "adapter_config.json").is_file():
        raise InvalidArgument(f"no adapter at {path!r}: it has no adapter_config.json")


class Adapters:
    """The adapters one simulator holds: name -> path, in load order."""

    def __init__(self, modules: tuple[tuple[str, str], ...] = ()):
        self._loaded: dict[str, str] = {}
        for name, path in modules:
            _check_path(path)
            self._loaded[name] = path

    def loaded(self) -> dict[str, str]:
        return dict(self._loaded)

    def __contains__(self, name: object) -> bool:
        return name in self._loaded

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/load_lora_adapter", self.load)
        app.router.add_post("/v1/unload_lora_adapter", self.unload)

    async def load(self, request: web.Request) -> web.Response:
        body = _Load.model_validate_json(await request.read())
        if body.lora_name in self._loaded:
            raise InvalidArgument(f"The lora adapter '{body.lora_name}' has already been loaded.")
        _check_path(body.lora_path)
        self._loaded[body.lora_name] = body.lora_path
        return web.Response(text=f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    async def unload(self, request: web.Request) -> web.Response:
        body = _Unload.model_validate_json(await request.read())
        if self._loaded.pop(body.lora_name, None) is None:
            raise NotFound(f"The lora adapter '{body.lora_name}' cannot be found.")
        return web.Response(text=f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
