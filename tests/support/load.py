"""Closed-loop load for tests and benchmarks: client threads sending back to back until stopped."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections import Counter
from collections.abc import Callable


class Load:
    """``clients`` threads each calling ``send`` again as soon as it returns, until the block ends.

    ``send`` returns the replica that answered ("" when it cannot tell) and
    the monotonic time its first bytes arrived; any exception is a failure,
    counted with its message. ``first`` holds when each replica first answered.
    """

    def __init__(self, send: Callable[[], tuple[str, float]], clients: int):
        self._send = send
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.outcomes: Counter[str] = Counter()
        self.errors: list[str] = []
        self.first: dict[str, float] = {}
        self.started = 0.0
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def __enter__(self) -> Load:
        self.started = time.monotonic()
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                replica, at = self._send()
            except Exception as err:  # every failure counts; the caller decides how many may happen
                with self._lock:
                    self.outcomes["failed"] += 1
                    self.errors.append(f"{type(err).__name__}: {err}")
                continue
            with self._lock:
                self.outcomes["ok"] += 1
                self.first.setdefault(replica, at)


def post_chat(base_url: str, body: dict, timeout: float = 120) -> tuple[int, str, float]:
    """POST /v1/chat/completions with the stdlib: (status, x-llmgw-replica, first-byte time); reads it all."""
    host = base_url.split("//", 1)[1].split("/", 1)[0]
    conn = http.client.HTTPConnection(host, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read(1)
        first = time.monotonic()
        resp.read()
        return resp.status, resp.headers.get("x-llmgw-replica", ""), first
    finally:
        conn.close()
