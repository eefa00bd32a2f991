"""The HTTP/1.1 front: whole answers and streams, the app's other routes, framing, timeouts, flow
control, shutdown. (Bytes in, status out, case by case: test_front_conformance.py.)

Requests go over raw sockets where the bytes matter (framing, pipelining,
several requests on one connection). An answer written by the front carries
no ``Server`` header; aiohttp's always does, which is how a test tells that
every answer on the port is the front's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import aiohttp
import pytest

from llmgw.router.config import Limits
from llmgw.router.frontwire import answer_head as _head

from .engines import FakeEngine
from .helpers import router, wait_for
from .test_app import config
from .test_resume import ScriptedEngine, standalone

CHAT = "/v1/chat/completions"
HI = {"model": "local", "messages": [{"role": "user", "content": "hi"}]}


def post(body: bytes | dict, *, path: str = CHAT, extra: str = "") -> bytes:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}"
    return f"{head}Content-Length: {len(raw)}\r\n\r\n".encode() + raw


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    @property
    def by_front(self) -> bool:
        return "server" not in self.headers


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") != "chunked":
        body = await asyncio.wait_for(reader.read(), 10)  # ended by the connection closing
    else:
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            chunk = await reader.readexactly(size + 2)
            if not size:
                break
            body += chunk[:-2]
    return Answer(status, headers, body)


async def connect(r) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", r.port)


async def test_a_non_streamed_request_is_answered_by_the_front_with_the_usual_headers():
    async with FakeEngine() as engine, router(config(engine.url)) as r:
        reader, writer = await connect(r)
        writer.write(post(HI, extra="x-request-id: abc-1\r\n"))
        answer = await read_answer(reader)
        assert answer.status == 200 and answer.by_front
        assert answer.headers["x-request-id"] == "abc-1"
        assert answer.headers["x-llmgw-replica"] == "static:local:0"
        assert answer.headers["x-llmgw-model"] == "local"
        assert "date" in answer.headers
        assert json.loads(answer.body)["choices"][0]["message"]["content"] == "hello from engine"
        # The engine got the trace and id headers, never the client's framing.
        assert engine.seen[0].headers["x-request-id"] == "abc-1"
        writer.close()


async def test_streams_and_other_paths_are_the_fronts_on_the_same_connection():
    async with FakeEngine() as engine, router(config(engine.url)) as r:
        engine.release.set()  # streams run to the end
        reader, writer = await connect(r)
        writer.write(post(HI))
        first = await read_answer(reader)
        writer.write(post({**HI, "stream": True}, extra="x-request-id: s-1\r\n"))
        streamed = await read_answer(reader)
        writer.write(post(HI))
        after = await read_answer(reader)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        health = await read_answer(reader)
        writer.write(post(HI))
        last = await read_answer(reader)
        assert first.by_front and first.status == 200
        assert streamed.by_front and streamed.status == 200
        assert streamed.headers["content-type"].startswith("text/event-stream")
        assert streamed.headers["x-request-id"] == "s-1"
        assert streamed.headers["cache-control"] == "no-cache"
        assert streamed.body.endswith(b"data: [DONE]\n\n")
        # The connection is kept after a stream.
        assert after.by_front and after.status == 200
        assert health.by_front and json.loads(health.body)["status"] == "ok"
        assert health.headers["x-request-id"]  # the same chain as aiohttp's
        assert last.by_front and last.status == 200
        writer.close()


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "local", "messages": [], "stream": false}',
        b'{"model": "local", "messages": [{"role": "user", "content": "stream"}]}',
        b'{"model": "local", "messages": [], "stream": true}',
        b'{"model": "local", "messages": [], "\\u0073tream": true}',
    ],
)
async def test_whether_an_answer_streams_is_the_json_bodys_to_say(body):
    async with FakeEngine() as engine, router(config(engine.url)) as r:
        engine.release.set()  # streams run to the end
        reader, writer = await connect(r)
        writer.write(post(body))
        answer = await read_answer(reader)
        assert answer.status == 200 and answer.by_front
        assert answer.body.endswith(b"data: [DONE]\n\n") is (b"true" in body)
        writer.close()


async def test_a_stream_with_connection_close_ends_with_the_connection():
    async with FakeEngine() as engine, router(config(engine.url)) as r:
        engine.release.set()
        reader, writer = await connect(r)
        writer.write(post({**HI, "stream": True}, extra="Connection: close\r\n"))
        answer = await read_answer(reader)
        assert answer.headers["connection"] == "close" and answer.body.endswith(b"data: [DONE]\n\n")
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()


async def test_a_handler_failing_after_a_streams_head_closes_the_connection():
    # The client must see a stream cut short (no last chunk), never a second answer inside it.
    async with FakeEngine() as engine, router(config(engine.url)) as r:
        assert r._front is not None

        async def failing(request):
            stream = await request.responder.stream({"Content-Type": "text/event-stream"})
            await stream.write(b"data: one\n\n")
            raise RuntimeError("a bug after the head")

        r._front.handler = failing
        reader, writer = await connect(r)
        writer.write(post({**HI, "stream": True}))
        received = await asyncio.wait_for(reader.read(), 5)  # up to the close
        assert received.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"Transfer-Encoding: chunked\r\n" in received
        assert received.endswith(b"\r\n\r\nb\r\ndata: one\n\n\r\n")  # no 0-length last chunk
        writer.close()


async def test_a_stream_waits_while_the_client_does_not_read_and_stops_when_it_leaves():
    async with FakeEngine() as engine, router(config(engine.url)) as r:
        assert r._front is not None
        wrote: list[str] = []
        waiting = asyncio.Event()

        async def streaming(request):
            stream = await request.responder.stream({"Content-Type": "text/event-stream"})
            conn = request._conn
            conn.pause_writing()  # what the transport says when the client's socket buffer is full
            write = asyncio.ensure_future(stream.write(b"data: one\n\n"))
            await asyncio.sleep(0.05)
            wrote.append("waiting" if not write.done() else "not waiting")
            conn.resume_writing()
            await write
            wrote.append("resumed")
            conn.pause_writing()
            write = asyncio.ensure_future(stream.write(b"data: two\n\n"))
            waiting.set()
            try:
                await asyncio.shield(write)
            except asyncio.CancelledError:
                # The client left: the handler is cancelled, and the waiting write says why.
                with pytest.raises(ConnectionResetError):
                    await write
                wrote.append("client gone")
                raise

        r._front.handler = streaming
        reader, writer = await connect(r)
        writer.write(post({**HI, "stream": True}))
        await asyncio.wait_for(waiting.wait(), 5)
        writer.close()
        await wait_for(lambda: wrote == ["waiting", "resumed", "client gone"])


async def test_pipelined_requests_and_a_body_in_pieces_are_answered_in_order():
    async with FakeEngine() as engine, router(config(engine.url)) as r:
        reader, writer = await connect(r)
        one = post({**HI, "user": "one"})
        two = post({**HI, "user": "two"})
        writer.write(one + two)
        answers = [await read_answer(reader), await read_answer(reader)]
        assert [a.status for a in answers] == [200, 200]
        assert all(a.by_front for a in answers)
        assert [s.body["user"] for s in engine.seen] == ["one", "two"]
        three = post({**HI, "user": "three"})
        for piece in (three[:10], three[10:60], three[60:]):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.05)
        assert (await read_answer(reader)).status == 200
        assert engine.seen[-1].body["user"] == "three"
        writer.close()


@pytest.mark.parametrize(
    ("extra", "status"),
    [
        ("Content-Length: 5\r\n", 400),  # a second, different length
        ("Transfer-Encoding: chunked\r\n", 400),  # both framings
        ("Expect: the-unexpected\r\n", 417),  # only 100-continue is the front's
    ],
)
async def test_ambiguous_framing_and_odd_expectations_are_refused_with_an_openai_error(extra, status):
    async with FakeEngine() as engine, router(config(engine.url)) as r:
        reader, writer = await connect(r)
        writer.write(post(HI, extra=extra))
        answer = await read_answer(reader)
        assert answer.status == status and answer.by_front
        assert json.loads(answer.body)["error"]["type"] == "invalid_request_error"
        assert answer.headers["connection"] == "close"
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert engine.seen == []
        writer.close()


async def test_a_chunked_body_is_read_and_an_oversized_one_refused_by_the_front():
    async with FakeEngine() as engine:
        cfg = config(engine.url)
        cfg = cfg.model_copy(update={"limits": cfg.limits.model_copy(update={"max_body_bytes": 1024})})
        async with router(cfg) as r:
            reader, writer = await connect(r)
            raw = json.dumps(HI).encode()
            head = f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            writer.write(head.encode() + b"%x\r\n%s\r\n0\r\n\r\n" % (len(raw), raw))
            chunked = await read_answer(reader)
            assert chunked.status == 200 and chunked.by_front
            writer.close()
            reader, writer = await connect(r)
            writer.write(post({**HI, "user": "x" * 2000}))
            big = await read_answer(reader)
            assert big.status == 413
            assert json.loads(big.body)["error"]["code"] == "request_too_large"
            writer.close()
            assert len(engine.seen) == 1


async def test_expect_100_continue_is_answered_by_the_front_before_the_body():
    # What curl does before a large body: the head, then a wait for "100 Continue".
    async with FakeEngine() as engine, router(config(engine.url)) as r:
        reader, writer = await connect(r)
        whole = post({**HI, "user": "u" * 2000}, extra="Expect: 100-continue\r\n")
        head, body = whole.split(b"\r\n\r\n", 1)
        writer.write(head + b"\r\n\r\n")
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(body)
        answer = await read_answer(reader)
        assert answer.status == 200 and answer.by_front
        assert engine.seen[0].body["user"] == "u" * 2000
        # A client that sends its body at once gets no interim answer.
        writer.write(whole)
        again = await read_answer(reader)
        assert again.status == 200 and again.by_front
        writer.close()


async def test_connection_close_is_honoured():
    async with FakeEngine() as engine, router(config(engine.url)) as r:
        reader, writer = await connect(r)
        writer.write(post(HI, extra="Connection: close\r\n"))
        answer = await read_answer(reader)
        assert answer.by_front and answer.headers["connection"] == "close"
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()


async def test_a_request_arriving_too_slowly_and_an_idle_connection_are_closed():
    async with FakeEngine() as engine:
        cfg = config(engine.url)
        limits = cfg.limits.model_copy(
            update={"client_read_timeout_seconds": 0.3, "keepalive_timeout_seconds": 0.3}
        )
        cfg = cfg.model_copy(update={"limits": limits})
        async with router(cfg) as r:
            reader, writer = await connect(r)
            writer.write(post(HI)[:30])
            started = time.monotonic()
            late = await asyncio.wait_for(reader.read(), 5)
            assert late.startswith(b"HTTP/1.1 408 ")
            assert 0.3 <= time.monotonic() - started < 3
            writer.close()
            reader, writer = await connect(r)
            writer.write(post(HI))
            assert (await read_answer(reader)).status == 200
            started = time.monotonic()
            assert await asyncio.wait_for(reader.read(), 5) == b""
            assert 0.3 <= time.monotonic() - started < 3
            writer.close()


async def test_client_hanging_up_cancels_a_non_streamed_request_upstream_at_once():
    async with ScriptedEngine("a", delay=30) as a, router(standalone(a)) as r:
        reader, writer = await connect(r)
        writer.write(post({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
        await wait_for(lambda: len(a.bodies) == 1)
        assert r.table.state("static:m:0").in_flight == 1
        hung_up = time.monotonic()
        writer.close()
        await asyncio.wait_for(a.cancelled.wait(), 3)
        assert time.monotonic() - hung_up < 2
        await wait_for(lambda: r.table.state("static:m:0").in_flight == 0)


async def test_shutdown_lets_a_non_streamed_request_in_flight_finish():
    async with FakeEngine(delay=0.5) as engine:
        r = router(config(engine.url).model_copy(update={"shutdown_grace_seconds": 5.0}))
        await r.__aenter__()
        async with aiohttp.ClientSession() as client:
            pending = asyncio.create_task(client.post(r.url + CHAT, json=HI))
            await wait_for(lambda: len(engine.seen) == 1)
            closing = asyncio.create_task(r.__aexit__(None, None, None))
            resp = await asyncio.wait_for(pending, 5)
            assert resp.status == 200
            assert (await resp.json())["choices"][0]["message"]["content"] == "hello from engine"
            await asyncio.wait_for(closing, 5)


def test_an_answer_header_with_a_line_break_is_refused_not_sent():
    with pytest.raises(ValueError):
        _head(200, "OK", {"X-Bad": "a\r\nSet-Cookie: x=1"}, "Content-Length: 0", "now", False)
    with pytest.raises(ValueError):
        _head(200, "OK", {"X-Bad": "a\nb"}, "Content-Length: 0", "now", False)
    assert _head(200, "OK", {"X-Ok": "a"}, "Content-Length: 2", "now", True) == (
        b"HTTP/1.1 200 OK\r\nX-Ok: a\r\nContent-Length: 2\r\nDate: now\r\nConnection: close\r\n\r\n"
    )


def test_the_fronts_own_framing_replaces_any_in_an_answers_headers():
    from multidict import CIMultiDict

    headers = CIMultiDict(
        {"X-Ok": "a", "Content-Length": "99", "Transfer-Encoding": "chunked", "date": "then"}
    )
    assert _head(200, "OK", headers, "Transfer-Encoding: chunked", "now", False) == (
        b"HTTP/1.1 200 OK\r\nX-Ok: a\r\nTransfer-Encoding: chunked\r\nDate: now\r\n\r\n"
    )


async def test_reading_pauses_behind_a_slow_answer_and_resumes_for_the_next_request():
    async with FakeEngine(delay=0.3) as engine, router(config(engine.url)) as r:
        reader, writer = await connect(r)
        big = post({**HI, "user": "y" * 400_000})  # more than the front reads ahead
        writer.write(post(HI) + big)
        first, second = await read_answer(reader), await read_answer(reader)
        assert first.status == second.status == 200
        assert first.by_front and second.by_front
        assert len(engine.seen) == 2 and engine.seen[1].body["user"] == "y" * 400_000
        writer.close()


async def test_an_http_1_0_request_is_answered_and_its_connection_closed():
    async with FakeEngine() as engine, router(config(engine.url)) as r:
        reader, writer = await connect(r)
        raw = json.dumps(HI).encode()
        head = f"POST {CHAT} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n"
        writer.write(head.encode() + raw)
        answer = await read_answer(reader)
        assert answer.status == 200 and answer.by_front
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()


async def test_the_handler_chain_sees_the_requests_content_length():
    # The key check estimates a request's prompt tokens from it (see auth.py).
    async with FakeEngine() as engine, router(config(engine.url)) as r:
        assert r._front is not None
        seen: list[int | None] = []
        chain = r._front.handler

        async def recording(request):
            seen.append(request.content_length)
            return await chain(request)

        r._front.handler = recording
        reader, writer = await connect(r)
        raw = json.dumps({**HI, "user": "z" * 1000}).encode()
        writer.write(post(raw))
        assert (await read_answer(reader)).by_front
        assert seen == [len(raw)]
        writer.close()


async def test_a_client_that_does_not_read_its_answers_is_not_read_from_without_limit():
    async with FakeEngine() as engine, router(config(engine.url)) as r:
        reader, writer = await connect(r)
        writer.write(post(HI))
        await read_answer(reader)
        assert r._front is not None
        conn = next(iter(r._front.connections))
        conn.pause_writing()  # what the transport says when the client's socket buffer is full
        writer.write(post(HI) * 4000)  # about 1 MB of requests, none answered meanwhile
        await writer.drain()
        await wait_for(lambda: conn._paused)
        assert len(conn.queue) < 2000  # what one read or two hold, not all 4000
        conn.resume_writing()
        answers = [await read_answer(reader) for _ in range(4000)]
        assert all(a.status == 200 for a in answers)
        writer.close()


class RecordingTransport(asyncio.Transport):
    """A client connection's transport that keeps what the front writes, one entry per write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True


