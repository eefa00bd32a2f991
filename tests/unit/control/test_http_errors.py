"""Every error status the OpenAPI document lists for an operation happens, with its gRPC code.

The document lists, per operation, the errors of the HTTP port itself
(GENERIC_ERRORS: a request that does not parse, no token, a control plane
without one; 413 where there is a body; 404 where a path variable can
normalize away) and the ones the method declares in
proto/ with ``(llmgw.v1.errors)``. This test holds a request for each
(operation, code) and sends it to real control planes in one process: a
leader, a standby on the same store, and one without an admin token. Each
must answer the documented HTTP status with that code in the error shape;
a listed (operation, code) without a request here fails, and so does a
request for one the document does not list.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from llmgw.common.etcd import MemoryStore
from llmgw.control.controlplane import ControlPlane
from llmgw.control.http.openapi import GENERIC_ERRORS, document
from llmgw.control.http.transcode import service_descriptors
from llmgw.v1 import errors_pb2

from .helpers import until
from .test_controlplane import SECRET, config, running

TOKEN = "errors-admin-token-0123456789"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
EXTRA = {
    "name": "extra",
    "aliases": ["extra-alias"],
    "min_replicas": 0,
    "profile": {"engine": "simulator", "gpus": 1},
}
PEER = json.dumps({"name": "east", "url": "http://127.0.0.1:9"})
# Path variables for the generic cases, which are refused before the method runs.
FILL = {
    "name": "demo",
    "model": "demo",
    "node_id": "node-x",
    "replica_id": "r-1",
    "key": "ghost",
    "id": "abc123",
}
FILL |= {"label": "rack", "value": "r1"}


@dataclass(frozen=True)
class Call:
    path: str
    on: str = "leader"  # leader, standby, no-token
    query: dict[str, str] = field(default_factory=dict)
    body: Any = None
    token: bool = True


def doc(**kw: Any) -> str:
    return json.dumps({**EXTRA, **kw})


# (operationId, gRPC code) -> a request the method answers with that code.
DECLARED: dict[tuple[str, str], Call] = {
    ("AdminService_ListNodes", "UNAVAILABLE"): Call("/api/v1/nodes", on="standby"),
    ("AdminService_ListReplicas", "NOT_FOUND"): Call("/api/v1/replicas", query={"model": "ghost"}),
    ("AdminService_ListRouters", "UNAVAILABLE"): Call("/api/v1/routers", on="standby"),
    ("AdminService_GetModel", "NOT_FOUND"): Call("/api/v1/models/ghost"),
    ("AdminService_AddModel", "INVALID_ARGUMENT"): Call(
        "/api/v1/models", body={"document": doc(name="other", aliases=[], fallbacks=["ghost"])}
    ),
    ("AdminService_AddModel", "FAILED_PRECONDITION"): Call(
        "/api/v1/models", body={"document": doc(name="demo", aliases=[])}
    ),
    ("AdminService_UpdateModel", "INVALID_ARGUMENT"): Call(
        "/api/v1/models", body={"document": doc(min_replicas=-1)}
    ),
    ("AdminService_UpdateModel", "FAILED_PRECONDITION"): Call(
        "/api/v1/models", body={"document": doc(name="demo", aliases=[])}
    ),
    ("AdminService_UpdateModel", "NOT_FOUND"): Call(
        "/api/v1/models", body={"document": doc(name="ghost", aliases=[])}
    ),
    ("AdminService_UpdateModel", "ABORTED"): Call(
        "/api/v1/models", body={"document": doc(), "if_revision": "1"}
    ),
    ("AdminService_RemoveModel", "INVALID_ARGUMENT"): Call("/api/v1/models/extra-alias"),
    ("AdminService_RemoveModel", "FAILED_PRECONDITION"): Call("/api/v1/models/demo"),
    ("AdminService_RemoveModel", "NOT_FOUND"): Call("/api/v1/models/ghost"),
    ("SettingsService_GetSettings", "NOT_FOUND"): Call("/api/v1/settings", query={"version": "999"}),
    ("SettingsService_PutSettings", "INVALID_ARGUMENT"): Call(
        "/api/v1/settings", body={"document": '{"no_such_setting": 1}'}
    ),
    ("SettingsService_PutSettings", "ABORTED"): Call(
        "/api/v1/settings", body={"document": "{}", "if_version": "999"}
    ),
    ("SettingsService_RollbackSettings", "NOT_FOUND"): Call(
        "/api/v1/settings/rollback", body={"version": "999"}
    ),
    ("SettingsService_RollbackSettings", "ABORTED"): Call(
        "/api/v1/settings/rollback", body={"version": "1", "if_version": "999"}
    ),
    ("NodeService_HoldNode", "INVALID_ARGUMENT"): Call("/api/v1/nodes/-bad/hold", body={}),
    ("NodeService_ReleaseNode", "INVALID_ARGUMENT"): Call("/api/v1/nodes/-bad/release", body={}),
    ("NodeService_LabelNode", "INVALID_ARGUMENT"): Call(
        "/api/v1/nodes/node-x/labels", body={"set": {"bad key!": "x"}}
    ),
    ("NodeService_HoldDomain", "INVALID_ARGUMENT"): Call("/api/v1/domains/-bad/r1/hold", body={}),
    ("NodeService_ReleaseDomain", "INVALID_ARGUMENT"): Call("/api/v1/domains/-bad/r1/release", body={}),
    ("PlacementService_ExplainPlacement", "FAILED_PRECONDITION"): Call(
        "/api/v1/models/demo/placement", on="standby"
    ),
    ("PlacementService_ExplainPlacement", "NOT_FOUND"): Call("/api/v1/models/ghost/placement"),
    ("OwnerService_ListOwnerUsage", "FAILED_PRECONDITION"): Call("/api/v1/owners/usage", on="standby"),
    ("NodeAdminService_GetReplicaLogs", "FAILED_PRECONDITION"): Call(
        "/api/v1/replicas/r-1/logs", on="standby"
    ),
    ("NodeAdminService_GetReplicaLogs", "NOT_FOUND"): Call("/api/v1/replicas/r-1/logs"),
    ("NodeAdminService_ListWeights", "FAILED_PRECONDITION"): Call("/api/v1/weights", on="standby"),
    ("NodeAdminService_ListWeights", "NOT_FOUND"): Call("/api/v1/weights", query={"node_id": "ghost"}),
    ("NodeAdminService_FetchWeights", "FAILED_PRECONDITION"): Call(
        "/api/v1/nodes/node-x/weights", on="standby", body={"name": "w", "source": "/w"}
    ),
    ("NodeAdminService_FetchWeights", "NOT_FOUND"): Call(
        "/api/v1/nodes/ghost/weights", body={"name": "w", "source": "/w"}
    ),
    ("NodeAdminService_RemoveWeights", "FAILED_PRECONDITION"): Call(
        "/api/v1/nodes/node-x/weights/w", on="standby"
    ),
    ("NodeAdminService_RemoveWeights", "NOT_FOUND"): Call("/api/v1/nodes/ghost/weights/w"),
    ("KeyService_CreateKey", "INVALID_ARGUMENT"): Call("/api/v1/keys", body={"models": ["ghost"]}),
    ("KeyService_RevokeKey", "NOT_FOUND"): Call("/api/v1/keys/ghost"),
    ("FabricService_RunFabricTest", "INVALID_ARGUMENT"): Call("/api/v1/fabric/tests", body={"pings": 5000}),
    ("FabricService_RunFabricTest", "NOT_FOUND"): Call("/api/v1/fabric/tests", body={"nodes": ["x", "y"]}),
    ("FabricService_RunFabricTest", "FAILED_PRECONDITION"): Call("/api/v1/fabric/tests", body={}),
    ("FabricService_RunFabricTest", "UNAVAILABLE"): Call("/api/v1/fabric/tests", on="standby", body={}),
    ("FederationService_AddPeer", "INVALID_ARGUMENT"): Call("/api/v1/peers", body={"document": "[]"}),
    ("FederationService_AddPeer", "FAILED_PRECONDITION"): Call("/api/v1/peers", body={"document": PEER}),
    ("FederationService_RemovePeer", "NOT_FOUND"): Call("/api/v1/peers/ghost"),
    ("JoinTokenService_CreateJoinToken", "INVALID_ARGUMENT"): Call(
        "/api/v1/join-tokens", body={"max_uses": 1000000}
    ),
    ("JoinTokenService_RevokeJoinToken", "INVALID_ARGUMENT"): Call("/api/v1/join-tokens/Not-An-Id"),
    ("JoinTokenService_RevokeJoinToken", "NOT_FOUND"): Call("/api/v1/join-tokens/abc123"),
    ("CertificateService_RevokeCertificate", "INVALID_ARGUMENT"): Call("/api/v1/revocations", body={}),
}


def _filled(path: str) -> str:
    for name, value in FILL.items():
        path = path.replace("{" + name + "}", value)
    return path


def generic(code: str, path: str, has_body: bool) -> Call:
    """The HTTP port's own refusals, the same for every operation."""
    body = {} if has_body else None
    if code == "INVALID_ARGUMENT":
        return Call(_filled(path), query={"not_a_field": "1"}, body=body)
    if code == "UNAUTHENTICATED":
        return Call(_filled(path), token=False, body=body)
    if code == "PERMISSION_DENIED":
        return Call(_filled(path), on="no-token", body=body)
    if code == "RESOURCE_EXHAUSTED":
        return Call(_filled(path), body={"document": "x" * (1024 * 1024 + 1)})
    if code == "NOT_FOUND":  # a path variable ".." takes the segment before it away
        first = path.index("{")
        return Call(_filled(path[:first] + "%2E%2E" + path[path.index("}", first) + 1 :]), body=body)
    raise AssertionError(f"no generic request for {code}")


