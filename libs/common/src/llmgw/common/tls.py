"""Mutual TLS for every gRPC link: the ``tls`` section of each role's config, credentials, channels.

Every role's config has the same section::

    tls:
      ca_file: /etc/llmgw/tls/ca.crt        # the cluster CA peers' certificates must chain to
      cert_file: /etc/llmgw/tls/node-a.crt  # this process's certificate (pki.py: what it must name)
      key_file: /etc/llmgw/tls/node-a.key
      server_name: llmgw-control            # clients: the name the control plane's certificate carries
      # plaintext: true                     # development only: no TLS, no identities

Decisions:

- **TLS is the default**: a config that neither names the three files nor
  says ``plaintext: true`` is refused at start with a message naming
  ``llmgw certs``. Plaintext is a choice someone writes down, and the
  control plane logs a warning at every start in that mode.
- **Mutual**: the server requires a client certificate from the CA
  (gRPC cannot ask for an optional one), so a process without one cannot
  even complete a handshake; what it may call is then the control plane's
  authorization table (control/api/auth.py).
- **Rotation without restart**: the server's certificate, key and CA are
  read again when one of the files changes (gRPC asks at each new
  handshake; a pair whose key does not match its certificate, a rotation
  caught between its two writes, is ignored until it does). Clients read
  the files each time they open a channel, and they open a new one on each
  reconnect. Streams already open keep the keys they were opened with.
- Clients check the server's certificate against ``server_name``, not the
  dialed address (pki.py says why).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import grpc
from pydantic import model_validator

from .config import Document
from .errors import InvalidArgument
from .pki import CONTROL_NAME, matching_pair

log = logging.getLogger("llmgw.common.tls")

MISSING = (
    "set tls.ca_file, tls.cert_file and tls.key_file (create them with `llmgw certs ca` and "
    "`llmgw certs issue ROLE NAME`, see docs/security.md), or tls.plaintext: true for development only"
)


class TlsSettings(Document):
    # The cluster CA (PEM): peers' certificates must chain to it.
    ca_file: str = ""
    # This process's certificate (PEM): its llmgw identity (pki.py).
    cert_file: str = ""
    # The certificate's private key (PEM), readable by this process's user only.
    key_file: str = ""
    # Clients: the DNS name the control plane's certificate must carry, whatever address is dialed.
    server_name: str = CONTROL_NAME
    # Development only: no TLS and no identities (the control plane warns at every start).
    plaintext: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> TlsSettings:
        files = {"ca_file": self.ca_file, "cert_file": self.cert_file, "key_file": self.key_file}
        given = [k for k, v in files.items() if v]
        if self.plaintext and given:
            raise ValueError(f"tls.plaintext is true but {', '.join(given)} set: choose one")
        if given and len(given) < 3:
            missing = [k for k in files if k not in given]
            raise ValueError(f"tls: {', '.join(missing)} missing (the three files go together)")
        return self

    @property
    def configured(self) -> bool:
        """Whether this section says what to do: files, or plaintext on purpose."""
        return self.plaintext or bool(self.cert_file)


# Plaintext on purpose: in-process tests' default for clients built without a config.
PLAINTEXT = TlsSettings(plaintext=True)


def require(settings: TlsSettings) -> TlsSettings:
    """For a config validator: the section, or a ValueError that says how to fill it."""
    if not settings.configured:
        raise ValueError(MISSING)
    return settings


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise InvalidArgument(f"tls.{what} {path}: {err.strerror}") from None


class PemFiles:
    """The three files of a TlsSettings, read again when one of them changes."""

    def __init__(self, settings: TlsSettings):
        self._paths = (settings.ca_file, settings.cert_file, settings.key_file)
        self._seen: tuple[tuple[int, int, int] | None, ...] | None = None

    def _stamp(self) -> tuple[tuple[int, int, int] | None, ...]:
        stamps: list[tuple[int, int, int] | None] = []
        for p in self._paths:
            try:
                st = os.stat(p)
                stamps.append((st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                stamps.append(None)
        return tuple(stamps)

    def changed(self) -> bool:
        return self._stamp() != self._seen

    def load(self) -> tuple[bytes, bytes, bytes]:
        """(ca, cert, key); InvalidArgument when one is unreadable or the key is not the cert's."""
        stamp = self._stamp()
        ca = _read(self._paths[0], "ca_file")
        cert = _read(self._paths[1], "cert_file")
        key = _read(self._paths[2], "key_file")
        if not matching_pair(cert, key):
            raise InvalidArgument(
                f"tls.key_file {self._paths[2]} is not the key of tls.cert_file {self._paths[1]}"
            )
        self._seen = stamp
        return ca, cert, key


