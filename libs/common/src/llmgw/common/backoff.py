"""Retry delays: the one backoff policy of every retry loop in llmgw.

The agent's control-plane link, the router's watch, quota and usage streams
and the router's engine-metrics polls wait by this policy, so one reading of
it holds everywhere; the leader's replacement of a failed replica waits its
ceiling (one decision per model, shown to operators, needs no spreading).

After ``n`` consecutive failures (``n >= 1``) the wait is drawn uniformly from
``[initial, min(maximum, initial * 2**(n - 1))]``:

- **Exponential** ceilings, capped at ``maximum``: a peer that stays down costs
  one attempt per ``maximum`` seconds per client.
- **Full jitter** across the whole window above the floor (the "Exponential
  Backoff And Jitter" analysis: full jitter spreads a crowd of clients that
  failed together best, so a control plane or etcd coming back is not met by
  every agent and router at the same instant).
- **A floor of** ``initial``, deliberately, unlike textbook full jitter's
  ``U(0, ceiling)``: the first retry comes after exactly ``initial`` (fast
  recovery from a blip stays predictable), and no retry ever comes sooner, so
  a crash loop or a refusing peer is never hammered by a lucky draw near zero.

``delay`` is a pure function of the failure count and a ``random.Random``
that callers own (seeded in tests); :class:`Retries` is the counter a loop
keeps between attempts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["BackoffPolicy", "Retries"]


@dataclass(frozen=True)
class BackoffPolicy:
    """Waits between attempts: see the module docstring for the policy."""

    initial: float = 0.1
    maximum: float = 2.0

    def __post_init__(self) -> None:
        if self.initial < 0 or self.maximum < self.initial:
            raise ValueError(f"backoff needs 0 <= initial <= maximum, got {self.initial} and {self.maximum}")

    def ceiling(self, failures: int) -> float:
        """The longest wait after ``failures`` consecutive failures."""
        # 2**62 already dwarfs any maximum; the bound keeps the power finite.
        return min(self.maximum, self.initial * float(2 ** min(max(failures, 1) - 1, 62)))

    def delay(self, failures: int, rng: random.Random) -> float:
        """How long to wait after ``failures`` consecutive failures (1 for the first)."""
        return rng.uniform(min(self.initial, self.maximum), self.ceiling(failures))


class Retries:
    """One loop's consecutive failures: ``next()`` after a failure, ``reset()`` after a success."""

    def __init__(self, policy: BackoffPolicy, rng: random.Random | None = None) -> None:
        self.policy = policy
        self._rng = rng or random.Random()
        self.failures = 0

    def next(self) -> float:
        """Count one more failure and return how long to wait before the next attempt."""
        self.failures += 1
        return self.policy.delay(self.failures, self._rng)

    def reset(self) -> None:
        self.failures = 0
