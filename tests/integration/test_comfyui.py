"""ComfyUI image models end to end, over real processes: etcd, control, router, agent, and the
ComfyUI simulator the agent launches as its ``comfyui`` engine.

- Two models of one environment (``studio``) are served by one replica of
  the hidden ``comfyui-env-studio`` entry: one engine process, woken from
  zero by the first request, and each member's request is submitted with
  that member's own checkpoint (read back from the engine's /history).
- The official openai client's ``images.generate`` gets PNGs, as
  ``b64_json`` and as a ``url``, of the size asked for.
- A client that hangs up interrupts its job on the engine.
- A workflow that fails is an OpenAI-shaped 502 naming ComfyUI's reason
  (ComfyUI's validation errors, and the time limit, are unit-tested in
  tests/unit/router/test_images.py).
- A ComfyUI outside the cluster (an ``external`` model, ``api: comfyui``)
  with a workflow file is routed the same way.
"""

from __future__ import annotations

import base64
import io
import json
import socket
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import openai
import png
import pytest

from llmgw.common.keys import engine_key
from tests.support.cluster import QUICK_AGENT, Cluster, running_cluster
from tests.support.procs import free_port, start, wait_port

pytestmark = pytest.mark.integration

ENTRY = "comfyui-env-studio"
JOB_SECONDS = 1.0
FAIL = "[simulated-failure]"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _comfy_model(name: str, ckpt: Path, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "profile": {"engine": "comfyui", "cpu_only": True, "memory_gb": extra.pop("memory_gb", 1)},
        "weights": {"source": str(ckpt)},
        "scaling": {"min": 0, "max": 1, "idle_timeout_seconds": 300},
        "comfyui": {"environment": "studio", **extra},
    }


@pytest.fixture(scope="module")
def external(tmp_path_factory):
    """A ComfyUI outside the cluster: the simulator, started by the test, with one checkpoint."""
    d = tmp_path_factory.mktemp("external-comfy")
    (d / "ckpt").mkdir()
    (d / "ckpt" / "ext.safetensors").write_bytes(b"weights")
    (d / "paths.yaml").write_text(f"outside:\n  checkpoints: |\n    {d / 'ckpt'}\n")
    port = free_port()
    argv = [sys.executable, "-m", "llmgw.agent.comfysim", "--listen", "127.0.0.1", "--port", str(port)]
    proc = start(
        "external-comfy",
        [*argv, "--extra-model-paths-config", str(d / "paths.yaml"), "--job-seconds", "0.2"],
        d,
    )
    try:
        wait_port(port, proc=proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, external):
    state = tmp_path_factory.mktemp("comfyui")
    weights = state / "weights"
    for name in ("a", "b"):
        (weights / name).mkdir(parents=True)
        (weights / name / f"{name}.safetensors").write_bytes(b"weights of " + name.encode())
    (state / "nodes-b").mkdir()
    workflow = state / "ext-workflow.json"
    # A user's own workflow, exported in API format, with placeholders for what a request fills.
    workflow.write_text(
        json.dumps(
            {
                "10": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "anything"}},
                "11": {"class_type": "CLIPTextEncode", "inputs": {"text": "{{prompt}}", "clip": ["10", 1]}},
                "12": {
                    "class_type": "EmptyLatentImage",
                    "inputs": {"width": 8, "height": 8, "batch_size": 1},
                },
                "13": {
                    "class_type": "KSampler",
                    "inputs": {"seed": 1, "positive": ["11", 0], "model": ["10", 0]},
                },
                "14": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ext", "images": ["13", 0]}},
            }
        )
    )
    models = [
        _comfy_model("studio-a", weights / "a" / "a.safetensors"),
        _comfy_model(
            "studio-b", weights / "b" / "b.safetensors", memory_gb=2, custom_nodes=[str(state / "nodes-b")]
        ),
        {
            "name": "outside",
            "external": {"url": external, "api": "comfyui"},
            "comfyui": {"workflow": str(workflow), "checkpoint": "ext.safetensors"},
        },
    ]
    agent = {
        **QUICK_AGENT,
        "engines": {
            "comfyui": {
                "command": [sys.executable, "-m", "llmgw.agent.comfysim"],
                "args": {"job-seconds": str(JOB_SECONDS), "fail-marker": FAIL},
            }
        },
    }
    with running_cluster(
        state,
        models,
        control={"reconcile_interval_seconds": 0.5},
        agent=agent,
        router={
            "autoscaling": {"report_interval_seconds": 0.5, "wake_timeout_seconds": 60},
            "images": {"poll_interval_seconds": 0.05},
        },
    ) as c:
        c.wait(lambda: _router_ready(c), 60, "router has its table")
        yield c


def _router_ready(c: Cluster) -> bool:
    with urllib.request.urlopen(c.router_url + "/ready", timeout=5) as resp:
        return resp.status == 200


