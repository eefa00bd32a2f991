"""The autoscaling decision, driven with a fake clock: bounds, windows, hysteresis, wake, idle."""

from __future__ import annotations

from llmgw.control.decide.autoscale import ModelScale, decide
from llmgw.control.spec.catalog import Catalog, Model
from llmgw.control.spec.model import ModelSpec
from llmgw.control.state.usage import Demand


def model(name="m", min=1, max=4, target=10.0, up=10.0, down=60.0, idle=300.0) -> Model:  # noqa: A002
    return Model.from_spec(
        ModelSpec(
            name=name,
            profile={"engine": "simulator"},
            scaling={
                "min": min,
                "max": max,
                "target_load": target,
                "scale_up_seconds": up,
                "scale_down_seconds": down,
                "idle_timeout_seconds": idle,
            },
        )
    )


class Run:
    """Calls decide() over time for one model, carrying its memory like the controller does."""

    def __init__(self, m: Model, current: int | None = None, t: float = 0.0):
        self.catalog = Catalog([m])
        self.name = m.name
        self.state: dict[str, ModelScale] = {}
        self.current = {} if current is None else {m.name: current}
        self.t = t

    def at(self, t: float, load: float = 0.0, pending: int = 0, last_used: float | None = None) -> int:
        self.t = t
        return self._decide({self.name: Demand(load, pending, last_used)})

    def blind(self, t: float) -> int:
        self.t = t
        return self._decide(None)

    def hold(self, until: float, load: float, step: float = 1.0) -> list[int]:
        """The same load every ``step`` seconds from now to ``until``; the counts decided."""
        out = []
        t = self.t
        while t < until:
            t += step
            out.append(self.at(t, load))
        return out

    def _decide(self, demand) -> int:
        d = decide(self.catalog, demand, self.current, self.state, self.t)
        self.state = dict(d.state)
        return d.desired[self.name]


def test_a_model_first_seen_starts_from_what_runs_within_its_bounds():
    assert Run(model(min=1, max=4), current=3).at(0) == 3
    assert Run(model(min=1, max=4), current=7).at(0) == 4
    assert Run(model(min=2, max=4), current=0).at(0) == 2
    assert Run(model(min=2, max=4)).at(0) == 2


def test_scales_up_only_after_load_stays_above_target_for_the_window():
    r = Run(model(target=10, up=10), current=1)
    assert r.at(0, load=25) == 1
    assert r.hold(9, load=25) == [1] * 9
    assert r.at(10, load=25) == 3, "to what the load asks for: 25 / 10 per replica"


def test_a_dip_below_target_restarts_the_up_window():
    r = Run(model(target=10, up=10), current=1)
    r.at(0, load=25)
    r.hold(8, load=25)
    assert r.at(9, load=5) == 1
    # The window starts again at t=10.
    assert r.hold(19, load=25) == [1] * 10
    assert r.at(20, load=25) == 3


def test_scale_up_takes_the_smallest_count_the_window_asked_for():
    r = Run(model(target=10, up=10, max=8), current=1)
    r.at(0, load=15)
    r.hold(9, load=15)
    assert r.at(10, load=70) == 2, "a burst at the end of the window does not buy 7 replicas"


def test_scale_up_stops_at_max():
    r = Run(model(target=10, up=1, max=3), current=1)
    r.at(0, load=100)
    assert r.at(1, load=100) == 3
    assert r.hold(10, load=100) == [3] * 9


def test_every_change_restarts_the_windows():
    r = Run(model(target=10, up=5, max=8), current=1)
    r.at(0, load=15)
    assert r.at(5, load=15) == 2
    # Load jumps again at once: the next step needs a whole window of its own.
    assert r.hold(9, load=40) == [2] * 4
    assert r.at(10, load=40) == 2
    assert r.at(11, load=40) == 4


def test_scales_down_only_after_the_longer_window_and_to_the_largest_count_it_asked_for():
    r = Run(model(target=10, up=5, down=60, min=1, max=8), current=4)
    r.at(0, load=10)
    r.hold(30, load=10, step=5)
    r.hold(59, load=2, step=1)
    assert r.at(60, load=2) == 2, "10 requests at 80% of target need 2; the window remembers that"
    # The next window starts at t=61.
    assert r.hold(120, load=2, step=1) == [2] * 60
    assert r.at(121, load=2) == 1


