"""``llmgw status`` as people read it."""

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
