"""One connection to a control plane for every admin command: address, TLS, admin token, errors.

The connection is mutual TLS (common/tls.py), with the certificate files
taken from, in order: ``--plaintext`` (a development cluster with
``tls.plaintext``), ``--tls-ca``/``--tls-cert``/``--tls-key``, ``--tls-dir`` or
``$LLMGW_TLS_DIR``, then ``.llmgw/tls`` (what ``llmgw up`` writes) when it
exists. In a directory, ``ca.crt`` is the CA and the one ``admin-*.crt``
(with its ``.key``) is the certificate; ``--tls-cert``/``--tls-key`` pick another.
An admin certificate makes the caller admin with no token.

The admin token is taken from, in order: ``--token``, ``--token-file``,
``$LLMGW_ADMIN_TOKEN``, ``$LLMGW_ADMIN_TOKEN_FILE``, then ``.llmgw/admin.token``
(what ``llmgw up`` writes) when it exists. It is sent as gRPC metadata
``authorization: Bearer TOKEN`` on every call. A control plane without a
token configured ignores it.

Failures become :class:`AdminError` with one line that says what happened
and what to do; the server's own message (which names what to fix) follows
when it has more to say. "Not reachable" is said only when the address
takes no TCP connection: an UNAVAILABLE the control plane sends (etcd down,
not the leader) is its own message, which names the part that failed.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format

from llmgw.common.errors import InvalidArgument
from llmgw.common.tls import PLAINTEXT, TlsSettings, sync_channel

# Generous: a change validates the whole catalog and writes to etcd.
DEADLINE_SECONDS = 10.0
DEFAULT_TOKEN_FILE = Path(".llmgw") / "admin.token"
DEFAULT_TLS_DIR = Path(".llmgw") / "tls"


class AdminError(Exception):
    pass


def resolve_token(token: str | None, token_file: str | None, env: dict[str, str]) -> str:
    """The admin token from the first source that gives one, in the module docstring's order."""
    if token:
        return token.strip()
    if not token_file and env.get("LLMGW_ADMIN_TOKEN"):
        return env["LLMGW_ADMIN_TOKEN"].strip()
    path = token_file or env.get("LLMGW_ADMIN_TOKEN_FILE")
    if not path and DEFAULT_TOKEN_FILE.exists():
        path = str(DEFAULT_TOKEN_FILE)
    if not path:
        return ""
    try:
        return Path(path).read_text().strip()
    except OSError as err:
        raise AdminError(f"cannot read the admin token file {path}: {err.strerror}") from None


def admin_cert(directory: Path) -> tuple[Path, Path]:
    """The one admin certificate of a directory and its key."""
    found = sorted(directory.glob("admin-*.crt"))
    if len(found) != 1:
        raise AdminError(
            f"{directory} holds {len(found)} admin certificates (admin-*.crt); "
            "pick one with --tls-cert and --tls-key"
            + ("" if found else ", or issue one: llmgw certs issue admin NAME")
        )
    return found[0], found[0].with_suffix(".key")


def resolve_tls(args: Any, env: dict[str, str]) -> TlsSettings:
    """The connection's TLS files, from the first source that gives them (the module docstring's order)."""
    if getattr(args, "plaintext", False):
        return PLAINTEXT
    ca, cert, key = (getattr(args, f"tls_{k}", None) for k in ("ca", "cert", "key"))
    directory = getattr(args, "tls_dir", None) or env.get("LLMGW_TLS_DIR")
    if not directory and DEFAULT_TLS_DIR.is_dir():
        directory = str(DEFAULT_TLS_DIR)
    if directory:
        d = Path(directory)
        ca = ca or str(d / "ca.crt")
        if not cert:
            crt, k = admin_cert(d)
            cert, key = str(crt), key or str(k)
    if not (ca and cert and key):
        raise AdminError(
            "no TLS certificate to call the control plane with: pass --tls-dir DIR (or $LLMGW_TLS_DIR) "
            "holding ca.crt and an admin-NAME.crt, or --tls-ca, --tls-cert and --tls-key; run from the "
            "directory above .llmgw for a cluster `llmgw up` started; --plaintext for a plaintext cluster"
        )
    try:
        return TlsSettings(ca_file=ca, cert_file=cert, key_file=key)
    except ValueError as err:
        raise AdminError(str(err)) from None


@dataclass
class Target:
    """Where and how to reach the admin API."""

    address: str
    token: str = ""
    tls: TlsSettings = PLAINTEXT

    @classmethod
    def from_args(cls, args: Any) -> Target:
        env = dict(os.environ)
        return cls(args.control, resolve_token(args.token, args.token_file, env), resolve_tls(args, env))

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def call(
        self, command: str, method: Callable[..., Any], request: Any, timeout: float = DEADLINE_SECONDS
    ) -> Any:
        """One unary call with the deadline and the token; AdminError on failure."""
        try:
            return method(request, timeout=timeout, metadata=self.metadata)
        except grpc.RpcError as err:
            raise self.error(err, command) from None

    def error(self, err: grpc.RpcError, command: str) -> AdminError:
        code = err.code()
        details = err.details() or ""
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            # The words of the status cannot tell whose failure it is: a control plane that
            # answers UNAVAILABLE quotes its own dependency's error ("etcd ... failed to connect
            # ..."). Whether the address takes a connection can.
            if not listening(self.address):
                return AdminError(
                    f"control plane at {self.address} is not reachable ({code.name.lower()}); "
                    "is it running? set --control or LLMGW_CONTROL"
                )
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return AdminError(
                    f"{command}: the control plane at {self.address} took a connection but did not "
                    "answer in time; see its log"
                )
            if not self.tls.plaintext and ("handshake" in details.lower() or "ssl" in details.lower()):
                # It listens, yet gRPC could not connect: the TLS handshake failed.
                return AdminError(
                    f"control plane at {self.address} refused the TLS handshake ({details}); "
                    "the CA and certificate must be the cluster's (--tls-dir)"
                )
        if code == grpc.StatusCode.PERMISSION_DENIED:
            return AdminError(f"{command}: refused: {details}")
        if code == grpc.StatusCode.UNAUTHENTICATED and "certificate" in details:
            return AdminError(f"{command}: {details}")
        if code == grpc.StatusCode.UNAUTHENTICATED:
            given = "the admin token given was refused" if self.token else "no admin token was given"
            return AdminError(
                f"{command}: {given}; pass it with --token, --token-file or $LLMGW_ADMIN_TOKEN "
                f"(the control plane's admin_token_file)"
            )
        return AdminError(f"{command} failed: {code.name}: {err.details()}")


def listening(address: str, timeout: float = 2.0) -> bool:
    """Whether something at ``address`` (host:port) accepts a TCP connection."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def channel(target: Target) -> grpc.Channel:
    try:
        return sync_channel(target.address, target.tls)
    except InvalidArgument as err:
        raise AdminError(str(err)) from None


def as_json(msg: Any) -> str:
    return json.dumps(json_format.MessageToDict(msg, preserving_proto_field_name=True), indent=2)
