"""Requests and tokens per owner path and model, from the routers' quota reports: soft state of one term.

Routers report what each owner's keys consumed, by model, with every
QuotaService report (applied once per report, see api/quota.py); the
leader adds it here. Decisions:

- Like GPU-hours (:mod:`.gpuhours`), soft state: a new term starts from
  zero and says since when it counts. Billing-grade history belongs in
  Prometheus (``llmgw_control_owner_requests_total`` and
  ``..._tokens_total``, or the routers' own ``llmgw_router_owner_*``).
- Per exact owner path; the roll-up to team and org is done when read
  (OwnerService), in one place, as for GPU-hours.
- Periods: counts are kept per minute for the last :data:`HISTORY_SECONDS`
  (24 h), so a period is summed at minute resolution; totals since the term
  began are kept apart and never dropped.
- Bounded: at most :data:`MAX_SERIES` (owner, model) pairs; usage of a
  pair beyond them is dropped with a warning (a cluster has far fewer
  keys' owners times models).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

log = logging.getLogger("llmgw.control.state.ownerrequests")

HISTORY_SECONDS = 86_400
MINUTE = 60.0
MAX_SERIES = 10_000


@dataclass
class _Series:
    requests: int = 0
    tokens: int = 0
    # (minute start, requests, tokens), oldest first, the last HISTORY_SECONDS.
    minutes: deque[list] = field(default_factory=deque)


class OwnerRequests:
    def __init__(self) -> None:
        self.since = 0.0
        self._term: object | None = None
        self._series: dict[tuple[str, str], _Series] = {}

    def term(self, term: object | None, wall: float) -> OwnerRequests:
        """This book for ``term``: a term other than the last one counted starts from zero at ``wall``."""
        if term is not None and term is not self._term:
            self._term, self.since, self._series = term, wall, {}
        return self

    def add(self, owner: str, model: str, requests: int, tokens: int, wall: float) -> None:
        key = (owner, model)
        s = self._series.get(key)
        if s is None:
            if len(self._series) >= MAX_SERIES:
                log.warning("usage of %s on %s not counted: %d owner/model pairs", owner, model, MAX_SERIES)
                return
            s = self._series[key] = _Series()
        s.requests += requests
        s.tokens += tokens
        minute = wall - wall % MINUTE
        if s.minutes and s.minutes[-1][0] == minute:
            s.minutes[-1][1] += requests
            s.minutes[-1][2] += tokens
        else:
            s.minutes.append([minute, requests, tokens])
        while s.minutes and s.minutes[0][0] < wall - HISTORY_SECONDS:
            s.minutes.popleft()

    def totals(self) -> Mapping[tuple[str, str], tuple[int, int]]:
        """(owner, model) -> (requests, tokens) since the term began."""
        return {k: (s.requests, s.tokens) for k, s in self._series.items()}

    def over(self, period: float, wall: float) -> dict[tuple[str, str], tuple[int, int]]:
        """(owner, model) -> (requests, tokens) in the minutes from ``wall - period`` on.

        ``period`` 0: the whole term.
        """
        if period <= 0:
            return dict(self.totals())
        start = wall - period
        out = {}
        for key, s in self._series.items():
            r = t = 0
            for minute, requests, tokens in s.minutes:
                # A minute counts when any of it is in the period.
                if minute + MINUTE > start:
                    r += requests
                    t += tokens
            if r or t:
                out[key] = (r, t)
        return out
