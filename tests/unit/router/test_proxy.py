"""The proxy end to end: a real router in front of real (fake) engines on port 0."""

from __future__ import annotations

import asyncio
import json
import random

import aiohttp
import openai
import pytest
from aiohttp import web

from llmgw.router.app import build_app
from llmgw.router.config import Backend, Limits, RouterConfig
from llmgw.router.table import Model
from tests.support.procs import free_port

from .engines import FakeEngine
from .helpers import router, serve_app, wait_for

CHAT = "/v1/chat/completions"


def standalone(*backends: Backend, **limits: object) -> RouterConfig:
    return RouterConfig(listen="127.0.0.1:0", backends=list(backends), limits=Limits(**limits))


def assert_openai_error(body: dict, *, type_: str, param: str | None = None) -> None:
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == type_
    assert body["error"]["param"] == param
    assert body["error"]["message"]


async def test_streamed_chat_reaches_client_chunk_by_chunk_without_buffering():
    async with (
        FakeEngine(mode="stream") as engine,
        router(standalone(Backend(model="m", url=engine.url))) as r,
        aiohttp.ClientSession() as client,
        client.post(r.url + CHAT, json={"model": "m", "stream": True, "messages": []}) as resp,
    ):
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert resp.headers["x-llmgw-replica"] == "static:m:0"
        first = await asyncio.wait_for(resp.content.readline(), 2)
        # The engine is still holding chunk two: chunk one cannot have been buffered.
        assert not engine.release.is_set()
        assert json.loads(first.removeprefix(b"data: "))["choices"][0]["delta"]["content"] == "one"
        engine.release.set()
        rest = await asyncio.wait_for(resp.content.read(), 2)
        assert b'"two"' in rest
        assert rest.rstrip().endswith(b"data: [DONE]")


async def test_non_stream_completion_copies_status_json_and_adds_router_headers():
    async with (
        FakeEngine(name="e1") as engine,
        router(standalone(Backend(model="m", url=engine.url))) as r,
        aiohttp.ClientSession() as client,
    ):
        async with client.post(r.url + "/v1/completions", json={"model": "m", "prompt": "hi"}) as resp:
            assert resp.status == 200
            assert (await resp.json())["engine"] == "e1"
            assert resp.headers["x-llmgw-replica"] == "static:m:0"
            generated = resp.headers["x-request-id"]
        assert engine.seen[-1].path == "/v1/completions"
        assert engine.seen[-1].headers["x-request-id"] == generated
        async with client.post(
            r.url + "/v1/embeddings", json={"model": "m", "input": "x"}, headers={"x-request-id": "r-7"}
        ) as resp:
            assert resp.status == 200
            assert resp.headers["x-request-id"] == "r-7"
        assert engine.seen[-1].headers["x-request-id"] == "r-7"


async def test_alias_resolves_and_body_model_is_rewritten_with_unknown_fields_untouched():
    backend_spec = dict(model="m", aliases=["mm"], served_name="org/m-7b-instruct")
    async with FakeEngine() as engine:
        async with (
            router(standalone(Backend(url=engine.url, **backend_spec))) as r,
            aiohttp.ClientSession() as client,
        ):
            body = {
                "model": "mm",
                "messages": [{"role": "user", "content": "hi"}],
                "temperature": 0.1234567890123,
                "vendor_knob": {"nested": [1, None, True, "x"]},
            }
            async with client.post(r.url + CHAT, json=body) as resp:
                assert resp.status == 200
        forwarded = engine.seen[-1].body
        assert forwarded == {**body, "model": "org/m-7b-instruct"}


async def test_rewritten_body_keeps_what_only_the_standard_json_reads_exactly():
    # The router decodes with orjson to route: it rounds an integer past 64
    # bits and refuses NaN, which json accepts. A re-encoded body must carry both as sent.
    async with FakeEngine() as engine:
        async with (
            router(standalone(Backend(url=engine.url, model="m", served_name="org/m"))) as r,
            aiohttp.ClientSession() as client,
        ):
            json_type = {"Content-Type": "application/json"}
            bodies = (b'{"model": "m", "seed": 123456789012345678901234567890}', b'{"model": "m", "x": NaN}')
            for raw in bodies:
                async with client.post(r.url + CHAT, data=raw, headers=json_type) as resp:
                    assert resp.status == 200
                forwarded = engine.seen[-1].body
                assert forwarded["model"] == "org/m"
        assert engine.seen[0].body["seed"] == 123456789012345678901234567890
        assert engine.seen[1].body["x"] != engine.seen[1].body["x"]  # NaN


