"""Connections to every etcd member, and failing over between them.

aetcd (like python-etcd3 before it) dials one ``host:port`` over a plaintext
channel; it knows nothing of a cluster's other members or of TLS. So the
failover lives here, at one depth, below every Store call: :class:`Members`
holds one gRPC channel per listed endpoint (opened on first use) and the
index of the member calls go to now. aetcd is kept for its generated etcd
stubs only.

Decisions, after etcd's own ``clientv3`` (its retry interceptor):

- One member at a time, the first listed to begin with; a member that fails
  a call is left for the next one in the list, for every later call too
  (no failing back: the one in use stays until it fails in turn).
- A member has failed when it refuses the connection, answers UNAVAILABLE
  (down, shutting down, no raft leader) or does not answer within
  ``member_timeout`` -- the only way to notice a member that still accepts
  TCP but never answers (SIGSTOP, a hung disk, a partition).
- Reads, lease refreshes, grants and revokes are safe to repeat, so they go
  round the members until one answers or the call's whole deadline
  (``timeout``) passes. The first round gives each member ``member_timeout``
  (so the third member of three is asked within two of them); each later
  round doubles it, so a slow but healthy cluster still answers, and begins
  one member further than the last. A round of failures waits a little
  before the next: while etcd elects a new raft leader (a second or two
  after its leader died) no member answers lease calls, and a follower holds
  them until the caller's deadline; the next round must not start with the
  member that hangs.
- A write (Txn) is repeated on another member only when it provably never
  left: the channel was not connected. Such a write goes round the members
  like a read, until the call's deadline (a first TLS handshake to a member
  that just started can take longer than ``member_timeout``). Once sent, a
  failure's outcome is unknown, so it raises :class:`Unavailable` (after
  moving to the next member for the calls that follow); callers re-read, as
  the Store contract says.
- Watches (in ``client``) use the same current member and report failures
  here, so a member that stopped answering a watch is left by every call.

Concurrency: one asyncio loop. A failure moves the current member only if
it still is the one that failed, so two calls failing on the same member at
once move one step, not two.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

import grpc

from ..backoff import BackoffPolicy, Retries
from ..config import EtcdTls
from ..errors import InvalidArgument, Unavailable

T = TypeVar("T")

log = logging.getLogger("llmgw.common.etcd")

# Codes that say "this member cannot serve now", as opposed to "this request is wrong". UNKNOWN
# is how etcd passes on an error it has no code for; the one seen in practice is a follower's
# "context deadline exceeded" while it forwards a lease refresh to a leader that just died.
MEMBER_FAILURES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNKNOWN}
)

# The largest answer read from etcd (a range over the whole cluster prefix).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

# Pauses after a full round of members failed, before the next round (common backoff policy).
ROUND_BACKOFF = BackoffPolicy(initial=0.1, maximum=1.0)


_DIAL_FAILED = (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN)


class MemberFailed(Exception):
    """One member did not serve one attempt; the caller may try the next."""


def channel_credentials(tls: EtcdTls) -> grpc.ChannelCredentials:
    """TLS credentials from the config's PEM files; InvalidArgument names a file that cannot be read."""

    def read(path: str) -> bytes:
        try:
            return Path(path).read_bytes()
        except OSError as err:
            raise InvalidArgument(f"etcd.tls: cannot read {path}: {err.strerror}") from None

    return grpc.ssl_channel_credentials(
        root_certificates=read(tls.ca_file),
        private_key=read(tls.key_file) if tls.key_file else None,
        certificate_chain=read(tls.cert_file) if tls.cert_file else None,
    )


