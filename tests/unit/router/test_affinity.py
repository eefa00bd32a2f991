"""Affinity keys (what goes together) and bounded-load consistent hashing (where it goes)."""

from __future__ import annotations

import contextlib
import random
from collections import Counter

import aiohttp

from llmgw.router.affinity import key_for
from llmgw.router.balancer import Balancer
from llmgw.router.breaker import Breaker
from llmgw.router.config import Backend, Balancing, RouterConfig
from llmgw.router.table import Endpoint, EndpointState, Route

from .engines import FakeEngine
from .helpers import router

CHAT = "/v1/chat/completions"
SYSTEM = "You are a careful assistant for the llmgw project. " * 20  # ~1000 chars


def key(path: str, body: dict, headers: dict | None = None) -> int | None:
    return key_for(512, 64, path, headers or {}, body)


def chat(*contents: str, system: str = SYSTEM) -> dict:
    roles = ["user", "assistant"]
    messages = [{"role": "system", "content": system}] if system else []
    messages += [{"role": roles[i % 2], "content": c} for i, c in enumerate(contents)]
    return {"model": "m", "messages": messages}


def test_turns_of_one_conversation_share_a_key():
    question = "What is a replica, and how does the router choose one?"
    first = key(CHAT, chat(question, system="Short system prompt."))
    second = key(CHAT, chat(question, "A running engine.", "And an endpoint?", system="Short system prompt."))
    later = key(CHAT, chat(question, "A running engine.", "And an endpoint? " * 40, "Yes.", "More?"))
    # The opening (system prompt + first question) is the same in every turn.
    assert first is not None and first == second
    assert later == key(CHAT, chat(question))


def test_conversations_under_a_short_system_prompt_get_their_own_keys():
    one = key(CHAT, chat("First conversation, asking about the balancer in detail.", system="Be brief."))
    two = key(CHAT, chat("Second conversation, asking about the breaker in detail.", system="Be brief."))
    assert one is not None and two is not None and one != two


def test_conversations_under_one_long_system_prompt_share_a_key():
    assert key(CHAT, chat("question one")) == key(CHAT, chat("a different question"))


def test_different_system_prompts_get_different_keys():
    assert key(CHAT, chat("q")) != key(CHAT, chat("q", system="Another long prompt. " * 40))


def test_short_prompts_get_no_key():
    assert key(CHAT, chat("hi", system="")) is None
    assert key("/v1/completions", {"prompt": "hello"}) is None
    assert key(CHAT, {"model": "m"}) is None


def test_session_header_then_user_field_pin_whatever_the_content():
    a = key(CHAT, chat("one"), {"x-session-id": "conv-1"})
    b = key(CHAT, chat("two", system="other " * 50), {"x-session-id": "conv-1"})
    assert a == b
    assert key(CHAT, {**chat("x"), "user": "u1"}) == key(CHAT, {**chat("y", system="z" * 90), "user": "u1"})
    assert key(CHAT, chat("one"), {"x-session-id": "conv-2"}) != a


def test_completion_prompts_key_on_their_head():
    long = "Context: " + "lorem ipsum " * 100
    assert key("/v1/completions", {"prompt": long + "Q1"}) == key(
        "/v1/completions", {"prompt": [long + "Q2"]}
    )
    ids = list(range(200))
    assert key("/v1/completions", {"prompt": ids}) == key("/v1/completions", {"prompt": ids + [7]})
    assert key("/v1/completions", {"prompt": ids[:10]}) is None


def test_embeddings_and_odd_bodies_get_no_key():
    assert key("/v1/embeddings", {"input": "x" * 1000}) is None
    assert key(CHAT, {"messages": "not a list"}) is None
    assert key(CHAT, {"messages": ["not an object"] * 3}) is None


def routes(n: int, weights: tuple[int, ...] = ()) -> list[Route]:
    return [
        Route(Endpoint(f"e{i}", "m", f"http://e{i}", weight=weights[i] if weights else 1), EndpointState())
        for i in range(n)
    ]


def affine(**settings: object) -> Balancer:
    return Balancer("affinity", Balancing(**settings), Breaker(3, 5.0), random.Random(1), lambda: 100.0)


def test_one_key_goes_to_one_replica_while_it_has_room():
    b, rs = affine(), tuple(routes(4))
    k = key(CHAT, chat("q"))
    assert len({b.pick(rs, (), k).endpoint.id for _ in range(50)}) == 1