async def test_backend_key_replaces_the_client_authorization_upstream():
    async with FakeEngine() as keyed, FakeEngine() as open_engine:
        config = standalone(
            Backend(model="a", url=keyed.url, api_key="engine-secret-a"),
            Backend(model="b", url=open_engine.url),
        )
        async with router(config) as r, aiohttp.ClientSession() as client:
            auth = {"Authorization": "Bearer client-key"}
            for model in ("a", "b"):
                async with client.post(r.url + CHAT, json={"model": model}, headers=auth) as resp:
                    assert resp.status == 200
        assert keyed.seen[-1].headers["Authorization"] == "Bearer engine-secret-a"
        assert "Authorization" not in open_engine.seen[-1].headers


async def test_request_goes_to_the_endpoint_with_fewest_in_flight():
    async with FakeEngine(mode="stream") as e0, FakeEngine(mode="stream") as e1:
        config = standalone(Backend(model="m", url=e0.url), Backend(model="m", url=e1.url))
        async with router(config) as r, aiohttp.ClientSession() as client:
            body = {"model": "m", "stream": True}
            first = await client.post(r.url + CHAT, json=body)
            await first.content.readline()
            second = await client.post(r.url + CHAT, json=body)
            await second.content.readline()
            replicas = {first.headers["x-llmgw-replica"], second.headers["x-llmgw-replica"]}
            assert replicas == {"static:m:0", "static:m:1"}
            assert [r.table.state(i).in_flight for i in sorted(replicas)] == [1, 1]
            e0.release.set()
            e1.release.set()
            for resp in (first, second):
                assert b"[DONE]" in await resp.content.read()
                resp.release()


async def test_connect_refused_endpoint_is_retried_on_another():
    async with FakeEngine(name="live") as live:
        dead = f"http://127.0.0.1:{free_port()}"
        # Priority makes the dead endpoint the first choice, every time.
        config = standalone(
            Backend(model="m", url=dead, priority=0), Backend(model="m", url=live.url, priority=1)
        )
        async with router(config) as r, aiohttp.ClientSession() as client:
            async with client.post(r.url + CHAT, json={"model": "m"}) as resp:
                assert resp.status == 200
                assert resp.headers["x-llmgw-replica"] == "static:m:1"
            metrics = await (await client.get(r.url + "/metrics")).text()
            assert 'llmgw_router_upstream_retries_total{model="m"} 1.0' in metrics


async def test_engine_5xx_before_first_byte_is_retried_on_another():
    async with FakeEngine(fail_status=500) as sick, FakeEngine(name="ok") as ok:
        config = standalone(
            Backend(model="m", url=sick.url, priority=0), Backend(model="m", url=ok.url, priority=1)
        )
        async with router(config) as r, aiohttp.ClientSession() as client:
            async with client.post(r.url + CHAT, json={"model": "m"}) as resp:
                assert resp.status == 200
                assert (await resp.json())["engine"] == "ok"
        assert len(sick.seen) == 1


async def test_every_replica_failing_gives_502_and_a_final_429_is_relayed():
    async with FakeEngine(fail_status=503) as a, FakeEngine(fail_status=502) as b:
        config = standalone(Backend(model="m", url=a.url), Backend(model="m", url=b.url))
        async with router(config) as r, aiohttp.ClientSession() as client:
            async with client.post(r.url + CHAT, json={"model": "m"}) as resp:
                assert resp.status == 502
                assert_openai_error(await resp.json(), type_="server_error")
    async with FakeEngine(fail_status=429) as busy:
        async with (
            router(standalone(Backend(model="m", url=busy.url))) as r,
            aiohttp.ClientSession() as client,
            client.post(r.url + CHAT, json={"model": "m"}) as resp,
        ):
            assert resp.status == 429
            assert (await resp.json())["error"]["message"] == "engine is failing"


