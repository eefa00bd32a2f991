"""The client's side of one streamed response, across the attempts that feed it.

A streamed answer may be fed by several attempts (a whole retry before the
first event, a resume after a break: :mod:`.proxy`), but the client sees one
response. :class:`ClientStream` is that response, and
:meth:`ClientStream.relay` copies one attempt's event stream into it.

**Relay**: an engine's ``text/event-stream`` answer is copied as it
arrives, cut only at the last whole event in hand (the rest waits for the
next read), so a break never leaves half an event with the client; an event
longer than :data:`MAX_EVENT_BYTES` is no token stream, and the relay gives
it up. On the hot path the forwarded bytes are only kept
(:meth:`.resume.Transcript.record`), and parsed for a resume or in 64 KiB
batches; a resumed attempt's events are parsed and rewritten
(:class:`.resume.Rewriter`) so that they read as the rest of the first.

**Headers go out with the first events**, so until then an attempt may
still fail into a whole retry or a JSON error. Once they are out, an error
can only be an SSE ``data: {"error": ...}`` event that ends the stream
(:meth:`ClientStream.fail`), which OpenAI clients raise.

**The seam**: the relay says how the engine's stream ended (its API's last
event, :func:`.apis.stream_ended`: ``[DONE]`` for chat), the
client gone, or a :class:`StreamBreak` saying why and whether the engine is
to blame) and decides nothing further: the breaker, retries and resumes are
the proxy's. This module knows SSE and the client; the proxy knows
endpoints and budgets.

**Metrics**: the first write's gap from the stream's creation (the
request's arrival, give or take its routing) is time to first token, each
later gap inter-token time; the tokens answered are read from the usage in
the last events when the stream ends.

One request's attempts run one after another, so a stream is never used
concurrently.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from . import sse
from .apis import ApiPath, error_event, may_end, stream_ended
from .errors import error_body
from .metrics import ModelSeries, RouterMetrics
from .requestkeys import MODEL_LABEL, REQUEST_ID, STREAM_USAGE, STREAMED_USAGE, TRANSCRIPT
from .resume import Kind, Rewriter, Transcript
from .seam import ProxyRequest, StreamReply
from .table import Route

log = logging.getLogger(__name__)

# An SSE event longer than this is no token stream; the router gives it up.
MAX_EVENT_BYTES = 1024 * 1024


class EventSource(Protocol):
    """An engine's answer body as it arrives (:class:`.upstream.UpstreamResponse`)."""

    async def readany(self, deadline: float | None = None) -> bytes: ...


class Relayed(enum.Enum):
    """How a relay ended when the engine's stream did not break."""

    # The engine sent [DONE]: the caller records the success, then ends the client's stream.
    DONE = "done"
    # The client went away between chunks; nothing is left to tell it.
    HUNG_UP = "hung up"


@dataclass(frozen=True)
class StreamBreak:
    """An engine's stream that stopped short of ``[DONE]``."""

    # What the engine did, as the end of a sentence naming it ("went silent").
    reason: str
    # False when the engine is not to blame (the request's own deadline passed).
    counts: bool
    # A silence: before the first event, a first-byte timeout rather than a retry.
    timeout: bool = False