def test_keys_spread_over_replicas():
    b, rs = affine(), tuple(routes(4))
    homes = Counter(
        b.pick(rs, (), key(CHAT, chat("q", system=f"prompt {i} " * 30))).endpoint.id for i in range(400)
    )
    assert set(homes) == {"e0", "e1", "e2", "e3"}
    assert min(homes.values()) > 40


def test_a_hot_key_overflows_at_c_times_the_average_and_the_home_stays_first():
    b, rs = affine(load_factor=1.25), tuple(routes(4))
    k = key(CHAT, chat("hot"))
    home = b.pick(rs, (), k)
    placed = Counter()
    for _ in range(40):
        chosen = b.pick(rs, (), k)
        chosen.state.in_flight += 1
        placed[chosen.endpoint.id] += 1
    total = sum(placed.values())
    # No replica holds more than ceil(1.25 * total / 4); the overflow went to others.
    assert max(placed.values()) <= -(-125 * total // 400)
    assert placed[home.endpoint.id] == max(placed.values())
    assert len(placed) > 1
    for r in rs:
        r.state.in_flight = 0
    assert b.pick(rs, (), k) is home


def test_removing_a_replica_moves_only_its_keys():
    b = affine()
    four = tuple(routes(4))
    keys = [key(CHAT, chat("q", system=f"prompt {i} " * 30)) for i in range(300)]
    before = {k: b.pick(four, (), k).endpoint.id for k in keys}
    three = tuple(r for r in four if r.endpoint.id != "e3")
    after = {k: b.pick(three, (), k).endpoint.id for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == "e3" for k in moved)


def test_an_excluded_home_hands_the_key_to_the_next_replica_on_the_ring():
    b, rs = affine(), tuple(routes(4))
    k = key(CHAT, chat("q"))
    home = b.pick(rs, (), k).endpoint.id
    second = b.pick(rs, {home}, k).endpoint.id
    assert second != home
    assert {b.pick(rs, {home}, k).endpoint.id for _ in range(20)} == {second}


def test_weight_gives_a_replica_a_larger_share_of_keys():
    b, rs = affine(), tuple(routes(2, weights=(3, 1)))
    homes = Counter(
        b.pick(rs, (), key(CHAT, chat("q", system=f"p{i} " * 40))).endpoint.id for i in range(600)
    )
    assert 2.0 < homes["e0"] / homes["e1"] < 4.5


def test_request_without_key_is_balanced_on_load():
    b, rs = affine(), tuple(routes(2))
    rs[0].state.in_flight = 3
    assert b.pick(rs, (), None).endpoint.id == "e1"


async def test_through_a_router_a_shared_prefix_and_a_session_each_stay_on_one_replica():
    async with contextlib.AsyncExitStack() as stack:
        engines = [await stack.enter_async_context(FakeEngine(name=f"e{i}")) for i in range(4)]
        config = RouterConfig(
            listen="127.0.0.1:0",
            backends=[Backend(model="m", url=e.url) for e in engines],
            balancing=Balancing(engine_metrics_interval_seconds=0),
        )
        r = await stack.enter_async_context(router(config))
        client = await stack.enter_async_context(aiohttp.ClientSession())

        async def replica(body: dict, headers: dict | None = None) -> str:
            async with client.post(r.url + CHAT, json=body, headers=headers or {}) as resp:
                assert resp.status == 200
                return resp.headers["x-llmgw-replica"]

        shared = {await replica(chat(f"question {i}")) for i in range(12)}
        assert len(shared) == 1
        pinned = {
            await replica(chat(f"q{i}", system=f"other prompt {i} " * 30), {"x-session-id": "conv-9"})
            for i in range(12)
        }
        assert len(pinned) == 1
        spread = {await replica(chat("q", system=f"prompt {i} " * 30)) for i in range(40)}
        assert len(spread) > 1


async def test_round_robin_setting_rotates_through_a_router():
    async with contextlib.AsyncExitStack() as stack:
        engines = [await stack.enter_async_context(FakeEngine(name=f"e{i}")) for i in range(3)]
        config = RouterConfig(
            listen="127.0.0.1:0",
            backends=[Backend(model="m", url=e.url) for e in engines],
            balancer="round-robin",
        )
        r = await stack.enter_async_context(router(config))
        client = await stack.enter_async_context(aiohttp.ClientSession())
        seen = []
        for _ in range(6):
            async with client.post(r.url + CHAT, json=chat("same prompt")) as resp:
                seen.append(resp.headers["x-llmgw-replica"])
        assert seen == ["static:m:0", "static:m:1", "static:m:2"] * 2
