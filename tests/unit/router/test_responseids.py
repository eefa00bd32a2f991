"""Stored responses routed home: signed ids that name their replica, through a real router in
front of two real simulators (each stores what it answered)."""

from __future__ import annotations

import json

import aiohttp
import pytest

from llmgw.agent.simulator import SimulatorServer, SimulatorSettings
from llmgw.router.config import Backend, RouterConfig
from llmgw.router.errors import ResponseNotFound
from llmgw.router.responseids import IdRewriter, ResponseIds

from .helpers import router


def test_an_id_names_its_replica_and_only_the_key_that_signed_it_reads_it():
    ids = ResponseIds(b"cluster secret")
    wrapped = ids.wrap("replica-7", "resp_abc")
    assert wrapped.startswith("resp_") and "replica-7" not in wrapped
    assert ids.unwrap(wrapped) == ("replica-7", "resp_abc")
    # Another router of the same cluster reads it; another cluster does not.
    assert ResponseIds(b"cluster secret").unwrap(wrapped) == ("replica-7", "resp_abc")
    with pytest.raises(ResponseNotFound):
        ResponseIds(b"another secret").unwrap(wrapped)


@pytest.mark.parametrize("forged", ["resp_abc", "nope", "resp_.x", "resp_!!!.AAAA", ""])
def test_ids_not_issued_by_the_gateway_are_not_found(forged):
    ids = ResponseIds(b"s")
    with pytest.raises(ResponseNotFound):
        ids.unwrap(forged)
    # A forged route: a valid token with another replica's name but the signature of the first.
    token, _, sig = ids.wrap("a", "resp_1").removeprefix("resp_").rpartition(".")
    other, _, _ = ids.wrap("b", "resp_1").removeprefix("resp_").rpartition(".")
    with pytest.raises(ResponseNotFound):
        ids.unwrap(f"resp_{other}.{sig}")


def test_the_rewriter_learns_the_engines_id_once_and_replaces_it_everywhere():
    ids = ResponseIds(b"s")
    rewrite = IdRewriter(ids, "r1")
    first = rewrite(b'data: {"response":{"id":"resp_e1","status":"in_progress"}}\n\n')
    routed = json.loads(first.removeprefix(b"data: "))["response"]["id"]
    assert ids.unwrap(routed) == ("r1", "resp_e1")
    assert (
        rewrite(b'{"id":"resp_e1","x":"resp_e1"}')
        == json.dumps({"id": routed, "x": routed}, separators=(",", ":")).encode()
    )
    assert rewrite(b'{"id":"msg_1"}') == b'{"id":"msg_1"}'


SECRET = b"a-cluster-secret-of-enough-bytes"


@pytest.fixture
async def two_replicas(tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET + b"\n")
    settings = SimulatorSettings(ttft_ms=1, itl_ms=1, output_tokens=4, served_model_names=("m",))
    async with SimulatorServer(settings) as a, SimulatorServer(settings) as b:
        config = RouterConfig(
            listen="127.0.0.1:0",
            cluster_secret_file=str(secret),
            backends=[Backend(model="m", url=a.url), Backend(model="m", url=b.url)],
        )
        async with router(config) as r, aiohttp.ClientSession() as client:
            yield r, client


async def test_stored_responses_are_fetched_cancelled_and_continued_on_their_replica(two_replicas):
    r, client = two_replicas
    made: list[tuple[str, str]] = []
    while len({replica for _, replica in made}) < 2 and len(made) < 64:  # until both stored some
        async with client.post(r.url + "/v1/responses", json={"model": "m", "input": "hi"}) as resp:
            assert resp.status == 200
            made.append(((await resp.json())["id"], resp.headers["x-llmgw-replica"]))
    assert {replica for _, replica in made} == {"static:m:0", "static:m:1"}
    for response_id, replica in made:
        async with client.get(r.url + f"/v1/responses/{response_id}") as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["id"] == response_id
            assert resp.headers["x-llmgw-replica"] == replica
        async with client.post(r.url + f"/v1/responses/{response_id}/cancel") as resp:
            assert resp.status == 200
        body = {"model": "m", "input": "more", "previous_response_id": response_id}
        async with client.post(r.url + "/v1/responses", json=body) as resp:
            assert resp.status == 200, await resp.text()
            assert resp.headers["x-llmgw-replica"] == replica
    response_id = made[0][0]
    async with client.delete(r.url + f"/v1/responses/{response_id}") as resp:
        assert resp.status == 200
    async with client.get(r.url + f"/v1/responses/{response_id}") as resp:
        assert resp.status == 404  # the replica's own answer: it no longer has it


async def test_a_streamed_response_carries_the_routed_id_in_every_event(two_replicas):
    r, client = two_replicas
    async with client.post(
        r.url + "/v1/responses", json={"model": "m", "input": "hi", "stream": True}
    ) as resp:
        raw = await resp.read()
    ids = {
        json.loads(line[6:])["response"]["id"]
        for line in raw.decode().splitlines()
        if line.startswith("data: ") and '"response":{' in line
    }
    assert len(ids) == 1
    (response_id,) = ids
    async with client.get(r.url + f"/v1/responses/{response_id}") as resp:
        assert resp.status == 200
        assert (await resp.json())["status"] == "completed"


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_a_forged_id_or_a_gone_replica_is_an_openai_404(two_replicas, method):
    r, client = two_replicas
    gone = ResponseIds(SECRET).wrap("static:m:9", "resp_1")  # a real id of a replica no longer there
    for bad in ("resp_forged", ResponseIds(b"elsewhere").wrap("static:m:0", "resp_1"), gone):
        if method == "GET":
            call = client.get(r.url + f"/v1/responses/{bad}")
        else:
            call = client.post(
                r.url + "/v1/responses", json={"model": "m", "input": "x", "previous_response_id": bad}
            )
        async with call as resp:
            assert resp.status == 404
            error = (await resp.json())["error"]
            assert error["code"] == "response_not_found" and bad[:20] in error["message"]
            assert ("static:m:9" in error["message"]) == (bad == gone)
