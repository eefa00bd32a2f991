"""Prefill cost per uncached prompt token, and a vLLM-like prefix cache of 16-token blocks."""

from __future__ import annotations

import time

from llmgw.agent.simulator.main import parse_settings
from llmgw.agent.simulator.prefixcache import PrefixCache, block_hashes
from llmgw.agent.simulator.tokens import tokenize

from .support import openai_client, scrape


def words(n: int, start: int = 0) -> list[str]:
    return [f"w{i}" for i in range(start, start + n)]


def test_only_full_blocks_are_hashed_and_each_hash_chains_its_prefix():
    assert len(block_hashes(words(47), 16)) == 2
    a = block_hashes(words(32), 16)
    b = block_hashes(words(16, start=100) + words(16, start=16), 16)
    assert a[1] != b[1]  # same second block, different first block: no hit


def test_lookup_counts_leading_hits_and_always_leaves_one_token_to_compute():
    cache = PrefixCache(capacity=100)
    hashes = block_hashes(words(48), 16)
    assert cache.lookup(hashes, 48) == 0
    cache.store(hashes[:2])
    assert cache.lookup(hashes, 48) == 32
    cache.store(hashes)
    assert cache.lookup(hashes, 48) == 47
    other = block_hashes(words(16, start=500) + words(32, start=16), 16)
    assert cache.lookup(other, 48) == 0


def test_least_recently_used_blocks_are_evicted_first():
    cache = PrefixCache(capacity=2)
    x, y, z = (block_hashes(words(16, start=s), 16) for s in (0, 100, 200))
    cache.store(x)
    cache.store(y)
    assert cache.lookup(x, 99) == 16  # refreshes x
    cache.store(z)  # evicts y
    assert len(cache) == 2
    assert cache.lookup(y, 99) == 0 and cache.lookup(x, 99) == 16 and cache.lookup(z, 99) == 16


def test_capacity_zero_caches_nothing():
    cache = PrefixCache(capacity=0)
    hashes = block_hashes(words(32), 16)
    cache.store(hashes)
    assert cache.lookup(hashes, 32) == 0


async def ttft(client, **request) -> float:
    started = time.monotonic()
    stream = await client.completions.create(model="simulated-model", stream=True, **request)
    async for _ in stream:
        elapsed = time.monotonic() - started
        break
    async for _ in stream:
        pass
    return elapsed


async def test_a_repeated_prompt_skips_the_prefill_of_its_cached_blocks(start_simulator, http):
    sim = await start_simulator(ttft_ms=1, prefill_us_per_token=2000, output_tokens=2)
    prompt = " ".join(words(160))  # 160 tokens: 0.32 s of prefill when uncached
    async with openai_client(sim) as client:
        cold = await ttft(client, prompt=prompt)
        warm = await ttft(client, prompt=prompt)
        other = await ttft(client, prompt=" ".join(words(160, start=1000)))
    assert cold > 0.30 and other > 0.30
    assert warm < 0.15
    m = await scrape(http, sim)
    assert m[("vllm:prefix_cache_queries_total", "")] == 480
    assert m[("vllm:prefix_cache_hits_total", "")] == 159


async def test_the_next_turn_of_a_chat_hits_the_previous_prompt_and_answer(start_simulator, http):
    sim = await start_simulator(output_tokens=40, prefix_cache_blocks=1000)
    system = {"role": "system", "content": " ".join(words(100))}
    first = [system, {"role": "user", "content": "first question"}]
    async with openai_client(sim) as client:
        reply = await client.chat.completions.create(model="simulated-model", messages=first)
        answer = reply.choices[0].message.content
        before = await scrape(http, sim)
        turn = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "next"}]
        await client.chat.completions.create(model="simulated-model", messages=turn)
    after = await scrape(http, sim)
    hits = after[("vllm:prefix_cache_hits_total", "")] - before[("vllm:prefix_cache_hits_total", "")]
    # The first request's prompt rendering plus its 40 generated tokens, in whole blocks.
    rendered = len(tokenize("system: " + system["content"] + "\nuser: first question")) + 2 + 40
    assert hits == (rendered // 16) * 16
    assert hits > 112  # more than the first prompt alone could give


async def test_without_prefill_cost_timing_is_unchanged(start_simulator):
    sim = await start_simulator(ttft_ms=1, output_tokens=2)
    async with openai_client(sim) as client:
        assert await ttft(client, prompt=" ".join(words(2000))) < 0.2


def test_cli_flags_set_prefill_cost_and_cache_size():
    settings, _ = parse_settings(
        ["--port", "0", "--prefill-us-per-token", "25", "--prefix-cache-blocks", "0", "--block-size", "32"]
    )
    assert (settings.prefill_us_per_token, settings.prefix_cache_blocks, settings.block_size) == (25.0, 0, 32)
    defaults, _ = parse_settings(["--port", "0"])
    assert (defaults.prefill_us_per_token, defaults.prefix_cache_blocks, defaults.block_size) == (
        0.0,
        4096,
        16,
    )
