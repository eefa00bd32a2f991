"""Federation end to end: two whole clusters on loopback, each a peer of the other.

Cluster ``beta`` (its own etcd, control plane, agent with the simulator,
router requiring client keys) serves ``chat``. Cluster ``alpha`` (the same
parts, no keys) serves ``small`` and declares ``big``, which cannot be placed
(it needs 8 GPUs; the node has 2) and falls back to ``beta/chat``, then to
``small``; its settings name beta as a peer, with a key made by beta's
``llmgw keys create``, asking for tags. Beta's peer alpha is added later
with ``llmgw peers add``, the way an operator would.

What must hold:

- beta's ``chat`` answers through alpha's router as ``beta/chat`` with the
  official openai client, whole and streamed; alpha's usage records it
  against the endpoint ``peer:beta/chat``, and beta's access log names the
  origin cluster;
- a local model with no capacity answers through the healthy peer;
- a request that would bounce alpha -> beta -> alpha is refused with a 400
  (``hop_limit_reached``) rather than forwarded again;
- beta's router stopped: within the check interval plus a second alpha's
  router no longer lists ``beta/chat``, ``llmgw peers`` says unhealthy, and
  ``big`` answers through its local fallback ``small``;
- beta's router back: ``beta/chat`` is listed and answers again.

Both clusters check their peers every second (``federation.check_interval_seconds:
1`` in the settings, as an operator would set it): the default, 10 s, would make
each withdrawal and return in this test wait up to ten seconds.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.request

import openai
import pytest

from tests.support.cluster import QUICK_AGENT, Cluster, running_cluster, simulator_model
from tests.support.procs import start, tool, wait_port

pytestmark = pytest.mark.integration

CHECK_INTERVAL = 1.0
FEDERATION = {"check_interval_seconds": CHECK_INTERVAL}
PROMPT = [{"role": "user", "content": "hello"}]
# An external provider nobody serves: a model that costs no replica.
NOWHERE = "http://127.0.0.1:9"


def _listed(c: Cluster, api_key: str = "unused") -> set[str]:
    request = urllib.request.Request(
        c.router_url + "/v1/models", headers={"Authorization": f"Bearer {api_key}"}
    )
    with urllib.request.urlopen(request, timeout=5) as resp:
        return {m["id"] for m in json.loads(resp.read())["data"]}


def _requests(c: Cluster, model: str, replica: str) -> float:
    """``llmgw_router_requests_total`` of ``model`` answered 200 by ``replica``."""
    with urllib.request.urlopen(c.router_url + "/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if (
                line.startswith("llmgw_router_requests_total{")
                and f'model="{model}"' in line
                and f'replica="{replica}"' in line
                and 'status="200"' in line
            ):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def _peer(c: Cluster, name: str) -> dict:
    peers = c.llmgw_json("peers").get("peers", [])
    return next(p for p in peers if p["name"] == name)


def _chat(client: openai.OpenAI, model: str) -> str:
    answer = client.chat.completions.create(model=model, messages=PROMPT, max_tokens=8)
    assert answer.choices[0].message.content
    return answer.model


@pytest.fixture(scope="module")
def clusters(tmp_path_factory):
    beta_state = tmp_path_factory.mktemp("beta")
    alpha_state = tmp_path_factory.mktemp("alpha")
    with running_cluster(
        beta_state,
        [simulator_model("chat", 1), {"name": "clash", "external": {"url": NOWHERE}}],
        name="beta",
        nodes={"node-b": 2},
        agent=QUICK_AGENT,
        control={"federation": FEDERATION},
        router={"auth": "keys"},
    ) as beta:
        made = beta.llmgw_json("keys", "create", "--name", "from-alpha")
        key_file = alpha_state / "beta.key"
        key_file.write_text(made["secret"] + "\n")
        big = {
            "name": "big",
            "min_replicas": 1,
            "profile": {"engine": "simulator", "gpus": 8},
            "fallbacks": ["beta/chat", "small"],
        }
        peer = {"name": "beta", "url": beta.router_url, "api_key_file": str(key_file), "send_tags": True}
        with running_cluster(
            alpha_state,
            # beta/clash: a local model with the name of one of beta's; the local one wins.
            [simulator_model("small", 1), big, {"name": "beta/clash", "external": {"url": NOWHERE}}],
            name="alpha",
            nodes={"node-a": 2},
            agent=QUICK_AGENT,
            control={"federation": {**FEDERATION, "peers": [peer]}},
        ) as alpha:
            beta.wait(lambda: beta.ready("chat") == 1, 60, "beta's chat ready")
            alpha.wait(lambda: alpha.ready("small") == 1, 60, "alpha's small ready")
            alpha.wait(lambda: "beta/chat" in _listed(alpha), 30, "alpha's router lists beta/chat")
            yield alpha, beta, made["secret"]


def test_a_peer_model_answers_through_this_cluster_with_the_openai_client(clusters):
    alpha, beta, _ = clusters
    client = alpha.client()
    before = _requests(alpha, "beta/chat", "peer:beta/chat")
    assert _chat(client, "beta/chat") == "chat"
    chunks = list(
        client.chat.completions.create(model="beta/chat", messages=PROMPT, max_tokens=8, stream=True)
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    # Usage records the peer's answers as the endpoint peer:<model>. The stream is counted once
    # beta's answer has ended, which the openai client does not wait for: it leaves on [DONE].
    alpha.wait(
        lambda: _requests(alpha, "beta/chat", "peer:beta/chat") == before + 2,
        10,
        "alpha counts both answers of peer:beta/chat as 200s",
    )
    # The peer asked for tags: its access log names the cluster that sent them.
    assert "origin='alpha'" in beta.procs["router"].log.read_text()
    peer = _peer(alpha, "beta")
    assert peer["health"] == "healthy" and "beta/chat" in peer["offered"], peer
    shown = alpha.llmgw("peers")
    assert shown.returncode == 0 and "check every 1s, hop limit 1" in shown.stdout, shown
    (row,) = [line for line in shown.stdout.splitlines() if line.startswith("beta ")]
    assert "healthy" in row and "beta/chat" in row and "s ago" in row, shown.stdout


def test_a_peer_model_with_a_local_name_is_not_offered_and_the_clash_is_reported(clusters):
    alpha, _, _ = clusters
    peer = _peer(alpha, "beta")
    assert peer["clashes"] == ["beta/clash"] and "beta/clash" not in peer["offered"], peer
    shown = alpha.llmgw("explain", "beta/clash")
    assert shown.returncode == 0 and "beta/clash is not offered" in shown.stdout, shown
    ours = alpha.llmgw_json("models")
    origins = {m["name"]: m.get("origin") for m in ours["models"]}
    assert origins["beta/clash"] == "declared" and origins["beta/chat"] == "peer", origins
    explained = alpha.llmgw("explain", "beta/chat")
    assert "served by peer cluster beta" in explained.stdout, explained


def test_a_local_model_without_capacity_answers_through_the_peer(clusters):
    alpha, _, _ = clusters
    before = _requests(alpha, "beta/chat", "peer:beta/chat")
    assert _chat(alpha.client(), "big") == "chat"
    assert _requests(alpha, "beta/chat", "peer:beta/chat") == before + 1


def test_a_request_bouncing_between_the_clusters_is_refused_not_looped(clusters):
    alpha, beta, key = clusters
    added = beta.llmgw(
        "peers", "add", "alpha", "--url", alpha.router_url, "--model", "small", "-m", "loop test"
    )
    assert added.returncode == 0, added.stderr
    beta.wait(lambda: "alpha/small" in _listed(beta, key), 30, "beta's router lists alpha/small")
    # Alpha offers all of beta's models, beta's own peer models among them.
    alpha.wait(lambda: "beta/alpha/small" in _listed(alpha), 30, "alpha's router lists beta/alpha/small")
    small_before = _requests(alpha, "small", alpha_small_replica(alpha))
    with pytest.raises(openai.BadRequestError) as refused:
        alpha.client().chat.completions.create(model="beta/alpha/small", messages=PROMPT, max_tokens=8)
    error = refused.value.body
    assert isinstance(error, dict) and error.get("code") == "hop_limit_reached", error
    assert "cannot loop" in error["message"]
    # Nothing reached alpha's own replica a second time.
    assert _requests(alpha, "small", alpha_small_replica(alpha)) == small_before
    removed = beta.llmgw("peers", "remove", "alpha")
    assert removed.returncode == 0, removed.stderr


def alpha_small_replica(alpha: Cluster) -> str:
    return alpha.replicas("small")[0].replica_id


def test_a_peer_that_stops_answering_is_withdrawn_and_returns(clusters):
    alpha, beta, _ = clusters
    router = beta.procs["router"]
    # Killed, not shut down gracefully: the moment it stops answering is then known to
    # the test (a graceful stop may outlast a check, so withdrawal could precede its end).
    router.signal(signal.SIGKILL)
    router.popen.wait(5)
    stopped = time.monotonic()
    gone = alpha.wait(lambda: "beta/chat" not in _listed(alpha), 10, "alpha withdraws beta/chat")
    took = gone - stopped
    print(f"beta/chat withdrawn {took:.2f}s after beta's router stopped (check interval {CHECK_INTERVAL:g}s)")
    assert took <= CHECK_INTERVAL + 1.0
    peer = _peer(alpha, "beta")
    assert peer["health"] == "unhealthy" and peer["error"] and not peer.get("offered"), peer
    # The local model without capacity now answers through its local fallback.
    assert _chat(alpha.client(), "big") == "small"

    port = int(beta.router_url.rsplit(":", 1)[1])
    beta.procs["router"] = start(
        "router", [tool("llmgw-router"), "--config", str(beta.state / "router.yaml")], beta.state / "logs"
    )
    wait_port(port, proc=beta.procs["router"])
    alpha.wait(lambda: "beta/chat" in _listed(alpha), 30, "alpha offers beta/chat again")
    assert _chat(alpha.client(), "beta/chat") == "chat"
    assert _chat(alpha.client(), "big") == "chat"
