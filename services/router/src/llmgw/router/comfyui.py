"""Image generation through ComfyUI: ``POST /v1/images/generations`` as a workflow.

The proxy chooses the replica (keys, quotas, waking an on-demand model,
balancing, the breaker) as for every API (:mod:`.proxy`); this module makes
the one attempt on it. What it guarantees:

- **The request becomes the model's workflow.** OpenAI's fields (``prompt``,
  ``size`` ``WxH``, ``n``, ``response_format`` ``b64_json`` or ``url``) fill
  the model's workflow: a built-in (:data:`BUILTIN`, by name) or the JSON the
  control plane read from the model's workflow file. Where a string input is
  exactly ``{{prompt}}``, ``{{checkpoint}}``, ``{{width}}``, ``{{height}}``,
  ``{{n}}`` or ``{{seed}}`` it is replaced; otherwise by node type, as
  ComfyUI's own examples are built: the ``CLIPTextEncode`` a sampler takes as
  ``positive`` gets the prompt, every ``CheckpointLoaderSimple`` the model's
  checkpoint (so the members of a shared environment, one ComfyUI, each load
  their own), ``EmptyLatentImage`` the size and ``n`` as its batch, and each
  sampler a fresh seed. A workflow with no place for the prompt is refused.
- **Submitted, waited for, fetched.** ``POST /prompt``, then ``GET
  /history/<id>`` every ``images.poll_interval_seconds`` until the job ends
  (polling rather than the websocket: one plain request per tick, nothing
  held open per job, and it survives a ComfyUI restart between polls), then
  each output image through ``GET /view``, each at most
  ``images.max_image_bytes``. Answered as OpenAI does: ``{"created",
  "data": [{"b64_json"} | {"url"}]}``; ``url`` is a ``data:image/png;base64``
  URL, since a stateless router keeps no files to link to.
- **Failures are OpenAI errors.** ComfyUI refusing the workflow (its 400,
  e.g. a checkpoint it does not have) or the job ending in error is a 502
  ``workflow_failed`` naming ComfyUI's reason; not retried on another
  replica, where it would fail the same way. A replica that does not take
  the submission (refused, reset) is retried like any engine. No answer
  within ``images.timeout_seconds`` (or the request's deadline) is a 504,
  and the job is interrupted.
- **A client that hangs up cancels the job.** The handler is cancelled
  (the front cancels it on a closed connection, as ``handler_cancellation``
  does on aiohttp); the job is then dropped from the queue (``POST /queue``
  ``{"delete": [id]}``) and, if ``GET /queue`` shows it running,
  interrupted (``POST /interrupt`` with its ``prompt_id``): never another
  client's job, even on a ComfyUI that ignores the ``prompt_id``. All of it
  within ``images.cancel_timeout_seconds``. A request that cannot become a
  workflow (a bad field, no usable workflow) is refused before a replica is
  chosen or woken.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import logging
import random
import re
import time
import uuid
from collections.abc import Callable
from typing import Any, Literal

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .breaker import Breaker
from .config import Images
from .errors import BadRequest, UpstreamFailed, UpstreamTimeout, WorkflowFailed
from .forward import KeySource, Outcome, Retryable
from .requestkeys import REQUEST_ID
from .seam import ProxyRequest
from .table import Model, Route

log = logging.getLogger(__name__)

# The built-in workflows, by name (the control plane's model document names the same).
TXT2IMG: dict[str, Any] = {
    "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "{{checkpoint}}"}},
    "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "{{prompt}}", "clip": ["4", 1]}},
    "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["4", 1]}},
    "5": {
        "class_type": "EmptyLatentImage",
        "inputs": {"width": "{{width}}", "height": "{{height}}", "batch_size": "{{n}}"},
    },
    "3": {
        "class_type": "KSampler",
        "inputs": {
            "seed": "{{seed}}",
            "steps": 20,
            "cfg": 7.0,
            "sampler_name": "euler",
            "scheduler": "normal",
            "denoise": 1.0,
            "model": ["4", 0],
            "positive": ["6", 0],
            "negative": ["7", 0],
            "latent_image": ["5", 0],
        },
    },
    "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
    "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "llmgw", "images": ["8", 0]}},
}
BUILTIN: dict[str, dict[str, Any]] = {"txt2img": TXT2IMG}
DEFAULT_SIZE = (512, 512)
MAX_SIDE = 4096
_SIZE = re.compile(r"^([1-9][0-9]{1,4})x([1-9][0-9]{1,4})$")
# ComfyUI's own error text can be long (a traceback); a client gets this much of it.
MAX_REASON_CHARS = 1000


class ImageRequest(BaseModel):
    """OpenAI's image generation body; fields it does not use (quality, style, user) pass."""

    model_config = ConfigDict(extra="allow")

    model: str
    prompt: str = Field(min_length=1, max_length=32000)
    n: int = Field(default=1, ge=1, le=10)
    size: str | None = None
    response_format: Literal["b64_json", "url"] | None = None


