"""A cluster CA and certificates for tests, issued the way `llmgw certs` issues them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmgw.common import pki
from llmgw.common.tls import TlsSettings


@dataclass(frozen=True)
class ClusterPki:
    dir: Path

    @classmethod
    def create(cls, directory: Path) -> ClusterPki:
        if not (directory / "ca.crt").exists():
            pki.create_ca(directory, "test")
        return cls(directory)

    def tls(self, role: str, name: str, hosts: tuple[str, ...] = ()) -> dict[str, str]:
        """The ``tls`` section of a config for ``role``/``name``, issuing the certificate if needed."""
        crt, key = self.dir / f"{role}-{name}.crt", self.dir / f"{role}-{name}.key"
        if not crt.exists():
            crt, key = pki.issue(self.dir, role, name, hosts)
        return {"ca_file": str(self.dir / "ca.crt"), "cert_file": str(crt), "key_file": str(key)}

    def settings(self, role: str, name: str, hosts: tuple[str, ...] = ()) -> TlsSettings:
        return TlsSettings(**self.tls(role, name, hosts))

    def control(self, name: str = "control-1") -> dict[str, str]:
        return self.tls("control", name, ("127.0.0.1", "localhost"))

    def node(self, node_id: str) -> dict[str, str]:
        return self.tls("node", node_id, ("127.0.0.1", "localhost"))
