"""LoRA adapters on a running engine: loaded and unloaded without a restart.

The control plane sends a replica the whole set of adapters it should hold
(``SetAdapters``, a snapshot); the replica's runner task (see
:mod:`.lifecycle`, the only code that touches a live engine) calls
:func:`sync` with it. Decisions:

- **Weights like base weights.** Each adapter's source goes through the
  node's weights cache (:mod:`.weights`): an ``hf://`` source is fetched
  into it (progress and disk use reported like any entry), an absolute
  path is used in place. The engine is given the local path.
- **The engine's API, per kind.** vLLM (and the simulator, which copies
  it): ``POST /v1/load_lora_adapter {lora_name, lora_path}`` and
  ``/v1/unload_lora_adapter {lora_name}``, which vLLM serves only when the
  engine's environment has ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` (the
  launchers set it). SGLang: the same bodies at ``/load_lora_adapter`` and
  ``/unload_lora_adapter``. llama.cpp serves no adapter by name, so a model
  with LoRA is refused there at launch.
- **Unload first, then load**, so a replica at ``max_loras`` makes room
  before it takes a new adapter.
- **The engine says what it holds.** After a sync the loaded set is read
  back from the engine's ``/v1/models`` (vLLM lists each adapter with its
  base as ``parent``); when that cannot be read, what the agent loaded is
  reported. The same read after an agent restart tells an adopted engine's
  adapters.
- **One failure is one adapter.** An adapter whose weights or load fail is
  left out (the message names it, in the agent's log and the replica's
  engine log) and the others still load; the control plane sends the set
  again after its resend spacing, which retries it.
- Every call has a timeout (:data:`CALL_TIMEOUT_SECONDS` for a load, which
  reads the adapter from disk; :data:`LIST_TIMEOUT_SECONDS` for the list).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import aiohttp

from llmgw.common.errors import LlmgwError

from .weights import WeightsResolver

log = logging.getLogger("llmgw.agent.adapters")

CALL_TIMEOUT_SECONDS = 60.0
# Reading /v1/models back is quick on a live engine; it must not hold up a READY report.
LIST_TIMEOUT_SECONDS = 10.0
RUNTIME_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


@dataclass(frozen=True)
class AdapterRef:
    name: str
    source: str


@dataclass(frozen=True)
class LoraSpec:
    """What a replica's engine starts with: LoRA on, its limits, the adapters loaded at start."""

    max_loras: int
    max_rank: int
    adapters: tuple[AdapterRef, ...] = ()


@dataclass(frozen=True)
class AdapterApi:
    load_path: str
    unload_path: str


# Engine kind -> its runtime adapter API; a kind not here cannot serve adapters.
APIS = {
    "vllm": AdapterApi("/v1/load_lora_adapter", "/v1/unload_lora_adapter"),
    "simulator": AdapterApi("/v1/load_lora_adapter", "/v1/unload_lora_adapter"),
    "sglang": AdapterApi("/load_lora_adapter", "/unload_lora_adapter"),
}


async def resolve_all(
    weights: WeightsResolver | None, adapters: Sequence[AdapterRef], problem: Callable[[str], None]
) -> list[AdapterRef]:
    """Each adapter with the local path of its weights; one whose weights fail is told and left out."""
    out: list[AdapterRef] = []
    for a in adapters:
        if weights is None:
            out.append(a)
            continue
        try:
            out.append(AdapterRef(a.name, await weights.resolve(a.source)))
        except LlmgwError as err:
            problem(f"adapter {a.name}: cannot get its weights {a.source}: {err}")
    return out


class AdapterClient:
    """One engine's adapter API, through a shared HTTP session."""

    def __init__(self, http: aiohttp.ClientSession, base: str, key: str, api: AdapterApi):
        self._http = http
        self._base = base
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._api = api

    async def _post(self, path: str, body: dict[str, str]) -> str:
        """'' on success, else what went wrong."""
        try:
            async with self._http.post(
                self._base + path,
                json=body,
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_SECONDS),
            ) as resp:
                text = (await resp.text())[:500]
                return "" if resp.status < 300 else f"HTTP {resp.status}: {text}"
        except (aiohttp.ClientError, TimeoutError) as err:
            return f"{type(err).__name__}: {err}"

    async def load(self, name: str, path: str) -> str:
        return await self._post(self._api.load_path, {"lora_name": name, "lora_path": path})

    async def unload(self, name: str) -> str:
        return await self._post(self._api.unload_path, {"lora_name": name})

    async def loaded(self) -> set[str] | None:
        """The adapters ``/v1/models`` lists (entries with a parent); None when it cannot be read."""
        try:
            async with self._http.get(
                self._base + "/v1/models",
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=LIST_TIMEOUT_SECONDS),
            ) as resp:
                if resp.status != 200:
                    return None
                doc = await resp.json()
            return {m["id"] for m in doc.get("data", []) if isinstance(m, dict) and m.get("parent")}
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError):
            return None


async def sync(
    client: AdapterClient,
    loaded: set[str],
    wanted: Sequence[AdapterRef],
    resolve: Callable[[Sequence[AdapterRef]], Awaitable[list[AdapterRef]]],
    problem: Callable[[str], None],
) -> set[str]:
    """Make the engine hold ``wanted`` (unload the rest first); returns what it holds after."""
    names = {a.name for a in wanted}
    holds = set(loaded)
    for name in sorted(holds - names):
        why = await client.unload(name)
        if why:
            problem(f"adapter {name}: unload failed: {why}")
        else:
            holds.discard(name)
    missing = [a for a in wanted if a.name not in holds]
    for a in await resolve(missing):
        why = await client.load(a.name, a.source)
        if why:
            problem(f"adapter {a.name}: load of {a.source} failed: {why}")
        else:
            holds.add(a.name)
    told = await client.loaded()
    return told if told is not None else holds
