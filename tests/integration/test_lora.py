"""LoRA adapters end to end, over real processes: etcd, control, router, agent, simulators.

A model runs two simulator replicas with LoRA enabled (``lora:``). An
operator adds an adapter with ``llmgw model set``; the control plane loads
it on one replica through the engine's runtime API, publishes that replica
as holding it, and the router lists it in ``/v1/models`` with the base as
parent and answers a request naming it through that replica only (the
answer's ``model`` says the adapter served), with the official openai
client. No replica is restarted: the engine PIDs are the same before and
after. Removing the adapter unloads it and the router stops listing it.
An adapter whose source does not exist is refused before anything is
written.
"""

from __future__ import annotations

import base64
import json
import subprocess
import urllib.request
from pathlib import Path

import pytest

from llmgw.v1 import endpoints_pb2
from tests.support.cluster import QUICK_AGENT, Cluster, running_cluster
from tests.support.procs import tool

pytestmark = pytest.mark.integration

BASE = "base"
ADAPTER = "sql"
# Added at runtime (declared models are changed through the settings instead).
MODEL = {
    "name": BASE,
    "scaling": {"min": 2, "max": 2},
    "lora": {"max_loras": 2},
    "profile": {"engine": "simulator", "gpus": 1, "args": {"ttft-ms": "5", "itl-ms": "2"}},
}


def _adapter_dir(root: Path, name: str) -> Path:
    d = root / "lora" / name
    d.mkdir(parents=True)
    (d / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    return d


def _router_models(c: Cluster) -> dict[str, dict]:
    with urllib.request.urlopen(c.router_url + "/v1/models", timeout=5) as resp:
        return {m["id"]: m for m in json.load(resp)["data"]}


def _holders(c: Cluster, adapter: str) -> list[str]:
    return [rid for rid, adapters in _published_adapters(c).items() if adapter in adapters]


def _etcd_range(c: Cluster, prefix: str) -> dict[str, bytes]:
    """Keys under the cluster's prefix (``/llmgw/test/``), relative to it, with their values."""
    root = "/llmgw/test/"
    out = subprocess.run(
        [tool("etcdctl"), "--endpoints", c.etcd, "get", "--prefix", root + prefix, "-w", "json"],
        capture_output=True,
        timeout=30,
        check=True,
    )
    kvs = json.loads(out.stdout).get("kvs", [])
    return {
        base64.b64decode(kv["key"]).decode().removeprefix(root): base64.b64decode(kv.get("value", ""))
        for kv in kvs
    }


def _published_adapters(c: Cluster) -> dict[str, tuple[str, ...]]:
    """Replica id -> adapters, as the endpoint table in etcd publishes them."""
    return {
        key.removeprefix("endpoints/"): tuple(endpoints_pb2.Endpoint.FromString(value).adapters)
        for key, value in _etcd_range(c, "endpoints/").items()
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    state = tmp_path_factory.mktemp("lora")
    with running_cluster(
        state,
        [],
        nodes={"node-a": 2},
        control={"reconcile_interval_seconds": 0.5},
        agent=QUICK_AGENT,
    ) as c:
        added = c.llmgw("model", "add", "-", stdin=json.dumps(MODEL))
        assert added.returncode == 0, added.stderr
        c.wait(lambda: c.ready(BASE) == 2 and c.router_endpoints(BASE) == 2, 90, "two base replicas")
        yield c


def test_adapter_added_at_runtime_answers_through_the_router_without_a_restart(cluster, tmp_path):
    c = cluster
    pids = c.engine_pids()
    assert len(pids) == 2
    source = _adapter_dir(tmp_path, ADAPTER)

    out = c.llmgw("model", "set", BASE, f"adapters=[{{name: {ADAPTER}, source: {source}}}]")
    assert out.returncode == 0, out.stderr
    c.wait(lambda: ADAPTER in _router_models(c), 30, "the router lists the adapter")
    listed = _router_models(c)[ADAPTER]
    assert listed["parent"] == BASE

    # Sent as soon as it is listed: the router holds it until a replica has loaded it.
    client = c.client(timeout=90)
    answer = client.chat.completions.create(
        model=ADAPTER, messages=[{"role": "user", "content": "select"}], max_tokens=4
    )
    assert answer.model == ADAPTER, "the simulator answers with the adapter that served"
    assert answer.choices[0].message.content

    holders = _holders(c, ADAPTER)
    assert len(holders) == 1, "one replica holds a quiet adapter (affinity)"
    streamed = client.chat.completions.create(
        model=ADAPTER, messages=[{"role": "user", "content": "again"}], max_tokens=4, stream=True
    )
    assert [chunk.model for chunk in streamed][0] == ADAPTER
    base = client.chat.completions.create(model=BASE, messages=[{"role": "user", "content": "hi"}])
    assert base.model == BASE
    assert c.engine_pids() == pids, "adding an adapter restarts no replica"

    out = c.llmgw("model", "unset", BASE, "adapters")
    assert out.returncode == 0, out.stderr
    c.wait(lambda: ADAPTER not in _router_models(c), 30, "the router stops listing the adapter")
    c.wait(lambda: not any(_published_adapters(c).values()), 30, "the adapter is unloaded")
    assert c.engine_pids() == pids, "removing an adapter restarts no replica"


def test_adapter_whose_source_does_not_exist_is_refused_and_nothing_is_written(cluster, tmp_path):
    c = cluster
    before = _etcd_range(c, "models")
    assert before, "the model is stored: the comparison below can see a write"
    missing = tmp_path / "no-such-adapter"
    out = c.llmgw("model", "set", BASE, f"adapters=[{{name: ghost, source: {missing}}}]")
    assert out.returncode != 0
    assert "ghost" in out.stderr and "does not exist" in out.stderr, out.stderr
    assert _etcd_range(c, "models") == before


def test_weights_that_cannot_fit_the_profile_are_refused_and_nothing_is_written(cluster, tmp_path):
    c = cluster
    weights = tmp_path / "big"
    weights.mkdir()
    (weights / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    # A safetensors header for 4 Gi bf16 parameters (8 GiB); the check reads headers only.
    header = json.dumps({"w": {"dtype": "BF16", "shape": [4 * 1024**3], "data_offsets": [0, 8 * 1024**3]}})
    (weights / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header.encode())
    doc = {
        "name": "too-big",
        "profile": {"engine": "vllm", "gpus": 1, "gpu_memory_gb": 4, "args": {"weights": str(weights)}},
    }
    before = _etcd_range(c, "")
    out = c.llmgw("model", "add", "-", stdin=json.dumps(doc))
    assert out.returncode != 0
    assert "cannot run as declared" in out.stderr and "GiB" in out.stderr, out.stderr
    after = _etcd_range(c, "")
    assert {k: v for k, v in after.items() if k.startswith("models")} == {
        k: v for k, v in before.items() if k.startswith("models")
    }
    assert "too-big" not in _router_models(c)