def documented() -> list[tuple[str, str, str, int, str, bool]]:
    """(operationId, verb, path, HTTP status, gRPC code, has a body) for every listed error."""
    out = []
    for path, ops in document()["paths"].items():
        for verb, op in ops.items():
            for status, response in op["responses"].items():
                for code in response.get("x-grpc-status", []):
                    body = "requestBody" in op
                    out.append((op["operationId"], verb.upper(), path, int(status), code, body))
    return out


def _declared_in_proto() -> set[tuple[str, str]]:
    out = set()
    for service in service_descriptors():
        for method in service.methods:
            for e in method.GetOptions().Extensions[errors_pb2.errors]:
                out.add((f"{service.name}_{method.name}", e.code))
    return out


def test_every_declared_error_has_a_request_here_and_every_request_a_declared_error():
    generic_codes = {c for c, _ in GENERIC_ERRORS} | {"RESOURCE_EXHAUSTED", "NOT_FOUND"}
    listed = {(op, code) for op, _, _, _, code, _ in documented()}
    declared = {(op, code) for op, code in listed if (op, code) not in DECLARED and code not in generic_codes}
    # Each operation's declared codes, from proto/, need a request here even where a generic
    # refusal shares the code.
    declared |= _declared_in_proto() - set(DECLARED)
    assert not declared, f"documented errors without a request in this test: {sorted(declared)}"
    extra = set(DECLARED) - listed
    assert not extra, f"requests here for errors the document does not list: {sorted(extra)}"


