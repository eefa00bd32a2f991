"""Node certificates renewed before they expire, with no restart (api/renewal.py, agent/renewal.py).

A cluster started as `llmgw up` starts it (mutual TLS), whose control plane
holds the CA key and signs node certificates valid 30 seconds
(``join.cert_seconds: 30``, set in the control plane's config as an
operator would). Why so short: the agent renews at two thirds of the
lifetime (its default, plus up to a tenth of jitter), so the renewal, and
the old certificate's expiry after it, both happen within this test's
first minute; at the default lifetime (a year) they would take months.

What is shown:

- an agent that joined renews its certificate before it expires, with no
  restart of itself or its engine: the serial in its cert file changes,
  the key is new and 0600, the ledger records the renewal, the old
  certificate works until it expires and not after, and the model keeps
  answering through the router with the same engine PID past that expiry;
- a node asking for another node's identity, other hosts or a usage is
  refused, and so is a router;
- a node whose identity was revoked is refused renewal, whichever of its
  certificates (the joined one or a renewed one) it calls with.
"""

from __future__ import annotations

import stat
import time
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llmgw.common import pki
from llmgw.common.joining import join, make_csr
from llmgw.common.tls import TlsSettings
from llmgw.v1 import trust_pb2, trust_pb2_grpc
from tests.support.cluster import QUICK_AGENT, Cluster, running_cluster, simulator_model

pytestmark = pytest.mark.integration

LIFETIME = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    state = tmp_path_factory.mktemp("renewal")
    with running_cluster(
        state,
        [simulator_model("demo", 1)],
        name="renewal",
        nodes={},
        admin_token="renewal-test-admin-token-0123",
        control={
            "join": {
                "ca_key_file": str(state / "tls" / "ca.key"),
                "listen": "127.0.0.1:0",
                "cert_seconds": LIFETIME,
                "per_peer_burst": 50,
            },
        },
    ) as c:
        yield c


def _token(cluster: Cluster, *flags: str) -> dict:
    return cluster.llmgw_json("nodes", "join-token", "create", *flags)


def _joined_files(cluster: Cluster, node: str) -> TlsSettings:
    """A node certificate from a join (made here, not by an agent), written to files.

    The token lists no hosts, so the certificate names none (the node
    publishes on the address it connects from): a renewal names none either.
    """
    created = _token(cluster)
    joined = join(created["join_address"], created["secret"], created["ca_cert_hash"], node, [])
    d = cluster.state / "direct" / node
    d.mkdir(parents=True, exist_ok=True)
    for name, data in (
        ("node.key", joined.key_pem),
        ("node.crt", joined.cert_pem),
        ("ca.crt", joined.ca_pem),
    ):
        pki.write_file(d / name, data, private=name.endswith(".key"))
    return TlsSettings(ca_file=str(d / "ca.crt"), cert_file=str(d / "node.crt"), key_file=str(d / "node.key"))