async def test_engine_silent_past_first_byte_timeout_gives_504():
    async with FakeEngine(delay=5) as slow:
        config = standalone(Backend(model="m", url=slow.url), first_byte_timeout_seconds=0.2)
        async with (
            router(config) as r,
            aiohttp.ClientSession() as client,
            client.post(r.url + CHAT, json={"model": "m"}) as resp,
        ):
            assert resp.status == 504
            assert_openai_error(await resp.json(), type_="server_error")


async def test_unknown_model_gives_openai_404_naming_it():
    async with FakeEngine() as engine:
        async with (
            router(standalone(Backend(model="m", url=engine.url))) as r,
            aiohttp.ClientSession() as client,
            client.post(r.url + CHAT, json={"model": "nope"}) as resp,
        ):
            assert resp.status == 404
            body = await resp.json()
            assert_openai_error(body, type_="invalid_request_error", param="model")
            assert body["error"]["code"] == "model_not_found"
            assert "'nope'" in body["error"]["message"]
            assert "GET /v1/models" in body["error"]["message"]
        assert engine.seen == []


async def test_known_model_without_ready_replica_gives_503_with_retry_after():
    async with FakeEngine() as engine:
        config = standalone(Backend(model="m", url=engine.url), retry_after_seconds=7)
        async with router(config) as r, aiohttp.ClientSession() as client:
            r.table.apply_catalog(snapshot=True, upserts=[Model("lonely")], removals=[])
            async with client.post(r.url + CHAT, json={"model": "lonely"}) as resp:
                assert resp.status == 503
                assert resp.headers["Retry-After"] == "7"
                assert (await resp.json())["error"]["code"] == "no_ready_replica"


BAD_BODIES = [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    (b"{}", 400, "model"),
    (b'{"model": 3}', 400, "model"),
    (b'{"model": "m", "stream": "yes"}', 400, "stream"),
    (b'{"model": "m", "pad": "' + b"x" * 2048 + b'"}', 413, None),
]


async def test_bad_bodies_get_openai_4xx_and_the_router_keeps_serving():
    async with FakeEngine() as engine:
        config = standalone(Backend(model="m", url=engine.url), max_body_bytes=1024)
        async with router(config) as r, aiohttp.ClientSession() as client:
            for raw, status, param in BAD_BODIES:
                headers = {"Content-Type": "application/json"}
                async with client.post(r.url + CHAT, data=raw, headers=headers) as resp:
                    assert resp.status == status, raw[:40]
                    body = await resp.json()
                    assert_openai_error(body, type_="invalid_request_error", param=param)
            async with client.post(r.url + CHAT, json={"model": "m"}) as resp:
                assert resp.status == 200
        assert len(engine.seen) == 1


async def test_unknown_path_and_wrong_method_are_openai_errors():
    async with FakeEngine() as engine:
        async with router(standalone(Backend(model="m", url=engine.url))) as r:
            async with aiohttp.ClientSession() as client:
                async with client.get(r.url + "/v2/nothing") as resp:
                    assert resp.status == 404
                    assert_openai_error(await resp.json(), type_="invalid_request_error")
                async with client.get(r.url + CHAT) as resp:
                    assert resp.status == 405
                    assert resp.headers["Allow"] == "POST"
                    assert_openai_error(await resp.json(), type_="invalid_request_error")


async def test_client_disconnect_mid_stream_cancels_the_upstream_request():
    async with FakeEngine(mode="stream") as engine:
        async with router(standalone(Backend(model="m", url=engine.url))) as r:
            async with aiohttp.ClientSession() as client:
                resp = await client.post(r.url + CHAT, json={"model": "m", "stream": True})
                await resp.content.readline()
                assert r.table.state("static:m:0").in_flight == 1
                resp.close()
            await asyncio.wait_for(engine.cancelled.wait(), 3)
            await wait_for(lambda: r.table.state("static:m:0").in_flight == 0)
            assert not engine.release.is_set()


