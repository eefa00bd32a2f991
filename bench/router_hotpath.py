#!/usr/bin/env python3
"""The router's own Python cost per request, whole or streamed, without the network.

The peer benchmark (``bench/router_peers.py``) measures the whole router
process on a shared 2-core machine: kernel, load generator and simulators
included, and noisy from run to run. This one isolates what the router's
code costs, to guide work on its request path: the real app (``build_app``
with two static backends, default settings but engine polling off) behind
the real front (:mod:`llmgw.router.front`), with both transports fake. A
client transport feeds each connection a canned chat completion request as
soon as the last answer was written; each upstream connection answers
every request with a canned engine answer on the next loop turn. No
sockets, no other process.

Engine polling is off (there are no engines to poll), but the proxy gets
the stall watch (:mod:`llmgw.router.stall`) that polling brings, as the
real router runs by default: nothing is ever unresponsive here, so it
never cuts an attempt, and each attempt pays what it pays there. The heap
is settled as the router's ``main`` does once it listens
(:func:`llmgw.router.main.settle_heap`: the startup heap frozen, the young
generation's threshold raised); without it the collector's young
collections, which the real router never runs at these concurrencies,
were counted as the chain's (about 20,000 instructions per answer once the
requests in flight held more than 700 objects). Confirm a change under wrk
too (``router_wrk.py``, ``router_cpu_split.py``): a compiled chain once
measured 13% cheaper here and 11% dearer there, by a cycle per attempt
that only the stall watch made (docs/benchmarks.md, "The wire compiled").

Workloads (``--workloads``): ``non-streamed`` (a 16-token completion) and
``stream`` (the simulator's 64-token stream: 67 SSE events, which the
engine's transport delivers in :data:`STREAM_PIECES` pieces on successive
loop turns, as a real engine's arrive in a few reads; ``--requests`` / 4
streams per round), and ``sdk-head`` (the non-streamed request with the
head the official openai client sends: 17 fields rather than 3; not run
unless asked for).

It prints two figures per variant:

- **CPU per request** (``time.process_time`` over a round, the minimum over
  ``--rounds``): includes the event loop's own work (uvloop, futures,
  tasks) and C-level work, but not system calls of the network.
- **Python bytecodes and calls per request** (one extra traced round,
  ``sys.settrace`` with opcode events): deterministic, so a change to the
  path shows up exactly, whatever the machine is doing. It does not see
  C-level work (orjson, regexes, multidict, the loop). ``--detail`` lists
  the functions that execute the most.

Variants (``--variants``): ``app`` (the router's whole chain) and ``bare``
(the front and the upstream client only, with a handler that forwards the
body and copies the answer, or relays the stream as it comes: the floor
the chain's logic sits on); and ``app-no-FEATURE``, the whole chain with
one feature made a no-op while that variant runs (``metrics``, ``record``,
``request-id``, ``pick``, ``affinity``): what the feature costs, by
subtraction.

``--untraced`` skips the traced round: what ``bench/router_instructions.py``
runs under callgrind, where only the timed rounds' instructions are counted.

Usage: python bench/router_hotpath.py [--requests 20000] [--rounds 7] [--variants app,bare]
       [--workloads non-streamed,stream] [--detail] [--untraced]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

CONNECTIONS = 32
BACKENDS = ("http://127.0.0.1:9001", "http://127.0.0.1:9002")


# The fields the official openai client (Python, 1.x) sends besides Host, Content-Type and
# Content-Length: a real client's head has five times the bench's three fields.
SDK_FIELDS = (
    b"Accept: application/json\r\nAccept-Encoding: gzip, deflate\r\nAuthorization: Bearer sk-unused\r\n"
    b"Connection: keep-alive\r\nUser-Agent: OpenAI/Python 1.99.1\r\nX-Stainless-Lang: python\r\n"
    b"X-Stainless-Package-Version: 1.99.1\r\nX-Stainless-OS: Linux\r\nX-Stainless-Arch: x64\r\n"
    b"X-Stainless-Runtime: CPython\r\nX-Stainless-Runtime-Version: 3.11.7\r\nX-Stainless-Async: false\r\n"
    b"x-stainless-retry-count: 0\r\nx-stainless-read-timeout: 600\r\n"
)


def _request(stream: bool, fields: bytes = b"") -> bytes:
    body = json.dumps(
        {
            "model": "bench",
            "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 64 if stream else 16,
            "stream": stream,
        }
    ).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"%sContent-Length: %d\r\n\r\n%s" % (fields, len(body), body)
    )


REQUESTS = {
    "non-streamed": _request(False),
    "stream": _request(True),
    # The non-streamed request with the head the openai client sends.
    "sdk-head": _request(False, SDK_FIELDS),
}
# What the simulator answers such a request with (aiohttp's head, a 16-token completion).
_ANSWER = (
    b'{"id": "chatcmpl-95e8d137026a4c4cb600a96be2f8ef58", "object": "chat.completion", '
    b'"created": 1796305123, '
    b'"model": "bench", "choices": [{"index": 0, "message": {"role": "assistant", "content": " here we for '
    b'much world also all them this as did more no get when to"}, "logprobs": null, "finish_reason": '
    b'"length"}], "usage": {"prompt_tokens": 8, "completion_tokens": 16, "total_tokens": 24}}'
)
ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: %d\r\n"
    b"Date: Thu, 03 Dec 2026 13:38:43 GMT\r\nServer: Python/3.11 aiohttp/3.14.5\r\n\r\n%s"
    % (len(_ANSWER), _ANSWER)
)


def _stream_answer_pieces(pieces: int) -> list[bytes]:
    """The simulator's answer to a 64-token chat stream (its ids and words aside), in ``pieces`` reads.

    An engine writes each event as one whole chunk, so reads end on chunk
    boundaries: the head arrives with the first events, the rest in even
    groups of whole chunks.
    """
    start = b'data: {"id":"chatcmpl-7e878b95ac6c4af082c0d09040639952","object":"chat.completion.chunk",'
    start += b'"created":1796314530,"model":"bench","choices":[{"index":0,"delta":'
    end = b',"logprobs":null,"finish_reason":%s}]}\n\n'
    events = [start + b'{"role":"assistant","content":""}' + end % b"null"]
    events += [start + b'{"content":" word%d"}' % i + end % b"null" for i in range(64)]
    events += [start + b"{}" + end % b'"length"', b"data: [DONE]\n\n"]
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        b"Transfer-Encoding: chunked\r\nDate: Thu, 03 Dec 2026 16:15:30 GMT\r\n"
        b"Server: Python/3.11 aiohttp/3.14.5\r\n\r\n"
    )
    frames = [b"%x\r\n%s\r\n" % (len(e), e) for e in events]
    frames[-1] += LAST_CHUNK
    per = -(-len(frames) // pieces)
    reads = [b"".join(frames[i : i + per]) for i in range(0, len(frames), per)]
    reads[0] = head + reads[0]
    return reads


LAST_CHUNK = b"0\r\n\r\n"
# A stream arrives in this many reads (about what the router makes of a simulator's 64-token stream
# under the peer benchmark's load: strace counts 16 reads per stream).
STREAM_PIECES = 16
STREAM_ANSWER_PIECES = _stream_answer_pieces(STREAM_PIECES)


class EngineTransport:
    """An upstream connection's transport: every request written is answered from the next loop turn."""

    def __init__(self, conn: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._conn, self._loop = conn, loop

    def write(self, data: bytes) -> None:
        # find(), not ``in``: a bytes ``in`` formats a TypeError first (docs/benchmarks.md), a cost
        # of the bench that would be counted as the router's.
        if data.find(b'"stream": true') >= 0:
            self._loop.call_soon(self._feed, 0)
        else:
            self._loop.call_soon(self._conn.data_received, ANSWER)

    def _feed(self, i: int) -> None:
        """One piece of a stream per loop turn."""
        self._conn.data_received(STREAM_ANSWER_PIECES[i])
        if i + 1 < len(STREAM_ANSWER_PIECES):
            self._loop.call_soon(self._feed, i + 1)

    def abort(self) -> None:
        pass

    close = pause_reading = resume_reading = abort

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class Round:
    """One round's clients: ``total`` requests over the connections, each sent when the last answer ended."""

    def __init__(self, total: int, request: bytes) -> None:
        self.total, self.sent, self.done, self.bad = total, 0, 0, 0
        self.request = request
        self.stream = b'"stream": true' in request
        self.finished = asyncio.Event()


class ClientTransport:
    def __init__(self, round_: Round, loop: asyncio.AbstractEventLoop) -> None:
        self._round, self._loop = round_, loop
        self.conn: Any = None
        self._answer_started = False

    def write(self, data: bytes) -> None:
        r = self._round
        if not self._answer_started and not data.startswith(b"HTTP/1.1 200 "):
            r.bad += 1
        if r.stream and not (data == LAST_CHUNK or data.endswith(b"\r\n" + LAST_CHUNK)):
            self._answer_started = True  # more of this stream to come
            return
        self._answer_started = False
        r.done += 1
        if r.sent < r.total:
            r.sent += 1
            self._loop.call_soon(self.conn.data_received, r.request)
        elif r.done >= r.total:
            r.finished.set()

    def writelines(self, parts: list[bytes]) -> None:
        self.write(b"".join(parts))

    def close(self) -> None:
        pass

    pause_reading = resume_reading = close

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


async def run_round(front: Any, total: int, request: bytes) -> float:
    """CPU seconds per request over one round."""
    loop = asyncio.get_running_loop()
    r = Round(total, request)
    started = time.process_time()
    for _ in range(CONNECTIONS):
        transport = ClientTransport(r, loop)
        transport.conn = conn = front()
        conn.connection_made(transport)
        r.sent += 1
        loop.call_soon(conn.data_received, request)
    await r.finished.wait()
    seconds = time.process_time() - started
    if r.bad:
        raise SystemExit(f"{r.bad} of {total} answers were not 200: the router is not answering as it should")
    return seconds / total


async def traced_round(
    front: Any, total: int, request: bytes, detail: bool
) -> tuple[float, float, list[tuple[str, float]]]:
    """(opcodes, calls, the top functions by opcodes), each per request, over one traced round."""
    counts: dict[tuple[str, str], int] = {}
    calls = 0

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        nonlocal calls
        if event == "call":
            calls += 1
            frame.f_trace_opcodes = True
        elif event == "opcode":
            code = frame.f_code
            key = (code.co_filename, code.co_name)
            counts[key] = counts.get(key, 0) + 1
        return tracer

    sys.settrace(tracer)
    try:
        await run_round(front, total, request)
    finally:
        sys.settrace(None)
    opcodes = sum(counts.values())
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:40] if detail else []
    named = [(f"{path.rsplit('/', 2)[-1]}:{name}", n / total) for (path, name), n in top]
    return opcodes / total, calls / total, named


