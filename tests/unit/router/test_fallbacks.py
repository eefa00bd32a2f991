"""Fallbacks and canaries: a real router in front of real (fake) engines on port 0."""

from __future__ import annotations

import asyncio
import random

import aiohttp
import openai

from llmgw.router.config import Backend, Balancing, CanarySpec, Limits, RouterConfig, StaticModel
from llmgw.router.fallbacks import Planner
from llmgw.router.table import Canary, Endpoint, Model, RoutingTable

from .engines import FakeEngine
from .helpers import router

CHAT = "/v1/chat/completions"


def config(*backends: Backend, models: list[StaticModel], **settings: object) -> RouterConfig:
    return RouterConfig(listen="127.0.0.1:0", backends=list(backends), models=models, **settings)


async def metric(client: aiohttp.ClientSession, url: str, series: str) -> float:
    text = await (await client.get(url + "/metrics")).text()
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{series} not exposed")


async def test_model_without_replicas_answers_through_its_fallback_and_says_which():
    models = [StaticModel(name="big", aliases=["b"], fallbacks=["small"])]
    async with (
        FakeEngine(name="small-engine") as small,
        router(config(Backend(model="small", url=small.url, served_name="org/small-1b"), models=models)) as r,
        aiohttp.ClientSession() as client,
    ):
        async with client.post(r.url + CHAT, json={"model": "b", "messages": []}) as resp:
            assert resp.status == 200
            assert resp.headers["x-llmgw-model"] == "small"
            body = await resp.json()
        # The model field is the answering engine's own name for what answered.
        assert body["model"] == "org/small-1b"
        assert body["engine"] == "small-engine"
        series = 'llmgw_router_fallbacks_total{fallback="small",model="big"}'
        assert await metric(client, r.url, series) == 1.0


async def test_fallback_answers_once_every_primary_replica_failed_and_then_while_its_breaker_is_open():
    models = [StaticModel(name="big", fallbacks=["small"])]
    limits = Limits(retries=1, breaker_failures=2, breaker_cooldown_seconds=60)
    async with (
        FakeEngine(name="big-a", fail_status=503) as big_a,
        FakeEngine(name="big-b", fail_status=503) as big_b,
        FakeEngine(name="small") as small,
        router(
            config(
                Backend(model="big", url=big_a.url),
                Backend(model="big", url=big_b.url),
                Backend(model="small", url=small.url),
                models=models,
                limits=limits,
            )
        ) as r,
    ):
        client = openai.AsyncOpenAI(base_url=r.url + "/v1", api_key="unused", max_retries=0)
        # Both replicas fail before the first byte: the fallback answers, the client sees no error.
        for _ in range(2):
            answer = await client.chat.completions.with_raw_response.create(model="big", messages=[])
            assert answer.headers["x-llmgw-model"] == "small"
        assert (len(big_a.seen), len(big_b.seen)) == (2, 2)
        # Both breakers are open now: big has no capacity and is not even tried.
        answer = await client.chat.completions.with_raw_response.create(model="big", messages=[])
        assert answer.headers["x-llmgw-model"] == "small"
        assert (len(big_a.seen), len(big_b.seen)) == (2, 2)
        assert len(small.seen) == 3
        await client.close()


async def test_saturated_model_spills_to_its_fallback_and_the_fallbacks_fallback_in_order():
    models = [
        StaticModel(name="big", fallbacks=["mid"]),
        StaticModel(name="mid", fallbacks=["small"]),
    ]
    settings = dict(balancing=Balancing(saturation_in_flight=1, engine_metrics_interval_seconds=0))
    async with (
        FakeEngine(name="big", mode="stream") as big,
        FakeEngine(name="mid", mode="stream") as mid,
        FakeEngine(name="small") as small,
        router(
            config(
                Backend(model="big", url=big.url),
                Backend(model="mid", url=mid.url),
                Backend(model="small", url=small.url),
                models=models,
                **settings,
            )
        ) as r,
        aiohttp.ClientSession() as client,
    ):
        held_big = await client.post(r.url + CHAT, json={"model": "big", "stream": True})
        assert held_big.headers["x-llmgw-model"] == "big"
        await held_big.content.readline()
        held_mid = await client.post(r.url + CHAT, json={"model": "big", "stream": True})
        assert held_mid.headers["x-llmgw-model"] == "mid"
        await held_mid.content.readline()
        async with client.post(r.url + CHAT, json={"model": "big"}) as resp:
            assert resp.status == 200
            assert resp.headers["x-llmgw-model"] == "small"
        big.release.set()
        mid.release.set()
        assert b"[DONE]" in await held_big.content.read()
        assert b"[DONE]" in await held_mid.content.read()
        held_big.close()
        held_mid.close()
        assert await metric(client, r.url, 'llmgw_router_fallbacks_total{fallback="mid",model="big"}') == 1
        assert await metric(client, r.url, 'llmgw_router_fallbacks_total{fallback="small",model="big"}') == 1