async def test_unexpected_handler_exception_is_a_500_json_and_the_worker_survives():
    async def broken(request: web.Request) -> web.Response:
        raise RuntimeError("boom")

    async with FakeEngine() as engine:
        app = build_app(standalone(Backend(model="m", url=engine.url)), rng=random.Random(1))
        app.router.add_get("/broken", broken)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        base = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            async with aiohttp.ClientSession() as client:
                for _ in range(2):
                    async with client.get(base + "/broken") as resp:
                        assert resp.status == 500
                        body = await resp.json()
                        assert_openai_error(body, type_="server_error")
                        assert "boom" not in body["error"]["message"]
                async with client.post(base + CHAT, json={"model": "m"}) as resp:
                    assert resp.status == 200
        finally:
            await runner.cleanup()


async def test_official_openai_client_streams_and_completes_through_the_router():
    async with FakeEngine() as engine:
        engine.release.set()
        async with router(standalone(Backend(model="m", url=engine.url, aliases=["m-alias"]))) as r:
            client = openai.AsyncOpenAI(base_url=r.url + "/v1", api_key="client-key", max_retries=0)
            try:
                done = await client.chat.completions.create(
                    model="m-alias", messages=[{"role": "user", "content": "hi"}]
                )
                assert done.choices[0].message.content == "hello from engine"
                stream = await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], stream=True
                )
                texts = [chunk.choices[0].delta.content async for chunk in stream]
                assert texts == ["one", "two"]
                with pytest.raises(openai.NotFoundError):
                    await client.chat.completions.create(model="nope", messages=[])
                listed = [m.id async for m in client.models.list()]
                assert listed == ["m"]
            finally:
                await client.close()


MESSAGES = "/v1/messages"
# Each API's last events: its usage (2 tokens out), then the event that ends its stream.
LAST_EVENTS = {
    CHAT: [
        b'data: {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}\n\n',
        b"data: [DONE]\n\n",
    ],
    MESSAGES: [
        b'event: message_delta\ndata: {"type": "message_delta", "usage": {"output_tokens": 2}}\n\n',
        b'event: message_stop\ndata: {"type": "message_stop"}\n\n',
    ],
}


async def _leave_at_last_event(router_url: str, path: str) -> None:
    """Stream ``path`` and close the connection at the event that ends it, as clients do."""
    if path == CHAT:
        # The official client: it closes its connection on [DONE], without reading the body's end.
        client = openai.AsyncOpenAI(base_url=router_url + "/v1", api_key="k", max_retries=0)
        try:
            stream = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            assert [c async for c in stream] != []
        finally:
            await client.close()
        return
    body = {"model": "m", "stream": True, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        resp = await session.post(router_url + path, json=body)
        seen = b""
        while b"message_stop" not in seen:
            seen += await asyncio.wait_for(resp.content.readany(), 5)
        resp.close()


@pytest.mark.parametrize("path", [CHAT, MESSAGES])
async def test_a_client_that_leaves_at_the_last_event_has_its_stream_counted_whole(path):
    """A client may close its connection once it has read the event that ends the stream, before
    the engine's end of body (the last chunk) has reached the router: the answer is whole, so it
    counts as a 200 with its usage, not as a client that hung up (499)."""
    finish = asyncio.Event()
    peers: list[object] = []  # the router's end of each request's engine connection

    async def engine(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        peers.append(request.transport.get_extra_info("peername"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in LAST_EVENTS[request.path]:
            await response.write(event)
        await finish.wait()  # the body's end held back until the client has left
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post(path, engine)
    runner, url = await serve_app(app)
    try:
        async with router(standalone(Backend(model="m", url=url))) as r:
            await _leave_at_last_event(r.url, path)
            await asyncio.sleep(0.2)  # the router sees the client leave
            finish.set()
            # The request is counted once its attempt is over (the same step, no await between).
            await wait_for(lambda: r.table.state("static:m:0").in_flight == 0)
            async with aiohttp.ClientSession() as session, session.get(r.url + "/metrics") as resp:
                text = await resp.text()
            assert 'llmgw_router_requests_total{model="m",replica="static:m:0",status="200"} 1.0' in text
            assert 'status="499"' not in text
            assert 'llmgw_router_completion_tokens_total{model="m"} 2.0' in text
            # The router waited for the engine's end of body: the connection went back to the pool.
            async with aiohttp.ClientSession() as session:
                body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
                async with session.post(r.url + path, json=body) as resp:
                    assert resp.status == 200
                    await resp.read()
            assert len(peers) == 2 and peers[0] == peers[1], peers
    finally:
        await runner.cleanup()
