#!/usr/bin/env python3
"""A lean HTTP/1.1 load generator, run as a process of its own by the router benchmarks.

Closed loop: ``--concurrency`` keep-alive connections (spread over the
``--url``s in turn), each sending the same POST again as soon as its last
answer ended. It runs ``--warmup`` seconds unmeasured, then ``--seconds``
measured, and prints one JSON object: requests completed in the window,
errors, latency and time-to-first-byte percentiles, and, for each
``--watch`` PID, the CPU seconds its process tree used in the window.

Why not aiohttp's client: on a 2-core machine the generator competes for
CPU with what it measures, and aiohttp's client costs several times what
this does per request (a protocol object parsing the response in place,
no per-request objects beyond a future). The price is that it speaks only
what the benchmark needs: ``Content-Length`` or chunked answers, no
trailers, no redirects.

An answer counts as an error when its status is not 200, when the
connection closes before it ends, or (``--expect``) when its last 64 bytes
on the wire do not hold the expected ones (``[DONE]`` for a stream that
finished).

Time to first byte: from sending the request to the first byte of the
answer's body (for a stream, its first event).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import cpu_seconds  # noqa: E402

try:
    import uvloop
except ImportError:  # the generator works without it, only slower
    uvloop = None


class ConnectionLost(Exception):
    pass


class HttpConnection(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()
        self._buf = bytearray()
        self._waiter: asyncio.Future | None = None
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.first_byte = 0.0
        self.tail = b""
        self.keep_alive = True
        self._head_done = False
        self._remaining = -1  # Content-Length left; -1 while chunked
        self._chunked = False
        self._chunk_left = 0  # bytes of the current chunk's data left (+2 for its CRLF)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionLost(str(exc or "closed by the server")))
        if not self.closed.done():
            self.closed.set_result(None)

    def request(self, data: bytes) -> asyncio.Future:
        self._reset()
        self._waiter = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(data)
        return self._waiter

    def data_received(self, data: bytes) -> None:
        if not self.first_byte and self._head_done:
            self.first_byte = time.perf_counter()
        self._buf += data
        # The last bytes seen, framing included, for --expect.
        self.tail = (self.tail + data)[-64:]
        try:
            self._parse()
        except ValueError as err:
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_exception(ConnectionLost(f"bad response: {err}"))
            assert self.transport is not None
            self.transport.close()

    def _parse(self) -> None:
        buf = self._buf
        if not self._head_done:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = bytes(buf[:end]).split(b"\r\n")
            del buf[: end + 4]
            self._head_done = True
            self.status = int(lines[0][9:12])
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    self._remaining = int(value)
                elif name == b"transfer-encoding":
                    self._chunked = b"chunked" in value.lower()
                elif name == b"connection":
                    self.keep_alive = b"close" not in value.lower()
            if not self._chunked and self._remaining < 0:
                raise ValueError("neither Content-Length nor chunked")
            if buf:
                self.first_byte = time.perf_counter()
        if not self._chunked:
            if len(buf) >= self._remaining:
                del buf[: self._remaining]
                self._finish()
            return
        while True:
            if self._chunk_left:
                take = min(self._chunk_left, len(buf))
                del buf[:take]
                self._chunk_left -= take
                if self._chunk_left:
                    return
            line_end = buf.find(b"\r\n")
            if line_end < 0:
                return
            size = int(bytes(buf[:line_end]).split(b";")[0], 16)
            if size == 0:
                if len(buf) < line_end + 4:
                    return
                del buf[: line_end + 4]
                self._finish()
                return
            del buf[: line_end + 2]
            self._chunk_left = size + 2

    def _finish(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if not self.keep_alive and self.transport is not None:
            self.transport.close()


def request_bytes(url: str, path: str, body: bytes, headers: list[str]) -> bytes:
    host = urlsplit(url).netloc
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", "Content-Type: application/json"]
    lines += headers
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def run(args: argparse.Namespace, body: bytes) -> dict:
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    ttfbs: list[float] = []
    errors: list[str] = []
    measuring = False
    stopping = False

    async def worker(index: int) -> None:
        url = args.url[index % len(args.url)]
        target = urlsplit(url)
        payload = request_bytes(url, args.path, body, args.header)
        conn: HttpConnection | None = None
        while not stopping:
            try:
                if conn is None or conn.transport is None or conn.transport.is_closing():
                    _, conn = await loop.create_connection(HttpConnection, target.hostname, target.port)
                t0 = time.perf_counter()
                await conn.request(payload)
                t1 = time.perf_counter()
            except (OSError, ConnectionLost) as err:
                conn = None
                if measuring and not stopping:
                    errors.append(f"{type(err).__name__}: {err}")
                    await asyncio.sleep(0.01)
                continue
            if stopping or not measuring:
                continue
            if conn.status != 200:
                errors.append(f"status {conn.status}")
            elif args.expect and args.expect.encode() not in conn.tail:
                errors.append(f"body ended with {conn.tail!r}")
            else:
                latencies.append(t1 - t0)
                ttfbs.append((conn.first_byte or t1) - t0)
        if conn is not None and conn.transport is not None:
            conn.transport.close()

    tasks = [asyncio.ensure_future(worker(i)) for i in range(args.concurrency)]
    await asyncio.sleep(args.warmup)
    cpu0 = {pid: cpu_seconds(pid) for pid in args.watch}
    measuring = True
    start = time.perf_counter()
    await asyncio.sleep(args.seconds)
    stopping = True
    elapsed = time.perf_counter() - start
    cpu = {pid: cpu_seconds(pid) - cpu0[pid] for pid in args.watch}
    await asyncio.wait(tasks, timeout=max(5.0, args.seconds))
    for t in tasks:
        t.cancel()
    return {
        "requests": len(latencies),
        "errors": len(errors),
        "error_samples": sorted(set(errors))[:5],
        "seconds": elapsed,
        "rps": len(latencies) / elapsed,
        "p50_ms": percentile(latencies, 0.50) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "ttfb_p50_ms": percentile(ttfbs, 0.50) * 1000,
        "ttfb_p99_ms": percentile(ttfbs, 0.99) * 1000,
        "cpu_seconds": {str(pid): used for pid, used in cpu.items()},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", action="append", required=True, help="base URL (repeatable; spread in turn)")
    ap.add_argument("--path", default="/v1/chat/completions")
    ap.add_argument("--body", default="{}")
    ap.add_argument("--body-file")
    ap.add_argument("--header", action="append", default=[], help="'Name: value' (repeatable)")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--expect", default="", help="bytes every answer body must end with")
    ap.add_argument("--watch", type=int, action="append", default=[], help="PID whose tree CPU to measure")
    args = ap.parse_args()
    runner = uvloop.run if uvloop is not None else asyncio.run
    body = Path(args.body_file).read_bytes() if args.body_file else args.body.encode()
    print(json.dumps(runner(run(args, body))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
