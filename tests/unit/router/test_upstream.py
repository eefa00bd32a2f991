"""The upstream client against a real socket that answers exactly the bytes each test scripts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest

from llmgw.router.upstream import Upstream, WireLimits


class RawServer:
    """An HTTP/1.1 peer on port 0 whose answers are raw bytes; counts connections and requests."""

    def __init__(self, answer: Callable[[int], list[bytes]], *, close_after: bool = False) -> None:
        self._answer = answer
        self._close_after = close_after
        self.connections = 0
        self.requests = 0
        self.hangups = 0  # connections the client closed
        self.port = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for writer in self.writers:
            writer.close()
        self._server.close()
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/chat/completions"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                self.requests += 1
                for piece in self._answer(self.requests):
                    writer.write(piece)
                    await writer.drain()
                    # Separate reads on the other side, so parsing must resume mid-frame.
                    await asyncio.sleep(0.001)
                if self._close_after:
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            self.hangups += 1
            writer.close()


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    client = Upstream(connect_timeout=2)
    yield client
    await client.close()


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def split_every(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


async def test_a_chunked_stream_split_anywhere_arrives_whole_and_unframed(upstream):
    events = [b'data: {"n": %d}\n\n' % i for i in range(20)]
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    wire = head + chunked(*events)
    # Three bytes at a time: every chunk line, CRLF and head boundary falls mid-read.
    async with RawServer(lambda _: split_every(wire, 3)) as server:
        response = await upstream.post(server.url, data=b"{}", headers={})
        assert response.status == 200
        assert response.content_type == "text/event-stream"
        assert await response.read() == b"".join(events)
        assert response.at_eof()


async def test_a_stream_read_in_whole_chunks_arrives_whole_and_unframed(upstream):
    # Reads that end on chunk boundaries (the common case, and the fast path), with payloads a
    # naive split would misread: CRLFs, something that looks like a size line, an empty-looking end.
    events = [b"data: a\r\n\r\n", b"data: 5\r\nhello\r\n\n\n", b"data: b\n\n", b"\r\n0\r\n\r\n"]
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    frames = [b"%x\r\n%s\r\n" % (len(e), e) for e in events]
    endings = [
        [frames[3] + b"1;ext=1\r\nx\r\n", b"0\r\n\r\n"],  # the last chunk alone
        [frames[3] + b"1\r\nx\r\n0\r\n\r\n"],  # the last chunk after whole chunks
        [frames[3], b"1\r\nx\r\n0\r\nX-Trailer: 1\r\n\r\n"],  # with trailers
    ]
    # The first answer's head comes alone: a read that is only a head carries no body bytes.
    starts = [[head, frames[0]], [head + frames[0]], [head + frames[0]]]
    pieces = [[*start, frames[1] + frames[2], *ending] for start, ending in zip(starts, endings, strict=True)]
    async with RawServer(lambda n: pieces[n - 1]) as server:
        for _ in endings:  # and the connection is clean for the next answer
            response = await upstream.post(server.url, data=b"{}", headers={})
            assert await response.read() == b"".join(events) + b"x"
        assert server.connections == 1


@pytest.mark.parametrize("size", [b"-3", b"0x3", b"+3", b"0_3"])
async def test_a_chunk_size_that_is_not_hex_digits_is_an_unreadable_answer(upstream, size):
    wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%s\r\nabc\r\n0\r\n\r\n" % size
    async with RawServer(lambda _: [wire]) as server:
        response = await upstream.post(server.url, data=b"{}", headers={})
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()


async def test_trailers_after_the_last_chunk_are_read_and_dropped(upstream):
    wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n"
    async with RawServer(lambda _: [wire]) as server:
        first = await upstream.post(server.url, data=b"{}", headers={})
        assert await first.read() == b"hello"
        # The trailer was consumed: the connection is clean for the next answer.
        second = await upstream.post(server.url, data=b"{}", headers={})
        assert await second.read() == b"hello"
        assert server.connections == 1


async def test_a_keep_alive_connection_is_reused_for_the_next_request(upstream):
    wire = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    async with RawServer(lambda _: [wire]) as server:
        for _ in range(3):
            response = await upstream.post(server.url, data=b"{}", headers={"X-Test": "1"})
            assert (response.status, await response.read()) == (200, b"{}")
        assert (server.connections, server.requests) == (1, 3)


async def test_an_answer_ended_by_close_is_whole_and_its_connection_not_reused(upstream):
    wire = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"ok": true}'
    async with RawServer(lambda _: [wire], close_after=True) as server:
        for _ in range(2):
            response = await upstream.post(server.url, data=b"{}", headers={})
            assert await response.read() == b'{"ok": true}'
        assert server.connections == 2


async def test_an_idle_connection_the_engine_dropped_is_replaced_without_an_error(upstream):
    wire = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    async with RawServer(lambda _: [wire]) as server:
        assert await (await upstream.post(server.url, data=b"{}", headers={})).read() == b"ok"
        # The engine closes its idle keep-alive connection, as uvicorn does after 5 s.
        for writer in server.writers:
            writer.close()
        await asyncio.sleep(0.05)
        assert await (await upstream.post(server.url, data=b"{}", headers={})).read() == b"ok"
        assert server.connections == 2


async def test_an_engine_closing_mid_body_is_a_payload_error(upstream):
    wire = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part"
    async with RawServer(lambda _: [wire], close_after=True) as server:
        response = await upstream.post(server.url, data=b"{}", headers={})
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()


async def test_an_engine_closing_before_answering_is_server_disconnected(upstream):
    async with RawServer(lambda _: [], close_after=True) as server:
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await upstream.post(server.url, data=b"{}", headers={})


async def test_no_answer_by_the_deadline_is_a_timeout_and_the_connection_is_dropped(upstream):
    async with RawServer(lambda _: []) as server:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            await upstream.post(server.url, data=b"{}", headers={}, deadline=loop.time() + 0.2)
        # The engine sees its client go.
        for _ in range(250):
            if server.hangups:
                break
            await asyncio.sleep(0.02)
        assert server.hangups == 1


async def test_a_refused_connect_is_a_client_connection_error(upstream):
    async with RawServer(lambda _: []) as server:
        url = server.url
    with pytest.raises(aiohttp.ClientConnectionError):
        await upstream.post(url, data=b"{}", headers={})


async def test_a_body_read_past_its_deadline_times_out(upstream):
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"
    async with RawServer(lambda _: [head]) as server:
        response = await upstream.post(server.url, data=b"{}", headers={})
        loop = asyncio.get_running_loop()
        assert await response.readany(loop.time() + 5) == b"abc"
        with pytest.raises(TimeoutError):
            await response.readany(loop.time() + 0.1)
        response.close()


async def test_an_unreadable_status_line_is_a_client_error(upstream):
    async with RawServer(lambda _: [b"SPEAK FRIEND\r\n\r\n"]) as server:
        with pytest.raises(aiohttp.ClientError):
            await upstream.post(server.url, data=b"{}", headers={})


async def test_a_204_has_no_body_and_its_connection_is_reused(upstream):
    wire = b"HTTP/1.1 204 No Content\r\n\r\n"
    async with RawServer(lambda _: [wire]) as server:
        for _ in range(2):
            response = await upstream.post(server.url, data=b"{}", headers={})
            assert (response.status, await response.read()) == (204, b"")
        assert server.connections == 1


async def test_a_stray_last_chunk_after_an_answer_closes_the_idle_connection_given_back_once():
    # Issue 22: the connection went back to the pool twice, and two requests then shared it.
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
    gave_back: list[object] = []

    class Counting(Upstream):
        def give_back(self, conn):
            gave_back.append(conn)
            super().give_back(conn)

    client = Counting(connect_timeout=2)
    async with RawServer(lambda n: [answer, b"0\r\n\r\n"] if n == 1 else [answer]) as server:
        first = await client.post(server.url, data=b"{}", headers={})
        assert await first.read() == b"ok"
        await asyncio.sleep(0.05)  # the stray has arrived on the idle connection
        assert len(gave_back) == 1 and gave_back[0].closed
        second = await client.post(server.url, data=b"{}", headers={})
        assert await second.read() == b"ok"
        assert server.connections == 2  # the second went on a fresh connection
    await client.close()


async def test_bytes_after_the_end_in_the_same_read_keep_the_connection_out_of_the_pool(upstream):
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    async with RawServer(lambda _: [answer + answer]) as server:
        for _ in range(2):
            assert await (await upstream.post(server.url, data=b"{}", headers={})).read() == b"ok"
        assert server.connections == 2


async def test_an_answer_framed_both_ways_fails_and_its_connection_is_not_reused(upstream):
    wire = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
    async with RawServer(lambda _: [wire]) as server:
        for _ in range(2):
            with pytest.raises(aiohttp.ClientError):
                await (await upstream.post(server.url, data=b"{}", headers={})).read()
        assert server.connections == 2


async def test_a_whole_answer_over_the_cap_fails_and_a_stream_is_not_capped():
    client = Upstream(connect_timeout=2, limits=WireLimits(max_answer_bytes=1024))
    big = b"HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\n" + b"x" * 2000
    chunked_big = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n7d0\r\n" + b"x" * 2000 + b"\r\n0\r\n\r\n"
    )
    stream = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 2000\r\n\r\n" + b"x" * 2000
    )
    answers = {1: [big], 2: [chunked_big], 3: [stream]}
    async with RawServer(lambda n: answers[n]) as server:
        with pytest.raises(aiohttp.ClientError, match="over 1024"):
            await (await client.post(server.url, data=b"{}", headers={})).read()
        with pytest.raises(aiohttp.ClientError, match="over 1024"):
            await (await client.post(server.url, data=b"{}", headers={})).read()
        assert len(await (await client.post(server.url, data=b"{}", headers={})).read()) == 2000
    await client.close()


async def test_the_clients_queries_neither_grow_the_target_cache_nor_reach_the_engine_unencoded():
    seen: list[bytes] = []

    class Recording(RawServer):
        async def _serve(self, reader, writer):
            seen.append(await reader.readuntil(b"\r\n"))
            await super()._serve(reader, writer)

    client = Upstream(connect_timeout=2)
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    async with Recording(lambda _: [answer], close_after=True) as server:
        for i in range(50):
            await (await client.post(server.url, query=f"q={i}&x=\u20ac\x01 ", data=b"{}", headers={})).read()
        assert len(client._targets) == 1
        assert seen[0] == b"POST /v1/chat/completions?q=0&x=%E2%82%AC%01%20 HTTP/1.1\r\n"
    await client.close()


async def test_a_connection_paused_by_an_unread_answer_is_reading_again_when_it_goes_back(upstream):
    # The read that fills the response past its high-water mark pauses the connection; when that
    # read also ends the answer, the connection goes back to the pool and must read the next one.
    body = b"x" * 300_000
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(body)
    async with RawServer(lambda _: [head + body[:200_000], body[200_000:]]) as server:
        loop = asyncio.get_running_loop()
        for _ in range(2):
            response = await upstream.post(server.url, data=b"{}", headers={}, deadline=loop.time() + 2)
            await asyncio.sleep(0.2)  # nothing read meanwhile: the whole answer arrives and is held
            assert await response.read() == body
        assert server.connections == 1
