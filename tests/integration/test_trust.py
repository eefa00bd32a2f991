"""The trust boundary of a cluster started as `llmgw up` starts it (mutual TLS, an admin token).

Every method of every service the control plane serves is listed through
gRPC reflection, not from a list in this file, and called by callers
without the right identity: each must refuse. A service added later is
therefore covered without anyone editing this test, and since api/auth.py
denies what its table does not name, it is refused until someone decides
who may call it. Only the few methods routers and nodes may call are
written down here, so widening what they may call fails this test too.

The join port (the one method callable without a certificate) serves
only JoinService/Join to such a caller, and refuses every other method.

Also: a rogue process (no certificate, a certificate of another CA, or one
of this CA with no llmgw identity) cannot register, report, watch or sync;
node A cannot open node B's stream; a node cannot publish an engine URL
outside the hosts of its certificate.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from llmgw.common import pki
from llmgw.common.tls import PLAINTEXT, TlsSettings, sync_channel
from llmgw.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    endpoints_pb2,
    endpoints_pb2_grpc,
    nodeadmin_pb2,
    nodeadmin_pb2_grpc,
)
from tests.support.cluster import Cluster, running_cluster, simulator_model
from tests.support.procs import free_port

pytestmark = pytest.mark.integration

ANYONE = {
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
}
# What a router and a node may call; everything else is the admin's.
ROUTER_MAY = ANYONE | {
    "/llmgw.v1.EndpointService/Watch",
    "/llmgw.v1.CatalogService/Watch",
    "/llmgw.v1.KeyTableService/Watch",
    "/llmgw.v1.UsageService/Report",
    "/llmgw.v1.QuotaService/Sync",
}
# A node renews its own certificate (api/renewal.py holds the CSR to the caller's identity).
NODE_MAY = ANYONE | {"/llmgw.v1.AgentService/Connect", "/llmgw.v1.RenewalService/RenewCertificate"}
# Admin-only methods this file names so that their being served (and so walked below) is checked:
# the fabric test starts traffic between nodes, so a router or a node must never start one.
ADMIN_ONLY = {"/llmgw.v1.FabricService/RunFabricTest", "/llmgw.v1.FabricService/ListFabricResults"}
REFUSED = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}


# On the join port (api/join.py), callers have no certificate: only these answer there.
JOIN_PORT_OPEN = ANYONE | {"/llmgw.v1.JoinService/Join"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    state = tmp_path_factory.mktemp("trust")
    with running_cluster(
        state,
        [simulator_model("demo", 0)],
        name="trust",
        nodes={"node-a": 1},
        admin_token="trust-test-admin-token-0123",
        # Joins on: the join port is part of the boundary.
        control={
            "join": {"ca_key_file": str(state / "tls" / "ca.key"), "listen": f"127.0.0.1:{free_port()}"}
        },
    ) as c:
        c.wait(lambda: c.node_state("node-a") == "ready", 30, "node-a registered")
        yield c


def _methods(cluster: Cluster, channel: grpc.Channel | None = None) -> list[tuple[str, bool, bool]]:
    """(path, client streaming, server streaming) of every method reflection lists (on ``channel``)."""
    with channel or cluster.channel() as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        pool = DescriptorPool(db)
        out = []
        for service in db.get_services():
            for m in pool.FindServiceByName(service).methods:
                out.append((f"/{service}/{m.name}", m.client_streaming, m.server_streaming))
    return out


def _call(channel: grpc.Channel, path: str, client_streaming: bool, server_streaming: bool):
    """Call ``path`` with one empty message; the RpcError, or None when it was answered."""
    raw = {"request_serializer": None, "response_deserializer": None}
    try:
        if client_streaming and server_streaming:
            next(iter(channel.stream_stream(path, **raw)(iter([b""]), timeout=5)))
        elif client_streaming:
            channel.stream_unary(path, **raw)(iter([b""]), timeout=5)
        elif server_streaming:
            next(iter(channel.unary_stream(path, **raw)(b"", timeout=5)))
        else:
            channel.unary_unary(path, **raw)(b"", timeout=5)
    except grpc.RpcError as err:
        return err
    except StopIteration:
        pass
    return None


def _refusals(cluster: Cluster, tls: TlsSettings, may: set[str]) -> dict[str, str]:
    """Each listed method ``tls``'s holder may not call -> what it got, when that is not a refusal."""
    wrong = {}
    with cluster.channel(tls=tls) as channel:
        for path, cs, ss in _methods(cluster):
            if path in may:
                continue
            err = _call(channel, path, cs, ss)
            if err is None or err.code() not in REFUSED:
                wrong[path] = "answered" if err is None else f"{err.code().name}: {err.details()}"
    return wrong


