"""Engine load polled from /metrics: parsed cheaply, kept through failures and table updates, used."""

from __future__ import annotations

import asyncio
import contextlib
import time

import aiohttp
import pytest
from aiohttp import web

from llmgw.agent.simulator import SimulatorServer, SimulatorSettings
from llmgw.router.config import Backend, Balancing, RouterConfig
from llmgw.router.enginemetrics import EngineMetricsPoller, MetricsUnreadable, parse_load
from llmgw.router.table import Endpoint, EngineSample, Model, RoutingTable, static_layer

from .helpers import router, wait_for

VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="a"} 3.0
vllm:num_requests_running{engine="1",model_name="a"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="a"} 4.0 1700000000000
vllm:num_requests_waiting_by_reason{reason="capacity"} 99.0
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="a"} 7.0
"""


def test_parse_sums_label_sets_and_ignores_other_series_and_timestamps():
    assert parse_load(VLLM_TEXT) == (5.0, 4.0)
    assert parse_load("vllm:num_requests_waiting 2\n") == (0.0, 2.0)


def test_parse_refuses_metrics_without_the_queue_gauges():
    with pytest.raises(MetricsUnreadable, match="neither"):
        parse_load("sglang:num_queue_reqs 3\n")
    with pytest.raises(MetricsUnreadable, match="cannot read"):
        parse_load('vllm:num_requests_running{a="b"} lots\n')


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def table_for(*urls: str) -> RoutingTable:
    models, endpoints = static_layer([Backend(model="m", url=u) for u in urls], created=0)
    return RoutingTable(models, endpoints)


async def test_poll_reads_a_real_simulators_running_and_waiting_counts():
    settings = SimulatorSettings(ttft_ms=2000, itl_ms=1, output_tokens=2, max_num_seqs=1)
    async with SimulatorServer(settings) as sim, aiohttp.ClientSession() as client:
        body = {"model": "simulated-model", "prompt": "hello", "stream": True}
        held = [asyncio.create_task(client.post(sim.url + "/v1/completions", json=body)) for _ in range(3)]
        try:
            table, clock = table_for(sim.url), Clock()
            poller = EngineMetricsPoller(table, interval=1.0, timeout=1.0, clock=clock)
            route = table.all_routes()[0]
            route.state.in_flight = 1

            async def sampled() -> EngineSample | None:
                await poller.poll_due(client, clock.now)
                return route.state.engine

            deadline = time.monotonic() + 5
            while (sample := await sampled()) is None or sample.waiting < 2:
                assert time.monotonic() < deadline, sample
                await asyncio.sleep(0.02)
            assert (sample.running, sample.waiting) == (1.0, 2.0)
            assert sample.url == sim.url and sample.own_in_flight == 1 and sample.at == clock.now
        finally:
            for task in held:
                task.cancel()
            await asyncio.gather(*held, return_exceptions=True)


async def test_failed_poll_keeps_the_last_sample_and_backs_off():
    answer = {"status": 200}

    async def metrics(request: web.Request) -> web.Response:
        if answer["status"] != 200:
            return web.Response(status=answer["status"])
        return web.Response(text="vllm:num_requests_running 4\nvllm:num_requests_waiting 1\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        table, clock = table_for(url), Clock()
        poller = EngineMetricsPoller(table, interval=1.0, timeout=1.0, clock=clock)
        route = table.all_routes()[0]
        async with aiohttp.ClientSession() as client:
            await poller.poll_due(client, clock.now)
            first = route.state.engine
            assert first is not None and (first.running, first.waiting) == (4.0, 1.0)

            answer["status"] = 500
            clock.now += 1
            await poller.poll_due(client, clock.now)
            assert route.state.engine is first
            assert route.state.poll_failures == 1 and route.state.next_poll == clock.now + 2.0
            await poller.poll_due(client, clock.now + 1)  # not due yet: no request made
            assert route.state.poll_failures == 1

            answer["status"] = 200
            clock.now += 2
            await poller.poll_due(client, clock.now)
            assert route.state.poll_failures == 0 and route.state.engine.at == clock.now
    finally:
        await runner.cleanup()


async def test_poll_of_a_dead_engine_times_out_within_its_bound():
    table, clock = table_for("http://10.255.255.1:9"), Clock()  # unroutable: connect hangs
    poller = EngineMetricsPoller(table, interval=1.0, timeout=0.2, clock=clock)
    async with aiohttp.ClientSession() as client:
        started = time.monotonic()
        await poller.poll_due(client, clock.now)
    assert time.monotonic() - started < 1.0
    assert table.all_routes()[0].state.poll_failures == 1


def test_endpoint_surviving_a_table_update_keeps_in_flight_breaker_and_engine_sample():
    table = RoutingTable(cluster=True)
    table.apply_catalog(snapshot=True, upserts=[Model("m")], removals=[])
    table.apply_endpoints(snapshot=True, upserts=[Endpoint("a", "m", "http://a")], removals=[])
    state = table.state("a")
    state.in_flight, state.consecutive_failures, state.open_until = 2, 3, 55.0
    state.engine = EngineSample("http://a", 1.0, 2.0, 2, 10.0)
    state.poll_failures, state.next_poll = 1, 12.0
    table.apply_endpoints(
        snapshot=True,
        upserts=[Endpoint("a", "m", "http://a", weight=5, priority=1), Endpoint("b", "m", "http://b")],
        removals=[],
    )
    kept = table.state("a")
    assert kept is state
    assert (kept.in_flight, kept.consecutive_failures, kept.open_until) == (2, 3, 55.0)
    assert kept.engine == EngineSample("http://a", 1.0, 2.0, 2, 10.0)
    assert (kept.poll_failures, kept.next_poll) == (1, 12.0)
    assert {r.endpoint.id: r.endpoint.weight for r in table.all_routes()} == {"a": 5, "b": 1}


async def test_router_steers_away_from_an_engine_whose_queue_is_full_of_other_clients():
    busy_settings = SimulatorSettings(ttft_ms=5000, itl_ms=1, output_tokens=2, max_num_seqs=1)
    idle_settings = SimulatorSettings(ttft_ms=1, itl_ms=1, output_tokens=2)
    async with (
        SimulatorServer(busy_settings) as busy,
        SimulatorServer(idle_settings) as idle,
        aiohttp.ClientSession() as client,
    ):
        # Another client loads `busy` directly: one running, one waiting.
        body = {"model": "simulated-model", "prompt": "hello", "stream": True}
        held = [asyncio.create_task(client.post(busy.url + "/v1/completions", json=body)) for _ in range(2)]
        config = RouterConfig(
            listen="127.0.0.1:0",
            backends=[
                Backend(model="m", url=busy.url, served_name="simulated-model"),
                Backend(model="m", url=idle.url, served_name="simulated-model"),
            ],
            balancing=Balancing(engine_metrics_interval_seconds=0.05),
        )
        try:
            async with router(config) as r:
                await wait_for(
                    lambda: (s := r.table.state("static:m:0").engine) is not None and s.waiting >= 1
                )
                long_prompt = "The same long shared prompt for every request. " * 20
                for prompt in ("hi", long_prompt, long_prompt):
                    request = {"model": "m", "prompt": prompt, "max_tokens": 2}
                    async with client.post(r.url + "/v1/completions", json=request) as resp:
                        assert resp.status == 200
                        assert resp.headers["x-llmgw-replica"] == "static:m:1"
        finally:
            for task in held:
                task.cancel()
            with contextlib.suppress(Exception):
                await asyncio.gather(*held, return_exceptions=True)
