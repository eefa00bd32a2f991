"""Clients that stream through the router without pause, and count every outcome.

The official openai client, no retries of its own: a request that fails is
a failure the router let through. Outcomes are "ok", "failed before the
first chunk" and "failed mid-stream"; ``errors`` says what each failure was.
With ``mixed``, every other request asks for a whole (not streamed) answer.
``latencies`` holds (start, seconds, ok) per request, monotonic clock.
``served`` holds, per answer in the order they ended, the distinct
``system_fingerprint`` values its chunks carried (the simulator's: the
weights that answered), sorted; None where an engine sent none.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import openai


class Clients:
    """``count`` threads streaming chat completions of ``model`` back to back until stopped."""

    def __init__(
        self,
        router_url: str,
        model: str = "demo",
        count: int = 4,
        *,
        timeout: float = 30,
        mixed: bool = False,
    ):
        self._url = router_url + "/v1"
        self._model = model
        self._timeout = timeout
        self._mixed = mixed
        self.latencies: list[tuple[float, float, bool]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.outcomes: Counter[str] = Counter()
        self.errors: list[str] = []
        self.served: list[tuple[str | None, ...]] = []
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(count)]

    def __enter__(self) -> Clients:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    @property
    def requests(self) -> int:
        with self._lock:
            return sum(self.outcomes.values())

    def _run(self, i: int) -> None:
        client = openai.OpenAI(base_url=self._url, api_key="unused", max_retries=0, timeout=self._timeout)
        n = 0
        while not self._stop.is_set():
            n += 1
            chunks = 0
            prints: set[str | None] = set()
            started = time.monotonic()
            messages = [{"role": "user", "content": f"client {i}: tell me something"}]
            try:
                if self._mixed and n % 2 == 0:
                    whole = client.chat.completions.create(model=self._model, messages=messages)
                    prints.add(whole.system_fingerprint)
                    if whole.usage is None or whole.usage.completion_tokens <= 0:
                        raise RuntimeError("a whole answer without usage")
                else:
                    stream = client.chat.completions.create(
                        model=self._model,
                        messages=messages,
                        stream=True,
                        stream_options={"include_usage": True},
                    )
                    usage = None
                    for chunk in stream:
                        chunks += 1
                        usage = chunk.usage or usage
                        prints.add(chunk.system_fingerprint)
                    if usage is None or usage.completion_tokens <= 0:
                        raise RuntimeError(f"stream ended after {chunks} chunk(s) without usage")
                outcome = "ok"
            except Exception as err:  # every kind of failure counts; none may happen
                outcome = "failed mid-stream" if chunks else "failed before the first chunk"
                with self._lock:
                    self.errors.append(
                        f"client {i}, {outcome} at +{started:.2f}s: {type(err).__name__}: {err}"
                    )
            with self._lock:
                self.outcomes[outcome] += 1
                if outcome == "ok":
                    self.served.append(tuple(sorted(prints, key=str)))
                self.latencies.append((started, time.monotonic() - started, outcome == "ok"))

    def started_between(self, since: float, until: float = float("inf")) -> list[float]:
        """Latencies, sorted, of the requests started in [since, until)."""
        with self._lock:
            return sorted(d for s, d, _ in self.latencies if since <= s < until)

    def p99(self, since: float = 0.0, until: float = float("inf")) -> float:
        """The 99th percentile latency of requests started in [since, until) (0: none)."""
        xs = self.started_between(since, until)
        return xs[min(len(xs) - 1, int(len(xs) * 0.99))] if xs else 0.0
