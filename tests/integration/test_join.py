"""Joining with a token and revoking certificates, on a cluster started as `llmgw up` starts it (mutual TLS).

The control plane is given the CA's key (``join.ca_key_file``) and a join
port; the cluster starts with no node at all. What is shown:

- an agent that has only a join token (in a file) and the CA's hash joins:
  it generates its key, gets its node certificate, registers over mutual
  TLS and serves the model a client then asks through the router;
- a used-up, expired, revoked, wrong or unknown token is refused, saying
  which, and nothing is signed;
- a server whose CA is not the pinned one gets nothing: the agent stops
  before it sends the token (the token is still unused), and an agent
  process with a wrong hash exits 1 saying so; an impostor join port (its
  own CA, or its own certificate followed by the cluster's public CA) is
  never sent the token;
- a node id with a live identity cannot be taken over by a token, unless
  the admin made the token for that node with --replace (which revokes
  the old certificate);
- a revoked certificate is refused on new calls, and its open streams (an
  agent's Connect, a router's Watch) are ended at once with the reason, on
  every control plane (the cluster has two; the revocation is made through
  one, the watch it ends is on the other).
"""

from __future__ import annotations

import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives import serialization

from llmgw.common import pki
from llmgw.common.errors import Unavailable
from llmgw.common.joining import JoinRefused, join, make_csr
from llmgw.common.tls import TlsSettings, join_port_credentials
from llmgw.v1 import endpoints_pb2, endpoints_pb2_grpc, trust_pb2, trust_pb2_grpc
from tests.support.cluster import QUICK_AGENT, Cluster, running_cluster, simulator_model
from tests.support.procs import free_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    state = tmp_path_factory.mktemp("join")
    with running_cluster(
        state,
        [simulator_model("demo", 1)],
        name="join",
        nodes={},
        controls=("control-1", "control-2"),
        admin_token="join-test-admin-token-0123",
        control={
            "join": {
                "ca_key_file": str(state / "tls" / "ca.key"),
                "listen": "127.0.0.1:0",
                # Every join of this module comes from 127.0.0.1.
                "per_peer_burst": 200,
            },
            "node_timeout_seconds": 3,
        },
    ) as c:
        yield c


def _token(cluster: Cluster, *flags: str) -> dict:
    return cluster.llmgw_json("nodes", "join-token", "create", *flags)


def _token_state(cluster: Cluster, token_id: str) -> dict:
    tokens = cluster.llmgw_json("nodes", "join-token", "list").get("tokens", [])
    return next(t for t in tokens if t["id"] == token_id)


def _join(created: dict, node: str, token: str = "", pin: str = ""):
    return join(
        created["join_address"],
        token or created["secret"],
        pin or created["ca_cert_hash"],
        node,
        ["127.0.0.1"],
    )


def _joiner_config(cluster: Cluster, node: str, created: dict, pin: str = "") -> dict:
    d = cluster.state / "joined" / node
    d.mkdir(parents=True, exist_ok=True)
    token_file = d / "join.token"
    token_file.write_text(created["secret"] + "\n")
    token_file.chmod(0o600)
    return {
        "tls": {
            "ca_file": str(d / "ca.crt"),
            "cert_file": str(d / "node.crt"),
            "key_file": str(d / "node.key"),
        },
        "join": {
            "address": created["join_address"],
            "token_file": str(token_file),
            "ca_cert_hash": pin or created["ca_cert_hash"],
        },
        **QUICK_AGENT,
    }


def test_an_agent_with_only_a_token_joins_and_serves_a_model(cluster):
    created = _token(cluster, "--ttl", "10m", "--description", "first node")
    assert created["ca_cert_hash"] == pki.ca_pin(pki.load_certs((cluster.pki.dir / "ca.crt").read_bytes())[0])
    config = _joiner_config(cluster, "joiner", created)
    cluster.start_agent("joiner", 1, config)
    cluster.wait(lambda: cluster.node_state("joiner") == "ready", 30, "the joined node registered")
    cluster.wait(lambda: cluster.ready("demo") == 1, 30, "demo ready on the joined node")
    reply = cluster.client().chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "hello"}]
    )
    assert reply.choices[0].message.content
    key = Path(config["tls"]["key_file"])
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    identity = pki.identity_of(Path(config["tls"]["cert_file"]).read_bytes())
    assert identity is not None and (identity.role, identity.name) == ("node", "joiner")
    used = _token_state(cluster, created["token"]["id"])
    assert used["uses"] == 1 and used["state"] == "used up"
    assert [u["node_id"] for u in used["used_by"]] == ["joiner"]
    # The token is not on the agent's command line.
    agent = cluster.procs["agent-joiner"]
    assert created["secret"].encode() not in Path(f"/proc/{agent.popen.pid}/cmdline").read_bytes()


