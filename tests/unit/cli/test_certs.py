"""``llmgw certs`` and how the CLI finds its TLS files."""

from __future__ import annotations

import pytest

from llmgw.cli.connection import AdminError, resolve_tls
from llmgw.cli.main import _parser, main
from llmgw.common import pki


def test_certs_ca_then_issue_makes_a_node_certificate_naming_its_id_and_hosts(tmp_path, capsys):
    d = str(tmp_path / "tls")
    assert main(["certs", "ca", "--dir", d]) == 0
    assert (
        main(["certs", "issue", "node", "node-a", "--host", "10.0.0.5", "--host", "gpu-a", "--dir", d]) == 0
    )
    crt = tmp_path / "tls" / "node-node-a.crt"
    identity = pki.identity_of(crt.read_bytes())
    assert identity == pki.Identity("node", "node-a", frozenset({"10.0.0.5", "gpu-a"}))
    assert (tmp_path / "tls" / "node-node-a.key").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "tls" / "ca.key").stat().st_mode & 0o777 == 0o600
    capsys.readouterr()
    assert main(["certs", "show", str(crt)]) == 0
    assert "identity: node node-a" in capsys.readouterr().out
    # A second CA would orphan every certificate: refused.
    assert main(["certs", "ca", "--dir", d]) == 1
    assert "already exists" in capsys.readouterr().err


def test_the_cli_takes_the_one_admin_certificate_of_its_tls_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = tmp_path / "tls"
    pki.create_ca(d)
    args = _parser().parse_args(["keys", "revoke", "k-1", "--tls-dir", str(d)])
    assert args.key == "k-1", "the TLS flags do not take a command's own arguments"
    with pytest.raises(AdminError, match="holds 0 admin certificates"):
        resolve_tls(args, {})
    pki.issue(d, "admin", "ann")
    tls = resolve_tls(args, {})
    assert tls.cert_file == str(d / "admin-ann.crt") and tls.ca_file == str(d / "ca.crt")
    bare = _parser().parse_args(["status"])
    with pytest.raises(AdminError, match="no TLS certificate"):
        resolve_tls(bare, {})
    assert resolve_tls(bare, {"LLMGW_TLS_DIR": str(d)}).key_file == str(d / "admin-ann.key")
