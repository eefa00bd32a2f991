"""Fake engines for router tests: real aiohttp servers on port 0.

This is the declared seam: the router talks HTTP to an "engine", and a fake
engine is a real HTTP server whose answers the test scripts. It records
every request (path, headers, JSON body) and can hold a stream open until
the test releases it, so tests can observe what the router does between
chunks and what happens when a client hangs up.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from multidict import CIMultiDict


@dataclass
class Seen:
    path: str
    headers: CIMultiDict[str]
    body: dict[str, Any]


@dataclass
class FakeEngine:
    name: str = "engine"
    # "json": one JSON answer; "stream": SSE, chunk 1, then waits for `release`.
    mode: str = "json"
    # When set, answer every request with this status and an OpenAI error body.
    fail_status: int = 0
    # Seconds to wait before answering at all (no headers meanwhile).
    delay: float = 0.0
    seen: list[Seen] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    # Set when a stream handler is cancelled (its client, the router, went away).
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    # Set when a stream has sent its first chunk.
    first_chunk_sent: asyncio.Event = field(default_factory=asyncio.Event)
    port: int = 0
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> FakeEngine:
        app = web.Application()
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
            app.router.add_post(path, self._handle)
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        assert self._runner is not None
        await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append(Seen(request.path, CIMultiDict(request.headers), body))
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail_status:
            error = {"error": {"message": f"{self.name} is failing", "type": "server_error"}}
            return web.json_response(error, status=self.fail_status)
        if self.mode == "stream" or body.get("stream"):
            return await self._stream(request, body)
        return web.json_response(
            {
                "id": "cmpl-1",
                "object": "chat.completion",
                "model": body["model"],
                "engine": self.name,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": f"hello from {self.name}"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
            }
        )

    async def _stream(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            await response.write(_chunk(body["model"], "one"))
            self.first_chunk_sent.set()
            await self.release.wait()
            await response.write(_chunk(body["model"], "two"))
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
                event = json.dumps({"choices": [], "usage": usage}).encode()
                await response.write(b"data: " + event + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        await response.write_eof()
        return response


def _chunk(model: str, text: str) -> bytes:
    event = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": model,
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }
    return b"data: " + json.dumps(event).encode() + b"\n\n"
