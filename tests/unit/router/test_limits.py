"""Limits on every path: body size on each proxied path, and the connect timeout."""

from __future__ import annotations

import socket

import aiohttp
import pytest

from llmgw.router.config import Backend, Limits, RouterConfig
from llmgw.router.proxy import PROXY_PATHS

from .engines import FakeEngine
from .helpers import router


@pytest.mark.parametrize("path", PROXY_PATHS)
async def test_every_proxied_path_refuses_a_body_over_the_limit_with_an_openai_413(path):
    async with FakeEngine() as engine:
        config = RouterConfig(
            listen="127.0.0.1:0",
            backends=[Backend(model="m", url=engine.url)],
            limits=Limits(max_body_bytes=2048),
        )
        big = b'{"model": "m", "input": "' + b"x" * 4096 + b'"}'
        async with router(config) as r, aiohttp.ClientSession() as client:
            async with client.post(
                r.url + path, data=big, headers={"Content-Type": "application/json"}
            ) as resp:
                assert resp.status == 413
                assert (await resp.json())["error"]["code"] == "request_too_large"
        assert engine.seen == []


async def test_engine_that_never_accepts_hits_the_connect_timeout_and_the_request_moves_on():
    # A listener whose accept queue is full: the kernel drops further SYNs, so connects hang.
    with socket.socket() as stuck:
        stuck.bind(("127.0.0.1", 0))
        stuck.listen(0)
        fillers = []
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(stuck.getsockname())
            fillers.append(filler)
        try:
            async with FakeEngine(name="good") as good:
                config = RouterConfig(
                    listen="127.0.0.1:0",
                    backends=[
                        Backend(model="m", url=f"http://127.0.0.1:{stuck.getsockname()[1]}", priority=0),
                        Backend(model="m", url=good.url, priority=1),
                    ],
                    limits=Limits(connect_timeout_seconds=0.3),
                )
                async with router(config) as r, aiohttp.ClientSession() as client:
                    async with client.post(r.url + "/v1/chat/completions", json={"model": "m"}) as resp:
                        assert resp.status == 200
                        assert resp.headers["x-llmgw-replica"] == "static:m:1"
                    # The stuck engine was tried first and failed (the connect timed out).
                    assert r.table.state("static:m:0").consecutive_failures == 1
        finally:
            for filler in fillers:
                filler.close()
