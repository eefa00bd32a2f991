"""The other engine APIs through a real cluster, each with the client that speaks it.

etcd, a control plane, an agent running simulator replicas and a router, as
separate processes (``running_cluster``, the way ``llmgw up`` starts them).
The official ``openai`` package calls the Responses API (stream and not;
stored responses retrieved and continued through a second router process)
audio transcription, and a realtime session (a WebSocket),
the official ``anthropic`` package the Messages API (stream and not, and
count_tokens), plain HTTP rerank, score and tokenize. A second model whose
catalog entry serves only ``rerank`` and ``score`` is refused a chat request
with a 400 naming them, from the model document to the router through the
control plane's watch.
"""

from __future__ import annotations

import base64
import io
import json
import urllib.error
import urllib.request
import wave

import anthropic
import openai
import pytest
import websockets
import websockets.sync.client
import yaml

from tests.support.cluster import Cluster, running_cluster, simulator_model
from tests.support.procs import free_port, start, tool, wait_port, write_yaml

pytestmark = pytest.mark.integration

CHAT = "chat"
RERANKER = "reranker"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reranker = {**simulator_model(RERANKER, 1), "apis": ["rerank", "score"]}
    chat = simulator_model(CHAT, 2)
    with running_cluster(tmp_path_factory.mktemp("apis"), [chat, reranker]) as c:
        c.wait(lambda: c.router_endpoints(CHAT) == 2, 90, "both replicas of chat routed")
        c.wait(lambda: c.router_endpoints(RERANKER) == 1, 90, "the reranker routed")
        yield c


@pytest.fixture(scope="module")
def second_router(cluster):
    """Another router process of the same cluster (same config, its own port)."""
    port = free_port()
    config = yaml.safe_load((cluster.state / "router.yaml").read_text())
    path = write_yaml(cluster.state / "router-2.yaml", {**config, "listen": f"127.0.0.1:{port}"})
    proc = start("router-2", [tool("llmgw-router"), "--config", str(path)], cluster.state / "logs")
    try:
        wait_port(port, proc=proc)
        url = f"http://127.0.0.1:{port}"
        cluster.wait(lambda: _ready(url), 60, "the second router has the table")
        yield url
    finally:
        proc.stop()


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/ready", timeout=5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _post(c: Cluster, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        c.router_url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def test_responses_with_the_openai_client(cluster):
    client = cluster.client()
    answer = client.responses.create(model=CHAT, input="Say hello", max_output_tokens=5)
    assert answer.status == "completed"
    assert answer.output_text.strip()
    assert answer.usage is not None and answer.usage.output_tokens == 5

    kinds, deltas, completed = [], [], None
    with client.responses.create(model=CHAT, input="Say hello", max_output_tokens=5, stream=True) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            elif event.type == "response.completed":
                completed = event.response
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert len(deltas) == 5
    assert completed is not None and completed.output_text == "".join(deltas)


def test_stored_responses_are_retrieved_and_continued_through_any_router(cluster, second_router):
    client = cluster.client()
    elsewhere = openai.OpenAI(base_url=second_router + "/v1", api_key="unused", max_retries=0, timeout=30)
    made, replicas = [], set()
    # Until both replicas stored some (ties are broken at random): each id must find its own.
    while len(replicas) < 2 and len(made) < 64:
        raw = client.responses.with_raw_response.create(model=CHAT, input="Say it", max_output_tokens=3)
        replicas.add(raw.headers["x-llmgw-replica"])
        made.append(raw.parse())
    assert len(replicas) == 2
    for answer in made:
        for c in (client, elsewhere):
            stored = c.responses.retrieve(answer.id)
            assert (stored.id, stored.output_text) == (answer.id, answer.output_text)
        follow = elsewhere.responses.create(
            model=CHAT, input="and then?", previous_response_id=answer.id, max_output_tokens=3
        )
        assert follow.id != answer.id and follow.output_text.strip()
        assert client.responses.retrieve(follow.id).output_text == follow.output_text
    with pytest.raises(openai.NotFoundError):
        elsewhere.responses.retrieve("resp_forged")


