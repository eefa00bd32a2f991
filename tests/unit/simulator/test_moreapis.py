"""The simulator's other APIs called directly: deterministic rerank and score, tokenize round
trips, the Responses API's typed events in order, Anthropic's event stream, count_tokens."""

from __future__ import annotations

import json

from llmgw.agent.simulator.tokens import VOCABULARY


async def _post(http, sim, path: str, body: dict) -> dict:
    async with http.post(sim.url + path, json=body) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


def _events(raw: bytes) -> list[tuple[str, dict]]:
    out = []
    for block in raw.decode().strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


async def test_rerank_and_score_are_deterministic_and_agree(start_simulator, http):
    sim = await start_simulator()
    body = {"query": "cats", "documents": ["dogs", "cats", "birds"]}
    first, again = await _post(http, sim, "/v1/rerank", body), await _post(http, sim, "/v2/rerank", body)
    assert first["results"] == again["results"]
    scores = [r["relevance_score"] for r in first["results"]]
    assert scores == sorted(scores, reverse=True)
    top = await _post(http, sim, "/v1/rerank", {**body, "top_n": 1})
    assert top["results"] == first["results"][:1]
    # A text scores highest against itself.
    assert first["results"][0]["document"]["text"] == "cats"
    scored = await _post(http, sim, "/v1/score", {"text_1": "cats", "text_2": ["dogs", "cats", "birds"]})
    assert {d["score"] for d in scored["data"]} == set(scores)


async def test_tokenize_and_detokenize_round_trip_generated_words(start_simulator, http):
    sim = await start_simulator()
    words = " ".join(VOCABULARY[:5])
    tokens = await _post(http, sim, "/tokenize", {"prompt": words})
    assert tokens["tokens"] == [0, 1, 2, 3, 4] and tokens["count"] == 5
    text = await _post(http, sim, "/detokenize", {"tokens": tokens["tokens"]})
    assert text["prompt"] == " " + words


async def test_responses_stream_sends_typed_events_in_order_and_no_done(start_simulator, http):
    sim = await start_simulator(output_tokens=3)
    async with http.post(sim.url + "/v1/responses", json={"input": "hi", "stream": True}) as resp:
        raw = await resp.read()
    events = _events(raw)
    kinds = [k for k, _ in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds.count("response.output_text.delta") == 3
    assert kinds[-1] == "response.completed" and b"[DONE]" not in raw
    assert [e["sequence_number"] for _, e in events] == list(range(len(events)))
    deltas = "".join(e["delta"] for k, e in events if k == "response.output_text.delta")
    assert events[-1][1]["response"]["output"][0]["content"][0]["text"] == deltas


async def test_messages_stream_is_anthropics_event_stream(start_simulator, http):
    sim = await start_simulator(output_tokens=3)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "stream": True}
    async with http.post(sim.url + "/v1/messages", json=body) as resp:
        events = _events(await resp.read())
    kinds = [k for k, _ in events]
    assert kinds == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * 3,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(k == e["type"] for k, e in events)
    assert events[-2][1]["usage"]["output_tokens"] == 3
    counted = await _post(http, sim, "/v1/messages/count_tokens", {"messages": body["messages"]})
    assert counted["input_tokens"] == events[0][1]["message"]["usage"]["input_tokens"]