async def build(variant: str) -> tuple[Any, Callable[[], Awaitable[None]]]:
    """The front of a router app for ``variant``, and how to clean it up."""
    from aiohttp import web

    import llmgw.router.upstream as upstream_module
    from llmgw.router.app import OTHER_ROUTES, PROXY_CHAIN, SESSION, build_app
    from llmgw.router.flags import build_parser, config_from_args
    from llmgw.router.front import Front
    from llmgw.router.proxy import Proxy
    from llmgw.router.stall import StallWatch
    from llmgw.router.upstream_wire import Connection, WireLimits

    # Pooled connections never age out between rounds (nothing reconnects: there is nowhere to).
    upstream_module.KEEPALIVE_SECONDS = 1e9
    argv = [a for url in BACKENDS for a in ("--backend", f"bench={url}")] + ["--log-level", "warning"]
    config = config_from_args(build_parser().parse_args(argv))
    balancing = config.balancing.model_copy(update={"engine_metrics_interval_seconds": 0})
    config = config.model_copy(update={"balancing": balancing})
    app = build_app(config)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    loop = asyncio.get_running_loop()
    client = app[SESSION]
    for url in BACKENDS:
        port = int(url.rsplit(":", 1)[1])
        for _ in range(CONNECTIONS):
            conn = Connection(client, ("http", "127.0.0.1", port), WireLimits())
            conn.connection_made(EngineTransport(conn, loop))
            client.give_back(conn)
    # The stall watch engine polling brings (on by default in the router), without the poller.
    for proxy in (o for o in gc.get_objects() if type(o) is Proxy):
        proxy._stalls = StallWatch(time.monotonic)
    chain = app[PROXY_CHAIN]
    if variant == "bare":
        urls = itertools.cycle([url + "/v1/chat/completions" for url in BACKENDS])

        async def chain(request: Any) -> web.StreamResponse:
            body = await request.read()
            answer = await client.post(next(urls), data=body, headers={"Content-Type": "application/json"})
            if body.find(b'"stream": true') < 0:
                return web.Response(body=await answer.read(), headers={"Content-Type": "application/json"})
            stream = await request.responder.stream({"Content-Type": "text/event-stream"})
            while chunk := await answer.readany():
                await stream.write(chunk)
            await stream.write_eof()
            return stream

    assert runner.server is not None
    front = Front(chain, app[OTHER_ROUTES], config.limits)
    return front, runner.cleanup


