"""The web console in a real browser against a real local cluster (what `llmgw up` starts).

Debian's chromium, driven by Playwright for Python through its
``executable_path`` (browsers are never downloaded: scripts/setup.sh installs
chromium with apt). The cluster is :class:`LocalCluster` with its defaults:
etcd, one control plane serving the console on its HTTP port, a router and
two agents with simulated GPUs. The test logs in with the admin token, sees
both nodes, adds a model (a wrong document first: the catalog's error shows
inline), watches it become ready, scales it, reads a replica's engine log,
changes a setting and rolls it back, creates a key (its secret shown once)
and revokes it, labels a node, holds it and releases it, sets a model's
canary and fallbacks (a wrong candidate first: the catalog's error shows
inline), and sees the router's requests and errors, sent through the
router with the openai client, reach the overview. Every wait is on
something the page shows, pushed by the event stream.

Screenshots of each page are taken on the way; with
LLMGW_CONSOLE_SCREENSHOTS=1 they are written to docs/console/ (the README
shows them), otherwise to the test's temporary directory.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import urllib.request
from pathlib import Path

import openai
import playwright.sync_api as playwright
import pytest

from llmgw.cli.localcluster import LocalCluster, Ports
from tests.support.procs import free_port, free_port_pair

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
WAIT_MS = 90_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.fail("no chromium: `apt-get install chromium` (scripts/setup.sh does when run as root)")
    state = tmp_path_factory.mktemp("console-cluster")
    c = LocalCluster(
        state_dir=state,
        ports=Ports(router=free_port(), control=free_port(), etcd=free_port_pair(), console=free_port()),
    )
    try:
        c.start(out=io.StringIO())
        yield c
    finally:
        c.stop()


@pytest.fixture
def shots(tmp_path) -> Path:
    if os.environ.get("LLMGW_CONSOLE_SCREENSHOTS") == "1":
        out = ROOT / "docs" / "console"
        out.mkdir(exist_ok=True)
        return out
    return tmp_path


def test_console_runs_the_fleet_in_a_browser(cluster, shots):
    token = cluster.token_file.read_text().strip()
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 860})
            page.set_default_timeout(WAIT_MS)
            page.on("dialog", lambda d: d.accept(d.default_value or "maintenance"))
            _walk(page, cluster, token, shots)
        finally:
            browser.close()


def _totals(text: str) -> tuple[int, int, int]:
    """The router row's "N requests · X 5xx · Y 4xx"."""
    requests, server, client = (int(part.split()[0]) for part in text.split("·"))
    return requests, server, client


def cluster_model(cluster: LocalCluster, token: str, name: str) -> dict:
    """The model document as the REST API has it (what the CLI reads over gRPC)."""
    request = urllib.request.Request(
        f"{cluster.console_url}/api/v1/models/{name}", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read())


def _shot(page, shots: Path, name: str) -> None:
    page.screenshot(path=str(shots / f"{name}.png"), full_page=True)


