"""Property-based: schemathesis sends what the OpenAPI document allows (and what it does not) to the REST API.

No input may give a 5xx, and every 4xx is the one error shape with a
message. A control plane runs in-process (MemoryStore, no agents) on its
own event loop in a thread; the requests carry the admin token, so they
reach the servicers. Kept short: a bounded number of examples per
operation (EXAMPLES), which covers every route with valid and invalid
bodies, paths and query strings in a few seconds.
"""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from llmgw.common.etcd import MemoryStore
from llmgw.control.controlplane import ControlPlane
from llmgw.control.http.openapi import document

from .test_controlplane import SECRET, config

TOKEN = "fuzz-admin-token-0123456789"
EXAMPLES = 20


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    # Defaults for the settings read only at start (lease_ttl_seconds, watch_history):
    # a generated settings document that validates must not restart the control plane.
    cfg = config(
        tmp_path_factory.mktemp("fuzz"), "control-fuzz", http_listen="127.0.0.1:0", lease_ttl_seconds=5
    )
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    started = threading.Event()
    planes: list[ControlPlane] = []

    async def serve():
        # Built on the loop that runs it (grpc.aio binds its server to the loop).
        plane = ControlPlane(cfg, MemoryStore(), SECRET, admin_token=TOKEN)
        planes.append(plane)
        task = asyncio.create_task(plane.run(stop))
        while not (plane.http and plane.http.port) and not task.done():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        started.set()
        await task

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(10), "the control plane did not start"
    plane = planes[0]
    yield f"http://127.0.0.1:{plane.http.port}"
    loop.call_soon_threadsafe(stop.set)
    thread.join(15)
    assert not plane.restart_requested, "a generated settings change restarted the control plane"


# The document the control plane serves (the file shipped with the package).
schema = schemathesis.openapi.from_dict(document())


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_input_gives_a_server_error(case, base_url):
    response = case.call(base_url=base_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=20)
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.text}"
    if response.status_code >= 400:
        error = json.loads(response.text)["error"]
        assert error["code"] == response.status_code and error["status"] and error["message"]
        # Every error a generated request for the operation meets is one the document lists
        # for it, by status and gRPC code (test_http_errors.py makes each listed one happen).
        # (Schemathesis also tries methods the path does not take: 405, no operation's.)
        if case.method.upper() == case.operation.method.upper():
            documented = case.operation.definition.raw["responses"].get(str(response.status_code), {})
            assert error["status"] in documented.get("x-grpc-status", []), (
                f"{case.method} {case.formatted_path}: undocumented {response.status_code} {error}"
            )