def parse_request(body: dict[str, Any], max_images: int) -> tuple[ImageRequest, tuple[int, int]]:
    try:
        req = ImageRequest.model_validate(body)
    except ValidationError as err:
        first = err.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise BadRequest(f"Invalid image request: {param}: {first['msg']}", param) from None
    if req.n > max_images:
        raise BadRequest(f"n is {req.n}; this gateway makes at most {max_images} images per request", "n")
    size = DEFAULT_SIZE
    if req.size not in (None, "auto"):
        m = _SIZE.match(req.size or "")
        if m is None:
            raise BadRequest(f"size {req.size!r} is not WIDTHxHEIGHT (e.g. 1024x1024) or auto", "size")
        w, h = int(m.group(1)), int(m.group(2))
        if not (64 <= w <= MAX_SIDE and 64 <= h <= MAX_SIDE) or w % 8 or h % 8:
            raise BadRequest(
                f"size {req.size}: each side from 64 to {MAX_SIDE} pixels, a multiple of 8", "size"
            )
        size = (w, h)
    return req, size


def workflow_of(model: Model) -> dict[str, Any]:
    """The model's workflow as a fresh document to fill; WorkflowFailed when it has none usable."""
    comfy = model.comfy
    if comfy is None or not comfy.workflow:
        raise WorkflowFailed(
            f"Model {model.name!r} has no usable ComfyUI workflow: the control plane could not read "
            "its workflow file (its log says why); fix the file or the model's comfyui.workflow."
        )
    builtin = BUILTIN.get(comfy.workflow)
    if builtin is not None:
        return copy.deepcopy(builtin)
    try:
        doc = json.loads(comfy.workflow)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise WorkflowFailed(
            f"Model {model.name!r} names workflow {comfy.workflow[:100]!r}, which this router does not "
            f"have built in ({', '.join(BUILTIN)}); upgrade the router or use a workflow file."
        )
    return doc


def fill(
    workflow: dict[str, Any], *, prompt: str, checkpoint: str, size: tuple[int, int], n: int, seed: int
) -> dict[str, Any]:
    """``workflow`` with the request's values put in (see the module docstring); raises BadRequest."""
    values: dict[str, Any] = {
        "{{prompt}}": prompt,
        "{{checkpoint}}": checkpoint,
        "{{width}}": size[0],
        "{{height}}": size[1],
        "{{n}}": n,
        "{{seed}}": seed,
    }
    used: set[str] = set()
    nodes: dict[str, dict[str, Any]] = {}
    for node_id, node in workflow.items():
        if not isinstance(node, dict) or not isinstance(node.get("inputs", {}), dict):
            raise WorkflowFailed(f"The model's workflow is not in ComfyUI's API format (node {node_id!r})")
        nodes[str(node_id)] = node
        inputs = node.setdefault("inputs", {})
        for key, value in list(inputs.items()):
            if isinstance(value, str) and value in values:
                inputs[key] = values[value]
                used.add(value)
    for node in nodes.values():
        kind, inputs = node.get("class_type"), node["inputs"]
        if kind == "CheckpointLoaderSimple" and "{{checkpoint}}" not in used:
            inputs["ckpt_name"] = checkpoint
        elif kind == "EmptyLatentImage":
            if "{{width}}" not in used:
                inputs["width"], inputs["height"] = size
            if "{{n}}" not in used:
                inputs["batch_size"] = n
        for seed_key in ("seed", "noise_seed"):
            if "{{seed}}" not in used and isinstance(inputs.get(seed_key), int):
                inputs[seed_key] = seed
    if "{{prompt}}" not in used:
        targets = [
            link[0]
            for node in nodes.values()
            if isinstance(link := node["inputs"].get("positive"), list) and link
        ]
        encoders = [
            nodes[str(t)] for t in targets if nodes.get(str(t), {}).get("class_type") == "CLIPTextEncode"
        ]
        if not encoders:
            raise WorkflowFailed(
                "The model's workflow has no place for the prompt: mark an input {{prompt}}, or feed a "
                "sampler's positive input from a CLIPTextEncode node."
            )
        for encoder in encoders:
            encoder["inputs"]["text"] = prompt
    return workflow