@contextlib.contextmanager
def stubbed(variant: str) -> Iterator[None]:
    """For ``app-no-FEATURE``: that feature of the chain made a no-op while the variant runs."""
    feature = variant.removeprefix("app-no-") if variant.startswith("app-no-") else None
    if feature is None:
        yield
        return
    import llmgw.router.balancer as balancer
    import llmgw.router.envelope as envelope
    import llmgw.router.metrics as metrics

    def first_free(self: Any, routes: Any, exclude: Any = (), key: Any = None) -> Any:
        return next((r for r in routes if r.endpoint.id not in exclude), None)

    def balancers() -> list[tuple[Any, str, Any]]:
        # Each balancer holds its mode's affinity function in an instance attribute.
        return [(b, "affinity", lambda *a: None) for b in gc.get_objects() if type(b) is balancer.Balancer]

    # Each feature's stubs, made only for the feature asked for (the balancers' walk of the heap).
    stubs: dict[str, Callable[[], list[tuple[Any, str, Any]]]] = {
        # The request's counters and histogram, and the answer's token usage.
        "metrics": lambda: [
            (metrics.RouterMetrics, "request_done", lambda self, *a: None),
            (metrics.RouterMetrics, "answered", lambda self, *a: None),
        ],
        # The envelope's record (metrics, and the access line's level check).
        "record": lambda: [(envelope, "_record", lambda *a: None)],
        "request-id": lambda: [(envelope, "request_id", lambda supplied, fresh: "0" * 32)],
        # The balancer's choice: the first route not tried.
        "pick": lambda: [(balancer.Balancer, "pick", first_free)],
        "affinity": balancers,
    }
    if feature not in stubs:
        raise SystemExit(f"unknown feature {feature!r}: choose from {sorted(stubs)}")
    chosen = stubs[feature]()
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in chosen]
    for owner, name, stub in chosen:
        setattr(owner, name, stub)
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


