"""Routers' request and error rates, from the cumulative counts their usage reports carry."""

from __future__ import annotations

from llmgw.control.state.traffic import Counts, TrafficHistory
from llmgw.control.state.usage import UsageBook
from llmgw.v1 import usage_pb2

from .test_usage import report, resolve


def counts(requests: float, client: float = 0, server: float = 0) -> Counts:
    return Counts(requests, client, server)


def test_a_rate_is_the_difference_over_the_window_divided_by_its_span():
    h = TrafficHistory(window=60, step=5)
    h.add(0.0, {"m": counts(100, 4, 2)})
    assert h.rates() == {}, "one report is no rate"
    for t in range(1, 31):  # a report a second, 10 requests, 1 client and 1 server error each
        h.add(float(t), {"m": counts(100 + 10 * t, 4 + t, 2 + t)})
    assert h.span() == 30
    assert h.rates() == {"m": counts(10, 1, 1)}


def test_the_window_slides_so_an_old_burst_leaves_the_rate():
    h = TrafficHistory(window=60, step=5)
    h.add(0.0, {"m": counts(0)})
    h.add(1.0, {"m": counts(6000, server=600)})  # a burst of errors, then quiet
    for t in range(2, 200):
        h.add(float(t), {"m": counts(6000, server=600)})
    assert h.span() <= 65
    assert h.rates() == {"m": counts(0)}


def test_a_count_that_goes_down_is_a_restart_not_a_negative_rate():
    h = TrafficHistory(window=60, step=5)
    h.add(0.0, {"m": counts(500, server=50)})
    h.add(10.0, {"m": counts(600, server=60)})
    h.add(20.0, {"m": counts(3)})  # restarted under the same id
    assert h.rates() == {}
    h.add(30.0, {"m": counts(23, server=10)})
    assert h.rates() == {"m": counts(2, 0, 1)}


def traffic(router: str, interval: float = 1.0, **models: tuple[int, int, int]) -> usage_pb2.UsageReport:
    r = report(router, [{"endpoint_id": "m-1", "model": "m", "in_flight": 2}], interval=interval)
    r.traffic.extend(
        usage_pb2.ModelTraffic(model=m, requests=a, client_errors=b, server_errors=c)
        for m, (a, b, c) in models.items()
    )
    return r


def test_the_routers_view_sums_rates_per_canonical_model_and_keeps_each_router_apart():
    book = UsageBook(min_expiry=100)
    book.update(traffic("r1", m=(0, 0, 0)), 0.0)
    book.update(traffic("r2", other=(0, 0, 0)), 0.0)
    book.update(traffic("r1", m=(100, 0, 0), **{"m-alias": (50, 10, 0)}), 10.0)
    book.update(traffic("r2", other=(20, 0, 20), m=(30, 0, 0)), 10.0)
    view = book.routers_view(resolve, 10.0)
    r1, r2 = view.routers
    assert (r1.router, r1.in_flight, r1.totals, r1.window) == ("r1", 2, counts(150, 10, 0), 10.0)
    assert r1.rates == counts(15, 1, 0)
    assert r2.rates == counts(5, 0, 2)
    # r2's "m" has no baseline: counted from zero, as a model's first requests are.
    assert view.rates == {"m": counts(18, 1, 0), "other": counts(2, 0, 2)}
    assert view.demand["m"].load == 4


def test_a_router_that_stops_reporting_leaves_the_view():
    book = UsageBook(expiry_intervals=3, min_expiry=0.5)
    book.update(traffic("r1", interval=0.2, m=(1, 0, 0)), 0.0)
    assert [r.router for r in book.routers_view(resolve, 0.1).routers] == ["r1"]
    assert book.routers_view(resolve, 1.0).routers == ()


def test_a_report_without_traffic_is_zero_not_an_error():
    book = UsageBook(min_expiry=100)
    book.update(report("r1"), 0.0)
    (r1,) = book.routers_view(resolve, 1.0).routers
    assert r1.totals == counts(0) and r1.rates == counts(0)
