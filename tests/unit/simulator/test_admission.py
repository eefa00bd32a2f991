"""Sequence slots seen from outside: queueing, disconnects, time to first token."""

from __future__ import annotations

import asyncio
import contextlib
import time

import aiohttp

from .support import openai_client, scrape, wait_for_metrics

RUNNING = ("vllm:num_requests_running", "")
WAITING = ("vllm:num_requests_waiting", "")
ABORTED = ("vllm:request_success_total", "abort")
CHAT = {"model": "simulated-model", "messages": [{"role": "user", "content": "hi"}]}


async def test_requests_beyond_max_num_seqs_wait_and_show_as_waiting(start_simulator, http):
    sim = await start_simulator(max_num_seqs=1, ttft_ms=300, output_tokens=2)
    async with openai_client(sim) as client:
        requests = [asyncio.create_task(client.chat.completions.create(**CHAT)) for _ in range(3)]
        try:
            await wait_for_metrics(http, sim, lambda m: (m[RUNNING], m[WAITING]) == (1, 2))
            replies = await asyncio.gather(*requests)
        finally:
            for r in requests:
                r.cancel()
            await asyncio.gather(*requests, return_exceptions=True)
    assert [r.usage.completion_tokens for r in replies] == [2, 2, 2]
    after = await scrape(http, sim)
    assert (after[RUNNING], after[WAITING]) == (0, 0)
    assert after[("vllm:request_success_total", "stop")] == 3


async def test_client_disconnect_mid_stream_frees_the_slot_for_the_next_request(start_simulator, http):
    # One slot, and a stream that would run for ~20 s if nobody hung up.
    sim = await start_simulator(max_num_seqs=1, itl_ms=20, output_tokens=1000)
    body = {**CHAT, "stream": True}
    resp = await http.post(sim.url + "/v1/chat/completions", json=body)
    try:
        assert resp.status == 200
        await resp.content.readline()  # the first event: the stream is running
        assert (await scrape(http, sim))[RUNNING] == 1
    finally:
        resp.close()  # hang up mid-stream

    freed = await wait_for_metrics(http, sim, lambda m: m[RUNNING] == 0 and m[ABORTED] == 1)
    assert freed[("vllm:kv_cache_usage_perc", "")] == 0

    async with openai_client(sim) as client:
        reply = await asyncio.wait_for(client.chat.completions.create(**CHAT, max_tokens=2), timeout=5)
    assert reply.usage.completion_tokens == 2


async def test_first_token_takes_at_least_ttft_ms(start_simulator):
    sim = await start_simulator(ttft_ms=200, itl_ms=1, output_tokens=2)
    async with openai_client(sim) as client:
        started = time.monotonic()
        stream = await client.chat.completions.create(**CHAT, stream=True)
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first_token_after = time.monotonic() - started
                break
        await stream.close()
    assert first_token_after >= 0.2


async def test_queued_request_waits_for_the_slot_before_its_ttft(start_simulator):
    # With one slot, the second request's first token comes after the first
    # request's whole run plus its own TTFT: timing starts at arrival.
    sim = await start_simulator(max_num_seqs=1, ttft_ms=150, itl_ms=1, output_tokens=2)
    async with openai_client(sim) as client:
        started = time.monotonic()
        await asyncio.gather(*(client.chat.completions.create(**CHAT) for _ in range(2)))
        elapsed = time.monotonic() - started
    assert elapsed >= 0.3


async def test_client_that_gives_up_during_ttft_frees_its_slot_at_once(start_simulator, http):
    # Nothing is written during a 10 s TTFT, so only handler cancellation can
    # notice the hang-up: this fails if handler_cancellation is off.
    sim = await start_simulator(max_num_seqs=1, ttft_ms=10_000)
    with contextlib.suppress(TimeoutError):
        await http.post(sim.url + "/v1/chat/completions", json=CHAT, timeout=aiohttp.ClientTimeout(total=0.3))
    await wait_for_metrics(http, sim, lambda m: m[RUNNING] == 0 and m[ABORTED] == 1, within_s=3)


async def test_client_that_gives_up_while_queued_leaves_the_queue(start_simulator, http):
    sim = await start_simulator(max_num_seqs=1, ttft_ms=10_000)
    holder = asyncio.create_task(http.post(sim.url + "/v1/chat/completions", json=CHAT))
    try:
        await wait_for_metrics(http, sim, lambda m: m[RUNNING] == 1)
        with contextlib.suppress(TimeoutError):
            await http.post(
                sim.url + "/v1/chat/completions", json=CHAT, timeout=aiohttp.ClientTimeout(total=0.3)
            )
        await wait_for_metrics(http, sim, lambda m: (m[RUNNING], m[WAITING]) == (1, 0), within_s=3)
    finally:
        holder.cancel()
        await asyncio.gather(holder, return_exceptions=True)
