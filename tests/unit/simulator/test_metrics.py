"""/metrics: vLLM's names, labelled with the primary served name, from zero."""

from __future__ import annotations

import asyncio
import contextlib

from prometheus_client.parser import text_string_to_metric_families

from .support import openai_client, scrape, wait_for_metrics

REQUIRED = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
}


async def test_fresh_simulator_exposes_every_vllm_metric_at_zero_for_the_primary_name(start_simulator, http):
    sim = await start_simulator(served_model_names=("primary", "alias"))
    async with http.get(sim.url + "/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        families = {f.name: f for f in text_string_to_metric_families(await resp.text())}
    for name, kind in REQUIRED.items():
        assert families[name].type == kind, name
        for sample in families[name].samples:
            assert sample.labels["model_name"] == "primary", sample
            if not sample.name.endswith("_created"):
                assert sample.value == 0, sample
    reasons = {s.labels["finished_reason"] for s in families["vllm:request_success"].samples}
    assert {"stop", "length", "abort"} <= reasons


async def test_counters_and_histograms_count_a_finished_request(start_simulator, http):
    sim = await start_simulator(output_tokens=5, ttft_ms=20)
    async with openai_client(sim) as client:
        await client.completions.create(model="simulated-model", prompt="one two three")
        await client.completions.create(model="simulated-model", prompt="four", max_tokens=2)
    m = await scrape(http, sim)
    assert m[("vllm:prompt_tokens_total", "")] == 4
    assert m[("vllm:generation_tokens_total", "")] == 7
    assert m[("vllm:request_success_total", "stop")] == 1
    assert m[("vllm:request_success_total", "length")] == 1
    assert m[("vllm:time_to_first_token_seconds_count", "")] == 2
    assert m[("vllm:time_to_first_token_seconds_sum", "")] >= 0.04
    assert m[("vllm:e2e_request_latency_seconds_count", "")] == 2


async def test_kv_cache_usage_counts_tokens_held_by_running_sequences(start_simulator, http):
    # 2 slots x 100 tokens of context = 200; one running request holding its
    # 10 prompt tokens plus at least its first token is over 5 percent.
    sim = await start_simulator(max_num_seqs=2, max_model_len=100, itl_ms=50, output_tokens=20)
    async with openai_client(sim) as client:
        task = asyncio.create_task(
            client.chat.completions.create(
                model="simulated-model", messages=[{"role": "user", "content": "Hello, world!"}]
            )
        )
        try:
            m = await wait_for_metrics(http, sim, lambda m: m[("vllm:kv_cache_usage_perc", "")] > 0.05)
            assert m[("vllm:kv_cache_usage_perc", "")] <= (10 + 20) / 200
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
