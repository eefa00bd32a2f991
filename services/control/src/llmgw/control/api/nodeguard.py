"""What a node's certificate lets it say on AgentService.Connect.

Checked on every message before AgentServicer sees it (the stream's
request iterator is wrapped, so api/agents.py knows nothing of it):

- Register names the certificate's node id, and no other: a node registers,
  reports and streams only as itself, so node A cannot take node B's
  stream or report B's replicas.
- Every engine URL (ReplicaStatus.url in Register, Heartbeat and status
  messages) and Register.address name a host the node may publish: the IP
  and DNS SANs of its certificate, which the CA vouched for when it issued
  it (``llmgw certs issue node ID --host ADDR``). A certificate with no such
  SAN allows the address the connection comes from. So a node cannot send
  users' prompts and its engine key to a host of its choosing.

The first message that breaks a rule ends the stream: the servicer sees
the end of its input (the node's session closes as when an agent goes
away, nothing of the message is recorded) and the call ends with
PERMISSION_DENIED and what was refused. In plaintext mode nothing is
checked (there is no certificate to check against).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from llmgw.v1 import agent_pb2

if TYPE_CHECKING:
    from .auth import Caller

log = logging.getLogger("llmgw.control.api.nodeguard")


def peer_host(peer: str) -> str:
    """The address in a gRPC peer string: ``ipv4:10.0.0.5:4242`` -> ``10.0.0.5``."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    return ""


def _normal(host: str) -> str:
    host = host.strip("[]").lower()
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def allowed_hosts(who: Caller) -> frozenset[str]:
    assert who.identity is not None
    if who.identity.hosts:
        return frozenset(_normal(h) for h in who.identity.hosts)
    host = peer_host(who.peer)
    return frozenset({_normal(host)}) if host else frozenset()


class AgentStreamGuard:
    def __init__(self, source: AsyncIterator[agent_pb2.AgentMessage], who: Caller):
        self._source = source
        self._who = who
        self._hosts = allowed_hosts(who) if who.verified else frozenset()
        self.violation = ""
        self.requests = self._checked()

    async def _checked(self) -> AsyncIterator[agent_pb2.AgentMessage]:
        async for msg in self._source:
            if self._who.verified:
                problem = self.problem(msg)
                if problem:
                    self.violation = problem
                    log.warning("closing the stream of %s: %s", self._who, problem)
                    return
            yield msg

    def _url_problem(self, statuses: Iterable[agent_pb2.ReplicaStatus]) -> str:
        for s in statuses:
            if not s.url:
                continue
            parts = urlsplit(s.url)
            host = _normal(parts.hostname or "")
            if parts.scheme not in ("http", "https") or host not in self._hosts:
                return (
                    f"replica {s.replica_id}: URL {s.url!r} is not on a host of node {self._who.name}'s "
                    f"certificate ({', '.join(sorted(self._hosts)) or 'none'}); issue the node's "
                    "certificate with --host for each address its engines listen on"
                )
        return ""

    def problem(self, msg: agent_pb2.AgentMessage) -> str:
        kind = msg.WhichOneof("msg")
        if kind == "register":
            reg = msg.register
            if reg.node_id != self._who.name:
                return (
                    f"Register.node_id {reg.node_id!r}: the certificate is node {self._who.name!r}'s, "
                    "and a node registers only as itself"
                )
            if reg.address and _normal(urlsplit("//" + reg.address).hostname or "") not in self._hosts:
                return (
                    f"Register.address {reg.address!r} is not a host of node {self._who.name}'s certificate "
                    f"({', '.join(sorted(self._hosts)) or 'none'})"
                )
            return self._url_problem(reg.replicas)
        if kind == "heartbeat":
            return self._url_problem(msg.heartbeat.replicas)
        if kind == "status":
            return self._url_problem([msg.status])
        return ""


def guard_agent_stream(source: AsyncIterator[agent_pb2.AgentMessage], who: Caller) -> AgentStreamGuard:
    return AgentStreamGuard(source, who)
