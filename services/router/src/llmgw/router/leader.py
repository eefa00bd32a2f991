"""Reaching the leading control plane: one reconnect loop for the router's leader-only streams.

The usage reports (:mod:`.usage`) and the quota sync (:mod:`.quotasync`)
must each talk to the leader, and only a control plane knows which one that
is, so both follow the same policy, kept here rather than written twice:

- The configured addresses are tried in turn.
- A standby names the leader and the next session goes there at once, with
  no backoff; at most :data:`MAX_REDIRECT_HOPS` in a row, so two control
  planes that each name the other cannot spin the loop.
- A redirect to the address just tried (a leader whose term is still
  loading names itself) is waited out like a failure.
- Anything else (the stream ended, failed, or raised) waits the watch's
  jittered :class:`~llmgw.common.backoff.BackoffPolicy`, reset by a session the leader accepted.
- Never dies on one failure: every exception but cancellation is logged
  and answered by reconnecting.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from collections.abc import Awaitable, Callable, Sequence

import grpc

from llmgw.common.backoff import BackoffPolicy

log = logging.getLogger(__name__)

# Redirects followed in a row before falling back to the configured list.
MAX_REDIRECT_HOPS = 3

# One connection to ``address``: (whether the leader accepted it, the address a standby named or "").
Session = Callable[[str], Awaitable[tuple[bool, str]]]


async def follow_leader(
    what: str,
    addresses: Sequence[str],
    session: Session,
    backoff: BackoffPolicy,
    rng: random.Random,
    *,
    ended: Callable[[], None] | None = None,
) -> None:
    """Run ``session`` against the leader until cancelled; ``ended`` is called after each one."""
    failures = 0
    hops = 0
    configured = itertools.cycle(addresses)
    redirect = ""
    while True:
        address = redirect or next(configured)
        accepted, redirect = False, ""
        try:
            accepted, redirect = await session(address)
        except grpc.aio.AioRpcError as err:
            log.warning("%s with %s failed: %s %s", what, address, err.code().name, err.details())
        except TimeoutError:
            log.warning("%s with %s: no answer in time", what, address)
        except Exception:
            log.exception("%s with %s broke; reconnecting", what, address)
        finally:
            if ended is not None:
                ended()
        if redirect and redirect != address and hops < MAX_REDIRECT_HOPS:
            hops += 1
            log.info("%s: %s redirects to the leader at %s", what, address, redirect)
            continue
        hops, redirect = 0, ""
        failures = 0 if accepted else failures + 1
        await asyncio.sleep(backoff.delay(failures, rng))