def test_a_used_up_token_is_refused(cluster):
    created = _token(cluster, "--uses", "1")
    _join(created, "once-1")
    with pytest.raises(JoinRefused, match="was used 1 time"):
        _join(created, "once-2")


def test_an_expired_token_is_refused(cluster):
    created = _token(cluster, "--ttl", "1")
    cluster.wait(
        lambda: _token_state(cluster, created["token"]["id"])["state"] == "expired", 10, "the token expired"
    )
    with pytest.raises(JoinRefused, match="expired at"):
        _join(created, "late")


def test_a_revoked_token_is_refused(cluster):
    created = _token(cluster)
    out = cluster.llmgw("nodes", "join-token", "revoke", created["token"]["id"])
    assert out.returncode == 0, out.stderr
    with pytest.raises(JoinRefused, match="was revoked"):
        _join(created, "revoked-token")


def test_a_wrong_or_unknown_token_is_refused(cluster):
    created = _token(cluster)
    secret = created["secret"]
    wrong = secret[:-4] + ("AAAA" if not secret.endswith("AAAA") else "BBBB")
    with pytest.raises(JoinRefused, match="the secret is wrong"):
        _join(created, "wrong", token=wrong)
    unknown = "llmgw-jt.zzzzzz." + secret.rsplit(".", 1)[1]
    with pytest.raises(JoinRefused, match="not known to this cluster"):
        _join(created, "unknown", token=unknown)
    with pytest.raises(JoinRefused, match="not of the form"):
        _join(created, "garbage", token="not-a-token")
    # None of that used the real token.
    assert _token_state(cluster, created["token"]["id"]).get("uses", 0) == 0


def test_a_server_whose_ca_is_not_the_pinned_one_gets_nothing(cluster, tmp_path):
    created = _token(cluster)
    other = pki.ca_pin(pki.load_certs(pki.create_ca(tmp_path / "other", "other")[0].read_bytes())[0])
    with pytest.raises(JoinRefused, match="is not the cluster whose CA hash is"):
        _join(created, "pinned", pin=other)
    assert _token_state(cluster, created["token"]["id"]).get("uses", 0) == 0
    # The agent process says so and exits 1, without a certificate.
    config = _joiner_config(cluster, "impostor-pin", created, pin=other)
    proc = cluster.start_agent("impostor-pin", 1, config)
    assert proc.popen.wait(30) == 1
    assert "is not the cluster whose CA hash is" in proc.tail()
    assert not Path(config["tls"]["cert_file"]).exists()
    assert _token_state(cluster, created["token"]["id"]).get("uses", 0) == 0


def test_a_live_node_id_is_taken_over_only_with_a_replace_token(cluster):
    first = _join(_token(cluster), "taken")
    with pytest.raises(JoinRefused, match="already has a live identity"):
        _join(_token(cluster), "taken")
    # A token for another node cannot be used for this one.
    with pytest.raises(JoinRefused, match="is for node other-node only"):
        _join(_token(cluster, "--for-node", "other-node"), "taken")
    second = _join(_token(cluster, "--for-node", "taken", "--replace"), "taken")
    revoked = cluster.llmgw_json("certs", "revocations").get("revocations", [])
    assert first.serial in {r.get("serial") for r in revoked}
    assert second.serial not in {r.get("serial") for r in revoked}


def test_the_join_port_takes_no_oversized_csr(cluster):
    created = _token(cluster)
    _, csr = make_csr("big", ["127.0.0.1"])
    ca = pki.load_certs((cluster.pki.dir / "ca.crt").read_bytes())[0]
    creds = grpc.ssl_channel_credentials(ca.public_bytes(serialization.Encoding.PEM))
    options = [("grpc.ssl_target_name_override", pki.CONTROL_NAME)]
    with grpc.secure_channel(created["join_address"], creds, options=options) as ch:
        stub = trust_pb2_grpc.JoinServiceStub(ch)
        for pem, code in (
            (csr.decode() + " " * 9000, grpc.StatusCode.INVALID_ARGUMENT),
            (csr.decode() + " " * 20000, grpc.StatusCode.RESOURCE_EXHAUSTED),
        ):
            with pytest.raises(grpc.RpcError) as err:
                stub.Join(trust_pb2.JoinRequest(token=created["secret"], csr_pem=pem), timeout=5)
            assert err.value.code() == code, err.value.details()
    assert _token_state(cluster, created["token"]["id"]).get("uses", 0) == 0


