"""Mutual TLS from files: the server reads its certificate again when the files change, no restart."""

from __future__ import annotations

import shutil

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llmgw.common import pki
from llmgw.common.grpcserver import GrpcServer
from llmgw.common.tls import TlsSettings, aio_channel


def _install(src_dir, role: str, name: str, dst_dir) -> TlsSettings:
    """Copy role-name's pair and its CA into dst_dir under fixed names (a rotation overwrites them)."""
    dst_dir.mkdir(exist_ok=True)
    for src, dst in (
        (src_dir / "ca.crt", dst_dir / "ca.crt"),
        (src_dir / f"{role}-{name}.crt", dst_dir / "tls.crt"),
        (src_dir / f"{role}-{name}.key", dst_dir / "tls.key"),
    ):
        tmp = dst.with_suffix(".tmp")
        shutil.copy(src, tmp)
        tmp.replace(dst)
    return TlsSettings(
        ca_file=str(dst_dir / "ca.crt"), cert_file=str(dst_dir / "tls.crt"), key_file=str(dst_dir / "tls.key")
    )


def _pki(directory, control_name: str = "c1"):
    pki.create_ca(directory)
    pki.issue(directory, "control", control_name)
    pki.issue(directory, "router", "r1")
    return directory


async def _healthy(address: str, tls: TlsSettings) -> bool:
    async with aio_channel(address, tls) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.UNAVAILABLE, err
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_a_rotated_certificate_and_ca_are_used_for_new_connections_without_a_restart(tmp_path):
    old, new = _pki(tmp_path / "old"), _pki(tmp_path / "new")
    server_tls = _install(old, "control", "c1", tmp_path / "server")
    server = GrpcServer("127.0.0.1:0", [], tls=server_tls)
    await server.start()
    address = f"127.0.0.1:{server.port}"
    old_client = _install(old, "router", "r1", tmp_path / "old-client")
    new_client = _install(new, "router", "r1", tmp_path / "new-client")
    try:
        assert await _healthy(address, old_client)
        assert not await _healthy(address, new_client), "another CA's client is refused"
        _install(new, "control", "c1", tmp_path / "server")
        assert await _healthy(address, new_client), "the server took the new files"
        assert not await _healthy(address, old_client), "and no longer trusts the old CA"
    finally:
        await server.stop(0)


async def test_a_key_that_does_not_match_its_certificate_is_ignored_until_it_does(tmp_path, caplog):
    d = _pki(tmp_path / "pki")
    server_tls = _install(d, "control", "c1", tmp_path / "server")
    server = GrpcServer("127.0.0.1:0", [], tls=server_tls)
    await server.start()
    address = f"127.0.0.1:{server.port}"
    client = _install(d, "router", "r1", tmp_path / "client")
    try:
        # Half a rotation: the new certificate is written, its key not yet.
        pki.issue(d, "control", "c1")
        shutil.copy(d / "control-c1.crt", tmp_path / "server" / "tls.crt")
        assert await _healthy(address, client), "the old pair still serves"
        assert "keeping the current TLS certificate" in caplog.text
        shutil.copy(d / "control-c1.key", tmp_path / "server" / "tls.key")
        assert await _healthy(address, client)
    finally:
        await server.stop(0)


def test_the_tls_section_is_three_files_or_plaintext_on_purpose():
    assert not TlsSettings().configured
    assert TlsSettings(plaintext=True).configured
    with pytest.raises(ValueError, match="key_file missing"):
        TlsSettings(ca_file="a", cert_file="b")
    with pytest.raises(ValueError, match="choose one"):
        TlsSettings(plaintext=True, ca_file="a", cert_file="b", key_file="c")