def _engine_get(c: Cluster, path: str) -> Any:
    """GET ``path`` of the shared replica's engine, with its engine key, as the router calls it."""
    [replica] = c.replicas(ENTRY)
    key = engine_key((c.state / "cluster.secret").read_bytes().strip(), replica.replica_id)
    req = urllib.request.Request(replica.url + path, headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def _checkpoints_submitted(history: dict[str, Any]) -> dict[str, str]:
    """prompt text -> the ckpt_name its workflow loaded, for every job the engine ran."""
    out = {}
    for entry in history.values():
        workflow = entry["prompt"][2]
        texts = [n["inputs"]["text"] for n in workflow.values() if n["class_type"] == "CLIPTextEncode"]
        ckpts = [
            n["inputs"]["ckpt_name"] for n in workflow.values() if n["class_type"] == "CheckpointLoaderSimple"
        ]
        out[texts[0]] = ckpts[0]
    return out


def _png_size(data: bytes) -> tuple[int, int]:
    assert data.startswith(PNG_MAGIC), "not a PNG"
    width, height, _, _ = png.Reader(file=io.BytesIO(data)).read()
    return width, height


def test_two_models_of_one_environment_wake_one_replica_and_each_loads_its_own_checkpoint(cluster):
    c = cluster
    assert c.replicas(ENTRY) == [], "the shared entry is on demand: nothing runs before a request"
    listed = {m.id for m in c.client().models.list().data}
    assert {"studio-a", "studio-b"} <= listed
    assert ENTRY not in listed, "the shared entry is hidden"

    started = time.monotonic()
    a = c.client(timeout=90).images.generate(model="studio-a", prompt="a lighthouse", size="128x64")
    cold = time.monotonic() - started
    b = c.client(timeout=90).images.generate(model="studio-b", prompt="a harbour")
    assert a.data and a.data[0].b64_json and b.data and b.data[0].b64_json
    assert _png_size(base64.b64decode(a.data[0].b64_json)) == (128, 64)
    assert _png_size(base64.b64decode(b.data[0].b64_json)) == (512, 512)

    assert len(c.replicas(ENTRY)) == 1
    assert c.replicas("studio-a") == [] and c.replicas("studio-b") == [], (
        "members run no replica of their own"
    )
    assert len(c.engine_pids()) == 1, "one engine process serves both models"
    submitted = _checkpoints_submitted(_engine_get(c, "/history"))
    assert submitted["a lighthouse"] == "a.safetensors"
    assert submitted["a harbour"] == "b.safetensors"
    stats = _engine_get(c, "/system_stats")["llmgw"]
    assert stats["checkpoints"] == ["a.safetensors", "b.safetensors"], (
        "the replica carries both members' weights"
    )
    assert stats["custom_nodes"] == [str(c.state / "nodes-b")]
    print(f"\nshared environment: first image after {cold:.2f}s (cold start, one job {JOB_SECONDS}s)")


def test_images_generate_answers_a_png_url_and_refuses_other_apis(cluster):
    c = cluster
    answer = c.client(timeout=90).images.generate(
        model="studio-b", prompt="two boats", n=2, size="64x64", response_format="url"
    )
    assert len(answer.data) == 2
    for image in answer.data:
        assert image.url and image.url.startswith("data:image/png;base64,")
        assert _png_size(base64.b64decode(image.url.split(",", 1)[1])) == (64, 64)
    with pytest.raises(openai.BadRequestError) as refused:
        c.client().chat.completions.create(model="studio-a", messages=[{"role": "user", "content": "hi"}])
    assert "images" in str(refused.value)


def test_a_client_that_hangs_up_interrupts_its_job(cluster):
    c = cluster
    c.client(timeout=90).images.generate(model="studio-a", prompt="warm up")  # awake before the timing
    with pytest.raises(openai.APITimeoutError):
        c.client(timeout=JOB_SECONDS / 4).images.generate(model="studio-a", prompt="never mind")

    def interrupted() -> bool:
        for entry in _engine_get(c, "/history").values():
            workflow = entry["prompt"][2]
            if any(n["inputs"].get("text") == "never mind" for n in workflow.values()):
                return any(m[0] == "execution_interrupted" for m in entry["status"]["messages"])
        return False

    c.wait(interrupted, JOB_SECONDS * 5, "the hung-up job interrupted on the engine")


def test_a_failing_workflow_is_an_openai_error_naming_comfyuis_reason(cluster):
    c = cluster
    with pytest.raises(openai.APIStatusError) as failed:
        c.client(timeout=90).images.generate(model="studio-a", prompt=f"please fail {FAIL}")
    assert failed.value.status_code == 502
    body = failed.value.body
    assert isinstance(body, dict) and body.get("code") == "workflow_failed", body
    assert "simulated failure" in body["message"]


def test_an_external_comfyui_with_a_workflow_file_is_routed_the_same_way(cluster, external):
    c = cluster
    answer = c.client(timeout=90).images.generate(model="outside", prompt="from outside", size="64x128")
    assert answer.data[0].b64_json
    assert _png_size(base64.b64decode(answer.data[0].b64_json)) == (64, 128)
    with urllib.request.urlopen(external + "/history", timeout=5) as resp:
        history = json.loads(resp.read())
    [entry] = [e for e in history.values() if e["prompt"][2]["11"]["inputs"]["text"] == "from outside"]
    workflow = entry["prompt"][2]
    assert workflow["10"]["inputs"]["ckpt_name"] == "ext.safetensors", "the workflow file, filled in"
    assert workflow["12"]["inputs"] == {"width": 64, "height": 128, "batch_size": 1}


def test_the_simulator_answers_bytes_it_cannot_parse_in_its_error_shape(external):
    port = int(external.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /history HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n")
        answer = b""
        while chunk := s.recv(65536):  # the answer, then the simulator closes
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"400", answer[:300]
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request" and error["message"].startswith("malformed HTTP request")
