"""Between and on the nodes, over real processes: a fabric test, and the agents' own metrics.

A real etcd, one control plane, one router and two agents (one simulated
GPU each, each with its Prometheus port open), running two replicas of
``demo`` on the simulator, one per node. What must hold:

1. ``llmgw nodes fabric-test node-a node-b`` measures the pair over
   loopback TCP through the agents (bandwidth and latency, NCCL said not to
   run, and why), stores it, and ``llmgw nodes`` then lists the pair with
   its figures; ``--all`` measures every pair of connected nodes.
2. Each agent's /metrics, scraped over HTTP, carries the running engines'
   CPU and memory per replica, agreeing with the engine processes' own
   figures in /proc, and the declared GPUs (memory, power limit, source
   ``declared``) with no measured GPU series (no NVML here).
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.cluster import Cluster, running_cluster, simulator_model
from tests.support.procs import free_port

pytestmark = pytest.mark.integration

NODES = ("node-a", "node-b")


@pytest.fixture(scope="module")
def metrics_ports() -> dict[str, int]:
    return {n: free_port() for n in NODES}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, metrics_ports):
    with running_cluster(
        tmp_path_factory.mktemp("fabric"),
        [simulator_model("demo", 2)],
        name="fabric",
        nodes=dict.fromkeys(NODES, 1),
        control={"placement_settle_seconds": 3.0},
        per_node={n: {"metrics_listen": f"127.0.0.1:{p}"} for n, p in metrics_ports.items()},
    ) as c:
        c.wait(lambda: c.ready("demo") == 2, 60, "demo's two replicas ready")
        yield c


def llmgw(c: Cluster, *args: str) -> str:
    done = c.llmgw(*args)
    assert done.returncode == 0, f"llmgw {' '.join(args)} failed: {done.stderr}"
    return done.stdout


def test_a_fabric_test_between_two_agents_is_stored_and_shown_in_llmgw_nodes(cluster):
    c = cluster
    before = llmgw(c, "nodes")
    assert "node-a <-> node-b" not in before
    out = c.llmgw_json("nodes", "fabric-test", "node-a", "node-b", "--bytes", str(32 << 20), "--pings", "50")
    (result,) = out["results"]
    assert (result["node_a"], result["node_b"]) == NODES
    assert not result.get("error"), result
    # Loopback TCP moves far more than 10 MB/s and answers a ping in well under 100 ms.
    assert result["bandwidth_bytes_per_second"] > 10e6
    assert 0 < result["latency_seconds"] < 0.1
    assert result["bytes"] == str(32 << 20) and result["pings"] == 50 and result["method"] == "tcp"
    assert "no NVIDIA GPUs" in result["nccl"]

    listed = llmgw(c, "nodes")
    print(listed)
    assert "fabric (llmgw nodes fabric-test):" in listed
    row = next(line for line in listed.splitlines() if "node-a <-> node-b" in line)
    assert "MB/s" in row or "GB/s" in row
    assert " ms" in row and "tcp" in row and "ok" in row
    assert "NCCL: not run: no NVIDIA GPUs" in listed

    again = c.llmgw_json("nodes", "fabric-test", "--all", "--bytes", str(8 << 20))
    assert [(r["node_a"], r["node_b"]) for r in again["results"]] == [NODES]
    assert again["results"][0]["bytes"] == str(8 << 20)


def test_a_fabric_test_names_an_unknown_node_and_refuses_sizes_beyond_its_bounds(cluster):
    done = cluster.llmgw("nodes", "fabric-test", "node-a", "node-x")
    assert done.returncode == 1
    assert "node-x" in done.stderr and "not known" in done.stderr
    done = cluster.llmgw("nodes", "fabric-test", "node-a", "node-b", "--bytes", str(5 << 30))
    assert done.returncode == 1 and "bytes must be 1 to" in done.stderr
    done = cluster.llmgw("nodes", "fabric-test", "node-a", "node-b", "--pings", "5000")
    assert done.returncode == 1 and "pings must be 1 to 1000" in done.stderr


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _group_rss(pgid: int) -> int:
    """Resident bytes of every process in group ``pgid``, as /proc says now."""
    import os

    total = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                total += int((d / "statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            continue
    return total


def test_each_agent_exports_its_engines_cpu_and_memory_and_its_declared_gpus(cluster, metrics_ports):
    c = cluster
    pids = c.engine_pids()
    replicas = {r.replica_id: r for r in c.replicas("demo")}
    assert len(replicas) == 2
    for node, port in metrics_ports.items():
        s = _scrape(port)
        mine = [r for r in replicas.values() if r.node_id == node]
        assert len(mine) == 1, f"{node} should run one demo replica: {replicas}"
        (r,) = mine
        key = (("engine", "simulator"), ("model", "demo"), ("node", node), ("replica", r.replica_id))
        memory = s[("llmgw_agent_engine_memory_bytes", key)]
        # The engine's own figure, read now: the two agree within what a few seconds can change.
        rss = _group_rss(pids[r.replica_id])
        assert rss > 10 << 20 and abs(memory - rss) < 0.25 * rss, (memory, rss)
        assert s[("llmgw_agent_engine_cpu_seconds_total", key)] > 0
        assert s[("llmgw_agent_engine_processes", key)] >= 1
        assert s[("llmgw_agent_replicas", (("node", node), ("state", "ready")))] == 1
        gpu0 = (("gpu", "0"), ("node", node))
        assert s[("llmgw_agent_gpu_memory_total_bytes", gpu0)] == 80 * 1024**3
        info = [k for k in s if k[0] == "llmgw_agent_gpu_info"]
        assert len(info) == 1 and ("source", "declared") in info[0][1]
        assert not [
            k for k in s if k[0] in ("llmgw_agent_gpu_utilization_ratio", "llmgw_agent_gpu_power_watts")
        ]
    # CPU time only grows while an engine serves.
    node, port = next(iter(metrics_ports.items()))
    (r,) = [r for r in replicas.values() if r.node_id == node]
    key = (("engine", "simulator"), ("model", "demo"), ("node", node), ("replica", r.replica_id))
    first = _scrape(port)[("llmgw_agent_engine_cpu_seconds_total", key)]
    client = c.client()
    for _ in range(20):
        client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}])
    c.wait(lambda: _scrape(port)[("llmgw_agent_engine_cpu_seconds_total", key)] > first, 10, "CPU time grew")