class Members:
    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        timeout: float,
        member_timeout: float,
        tls: EtcdTls | None = None,
    ):
        if not endpoints:
            raise InvalidArgument("etcd.endpoints is empty: list every etcd member as host:port")
        self._endpoints = list(endpoints)
        self._timeout = timeout
        self.member_timeout = min(member_timeout, timeout)
        self._credentials = channel_credentials(tls) if tls is not None else None
        self._channels: dict[int, grpc.aio.Channel] = {}
        self._current = 0

    @property
    def current(self) -> int:
        return self._current

    @property
    def count(self) -> int:
        return len(self._endpoints)

    def endpoint(self, i: int) -> str:
        return self._endpoints[i]

    def channel(self, i: int) -> grpc.aio.Channel:
        ch = self._channels.get(i)
        if ch is None:
            options = [
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                # A member that comes back is dialled again within a second or two, not minutes.
                ("grpc.initial_reconnect_backoff_ms", 250),
                ("grpc.max_reconnect_backoff_ms", 2000),
            ]
            target = self._endpoints[i]
            if self._credentials is None:
                ch = grpc.aio.insecure_channel(target, options=options)
            else:
                ch = grpc.aio.secure_channel(target, self._credentials, options=options)
            self._channels[i] = ch
        return ch

    def failed(self, i: int, why: str) -> None:
        """Member ``i`` failed a call: leave it for the next one (if it is still the current one)."""
        if i != self._current:
            return
        self._current = (i + 1) % len(self._endpoints)
        if len(self._endpoints) > 1:
            log.warning(
                "etcd member %s failed (%s); using %s",
                self._endpoints[i],
                why,
                self._endpoints[self._current],
            )

    async def call(
        self,
        what: str,
        attempt: Callable[[grpc.aio.Channel, float], Awaitable[T]],
        *,
        repeatable: bool,
    ) -> T:
        """Run ``attempt(channel, timeout)`` on the current member, failing over as the module says."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        errors: list[str] = []
        rounds = Retries(ROUND_BACKOFF)
        round_start: int | None = None
        while True:
            if self._current == round_start:
                # Every member failed and the next round would begin where this one did: begin at
                # the next member instead, so a member that hangs is not asked first every round.
                self._current = (self._current + 1) % len(self._endpoints)
            round_start = self._current
            for _ in range(len(self._endpoints)):
                i = self._current
                left = deadline - loop.time()
                if left <= 0:
                    break
                per = min(self.member_timeout * 2 ** min(rounds.failures, 3), left)
                ch = self.channel(i)
                if not repeatable and not await self._connected(ch, per):
                    errors.append(f"{self._endpoints[i]}: not connected")
                    self.failed(i, "not connected")
                    continue
                try:
                    return await attempt(ch, per)
                except grpc.aio.AioRpcError as err:
                    if err.code() not in MEMBER_FAILURES:
                        raise Unavailable(
                            f"etcd at {self._endpoints[i]} refused {what}: {err.details()}"
                        ) from err
                    why = _describe(err, per)
                    self.failed(i, why)
                    if not repeatable:
                        raise Unavailable(
                            f"etcd {what} at {self._endpoints[i]} failed ({why}); it may or may not "
                            "have been applied"
                        ) from err
                    errors.append(f"{self._endpoints[i]}: {why}")
                except MemberFailed as err:
                    self.failed(i, str(err))
                    errors.append(f"{self._endpoints[i]}: {err}")
            # A write only gets here when no member was connected (a sent write raised above): it
            # never left, so it goes round again like a read, until the deadline.
            pause = rounds.next()
            if deadline - loop.time() <= pause:
                raise Unavailable(f"etcd {what} failed on every member: {'; '.join(errors[-3:])}")
            await asyncio.sleep(pause)

    async def _connected(self, ch: grpc.aio.Channel, seconds: float) -> bool:
        """Whether the channel is (or becomes, within ``seconds``) connected; False on a failed dial."""
        state = ch.get_state(try_to_connect=True)
        try:
            async with asyncio.timeout(seconds):
                while state != grpc.ChannelConnectivity.READY:
                    if state in _DIAL_FAILED:
                        return False
                    await ch.wait_for_state_change(state)
                    state = ch.get_state(try_to_connect=True)
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            await ch.close()


def _describe(err: grpc.aio.AioRpcError, timeout: float) -> str:
    if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"no answer within {timeout:.1f}s"
    return err.details() or err.code().name