def test_a_revoked_node_certificate_is_cut_off(cluster):
    created = _token(cluster)
    config = _joiner_config(cluster, "victim", created)
    cluster.start_agent("victim", 1, config)
    cluster.wait(lambda: cluster.node_state("victim") == "ready", 30, "victim registered")
    out = cluster.llmgw("certs", "revoke", "--node", "victim", "--reason", "stolen laptop")
    assert out.returncode == 0, out.stderr
    # Its open stream is ended with the reason (the agent logs it), and it stays out.
    agent = cluster.procs["agent-victim"]
    cluster.wait(lambda: "stolen laptop" in agent.tail(200), 10, "the agent's stream ended by the revocation")
    cluster.wait(lambda: cluster.node_state("victim") != "ready", 15, "victim no longer ready")
    tls = TlsSettings(**config["tls"])
    with cluster.channel(tls=tls) as ch:
        with pytest.raises(grpc.RpcError) as err:
            endpoints_pb2_grpc.EndpointServiceStub(ch).Watch(endpoints_pb2.WatchRequest(), timeout=5).next()
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED and "revoked" in err.value.details()


def test_revoking_by_serial_ends_a_router_s_open_watch_on_another_control_plane(cluster, tmp_path):
    router = cluster.pki.settings("router", "router-revoked")
    serial = pki.serial_hex(pki.load_certs(Path(router.cert_file).read_bytes())[0].serial_number)
    # The watch is on control-2; the revocation is made through control-1.
    with cluster.channel("control-2", tls=router) as ch:
        watch = endpoints_pb2_grpc.EndpointServiceStub(ch).Watch(endpoints_pb2.WatchRequest(), timeout=30)
        next(watch)  # the snapshot: the stream is open
        out = cluster.llmgw("certs", "revoke", "--serial", serial)
        assert out.returncode == 0, out.stderr
        with pytest.raises(grpc.RpcError) as err:
            for _ in watch:
                pass
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, err.value.details()
    assert f"certificate {serial}" in err.value.details()
    issued = cluster.llmgw_json("certs", "issued").get("certificates", [])
    assert issued and all(c["role"] == "node" for c in issued)


def test_join_is_the_only_method_of_the_join_port(cluster):
    created = _token(cluster)
    ca = (cluster.pki.dir / "ca.crt").read_bytes()
    options = [("grpc.ssl_target_name_override", pki.CONTROL_NAME)]
    with grpc.secure_channel(
        created["join_address"], grpc.ssl_channel_credentials(ca), options=options
    ) as ch:
        for path in ("/llmgw.v1.AdminService/ListNodes", "/llmgw.v1.JoinTokenService/CreateJoinToken"):
            with pytest.raises(grpc.RpcError) as err:
                ch.unary_unary(path, request_serializer=None, response_deserializer=None)(b"", timeout=5)
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, path


def test_unavailable_join_port_is_retryable():
    with pytest.raises(Unavailable):
        join(f"127.0.0.1:{free_port()}", "llmgw-jt.aaaaaa." + "a" * 43, "sha256:" + "0" * 64, "x", [])


class _Recorder(trust_pb2_grpc.JoinServiceServicer):
    """A rogue join port's servicer: remembers every token it is sent."""

    def __init__(self):
        self.tokens: list[str] = []

    def Join(self, request, context):  # noqa: N802 - gRPC method name
        self.tokens.append(request.token)
        context.abort(grpc.StatusCode.UNAVAILABLE, "rogue")


@pytest.mark.parametrize("chain", ["its own CA", "the cluster's CA after its own certificate"])
def test_an_impostor_join_port_is_never_sent_the_token(cluster, tmp_path, chain):
    """A server with another CA's certificate, even one that also presents the real (public) CA."""
    other = tmp_path / "other"
    pki.create_ca(other, "impostor")
    crt, key = pki.issue(other, "control", "impostor", ["127.0.0.1"])
    ca_file = other / "ca.crt" if chain == "its own CA" else cluster.pki.dir / "ca.crt"
    tls = TlsSettings(ca_file=str(ca_file), cert_file=str(crt), key_file=str(key))
    recorder = _Recorder()
    server = grpc.server(ThreadPoolExecutor(2))
    trust_pb2_grpc.add_JoinServiceServicer_to_server(recorder, server)
    port = server.add_secure_port("127.0.0.1:0", join_port_credentials(tls))
    server.start()
    try:
        created = _token(cluster)
        rogue = {**created, "join_address": f"127.0.0.1:{port}"}
        expected = JoinRefused if chain == "its own CA" else Unavailable
        with pytest.raises(expected):
            _join(rogue, "fooled")
    finally:
        server.stop(0)
    assert recorder.tokens == []
