"""One connection to a control plane for every admin command: address, admin token, errors.

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

# Generous: a change validates the whole catalog and writes to etcd.
DEADLINE_SECONDS = 10.0
DEFAULT_TOKEN_FILE = Path(".llmgw") / "admin.token"


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


@dataclass
class Target:
    """Where and how to reach the admin API."""

    address: str
    token: str = ""

    @classmethod
    def from_args(cls, args: Any) -> Target:
        return cls(args.control, resolve_token(args.token, args.token_file, dict(os.environ)))

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
    return grpc.insecure_channel(target.address)


def as_json(msg: Any) -> str:
    return json.dumps(json_format.MessageToDict(msg, preserving_proto_field_name=True), indent=2)