def _cert(path: str | Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(Path(path).read_bytes())


def _serial(path: str | Path) -> str:
    return pki.serial_hex(_cert(path).serial_number)


def _renew(cluster: Cluster, tls: TlsSettings, csr_pem: bytes) -> trust_pb2.RenewCertificateResponse:
    with cluster.channel(tls=tls) as ch:
        return trust_pb2_grpc.RenewalServiceStub(ch).RenewCertificate(
            trust_pb2.RenewCertificateRequest(csr_pem=csr_pem.decode()), timeout=5
        )


def _refused(cluster: Cluster, tls: TlsSettings, csr_pem: bytes) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        _renew(cluster, tls, csr_pem)
    return err.value


def _health(cluster: Cluster, tls: TlsSettings) -> grpc.StatusCode:
    """OK when a new connection with ``tls``'s files is accepted, else the code it got."""
    with cluster.channel(tls=tls) as ch:
        try:
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.RpcError as err:
            return err.code()
    return grpc.StatusCode.OK


def test_a_joined_agent_renews_before_expiry_without_restart(cluster):
    created = _token(cluster, "--for-node", "joiner")
    d = cluster.state / "joined" / "joiner"
    d.mkdir(parents=True)
    token_file = d / "join.token"
    token_file.write_text(created["secret"] + "\n")
    token_file.chmod(0o600)
    tls = {"ca_file": str(d / "ca.crt"), "cert_file": str(d / "node.crt"), "key_file": str(d / "node.key")}
    config = {
        "tls": tls,
        "join": {
            "address": created["join_address"],
            "token_file": str(token_file),
            "ca_cert_hash": created["ca_cert_hash"],
        },
        **QUICK_AGENT,
    }
    agent = cluster.start_agent("joiner", 1, config)
    cluster.wait(lambda: cluster.ready("demo") == 1, 30, "demo ready on the joined node")
    client = cluster.client()
    assert client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}]).choices
    engines = cluster.engine_pids(["joiner"])
    assert len(engines) == 1
    old = _cert(tls["cert_file"])
    old_serial = pki.serial_hex(old.serial_number)
    old_key = Path(tls["key_file"]).read_bytes()
    # Keep the old pair aside, to show it works until it expires (and not after).
    keep = cluster.state / "old-joiner"
    keep.mkdir()
    for name in ("node.crt", "node.key"):
        pki.write_file(keep / name, (d / name).read_bytes(), private=True)
    old_tls = TlsSettings(
        ca_file=tls["ca_file"], cert_file=str(keep / "node.crt"), key_file=str(keep / "node.key")
    )
    old_end = old.not_valid_after_utc.timestamp()

    cluster.wait(
        lambda: _serial(tls["cert_file"]) != old_serial, LIFETIME, "the agent renewed its certificate"
    )
    renewed_at = time.time()
    assert renewed_at < old_end, "renewed before the old certificate expired"
    new = _cert(tls["cert_file"])
    new_serial = pki.serial_hex(new.serial_number)
    new_pem = Path(tls["cert_file"]).read_bytes()
    identity = pki.identity_of(new_pem)
    assert identity is not None and (identity.role, identity.name) == ("node", "joiner")
    assert identity.hosts == pki.identity_of(old.public_bytes(serialization.Encoding.PEM)).hosts
    assert new.not_valid_after_utc > old.not_valid_after_utc
    cluster.wait(
        lambda: pki.matching_pair(Path(tls["cert_file"]).read_bytes(), Path(tls["key_file"]).read_bytes()),
        5,
        "key and certificate written",
    )
    assert Path(tls["key_file"]).read_bytes() != old_key, "a new key, generated on the node"
    assert stat.S_IMODE(Path(tls["key_file"]).stat().st_mode) == 0o600
    issued = {c["serial"]: c for c in cluster.llmgw_json("certs", "issued").get("certificates", [])}
    assert issued[new_serial].get("renewed") == old_serial and issued[new_serial]["name"] == "joiner"
    # New connections with the new files are accepted; the old pair still works until it expires.
    assert _health(cluster, TlsSettings(**tls)) == grpc.StatusCode.OK
    assert time.time() < old_end and _health(cluster, old_tls) == grpc.StatusCode.OK

    cluster.wait(lambda: time.time() > old_end + 1, LIFETIME, "the old certificate expired")
    assert _health(cluster, old_tls) != grpc.StatusCode.OK, "an expired certificate is refused"
    # No restart: the same agent process, the same engine, still serving through the router.
    assert agent.popen.poll() is None
    assert cluster.engine_pids(["joiner"]) == engines
    assert cluster.node_state("joiner") == "ready"
    reply = client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "still there?"}]
    )
    assert reply.choices[0].message.content
    assert f"certificate {old_serial} renewed: {new_serial}" in agent.tail(400)


def test_a_node_may_renew_only_its_own_identity(cluster):
    tls = _joined_files(cluster, "renew-a")
    _, other_node = make_csr("renew-b", [])
    err = _refused(cluster, tls, other_node)
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "only its own" in err.details()
    _, other_hosts = make_csr("renew-a", ["10.9.9.9"])
    err = _refused(cluster, tls, other_hosts)
    assert (
        err.code() == grpc.StatusCode.PERMISSION_DENIED and "keeps the certificate's hosts" in err.details()
    )
    # A usage (here: a CA) asked for in the CSR.
    key = ec.generate_private_key(ec.SECP256R1())
    ca_csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "node:renew-a")]))
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier("llmgw://node/renew-a")]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )
    err = _refused(cluster, tls, ca_csr)
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "carries only its names" in err.details()
    # A router is not a node.
    _, own = make_csr("renew-a", [])
    err = _refused(cluster, cluster.pki.settings("router", "router"), own)
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    # Nothing was signed for any of these; the node's own request is.
    reply = _renew(cluster, tls, own)
    identity = pki.identity_of(reply.certificate_pem.encode())
    assert identity is not None and identity.name == "renew-a"


def test_a_revoked_node_is_refused_renewal(cluster):
    tls = _joined_files(cluster, "renew-revoked")
    key_pem, csr = make_csr("renew-revoked", [])
    reply = _renew(cluster, tls, csr)  # renewing works before the revocation
    d = Path(tls.cert_file).parent
    pki.write_file(d / "renewed.key", key_pem, private=True)
    pki.write_file(d / "renewed.crt", reply.certificate_pem.encode(), private=False)
    renewed = TlsSettings(
        ca_file=tls.ca_file, cert_file=str(d / "renewed.crt"), key_file=str(d / "renewed.key")
    )
    out = cluster.llmgw("certs", "revoke", "--node", "renew-revoked", "--reason", "decommissioned")
    assert out.returncode == 0, out.stderr
    for files in (tls, renewed):
        # In force once this control plane refuses the certificate any call.
        cluster.wait(
            lambda files=files: _health(cluster, files) == grpc.StatusCode.PERMISSION_DENIED,
            10,
            "the revocation in force",
        )
        _, csr = make_csr("renew-revoked", [])
        err = _refused(cluster, files, csr)
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "revoked" in err.details()
    signed = [
        c for c in cluster.llmgw_json("certs", "issued")["certificates"] if c["name"] == "renew-revoked"
    ]
    assert len(signed) == 2 and all(c.get("revoked") for c in signed)
