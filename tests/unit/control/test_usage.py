"""The usage book: routers' latest snapshots summed per model, expired when a router goes quiet."""

from __future__ import annotations

from llmgw.control.state.usage import Demand, UsageBook
from llmgw.v1 import usage_pb2

NAMES = {"m": "m", "m-alias": "m", "m-sql": "m", "other": "other"}


def resolve(name: str) -> str | None:
    return NAMES.get(name)


def report(router="r1", endpoints=(), models=(), interval=1.0) -> usage_pb2.UsageReport:
    return usage_pb2.UsageReport(
        router_id=router,
        interval_seconds=interval,
        endpoints=[usage_pb2.EndpointLoad(**e) for e in endpoints],
        models=[usage_pb2.ModelDemand(**m) for m in models],
    )


def test_no_router_reporting_means_no_data_not_zero_load():
    assert UsageBook().demand(resolve, 0.0) is None


def test_in_flight_is_summed_across_routers_per_replica_and_model():
    book = UsageBook()
    book.update(report("r1", [{"endpoint_id": "m-1", "model": "m", "in_flight": 3}]), 0.0)
    book.update(report("r2", [{"endpoint_id": "m-1", "model": "m", "in_flight": 2}]), 0.0)
    book.update(report("r2", [{"endpoint_id": "m-2", "model": "m", "in_flight": 4}]), 0.1)
    assert book.demand(resolve, 0.2)["m"].load == 3 + 4, "a router's new report replaces its old one"
    assert book.endpoint_load("m-1", 0.2) == 3


def test_an_engine_queue_counts_once_and_only_when_larger_than_what_routers_send():
    book = UsageBook()
    sampled = {"endpoint_id": "m-1", "model": "m", "in_flight": 1, "engine_sampled": True}
    book.update(report("r1", [{**sampled, "engine_running": 8, "engine_waiting": 4}]), 0.0)
    book.update(report("r2", [{**sampled, "engine_running": 8, "engine_waiting": 5}]), 0.5)
    # The freshest sample (r2's) wins; engines are not summed across routers.
    assert book.demand(resolve, 1.0)["m"].load == 13
    unsampled = {"endpoint_id": "m-1", "model": "m", "in_flight": 2, "engine_running": 99}
    book.update(report("r1", [unsampled]), 1.0)
    book.update(report("r2", [unsampled]), 1.0)
    assert book.demand(resolve, 1.0)["m"].load == 4, "a value without engine_sampled is not read"


def test_a_silent_router_drops_out_after_a_few_of_its_intervals():
    book = UsageBook(expiry_intervals=3, min_expiry=0.5)
    book.update(report("r1", [{"endpoint_id": "m-1", "model": "m", "in_flight": 3}], interval=1.0), 0.0)
    book.update(report("r2", [{"endpoint_id": "m-1", "model": "m", "in_flight": 1}], interval=0.2), 0.0)
    assert book.demand(resolve, 0.5)["m"].load == 4
    assert book.demand(resolve, 0.7)["m"].load == 3
    assert book.routers(0.7) == 1
    assert book.demand(resolve, 3.0) is None


def test_pending_and_last_use_are_summed_under_the_canonical_name():
    book = UsageBook()
    book.update(report("r1", models=[{"model": "m-alias", "pending": 2, "idle_seconds": 5}]), 100.0)
    book.update(report("r2", models=[{"model": "m-sql", "idle_seconds": 1}, {"model": "gone"}]), 100.0)
    assert book.demand(resolve, 100.0) == {"m": Demand(0.0, 2, 99.0)}


def test_the_last_use_outlives_the_router_that_saw_it():
    book = UsageBook(min_expiry=1)
    book.update(report("r1", models=[{"model": "m", "idle_seconds": 0}]), 10.0)
    book.update(report("r2"), 20.0)
    assert book.demand(resolve, 20.0)["m"].last_used == 10.0


def test_a_model_never_used_since_a_router_started_has_no_last_use():
    book = UsageBook()
    book.update(report("r1", models=[{"model": "m", "pending": 1}]), 10.0)
    assert book.demand(resolve, 10.0)["m"] == Demand(0.0, 1, None)


def test_quiet_needs_a_report_from_every_live_router_since_and_none_in_flight():
    book = UsageBook()
    busy = [{"endpoint_id": "m-1", "model": "m", "in_flight": 1}]
    book.update(report("r1"), 0.0)
    book.update(report("r2", busy), 0.0)
    assert not book.quiet("m-1", 0.5, 1.0)
    book.update(report("r1"), 1.0)
    assert not book.quiet("m-1", 0.5, 1.0), "r2 has not reported since"
    book.update(report("r2", busy), 1.0)
    assert not book.quiet("m-1", 0.5, 1.0), "r2 still has a request on it"
    book.update(report("r2"), 1.1)
    assert book.quiet("m-1", 0.5, 1.1)
    assert UsageBook().quiet("m-1", 0.5, 1.1), "no router, no traffic"