def test_a_rise_during_the_down_window_restarts_it():
    r = Run(model(target=10, down=60), current=3)
    r.at(0, load=0)
    r.hold(50, load=0, step=5)
    assert r.at(51, load=30) == 3
    # The window starts again at t=56.
    assert r.hold(111, load=0, step=5) == [3] * 12
    assert r.at(115, load=0) == 3
    assert r.at(116, load=0) == 1


def test_scale_down_never_goes_below_min():
    r = Run(model(min=2, max=4, down=10), current=4)
    r.at(0)
    assert r.hold(100, load=0)[-1] == 2


def test_load_just_under_one_replica_less_does_not_scale_down_so_the_count_never_flaps():
    # 2 replicas, 9.5 requests: one replica would be at 95% of target -- inside the
    # hysteresis band, so the count stays; without the band it would go to 1 and then,
    # at 10.5, straight back to 2.
    r = Run(model(target=10, up=5, down=10), current=2)
    r.at(0, load=9.5)
    assert set(r.hold(100, load=9.5)) == {2}
    assert set(r.hold(200, load=7.9)) == {2, 1}
    assert r.at(201, load=7.9) == 1
    assert set(r.hold(300, load=9.9)) == {1}, "9.9 per replica is under target: no way back up"


def test_an_on_demand_model_wakes_at_once_when_a_request_waits():
    r = Run(model(min=0, max=4, target=16, up=30), current=0)
    assert r.at(0) == 0
    assert r.at(1, pending=1) == 1, "no window for a wake"


def test_a_wake_asks_for_enough_replicas_for_everything_waiting():
    r = Run(model(min=0, max=4, target=16), current=0)
    assert r.at(1, pending=40) == 3
    r = Run(model(min=0, max=2, target=16), current=0)
    assert r.at(1, pending=400) == 2


def test_an_idle_on_demand_model_goes_to_zero_after_its_idle_timeout():
    r = Run(model(min=0, max=2, idle=30), current=0)
    r.at(0, pending=1)
    assert r.at(1, load=1) == 1
    # The request finished at t=2; routers report it as the last use.
    assert r.at(2, load=0, last_used=2) == 1
    assert r.hold(31, load=0) == [1] * 29
    assert r.at(32, load=0) == 0
    assert r.hold(100, load=0, step=10) == [0] * 7, "stays at zero until asked again"
    assert r.at(101, pending=1) == 1


def test_requests_in_flight_keep_an_on_demand_model_awake():
    r = Run(model(min=0, max=2, idle=30), current=1)
    assert set(r.hold(100, load=1)) == {1}


def test_a_router_reporting_a_recent_use_keeps_it_awake():
    r = Run(model(min=0, max=2, idle=30), current=1)
    for t in range(1, 100):
        assert r.at(t, load=0, last_used=t - 0.5) == 1


def test_the_idle_clock_starts_no_earlier_than_the_model_was_first_seen():
    # A new leader: a replica runs, no usage history at all.
    r = Run(model(min=0, max=2, idle=30), current=1, t=1000)
    assert r.at(1000) == 1
    assert r.at(1029) == 1
    assert r.at(1030) == 0


def test_a_model_with_min_above_zero_never_goes_to_zero_when_idle():
    r = Run(model(min=1, max=2, idle=5, down=5), current=1)
    assert set(r.hold(100, load=0)) == {1}


def test_without_reports_the_count_is_held_and_windows_restart():
    r = Run(model(min=0, max=4, target=10, up=10, idle=5), current=2)
    r.at(0, load=50)
    r.hold(9, load=50)
    assert [r.blind(t) for t in range(10, 100)] == [2] * 90, "no reports: neither up, down nor idle"
    assert r.at(100, load=50) == 2, "the up window starts again when reports return"
    assert r.at(110, load=50) == 4


def test_lowered_bounds_apply_at_once():
    r = Run(model(min=1, max=4), current=4)
    assert r.at(0, load=40) == 4
    r.catalog = Catalog([model(min=1, max=2)])
    assert r.at(1, load=40) == 2


def test_external_models_are_not_scaled():
    ext = Model.from_spec(ModelSpec(name="gpt", external={"url": "https://api.example.com"}))
    d = decide(Catalog([ext, model("m")]), {}, {}, {}, 0.0)
    assert dict(d.desired) == {"m": 1}


def test_changes_say_why():
    r = Run(model(min=0, max=2, idle=30), current=0)
    d = decide(r.catalog, {"m": Demand(pending=2)}, {}, {}, 0.0)
    (change,) = d.changes
    assert (change.model, change.before, change.after) == ("m", 0, 1)
    assert "2 request(s) waiting" in change.reason
