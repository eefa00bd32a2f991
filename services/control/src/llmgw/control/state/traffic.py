"""Routers' request and error rates, from the cumulative counts in their usage reports.

A router reports what it has answered since it started (per model:
requests, client errors, server errors), never per-request events. A rate
is the difference between its latest report and the oldest one kept within
:data:`WINDOW_SECONDS`, divided by the time between them, as Prometheus's
``rate()`` does over a range. Reports are kept at most one per
:data:`STEP_SECONDS`, so a router costs a dozen samples whatever its tick.

A count lower than the one before means the router restarted under the
same id: its history starts again from that report (rates read zero until
the next one), rather than a negative rate.

Soft state in the leader's memory, as the rest of the usage book.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

WINDOW_SECONDS = 60.0
STEP_SECONDS = 5.0


@dataclass(frozen=True)
class Counts:
    """Requests answered, and of them 4xx (but 499) and 5xx."""

    requests: float = 0.0
    client_errors: float = 0.0
    server_errors: float = 0.0

    def minus(self, other: Counts) -> Counts:
        return Counts(
            self.requests - other.requests,
            self.client_errors - other.client_errors,
            self.server_errors - other.server_errors,
        )

    def plus(self, other: Counts) -> Counts:
        return Counts(
            self.requests + other.requests,
            self.client_errors + other.client_errors,
            self.server_errors + other.server_errors,
        )

    def per(self, seconds: float) -> Counts:
        return Counts(self.requests / seconds, self.client_errors / seconds, self.server_errors / seconds)

    def below(self, other: Counts) -> bool:
        """Whether any count went down from ``other`` (a restart)."""
        return (
            self.requests < other.requests
            or self.client_errors < other.client_errors
            or self.server_errors < other.server_errors
        )


ZERO = Counts()


def total(counts: Iterable[Counts]) -> Counts:
    out = ZERO
    for c in counts:
        out = out.plus(c)
    return out


class TrafficHistory:
    """One router's cumulative counts over the last window, per model."""

    def __init__(self, window: float = WINDOW_SECONDS, step: float = STEP_SECONDS):
        self._window = window
        self._step = step
        # Kept samples, oldest first; the first is the rates' baseline.
        self._kept: deque[tuple[float, Mapping[str, Counts]]] = deque()
        self.latest: tuple[float, Mapping[str, Counts]] = (0.0, {})

    def add(self, now: float, counts: Mapping[str, Counts]) -> None:
        _, before = self.latest
        if any(c.below(before.get(m, ZERO)) for m, c in counts.items()) or set(before) - set(counts):
            self._kept.clear()  # the router restarted: its counts began again
        self.latest = (now, counts)
        if not self._kept or now - self._kept[-1][0] >= self._step:
            self._kept.append(self.latest)
        # The baseline is the newest sample at least a window old (or the oldest there is).
        while len(self._kept) > 1 and self._kept[1][0] <= now - self._window:
            self._kept.popleft()

    def span(self) -> float:
        """Seconds between the baseline and the latest report."""
        return self.latest[0] - self._kept[0][0] if self._kept else 0.0

    def rates(self) -> dict[str, Counts]:
        """Per model, per second over :meth:`span` (empty before two reports a moment apart)."""
        seconds = self.span()
        if seconds <= 0:
            return {}
        base = self._kept[0][1]
        return {m: c.minus(base.get(m, ZERO)).per(seconds) for m, c in self.latest[1].items()}