class ClientStream:
    """The client's side of one streamed response, across the attempts that feed it.

    The response is prepared (headers sent) with the first events written, so
    until then an attempt may still fail into a whole retry or a JSON error.
    """

    def __init__(
        self,
        request: ProxyRequest,
        kind: Kind | None,
        data: dict[str, Any],
        metrics: RouterMetrics,
        clock: Callable[[], float],
        api: ApiPath,
    ) -> None:
        self._request = request
        self._api = api
        self.transcript = Transcript.for_request(kind, data) if kind is not None else None
        if self.transcript is not None:
            request[TRANSCRIPT] = self.transcript
        self.response: StreamReply | None = None
        # Whether the response is prepared (events went out): a plain attribute, read per attempt.
        self.started = False
        self._last = b""
        # The write before the last: a final usage chunk may precede a [DONE] written apart.
        self._prev = b""
        self._metrics = metrics
        self._series: ModelSeries | None = None
        # The event loop's clock, passed in: asyncio.get_running_loop() costs a system call.
        self._clock = clock
        self._last_at = self._clock()
        # The record of the attempt in flight while the stall watch watches it (:class:`.stall.Attempt`).
        self.watched: Route | None = None
        self.watched_since = 0.0
        self.watched_task: asyncio.Task[Any] | None = None
        self.cut = False

    @property
    def last_sent_at(self) -> float:
        """When events last went to the client (when the stream was made, before any)."""
        return self._last_at

    @property
    def done(self) -> bool:
        """Whether the event that ends this API's stream (``[DONE]`` for chat) has gone out."""
        return stream_ended(self._last, self._api)

    async def relay(
        self,
        reader: EventSource,
        headers: dict[str, str],
        *,
        first_event_by: float,
        idle: float,
        deadline: float,
        ids: Callable[[bytes], bytes] | None = None,
    ) -> Relayed | StreamBreak:
        """Copy one attempt's event stream to the client until it ends or breaks.

        ``headers`` go out with the first events if no attempt has sent any;
        the first event is awaited until ``first_event_by``, each next one
        for ``idle`` seconds, and none past ``deadline`` (all loop time);
        ``ids`` rewrites the events' response ids (:mod:`.responseids`).
        """
        transcript = self.transcript
        rewrite = Rewriter(transcript) if self.started and transcript is not None else None
        wait_until = first_event_by
        tail = b""
        while True:
            try:
                chunk = await reader.readany(min(wait_until, deadline))
            except TimeoutError:
                silent = "sent no event" if wait_until == first_event_by else "went silent"
                return StreamBreak(silent, self._clock() < deadline, timeout=True)
            except aiohttp.ClientError as err:
                return StreamBreak(f"broke off ({type(err).__name__}: {err})", True)
            if not chunk:
                # An unterminated event at the end is dropped, as SSE says, unless it is [DONE].
                events = tail.rstrip() + b"\n\n" if sse.ends_with_done(tail) else b""
            else:
                if tail:
                    chunk = tail + chunk
                if chunk.endswith(b"\n\n"):
                    # The usual read: whole events.
                    events, tail = chunk, b""
                else:
                    cut = sse.complete_prefix(chunk)
                    events, tail = chunk[:cut], chunk[cut:]
                    if len(tail) > MAX_EVENT_BYTES:
                        return StreamBreak(f"sent an event over {MAX_EVENT_BYTES} bytes", False)
                if events:
                    wait_until = self._clock() + idle
            if events and ids is not None:
                events = ids(events)
            if events and rewrite is not None:
                events = rewrite(events)
            elif events and transcript is not None:
                transcript.record(events)
            if events:
                try:
                    if self.response is None:
                        await self._open(headers)
                    await self.response.write(events)  # type: ignore[union-attr]
                    self._sent(events)
                except ConnectionResetError:
                    log.info("request %s: client hung up mid-stream", self._request[REQUEST_ID])
                    return Relayed.HUNG_UP
                # find, not ``in``: a bytes ``in`` first tries its operand as an integer, and formats
                # the TypeError it raises (see :mod:`.fields`), on every write of a stream.
                ended = events.find(b"[DONE]") >= 0 or (self._api.ends and may_end(events, self._api))
                if ended and self.done:
                    # The stream's last event is out: the client's answer is whole now, whenever
                    # the engine's end of body comes (the caller waits for it). The openai client
                    # closes its connection on [DONE]; it is not a client that left.
                    return Relayed.DONE
            if not chunk:
                break
        if self.done:
            return Relayed.DONE
        return StreamBreak("ended its stream without its last event", True)

    async def _open(self, headers: dict[str, str]) -> None:
        """Start the client's response: its head goes out with the first events."""
        # Tell a buffering reverse proxy in front (nginx) to pass chunks on.
        headers = {**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        self.response = await self._request.responder.stream(headers)
        self.started = True
        self._series = self._metrics.series(self._request[MODEL_LABEL])

    def _sent(self, events: bytes) -> None:
        """Account for events written: the first write's gap (from the request's arrival) is time
        to first token, each later one inter-token time."""
        now = self._clock()
        assert self._series is not None
        (self._series.inter_token if self._last else self._series.ttft).observe(now - self._last_at)
        self._last_at = now
        self._prev, self._last = self._last, events

    async def end(self, tail: bytes = b"") -> StreamReply:
        assert self.response is not None
        counts = self._metrics.answered(self._request[MODEL_LABEL], self._prev + self._last + tail)
        if counts is not None:
            self._request[STREAMED_USAGE] = counts
        if counts is not None and self.transcript is None:
            self._request[STREAM_USAGE] = counts
        try:
            if tail:
                await self.response.write(tail)
            await self.response.write_eof()
        except ConnectionResetError:
            log.info("request %s: client hung up at the end of the stream", self._request[REQUEST_ID])
        return self.response

    async def fail(self, message: str) -> StreamReply:
        event = error_body(message, "server_error", None, "upstream_error")
        return await self.end(error_event(self._api, event))
