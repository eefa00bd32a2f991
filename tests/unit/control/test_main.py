"""The entry point as a real process over a real etcd: serves, leads, resigns on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import subprocess

import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llmgw.common.tls import aio_channel
from llmgw.v1 import admin_pb2, admin_pb2_grpc
from tests.support.certs import ClusterPki
from tests.support.procs import free_port, start, tool, wait_port


def write_config(tmp_path, etcd_endpoint, etcd_root):
    secret = tmp_path / "secret"
    secret.write_bytes(b"0123456789abcdef0123456789abcdef")
    # etcd_root is /<prefix>/<cluster>/ for the control plane: split it accordingly.
    prefix, cluster = etcd_root.rstrip("/").rsplit("/", 1)
    doc = {
        "cluster": cluster,
        "listen": "127.0.0.1:1",  # overridden by --listen below
        "cluster_secret_file": str(secret),
        "etcd": {"endpoints": [etcd_endpoint], "prefix": prefix},
        "lease_ttl_seconds": 2,
        "models": [{"name": "demo", "profile": {"engine": "simulator", "gpus": 1}}],
        "tls": ClusterPki.create(tmp_path / "tls").control(),
    }
    path = tmp_path / "control.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


async def test_control_process_serves_leads_and_resigns_on_sigterm(
    tmp_path, etcd_endpoint, etcd_root, etcd_store
):
    port = free_port()
    cfg = write_config(tmp_path, etcd_endpoint, etcd_root)
    proc = start(
        "control",
        [
            tool("llmgw-control"),
            "--config",
            str(cfg),
            "--listen",
            f"127.0.0.1:{port}",
            "--control-id",
            "proc-1",
        ],
        tmp_path,
    )
    try:
        await asyncio.to_thread(wait_port, port, 20.0, proc)
        admin_tls = ClusterPki.create(tmp_path / "tls").settings("admin", "test")
        async with aio_channel(f"127.0.0.1:{port}", admin_tls) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(service="llmgw.v1.AgentService"))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            # Generous: on a loaded machine the first election can take seconds.
            for _ in range(300):
                status = await admin.GetClusterStatus(admin_pb2.GetClusterStatusRequest())
                if status.leader:
                    break
                await asyncio.sleep(0.1)
            assert (status.control_id, status.leader_address) == ("proc-1", f"127.0.0.1:{port}")
        # The term publishes the catalog right after winning the election.
        for _ in range(100):
            if await etcd_store.get("catalog/demo") is not None:
                break
            await asyncio.sleep(0.05)
        assert await etcd_store.get("catalog/demo") is not None
        proc.signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.popen.wait, 15)
        assert code == 0, proc.tail()
    finally:
        proc.stop()
    assert await etcd_store.get("leader") is None, "the lease was not revoked on shutdown"


def test_bad_config_exits_2_with_a_message_that_names_the_problem(tmp_path):
    path = tmp_path / "control.yaml"
    path.write_text("cluster: ok\nlease_ttl_secnds: 3\n")
    result = subprocess.run(
        [tool("llmgw-control"), "--config", str(path)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "lease_ttl_secnds" in result.stderr and "cluster_secret_file" in result.stderr
