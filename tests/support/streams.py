"""Clients that stream through the router without pause, and count every outcome.

The official openai client, no retries of its own: a request that fails is
a failure the router let through. Outcomes are "ok", "failed before the
first chunk" and "failed mid-stream"; ``errors`` says what each failure was.
"""

from __future__ import annotations

import threading
from collections import Counter

import openai


class Clients:
    """``count`` threads streaming chat completions of ``model`` back to back until stopped."""

    def __init__(self, router_url: str, model: str = "demo", count: int = 4):
        self._url = router_url + "/v1"
        self._model = model
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.outcomes: Counter[str] = Counter()
        self.errors: list[str] = []
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
        client = openai.OpenAI(base_url=self._url, api_key="unused", max_retries=0, timeout=30)
        while not self._stop.is_set():
            chunks = 0
            try:
                stream = client.chat.completions.create(
                    model=self._model,
                    messages=[{"role": "user", "content": f"client {i}: tell me something"}],
                    stream=True,
                    stream_options={"include_usage": True},
                )
                usage = None
                for chunk in stream:
                    chunks += 1
                    usage = chunk.usage or usage
                if usage is None or usage.completion_tokens <= 0:
                    raise RuntimeError(f"stream ended after {chunks} chunk(s) without usage")
                outcome = "ok"
            except Exception as err:  # every kind of failure counts; none may happen
                outcome = "failed mid-stream" if chunks else "failed before the first chunk"
                with self._lock:
                    self.errors.append(f"client {i}, {outcome}: {type(err).__name__}: {err}")
            with self._lock:
                self.outcomes[outcome] += 1