async def main(args: argparse.Namespace) -> None:
    variants = [v for v in args.variants.split(",") if v]
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = set(workloads) - set(REQUESTS)
    if unknown:
        raise SystemExit(f"unknown workloads {sorted(unknown)}; choose from {sorted(REQUESTS)}")
    fronts = {}
    cleanups = []
    for variant in variants:
        fronts[variant], cleanup = await build("app" if variant.startswith("app-no-") else variant)
        cleanups.append(cleanup)
    # As the router's main does once it listens (see the module docstring).
    from llmgw.router.main import settle_heap

    settle_heap()
    for workload in workloads:
        request = REQUESTS[workload]
        # A stream is several times a whole answer's work.
        total = args.requests // 4 if workload == "stream" else args.requests
        cpu: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(args.rounds):
            # Interleaved, so the machine's noise lands on every variant alike.
            for variant in variants:
                with stubbed(variant):
                    cpu[variant].append(await run_round(fronts[variant], total, request))
        print(f"router hot path: {total} {workload} requests x {args.rounds} rounds, {CONNECTIONS} clients")
        columns = ("us CPU/req (min)", 17), ("median", 8), ("opcodes/req", 12), ("calls/req", 10)
        print(f"  {'variant':18s} " + " ".join(f"{name:>{width}s}" for name, width in columns))
        details = {}
        for variant in variants:
            values = sorted(cpu[variant])
            timed = f"  {variant:18s} {values[0] * 1e6:17.1f} {values[len(values) // 2] * 1e6:8.1f}"
            if args.untraced:
                print(timed)
                continue
            traced = min(total, 3000 if workload == "non-streamed" else 750)
            with stubbed(variant):
                opcodes, calls, top = await traced_round(fronts[variant], traced, request, args.detail)
            details[variant] = top
            print(f"{timed} {opcodes:12.0f} {calls:10.1f}")
        if "app" in cpu and "bare" in cpu:
            print(f"  app / bare CPU: {min(cpu['app']) / min(cpu['bare']):.2f}x")
        for variant, top in details.items():
            if top:
                print(f"\n  {variant}: the functions that execute the most bytecodes (per request)")
                for name, n in top:
                    print(f"    {n:7.1f}  {name}")
        print()
    for cleanup in cleanups:
        await cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000, help="requests per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per variant, interleaved")
    parser.add_argument(
        "--variants",
        default="app,bare",
        help="comma-separated: app, bare, app-no-FEATURE (metrics, record, request-id, pick, affinity)",
    )
    parser.add_argument(
        "--untraced",
        action="store_true",
        help="skip the traced round (bytecodes and calls): only the timed rounds run",
    )
    parser.add_argument(
        "--workloads",
        default="non-streamed,stream",
        help="comma-separated: non-streamed, stream, sdk-head",
    )
    parser.add_argument(
        "--detail", action="store_true", help="list the functions executing the most bytecodes"
    )
    arguments = parser.parse_args()
    try:
        import uvloop
    except ImportError:  # the router runs on uvloop; so should its measure
        raise SystemExit("uvloop is required (it is in the router's dependencies)") from None
    uvloop.run(main(arguments))
