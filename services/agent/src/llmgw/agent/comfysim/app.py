"""The simulated ComfyUI: a job queue run by one worker, and its HTTP API (see the package doc)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import png
import yaml
from aiohttp import WSMsgType, web

from llmgw.common.tasks import cancel_and_wait

MAX_BODY_BYTES = 4 * 1024 * 1024
# Largest image side and batch the simulator draws; ComfyUI's own limit is far higher,
# but a simulator spending seconds in pure-Python PNG encoding would skew every timing.
MAX_SIDE = 2048
MAX_BATCH = 8
# Jobs whose history is kept (ComfyUI keeps 10,000 by default; a simulator needs fewer).
MAX_HISTORY = 1000
CHECKPOINT_SUFFIXES = (".safetensors", ".ckpt", ".pt", ".pth", ".bin", ".sft", ".gguf")
KNOWN_NODES = (
    "CheckpointLoaderSimple",
    "CLIPTextEncode",
    "EmptyLatentImage",
    "KSampler",
    "VAEDecode",
    "SaveImage",
)


@dataclass(frozen=True)
class ComfySettings:
    host: str = "127.0.0.1"
    port: int = 8188
    # Seconds one job runs, split over `steps` progress events.
    job_seconds: float = 1.0
    steps: int = 4
    # Folders searched for checkpoints and custom nodes (from --extra-model-paths-config).
    checkpoint_dirs: tuple[str, ...] = ()
    custom_node_dirs: tuple[str, ...] = ()
    # A job whose workflow text contains this fails with an execution_error ("" never).
    fail_marker: str = ""
    # Required as a bearer token when set (ComfyUI itself has no auth).
    api_key: str = field(default="", repr=False)


def read_model_paths(path: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Checkpoint and custom-node folders from ComfyUI's ``extra_model_paths.yaml`` format."""
    doc = yaml.safe_load(Path(path).read_text()) or {}
    checkpoints: list[str] = []
    nodes: list[str] = []
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a mapping of sections")
    for section in doc.values():
        if not isinstance(section, dict):
            continue
        base = str(section.get("base_path", ""))
        for key, out in (("checkpoints", checkpoints), ("custom_nodes", nodes)):
            for line in str(section.get(key, "")).splitlines():
                if line.strip():
                    out.append(str(Path(base) / line.strip()) if base else line.strip())
    return tuple(checkpoints), tuple(nodes)


def checkpoints_in(dirs: tuple[str, ...]) -> list[str]:
    names: list[str] = []
    for d in dirs:
        p = Path(d)
        if p.is_dir():
            names += sorted(f.name for f in p.iterdir() if f.suffix in CHECKPOINT_SUFFIXES)
    return sorted(set(names))


