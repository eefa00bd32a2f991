"""Join tokens, the CSR check, the join port's limits and revocation enforcement, each called directly.

The store is MemoryStore (etcd's revision semantics); the integration test
(tests/integration/test_join.py) runs the same over real processes.
"""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from llmgw.common import pki
from llmgw.common.errors import InvalidArgument, PermissionDenied, ResourceExhausted
from llmgw.common.etcd import MemoryStore
from llmgw.common.joining import make_csr
from llmgw.control.api.join import JoinLimits, check_csr, peer_host
from llmgw.control.api.revocation import Enforcer
from llmgw.control.store.trust import JoinTokens, RevocationList, Revocations, TokenRequest
from llmgw.v1 import trust_pb2


class Clock:
    def __init__(self, now: float = 1_800_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _request(**kw) -> TokenRequest:
    return TokenRequest.parse(trust_pb2.CreateJoinTokenRequest(**kw))


def _issued(serial: str, node: str = "n1") -> trust_pb2.IssuedCertificate:
    return trust_pb2.IssuedCertificate(serial=serial, role="node", name=node, not_after=2_000_000_000)


async def test_a_token_is_stored_hashed_and_refused_once_used_up():
    store, wall = MemoryStore(), Clock()
    tokens = JoinTokens(store, wall)
    token, secret = await tokens.create(_request(max_uses=2))
    stored = (await store.get("join-tokens/" + token.id)).value
    assert secret.encode() not in stored and secret.rsplit(".", 1)[1].encode() not in stored
    for serial in ("a1", "a2"):
        checked, revision = await tokens.check(secret)
        assert await tokens.record_use(checked, revision, _issued(serial), "ipv4:10.0.0.1:5")
    with pytest.raises(PermissionDenied, match="was used 2 time"):
        await tokens.check(secret)
    assert [c.serial for c in await tokens.issued()] == ["a1", "a2"]


async def test_two_joins_racing_for_the_last_use_cannot_both_count():
    tokens = JoinTokens(MemoryStore(), Clock())
    _, secret = await tokens.create(_request())
    first, revision = await tokens.check(secret)
    second, same_revision = await tokens.check(secret)
    assert await tokens.record_use(first, revision, _issued("b1"), "p")
    assert not await tokens.record_use(second, same_revision, _issued("b2"), "p")
    assert [c.serial for c in await tokens.issued()] == ["b1"]


async def test_expired_revoked_wrong_and_malformed_tokens_are_refused_saying_which():
    wall = Clock()
    tokens = JoinTokens(MemoryStore(), wall)
    token, secret = await tokens.create(_request(ttl_seconds=60))
    wall.now += 61
    with pytest.raises(PermissionDenied, match="expired at"):
        await tokens.check(secret)
    token, secret = await tokens.create(_request())
    await tokens.revoke(token.id)
    with pytest.raises(PermissionDenied, match="was revoked"):
        await tokens.check(secret)
    _, secret = await tokens.create(_request())
    with pytest.raises(PermissionDenied, match="secret is wrong"):
        await tokens.check(secret[:-1] + ("A" if secret[-1] != "A" else "B"))
    with pytest.raises(PermissionDenied, match="not of the form"):
        await tokens.check("x" * 500)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"ttl_seconds": 31 * 86400}, "ttl_seconds"),
        ({"max_uses": 5000}, "max_uses"),
        ({"replace": True}, "name the node"),
        ({"node_id": "bad/id"}, "node_id"),
        ({"hosts": ["a b"]}, "hosts"),
    ],
)
def test_a_bad_token_request_is_refused_before_anything_is_written(fields, message):
    with pytest.raises(InvalidArgument, match=message):
        _request(**fields)


def _csr(uris: list[str], hosts: list[str] = (), key=None) -> str:
    key = key or ec.generate_private_key(ec.SECP256R1())
    names = [x509.UniformResourceIdentifier(u) for u in uris] + [x509.DNSName(h) for h in hosts]
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "x")])
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode()