def test_messages_with_the_anthropic_client(cluster):
    client = anthropic.Anthropic(base_url=cluster.router_url, api_key="unused", max_retries=0, timeout=30)
    messages = [{"role": "user", "content": "Hello, world!"}]
    message = client.messages.create(model=CHAT, max_tokens=6, messages=messages)
    assert message.role == "assistant"
    assert message.content[0].text.strip()
    assert message.usage.output_tokens == 6
    assert message.stop_reason == "max_tokens"

    with client.messages.stream(model=CHAT, max_tokens=6, messages=messages) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text.strip() and final.content[0].text == text
    assert final.usage.output_tokens == 6

    counted = client.messages.count_tokens(model=CHAT, messages=messages)
    assert counted.input_tokens > 0


def test_audio_transcription_with_the_openai_client(cluster):
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\0\0" * 800)
    audio = out.getvalue()
    text = cluster.client().audio.transcriptions.create(model=CHAT, file=("hello.wav", audio))
    assert text.text == f"The simulated transcription of {len(audio)} bytes of audio."


def test_a_realtime_session_with_the_openai_client(cluster):
    audio = b"\x01\x00" * 1600
    client = cluster.client()
    with client.realtime.connect(model=CHAT) as conn:
        assert json.loads(conn.recv_bytes())["type"] == "session.created"
        conn.send({"type": "session.update", "session": {"type": "transcription", "model": CHAT}})
        conn.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(audio).decode()})
        conn.send({"type": "input_audio_buffer.commit"})
        deltas = []
        while (event := json.loads(conn.recv_bytes()))["type"] == "transcription.delta":
            deltas.append(event["delta"])
    assert event["type"] == "transcription.done", event
    assert event["text"] == "".join(deltas) == f"The simulated transcription of {len(audio)} bytes of audio."
    # The reranker does not list the realtime API: refused before any engine is asked.
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        with client.realtime.connect(model=RERANKER) as conn:
            conn.recv_bytes()
    assert refused.value.response.status_code == 400


def test_a_realtime_session_naming_its_model_in_session_update_as_vllm_clients_do(cluster):
    audio = b"\x01\x00" * 800
    url = cluster.router_url.replace("http", "ws", 1) + "/v1/realtime"
    with websockets.sync.client.connect(url, open_timeout=30) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
        ws.send(json.dumps({"type": "session.update", "model": CHAT}))
        ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(audio).decode()}))
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        while (event := json.loads(ws.recv(timeout=30)))["type"] == "transcription.delta":
            pass
    assert event["type"] == "transcription.done", event
    assert event["text"] == f"The simulated transcription of {len(audio)} bytes of audio."


def test_rerank_score_and_tokenize_over_plain_http(cluster):
    status, ranked = _post(
        cluster, "/v1/rerank", {"model": RERANKER, "query": "cats", "documents": ["dogs", "cats", "birds"]}
    )
    assert status == 200
    scores = [r["relevance_score"] for r in ranked["results"]]
    assert scores == sorted(scores, reverse=True) and len(scores) == 3
    # Deterministic: the same pair scores the same through /v1/score.
    status, scored = _post(cluster, "/v1/score", {"model": RERANKER, "text_1": "cats", "text_2": ["cats"]})
    assert status == 200
    by_text = {r["document"]["text"]: r["relevance_score"] for r in ranked["results"]}
    assert scored["data"][0]["score"] == by_text["cats"]

    status, tokens = _post(cluster, "/tokenize", {"model": CHAT, "prompt": "the of and"})
    assert status == 200 and tokens["count"] == 3
    status, text = _post(cluster, "/detokenize", {"model": CHAT, "tokens": tokens["tokens"]})
    assert status == 200 and text["prompt"].split() == ["the", "of", "and"]


def test_an_api_the_catalog_does_not_list_is_refused_400(cluster):
    status, body = _post(cluster, "/v1/chat/completions", {"model": RERANKER, "messages": []})
    assert status == 400
    assert body["error"]["code"] == "api_not_supported"
    assert "rerank, score" in body["error"]["message"]
    # The same model answers the APIs it lists.
    status, _ = _post(cluster, "/v1/score", {"model": RERANKER, "text_1": "a", "text_2": "b"})
    assert status == 200