class Invalid(Exception):
    def __init__(self, message: str, node_errors: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.node_errors = dict(node_errors or {})


@dataclass
class Job:
    prompt_id: str
    number: int
    workflow: dict[str, Any]
    client_id: str
    images: list[bytes] = field(default_factory=list)
    interrupted: bool = False
    messages: list[list[Any]] = field(default_factory=list)


class Comfy:
    """The queue and the one worker; every method runs on the event loop."""

    def __init__(self, settings: ComfySettings):
        self.settings = settings
        self._numbers = itertools.count()
        self._queue: asyncio.Queue[Job] = asyncio.Queue()
        self._pending: dict[str, Job] = {}
        self.running: Job | None = None
        self._run_task: asyncio.Task[None] | None = None
        self.history: dict[str, dict[str, Any]] = {}
        self.files: dict[str, bytes] = {}
        self.sockets: dict[str, set[web.WebSocketResponse]] = {}

    # -- submission -------------------------------------------------------

    def validate(self, workflow: Any) -> None:
        if not isinstance(workflow, dict) or not workflow:
            raise Invalid("Prompt has no nodes: 'prompt' must be a non-empty object of nodes")
        checkpoints = checkpoints_in(self.settings.checkpoint_dirs)
        errors: dict[str, Any] = {}
        outputs = 0
        for node_id, node in workflow.items():
            if not isinstance(node, dict) or not isinstance(node.get("class_type"), str):
                raise Invalid(f"Node {node_id!r} has no class_type")
            inputs = node.get("inputs", {})
            if not isinstance(inputs, dict):
                raise Invalid(f"Node {node_id!r}: inputs must be an object")
            if node["class_type"] == "SaveImage":
                outputs += 1
            if node["class_type"] == "CheckpointLoaderSimple":
                name = inputs.get("ckpt_name")
                if name not in checkpoints:
                    errors[node_id] = {
                        "errors": [
                            {
                                "type": "value_not_in_list",
                                "message": "Value not in list",
                                "details": f"ckpt_name: '{name}' not in {checkpoints}",
                                "extra_info": {"input_name": "ckpt_name"},
                            }
                        ],
                        "class_type": node["class_type"],
                    }
        if errors:
            raise Invalid("Prompt outputs failed validation", errors)
        if not outputs:
            raise Invalid("Prompt has no outputs")

    def submit(self, workflow: dict[str, Any], client_id: str) -> Job:
        self.validate(workflow)
        job = Job(uuid.uuid4().hex, next(self._numbers), workflow, client_id)
        self._pending[job.prompt_id] = job
        self._queue.put_nowait(job)
        self._broadcast_status()
        return job

    def interrupt(self, prompt_id: str | None) -> None:
        job = self.running
        if job is not None and (prompt_id is None or prompt_id == job.prompt_id):
            job.interrupted = True
            if self._run_task is not None:
                self._run_task.cancel()

    def pending(self) -> list[Job]:
        return list(self._pending.values())

    def delete(self, prompt_ids: list[str]) -> None:
        for pid in prompt_ids:
            job = self._pending.pop(pid, None)
            if job is not None:
                job.interrupted = True

    # -- the worker -------------------------------------------------------

    async def work(self) -> None:
        while True:
            job = await self._queue.get()
            if self._pending.pop(job.prompt_id, None) is None:
                continue  # deleted from the queue
            self.running = job
            self._run_task = asyncio.create_task(self._run(job))
            try:
                try:
                    await asyncio.wait({self._run_task})
                except asyncio.CancelledError:
                    self._run_task.cancel()
                    raise
                if self._run_task.cancelled() or job.interrupted:
                    self._end(job, "error", interrupted=True)
                elif (err := self._run_task.exception()) is not None:
                    self._end(job, "error", error=str(err))
                else:
                    self._end(job, "success")
            finally:
                self.running = None
                self._run_task = None

    async def _run(self, job: Job) -> None:
        s = self.settings
        self._event(job, "execution_start", {"prompt_id": job.prompt_id, "timestamp": _ms()})
        sampler = next((k for k, n in job.workflow.items() if n["class_type"] == "KSampler"), None)
        self._send(job, "executing", {"node": sampler, "display_node": sampler, "prompt_id": job.prompt_id})
        for step in range(1, s.steps + 1):
            await asyncio.sleep(s.job_seconds / s.steps)
            self._send(
                job,
                "progress",
                {"value": step, "max": s.steps, "prompt_id": job.prompt_id, "node": sampler},
            )
        if s.fail_marker and s.fail_marker in json.dumps(job.workflow):
            raise RuntimeError(f"simulated failure: the workflow contains {s.fail_marker!r}")
        width, height, batch = _latent(job.workflow)
        colour = _colour(job.workflow)
        for i in range(batch):
            job.images.append(draw_png(width, height, colour, i))

    def _end(self, job: Job, status: str, *, interrupted: bool = False, error: str = "") -> None:
        outputs: dict[str, Any] = {}
        if status == "success":
            save = [k for k, n in job.workflow.items() if n["class_type"] == "SaveImage"]
            prefix = str(job.workflow[save[0]].get("inputs", {}).get("filename_prefix", "ComfyUI"))
            images = []
            for i, data in enumerate(job.images):
                name = f"{prefix}_{job.number:05d}_{i:02d}_.png"
                self.files[name] = data
                images.append({"filename": name, "subfolder": "", "type": "output"})
            outputs[save[0]] = {"images": images}
            self._send(
                job, "executed", {"node": save[0], "output": outputs[save[0]], "prompt_id": job.prompt_id}
            )
            self._event(job, "execution_success", {"prompt_id": job.prompt_id, "timestamp": _ms()})
        elif interrupted:
            self._event(
                job,
                "execution_interrupted",
                {"prompt_id": job.prompt_id, "node_id": "", "node_type": "", "executed": []},
            )
        else:
            self._event(
                job,
                "execution_error",
                {
                    "prompt_id": job.prompt_id,
                    "node_id": "",
                    "node_type": "KSampler",
                    "exception_message": error,
                    "exception_type": "RuntimeError",
                    "traceback": [],
                },
            )
        self._send(job, "executing", {"node": None, "prompt_id": job.prompt_id})
        self.history[job.prompt_id] = {
            "prompt": [job.number, job.prompt_id, job.workflow, {"client_id": job.client_id}, list(outputs)],
            "outputs": outputs,
            "status": {"status_str": status, "completed": status == "success", "messages": job.messages},
            "meta": {},
        }
        while len(self.history) > MAX_HISTORY:
            old = next(iter(self.history))
            for entry in self.history.pop(old)["outputs"].values():
                for image in entry.get("images", []):
                    self.files.pop(image["filename"], None)
        self._broadcast_status()

    # -- websocket events -------------------------------------------------

    def _event(self, job: Job, kind: str, data: dict[str, Any]) -> None:
        job.messages.append([kind, data])
        self._send(job, kind, data)

    def _send(self, job: Job, kind: str, data: dict[str, Any]) -> None:
        for ws in list(self.sockets.get(job.client_id, ())):
            if not ws.closed:
                _spawn_send(ws, {"type": kind, "data": data})

    def status(self) -> dict[str, Any]:
        remaining = self._queue.qsize() + (1 if self.running is not None else 0)
        return {"status": {"exec_info": {"queue_remaining": remaining}}}

    def _broadcast_status(self) -> None:
        for sockets in self.sockets.values():
            for ws in list(sockets):
                if not ws.closed:
                    _spawn_send(ws, {"type": "status", "data": self.status()})


_SENDS: set[asyncio.Task[None]] = set()


def _spawn_send(ws: web.WebSocketResponse, message: dict[str, Any]) -> None:
    # Sends are short and ordered per socket by aiohttp's writer; each task is kept
    # until done so none is collected mid-send, and a closed socket just ends it.
    async def send() -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await ws.send_json(message)

    task = asyncio.get_running_loop().create_task(send())
    _SENDS.add(task)
    task.add_done_callback(_SENDS.discard)


def _ms() -> int:
    return int(time.time() * 1000)


def _latent(workflow: Mapping[str, Any]) -> tuple[int, int, int]:
    for node in workflow.values():
        if node["class_type"] == "EmptyLatentImage":
            inputs = node.get("inputs", {})
            try:
                w, h = int(inputs.get("width", 512)), int(inputs.get("height", 512))
                b = int(inputs.get("batch_size", 1))
            except (TypeError, ValueError):
                return 64, 64, 1
            return max(8, min(w, MAX_SIDE)), max(8, min(h, MAX_SIDE)), max(1, min(b, MAX_BATCH))
    return 64, 64, 1


def _colour(workflow: Mapping[str, Any]) -> tuple[int, int, int]:
    digest = hashlib.sha256(json.dumps(workflow, sort_keys=True).encode()).digest()
    return digest[0], digest[1], digest[2]


def draw_png(width: int, height: int, colour: tuple[int, int, int], index: int) -> bytes:
    """A ``width`` x ``height`` RGB PNG: a vertical gradient of ``colour``, shifted per ``index``."""
    r, g, b = colour
    rows = []
    for y in range(height):
        shade = (y * 255 // max(1, height - 1) + index * 37) % 256
        rows.append(bytes((r, g, (b + shade) % 256)) * width)
    out = io.BytesIO()
    png.Writer(width, height, greyscale=False, bitdepth=8).write(out, rows)
    return out.getvalue()


# -- HTTP ----------------------------------------------------------------------

COMFY: web.AppKey[Comfy] = web.AppKey("comfy", Comfy)


@web.middleware
async def _auth(request: web.Request, handler: Any) -> web.StreamResponse:
    key = request.app[COMFY].settings.api_key
    # /system_stats stays open, like vLLM's /health: the agent's health check sends no key.
    if (
        key
        and request.path != "/system_stats"
        and request.headers.get("Authorization", "") != f"Bearer {key}"
    ):
        return web.json_response(
            {"error": {"type": "unauthorized", "message": "bad or missing key"}}, status=401
        )
    result: web.StreamResponse = await handler(request)
    return result


async def _json(request: web.Request) -> Any:
    try:
        return json.loads(await request.read())
    except ValueError as err:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": {"type": "invalid_prompt", "message": f"invalid JSON: {err}"}}),
            content_type="application/json",
        ) from None


async def post_prompt(request: web.Request) -> web.Response:
    comfy = request.app[COMFY]
    body = await _json(request)
    if not isinstance(body, dict):
        return _invalid(Invalid("the body must be an object with a 'prompt'"))
    try:
        job = comfy.submit(body.get("prompt"), str(body.get("client_id", "")))  # type: ignore[arg-type]
    except Invalid as err:
        return _invalid(err)
    return web.json_response({"prompt_id": job.prompt_id, "number": job.number, "node_errors": {}})


def _invalid(err: Invalid) -> web.Response:
    kind = "prompt_outputs_failed_validation" if err.node_errors else "invalid_prompt"
    body = {
        "error": {"type": kind, "message": str(err), "details": "", "extra_info": {}},
        "node_errors": err.node_errors,
    }
    return web.json_response(body, status=400)


async def get_history(request: web.Request) -> web.Response:
    comfy = request.app[COMFY]
    pid = request.match_info.get("prompt_id")
    if pid is None:
        return web.json_response(comfy.history)
    entry = comfy.history.get(pid)
    return web.json_response({pid: entry} if entry is not None else {})


async def get_view(request: web.Request) -> web.Response:
    comfy = request.app[COMFY]
    name = request.query.get("filename", "")
    if request.query.get("type", "output") != "output" or request.query.get("subfolder", ""):
        raise web.HTTPNotFound()
    data = comfy.files.get(name)
    if data is None:
        raise web.HTTPNotFound()
    return web.Response(body=data, content_type="image/png")


async def post_interrupt(request: web.Request) -> web.Response:
    body = await _json(request) if request.can_read_body else {}
    pid = body.get("prompt_id") if isinstance(body, dict) else None
    request.app[COMFY].interrupt(pid if isinstance(pid, str) else None)
    return web.Response()


async def post_queue(request: web.Request) -> web.Response:
    body = await _json(request)
    if isinstance(body, dict) and isinstance(body.get("delete"), list):
        request.app[COMFY].delete([str(p) for p in body["delete"]])
    return web.Response()


async def get_queue(request: web.Request) -> web.Response:
    comfy = request.app[COMFY]
    running = [comfy.running] if comfy.running is not None else []
    return web.json_response(
        {
            "queue_running": [_queue_item(j) for j in running],
            "queue_pending": [_queue_item(j) for j in comfy.pending()],
        }
    )


def _queue_item(job: Job) -> list[Any]:
    return [job.number, job.prompt_id, job.workflow, {"client_id": job.client_id}, []]


async def get_object_info(request: web.Request) -> web.Response:
    comfy = request.app[COMFY]
    info: dict[str, Any] = {
        name: {
            "input": {"required": {}},
            "output": [],
            "name": name,
            "display_name": name,
            "category": "llmgw",
        }
        for name in KNOWN_NODES
    }
    info["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"] = [
        checkpoints_in(comfy.settings.checkpoint_dirs)
    ]
    return web.json_response(info)


async def get_system_stats(request: web.Request) -> web.Response:
    s = request.app[COMFY].settings
    return web.json_response(
        {
            "system": {
                "os": "posix",
                "comfyui_version": "simulated",
                "python_version": "",
                "embedded_python": False,
            },
            "devices": [{"name": "cpu", "type": "cpu", "index": None}],
            "llmgw": {
                "checkpoints": checkpoints_in(s.checkpoint_dirs),
                "custom_nodes": list(s.custom_node_dirs),
            },
        }
    )


async def websocket(request: web.Request) -> web.WebSocketResponse:
    comfy = request.app[COMFY]
    client_id = request.query.get("clientId") or uuid.uuid4().hex
    ws = web.WebSocketResponse(heartbeat=30)
    await ws.prepare(request)
    comfy.sockets.setdefault(client_id, set()).add(ws)
    try:
        await ws.send_json({"type": "status", "data": {**comfy.status(), "sid": client_id}})
        async for msg in ws:
            if msg.type in (WSMsgType.ERROR, WSMsgType.CLOSE):
                break
    finally:
        sockets = comfy.sockets.get(client_id, set())
        sockets.discard(ws)
        if not sockets:
            comfy.sockets.pop(client_id, None)
    return ws


def build_app(settings: ComfySettings) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_auth])
    app[COMFY] = Comfy(settings)

    async def worker(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(app[COMFY].work())
        yield
        await cancel_and_wait(task)

    app.cleanup_ctx.append(worker)
    app.router.add_post("/prompt", post_prompt)
    app.router.add_get("/history", get_history)
    app.router.add_get("/history/{prompt_id}", get_history)
    app.router.add_get("/view", get_view)
    app.router.add_post("/interrupt", post_interrupt)
    app.router.add_post("/queue", post_queue)
    app.router.add_get("/queue", get_queue)
    app.router.add_get("/object_info", get_object_info)
    app.router.add_get("/system_stats", get_system_stats)
    app.router.add_get("/ws", websocket)
    return app