def _foreign(directory: Path, uri: str | None, ca: tuple | None = None) -> TlsSettings:
    """A certificate naming ``uri`` (or no llmgw identity), signed by ``ca`` (default: a new CA)."""
    if ca is None:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rogue CA")])
    else:
        ca_name, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    sans = [x509.DNSName("rogue.example")] + ([x509.UniformResourceIdentifier(uri)] if uri else [])
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rogue")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    name = "rogue-" + ("cluster-ca" if ca else "own-ca") + ("-" + uri.rsplit("/", 2)[1] if uri else "")
    crt, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return TlsSettings(ca_file=str(directory / "ca.crt"), cert_file=str(crt), key_file=str(key_path))


def _cluster_ca(cluster: Cluster) -> tuple:
    d = cluster.pki.dir
    ca = x509.load_pem_x509_certificate((d / "ca.crt").read_bytes())
    return ca.subject, serialization.load_pem_private_key((d / "ca.key").read_bytes(), None)


def test_the_admin_only_methods_named_here_are_served_and_walked(cluster):
    served = {path for path, _, _ in _methods(cluster)}
    assert ADMIN_ONLY <= served and not ADMIN_ONLY & (ROUTER_MAY | NODE_MAY)


def test_the_control_port_lists_every_service(cluster):
    assert len(_methods(cluster)) > 30


def _anonymous_join_channel(cluster: Cluster) -> grpc.Channel:
    """A TLS channel to the join port with no client certificate (what a joining agent has)."""
    created = cluster.llmgw_json("nodes", "join-token", "create")
    ca = (cluster.pki.dir / "ca.crt").read_bytes()
    options = [("grpc.ssl_target_name_override", pki.CONTROL_NAME)]
    return grpc.secure_channel(created["join_address"], grpc.ssl_channel_credentials(ca), options=options)


def test_the_join_port_serves_only_join_to_a_caller_without_a_certificate(cluster):
    with _anonymous_join_channel(cluster) as channel:
        listed = _methods(cluster, channel)
    services = {p.rsplit("/", 1)[0] for p, _, _ in listed}
    assert "/llmgw.v1.JoinService" in services
    assert services <= {p.rsplit("/", 1)[0] for p in JOIN_PORT_OPEN}, services
    wrong = {}
    with _anonymous_join_channel(cluster) as channel:
        # Every method of the control port and of the join port, asked on the join port: refused.
        for path, cs, ss in _methods(cluster) + listed:
            if path in JOIN_PORT_OPEN:
                continue
            err = _call(channel, path, cs, ss)
            if err is None or err.code() not in REFUSED:
                wrong[path] = "answered" if err is None else f"{err.code().name}: {err.details()}"
        # Join itself, with no token: refused, saying what a token looks like.
        err = _call(channel, "/llmgw.v1.JoinService/Join", False, False)
        assert err is not None and err.code() == grpc.StatusCode.PERMISSION_DENIED, err
        assert "llmgw-jt." in err.details()
    assert wrong == {}


def test_every_method_refuses_a_router_except_the_routers_own(cluster):
    assert _refusals(cluster, cluster.pki.settings("router", "router-1"), ROUTER_MAY) == {}


def test_every_method_refuses_a_node_except_its_stream(cluster):
    assert _refusals(cluster, cluster.pki.settings("node", "node-a"), NODE_MAY) == {}


def test_agent_upgrades_are_the_admins_alone_not_a_nodes_even_for_itself(cluster):
    # Listed by reflection like every method; named here because a node that could
    # upgrade agents could make every node run a program of its choosing.
    path = "/llmgw.v1.NodeAdminService/UpgradeAgent"
    assert (path, False, False) in _methods(cluster)
    request = nodeadmin_pb2.UpgradeAgentRequest(node_id="node-a", version="9", command=["/bin/sh"])
    for tls in (cluster.pki.settings("node", "node-a"), cluster.pki.settings("router", "router-1")):
        with cluster.channel(tls=tls) as channel:
            with pytest.raises(grpc.RpcError) as err:
                nodeadmin_pb2_grpc.NodeAdminServiceStub(channel).UpgradeAgent(request, timeout=5)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, err.value.details()


