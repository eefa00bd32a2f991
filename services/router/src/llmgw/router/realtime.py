"""The realtime API (``GET /v1/realtime``, a WebSocket) through the router: one session, relayed.

A client opens a WebSocket naming its model in the query
(``/v1/realtime?model=<name>``, what the ``openai`` package's
``client.realtime.connect(model=...)`` sends); the router checks it as it
checks any request, then opens a WebSocket to one replica of that model and
relays messages both ways until either side closes. (A client that names
the model only in its ``session.update``, as vLLM's own clients do, is
greeted by the router first: :meth:`Realtime._by_session`.) In order:

1. **Before any engine is asked** (a JSON error, no upgrade): the key (the
   :mod:`.auth` middleware, on every ``/v1/`` path), a GET with
   ``Upgrade: websocket`` (else 400 ``not_a_websocket``), the query's
   model known (404) and serving the
   ``realtime`` API in the catalog (400 naming what it serves), the key's
   models and request rate (404 / 429: a session is one request).
2. **The engine's socket**, opened before the client's: replicas chosen by
   the balancer, each at most once, within ``limits.retries``; an engine
   that refuses or does not complete its handshake within
   ``limits.connect_timeout_seconds`` counts against its breaker and the
   next is tried. When none opens, the client gets a 502 (or 503 when the
   model has no replica) and no upgrade. The engine gets its own key
   (``Authorization``), the request id, and the model under the name it
   serves.
3. **The session**: messages relayed whole, text as text and binary as
   binary, in order each way; a client ``session.update`` naming the
   model by the router's name is rewritten to the engine's (vLLM checks it).
   Bounds: a client's message over ``limits.realtime_max_message_bytes``
   closes the session (1009, the WebSocket code for it; an engine's, 1011
   naming the setting); no message either
   way for ``limits.realtime_idle_timeout_seconds``, or a session older
   than ``limits.realtime_session_timeout_seconds``, closes it with 1008
   and a reason naming the limit; the client's socket is flow-controlled
   (:mod:`.frontsocket`).
4. **Closing**: a close from either side is passed to the other with its
   code and reason; an engine that goes away without a close (or breaks
   the protocol) closes the client's side with 1011 and a reason naming
   the replica; router shutdown closes it with 1001. A session broken
   mid-way is not resumed elsewhere: the engine holds its audio buffer and
   conversation, which another replica does not have.

A session counts once in ``llmgw_router_requests_total`` (status 101 when it
opened) when it ends, its duration in the request duration histogram; it is
in the replica's requests in flight while open. Tokens: any engine message
with a ``usage`` object (vLLM's ``transcription.done``, OpenAI's
``response.done``) is counted in the token counters and charged to the key.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.frames import CloseCode

from llmgw.common.errors import LlmgwError

from .apis import REALTIME
from .breaker import Breaker
from .config import Limits
from .errors import (
    ApiNotServed,
    BadRequest,
    KeysNotLoaded,
    ModelNotFound,
    NoReadyReplica,
    RateLimited,
    UpstreamFailed,
)
from .forward import KeySource
from .metrics import RouterMetrics
from .requestkeys import MODEL_LABEL, REPLICA_LABEL, REQUEST_ID, STREAM_USAGE
from .seam import NOT_A_WEBSOCKET, ClientSocket, RequestView, Responder, SocketClosed
from .table import Model, Route

log = logging.getLogger(__name__)

# How a session ends when the client's connection is gone: nothing to send it, 1001 to the engine.
_CLIENT_GONE = (int(CloseCode.ABNORMAL_CLOSURE), "the client went away", None, int(CloseCode.GOING_AWAY))
# How long the router waits for the other side's close frame once it closed.
CLOSE_WAIT_SECONDS = 2.0


class SocketRequest(RequestView, Protocol):
    @property
    def responder(self) -> Responder: ...


class Routes(Protocol):
    def resolve(self, name: str) -> Model | None: ...
    def routes(self, model: str) -> Sequence[Route]: ...


class Picker(Protocol):
    def pick(self, routes: Sequence[Route], exclude: set[str], key: int | None = None) -> Route | None: ...


class Gate(Protocol):
    def admit(self, request: Any, requested: str, model: Model) -> None: ...


class Demand(Protocol):
    def used(self, model: str) -> None: ...


class Realtime:
    """``GET /v1/realtime``: see the module docstring."""

    def __init__(
        self,
        table: Routes,
        balancer: Picker,
        breaker: Breaker,
        limits: Limits,
        metrics: RouterMetrics,
        keys: KeySource,
        *,
        gate: Gate | None = None,
        demand: Demand | None = None,
    ) -> None:
        self._table = table
        self._balancer = balancer
        self._breaker = breaker
        self._limits = limits
        self._metrics = metrics
        self._keys = keys
        self._gate = gate
        self._demand = demand

    async def __call__(self, request: SocketRequest) -> Any:
        if request.method != "GET" or request.headers.get("Upgrade", "").lower() != "websocket":
            raise BadRequest(NOT_A_WEBSOCKET)
        query = dict(parse_qsl(request.query_string))
        requested = query.get("model", "")
        if not requested:
            return await self._by_session(request, query)
        model = self._admit(request, requested)
        route, engine = await self._open(request, model, query)
        headers = {
            "x-request-id": request[REQUEST_ID],
            "x-llmgw-replica": route.endpoint.id,
            "x-llmgw-model": model.name,
        }
        try:
            client = await request.responder.websocket(headers, self._limits.realtime_max_message_bytes)
        except BaseException:
            await engine.close(CloseCode.GOING_AWAY, "the client's upgrade failed")
            raise
        await self._run(
            request, _Session(client, engine, route, model, requested, self._limits, self._metrics)
        )
        return client

    def _admit(self, request: SocketRequest, requested: str) -> Model:
        """The model, once the catalog and the key allow this session (raises to refuse)."""
        model = self._table.resolve(requested)
        if model is None:
            raise ModelNotFound(requested)
        request[MODEL_LABEL] = model.name
        if model.apis and REALTIME not in model.apis:
            raise ApiNotServed(model.name, REALTIME, model.apis)
        if self._gate is not None:
            self._gate.admit(request, requested, model)
        if self._demand is not None:
            self._demand.used(model.name)
        return model

    async def _run(self, request: SocketRequest, session: _Session) -> None:
        state = session.route.state
        state.in_flight += 1
        try:
            await session.run()
        finally:
            state.in_flight -= 1
            if session.tokens != (0, 0):
                request[STREAM_USAGE] = session.tokens

    async def _by_session(self, request: SocketRequest, query: dict[str, str]) -> ClientSocket:
        """A session whose model is named only in its ``session.update`` (vLLM's protocol).

        vLLM's clients wait for ``session.created`` before they name the
        model, so the router greets the client itself, holds what it sends
        (within one message's size limit and the idle timeout) until a
        ``session.update`` names the model, then checks and opens the
        engine's session as for a model in the query, drops the engine's
        own greeting and sends it what the client sent. A refusal is then an
        ``error`` event (vLLM's shape) and a close: 1008 for the client's
        fault, 1013 (try again later) for a limit or no replica, 1011 when
        no engine opened a session.
        """
        limits = self._limits
        client = await request.responder.websocket(
            {"x-request-id": request[REQUEST_ID]}, limits.realtime_max_message_bytes
        )
        greeting = {"type": "session.created", "id": f"sess-{uuid.uuid4().hex}", "created": int(time.time())}
        held: list[str | bytes] = []
        size = 0
        try:
            await client.send(json.dumps(greeting))
            requested = None
            async with asyncio.timeout(limits.realtime_idle_timeout_seconds):
                while requested is None:
                    message = await client.receive()
                    held.append(message)
                    size += len(message)
                    requested = _session_model(message)
                    if requested is None and size > limits.realtime_max_message_bytes:
                        raise BadRequest("Name the model (a session.update) before sending audio.", "model")
            model = self._admit(request, requested)
            route, engine = await self._open(request, model, {**query, "model": requested})
        except (SocketClosed, ConnectionResetError):
            return client  # the client went away first
        except TimeoutError:
            await _refuse(
                client, int(CloseCode.POLICY_VIOLATION), "No session.update named the model in time."
            )
            return client
        except LlmgwError as err:
            await _refuse(client, _close_code(err), str(err))
            return client
        session = _Session(client, engine, route, model, requested, limits, self._metrics, held=held)
        await self._run(request, session)
        return client

    async def _open(
        self, request: SocketRequest, model: Model, query: dict[str, str]
    ) -> tuple[Route, ClientConnection]:
        """The engine's socket, from the first replica that opens one (see the module docstring)."""
        routes = self._table.routes(model.name)
        if not routes:
            raise NoReadyReplica(model.name, self._limits.retry_after_seconds)
        loop = asyncio.get_running_loop()
        tried: set[str] = set()
        failures: list[str] = []
        for _ in range(self._limits.retries + 1):
            route = self._balancer.pick(routes, tried)
            if route is None:
                break
            endpoint = route.endpoint
            tried.add(endpoint.id)
            request[REPLICA_LABEL] = endpoint.id
            self._breaker.admit(route.state, loop.time())
            upstream_query = urlencode({**query, "model": endpoint.upstream_model})
            url = endpoint.url.replace("http", "ws", 1) + f"/v1/realtime?{upstream_query}"
            headers = {"x-request-id": request[REQUEST_ID]}
            if endpoint.api_key_file:
                headers["Authorization"] = f"Bearer {self._keys.key(endpoint.api_key_file)}"
            elif endpoint.api_key:
                headers["Authorization"] = f"Bearer {endpoint.api_key}"
            try:
                engine = await connect(
                    url,
                    additional_headers=headers,
                    user_agent_header=None,
                    compression=None,
                    open_timeout=self._limits.connect_timeout_seconds,
                    close_timeout=CLOSE_WAIT_SECONDS,
                    max_size=self._limits.realtime_max_message_bytes,
                    # The engine's queue is the engine's: the router relays as it reads.
                    max_queue=4,
                )
            except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as err:
                self._breaker.failure(route.state, loop.time())
                reason = f"{endpoint.id}: {type(err).__name__}: {err}"[:300]
                log.warning("request %s: realtime: %s", request[REQUEST_ID], reason)
                failures.append(reason)
                continue
            self._breaker.success(route.state)
            return route, engine
        raise UpstreamFailed(
            f"No replica of model {model.name!r} opened a realtime session "
            f"({len(failures)} tried: {'; '.join(failures)}); retry shortly."
        )


class _Session:
    """One open session: the relay both ways, its deadlines, and how it closes."""

    def __init__(
        self,
        client: ClientSocket,
        engine: ClientConnection,
        route: Route,
        model: Model,
        requested: str,
        limits: Limits,
        metrics: RouterMetrics,
        *,
        held: Sequence[str | bytes] = (),
    ) -> None:
        self._client = client
        self._engine = engine
        self.route = self._route = route
        # What the client sent before the engine's session opened (it greeted the client then).
        self._held = held
        self._model = model
        self._requested = requested
        self._limits = limits
        self._metrics = metrics
        self._idle: asyncio.Timeout | None = None
        self.tokens = (0, 0)

    async def run(self) -> None:
        limits = self._limits
        policy = int(CloseCode.POLICY_VIOLATION)
        idle = limits.realtime_idle_timeout_seconds
        try:
            async with asyncio.timeout(limits.realtime_session_timeout_seconds):
                async with asyncio.timeout(idle) as self._idle:
                    code, reason, to_client, to_engine = await self._relay()
        except TimeoutError:
            if self._idle is not None and self._idle.expired():
                reason = f"no message either way for {idle:g} s (limits.realtime_idle_timeout_seconds)"
            else:
                most = limits.realtime_session_timeout_seconds
                reason = (
                    f"the session reached its limit of {most:g} s (limits.realtime_session_timeout_seconds)"
                )
            code = to_client = to_engine = policy
        except asyncio.CancelledError:
            # The router is shutting down (a lost client ends the session without a cancel).
            code, reason = int(CloseCode.GOING_AWAY), "the router is shutting down"
            await self._finish(reason, code, code)
            raise
        await self._finish(reason, to_client, to_engine)

    async def _relay(self) -> tuple[int, str, int | None, int | None]:
        """Relay both ways until one side ends: (code, reason, close the client with, the engine with)."""
        if self._held:
            try:
                first = await self._engine.recv()
                if _event_type(first) != "session.created":
                    await self._client.send(first)  # not a greeting: the client gets it
                for message in self._held:
                    await self._engine.send(
                        self._engine_model(message) if isinstance(message, str) else message
                    )
            except ConnectionClosed as err:
                return self._engine_gone(err)
            except ConnectionResetError:
                return _CLIENT_GONE
        up = asyncio.ensure_future(self._client_to_engine())
        down = asyncio.ensure_future(self._engine_to_client())
        try:
            done, _ = await asyncio.wait((up, down), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (up, down):
                task.cancel()
            await asyncio.gather(up, down, return_exceptions=True)
        return done.pop().result()

    def _heard(self) -> None:
        if self._idle is not None:
            self._idle.reschedule(
                asyncio.get_running_loop().time() + self._limits.realtime_idle_timeout_seconds
            )

    async def _finish(self, reason: str, to_client: int | None, to_engine: int | None) -> None:
        if to_engine is not None:
            await _quietly(self._engine.close(to_engine, reason))
        else:
            await _quietly(self._engine.close())
        if to_client is not None:
            await _quietly(self._client.close(to_client, reason))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_WAIT_SECONDS):
                await _quietly(self._client.closed())

    async def _client_to_engine(self) -> tuple[int, str, int | None, int | None]:
        while True:
            try:
                message = await self._client.receive()
            except SocketClosed as closed:
                # The client closed (its code goes to the engine), or the router refused a message.
                to_client = None if closed.by_peer else closed.code
                return closed.code, closed.reason, to_client, _sendable(closed.code)
            self._heard()
            if isinstance(message, str) and "session.update" in message:
                message = self._engine_model(message)
            try:
                await self._engine.send(message)
            except ConnectionClosed as err:
                return self._engine_gone(err)

    async def _engine_to_client(self) -> tuple[int, str, int | None, int | None]:
        while True:
            try:
                message = await self._engine.recv()
            except ConnectionClosed as err:
                return self._engine_gone(err)
            self._heard()
            data = message.encode() if isinstance(message, str) else message
            if data.find(b'"usage"') >= 0:  # find: a bytes ``in`` costs twice (see :mod:`.fields`)
                counted = self._metrics.answered(self._model.name, data)
                if counted is not None:
                    self.tokens = (self.tokens[0] + counted[0], self.tokens[1] + counted[1])
            try:
                await self._client.send(message)
            except ConnectionResetError:
                return _CLIENT_GONE

    def _engine_gone(self, err: ConnectionClosed) -> tuple[int, str, int | None, int | None]:
        endpoint = self._route.endpoint.id
        rcvd = err.rcvd
        if rcvd is not None and _sendable(rcvd.code) is not None:
            # The engine closed: its code and reason go to the client as they are.
            return rcvd.code, rcvd.reason, rcvd.code, None
        sent = err.sent
        if sent is not None and sent.code == CloseCode.MESSAGE_TOO_BIG:
            reason = f"replica {endpoint} sent a message over limits.realtime_max_message_bytes"
        else:
            reason = f"replica {endpoint} went away without closing the session"
        log.warning("realtime session on %s ended: %s", endpoint, reason)
        return int(CloseCode.INTERNAL_ERROR), reason, int(CloseCode.INTERNAL_ERROR), None

    def _engine_model(self, message: str) -> str:
        """A ``session.update`` naming the model as the client knows it, in the engine's name."""
        served = self._route.endpoint.upstream_model
        try:
            event = json.loads(message)
        except ValueError:
            return message
        if not isinstance(event, dict) or event.get("type") != "session.update":
            return message
        changed = False
        if event.get("model") == self._requested:
            event["model"], changed = served, True
        session = event.get("session")
        if isinstance(session, dict) and session.get("model") == self._requested:
            session["model"], changed = served, True
        return json.dumps(event) if changed else message


def _event_type(message: str | bytes) -> str | None:
    try:
        event = json.loads(message)
    except ValueError:
        return None
    kind = event.get("type") if isinstance(event, dict) else None
    return kind if isinstance(kind, str) else None


def _session_model(message: str | bytes) -> str | None:
    """The model a ``session.update`` names (``model``, or ``session.model`` as OpenAI's clients put it)."""
    if not isinstance(message, str) or "session.update" not in message:
        return None
    try:
        event = json.loads(message)
    except ValueError:
        return None
    if not isinstance(event, dict) or event.get("type") != "session.update":
        return None
    session = event.get("session")
    model = event.get("model") or (session.get("model") if isinstance(session, dict) else None)
    return model if isinstance(model, str) and model else None


def _close_code(err: LlmgwError) -> int:
    """The close code that says why a session was refused after its socket opened."""
    if isinstance(err, RateLimited | NoReadyReplica | KeysNotLoaded):
        return int(CloseCode.TRY_AGAIN_LATER)
    if isinstance(err, UpstreamFailed):
        return int(CloseCode.INTERNAL_ERROR)
    return int(CloseCode.POLICY_VIOLATION)


async def _refuse(client: ClientSocket, code: int, message: str) -> None:
    """An ``error`` event saying why (vLLM's shape), then the close."""
    error = {"type": "error", "error": message, "code": "session_refused"}
    with contextlib.suppress(ConnectionResetError):
        await client.send(json.dumps(error))
    await client.close(code, message)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(CLOSE_WAIT_SECONDS):
            await _quietly(client.closed())


def _sendable(code: int) -> int | None:
    """``code`` if it may be sent in a close frame (not 1005, 1006 or 1015, which say none came)."""
    return None if code in (1005, 1006, 1015) or not 1000 <= code < 5000 else code


async def _quietly(closing: Any) -> None:
    try:
        await closing
    except (OSError, ConnectionError, ConnectionClosed):
        pass
