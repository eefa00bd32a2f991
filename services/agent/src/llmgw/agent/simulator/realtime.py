"""The simulator's realtime API: ``GET /v1/realtime``, a WebSocket speaking vLLM's protocol.

vLLM 0.32 serves ``/v1/realtime`` for realtime speech-recognition models
(``vllm/entrypoints/speech_to_text/realtime``): JSON text messages, each
with a ``type``. This is that protocol, deterministic so tests can assert
on it:

- on connect the server sends ``session.created`` (``id``, ``created``);
- ``session.update`` names the model (``model``, or ``session.model`` as
  OpenAI's clients put it); an unknown or missing one is an ``error``
  event, and the session stays unvalidated;
- ``input_audio_buffer.append`` carries base64 PCM16 in ``audio``, buffered;
- ``input_audio_buffer.commit`` (after a valid ``session.update``, as vLLM
  requires) transcribes the buffer: one ``transcription.delta`` per word
  of a fixed sentence naming the buffered byte count, then
  ``transcription.done`` with the text and a ``usage``; ``final: true``
  only ends the audio;
- anything else is an ``error`` event (``invalid_json``,
  ``unknown_event``, ``invalid_audio``, ``model_not_validated``), as vLLM
  answers, and the session goes on.

A message over the simulator's body limit closes the socket with 1009.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
import uuid
from typing import Any, Protocol

from aiohttp import WSMsgType, web

from llmgw.common.errors import LlmgwError

# PCM16 at 16 kHz: bytes per second of audio, and about one prompt token per 40 ms (as Whisper's).
_BYTES_PER_TOKEN = 32_000 // 25


class Models(Protocol):
    def check_model(self, requested: str | None) -> str: ...


class RealtimeApi:
    def __init__(self, models: Models, max_message_bytes: int) -> None:
        self._models = models
        self._max = max_message_bytes

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/realtime", self.session)

    async def session(self, request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse(max_msg_size=self._max)
        await socket.prepare(request)
        await _send(socket, "session.created", id=f"sess-{uuid.uuid4().hex}", created=int(time.time()))
        state = _State()
        async for message in socket:
            if message.type is WSMsgType.TEXT:
                await self._event(socket, state, message.data)
            elif message.type is WSMsgType.BINARY:
                await _error(socket, "send JSON text messages, not binary ones", "invalid_json")
        return socket

    async def _event(self, socket: web.WebSocketResponse, state: _State, text: str) -> None:
        try:
            event = json.loads(text)
        except ValueError:
            await _error(socket, "Invalid JSON", "invalid_json")
            return
        kind = event.get("type") if isinstance(event, dict) else None
        if kind == "session.update":
            session = event.get("session")
            model = event.get("model") or (session.get("model") if isinstance(session, dict) else None)
            if not model:
                await _error(socket, "Missing required field: model", "invalid_event")
                return
            try:
                self._models.check_model(model)
            except LlmgwError:
                await _error(socket, f"The model `{model}` does not exist.", "model_not_found")
                return
            state.validated = True
        elif kind == "input_audio_buffer.append":
            try:
                audio = base64.b64decode(event.get("audio") or "", validate=True)
            except (binascii.Error, TypeError, ValueError):
                audio = b""
            if not audio:
                await _error(socket, "Invalid audio data", "invalid_audio")
                return
            state.audio += len(audio)
        elif kind == "input_audio_buffer.commit":
            if not state.validated:
                await _error(
                    socket,
                    "Model not validated. Make sure to validate the model by sending a session.update event.",
                    "model_not_validated",
                )
                return
            if event.get("final"):
                return
            await self._transcribe(socket, state)
        else:
            await _error(socket, f"Unknown event type: {kind}", "unknown_event")

    async def _transcribe(self, socket: web.WebSocketResponse, state: _State) -> None:
        text = transcription(state.audio)
        words = text.split(" ")
        for i, word in enumerate(words):
            await _send(socket, "transcription.delta", delta=word if i == 0 else " " + word)
        prompt = max(1, state.audio // _BYTES_PER_TOKEN)
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": len(words),
            "total_tokens": prompt + len(words),
        }
        await _send(socket, "transcription.done", text=text, usage=usage)
        state.audio = 0


def transcription(audio_bytes: int) -> str:
    """What the simulator hears in ``audio_bytes`` bytes of audio."""
    return f"The simulated transcription of {audio_bytes} bytes of audio."


class _State:
    def __init__(self) -> None:
        self.validated = False
        self.audio = 0


async def _send(socket: web.WebSocketResponse, kind: str, **fields: Any) -> None:
    await socket.send_str(json.dumps({"type": kind, **fields}))


async def _error(socket: web.WebSocketResponse, message: str, code: str) -> None:
    await _send(socket, "error", error=message, code=code)
