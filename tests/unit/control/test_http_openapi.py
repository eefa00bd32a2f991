"""The OpenAPI document is generated from proto/ and matches what the transcoder serves."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from llmgw.control.api.auth import ADMIN, POLICY
from llmgw.control.http.openapi import SERVED
from llmgw.control.http.transcode import bindings, service_descriptors

ROOT = Path(__file__).resolve().parents[3]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_openapi", ROOT / "scripts" / "gen_openapi.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_checked_in_documents_are_what_the_protos_generate():
    fresh = _generator().text()
    for path in (ROOT / "docs" / "openapi.json", SERVED):
        assert path.read_text() == fresh, f"{path} is stale: run `.venv/bin/python scripts/gen_openapi.py`"


def test_every_route_the_transcoder_serves_is_documented_and_nothing_else():
    doc = json.loads(SERVED.read_text())
    documented = {(verb.upper(), path) for path, ops in doc["paths"].items() for verb in ops}
    served = {(b.verb, b.path) for b in bindings(service_descriptors())}
    assert served == documented
    assert len(served) == 41  # every annotated admin method (proto/)


def test_every_method_only_an_admin_may_call_has_a_rest_route():
    # "JSON over HTTP for everything the admin gRPC API does": a new admin method
    # without a google.api.http rule would be reachable over gRPC only.
    admin_only = {m for m, roles in POLICY.items() if roles == frozenset({ADMIN})}
    routed = {b.full_method for b in bindings(service_descriptors())}
    assert admin_only - routed == set()