async def test_a_streams_head_goes_out_with_its_first_chunk_in_one_write():
    from llmgw.router.front import Front

    async def streaming(request):
        stream = await request.responder.stream({"Content-Type": "text/event-stream"})
        await stream.write(b"data: one\n\n")
        await stream.write(b"data: two\n\n")
        await stream.write_eof()
        return stream

    front = Front(streaming, lambda method, path: streaming, Limits())
    conn = front()
    transport = RecordingTransport()
    conn.connection_made(transport)
    conn.data_received(post({**HI, "stream": True}))
    await wait_for(lambda: not conn.busy and len(transport.writes) == 3)
    first, second, last = transport.writes
    assert first.startswith(b"HTTP/1.1 200 OK\r\n") and first.endswith(b"\r\n\r\nb\r\ndata: one\n\n\r\n")
    assert (second, last) == (b"b\r\ndata: two\n\n\r\n", b"0\r\n\r\n")
    assert not transport.closed  # kept for the next request


STREAM_BODY = json.dumps({**HI, "stream": True}).encode()


@pytest.mark.parametrize(
    ("request_bytes", "framing"),
    [
        # A body in chunks: the answer is chunked as usual.
        (
            f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
            + b"%x\r\n%s\r\n0\r\n\r\n" % (len(STREAM_BODY), STREAM_BODY),
            "chunked",
        ),
        # HTTP/1.0 has no chunked coding: the stream's end is the connection's.
        (
            f"POST {CHAT} HTTP/1.0\r\nContent-Length: {len(STREAM_BODY)}\r\n\r\n".encode() + STREAM_BODY,
            "close",
        ),
    ],
    ids=["chunked_request_body", "http_1_0"],
)
async def test_a_stream_is_relayed_whatever_the_requests_framing(request_bytes, framing):
    async with FakeEngine() as engine, router(config(engine.url)) as r:
        engine.release.set()
        reader, writer = await connect(r)
        writer.write(request_bytes)
        answer = await read_answer(reader)  # to its last chunk, or to the close
        assert answer.status == 200 and answer.by_front
        assert answer.headers["cache-control"] == "no-cache"
        if framing == "close":
            assert "transfer-encoding" not in answer.headers and answer.headers["connection"] == "close"
        assert answer.body.startswith(b"data: ") and answer.body.endswith(b"data: [DONE]\n\n")
        writer.close()


