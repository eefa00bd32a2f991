"""The APIs the router forwards: one table, read by every path the request takes.

Every proxied API is a POST that names its model in the body's ``model``
field (a JSON field, or a form field for audio uploads), so routing,
balancing, keys, quotas, retries before the first byte and metrics are the
same code for all of them; what differs between APIs is data, kept in
:data:`PATHS`:

- ``api``: the API's name in the catalog (a model's ``apis`` list, see
  :mod:`.table`); a request for an API its model does not list is refused
  400 before any engine is asked. Several paths may share one name (the
  two rerank versions, tokenize and detokenize, Messages and its
  ``count_tokens``).
- ``resume``: the kind of stream the router knows how to resume after a
  broken engine (:mod:`.resume`), or None: that API's stream ends with an
  error event when its engine breaks mid-way. Only chat and text
  completions resume (docs/router.md says why the others do not).
- ``ends``: the stream events that end a stream properly. OpenAI's chat and
  completions end with ``data: [DONE]`` (always accepted); the Responses
  API ends with a terminal ``response.*`` event and no ``[DONE]``; the
  Anthropic Messages API with ``message_stop``. A stream that stops
  without one of them is a broken stream.
- ``stored``: the engine stores the answer under an id that names it (the
  Responses API); the router rewrites that id into one that names the
  replica, and routes a later request naming it (``previous_response_id``,
  ``GET /v1/responses/{id}``, ``.../cancel``) to that replica
  (:mod:`.responseids`).
- ``form``: the body is ``multipart/form-data`` (audio), read and forwarded
  as :mod:`.body` says; no token estimate is charged for its bytes.
- ``images``: not forwarded as it came: the request is turned into a
  ComfyUI workflow, submitted to the replica's ComfyUI and answered when
  the job ends (:mod:`.comfyui`). Choosing the replica, retries before
  submission, keys, quotas and waking are the same as for every API.
- ``anthropic``: errors inside a stream take Anthropic's shape
  (``event: error``) rather than OpenAI's, so the ``anthropic`` client
  raises them; and the client's key may come in ``x-api-key``, the header
  that client sends (see :mod:`.auth`).

A path not in the table is not proxied (404). Not here:
:data:`REALTIME_PATH` (a WebSocket, its model in the query: :mod:`.realtime`,
its API name :data:`REALTIME`); the stored Responses routes by id are
:mod:`.app`'s, through :mod:`.responseids`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .resume import Kind


# A class with slots, not a NamedTuple: its fields are read several times per request, and the
# interpreter caches a slot's lookup where it does not a NamedTuple field's.
@dataclass(frozen=True, slots=True)
class ApiPath:
    api: str
    resume: Kind | None = None
    ends: frozenset[str] = frozenset()
    anthropic: bool = False
    # Answers carry stored response ids, routed home (:mod:`.responseids`).
    stored: bool = False
    # The body is multipart/form-data (a file upload), its model a form field (:func:`.body.parse_form`).
    form: bool = False
    # Answered by a ComfyUI workflow (:mod:`.comfyui`), not forwarded.
    images: bool = False


_RESPONSES_END = frozenset({"response.completed", "response.failed", "response.incomplete"})
_MESSAGES_END = frozenset({"message_stop"})

PATHS: dict[str, ApiPath] = {
    "/v1/chat/completions": ApiPath("chat", Kind.CHAT),
    "/v1/completions": ApiPath("completions", Kind.COMPLETION),
    "/v1/embeddings": ApiPath("embeddings"),
    "/v1/responses": ApiPath("responses", ends=_RESPONSES_END, stored=True),
    "/v1/messages": ApiPath("messages", ends=_MESSAGES_END, anthropic=True),
    "/v1/messages/count_tokens": ApiPath("messages", anthropic=True),
    "/v1/audio/transcriptions": ApiPath("audio", form=True),
    "/v1/audio/translations": ApiPath("audio", form=True),
    "/v1/rerank": ApiPath("rerank"),
    "/v2/rerank": ApiPath("rerank"),
    "/v1/score": ApiPath("score"),
    "/pooling": ApiPath("pooling"),
    "/classify": ApiPath("classify"),
    "/tokenize": ApiPath("tokenize"),
    "/detokenize": ApiPath("tokenize"),
    "/v1/images/generations": ApiPath("images", images=True),
}
# Each API's stream-ending event names as bytes, to look for in the events written.
_END_NAMES = {api.ends: tuple(name.encode() for name in api.ends) for api in PATHS.values()}

# The realtime API: a WebSocket, not a POST (:mod:`.realtime`).
REALTIME = "realtime"
REALTIME_PATH = "/v1/realtime"

# Every API name, in the order a message lists them.
API_NAMES: tuple[str, ...] = (*dict.fromkeys(p.api for p in PATHS.values()), REALTIME)


def stream_ended(last: bytes, path: ApiPath) -> bool:
    """Whether ``last`` (the last events written) ends with an event that ends ``path``'s stream."""
    tail = last.rstrip()
    if tail.endswith(b"data: [DONE]") or tail.endswith(b"data:[DONE]"):
        return True
    if not path.ends:
        return False
    event = tail.replace(b"\r\n", b"\n").rsplit(b"\n\n", 1)[-1]
    data: list[bytes] = []
    for line in event.split(b"\n"):
        if line.startswith(b"event:"):
            if line[6:].strip().decode(errors="replace") in path.ends:
                return True
        elif line.startswith(b"data:"):
            data.append(line[5:].removeprefix(b" "))
    try:
        kind = json.loads(b"\n".join(data)).get("type")
    except (ValueError, AttributeError):
        return False
    return kind in path.ends


def may_end(events: bytes, path: ApiPath) -> bool:
    """Whether ``events`` name one of the events that end ``path``'s stream (besides [DONE]):
    a search per write, so that :func:`stream_ended`'s parse runs only when it may be true."""
    return any(events.find(name) >= 0 for name in _END_NAMES[path.ends])  # find: see clientstream


def error_event(path: ApiPath, body: dict) -> bytes:
    """An error as the last event of ``path``'s stream (``body`` is OpenAI's error object)."""
    if path.anthropic:
        error = body["error"]
        kind = "api_error" if error.get("type") == "server_error" else error.get("type")
        payload = {"type": "error", "error": {"type": kind, "message": error.get("message", "")}}
        return b"event: error\ndata: " + json.dumps(payload).encode() + b"\n\n"
    return b"data: " + json.dumps(body).encode() + b"\n\n"
