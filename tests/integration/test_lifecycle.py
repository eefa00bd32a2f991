"""Eval gates and rolling updates, over real processes: etcd, control, router, agents, simulators.

Eval gates: a model whose gate names a suite it cannot pass (the simulator
never says "paris") gets a replica that is never published: the router has
no endpoint for it, ``llmgw models`` says why with the score, and etcd
keeps the failed result with the weights' revision. Changing the gate to
a scoring command that passes it promotes the same replica: published, and
it answers the official openai client.

Rolling updates: a model with two replicas, four clients streaming through
the router with the official openai client the whole time. Changing its
weights' revision replaces both replicas one at a time (progress in
``llmgw models``): no client request fails, and at the end the old engine
processes are gone. Then a change whose new replica fails to start rolls
back: the two replicas that serve are never touched (same PIDs), the
failed version is not published, and still no request fails. A gated
model's update whose new version fails the gate rolls back the same way:
the new replica is never published and the old ones keep serving.

New weights: a model whose ``weights.source`` is a local path serves
those weights (the simulator reports what it was given as the answers'
``system_fingerprint``, seen through the router by the openai client).
Changing the path rolls both replicas under four streaming clients with
no failure; every answer comes whole from one version, and once the roll
is done every answer comes from the new weights, which each node's
weights cache now lists.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster import QUICK_AGENT, Cluster, running_cluster
from tests.support.procs import tool
from tests.support.streams import Clients

pytestmark = pytest.mark.integration

GATED = "gated"
ROLLED = "rolled"
WEIGHTED = "weighted"
SCORER = (
    "import json, sys; d = json.load(sys.stdin); print(1.0 if all(c['answer'] for c in d['cases']) else 0.0)"
)
SUITES = {
    "geography": {"metric": "contains", "cases": [{"prompt": "Capital of France?", "expected": "paris"}]},
    # Passes a version whose answers are 16 words long (output-tokens 16), fails any other.
    "sixteen": {
        "metric": "regex",
        "max_tokens": 64,
        "cases": [{"prompt": "Count to sixteen.", "expected": r"^( [a-z]+){16}$"}],
    },
    "judged": {
        "metric": "command",
        "command": [sys.executable, "-c", SCORER],
        "command_timeout_seconds": 30,
        "cases": [{"prompt": "Say anything.", "expected": ""}],
    },
}
PROFILE = {"engine": "simulator", "gpus": 1, "args": {"ttft-ms": "20", "itl-ms": "10", "output-tokens": "16"}}


def _etcd_range(c: Cluster, prefix: str) -> dict[str, bytes]:
    root = "/llmgw/test/"
    out = subprocess.run(
        [tool("etcdctl"), "--endpoints", c.etcd, "get", "--prefix", root + prefix, "-w", "json"],
        capture_output=True,
        timeout=30,
        check=True,
    )
    return {
        base64.b64decode(kv["key"]).decode().removeprefix(root): base64.b64decode(kv.get("value", ""))
        for kv in json.loads(out.stdout).get("kvs", [])
    }


def _model(c: Cluster, name: str) -> dict:
    return next(m for m in c.llmgw_json("models")["models"] if m["name"] == name)


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _ok(c: Cluster, *args: str) -> str:
    done = c.llmgw(*args)
    assert done.returncode == 0, f"llmgw {' '.join(args)}: {done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_cluster(
        tmp_path_factory.mktemp("lifecycle"),
        [],
        nodes={"node-a": 3, "node-b": 3},
        control={"reconcile_interval_seconds": 0.5, "eval_suites": SUITES, "failure_backoff_seconds": 1.0},
        agent=QUICK_AGENT,
    ) as c:
        yield c


def test_a_failing_eval_gate_keeps_the_candidate_unpublished_and_a_passing_one_promotes_it(cluster):
    c = cluster
    doc = {
        "name": GATED,
        "min_replicas": 1,
        "profile": PROFILE,
        "weights": {"revision": "r1"},
        "eval_gate": {"suite": "geography", "min_score": 0.5},
    }
    added = c.llmgw("model", "add", "-", stdin=json.dumps(doc))
    assert added.returncode == 0, added.stderr
    failed = c.wait_for(
        lambda: (m := _model(c, GATED)).get("eval_gate", "").startswith("failed") and m,
        60,
        "the eval gate's verdict",
    )
    assert failed["ready_replicas"] == 1, "the candidate runs"
    assert "score 0 (min 0.5, suite geography) on r1" in failed["eval_gate"], failed
    assert c.router_endpoints(GATED) == 0, "a failed candidate is never published"
    assert not any(k.startswith(f"endpoints/{GATED}-") for k in _etcd_range(c, "endpoints/"))
    (stored,) = [json.loads(v) for v in _etcd_range(c, f"evals/{GATED}/").values()]
    assert (stored["passed"], stored["revision"], stored["score"]) == (False, "r1", 0.0)
    assert "0 of 1 case(s) passed" in stored["reason"]
    listing = _ok(c, "models")
    assert f"{GATED}: eval gate failed: score 0" in listing, listing
    assert "eval gate: failed" in _ok(c, "explain", GATED)

    pids = c.engine_pids()
    _ok(c, "model", "set", GATED, "eval_gate={suite: judged, min_score: 0.9}")
    c.wait(lambda: c.router_endpoints(GATED) == 1, 60, "the candidate published once it passes")
    assert _model(c, GATED)["eval_gate"].startswith("passed: score 1 (min 0.9, suite judged)")
    answer = c.client().chat.completions.create(model=GATED, messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content
    assert c.engine_pids() == pids, "the gate judged the replica that runs; nothing restarted"
    _ok(c, "model", "remove", GATED)
    c.wait(lambda: not [p for p in pids.values() if _alive(p)], 30, "the gated model's engine stopped")


def test_a_rolling_update_replaces_two_replicas_under_four_streams_and_rolls_back_a_failing_one(cluster):
    c = cluster
    doc = {"name": ROLLED, "min_replicas": 2, "profile": PROFILE, "weights": {"revision": "v1"}}
    added = c.llmgw("model", "add", "-", stdin=json.dumps(doc))
    assert added.returncode == 0, added.stderr
    c.wait(lambda: c.ready(ROLLED) == 2 and c.router_endpoints(ROLLED) == 2, 60, "two v1 replicas routed")
    v1 = c.engine_pids()
    v1_ids = set(v1)
    assert len(v1) == 2
    progress: set[str] = set()

    with Clients(c.router_url, model=ROLLED, count=4) as clients:
        c.wait(lambda: clients.requests >= 8, 30, "clients streaming before the update")
        _ok(c, "model", "set", ROLLED, "weights.revision=v2")

        def rolled() -> bool:
            m = _model(c, ROLLED)
            if m.get("rollout"):
                progress.add(m["rollout"])
            ids = {r.replica_id for r in c.replicas(ROLLED)}
            return not ids & v1_ids and c.ready(ROLLED) == 2 and c.router_endpoints(ROLLED) == 2

        c.wait(rolled, 90, "both replicas replaced")
        after_update = clients.requests
        c.wait(lambda: clients.requests >= after_update + 8, 30, "clients streaming after the update")
        v2 = c.engine_pids()
        assert set(v2).isdisjoint(v1_ids) and len(v2) == 2
        c.wait(lambda: not [p for p in v1.values() if _alive(p)], 30, "the old engines gone")
        c.wait(lambda: not _model(c, ROLLED).get("rollout"), 10, "the rollout marked done")
        assert any("1 of 2 on the new revision" in p for p in progress), progress

        # A version whose replica cannot start (the simulator refuses output-tokens 0): rolled back.
        _ok(c, "model", "set", ROLLED, "profiles.0.args.output-tokens='0'")
        back = c.wait_for(
            lambda: (r := _model(c, ROLLED).get("rollout", "")).startswith("rolled back") and r,
            60,
            "the failed update rolled back",
        )
        assert "failed" in back, back
        c.wait(lambda: set(c.engine_pids()) == set(v2), 30, "only the v2 replicas run")
        settled = clients.requests
        c.wait(lambda: clients.requests >= settled + 8, 30, "clients streaming after the rollback")

    print(
        f"\nrolling update: {clients.requests} requests, outcomes {dict(clients.outcomes)}; "
        f"progress seen {sorted(progress)}; rollback: {back}"
    )
    assert clients.outcomes["ok"] == clients.requests, "\n".join(clients.errors)
    assert all(_alive(p) for p in v2.values()), "the rollback never touched the serving replicas"
    assert c.router_endpoints(ROLLED) == 2


def test_a_rolling_update_whose_new_version_fails_the_eval_gate_rolls_back_unpublished(cluster):
    c = cluster
    name = "judged-roll"
    doc = {
        "name": name,
        "min_replicas": 2,
        "profile": PROFILE,
        "weights": {"revision": "g1"},
        "eval_gate": {"suite": "sixteen", "min_score": 1.0},
    }
    added = c.llmgw("model", "add", "-", stdin=json.dumps(doc))
    assert added.returncode == 0, added.stderr
    c.wait(lambda: c.router_endpoints(name) == 2, 60, "two replicas past the gate, routed")
    assert _model(c, name)["eval_gate"].startswith("passed: score 1")
    before = {r.replica_id for r in c.replicas(name)}
    published: set[str] = set()

    with Clients(c.router_url, model=name, count=4) as clients:
        c.wait(lambda: clients.requests >= 8, 30, "clients streaming before the update")
        # Eight words an answer: the new version cannot pass the gate.
        _ok(c, "model", "set", name, "profiles.0.args.output-tokens='8'", "weights.revision=g2")

        def rolled_back() -> str:
            published.update(k.removeprefix("endpoints/") for k in _etcd_range(c, "endpoints/"))
            return _model(c, name).get("rollout", "").startswith("rolled back") and _model(c, name)["rollout"]

        back = c.wait_for(rolled_back, 60, "the update rolled back by the gate")
        c.wait(lambda: {r.replica_id for r in c.replicas(name)} == before, 30, "only the old replicas left")
        settled = clients.requests
        c.wait(lambda: clients.requests >= settled + 8, 30, "clients streaming after the rollback")

    assert "the eval gate failed it" in back and "0 of 1 case(s) passed" in back, back
    assert published & {f"{r}" for r in before} == before
    assert not {p for p in published if p.startswith(name) and p not in before}, (
        "the new version was published"
    )
    assert _model(c, name)["eval_gate"].startswith("failed: score 0"), "the new version's verdict is shown"
    assert clients.outcomes["ok"] == clients.requests, "\n".join(clients.errors)
    assert c.router_endpoints(name) == 2


def test_new_weights_roll_the_replicas_and_the_new_ones_serve_them(cluster, tmp_path):
    c = cluster
    v1, v2 = tmp_path / "weights-v1", tmp_path / "weights-v2"
    for d in (v1, v2):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"w" * 1000)
    doc = {"name": WEIGHTED, "min_replicas": 2, "profile": PROFILE, "weights": {"source": str(v1)}}
    added = c.llmgw("model", "add", "-", stdin=json.dumps(doc))
    assert added.returncode == 0, added.stderr
    c.wait(lambda: c.router_endpoints(WEIGHTED) == 2, 60, "two replicas of v1 routed")
    before = {r.replica_id for r in c.replicas(WEIGHTED)}
    old_pids = {rid: pid for rid, pid in c.engine_pids().items() if rid in before}
    assert len(old_pids) == 2

    def served() -> str | None:
        answer = c.client().chat.completions.create(
            model=WEIGHTED, messages=[{"role": "user", "content": "hi"}]
        )
        return answer.system_fingerprint

    assert {served() for _ in range(4)} == {str(v1)}, "the replicas serve the model document's weights"

    with Clients(c.router_url, model=WEIGHTED, count=4) as clients:
        c.wait(lambda: clients.requests >= 8, 30, "clients streaming before the update")
        _ok(c, "model", "set", WEIGHTED, f"weights.source={v2}")

        def rolled() -> bool:
            ids = {r.replica_id for r in c.replicas(WEIGHTED)}
            return not ids & before and c.ready(WEIGHTED) == 2 and c.router_endpoints(WEIGHTED) == 2

        c.wait(rolled, 90, "both replicas replaced")
        c.wait(lambda: not _model(c, WEIGHTED).get("rollout"), 30, "the rollout marked done")
        done = len(clients.served)
        c.wait(lambda: len(clients.served) >= done + 8, 30, "clients streaming after the update")

    print(f"\nnew weights: {clients.requests} requests, outcomes {dict(clients.outcomes)}")
    assert clients.outcomes["ok"] == clients.requests, "\n".join(clients.errors)
    seen = clients.served
    assert set(seen) == {(str(v1),), (str(v2),)}, f"each answer whole from one version: {set(seen)}"
    assert set(seen[done:]) == {(str(v2),)}, "after the roll only the new weights answer"
    assert {served() for _ in range(4)} == {str(v2)}
    c.wait(lambda: not [p for p in old_pids.values() if _alive(p)], 30, "the old engines gone")
    nodes = {r.node_id for r in c.replicas(WEIGHTED)}

    def held() -> set[tuple[str, str]]:
        listed = c.llmgw_json("weights").get("nodes", [])
        return {(n["node_id"], w["source"]) for n in listed for w in n.get("weights", [])}

    c.wait(lambda: {(n, str(v2)) for n in nodes} <= held(), 30, "the new weights in the nodes' caches")
    _ok(c, "model", "remove", WEIGHTED)