def test_what_the_front_keeps_of_client_bytes_stays_bounded():
    # Request targets and Host values are remembered to spare a parse per request; both are the
    # client's bytes, so a client sending a new one each time must not grow them.
    from llmgw.router import frontrules

    for n in range(5 * frontrules.MAX_KEPT):
        assert frontrules.target(b"/v1/x%d?q=%d" % (n, n)) == (f"/v1/x{n}", f"q={n}")
        assert frontrules.head_refusal("1.1", [b"h%d:80" % n], None, None) is None
        assert len(frontrules._TARGETS) <= frontrules.MAX_KEPT
        assert len(frontrules._GOOD_HOSTS) <= frontrules.MAX_KEPT
    long = b"/" + b"a" * frontrules.MAX_KEPT_BYTES
    assert frontrules.target(long) == (long.decode(), "")
    assert long not in frontrules._TARGETS
    # A Host refused is refused every time (only good ones are remembered).
    for _ in range(2):
        refusal = frontrules.head_refusal("1.1", [b"bad host"], None, None)
        assert refusal is not None and refusal.status == 400


@contextlib.asynccontextmanager
async def front_serving(handler):
    """A front on a port of its own whose every path is ``handler``; yields (front, port)."""
    from llmgw.router.front import Front

    front = Front(handler, lambda method, path: handler, Limits())
    port = await front.listen("127.0.0.1", 0, reuse_port=None, backlog=16)
    try:
        yield front, port
    finally:
        front.close()
        await front.drain(1.0)


