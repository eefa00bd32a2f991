"""The scaler: scale-down unpublishes first and stops only once routers have drained the replica."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from llmgw.control.decide.reconcile import Replica
from llmgw.control.leader.scaler import Scaler, ScalerSettings
from llmgw.control.metrics import AutoscaleMetrics
from llmgw.control.spec.catalog import Catalog, Model
from llmgw.control.spec.model import ModelSpec
from llmgw.control.state.inventory import ReportedReplica
from llmgw.control.state.usage import UsageBook
from llmgw.control.store.replicas import ReplicaRecord
from llmgw.v1 import agent_pb2, usage_pb2

READY = agent_pb2.ReplicaState.REPLICA_STATE_READY
STARTING = agent_pb2.ReplicaState.REPLICA_STATE_STARTING


def catalog(min=1, max=3, down=0.0, up=0.0, idle=300.0) -> Catalog:  # noqa: A002
    spec = ModelSpec(
        name="m",
        profile={"engine": "simulator"},
        scaling={
            "min": min,
            "max": max,
            "target_load": 10,
            "scale_up_seconds": up,
            "scale_down_seconds": down,
            "idle_timeout_seconds": idle,
        },
    )
    return Catalog([Model.from_spec(spec)])


def replica(rid: str, created: float, state=READY) -> Replica:
    rec = ReplicaRecord(rid, "m", "node-a", (0,), "simulator", "m", created)
    return Replica(rec, ReportedReplica(rid, "m", state, url="http://x"))


class Router:
    def __init__(self, scaler: Scaler, rid: str = "r1"):
        self.scaler = scaler
        self.rid = rid

    def report(self, now: float, in_flight: dict[str, int], pending: int = 0, urgent=False) -> None:
        self.scaler.report(
            usage_pb2.UsageReport(
                router_id=self.rid,
                interval_seconds=1.0,
                endpoints=[
                    usage_pb2.EndpointLoad(endpoint_id=e, model="m", in_flight=n)
                    for e, n in in_flight.items()
                ],
                models=[usage_pb2.ModelDemand(model="m", idle_seconds=0, pending=pending)],
                urgent=urgent,
            ),
            now,
        )


def scaler(notify=lambda: None, timeout=60.0) -> Scaler:
    return Scaler(UsageBook(min_expiry=100), notify, ScalerSettings(1.0, timeout))


def test_scale_down_drains_the_least_loaded_replica_and_plan_keeps_it_meanwhile():
    s = scaler()
    reps = [replica("m-1", 1.0), replica("m-2", 2.0), replica("m-3", 3.0)]
    router = Router(s)
    router.report(0.0, {"m-1": 2, "m-2": 0, "m-3": 1})
    out = s.pass_(catalog(min=1, max=3), reps, 0.0)
    # Load 3 fits one replica: two drain, the busiest (m-1) stays.
    assert s.draining == {"m-2", "m-3"}
    assert out.desired == {"m": 3}, "plan holds all three while two drain"
    assert out.stops == ()


def test_among_equally_loaded_replicas_the_newest_drains_first():
    s = scaler()
    reps = [replica("m-1", 1.0), replica("m-2", 3.0), replica("m-3", 2.0)]
    Router(s).report(0.0, {"m-1": 0, "m-2": 0, "m-3": 0})
    s.pass_(catalog(min=2, max=3), reps, 0.0)
    assert s.draining == {"m-2"}


def test_a_replica_not_ready_drains_before_a_ready_one():
    s = scaler()
    reps = [replica("m-1", 1.0), replica("m-2", 1.0, state=STARTING)]
    Router(s).report(0.0, {"m-1": 0})
    s.pass_(catalog(min=1, max=2), reps, 0.0)
    assert s.draining == {"m-2"}


def test_a_draining_replica_is_stopped_only_when_routers_report_nothing_in_flight_on_it():
    s = scaler()
    reps = [replica("m-1", 1.0), replica("m-2", 2.0)]
    router = Router(s)
    router.report(0.0, {"m-1": 1, "m-2": 0})
    s.pass_(catalog(min=1, max=2), reps, 0.0)
    assert s.draining == {"m-2"}
    # Requests still run on m-2 at this router (it left the table, they did not).
    router.report(1.5, {"m-1": 1, "m-2": 2})
    assert s.pass_(catalog(min=1, max=2), reps, 1.5).stops == ()
    router.report(2.5, {"m-1": 1})
    (stop,) = s.pass_(catalog(min=1, max=2), reps, 2.5).stops
    assert (stop.replica_id, stop.forget) == ("m-2", True)
    assert "drained" in stop.reason
    # Its record is gone next pass: the drain is forgotten, plan holds one.
    assert s.pass_(catalog(min=1, max=2), reps[:1], 3.0).desired == {"m": 1}
    assert s.draining == frozenset()


def test_a_drain_that_never_ends_is_stopped_at_the_drain_timeout():
    s = scaler(timeout=30.0)
    reps = [replica("m-1", 1.0), replica("m-2", 2.0)]
    router = Router(s)
    router.report(0.0, {"m-1": 0, "m-2": 0})
    s.pass_(catalog(min=1, max=2), reps, 0.0)
    router.report(29.0, {"m-2": 1})
    assert s.pass_(catalog(min=1, max=2), reps, 29.0).stops == ()
    (stop,) = s.pass_(catalog(min=1, max=2), reps, 30.0).stops
    assert stop.replica_id == "m-2" and "not drained" in stop.reason


def test_load_that_returns_during_a_drain_cancels_it_instead_of_starting_a_replica():
    s = scaler()
    reps = [replica("m-1", 1.0), replica("m-2", 2.0)]
    router = Router(s)
    router.report(0.0, {"m-1": 0, "m-2": 0})
    s.pass_(catalog(min=1, max=2, up=0), reps, 0.0)
    assert s.draining == {"m-2"}
    router.report(0.5, {"m-1": 25})
    out = s.pass_(catalog(min=1, max=2, up=0), reps, 0.5)
    assert s.draining == frozenset()
    assert out.desired == {"m": 2} and out.stops == ()


def test_a_waiting_request_runs_a_pass_at_once_but_a_steady_wait_does_not_repeat_it():
    calls = []
    s = scaler(notify=lambda: calls.append(1))
    router = Router(s)
    router.report(0.0, {})
    assert calls == []
    router.report(0.1, {}, pending=1)
    assert len(calls) == 1
    router.report(1.1, {}, pending=1)
    assert len(calls) == 1
    router.report(1.2, {}, pending=1, urgent=True)
    assert len(calls) == 2
    # Another router with nothing waiting does not make the first one's wait look new.
    Router(s, "r2").report(1.3, {})
    router.report(1.4, {}, pending=1)
    assert len(calls) == 2


def test_a_woken_on_demand_model_is_placed_through_the_desired_count():
    s = scaler()
    Router(s).report(0.0, {}, pending=1)
    assert s.pass_(catalog(min=0, max=2), [], 0.0).desired == {"m": 1}


def test_reset_forgets_drains_and_decisions():
    s = scaler()
    reps = [replica("m-1", 1.0), replica("m-2", 2.0)]
    Router(s).report(0.0, {})
    s.pass_(catalog(min=1, max=2), reps, 0.0)
    assert s.draining
    s.reset()
    assert s.draining == frozenset() and s.scale("m") is None


def test_metrics_show_the_desired_count_the_load_and_each_change():
    registry = CollectorRegistry()
    s = Scaler(UsageBook(min_expiry=100), lambda: None, ScalerSettings(), AutoscaleMetrics(registry))
    Router(s).report(0.0, {}, pending=3)
    s.pass_(catalog(min=0, max=2), [], 0.0)
    assert registry.get_sample_value("llmgw_control_desired_replicas", {"model": "m"}) == 1
    assert registry.get_sample_value("llmgw_control_model_load", {"model": "m"}) == 3
    assert (
        registry.get_sample_value("llmgw_control_scale_changes_total", {"model": "m", "direction": "up"}) == 1
    )
    assert (
        registry.get_sample_value("llmgw_control_scale_changes_total", {"model": "m", "direction": "down"})
        == 0
    )
    assert registry.get_sample_value("llmgw_control_usage_routers") == 1


def test_a_new_leader_without_reports_keeps_every_replica_that_runs():
    s = scaler()
    reps = [replica("m-1", 1.0), replica("m-2", 2.0)]
    out = s.pass_(catalog(min=1, max=3, down=0), reps, 0.0)
    assert out.desired == {"m": 2} and s.draining == frozenset()


def test_a_replica_being_moved_off_a_held_node_is_neither_counted_nor_drained():
    # plan() runs a replacement beside it and stops it itself once the replacement is ready.
    s = scaler()
    reps = [replica("m-old", 1.0), replica("m-new", 2.0, state=STARTING)]
    Router(s).report(0.0, {"m-old": 1})
    out = s.pass_(catalog(min=1, max=1), reps, 0.0, leaving={"m-old"})
    assert s.draining == frozenset()
    assert out.desired == {"m": 1} and out.stops == ()
