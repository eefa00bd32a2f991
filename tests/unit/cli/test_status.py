"""``llmgw status`` and ``llmgw routers`` as people read them."""

from __future__ import annotations

from llmgw.cli.admin import render
from llmgw.v1 import admin_pb2


def test_status_shows_the_settings_version_and_a_pending_restart():
    msg = admin_pb2.ClusterStatus(cluster="c", control_id="cp-1", leader=True, settings_version=7)
    assert "settings:       version 7" in render("status", msg)
    msg.restart_pending.append("lease_ttl_seconds")
    assert "version 7, restarting for lease_ttl_seconds" in render("status", msg)


def test_status_before_etcd_was_read_says_the_settings_are_the_files():
    msg = admin_pb2.ClusterStatus(cluster="c", control_id="cp-1")
    assert "settings:       version - (from the file)" in render("status", msg)


def test_routers_shows_each_routers_error_shares_and_each_models():
    msg = admin_pb2.ListRoutersResponse(
        routers=[
            admin_pb2.RouterStatus(
                router_id="r1",
                requests=100,
                server_errors=5,
                requests_per_second=4.0,
                server_errors_per_second=1.0,
                client_errors_per_second=0.5,
            )
        ],
        models=[admin_pb2.ModelTrafficStatus(model="", requests_per_second=0.0, load=2)],
        window_seconds=60,
    )
    out = render("routers", msg)
    row = next(line for line in out.splitlines() if line.startswith("r1"))
    assert "4.00" in row and "25.0%" in row and "12.5%" in row and "100 requests, 5 5xx, 0 4xx" in row
    assert "(no model)" in out and "last 60s" in out
