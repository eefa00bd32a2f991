"""The ComfyUI simulator's API as a ComfyUI client sees it: the websocket's events, interrupting
only the job named, and the workflow kept in the history."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from llmgw.agent.comfysim import ComfySettings, build_app
from llmgw.agent.comfysim.__main__ import parse

from ..router.helpers import serve_app

WORKFLOW: dict[str, Any] = {
    "1": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
    "2": {"class_type": "KSampler", "inputs": {"seed": 3, "latent_image": ["1", 0]}},
    "3": {"class_type": "SaveImage", "inputs": {"filename_prefix": "t", "images": ["2", 0]}},
}


@pytest.fixture
async def comfy():
    app = build_app(ComfySettings(job_seconds=0.2, steps=2))
    runner, url = await serve_app(app, handler_cancellation=True)
    async with aiohttp.ClientSession() as session:
        yield session, url
    await runner.cleanup()


async def test_a_websocket_client_sees_its_jobs_events_in_comfyuis_order(comfy):
    session, url = comfy
    async with session.ws_connect(url + "/ws?clientId=me") as ws:
        first = await ws.receive_json(timeout=5)
        assert first["type"] == "status" and first["data"]["sid"] == "me"
        async with session.post(url + "/prompt", json={"prompt": WORKFLOW, "client_id": "me"}) as resp:
            prompt_id = (await resp.json())["prompt_id"]
        kinds = []
        while True:
            msg = await ws.receive_json(timeout=5)
            if msg["type"] == "status":
                continue
            kinds.append(msg["type"])
            if msg["type"] == "executing" and msg["data"]["node"] is None:
                assert msg["data"]["prompt_id"] == prompt_id
                break
    assert kinds == [
        "execution_start",
        "executing",
        "progress",
        "progress",
        "executed",
        "execution_success",
        "executing",
    ]


async def test_interrupt_naming_another_job_leaves_the_running_one_alone(comfy):
    session, url = comfy
    async with session.post(url + "/prompt", json={"prompt": WORKFLOW}) as resp:
        prompt_id = (await resp.json())["prompt_id"]
    async with session.post(url + "/interrupt", json={"prompt_id": "someone-else"}):
        pass
    entry: dict[str, Any] = {}
    for _ in range(100):
        async with session.get(f"{url}/history/{prompt_id}") as resp:
            entry = (await resp.json()).get(prompt_id, {})
        if entry:
            break
        await asyncio.sleep(0.05)
    assert entry["status"]["status_str"] == "success"
    assert entry["prompt"][2] == WORKFLOW, "the history keeps the workflow as submitted"
    image = entry["outputs"]["3"]["images"][0]
    async with session.get(url + "/view", params=image) as resp:
        assert resp.status == 200 and (await resp.read()).startswith(b"\x89PNG")


async def test_object_info_lists_the_checkpoints_it_was_given(tmp_path):
    (tmp_path / "x.safetensors").write_bytes(b"w")
    paths = tmp_path / "paths.yaml"
    paths.write_text(f"a:\n  base_path: {tmp_path}\n  checkpoints: |\n    .\n  custom_nodes: nodes\n")
    settings = parse(["--extra-model-paths-config", str(paths), "--port", "0"])
    assert settings.custom_node_dirs == (str(tmp_path / "nodes"),)
    runner, url = await serve_app(build_app(settings))
    try:
        async with aiohttp.ClientSession() as s, s.get(url + "/object_info") as resp:
            info = await resp.json()
        assert info["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"] == [["x.safetensors"]]
    finally:
        await runner.cleanup()
