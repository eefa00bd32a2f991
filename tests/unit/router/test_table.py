"""The routing table: name and alias resolution, two layers, live state kept by id."""

from __future__ import annotations

from llmgw.router.config import Backend
from llmgw.router.table import Endpoint, Model, RoutingTable, static_layer


def ep(id_: str, model: str = "m", url: str = "http://e") -> Endpoint:
    return Endpoint(id_, model, url)


def test_endpoint_surviving_an_update_keeps_its_live_state_and_removed_ones_drop_it():
    table = RoutingTable(cluster=True)
    table.apply_catalog(snapshot=True, upserts=[Model("m")], removals=[])
    table.apply_endpoints(snapshot=True, upserts=[ep("a"), ep("b")], removals=[])
    table.state("a").in_flight = 2
    table.state("a").consecutive_failures = 1
    # The url changes and a snapshot replaces the table: "a" is still "a".
    table.apply_endpoints(snapshot=True, upserts=[ep("a", url="http://moved"), ep("c")], removals=[])
    assert table.state("a").in_flight == 2
    assert table.state("a").consecutive_failures == 1
    assert table.state("b") is None
    routes = {r.endpoint.id: r for r in table.routes("m")}
    assert routes["a"].endpoint.url == "http://moved"
    assert routes["a"].state is table.state("a")
    table.apply_endpoints(snapshot=False, upserts=[], removals=["c"])
    assert [r.endpoint.id for r in table.routes("m")] == ["a"]


def test_names_win_over_aliases_and_catalog_aliases_over_static_ones():
    models, endpoints = static_layer(
        [Backend(model="s", url="http://s", aliases=["shared", "big"])], created=1
    )
    table = RoutingTable(models, endpoints, cluster=True)
    table.apply_catalog(snapshot=True, upserts=[Model("big"), Model("c", aliases=("shared",))], removals=[])
    assert table.resolve("big").name == "big"
    assert table.resolve("shared").name == "c"
    assert table.resolve("s").name == "s"
    assert table.resolve("nothing") is None


def test_endpoint_routes_only_while_its_model_is_in_the_catalog():
    table = RoutingTable(cluster=True)
    table.apply_endpoints(snapshot=True, upserts=[ep("a", "m")], removals=[])
    table.apply_catalog(snapshot=True, upserts=[Model("m")], removals=[])
    assert len(table.routes("m")) == 1
    table.apply_catalog(snapshot=False, upserts=[], removals=["m"])
    assert table.resolve("m") is None
    assert table.routes("m") == ()


def test_static_backend_of_a_catalog_model_adds_endpoints_and_aliases_to_it():
    models, endpoints = static_layer(
        [
            Backend(model="m", url="http://one/", aliases=["x"]),
            Backend(model="m", url="http://two", aliases=["y"], weight=3),
        ],
        created=5,
    )
    assert [e.id for e in endpoints] == ["static:m:0", "static:m:1"]
    assert endpoints[0].url == "http://one"
    table = RoutingTable(models, endpoints, cluster=True)
    table.apply_catalog(snapshot=True, upserts=[Model("m", ("z",), "team", 42)], removals=[])
    table.apply_endpoints(snapshot=True, upserts=[ep("r1")], removals=[])
    model = table.resolve("y")
    assert (model.name, model.owned_by, model.created) == ("m", "team", 42)
    assert set(model.aliases) == {"x", "y", "z"}
    assert {r.endpoint.id for r in table.routes("m")} == {"r1", "static:m:0", "static:m:1"}


def test_ready_waits_for_catalog_and_endpoints_in_cluster_mode_only():
    assert RoutingTable().ready
    table = RoutingTable(cluster=True)
    assert not table.ready
    table.apply_catalog(snapshot=True, upserts=[], removals=[])
    assert not table.ready
    table.apply_endpoints(snapshot=True, upserts=[], removals=[])
    assert table.ready


def test_an_adapter_is_a_model_whose_routes_are_the_base_endpoints_that_hold_it():
    table = RoutingTable(cluster=True)
    table.apply_catalog(snapshot=True, upserts=[Model("base", adapters=("sql", "fr"))], removals=[])
    holding = Endpoint("a", "base", "http://a", served_name="base-served", adapters=("sql",))
    table.apply_endpoints(snapshot=True, upserts=[holding, ep("b", "base")], removals=[])
    sql = table.resolve("sql")
    assert sql.parent == "base" and sql.on_demand, "an adapter with no holder waits for one"
    routes = table.routes("sql")
    assert [r.endpoint.id for r in routes] == ["a"], "only replicas that hold it"
    assert routes[0].endpoint.upstream_model == "sql", "the engine is asked for the adapter by name"
    assert routes[0].state is table.state("a"), "one engine, one live state, however it is named"
    assert table.routes("fr") == () and table.resolve("fr") is not None
    assert [r.endpoint.id for r in table.all_routes()] == ["a", "b"], "each endpoint once"
    table.apply_catalog(snapshot=True, upserts=[Model("base")], removals=[])
    assert table.resolve("sql") is None and table.routes("sql") == (), "an undeclared adapter is not routed"


def test_an_adapter_named_like_a_model_is_ignored():
    table = RoutingTable(cluster=True)
    table.apply_catalog(
        snapshot=True, upserts=[Model("base", adapters=("other",)), Model("other")], removals=[]
    )
    assert table.resolve("other").parent == ""