def _walk(page, cluster: LocalCluster, token: str, shots: Path) -> None:
    expect = playwright.expect
    page.goto(cluster.console_url + "/")
    expect(page.locator("#login-form")).to_be_visible()
    _shot(page, shots, "login")
    page.fill("#token", "not-the-admin-token")
    page.click("#login-form button")
    expect(page.locator("#login-error")).to_contain_text("not this cluster's admin token")
    page.fill("#token", token)
    page.click("#login-form button")

    # The token is nowhere the page can read it: only an HttpOnly cookie holds the session.
    cookies = page.context.cookies()
    assert [c["name"] for c in cookies] == ["llmgw_session"] and cookies[0]["httpOnly"]
    assert cookies[0]["sameSite"] == "Strict"
    assert token not in page.evaluate("document.cookie + JSON.stringify(localStorage) + location.href")

    # Overview: both nodes of the local cluster, the demo model's replicas ready.
    expect(page.locator("#stat-nodes .stat-value")).to_have_text("2 / 2")
    expect(page.locator("#stat-replicas .stat-value")).to_have_text("2 / 2")
    # The router's usage reports reach the leader: one router, and what it answered.
    expect(page.locator("#stat-routers .stat-value")).to_have_text("1")
    router_row = page.locator("tr[data-router]")
    expect(router_row).to_have_count(1)
    before = _totals(router_row.locator(".totals").inner_text())
    client = openai.OpenAI(base_url=cluster.router_url + "/v1", api_key="unused", max_retries=0)
    for _ in range(3):
        client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    # Counted by the router, sent up in its next usage report, pushed to the page.
    after = f"{before[0] + 4} requests · {before[1]} 5xx · {before[2] + 1} 4xx"
    expect(router_row.locator(".totals")).to_have_text(after)
    expect(page.locator("tr[data-model=demo] .rps")).not_to_have_text("–")
    _shot(page, shots, "overview")

    page.click("nav a[data-view=nodes]")
    for node in ("node-a", "node-b"):
        expect(page.locator(f"tr[data-node={node}]")).to_contain_text("ready")
    _shot(page, shots, "nodes")

    # Models: a wrong document first, its error inline; then the right one.
    page.click("nav a[data-view=models]")
    page.click("#add-model")
    wrong = {"name": "chat-b", "scaling": {"min": 1, "max": 0}, "profile": {"engine": "simulator", "gpus": 1}}
    page.fill("#model-doc", json.dumps(wrong, indent=2))
    page.click("#model-form button[type=submit]")
    expect(page.locator("#model-form .error")).to_contain_text("INVALID_ARGUMENT")
    expect(page.locator("#model-form .error")).to_contain_text("scaling.max")
    _shot(page, shots, "models-error")
    right = {**wrong, "scaling": {"min": 1}}
    page.fill("#model-doc", json.dumps(right, indent=2))
    page.click("#model-form button[type=submit]")
    expect(page.locator("#model-form")).to_have_count(0)
    row = page.locator("tr[data-model=chat-b]")
    expect(row.locator(".bar span")).to_have_text("1/1")
    page.fill("#scale-chat-b", "2")
    row.locator("button", has_text="Scale").click()
    expect(row.locator(".bar span")).to_have_text("2/2")
    # The demo model is declared (cluster settings): scaling it writes a settings version.
    demo = page.locator("tr[data-model=demo]")
    page.fill("#scale-demo", "1")
    demo.locator("button", has_text="Scale").click()
    expect(demo.locator(".bar span")).to_have_text("1/1")

    # Edit: a refused change shows the control plane's reason inline; then one that holds.
    row.locator("button", has_text="Edit").click()
    edited = json.loads(page.locator("#model-doc").input_value())
    page.fill("#model-doc", json.dumps({**edited, "aliases": ["demo-chat"]}, indent=2))
    page.click("#model-form button[type=submit]")
    expect(page.locator("#model-form .error")).to_contain_text("FAILED_PRECONDITION")
    expect(page.locator("#model-form .error")).to_contain_text("declared in the cluster settings")
    page.fill("#model-doc", json.dumps({**edited, "aliases": ["chat-bee"]}, indent=2))
    page.click("#model-form button[type=submit]")
    expect(page.locator("#model-form")).to_have_count(0)
    expect(row).to_contain_text("chat-bee")

    # Canary and fallbacks: the control plane's validation, inline; then a change that holds.
    row.locator("button", has_text="Canary & fallbacks").click()
    form = page.locator("#routing-form")
    expect(form.locator("#routing-canary")).to_be_visible()
    form.locator("#routing-canary").fill("no-such-model")
    form.locator("#routing-percent").fill("10")
    form.locator("button[type=submit]").click()
    expect(form.locator(".error")).to_contain_text("INVALID_ARGUMENT")
    expect(form.locator(".error")).to_contain_text("canary 'no-such-model', which is not in the catalog")
    _shot(page, shots, "models-canary")
    form.locator("#routing-canary").fill("demo")
    form.locator("#routing-fallbacks").fill("demo")
    form.locator("button[type=submit]").click()
    expect(form).to_have_count(0)
    expect(row.locator(".notes")).to_contain_text("fallbacks: demo")
    expect(row.locator(".notes")).to_contain_text("canary: 10% to demo")
    stored = json.loads(cluster_model(cluster, token, "chat-b")["document"])
    assert stored["fallbacks"] == ["demo"] and stored["canary"] == {"model": "demo", "percent": 10.0}
    # A declared model's are in the cluster settings, which the same form changes by a
    # settings version; they are validated alone, so a runtime model is no fallback there.
    demo.locator("button", has_text="Canary & fallbacks").click()
    expect(form).to_contain_text("writes a new settings version")
    expect(form.locator("#routing-fallbacks")).to_be_visible()
    form.locator("#routing-fallbacks").fill("chat-b")
    form.locator("button[type=submit]").click()
    expect(form.locator(".error")).to_contain_text("the settings: 1 problem(s)")
    expect(form.locator(".error")).to_contain_text("falls back to 'chat-b', which is not in the catalog")
    form.locator("button", has_text="Cancel").click()
    _shot(page, shots, "models")

    # Replicas and an engine log.
    page.click("nav a[data-view=replicas]")
    first = page.locator("tr[data-replica]").first
    expect(first).to_contain_text("ready")
    first.locator("button", has_text="Logs").click()
    expect(page.locator("#logs pre.log")).not_to_be_empty()
    _shot(page, shots, "replicas")

    # Settings: a change, then a rollback to the version before it.
    page.click("nav a[data-view=settings]")
    editor = page.locator("#settings-doc")
    expect(editor).not_to_be_empty()
    before = json.loads(editor.input_value())
    version = int(page.locator("tr[data-version]").first.get_attribute("data-version"))
    page.fill("#settings-doc", json.dumps({**before, "failure_backoff_seconds": 7.5}, indent=2))
    page.fill("#settings-reason", "try a shorter backoff")
    page.click("text=Save new version")
    expect(page.locator(f"tr[data-version='{version + 1}']")).to_contain_text("in force")
    page.locator(f"tr[data-version='{version}'] button", has_text="Roll back").click()
    expect(page.locator(f"tr[data-version='{version + 2}']")).to_contain_text("in force")
    expect(page.locator("#settings-doc")).to_have_value(json.dumps(before, indent=2))
    page.locator(f"tr[data-version='{version + 1}'] button", has_text="Diff").click()
    expect(page.locator("#diff .del")).to_contain_text("failure_backoff_seconds")  # in v2, not in force now
    _shot(page, shots, "settings")

    # Keys: created, shown once, revoked.
    page.click("nav a[data-view=keys]")
    page.fill("#key-name", "ci-bot")
    page.click("#key-form button[type=submit]")
    secret = page.locator("#secret-value").inner_text()
    assert len(secret) > 20
    expect(page.locator("tr[data-key=ci-bot]")).to_be_visible()
    _shot(page, shots, "keys")
    page.click("#key-secret button:has-text('Done')")
    expect(page.locator("#secret-value")).to_have_count(0)
    assert secret not in page.content()
    page.locator("tr[data-key=ci-bot] button", has_text="Revoke").click()
    expect(page.locator("tr[data-key=ci-bot]")).to_have_count(0)

    # Nodes: why a model runs where it does, per node; a label, then a hold (drain) and its release.
    page.click("nav a[data-view=nodes]")
    page.select_option("#explain-model", "chat-b")
    page.locator("form:has(#explain-model) button").click()
    for name in ("node-a", "node-b"):
        expect(page.locator("#explain tr", has_text=name).first).to_be_visible()
    node = page.locator("tr[data-node=node-b]")
    node.locator("input").fill("zone=b")
    node.locator("button", has_text="Label").click()
    expect(node.locator(".chip", has_text="zone=b")).to_be_visible()
    node.locator("button", has_text="Hold & drain").click()
    expect(node.locator(".badge")).to_have_text("held")
    expect(node).to_contain_text("maintenance")
    node.locator("button", has_text="Release").click()
    expect(node.locator(".badge")).to_have_text("ready")
