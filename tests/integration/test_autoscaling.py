"""Autoscaling end to end, over real processes: etcd, control, router, agent, simulators.

- An on-demand model (``scaling.min: 0``) has no replica until asked. Its
  first request, through the router with the official openai client, is
  held while the control plane wakes it and then answered, with no error;
  after a short idle timeout the model goes back to zero replicas and the
  router to zero endpoints for it.
- A load spike on an elastic model (``min 1, max 2``, a low target load)
  adds a replica that the router then routes to; when the load stops, the
  model goes back to one replica, the removed one drained first, and no
  request of the spike fails.
"""

from __future__ import annotations

import time
import urllib.request

import pytest

from tests.support.cluster import QUICK_AGENT, Cluster, running_cluster
from tests.support.load import Load

pytestmark = pytest.mark.integration

SLEEPY = "sleepy"
ELASTIC = "elastic"
IDLE_SECONDS = 3.0
MODELS = [
    {
        "name": SLEEPY,
        "aliases": ["sleepy-chat"],
        "scaling": {"min": 0, "max": 1, "idle_timeout_seconds": IDLE_SECONDS},
        "profile": {
            "engine": "simulator",
            "gpus": 1,
            "args": {"ttft-ms": "10", "itl-ms": "5", "output-tokens": "8"},
        },
    },
    {
        "name": ELASTIC,
        # Two requests per replica is the target: four clients are twice that.
        "scaling": {"min": 1, "max": 2, "target_load": 2, "scale_up_seconds": 1, "scale_down_seconds": 3},
        "profile": {
            "engine": "simulator",
            "gpus": 1,
            "args": {"ttft-ms": "20", "itl-ms": "40", "output-tokens": "30"},
        },
    },
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    state = tmp_path_factory.mktemp("autoscaling")
    with running_cluster(
        state,
        MODELS,
        control={"reconcile_interval_seconds": 0.5},
        agent=QUICK_AGENT,
        router={"autoscaling": {"report_interval_seconds": 0.5, "wake_timeout_seconds": 60}},
    ) as c:
        c.wait(
            lambda: c.ready(ELASTIC) == 1 and c.router_endpoints(ELASTIC) == 1, 90, "elastic at min", step=0.2
        )
        c.wait(lambda: _router_ready(c), 30, "router has its table")
        yield c


def _router_ready(c: Cluster) -> bool:
    with urllib.request.urlopen(c.router_url + "/ready", timeout=5) as resp:
        return resp.status == 200


def test_on_demand_model_wakes_for_its_first_request_and_returns_to_zero_when_idle(cluster):
    c = cluster
    assert c.replicas(SLEEPY) == [], "an on-demand model runs nothing until asked"

    started = time.monotonic()
    answer = c.client(timeout=90).chat.completions.create(
        model="sleepy-chat", messages=[{"role": "user", "content": "wake up"}]
    )
    cold = time.monotonic() - started
    assert answer.choices[0].message.content, "the held request is answered by the woken replica"
    assert c.ready(SLEEPY) == 1

    # Warm now: a streamed request goes straight through.
    stream = c.client(timeout=90).chat.completions.create(
        model=SLEEPY, messages=[{"role": "user", "content": "again"}], stream=True
    )
    assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)

    idle_from = time.monotonic()
    gone = c.wait(
        lambda: c.replicas(SLEEPY) == [] and c.router_endpoints(SLEEPY) == 0,
        IDLE_SECONDS + 30,
        "the idle on-demand model back at zero",
        step=0.2,
    )
    print(f"\non demand: first answer after {cold:.2f}s (cold start); zero {gone - idle_from:.2f}s later")
    assert gone - idle_from >= IDLE_SECONDS - 0.5, "not stopped before its idle timeout"
    models = c.client(timeout=90).models.list()
    assert SLEEPY in {m.id for m in models.data}, "still listed, ready to wake again"


def _stream_once(c: Cluster) -> tuple[str, float]:
    stream = c.client(timeout=90).chat.completions.create(
        model=ELASTIC, messages=[{"role": "user", "content": "spike"}], stream=True
    )
    first = 0.0
    text = ""
    for chunk in stream:
        first = first or time.monotonic()
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
    if not text:
        raise RuntimeError("the stream carried no content")
    return "", first


def test_a_load_spike_adds_a_replica_and_its_end_removes_it_after_a_drain(cluster):
    c = cluster
    assert c.ready(ELASTIC) == 1
    with Load(lambda: _stream_once(c), clients=4) as load:
        spike = time.monotonic()
        serving = c.wait(
            lambda: c.ready(ELASTIC) == 2 and c.router_endpoints(ELASTIC) == 2, 60, "a second replica routed"
        )
    ended = time.monotonic()
    back = c.wait(
        lambda: len(c.replicas(ELASTIC)) == 1 and c.router_endpoints(ELASTIC) == 1, 60, "back to one replica"
    )
    print(
        f"\nspike: second replica serving {serving - spike:.2f}s after the spike; "
        f"back to one {back - ended:.2f}s after it ended; outcomes {dict(load.outcomes)}"
    )
    assert load.outcomes["ok"] > 0
    assert load.outcomes["failed"] == 0, "\n".join(load.errors)