async def ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One chat request on the connection, answered 200."""
    writer.write(post(HI))
    assert (await read_answer(reader)).status == 200


def whole(body: bytes = b"{}") -> object:
    from llmgw.router.answer import Answer as Whole

    return Whole(200, {"Content-Type": "application/json"}, body)


async def test_one_task_answers_the_requests_of_a_connection_and_ends_with_it():
    tasks: list[asyncio.Task] = []

    async def handler(request):
        await request.read()
        tasks.append(asyncio.current_task())
        return whole()

    async with front_serving(handler) as (front, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(3):
            await ok(reader, writer)
        writer.write(post(HI) * 2)  # pipelined: the second waits for the first
        assert [(await read_answer(reader)).status for _ in range(2)] == [200, 200]
        other_reader, other_writer = await asyncio.open_connection("127.0.0.1", port)
        await ok(other_reader, other_writer)
        first = tasks[0]
        assert tasks[:5] == [first] * 5 and tasks[5] is not first
        # Idle between requests, the task waits for the next one; it ends when the client leaves.
        [conn] = [c for c in front.connections if c.task is first]
        assert not conn.busy and not first.done()
        writer.close()
        await wait_for(lambda: first.done() and conn.task is None)
        assert not first.cancelled()
        other_writer.close()


async def test_a_cancellation_a_handler_swallowed_is_not_left_to_the_next_request():
    seen: list[tuple[asyncio.Task, int]] = []

    async def handler(request):
        await request.read()
        task = asyncio.current_task()
        seen.append((task, task.cancelling()))
        if len(seen) == 1:
            # Cancelled and the cancellation not taken back (no uncancel): a handler that went on.
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(1)
        return whole()

    async with front_serving(handler) as (front, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(2):
            await ok(reader, writer)
        writer.write(post(HI) * 2)
        assert [(await read_answer(reader)).status for _ in range(2)] == [200, 200]
        # The second request began on a task of its own with nothing pending; the task is then kept.
        (first, _), (second, pending), (third, _), (fourth, _) = seen
        assert second is not first and pending == 0 and third is second and fourth is second
        writer.close()


async def test_an_idle_connection_does_not_keep_its_last_request_alive():
    import gc
    import weakref

    class Marker:
        pass

    markers: list[weakref.ref] = []

    async def handler(request):
        await request.read()
        marker = Marker()
        request["marker"] = marker  # reachable only through the request
        markers.append(weakref.ref(marker))
        return whole()

    async with front_serving(handler) as (front, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # The first request reaches the task as it is made; the second through its wait.
        for _ in range(2):
            await ok(reader, writer)
            await wait_for(lambda: [(c.busy, c.task is None) for c in front.connections] == [(False, False)])
            gc.collect()
            # The serving task waits for the next request, holding nothing of the last one.
            assert markers[-1]() is None
        writer.close()


async def test_the_fronts_chain_passes_each_middleware_its_handler_by_position():
    from llmgw.router.routes import chain

    seen: list[str] = []

    # Positional-only: a chain that passed ``handler`` by keyword (a dictionary per call) fails here.
    async def outer(request, handler, /):
        seen.append("outer")
        return await handler(request)

    async def inner(request, handler, /):
        seen.append("inner")
        return await handler(request)

    async def handler(request):
        seen.append(request)
        return "answer"

    assert await chain(handler, [outer, inner])("request") == "answer"
    assert seen == ["outer", "inner", "request"]