async def test_every_documented_error_status_happens_with_its_code(tmp_path):
    store = MemoryStore()
    leader = ControlPlane(
        config(tmp_path, "control-a", http_listen="127.0.0.1:0"), store, SECRET, admin_token=TOKEN
    )
    standby = ControlPlane(
        config(tmp_path, "control-b", http_listen="127.0.0.1:0"), store, SECRET, admin_token=TOKEN
    )
    open_plane = ControlPlane(
        config(tmp_path, "control-c", http_listen="127.0.0.1:0"), MemoryStore(), SECRET, admin_token=""
    )
    async with running(leader), running(open_plane):
        await until(lambda: leader.controller.accepting and leader.http.port and open_plane.http.port)
        async with running(standby), aiohttp.ClientSession() as http:
            await until(lambda: standby.http.port)
            ports = {
                "leader": leader.http.port,
                "standby": standby.http.port,
                "no-token": open_plane.http.port,
            }
            async with http.post(
                f"http://127.0.0.1:{ports['leader']}/api/v1/models",
                json={"document": json.dumps(EXTRA)},
                headers=BEARER,
            ) as resp:
                assert resp.status == 200, await resp.text()
            async with http.post(
                f"http://127.0.0.1:{ports['leader']}/api/v1/peers", json={"document": PEER}, headers=BEARER
            ) as resp:
                assert resp.status == 200, await resp.text()

            wrong = []
            for op, verb, path, status, code, has_body in documented():
                call = DECLARED.get((op, code)) or generic(code, path, has_body)
                async with http.request(
                    verb,
                    f"http://127.0.0.1:{ports[call.on]}{call.path}",
                    params=call.query,
                    json=call.body,
                    headers=BEARER if call.token else {},
                ) as resp:
                    text = await resp.text()
                try:
                    error = json.loads(text)["error"]
                    ok = (resp.status, error["code"], error["status"]) == (status, status, code)
                    ok = ok and bool(error["message"])
                except (ValueError, KeyError):
                    ok = False
                if not ok:
                    wrong.append(f"{op} {code}: {verb} {call.path} gave {resp.status} {text[:300]}")
            assert not wrong, "documented errors that did not happen:\n" + "\n".join(wrong)