def server_credentials(settings: TlsSettings) -> grpc.ServerCredentials:
    """Credentials requiring a client certificate from the CA, re-read when the files change."""
    files = PemFiles(settings)
    ca, cert, key = files.load()

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        # Called by gRPC at each new handshake: a stat, and a read only on change.
        if not files.changed():
            return None
        try:
            ca, cert, key = files.load()
        except InvalidArgument as err:
            log.warning("keeping the current TLS certificate: %s", err)
            return None
        log.info("TLS certificate, key or CA changed: new connections use the new ones")
        return grpc.ssl_server_certificate_configuration([(key, cert)], ca)

    return grpc.dynamic_ssl_server_credentials(
        grpc.ssl_server_certificate_configuration([(key, cert)], ca),
        fetch,  # type: ignore[arg-type]  # None means "no change", as gRPC documents
        require_client_authentication=True,
    )


def join_port_credentials(settings: TlsSettings) -> grpc.ServerCredentials:
    """Server-only TLS for the join port: no client certificate asked, the chain ends with the CA.

    A joining agent has no certificate yet. It reads the CA from the chain
    this port presents, checks it against the hash it was given (pinning),
    then verifies this port's certificate with it before it sends its token
    (common/joining.py). Re-read when the files change, like the main port.
    """
    files = PemFiles(settings)

    def config() -> grpc.ServerCertificateConfiguration:
        ca, cert, key = files.load()
        return grpc.ssl_server_certificate_configuration([(key, cert.rstrip() + b"\n" + ca)])

    first = config()

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        if not files.changed():
            return None
        try:
            return config()
        except InvalidArgument as err:
            log.warning("join port: keeping the current TLS certificate: %s", err)
            return None

    return grpc.dynamic_ssl_server_credentials(
        first,
        fetch,  # type: ignore[arg-type]  # None means "no change", as gRPC documents
        require_client_authentication=False,
    )


def channel_credentials(settings: TlsSettings) -> grpc.ChannelCredentials:
    ca, cert, key = PemFiles(settings).load()
    return grpc.ssl_channel_credentials(ca, key, cert)


def _options(settings: TlsSettings, options: Sequence[tuple[str, object]]) -> list[tuple[str, object]]:
    return [*options, ("grpc.ssl_target_name_override", settings.server_name)]


def aio_channel(
    address: str, settings: TlsSettings, options: Sequence[tuple[str, object]] = ()
) -> grpc.aio.Channel:
    """A new asyncio channel to a control plane, with the files as they are now."""
    if settings.plaintext:
        return grpc.aio.insecure_channel(address, options=list(options))
    credentials = channel_credentials(settings)
    return grpc.aio.secure_channel(address, credentials, options=_options(settings, options))


def sync_channel(
    address: str, settings: TlsSettings, options: Sequence[tuple[str, object]] = ()
) -> grpc.Channel:
    """A new blocking channel (the CLI, tests), like :func:`aio_channel`."""
    if settings.plaintext:
        return grpc.insecure_channel(address, options=list(options))
    return grpc.secure_channel(address, channel_credentials(settings), options=_options(settings, options))
