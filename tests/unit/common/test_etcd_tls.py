"""TLS and client-certificate auth to a real etcd, and the etcd config section that asks for them.

The certificates come from the openssl command line (a throwaway CA, a
server certificate for 127.0.0.1, a client certificate); etcd runs with
``--client-cert-auth``, so a client without a certificate signed by the CA
is refused at the handshake.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from llmgw.common.config import EtcdSettings, EtcdTls, parse_config
from llmgw.common.errors import InvalidArgument, Unavailable
from llmgw.common.etcd import EtcdStore
from tests.support.procs import free_port, start, tool, wait_port


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _issue(d: Path, name: str, usage: str, san: str = "") -> None:
    _openssl(
        *("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"),
        *("-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}"),
        cwd=d,
    )
    (d / f"{name}.ext").write_text(f"extendedKeyUsage={usage}\n" + (f"subjectAltName={san}\n" if san else ""))
    _openssl(
        *("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial"),
        *("-out", f"{name}.crt", "-days", "1", "-extfile", f"{name}.ext"),
        cwd=d,
    )


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory):
    d = tmp_path_factory.mktemp("etcd-tls")
    _openssl(
        *("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"),
        *("-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=llmgw-test-ca"),
        cwd=d,
    )
    _issue(d, "etcd", "serverAuth,clientAuth", "IP:127.0.0.1")
    _issue(d, "control", "clientAuth")
    client, peer = free_port(), free_port()
    proc = start(
        "etcd-tls",
        [
            tool("etcd"),
            *("--data-dir", str(d / "data")),
            *("--listen-client-urls", f"https://127.0.0.1:{client}"),
            *("--advertise-client-urls", f"https://127.0.0.1:{client}"),
            *("--listen-peer-urls", f"http://127.0.0.1:{peer}"),
            *("--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}"),
            *("--initial-cluster", f"default=http://127.0.0.1:{peer}"),
            *("--cert-file", str(d / "etcd.crt"), "--key-file", str(d / "etcd.key")),
            *("--trusted-ca-file", str(d / "ca.crt"), "--client-cert-auth"),
            *("--log-level", "warn"),
        ],
        d,
    )
    wait_port(client, proc=proc)
    yield d, f"127.0.0.1:{client}"
    proc.stop()


async def test_a_client_certificate_signed_by_the_ca_reads_and_writes(tls_etcd):
    d, endpoint = tls_etcd
    tls = EtcdTls(
        ca_file=str(d / "ca.crt"), cert_file=str(d / "control.crt"), key_file=str(d / "control.key")
    )
    store = EtcdStore([endpoint], f"/tls/{uuid.uuid4().hex[:8]}/", tls=tls)
    try:
        await store.put("k", b"over TLS")
        assert (await store.get("k")).value == b"over TLS"
    finally:
        await store.close()


@pytest.mark.parametrize("tls", ["none", "no client certificate"])
async def test_etcd_refuses_a_client_without_tls_or_without_a_certificate(tls_etcd, tls):
    d, endpoint = tls_etcd
    settings = EtcdTls(ca_file=str(d / "ca.crt")) if tls != "none" else None
    store = EtcdStore([endpoint], "/tls/refused/", timeout=1.5, tls=settings)
    try:
        with pytest.raises(Unavailable):
            await store.put("k", b"never written")
    finally:
        await store.close()


def test_an_unreadable_certificate_file_is_named(tmp_path):
    missing = tmp_path / "nope.crt"
    with pytest.raises(InvalidArgument, match=str(missing)):
        EtcdStore(["127.0.0.1:2379"], "/x/", tls=EtcdTls(ca_file=str(missing)))


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"endpoints": ["https://10.0.0.1:2379"]}, "without a scheme"),
        ({"endpoints": ["10.0.0.1"]}, "must be host:port"),
        ({"endpoints": []}, "at least 1"),
        ({"tls": {"ca_file": "ca.crt", "cert_file": "c.crt"}}, "cert_file and key_file go together"),
    ],
)
def test_the_etcd_section_refuses_what_cannot_work(doc, says):
    with pytest.raises(InvalidArgument, match=says):
        parse_config(doc, EtcdSettings, "etcd")


def test_the_etcd_section_takes_every_member_and_tls_files():
    doc = {
        "endpoints": ["10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"],
        "tls": {"ca_file": "ca.crt", "cert_file": "c.crt", "key_file": "c.key"},
    }
    settings = parse_config(doc, EtcdSettings, "etcd")
    assert len(settings.endpoints) == 3 and settings.tls.key_file == "c.key"