class ComfyClient:
    """One attempt of an image request on one ComfyUI endpoint (see the module docstring)."""

    def __init__(
        self,
        settings: Images,
        breaker: Breaker,
        keys: KeySource,
        session: Callable[[], aiohttp.ClientSession],
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self._settings = settings
        self._breaker = breaker
        self._keys = keys
        self._session = session
        self._clock = clock
        self._rng = rng or random.Random()

    def _headers(self, request: ProxyRequest, route: Route) -> dict[str, str]:
        headers = {"x-request-id": request[REQUEST_ID]}
        endpoint = route.endpoint
        if endpoint.api_key_file:
            headers["Authorization"] = f"Bearer {self._keys.key(endpoint.api_key_file)}"
        elif endpoint.api_key:
            headers["Authorization"] = f"Bearer {endpoint.api_key}"
        return headers

    def check(self, model: Model, body: dict[str, Any]) -> None:
        """Refuse a request that cannot become a workflow before a replica is chosen or woken."""
        parse_request(body, self._settings.max_images)
        workflow_of(model)

    async def attempt(
        self, request: ProxyRequest, route: Route, model: Model, body: dict[str, Any], deadline: float
    ) -> Outcome:
        s = self._settings
        req, size = parse_request(body, s.max_images)
        comfy = model.comfy
        checkpoint = comfy.checkpoint if comfy is not None else ""
        seed = self._rng.randrange(2**48)
        workflow = fill(
            workflow_of(model), prompt=req.prompt, checkpoint=checkpoint, size=size, n=req.n, seed=seed
        )
        deadline = min(deadline, self._clock() + s.timeout_seconds)
        endpoint = route.endpoint
        headers = self._headers(request, route)
        client_id = uuid.uuid4().hex
        try:
            async with asyncio.timeout(max(0.0, deadline - self._clock())):
                submitted = await self._submit(route, headers, workflow, client_id)
        except TimeoutError:
            self._breaker.failure(route.state, self._clock())
            return Retryable(endpoint.id, "ComfyUI did not take the workflow in time", timeout=True)
        if not isinstance(submitted, str):
            return submitted
        prompt_id = submitted
        ended = False
        try:
            async with asyncio.timeout(max(0.0, deadline - self._clock())):
                outputs = await self._wait(route, headers, prompt_id)
                ended = True
                images = await self._fetch(route, headers, outputs)
        except TimeoutError:
            raise UpstreamTimeout(
                f"ComfyUI on replica {endpoint.id} did not finish job {prompt_id} in time "
                f"(images.timeout_seconds is {s.timeout_seconds:g}); it was interrupted."
            ) from None
        except WorkflowFailed:
            # The job ended on the server, in error: nothing is left to cancel.
            ended = True
            raise
        finally:
            if not ended:
                await self._cancel(route, headers, prompt_id)
        log.info(
            "request %s: ComfyUI job %s on %s made %d image(s)",
            request[REQUEST_ID],
            prompt_id,
            endpoint.id,
            len(images),
        )
        as_url = req.response_format == "url"
        data = [
            {"url": "data:image/png;base64," + base64.b64encode(i).decode()}
            if as_url
            else {"b64_json": base64.b64encode(i).decode(), "revised_prompt": None}
            for i in images
        ]
        answer = json.dumps({"created": int(time.time()), "data": data}).encode()
        reply_headers = {
            "Content-Type": "application/json",
            "x-llmgw-replica": endpoint.id,
            "x-llmgw-model": model.name,
            "x-request-id": request[REQUEST_ID],
        }
        return request.responder.whole(200, reply_headers, answer)

    async def _submit(
        self, route: Route, headers: dict[str, str], workflow: dict[str, Any], client_id: str
    ) -> str | Retryable:
        """The job's prompt_id, or how the replica failed to take it."""
        endpoint = route.endpoint
        try:
            async with self._session().post(
                endpoint.url + "/prompt", json={"prompt": workflow, "client_id": client_id}, headers=headers
            ) as resp:
                text = await _bounded_text(resp, self._settings.max_answer_bytes)
                status = resp.status
        except aiohttp.ClientError as err:
            self._breaker.failure(route.state, self._clock())
            return Retryable(endpoint.id, f"{type(err).__name__}: {err}")
        if status == 400:
            raise WorkflowFailed(f"ComfyUI refused the workflow: {_reason(text)}")
        if status >= 500:
            self._breaker.failure(route.state, self._clock())
            return Retryable(endpoint.id, f"ComfyUI answered {status}: {_reason(text)}")
        if status != 200:
            raise UpstreamFailed(
                f"ComfyUI on replica {endpoint.id} answered /prompt with {status}: {_reason(text)}"
            )
        try:
            prompt_id = json.loads(text)["prompt_id"]
        except (ValueError, KeyError, TypeError):
            raise UpstreamFailed(
                f"ComfyUI on replica {endpoint.id} answered /prompt without a prompt_id"
            ) from None
        if not isinstance(prompt_id, str) or not prompt_id:
            raise UpstreamFailed(
                f"ComfyUI on replica {endpoint.id} answered a prompt_id that is not a string"
            )
        self._breaker.success(route.state)
        return prompt_id

    async def _wait(self, route: Route, headers: dict[str, str], prompt_id: str) -> dict[str, Any]:
        """The job's outputs once it succeeded; WorkflowFailed when it ended otherwise."""
        url = f"{route.endpoint.url}/history/{prompt_id}"
        while True:
            try:
                async with self._session().get(url, headers=headers) as resp:
                    text = await _bounded_text(resp, self._settings.max_answer_bytes)
                    status = resp.status
            except aiohttp.ClientError as err:
                # The job may still run; the next poll (or the deadline) decides.
                log.warning("polling ComfyUI job %s on %s failed: %s", prompt_id, route.endpoint.id, err)
                status, text = 0, ""
            if 400 <= status < 500:
                raise UpstreamFailed(
                    f"ComfyUI on replica {route.endpoint.id} answered /history with {status}: {_reason(text)}"
                )
            if status == 200:
                entry = _history_entry(text, prompt_id)
                if entry is not None:
                    st = entry.get("status") or {}
                    if st.get("status_str") == "success" or (
                        st.get("completed") and st.get("status_str") != "error"
                    ):
                        outputs = entry.get("outputs")
                        return outputs if isinstance(outputs, dict) else {}
                    if st.get("status_str") == "error":
                        raise WorkflowFailed(f"The ComfyUI workflow failed: {_job_error(st)}")
            await asyncio.sleep(self._settings.poll_interval_seconds)

    async def _fetch(self, route: Route, headers: dict[str, str], outputs: dict[str, Any]) -> list[bytes]:
        images: list[bytes] = []
        for node in outputs.values():
            for image in (node or {}).get("images", []) if isinstance(node, dict) else []:
                if not isinstance(image, dict) or not image.get("filename"):
                    continue
                query = {
                    "filename": str(image["filename"]),
                    "subfolder": str(image.get("subfolder", "")),
                    "type": str(image.get("type", "output")),
                }
                try:
                    async with self._session().get(
                        route.endpoint.url + "/view", params=query, headers=headers
                    ) as resp:
                        if resp.status != 200:
                            raise UpstreamFailed(
                                f"ComfyUI answered /view for {query['filename']!r} with {resp.status}"
                            )
                        images.append(await _bounded_bytes(resp, self._settings.max_image_bytes))
                except aiohttp.ClientError as err:
                    raise UpstreamFailed(f"Fetching an image from ComfyUI failed: {err}") from None
        if not images:
            raise WorkflowFailed(
                "The ComfyUI workflow finished without an image (does it end in a SaveImage node?)"
            )
        return images

    async def _cancel(self, route: Route, headers: dict[str, str], prompt_id: str) -> None:
        """Drop the job if queued, interrupt it if it runs; bounded, and never raises.

        Deleted from the queue first (a no-op once it runs), then interrupted
        only if ``/queue`` shows it running: a ComfyUI older than the
        ``prompt_id`` argument of ``/interrupt`` interrupts whatever runs, which
        may be another client's job.
        """
        base = route.endpoint.url
        session = self._session()
        try:
            async with asyncio.timeout(self._settings.cancel_timeout_seconds):
                async with session.post(base + "/queue", json={"delete": [prompt_id]}, headers=headers):
                    pass
                async with session.get(base + "/queue", headers=headers) as resp:
                    queue = json.loads(await _bounded_text(resp, self._settings.max_answer_bytes))
                running = queue.get("queue_running", []) if isinstance(queue, dict) else []
                if any(isinstance(j, list) and len(j) > 1 and j[1] == prompt_id for j in running):
                    async with session.post(
                        base + "/interrupt", json={"prompt_id": prompt_id}, headers=headers
                    ):
                        pass
                    log.info("ComfyUI job %s on %s: interrupted", prompt_id, route.endpoint.id)
                else:
                    log.info("ComfyUI job %s on %s: dropped from the queue", prompt_id, route.endpoint.id)
        except (TimeoutError, aiohttp.ClientError, ValueError, UpstreamFailed) as err:
            log.warning("could not cancel ComfyUI job %s on %s: %s", prompt_id, route.endpoint.id, err)


def _history_entry(text: str, prompt_id: str) -> dict[str, Any] | None:
    with contextlib.suppress(ValueError):
        doc = json.loads(text)
        entry = doc.get(prompt_id) if isinstance(doc, dict) else None
        return entry if isinstance(entry, dict) else None
    return None


def _job_error(status: dict[str, Any]) -> str:
    for message in status.get("messages") or []:
        if isinstance(message, list) and len(message) == 2 and isinstance(message[1], dict):
            kind, data = message
            if kind == "execution_error":
                node = data.get("node_type") or data.get("node_id") or "a node"
                return f"{node}: {str(data.get('exception_message', ''))[:MAX_REASON_CHARS]}"
            if kind == "execution_interrupted":
                return "the job was interrupted on the ComfyUI server"
    return "ComfyUI reported an error without a message"


def _reason(text: str) -> str:
    """ComfyUI's error answer in a line: its message, and each node error's details."""
    try:
        doc = json.loads(text)
    except ValueError:
        return text[:MAX_REASON_CHARS] or "no detail"
    if not isinstance(doc, dict):
        return text[:MAX_REASON_CHARS]
    parts = []
    error = doc.get("error")
    if isinstance(error, dict):
        parts.append(str(error.get("message", "")))
    nodes = doc.get("node_errors")
    if isinstance(nodes, dict):
        for node_id, node in nodes.items():
            for e in (node or {}).get("errors", []) if isinstance(node, dict) else []:
                if isinstance(e, dict):
                    parts.append(f"node {node_id}: {e.get('message', '')}: {e.get('details', '')}")
    return "; ".join(p for p in parts if p)[:MAX_REASON_CHARS] or "no detail"


async def _bounded_bytes(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    data = bytearray()
    async for chunk in resp.content.iter_chunked(64 * 1024):
        data += chunk
        if len(data) > limit:
            raise UpstreamFailed(f"ComfyUI sent an answer of more than {limit} bytes; see the images limits")
    return bytes(data)


async def _bounded_text(resp: aiohttp.ClientResponse, limit: int) -> str:
    return (await _bounded_bytes(resp, limit)).decode(errors="replace")
