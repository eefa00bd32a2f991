"""The images API through ComfyUI: filling workflows, the table's shared-environment routes, and
one in-process router in front of the real ComfyUI simulator for the time limit and refusals."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from llmgw.agent.comfysim import ComfySettings
from llmgw.agent.comfysim import build_app as comfy_app
from llmgw.agent.comfysim.app import COMFY
from llmgw.router.comfyui import TXT2IMG, fill, parse_request
from llmgw.router.config import Backend, RouterConfig
from llmgw.router.errors import BadRequest, WorkflowFailed
from llmgw.router.table import Comfy, Endpoint, Model, RoutingTable

from .helpers import router, serve_app, wait_for


def test_the_builtin_workflow_is_filled_through_its_placeholders():
    wf = fill(
        {k: dict(v, inputs=dict(v["inputs"])) for k, v in TXT2IMG.items()},
        prompt="a cat",
        checkpoint="sd.safetensors",
        size=(640, 384),
        n=3,
        seed=42,
    )
    assert wf["4"]["inputs"]["ckpt_name"] == "sd.safetensors"
    assert wf["6"]["inputs"]["text"] == "a cat" and wf["7"]["inputs"]["text"] == ""
    assert wf["5"]["inputs"] == {"width": 640, "height": 384, "batch_size": 3}
    assert wf["3"]["inputs"]["seed"] == 42


def test_a_workflow_without_placeholders_is_filled_by_node_type():
    wf = fill(
        {
            "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "old.ckpt"}},
            "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "old prompt"}},
            "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry"}},
            "4": {"class_type": "EmptyLatentImage", "inputs": {"width": 8, "height": 8, "batch_size": 1}},
            "5": {
                "class_type": "KSampler",
                "inputs": {"seed": 1, "positive": ["2", 0], "negative": ["3", 0]},
            },
        },
        prompt="a dog",
        checkpoint="new.ckpt",
        size=(64, 64),
        n=2,
        seed=7,
    )
    assert wf["1"]["inputs"]["ckpt_name"] == "new.ckpt"
    assert wf["2"]["inputs"]["text"] == "a dog", "the sampler's positive encoder gets the prompt"
    assert wf["3"]["inputs"]["text"] == "blurry", "the negative one is kept"
    assert wf["4"]["inputs"] == {"width": 64, "height": 64, "batch_size": 2}
    assert wf["5"]["inputs"]["seed"] == 7


def test_a_workflow_with_no_place_for_the_prompt_is_refused():
    with pytest.raises(WorkflowFailed, match="no place for the prompt"):
        fill(
            {"1": {"class_type": "SaveImage", "inputs": {}}},
            prompt="x",
            checkpoint="c",
            size=(64, 64),
            n=1,
            seed=0,
        )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "prompt"),
        ({"model": "m", "prompt": "x", "size": "big"}, "size"),
        ({"model": "m", "prompt": "x", "size": "60x64"}, "size"),
        ({"model": "m", "prompt": "x", "n": 5}, "n"),
        ({"model": "m", "prompt": "x", "response_format": "png"}, "response_format"),
    ],
)
def test_bad_image_requests_are_400s_naming_the_field(body, param):
    with pytest.raises(BadRequest) as err:
        parse_request(body, max_images=4)
    assert err.value.param == param


def test_members_route_to_the_entrys_replicas_sharing_their_state_and_the_entry_is_hidden():
    table = RoutingTable()
    entry = Model("comfyui-env-s", comfy=Comfy("txt2img", "a.ckpt"), hidden=True, on_demand=True)
    a = Model("a", comfy=Comfy("txt2img", "a.ckpt", "comfyui-env-s"), on_demand=True)
    b = Model("b", comfy=Comfy("txt2img", "b.ckpt", "comfyui-env-s"), on_demand=True)
    table.apply_catalog(snapshot=True, upserts=[entry, a, b], removals=[])
    assert table.routes("a") == ()
    table.apply_endpoints(
        snapshot=True, upserts=[Endpoint("r1", "comfyui-env-s", "http://e", comfyui=True)], removals=[]
    )
    [ra], [rb] = table.routes("a"), table.routes("b")
    assert ra.state is rb.state is table.routes("comfyui-env-s")[0].state, "one engine, one live state"
    assert (ra.endpoint.model, rb.endpoint.model) == ("a", "b")
    assert table.resolve("comfyui-env-s") is None and {m.name for m in table.models()} == {"a", "b"}
    assert [r.endpoint.id for r in table.all_routes()] == ["r1"], "counted once in reports"


async def _router_with_comfy(sim_url: str, key: str, **images):
    config = RouterConfig(
        backends=[Backend(model="unused", url="http://127.0.0.1:9")],
        images={"poll_interval_seconds": 0.02, **images},
        balancing={"engine_metrics_interval_seconds": 0},
    )
    r = router(config)
    await r.__aenter__()
    model = Model("pic", comfy=Comfy("txt2img", "a.safetensors"), apis=("images",))
    r.table.apply_catalog(snapshot=True, upserts=[model], removals=[])
    r.table.apply_endpoints(
        snapshot=True, upserts=[Endpoint("r1", "pic", sim_url, api_key=key, comfyui=True)], removals=[]
    )
    return r


@pytest.fixture
async def comfy(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(b"w")
    settings = ComfySettings(job_seconds=5.0, steps=50, checkpoint_dirs=(str(tmp_path),), api_key="sim-key")
    app: web.Application = comfy_app(settings)
    runner, url = await serve_app(app, handler_cancellation=True)
    yield app, url
    await runner.cleanup()


async def test_a_job_past_the_time_limit_is_a_504_and_is_interrupted(comfy):
    app, url = comfy
    r = await _router_with_comfy(url, "sim-key", timeout_seconds=0.3)
    try:
        async with aiohttp.ClientSession() as s:
            body = {"model": "pic", "prompt": "slow"}
            async with s.post(r.url + "/v1/images/generations", json=body) as resp:
                answer = await resp.json()
            assert resp.status == 504, answer
            assert answer["error"]["code"] == "upstream_timeout"
        sim = app[COMFY]
        await wait_for(lambda: len(sim.history) == 1)
        [entry] = sim.history.values()
        assert entry["status"]["messages"][-1][0] == "execution_interrupted"
    finally:
        await r.__aexit__(None, None, None)


async def test_a_checkpoint_comfyui_lacks_is_a_502_naming_its_validation_error(comfy, tmp_path):
    _, url = comfy
    (tmp_path / "a.safetensors").unlink()
    r = await _router_with_comfy(url, "sim-key")
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(r.url + "/v1/images/generations", json={"model": "pic", "prompt": "x"}) as resp:
                answer = await resp.json()
        assert resp.status == 502
        assert answer["error"]["code"] == "workflow_failed"
        assert "ckpt_name: 'a.safetensors' not in []" in answer["error"]["message"]
    finally:
        await r.__aexit__(None, None, None)


async def test_without_the_engine_key_comfyui_refuses_and_the_client_sees_an_upstream_error(comfy):
    _, url = comfy
    r = await _router_with_comfy(url, "wrong-key")
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(r.url + "/v1/images/generations", json={"model": "pic", "prompt": "x"}) as resp:
                answer = await resp.json()
        assert resp.status == 502 and answer["error"]["code"] == "upstream_error"
    finally:
        await r.__aexit__(None, None, None)


async def test_a_queued_job_whose_client_hangs_up_is_dropped_and_anothers_running_job_is_left_alone(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(b"w")
    app = comfy_app(ComfySettings(job_seconds=1.0, steps=10, checkpoint_dirs=(str(tmp_path),)))
    runner, url = await serve_app(app, handler_cancellation=True)
    sim = app[COMFY]
    r = await _router_with_comfy(url, "")
    try:
        async with aiohttp.ClientSession() as s:
            theirs = fill(
                {k: dict(v, inputs=dict(v["inputs"])) for k, v in TXT2IMG.items()},
                prompt="theirs",
                checkpoint="a.safetensors",
                size=(64, 64),
                n=1,
                seed=1,
            )
            async with s.post(url + "/prompt", json={"prompt": theirs}) as resp:
                their_id = (await resp.json())["prompt_id"]
            await wait_for(lambda: sim.running is not None)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):
                    await s.post(r.url + "/v1/images/generations", json={"model": "pic", "prompt": "mine"})
            await wait_for(lambda: their_id in sim.history, within=10)
        assert sim.history[their_id]["status"]["status_str"] == "success", "theirs ran to the end"
        assert not sim.pending() and sim.running is None
        assert list(sim.history) == [their_id], "mine was dropped from the queue and never ran"
    finally:
        await r.__aexit__(None, None, None)
        await runner.cleanup()


async def test_a_bad_image_request_for_a_model_with_no_replica_is_a_400_not_a_wait():
    config = RouterConfig(backends=[Backend(model="unused", url="http://127.0.0.1:9")])
    async with router(config) as r:
        model = Model("pic", comfy=Comfy("txt2img", "a.safetensors"), apis=("images",), on_demand=True)
        r.table.apply_catalog(snapshot=True, upserts=[model], removals=[])
        async with aiohttp.ClientSession() as s:
            body = {"model": "pic", "prompt": "x", "size": "huge"}
            async with s.post(r.url + "/v1/images/generations", json=body) as resp:
                assert resp.status == 400
                assert (await resp.json())["error"]["param"] == "size"