def test_every_method_refuses_a_certificate_of_the_cluster_ca_without_an_llmgw_identity(cluster):
    tls = _foreign(cluster.pki.dir, None, _cluster_ca(cluster))
    assert _refusals(cluster, tls, set()) == {}


@pytest.mark.parametrize("who", ["no certificate", "plaintext", "another CA's router certificate"])
def test_a_caller_without_a_cluster_certificate_gets_no_connection_to_any_method(cluster, who):
    if who == "plaintext":
        tls = PLAINTEXT
    elif who == "no certificate":
        tls = None
    else:
        tls = _foreign(cluster.pki.dir, "llmgw://router/rogue")
    address = cluster.controls[cluster.first_control]
    if tls is None:
        ca = (cluster.pki.dir / "ca.crt").read_bytes()
        options = [("grpc.ssl_target_name_override", pki.CONTROL_NAME)]
        channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(ca), options=options)
    else:
        channel = sync_channel(address, tls)
    with channel:
        for path, cs, ss in _methods(cluster):
            err = _call(channel, path, cs, ss)
            assert err is not None and err.code() == grpc.StatusCode.UNAVAILABLE, (who, path, err)


def _agent_stream(cluster: Cluster, tls: TlsSettings, *messages: agent_pb2.AgentMessage):
    """Open AgentService.Connect with ``tls``, send ``messages``; the replies, or the RpcError."""
    replies = []
    with cluster.channel(tls=tls) as channel:
        call = agent_pb2_grpc.AgentServiceStub(channel).Connect(iter(messages), timeout=5)
        try:
            for reply in call:
                replies.append(reply)
        except grpc.RpcError as err:
            return replies, err
    return replies, None


def _register(node_id: str, address: str = "127.0.0.1", url: str = "") -> agent_pb2.AgentMessage:
    replicas = []
    if url:
        replicas = [
            agent_pb2.ReplicaStatus(
                replica_id="r-rogue", model="demo", state=agent_pb2.REPLICA_STATE_READY, url=url
            )
        ]
    return agent_pb2.AgentMessage(
        register=agent_pb2.Register(node_id=node_id, address=address, version="test", replicas=replicas)
    )


def test_node_a_cannot_take_node_b_s_stream(cluster):
    cluster.pki.node("node-b")
    _, err = _agent_stream(cluster, cluster.pki.settings("node", "node-b"), _register("node-a"))
    assert err is not None and err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "registers only as itself" in err.details()
    # node-a's own stream was not replaced.
    assert cluster.node_state("node-a") == "ready"


def test_a_node_cannot_publish_an_engine_url_outside_its_certificate_s_hosts(cluster):
    node = cluster.pki.settings("node", "node-c", ("127.0.0.1",))
    status = agent_pb2.AgentMessage(
        status=agent_pb2.ReplicaStatus(
            replica_id="r-rogue",
            model="demo",
            state=agent_pb2.REPLICA_STATE_READY,
            url="http://attacker.example:8000",
        )
    )
    for messages in (
        [_register("node-c"), status],
        [_register("node-c", url="http://10.66.66.66:8000")],
        [_register("node-c", address="attacker.example")],
    ):
        _, err = _agent_stream(cluster, node, *messages)
        assert err is not None and err.code() == grpc.StatusCode.PERMISSION_DENIED, messages
        assert "is not" in err.details() and "certificate" in err.details()
    with cluster.channel() as channel:
        watch = endpoints_pb2_grpc.EndpointServiceStub(channel).Watch(endpoints_pb2.WatchRequest(), timeout=5)
        snapshot = next(iter(watch))
        watch.cancel()
    urls = [e.url for e in snapshot.upserts]
    assert not any("attacker" in u or "10.66.66.66" in u for u in urls), urls


def test_a_node_registers_on_its_own_host(cluster):
    node = cluster.pki.settings("node", "node-d", ("127.0.0.1",))
    heartbeat = agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat())
    replies, err = _agent_stream(cluster, node, _register("node-d"), heartbeat)
    assert replies and replies[0].HasField("registered"), (replies, err)
    assert err is None or err.code() not in REFUSED, err
