"""What one request carries between the modules that handle it (aiohttp typed request keys).

The middleware in :mod:`.app` sets the request id and empty labels; the
proxy keeps the client's body and fills the labels in as it resolves the
model and tries endpoints (:mod:`.forward`); the client stream
(:mod:`.clientstream`) reads them for its metrics and log lines and leaves
its transcript for :mod:`.auth` to count tokens from. The keys live in a
module of their own so that none of those modules has to import another
only to name them.
"""

from __future__ import annotations

from aiohttp import web

from .resume import Transcript

REQUEST_ID = web.RequestKey("request_id", str)
# The canonical model answering a request, for metrics ("" until known): the
# one asked for, or its canary or fallback (see :mod:`.fallbacks`).
MODEL_LABEL = web.RequestKey("model_label", str)
# The endpoint of the request's last attempt ("" until one is tried).
REPLICA_LABEL = web.RequestKey("replica_label", str)
# The client's body, decoded and as sent: forwarded as sent when it needs no change.
CLIENT_BODY = web.RequestKey("client_body", tuple)
# What a streamed chat or text completion sent the client, for token accounting (:mod:`.auth`).
TRANSCRIPT = web.RequestKey("transcript", Transcript)
# (prompt, completion) tokens from the usage at the end of a stream no transcript follows (the
# Responses and Messages APIs), for token accounting (:mod:`.auth`).
STREAM_USAGE = web.RequestKey("stream_usage", tuple)
# (prompt, completion) tokens from the usage at the end of any stream that carried one
# (chat with stream_options.include_usage too), for usage per owner (:mod:`.auth`).
STREAMED_USAGE = web.RequestKey("streamed_usage", tuple)
