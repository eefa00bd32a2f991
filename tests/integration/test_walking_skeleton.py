"""The walking skeleton end to end, with every real part: ``llmgw up`` starts a
real etcd and the three services as separate processes; the official openai
client talks to the router; grpcurl lists the control plane's services
through reflection; Ctrl-C leaves no process behind.

The cluster is shared by the tests of this module (starting one costs
seconds) and the disruptive tests run last, in file order.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import openai
import pytest

from tests.support.procs import Proc, free_port, free_port_pair, start, tool

pytestmark = pytest.mark.integration

UP_TIMEOUT = 120


def _wait_for_line(proc: Proc, needle: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if needle in proc.log.read_text(errors="replace"):
            return
        if not proc.alive():
            raise RuntimeError(f"llmgw up exited with {proc.popen.returncode}:\n{proc.tail(80)}")
        time.sleep(0.2)
    raise TimeoutError(f"llmgw up did not print {needle!r} in {timeout}s:\n{proc.tail(80)}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    state = tmp_path_factory.mktemp("cluster")
    ports = {"router": free_port(), "control": free_port(), "etcd": free_port_pair(), "console": free_port()}
    proc = start(
        "llmgw-up",
        [
            # Started as a shell starts a background job (`llmgw up &`, a CI step): with SIGINT
            # ignored, which the process inherits. Ctrl-C (SIGINT) must stop it all the same.
            sys.executable,
            "-c",
            "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
            "os.execv(sys.argv[1], sys.argv[1:])",
            tool("llmgw"),
            "up",
            "--state-dir",
            str(state),
            "--router-port",
            str(ports["router"]),
            "--control-port",
            str(ports["control"]),
            "--console-port",
            str(ports["console"]),
            "--etcd-port",
            str(ports["etcd"]),
        ],
        state,
    )
    try:
        _wait_for_line(proc, "llmgw is up", UP_TIMEOUT)
    except BaseException:
        proc.stop()
        _dump_logs(state)
        raise
    manifest = json.loads((state / "cluster.json").read_text())
    info = {"proc": proc, "state": state, **manifest}
    yield info
    if proc.alive():
        proc.stop(timeout=30)
    if "control_proc" in info:  # the control plane a test restarted, outside llmgw up
        info["control_proc"].stop()


def _dump_logs(state: Path) -> None:
    for log in sorted((state / "logs").glob("*.log")):
        print(f"----- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-30:]))


@pytest.fixture
def client(cluster):
    return openai.OpenAI(base_url=cluster["router_url"] + "/v1", api_key="unused", max_retries=0, timeout=30)


def _token(cluster) -> list[str]:
    return ["--token-file", cluster["admin_token_file"], "--tls-dir", cluster["tls_dir"]]


def _grpcurl_tls(cluster, role: str = "admin-local") -> list[str]:
    """grpcurl's flags for mutual TLS with ``role``'s certificate of the cluster `llmgw up` made."""
    d = Path(cluster["tls_dir"])
    return [
        "-cacert", str(d / "ca.crt"), "-cert", str(d / f"{role}.crt"), "-key", str(d / f"{role}.key"),
        "-authority", "llmgw-control",
    ]  # fmt: skip


def _llmgw_json(cluster, *args: str) -> dict:
    out = subprocess.run(
        [tool("llmgw"), *args, "--control", cluster["control_address"], *_token(cluster), "--json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_streamed_chat_completion_through_router(client):
    stream = client.chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": "Say something"}],
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=12,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len([c for c in chunks if c.choices]) > 3, "the answer should arrive as many chunks"
    assert text.strip()
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12


def test_non_streamed_completion_by_alias(client):
    resp = client.completions.create(model="demo-chat", prompt="Once upon a time", max_tokens=5)
    assert resp.choices[0].text.strip()
    assert resp.usage.completion_tokens == 5


def test_models_lists_the_demo_model(client):
    ids = {m.id for m in client.models.list().data}
    assert "demo" in ids


def test_unknown_model_is_a_404_error_object(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    body = err.value.body
    assert isinstance(body, dict) and "no-such-model" in body["message"]


def test_grpcurl_lists_control_services_through_reflection(cluster):
    out = subprocess.run(
        [tool("grpcurl"), *_grpcurl_tls(cluster), cluster["control_address"], "list"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    services = set(out.stdout.split())
    assert {
        "llmgw.v1.AgentService",
        "llmgw.v1.EndpointService",
        "llmgw.v1.CatalogService",
        "llmgw.v1.AdminService",
        "llmgw.v1.SettingsService",
        "grpc.health.v1.Health",
    } <= services
    health = subprocess.run(
        [tool("grpcurl"), *_grpcurl_tls(cluster), cluster["control_address"], "grpc.health.v1.Health/Check"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert '"SERVING"' in health.stdout, health.stdout + health.stderr


def test_admin_commands_without_admin_credentials_are_refused_with_how_to_pass_them(cluster):
    d = Path(cluster["tls_dir"])
    router_cert = ["--tls-cert", str(d / "router-router-1.crt"), "--tls-key", str(d / "router-router-1.key")]
    out = subprocess.run(
        [tool("llmgw"), "models", "--control", cluster["control_address"], "--tls-dir", str(d), *router_cert],
        capture_output=True,
        text=True,
        timeout=30,
        env={k: v for k, v in os.environ.items() if not k.startswith("LLMGW_ADMIN_TOKEN")},
        cwd=cluster["state"],
    )
    assert out.returncode == 1
    assert "refused" in out.stderr and "for admin callers only; router router-1 may not" in out.stderr
    assert "authorization: Bearer TOKEN" in out.stderr, out.stderr
    raw = subprocess.run(
        [tool("grpcurl"), *_grpcurl_tls(cluster, "router-router-1"), cluster["control_address"]]
        + ["llmgw.v1.SettingsService/GetSettings"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert "PermissionDenied" in raw.stderr and "admin certificate" in raw.stderr, raw.stderr
    # Without a certificate there is no connection at all, even with TLS.
    d_ca = ["-cacert", str(d / "ca.crt"), "-authority", "llmgw-control"]
    bare = subprocess.run(
        [tool("grpcurl"), *d_ca, cluster["control_address"], "llmgw.v1.SettingsService/GetSettings"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bare.returncode != 0 and "GetSettings" not in bare.stdout, bare.stdout


def test_replicas_are_ready_and_spread_over_both_agents(cluster):
    replicas = _llmgw_json(cluster, "replicas")["replicas"]
    ready = [r for r in replicas if r.get("state") == "REPLICA_STATE_READY"]
    assert len(ready) == 2
    assert {r["node_id"] for r in ready} == {"node-a", "node-b"}
    nodes = _llmgw_json(cluster, "nodes")["nodes"]
    assert sorted(n["node_id"] for n in nodes) == ["node-a", "node-b"]


def _llmgw_model(cluster, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [tool("llmgw"), "model", *args, "--control", cluster["control_address"], *_token(cluster)],
        capture_output=True,
        text=True,
        timeout=30,
        input=stdin,
    )


def test_model_added_at_runtime_answers_and_removed_stops(cluster, client):
    bad = _llmgw_model(
        cluster, "add", "-", stdin="name: extra\nfallbacks: [ghost]\nprofile: {engine: simulator}\n"
    )
    assert bad.returncode == 1
    assert "falls back to 'ghost', which is not in the catalog" in bad.stderr
    assert "INVALID_ARGUMENT" in bad.stderr
    missing = _llmgw_model(cluster, "get", "extra")
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr, "an invalid add must leave no trace"

    declared = _llmgw_model(cluster, "remove", "demo")
    assert declared.returncode == 1 and "llmgw settings edit" in declared.stderr

    started = time.monotonic()
    added = _llmgw_model(
        cluster,
        "add",
        "-",
        stdin="name: extra\naliases: [extra-alias]\nprofile: {engine: simulator, gpus: 1}\n",
    )
    assert added.returncode == 0, added.stderr
    deadline = time.monotonic() + 30
    while True:
        try:
            resp = client.completions.create(model="extra-alias", prompt="hi", max_tokens=3)
            break
        except openai.APIError:
            assert time.monotonic() < deadline, "the model added at runtime never answered"
            time.sleep(0.2)
    print(f"AddModel to first answer through the router: {time.monotonic() - started:.2f}s")
    assert resp.usage.completion_tokens == 3
    models = {m["name"]: m for m in _llmgw_json(cluster, "models")["models"]}
    assert models["extra"]["origin"] == "runtime" and models["demo"]["origin"] == "declared"

    assert _llmgw_model(cluster, "remove", "extra").returncode == 0
    deadline = time.monotonic() + 15
    while "extra" in {m.id for m in client.models.list().data}:
        assert time.monotonic() < deadline, "a removed model stayed in /v1/models"
        time.sleep(0.2)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="extra", prompt="hi", max_tokens=3)


class _Provider(http.server.BaseHTTPRequestHandler):
    """A stand-in OpenAI-compatible provider that accepts one key (``server.key``)."""

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.seen.append((self.headers.get("Authorization"), body))  # type: ignore[attr-defined]
        ok = self.headers.get("Authorization") == f"Bearer {self.server.key}"  # type: ignore[attr-defined]
        answer = {
            "id": "chatcmpl-p",
            "object": "chat.completion",
            "created": 1,
            "model": body["model"],
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
            ],
        }
        data = json.dumps(answer if ok else {"error": {"message": "bad key", "type": "auth"}}).encode()
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def test_catalog_fallbacks_and_an_external_provider_take_effect_through_the_router(cluster, client, tmp_path):
    key_file = tmp_path / "provider.key"
    key_file.write_text("sk-one\n")
    provider = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Provider)
    provider.key, provider.seen = "sk-one", []  # type: ignore[attr-defined]
    thread = threading.Thread(target=provider.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{provider.server_address[1]}"
    try:
        ext = f"name: ext\nexternal: {{url: '{url}', model: prov-model, api_key_file: '{key_file}'}}\n"
        assert _llmgw_model(cluster, "add", "-", stdin=ext).returncode == 0
        # No node carries this label: the model never gets a replica and answers through its fallback.
        unplaceable = (
            "name: nowhere\nfallbacks: [demo]\n"
            "profile: {engine: simulator, gpus: 1, node_selector: {zone: nowhere}}\n"
        )
        assert _llmgw_model(cluster, "add", "-", stdin=unplaceable).returncode == 0
        deadline = time.monotonic() + 30
        while True:
            try:
                answered = client.chat.completions.with_raw_response.create(
                    model="nowhere", messages=[{"role": "user", "content": "hi"}], max_tokens=3
                )
                via_provider = client.chat.completions.with_raw_response.create(
                    model="ext", messages=[{"role": "user", "content": "hi"}]
                )
                break
            except openai.APIError:
                assert time.monotonic() < deadline, "the fallback or the external model never answered"
                time.sleep(0.2)
        assert answered.headers["x-llmgw-model"] == "demo"
        assert via_provider.headers["x-llmgw-replica"] == "external:ext"
        assert via_provider.parse().model == "prov-model"
        assert provider.seen[-1][0] == "Bearer sk-one"
        # Rotate the key: the router picks it up without a restart.
        provider.key = "sk-two"  # type: ignore[attr-defined]
        key_file.write_text("sk-two\n")
        deadline = time.monotonic() + 15
        while provider.seen[-1][0] != "Bearer sk-two":
            assert time.monotonic() < deadline, "the rotated provider key was never used"
            try:
                client.chat.completions.create(model="ext", messages=[{"role": "user", "content": "hi"}])
            except openai.AuthenticationError:
                time.sleep(0.2)
        assert _router_metric(cluster, 'llmgw_router_fallbacks_total{fallback="demo",model="nowhere"}') >= 1
    finally:
        _llmgw_model(cluster, "remove", "nowhere")
        _llmgw_model(cluster, "remove", "ext")
        provider.shutdown()
        provider.server_close()


def _chat_ok(client) -> bool:
    try:
        r = client.chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        return bool(r.choices[0].message.content)
    except openai.OpenAIError:
        return False


def _router_metric(cluster, name: str) -> float | None:
    with urllib.request.urlopen(cluster["router_url"] + "/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return None


def test_router_keeps_serving_while_control_plane_is_down_and_resumes(cluster, client):
    control_pid = cluster["pids"]["control"]
    os.killpg(control_pid, signal.SIGKILL)
    time.sleep(1.0)
    results = [_chat_ok(client) for _ in range(10)]
    assert all(results), f"requests failed with the control plane down: {results}"

    # Bring a control plane back with the same config: it takes the lease once
    # the dead one's expires, adopts the running replicas, and the router's
    # watch reconnects.
    state = cluster["state"]
    restarted = start(
        "control-2", [tool("llmgw-control"), "--config", str(state / "control.yaml")], state / "logs"
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _router_metric(cluster, "llmgw_router_watch_connected") != 1.0:
            assert _chat_ok(client)
            time.sleep(0.3)
        assert _router_metric(cluster, "llmgw_router_watch_connected") == 1.0
        assert all(_chat_ok(client) for _ in range(5))
        # The restarted control plane leads once the dead one's lease lapses,
        # then adopts the two running replicas rather than starting new ones.
        deadline = time.monotonic() + 30
        ready: list = []
        leads = False
        while time.monotonic() < deadline and not (leads and len(ready) == 2):
            # A standby lists the records in etcd (ready when published), so
            # ask who leads too: adoption is the leader's report.
            leads = bool(_llmgw_json(cluster, "status").get("leader"))
            replicas = _llmgw_json(cluster, "replicas").get("replicas", [])
            ready = [r for r in replicas if r.get("state") == "REPLICA_STATE_READY"]
            time.sleep(0.5)
        assert leads and len(ready) == 2, replicas
    finally:
        cluster["pids"]["control"] = restarted.popen.pid
        cluster["control_proc"] = restarted


def _engine_processes(ports: set[int]) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"llmgw.agent.simulator" in argv and any(str(p).encode() in argv for p in ports):
            found.append(int(d.name))
    return found


def test_ctrl_c_stops_everything_and_leaves_no_process(cluster):
    replicas = _llmgw_json(cluster, "replicas")["replicas"]
    ports = {int(r["url"].rsplit(":", 1)[1]) for r in replicas if r.get("url")}
    assert ports and _engine_processes(ports), "engines should be running before the stop"
    proc: Proc = cluster["proc"]
    proc.popen.send_signal(signal.SIGINT)
    try:
        code = proc.popen.wait(60)
    except subprocess.TimeoutExpired:
        _dump_logs(cluster["state"])
        pytest.fail(f"llmgw up still stopping after 60 s (its children's logs above):\n{proc.tail(40)}")
    assert code == 0, proc.tail(40)
    if "control_proc" in cluster:  # the control plane the previous test restarted
        cluster["control_proc"].stop()
    time.sleep(0.5)
    alive = [(role, pid) for role, pid in cluster["pids"].items() if role != "control" and _pid_alive(pid)]
    assert not alive, f"still running after Ctrl-C: {alive}"
    assert not _engine_processes(ports), "engine processes survived Ctrl-C"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) is not running.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