def test_a_csr_names_exactly_one_node_and_only_the_hosts_the_token_allows():
    any_node = trust_pb2.JoinToken(id="t1")
    _, csr = make_csr("gpu-1", ["10.0.0.5"])
    _, node, hosts = check_csr(csr.decode(), any_node)
    # A token without hosts gives none: the node publishes on its connection's address.
    assert (node, hosts) == ("gpu-1", [])
    with_hosts = trust_pb2.JoinToken(id="t2", hosts=["10.0.0.5"])
    assert check_csr(csr.decode(), with_hosts)[2] == ["10.0.0.5"]
    with pytest.raises(PermissionDenied, match="allows the hosts 10.0.0.6"):
        check_csr(csr.decode(), trust_pb2.JoinToken(id="t3", hosts=["10.0.0.6"]))
    with pytest.raises(PermissionDenied, match="is for node gpu-2 only"):
        check_csr(csr.decode(), trust_pb2.JoinToken(id="t4", node_id="gpu-2"))
    for uris in ([], ["llmgw://node/a", "llmgw://node/b"], ["llmgw://router/r1"], ["llmgw://node/bad id"]):
        with pytest.raises(InvalidArgument):
            check_csr(_csr(uris), any_node)
    with pytest.raises(InvalidArgument, match="RSA key has 1024 bits"):
        check_csr(_csr(["llmgw://node/a"], key=rsa.generate_private_key(65537, 1024)), any_node)
    with pytest.raises(InvalidArgument, match="at most"):
        check_csr("x" * 9000, any_node)
    with pytest.raises(InvalidArgument, match="not a PEM"):
        check_csr("garbage", any_node)


def test_join_attempts_are_limited_per_peer_and_overall():
    clock = Clock(0.0)
    limits = JoinLimits(per_peer_burst=2, per_peer_per_minute=6, burst=3, per_second=1, clock=clock)
    limits.admit("10.0.0.1")
    limits.admit("10.0.0.1")
    with pytest.raises(ResourceExhausted, match="from 10.0.0.1; retry in 10 s"):
        limits.admit("10.0.0.1")
    limits.admit("10.0.0.2")
    with pytest.raises(ResourceExhausted, match="on this control plane"):
        limits.admit("10.0.0.3")
    clock.now += 10
    limits.admit("10.0.0.1")
    assert peer_host("ipv6:[::1]:5000") == "::1" and peer_host("ipv4:10.1.2.3:99") == "10.1.2.3"


def _cert(tmp_path, name: str) -> bytes:
    if not (tmp_path / "ca.crt").exists():
        pki.create_ca(tmp_path)
    crt, _ = pki.issue(tmp_path, "router", name)
    return crt.read_bytes()


async def test_an_identity_revocation_covers_certificates_issued_before_it_only(tmp_path):
    store, wall = MemoryStore(), Clock(dt.datetime.now(dt.UTC).timestamp() + 3600)
    revocations = Revocations(store, wall)
    old = _cert(tmp_path, "r1")
    await revocations.revoke(trust_pb2.RevokeCertificateRequest(role="router", name="r1", reason="lost"))
    records, _ = await revocations.load()
    enforcer = Enforcer()
    enforcer.apply(RevocationList.of(records))
    assert "lost" in enforcer.why(old)
    assert enforcer.why(_cert(tmp_path, "r2")) == ""
    # Issued after the cutoff (a join starts validity after it): not revoked.
    listed = RevocationList.of(records)
    assert listed.why("ff", "router", "r1", wall.now + 1) == ""
    with pytest.raises(InvalidArgument, match="a serial"):
        await revocations.revoke(trust_pb2.RevokeCertificateRequest(role="wizard", name="x"))


async def test_a_revocation_ends_the_open_streams_of_its_certificate_only(tmp_path):
    revoked, kept = _cert(tmp_path, "gone"), _cert(tmp_path, "stays")
    serial = pki.serial_hex(x509.load_pem_x509_certificate(revoked).serial_number)
    enforcer = Enforcer()
    started = asyncio.Event()
    reasons: dict[str, str] = {}

    async def stream(name: str, pem: bytes) -> None:
        key = enforcer.open(pem)
        try:
            started.set()
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            reasons[name] = enforcer.close(key)
            raise

    async with asyncio.TaskGroup() as tg:
        gone = tg.create_task(stream("gone", revoked))
        stays = tg.create_task(stream("stays", kept))
        await started.wait()
        await asyncio.sleep(0)
        enforcer.apply(RevocationList.of([trust_pb2.Revocation(serial=serial, revoked_at=1)]))
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert not stays.done()
        stays.cancel()
    assert f"certificate {serial}" in reasons["gone"] and reasons["stays"] == ""
    assert enforcer.ended == 1
