"""A token bucket with debt: the one rate-limit primitive of llmgw.

The bucket holds at most ``capacity`` and refills at ``rate`` per second.
``take`` always succeeds and may leave the level negative (debt), down to
``floor``: callers may admit work while the level is positive and charge
its cost once known, which is how a tokens-per-minute limit works when the
tokens are only counted after the response. Time is passed in (monotonic
seconds), so the bucket is a pure value that tests drive directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class TokenBucket:
    capacity: float
    rate: float
    level: float
    at: float
    # The lowest level debt may reach (<= 0).
    floor: float

    @classmethod
    def full(cls, capacity: float, rate: float, now: float, floor: float | None = None) -> TokenBucket:
        return cls(capacity, rate, capacity, now, -capacity if floor is None else floor)

    def refill(self, now: float) -> float:
        """Bring the level up to ``now``; returns it."""
        if now > self.at:
            self.level = min(self.capacity, self.level + self.rate * (now - self.at))
            self.at = now
        return self.level

    def take(self, amount: float, now: float) -> None:
        self.refill(now)
        self.level = max(self.floor, min(self.capacity, self.level - amount))

    def is_full(self, now: float) -> bool:
        return self.refill(now) >= self.capacity

    def seconds_until(self, wanted: float, now: float) -> float:
        """How long until the level reaches ``wanted`` (0 when it has; inf when it never will)."""
        level = self.refill(now)
        if level >= wanted:
            return 0.0
        if self.rate <= 0 or wanted > self.capacity:
            return math.inf
        return (wanted - level) / self.rate
