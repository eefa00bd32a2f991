"""The control plane's HTTP port in one process: REST mapped from the protos, auth, sessions, events.

MemoryStore underneath and a real aiohttp client over loopback; the
browser test with real processes is tests/integration/test_console.py.
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from yarl import URL

from llmgw.common.etcd import MemoryStore
from llmgw.control.controlplane import ControlPlane
from llmgw.control.http.session import COOKIE, CSRF_HEADER
from llmgw.v1 import usage_pb2
from tests.support.rawhttp import exchange

from .helpers import until
from .routers import reporting_router
from .test_controlplane import SECRET, config, running

TOKEN = "test-admin-token-0123456789"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
MODEL = {"name": "extra", "min_replicas": 0, "profile": {"engine": "simulator", "gpus": 1}}


def _plane(tmp_path, token: str = TOKEN) -> ControlPlane:
    return ControlPlane(
        config(tmp_path, "control-a", http_listen="127.0.0.1:0"), MemoryStore(), SECRET, admin_token=token
    )


def _url(plane: ControlPlane, path: str) -> str:
    return f"http://127.0.0.1:{plane.http.port}{path}"


async def _json(resp: aiohttp.ClientResponse) -> dict:
    return json.loads(await resp.text())


async def test_every_api_call_needs_the_token_and_errors_have_one_shape(tmp_path):
    plane = _plane(tmp_path)
    async with running(plane), aiohttp.ClientSession() as http:
        await until(lambda: plane.http.port)
        for method, path in (("GET", "/api/v1/models"), ("POST", "/api/v1/keys"), ("GET", "/metrics")):
            async with http.request(method, _url(plane, path), json={}) as resp:
                assert resp.status == 401
                err = (await _json(resp))["error"]
                assert err["status"] == "UNAUTHENTICATED" and err["code"] == 401
                assert "authorization: Bearer TOKEN" in err["message"]
        wrong = {"Authorization": "Bearer not-the-token-at-all"}
        async with http.get(_url(plane, "/api/v1/models"), headers=wrong) as resp:
            assert resp.status == 401 and "not this cluster's" in (await _json(resp))["error"]["message"]
        async with http.get(_url(plane, "/api/v1/nope"), headers=BEARER) as resp:
            assert resp.status == 404 and (await _json(resp))["error"]["status"] == "NOT_FOUND"
        async with http.get(_url(plane, "/healthz")) as resp:
            assert resp.status == 200
        async with http.get(_url(plane, "/metrics"), headers=BEARER) as resp:
            assert resp.status == 200 and "llmgw_control_leader" in await resp.text(), await resp.text()


async def test_models_settings_nodes_and_keys_over_rest(tmp_path):
    plane = _plane(tmp_path)
    async with running(plane), aiohttp.ClientSession(headers=BEARER) as http:
        await until(lambda: plane.http.port and plane.controller.accepting)
        async with http.get(_url(plane, "/api/v1/models")) as resp:
            assert resp.status == 200
            assert [m["name"] for m in (await _json(resp))["models"]] == ["demo"]
        async with http.post(_url(plane, "/api/v1/models"), json={"document": json.dumps(MODEL)}) as resp:
            assert resp.status == 200, await resp.text()
            added = await _json(resp)
            assert added["origin"] == "runtime"
        async with http.get(_url(plane, "/api/v1/models/extra")) as resp:
            assert (await _json(resp))["revision"] == added["revision"]
        bad = {**MODEL, "min_replicas": -1}
        async with http.put(_url(plane, "/api/v1/models"), json={"document": json.dumps(bad)}) as resp:
            assert resp.status == 400
            err = (await _json(resp))["error"]
            assert err["status"] == "INVALID_ARGUMENT" and "scaling.min" in err["message"]
        async with http.put(
            _url(plane, "/api/v1/models"), json={"document": json.dumps(MODEL), "if_revision": "1"}
        ) as resp:
            assert resp.status == 409 and (await _json(resp))["error"]["status"] == "ABORTED"
        async with http.delete(_url(plane, "/api/v1/models/extra")) as resp:
            assert resp.status == 200
        async with http.get(_url(plane, "/api/v1/models/extra")) as resp:
            assert resp.status == 404

        async with http.get(_url(plane, "/api/v1/settings")) as resp:
            first = await _json(resp)
        doc = {**json.loads(first["document"]), "reconcile_interval_seconds": 0.5}
        async with http.put(
            _url(plane, "/api/v1/settings"),
            json={"document": json.dumps(doc), "if_version": first["version"]},
        ) as resp:
            assert resp.status == 200, await resp.text()
            second = await _json(resp)
            assert second["changed"] == ["reconcile_interval_seconds"]
        async with http.post(
            _url(plane, "/api/v1/settings/rollback"), json={"version": first["version"]}
        ) as resp:
            assert resp.status == 200
        async with http.get(_url(plane, "/api/v1/settings/versions"), params={"limit": "2"}) as resp:
            versions = (await _json(resp))["versions"]
            assert len(versions) == 2 and int(versions[0]["version"]) == int(second["version"]) + 1

        async with http.post(_url(plane, "/api/v1/nodes/node-x/hold"), json={"reason": "disk swap"}) as resp:
            assert (await _json(resp))["held"] is True
        async with http.post(_url(plane, "/api/v1/nodes/node-x/labels"), json={"set": {"zone": "a"}}) as resp:
            assert (await _json(resp))["labels"] == {"zone": "a"}
        async with http.post(_url(plane, "/api/v1/nodes/node-x/release")) as resp:
            assert (await _json(resp))["held"] is False

        async with http.post(_url(plane, "/api/v1/keys"), json={"name": "ci", "models": ["demo"]}) as resp:
            created = await _json(resp)
            assert created["secret"] and created["key"]["name"] == "ci"
        async with http.get(_url(plane, "/api/v1/keys")) as resp:
            listed = (await _json(resp))["keys"]
            assert [k["name"] for k in listed] == ["ci"] and "secret" not in json.dumps(listed)
        async with http.delete(_url(plane, "/api/v1/keys/ci")) as resp:
            assert resp.status == 200
        async with http.delete(_url(plane, "/api/v1/keys/ci")) as resp:
            assert resp.status == 404


@pytest.mark.parametrize(
    ("method", "path", "body", "words"),
    [
        ("POST", "/api/v1/keys", b"{not json", "not valid JSON"),
        ("POST", "/api/v1/keys", b"[1, 2]", "JSON object"),
        ("POST", "/api/v1/keys", b'{"nme": "x"}', "nme"),
        ("POST", "/api/v1/keys", b'{"requests_per_minute": "many"}', "requests_per_minute"),
        ("GET", "/api/v1/settings/versions?limit=x", b"", "limit"),
        ("GET", "/api/v1/models?colour=red", b"", "colour"),
        ("POST", "/api/v1/keys", b"x" * (2 * 1024 * 1024), "larger than"),
    ],
)
async def test_bad_input_is_a_4xx_that_says_what_is_wrong(tmp_path, method, path, body, words):
    plane = _plane(tmp_path)
    async with running(plane), aiohttp.ClientSession(headers=BEARER) as http:
        await until(lambda: plane.http.port)
        headers = {"Content-Type": "application/json"}
        async with http.request(method, _url(plane, path), data=body, headers=headers) as resp:
            assert 400 <= resp.status < 500, await resp.text()
            assert words in (await _json(resp))["error"]["message"]


async def test_console_login_sets_a_strict_http_only_cookie_and_changes_need_the_csrf_token(tmp_path):
    plane = _plane(tmp_path)
    # unsafe: the jar keeps cookies of an IP address (127.0.0.1), as browsers do.
    async with running(plane), aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        await until(lambda: plane.http.port and plane.controller.accepting)
        async with http.post(
            _url(plane, "/api/v1/session"), json={"token": "wrong-token-0123456789"}
        ) as resp:
            assert resp.status == 401
        async with http.post(_url(plane, "/api/v1/session"), json={"token": TOKEN}) as resp:
            assert resp.status == 200
            csrf = (await _json(resp))["csrf_token"]
            cookie = resp.headers["Set-Cookie"]
            assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN not in cookie
        async with http.get(_url(plane, "/api/v1/models")) as resp:
            assert resp.status == 200
        async with http.post(_url(plane, "/api/v1/keys"), json={"name": "k1"}) as resp:
            assert resp.status == 403 and CSRF_HEADER in (await _json(resp))["error"]["message"]
        async with http.post(
            _url(plane, "/api/v1/keys"), json={"name": "k1"}, headers={CSRF_HEADER: "x"}
        ) as resp:
            assert resp.status == 403
        async with http.post(
            _url(plane, "/api/v1/keys"), json={"name": "k1"}, headers={CSRF_HEADER: csrf}
        ) as resp:
            assert resp.status == 200
        async with http.get(_url(plane, "/api/v1/session")) as resp:
            assert (await _json(resp))["csrf_token"] == csrf
        expires, nonce, _ = http.cookie_jar.filter_cookies(URL(_url(plane, "/")))[COOKIE].value.split(".")
        for forged in (f"{expires}.{nonce}.{'0' * 64}", f"{int(expires) + 1}.{nonce}.x", "garbage"):
            async with aiohttp.ClientSession(headers={"Cookie": f"{COOKIE}={forged}"}) as other:
                async with other.get(_url(plane, "/api/v1/models")) as resp:
                    assert resp.status == 401
        async with http.delete(_url(plane, "/api/v1/session"), headers={CSRF_HEADER: csrf}) as resp:
            assert resp.status == 200
        async with http.get(_url(plane, "/api/v1/models")) as resp:
            assert resp.status == 401


async def test_without_an_admin_token_the_http_port_serves_no_api(tmp_path):
    plane = _plane(tmp_path, token="")
    async with running(plane), aiohttp.ClientSession() as http:
        await until(lambda: plane.http.port)
        for path in ("/api/v1/models", "/metrics", "/api/v1/events"):
            async with http.get(_url(plane, path)) as resp:
                assert resp.status == 403 and "admin_token_file" in (await _json(resp))["error"]["message"]
        async with http.post(_url(plane, "/api/v1/session"), json={"token": "anything-at-all-0123"}) as resp:
            assert resp.status == 403


async def test_events_push_the_state_again_when_a_key_is_created(tmp_path):
    plane = _plane(tmp_path)
    async with running(plane), aiohttp.ClientSession(headers=BEARER) as http:
        await until(lambda: plane.http.port and plane.controller.accepting)
        async with http.get(_url(plane, "/api/v1/events")) as events:
            assert events.headers["Content-Type"] == "text/event-stream"

            async def next_state() -> dict:
                data = None
                async for line in events.content:
                    text = line.decode().strip()
                    if text.startswith("data: "):
                        data = json.loads(text[6:])
                    elif not text and data is not None:
                        return data
                raise AssertionError("the stream ended")

            first = await next_state()
            assert [m["name"] for m in first["models"]["models"]] == ["demo"]
            assert first["keys"]["keys"] == []
            async with http.post(_url(plane, "/api/v1/keys"), json={"name": "live"}) as resp:
                assert resp.status == 200
            while not (await next_state())["keys"]["keys"]:
                pass


async def test_routers_load_and_errors_reach_the_api_and_the_event_stream_from_their_reports(tmp_path):
    plane = _plane(tmp_path)
    async with running(plane), aiohttp.ClientSession(headers=BEARER) as http:
        await until(lambda: plane.http.port and plane.controller.accepting)
        router = await reporting_router(plane.address, router_id="router-x")
        try:
            router.endpoints = [usage_pb2.EndpointLoad(endpoint_id="demo-1", model="demo", in_flight=3)]
            router.traffic = [usage_pb2.ModelTraffic(model="demo", requests=10, server_errors=1)]
            await until(lambda: plane.scaler.routers_view(plane.controller.catalog, time.monotonic()).routers)
            start = time.monotonic()
            # Counts since the router started; the rates come from two reports a moment apart.
            await asyncio.sleep(0.3)  # the span the rates are taken over
            router.traffic = [
                usage_pb2.ModelTraffic(model="demo", requests=40, client_errors=3, server_errors=7)
            ]

            async def figures() -> dict:
                async with http.get(_url(plane, "/api/v1/routers")) as resp:
                    assert resp.status == 200, await resp.text()
                    return await _json(resp)

            got = await figures()
            while got["routers"][0]["requests"] != "40":
                got = await figures()
            (r,) = got["routers"]
            assert r["router_id"] == "router-x" and r["in_flight"] == 3
            assert (r["client_errors"], r["server_errors"]) == ("3", "7")
            span = r["window_seconds"]
            assert 0.2 < span < time.monotonic() - start + 2.0
            # From the router's first report (nothing answered yet) to its latest.
            assert r["requests_per_second"] == pytest.approx(40 / span)
            assert r["client_errors_per_second"] == pytest.approx(3 / span)
            assert r["server_errors_per_second"] == pytest.approx(7 / span)
            (demo,) = got["models"]
            assert demo["model"] == "demo" and demo["load"] == 3
            assert demo["server_errors_per_second"] == pytest.approx(7 / span)

            async with http.get(_url(plane, "/api/v1/events")) as resp:
                line = b""
                while not line.startswith(b"data: "):
                    line = await resp.content.readline()
            routers = json.loads(line[6:])["routers"]["routers"]
            assert [x["router_id"] for x in routers] == ["router-x"]
        finally:
            await router.close()


async def test_a_request_refused_as_malformed_runs_nothing(tmp_path):
    # Who may call is checked before what is wrong with the call, without calling the method:
    # a refused CreateKey creates no key, a refused HoldNode holds nothing.
    plane = _plane(tmp_path)
    async with running(plane), aiohttp.ClientSession(headers=BEARER) as http:
        await until(lambda: plane.http.port and plane.controller.accepting)
        async with http.post(_url(plane, "/api/v1/keys"), params={"junk": "1"}, json={}) as resp:
            assert resp.status == 400 and "unknown query parameter" in (await _json(resp))["error"]["message"]
        async with http.post(
            _url(plane, "/api/v1/nodes/node-x/hold"), data=b"{", headers={"Content-Type": "application/json"}
        ) as resp:
            assert resp.status == 400 and "not valid JSON" in (await _json(resp))["error"]["message"]
        async with http.get(_url(plane, "/api/v1/keys")) as resp:
            assert (await _json(resp))["keys"] == []
        async with http.get(_url(plane, "/api/v1/node-overrides")) as resp:
            assert (await _json(resp))["overrides"] == []
        async with aiohttp.ClientSession() as anonymous:
            async with anonymous.post(_url(plane, "/api/v1/keys"), params={"junk": "1"}, json={}) as resp:
                assert resp.status == 401


@pytest.mark.parametrize(
    "request_bytes",
    [
        # A query string over aiohttp's 8,190-byte line limit (schemathesis generated one).
        b"GET /api/v1/replicas/r-1/logs?lines=" + b"%F0%9F%A7%95" * 800 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /api/v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
        b"GET /api/v1/models HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
    ],
    ids=["long request line", "long header", "malformed header"],
)
async def test_bytes_aiohttp_cannot_parse_get_the_error_shape_and_no_traceback(
    tmp_path, caplog, request_bytes
):
    plane = _plane(tmp_path)
    async with running(plane):
        await until(lambda: plane.http.port)
        answer = await exchange(plane.http.port, request_bytes)  # the answer, then it closes
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"400", answer[:300]  # HTTP/1.0 where the version was not read
    assert b"application/json" in head
    error = json.loads(body)["error"]
    assert error["code"] == 400 and error["status"] == "INVALID_ARGUMENT"
    assert error["message"].startswith("malformed HTTP request")
    assert not [r for r in caplog.records if r.levelno >= 40 or r.exc_info], caplog.text


async def test_a_standby_serves_the_api_too_and_names_the_leader_for_what_needs_it(tmp_path):
    store = MemoryStore()
    leader = ControlPlane(config(tmp_path, "control-a"), store, SECRET, admin_token=TOKEN)
    standby = ControlPlane(
        config(tmp_path, "control-b", http_listen="127.0.0.1:0"), store, SECRET, admin_token=TOKEN
    )
    async with running(leader):
        await until(lambda: leader.leadership.is_leader)
        async with running(standby), aiohttp.ClientSession(headers=BEARER) as http:
            await until(lambda: standby.http.port)
            async with http.get(_url(standby, "/api/v1/status")) as resp:
                status = await _json(resp)
                assert status["leader"] is False and status["leader_id"] == "control-a"
            async with http.post(_url(standby, "/api/v1/keys"), json={"name": "from-standby"}) as resp:
                assert resp.status == 200
            async with http.get(_url(standby, "/api/v1/models/demo/placement")) as resp:
                err = (await _json(resp))["error"]
                assert resp.status == 400 and err["status"] == "FAILED_PRECONDITION"
                assert "control-a" in err["message"]
            # Routers report to the leader only.
            async with http.get(_url(standby, "/api/v1/routers")) as resp:
                err = (await _json(resp))["error"]
                assert resp.status == 503 and err["status"] == "UNAVAILABLE"
                assert "control-a" in err["message"]


async def test_the_console_page_is_served_without_data_and_under_a_strict_csp(tmp_path):
    plane = _plane(tmp_path)
    async with running(plane), aiohttp.ClientSession() as http:
        await until(lambda: plane.http.port)
        async with http.get(_url(plane, "/")) as resp:
            assert resp.status == 200 and "llmgw console" in await resp.text()
            csp = resp.headers["Content-Security-Policy"]
            assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
            assert resp.headers["X-Frame-Options"] == "DENY"
        for name in ("app.js", "style.css", "favicon.svg"):
            async with http.get(_url(plane, f"/console/{name}")) as resp:
                assert resp.status == 200 and await resp.read()
        for path in ("/console/../config.py", "/console/transcode.py", "/console/index.html"):
            async with http.get(_url(plane, path)) as resp:
                assert resp.status == 404
        async with http.get(_url(plane, "/openapi.json")) as resp:
            assert (await _json(resp))["openapi"].startswith("3.")


async def test_a_shared_read_of_the_state_is_still_authorized_for_each_stream(tmp_path):
    plane = _plane(tmp_path)
    async with running(plane), aiohttp.ClientSession() as http:
        await until(lambda: plane.http.port and plane.controller.accepting)
        async with http.get(_url(plane, "/api/v1/events"), headers=BEARER) as first:
            assert first.status == 200
            await first.content.readline()  # the first state is read, and now fresh for sharing
            wrong = {"Authorization": "Bearer not-the-token-at-all"}
            async with http.get(_url(plane, "/api/v1/events"), headers=wrong) as second:
                assert second.status == 401
            async with http.get(_url(plane, "/api/v1/events")) as third:
                assert third.status == 401
