"""llmgw's node agent: one per machine, between the control plane and the engines.

The layout is the vocabulary:

- :mod:`.main`: the ``llmgw-agent`` entry point (flags, config, signals).
- :mod:`.node`: the parts assembled, and the shutdown order.
- :mod:`.connection`: the ``AgentService.Connect`` stream: register,
  redirect, heartbeats, commands, reconnect with backoff.
- :mod:`.supervisor`: the node's replicas: start and stop commands, status.
- :mod:`.lifecycle`: one replica's engine, in its own task: spawn, probes,
  process-group stop.
- :mod:`.adoption`: which engines left by a previous agent are still
  running, after a restart.
- :mod:`.processes`: ports, process groups, engine logs and ``/proc``
  identity (pid + start time), at the OS level.
- :mod:`.statefile`: what is remembered per engine so a restarted agent
  adopts it.
- :mod:`.engines`: the launcher seam: a StartReplica as argv and env
  (simulator, vLLM, SGLang, llama.cpp), one launcher per engine build.
- :mod:`.gpus`: the GPU source seam (NVML, declared) and host resources.
- :mod:`.replicas`: the agent's types for a replica; :mod:`.messages` maps
  them to ``llmgw.v1``.
- :mod:`.probe`: what makes a replica READY (/health and /v1/models).
- :mod:`.weights`: the node's weights cache (hf:// fetches, local paths).
- :mod:`.requests`: operator requests relayed by the control plane (a
  replica's log, fetch and remove weights, an upgrade).
- :mod:`.upgrade`: the hand-over to another agent version (its checks, and
  what the entry point then execs or exits for).
- :mod:`.simulator`: the vLLM-compatible engine for CPU fleets and tests.

Decisions that shape it: engines are separate processes in their own
process groups, so they keep serving through a control-plane outage and
through the agent's own exit when ``stop_engines_on_exit`` is off; the
agent reports snapshots (every heartbeat lists every replica) so a lost
message costs nothing; commands are idempotent because a control plane that
lost its stream resends them; a restarted agent adopts the engines it
finds before its first Register. See docs/agent.md.
"""
