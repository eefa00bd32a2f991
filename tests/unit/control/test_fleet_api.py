"""Domain holds and quotas through the real gRPC API of a control plane on one store."""

from __future__ import annotations

import time

import grpc
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from llmgw.common.etcd import MemoryStore
from llmgw.control import metrics
from llmgw.control.controlplane import ControlPlane
from llmgw.control.decide import reconcile
from llmgw.control.spec.model import ModelSpec, Profile
from llmgw.control.spec.tenancy import Quota
from llmgw.control.state.gpuhours import GpuHours
from llmgw.v1 import nodes_pb2, nodes_pb2_grpc, owners_pb2, owners_pb2_grpc

from .helpers import until
from .test_controlplane import SECRET, config, ready_status, register_with_leader, running


def stubs(address: str):
    channel = grpc.aio.insecure_channel(address)
    return channel, nodes_pb2_grpc.NodeServiceStub(channel), nodes_pb2_grpc.PlacementServiceStub(channel)


async def test_a_domain_hold_blocks_placement_then_drains_without_a_gap_and_bad_input_writes_nothing(
    tmp_path,
):
    store = MemoryStore()
    plane = ControlPlane(config(tmp_path, "control-a"), store, SECRET)
    async with running(plane):
        await until(lambda: plane.controller.accepting)
        chan, nodes, _ = stubs(plane.address)
        for nid, rack in (("node-a", "r1"), ("node-b", "r2")):
            await nodes.LabelNode(nodes_pb2.LabelNodeRequest(node_id=nid, set={"rack": rack}))
        for bad, what in [
            (nodes_pb2.HoldDomainRequest(label="rack", value=""), "has no value"),
            (nodes_pb2.HoldDomainRequest(label="-rack", value="r1"), "label key '-rack'"),
            (nodes_pb2.HoldDomainRequest(label="rack", value="r 1"), "label rack='r 1'"),
            (nodes_pb2.HoldDomainRequest(label="rack", value="r1", reason="x" * 300), "at most 256"),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await nodes.HoldDomain(bad)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and what in err.value.details()
        assert (await store.range("domain-holds/")).entries == []

        # Held before its agent connects: node-a gets nothing, node-b gets the replica.
        held = await nodes.HoldDomain(nodes_pb2.HoldDomainRequest(label="rack", value="r1", reason="power"))
        assert (held.reason, held.drain, held.held_since > 0) == ("power", False, True)
        a, _ = await register_with_leader(plane.address, "node-a")
        b, _ = await register_with_leader(plane.address, "node-b")
        start = (await b.inbox.next()).start
        assert start.model == "demo" and await a.inbox.quiet(0.5)
        await b.status(**ready_status(start, "http://127.0.0.1:39991"))
        listed = await nodes.ListDomainHolds(nodes_pb2.ListDomainHoldsRequest())
        assert [(h.label, h.value, list(h.nodes)) for h in listed.holds] == [("rack", "r1", ["node-a"])]

        # Release r1, then hold r2 with drain: the replacement starts on node-a first.
        await nodes.ReleaseDomain(nodes_pb2.ReleaseDomainRequest(label="rack", value="r1"))
        assert await b.inbox.quiet(0.5), "a domain hold without drain moves nothing"
        await nodes.HoldDomain(nodes_pb2.HoldDomainRequest(label="rack", value="r2", drain=True))
        new = (await a.inbox.next()).start
        assert await b.inbox.quiet(0.5), "the old replica stops only once its replacement is ready"
        await a.status(**ready_status(new, "http://127.0.0.1:39990"))
        stop = await b.inbox.next_matching(lambda m: m.HasField("stop"))
        assert stop.stop.replica_id == start.replica_id
        assert "node node-b is in held domain rack=r2" in stop.stop.reason
        await nodes.ReleaseDomain(nodes_pb2.ReleaseDomainRequest(label="rack", value="r2"))
        assert (await store.range("domain-holds/")).entries == []
        await until(lambda: not any(n.held for n in plane.controller.nodes()))
        for closer in (chan.close, a.close, b.close):
            await closer()


def scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the registry as (name, sorted labels) -> value, parsed from the text format."""
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_explain_and_the_fleet_metrics_show_the_owner_its_quotas_and_the_refusal(tmp_path):
    models = [
        ModelSpec(
            name="demo",
            min_replicas=2,
            owner={"org": "acme", "team": "search"},
            profile=Profile(engine="simulator", gpus=1),
        )
    ]
    cfg = config(tmp_path, "control-a", models, quotas={"acme/search": Quota(gpus=1, replicas=4)})
    registry = CollectorRegistry()
    plane = ControlPlane(cfg, MemoryStore(), SECRET, registry=registry)
    async with running(plane):
        await until(lambda: plane.controller.accepting)
        agent, _ = await register_with_leader(plane.address, "node-a")
        await agent.inbox.next()
        await until(lambda: "GPU quota" in plane.controller.placement_messages.get("demo", ""))
        chan, _, placement = stubs(plane.address)
        got = await placement.ExplainPlacement(nodes_pb2.ExplainPlacementRequest(model="demo"))
        assert got.owner == "acme/search"
        assert list(got.quotas) == ["team acme/search: replicas 1/4, GPUs 1/1"]
        assert got.placement_message == (
            "1 of 2 replica(s) cannot be placed: "
            "team acme/search: GPU quota 1, 1 in use, the replica needs 1 more"
        )
        m = scrape(registry)
        expected = {
            ("llmgw_control_settings_version", ()): 1,
            ("llmgw_control_nodes", (("state", "ready"),)): 1,
            ("llmgw_control_nodes", (("state", "held"),)): 0,
            ("llmgw_control_node_gpus", (("node", "node-a"),)): 2,
            ("llmgw_control_node_gpus_used", (("node", "node-a"),)): 1,
            ("llmgw_control_node_gpus_free", (("node", "node-a"),)): 1,
            ("llmgw_control_replicas", (("model", "demo"), ("state", "unreported"))): 1,
            ("llmgw_control_model_replicas_wanted", (("model", "demo"),)): 2,
            ("llmgw_control_model_replicas_ready", (("model", "demo"),)): 0,
            ("llmgw_control_models_unplaced", (("reason", "quota"),)): 1,
            ("llmgw_control_placement_failures_total", (("reason", "quota"),)): 1,
            ("llmgw_control_owner_gpus", (("owner", "acme"),)): 1,
            ("llmgw_control_owner_gpus", (("owner", "acme/search"),)): 1,
            ("llmgw_control_owner_replicas", (("owner", "acme/search"),)): 1,
            ("llmgw_control_owner_quota_gpus", (("owner", "acme/search"),)): 1,
            ("llmgw_control_owner_quota_replicas", (("owner", "acme/search"),)): 4,
        }
        assert {k: m.get(k) for k in expected} == expected

        owners = owners_pb2_grpc.OwnerServiceStub(chan)
        got = await owners.ListOwnerUsage(owners_pb2.ListOwnerUsageRequest())
        rows = {o.owner: o for o in got.owners}
        assert sorted(rows) == ["acme", "acme/search"] and got.since > 0
        team = rows["acme/search"]
        assert (team.replicas, team.gpus, team.quota_gpus, team.quota_replicas) == (1, 1, 1, 4)
        assert not team.HasField("quota_gpu_memory_gb") and not rows["acme"].HasField("quota_gpus")
        assert [(x.model, x.replicas, x.gpus) for x in team.models] == [("demo", 1, 1)]
        assert rows["acme"].models == [] and rows["acme"].gpus == 1
        only = await owners.ListOwnerUsage(owners_pb2.ListOwnerUsageRequest(owner="acme/search"))
        assert [o.owner for o in only.owners] == ["acme/search"]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await owners.ListOwnerUsage(owners_pb2.ListOwnerUsageRequest(period_seconds=2 * 86400))
        assert (
            err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "period_seconds" in err.value.details()
        )
        # What the routers reported of the keys' use rolls up the tree; the leader's metrics say it too.
        book = plane.quota.owner_requests.term(plane.leadership.term, time.time())
        book.add("acme/search/qa", "demo", 3, 300, time.time())
        got = await owners.ListOwnerUsage(owners_pb2.ListOwnerUsageRequest(period_seconds=3600))
        rows = {o.owner: o for o in got.owners}
        assert [(rows[s].requests, rows[s].tokens) for s in ("acme", "acme/search", "acme/search/qa")] == [
            (3, 300)
        ] * 3
        assert [(m.model, m.requests) for m in rows["acme/search/qa"].requested] == [("demo", 3)]
        assert rows["acme"].requested == []
        m = scrape(registry)
        assert (
            m[("llmgw_control_owner_requests_total", (("model", "demo"), ("owner", "acme/search/qa")))] == 3
        )
        assert (
            m[("llmgw_control_owner_tokens_total", (("model", "demo"), ("owner", "acme/search/qa")))] == 300
        )
        for closer in (chan.close, agent.close):
            await closer()


def test_the_metrics_reason_labels_are_the_decisions_kinds():
    assert metrics.UNPLACED_KINDS == reconcile.UNPLACED_KINDS


def test_gpu_hours_charge_each_interval_at_the_holdings_seen_at_its_start():
    hours = GpuHours()
    hours.start(1000.0)
    hours.observe(0.0, {"m": 2})
    hours.observe(1800.0, {"m": 1, "n": 4})
    hours.observe(3600.0, {})
    hours.observe(7200.0, {"m": 8})
    assert (hours.hours("m"), hours.hours("n"), hours.since) == (1.5, 2.0, 1000.0)
    hours.start(2000.0)
    assert hours.hours("m") == 0.0


async def test_a_standby_names_the_leader_instead_of_an_empty_usage(tmp_path):
    store = MemoryStore()
    leader = ControlPlane(config(tmp_path, "control-a"), store, SECRET)
    async with running(leader):
        await until(lambda: leader.controller.accepting)
        standby = ControlPlane(config(tmp_path, "control-b"), store, SECRET)
        async with running(standby), grpc.aio.insecure_channel(standby.address) as chan:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await owners_pb2_grpc.OwnerServiceStub(chan).ListOwnerUsage(
                    owners_pb2.ListOwnerUsageRequest()
                )
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert f"ask the leader control-a at {leader.address}" in err.value.details()
