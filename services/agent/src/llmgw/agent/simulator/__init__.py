"""A vLLM-compatible engine simulator: a product feature for CPU machines, demos, CI and load tests.

The agent launches it as a subprocess like any engine (``llmgw-simulator`` or
``python -m llmgw.agent.simulator``, flags in ``main.py``); the router
benchmark and tests run it in-process::

    async with SimulatorServer(SimulatorSettings(ttft_ms=5)) as sim:
        client = AsyncOpenAI(base_url=sim.url + "/v1", api_key="unused")

Decisions, and why:

- **vLLM's layering.** ``app.OpenAIApi`` (HTTP, validation, rendering)
  depends on an ``EngineClient`` protocol injected through its constructor;
  ``engine.SimulatedEngine`` plays vLLM's ``AsyncLLM`` (queue, sequence
  slots, timing, tokens) and knows nothing of HTTP. Request bodies are
  pydantic (``protocol``), tolerant of unknown fields; one function
  (``errors.error_response``) turns every exception into vLLM's error shape.
- **Admission like vLLM's scheduler.** ``--max-num-seqs`` slots; excess
  requests wait in a strict FIFO (``slots.SequenceSlots``) and show as
  ``vllm:num_requests_waiting``. Timing starts at arrival, so queueing shows
  in the time-to-first-token histogram as it does on a loaded vLLM.
- **Timing.** After a slot is granted: ``--ttft-ms`` plus
  ``--prefill-us-per-token`` for each prompt token the prefix cache does not
  hold (prefill), then the first token, then ``--itl-ms`` before each later
  token.
- **Prefix cache** (``prefixcache``): vLLM-like, an LRU of chained hashes of
  ``--block-size`` (16) token blocks, ``--prefix-cache-blocks`` of them;
  counted in ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``.
- **Tokens.** A deterministic stand-in tokenizer (a word or a punctuation
  mark is a token; chat adds 3 per message and 3 for the reply). Output is
  words from a fixed vocabulary, each a token with a leading space, chosen by
  a hash of (``--seed``, the request's ``seed``, the prompt): the same request
  always gets the same text. A reply has ``--output-tokens`` tokens and ends
  with ``stop``, unless ``max_tokens`` / ``max_completion_tokens`` (or the
  room left in ``--max-model-len``) cuts it short with ``length``. ``stop``
  strings are honoured. ``n > 1`` is refused with 400; sampling fields are
  accepted and have no effect.
- **Context window.** prompt + max_tokens over ``--max-model-len`` is a 400
  with vLLM's message.
- **Metrics.** vLLM's names, labelled ``model_name=<primary served name>``,
  on a per-app registry (``metrics``). ``vllm:kv_cache_usage_perc`` is tokens
  held by running sequences over ``max_num_seqs * max_model_len``.
  Embeddings count their prompt tokens and one ``stop`` success per input
  (vLLM also turns each input into its own engine request); they do not take
  a sequence slot and answer at once.
- **Auth.** ``--api-key`` guards ``/v1/*``; ``/health``, ``/version`` and
  ``/metrics`` stay open, as in vLLM, so probes and scrapers need no key.
- **Disconnects and shutdown.** ``handler_cancellation=True``: a client that
  hangs up cancels its handler, and the engine frees the slot and counts an
  ``abort``. SIGTERM closes the listener, gives in-flight requests
  ``--shutdown-timeout`` seconds, cancels the rest, and exits 0.
- **Compatibility flags.** Unknown flags are errors, except
  ``--tensor-parallel-size``, ``--gpu-memory-utilization`` and ``--dtype``,
  accepted and ignored because engine templates commonly pass them.
- **Bodies** over 4 MiB get 413; invalid JSON, wrong types or missing fields
  get 400 naming the field.
"""

from .app import EngineClient, OpenAIApi, build_app, create_app
from .engine import EngineStats, GenerationRequest, GenerationStep, SimulatedEngine
from .server import SimulatorServer
from .settings import SimulatorSettings

__all__ = [
    "EngineClient",
    "EngineStats",
    "GenerationRequest",
    "GenerationStep",
    "OpenAIApi",
    "SimulatedEngine",
    "SimulatorServer",
    "SimulatorSettings",
    "build_app",
    "create_app",
]
