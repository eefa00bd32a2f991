"""The metrics_listen port of the control plane and the agent (llmgw.common.metricsport)."""

from __future__ import annotations

import asyncio
import logging
import threading

import aiohttp
from prometheus_client import CollectorRegistry, Counter

from llmgw.common import metricsport
from tests.support.rawhttp import exchange


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("llmgw_test_things", "things", registry=registry).inc(3)
    return registry


async def test_metrics_are_served_and_nothing_else():
    async with metricsport.serving("127.0.0.1:0", _registry()) as port, aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
            assert "llmgw_test_things_total 3.0" in await r.text()
        async with http.get(f"http://127.0.0.1:{port}/") as r:
            assert r.status == 404
        async with http.post(f"http://127.0.0.1:{port}/metrics", data=b"x" * 4096) as r:
            assert r.status == 405


async def test_an_empty_listen_serves_nothing():
    async with metricsport.serving("", _registry()) as port:
        assert port == 0


async def test_idle_connections_hold_no_thread_and_scrapes_go_on():
    # prometheus_client's own server, which the control plane ran here before, held a thread per
    # connection with no timeout: 50 clients that never finish a request held 50 threads.
    async with metricsport.serving("127.0.0.1:0", _registry()) as port, aiohttp.ClientSession() as http:
        threads = threading.active_count()
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(50)]
        for _, writer in idle:
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # a head never finished
        await asyncio.sleep(0.2)
        assert threading.active_count() == threads
        async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
            assert r.status == 200
        for _, writer in idle:
            writer.close()


async def test_bytes_that_are_not_http_get_a_plain_400_and_one_info_line(caplog):
    caplog.set_level(logging.INFO)
    async with metricsport.serving("127.0.0.1:0", _registry()) as port:
        answer = await exchange(port, b"GET /metrics HTTP/1.1\r\nno colon\r\n\r\n")  # then it closes
    assert answer.split(b" ")[1] == b"400" and b"malformed HTTP request" in answer
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info], caplog.text


async def test_a_connection_that_sends_no_whole_request_is_closed_at_the_idle_bound(monkeypatch):
    # The bound as set (75 s) would make a slow test; the same setting, shortened.
    monkeypatch.setattr(metricsport, "IDLE_SECONDS", 0.5)
    async with metricsport.serving("127.0.0.1:0", _registry()) as port:
        # A head never finished: closed, unanswered.
        assert await exchange(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n") == b""
