"""A ComfyUI-compatible server simulator, shipped with the agent like the vLLM simulator.

The agent launches it as the ``comfyui`` engine on machines without a real
ComfyUI (``python -m llmgw.agent.comfysim``, the same flags ComfyUI takes
for what both understand), and tests run it in-process. It speaks the part
of ComfyUI's HTTP API that llmgw's router uses:

- ``POST /prompt`` ``{"prompt": <API-format workflow>, "client_id": ...}``:
  validated (every node has a ``class_type``; a ``CheckpointLoaderSimple``
  names a checkpoint found in the checkpoint folders), queued, answered
  ``{"prompt_id", "number", "node_errors"}``; an invalid one is a 400 in
  ComfyUI's shape (``error`` with ``type``/``message``, ``node_errors``).
- ``GET /history/<id>`` (``{}`` until the job ends) and ``GET /history``:
  the submitted workflow (``prompt[2]``), the outputs, and ``status``
  (``success`` or ``error`` with the event messages), as ComfyUI keeps them.
  Tests read the workflow a router submitted from here.
- ``GET /view?filename=&subfolder=&type=output``: a PNG made for the job
  (written with the ``png`` library, sized by ``EmptyLatentImage``, one per
  ``batch_size``, its colour a hash of the prompt and seed).
- ``POST /interrupt`` (optionally ``{"prompt_id"}``): the running job stops
  and ends ``error`` with ``execution_interrupted``; ``POST /queue``
  ``{"delete": [...]}`` drops queued jobs.
- ``GET /object_info``, ``GET /system_stats`` (the agent's readiness probe;
  it also lists the checkpoints and custom-node folders it was given under
  ``llmgw``), ``GET /queue``.
- ``GET /ws?clientId=``: ComfyUI's websocket events (``status``,
  ``execution_start``, ``executing``, ``progress``, ``executed``,
  ``execution_success``, ``execution_error``, ``execution_interrupted``).

One job runs at a time, in submission order, as in ComfyUI; each takes
``--job-seconds`` split over ``--steps`` progress steps. A job whose
workflow text contains ``--fail-marker`` (when set) fails with an
``execution_error``, so the error path is testable end to end.

Auth: ComfyUI has none. When ``LLMGW_ENGINE_KEY`` is set in its
environment (the agent sets it for every replica), the simulator requires it
as ``Authorization: Bearer`` on every path but ``/system_stats`` (the
health check, open like vLLM's ``/health``), so tests prove the router sends
it; real ComfyUI ignores it (docs/images.md says what that means).
"""

from .app import ComfySettings, build_app

__all__ = ["ComfySettings", "build_app"]