async def test_no_route_anywhere_in_the_chain_is_a_503_for_the_model_asked_for():
    models = [StaticModel(name="big", fallbacks=["ghost"]), StaticModel(name="ghost")]
    async with (
        FakeEngine() as other,
        router(config(Backend(model="other", url=other.url), models=models)) as r,
        aiohttp.ClientSession() as client,
        client.post(r.url + CHAT, json={"model": "big"}) as resp,
    ):
        assert resp.status == 503
        assert "Retry-After" in resp.headers
        assert "'big'" in (await resp.json())["error"]["message"]


async def test_canary_takes_about_its_percent_of_requests_and_metrics_count_them():
    models = [StaticModel(name="m", canary=CanarySpec(model="m-next", percent=25))]
    async with (
        FakeEngine(name="stable") as stable,
        FakeEngine(name="candidate") as candidate,
        router(
            config(
                Backend(model="m", url=stable.url),
                Backend(model="m-next", url=candidate.url),
                models=models,
            )
        ) as r,
        aiohttp.ClientSession() as client,
    ):
        answered: dict[str, int] = {}
        for _ in range(200):
            async with client.post(r.url + CHAT, json={"model": "m"}) as resp:
                assert resp.status == 200
                name = resp.headers["x-llmgw-model"]
                answered[name] = answered.get(name, 0) + 1
        # Seeded draws: the split is repeatable; the bound is wide enough for any seed.
        assert 25 <= answered["m-next"] <= 75, answered
        assert answered["m-next"] + answered["m"] == 200
        series = 'llmgw_router_canary_requests_total{candidate="m-next",model="m"}'
        assert await metric(client, r.url, series) == answered["m-next"]


async def test_models_endpoint_lists_declared_models_with_aliases_even_without_backends():
    models = [StaticModel(name="big", aliases=["b"], owned_by="team", fallbacks=["small"])]
    async with (
        FakeEngine() as small,
        router(config(Backend(model="small", url=small.url), models=models)) as r,
        aiohttp.ClientSession() as client,
        client.get(r.url + "/v1/models") as resp,
    ):
        listed = {m["id"]: m for m in (await resp.json())["data"]}
        assert set(listed) == {"big", "small"}
        assert listed["big"]["aliases"] == ["b"]
        assert listed["big"]["owned_by"] == "team"


class _Capacity:
    def __init__(self, full: set[str]) -> None:
        self.full = full

    def has_capacity(self, routes) -> bool:
        return routes[0].endpoint.model not in self.full


def test_plan_puts_models_with_capacity_first_then_those_that_can_queue_each_once():
    table = RoutingTable()
    table.apply_catalog(
        snapshot=True,
        upserts=[
            Model("a", fallbacks=("b", "c-alias")),
            Model("b", fallbacks=("c", "a")),
            Model("c", aliases=("c-alias",)),
            Model("d", canary=Canary("c", 100), fallbacks=("c",)),
        ],
        removals=[],
    )
    table.apply_endpoints(
        snapshot=True,
        upserts=[Endpoint(f"{m}1", m, "http://e") for m in "abcd"],
        removals=[],
    )
    capacity = _Capacity(full={"a", "b"})
    planner = Planner(table, capacity, random.Random(1))
    assert [(t.model.name, t.via) for t in planner.plan(table.resolve("a"))] == [
        ("c", "fallback"),
        ("a", ""),
        ("b", "fallback"),
    ]
    # A canary drawn and with capacity comes first, and is not repeated as a fallback.
    assert [(t.model.name, t.via) for t in planner.plan(table.resolve("d"))] == [("c", "canary"), ("d", "")]
    capacity.full = {"c"}
    assert [(t.model.name, t.via) for t in planner.plan(table.resolve("d"))] == [("d", ""), ("c", "fallback")]


async def test_concurrent_fallbacks_do_not_leak_in_flight_counts():
    models = [StaticModel(name="big", fallbacks=["small"])]
    async with (
        FakeEngine(name="small") as small,
        router(config(Backend(model="small", url=small.url), models=models)) as r,
        aiohttp.ClientSession() as client,
    ):

        async def one() -> int:
            async with client.post(r.url + CHAT, json={"model": "big"}) as resp:
                return resp.status

        assert await asyncio.gather(*(one() for _ in range(20))) == [200] * 20
        assert all(route.state.in_flight == 0 for route in r.table.all_routes())


async def test_canary_keeps_a_conversation_on_one_model_and_spreads_conversations_by_percent():
    models = [StaticModel(name="m", canary=CanarySpec(model="m-next", percent=30))]
    async with (
        FakeEngine(name="stable") as stable,
        FakeEngine(name="candidate") as candidate,
        router(
            config(
                Backend(model="m", url=stable.url),
                Backend(model="m-next", url=candidate.url),
                models=models,
            )
        ) as r,
        aiohttp.ClientSession() as client,
    ):
        chosen: dict[str, set[str]] = {}
        for session in range(100):
            for _turn in range(3):
                headers = {"x-session-id": f"conversation-{session}"}
                async with client.post(r.url + CHAT, json={"model": "m"}, headers=headers) as resp:
                    chosen.setdefault(f"{session}", set()).add(resp.headers["x-llmgw-model"])
        # Every turn of a conversation went to the same model ...
        assert all(len(models) == 1 for models in chosen.values())
        # ... and about 30% of conversations went to the candidate.
        on_candidate = sum(models == {"m-next"} for models in chosen.values())
        assert 12 <= on_candidate <= 50, on_candidate
