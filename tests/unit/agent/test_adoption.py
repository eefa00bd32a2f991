"""Adoption: a restarted agent on the same state dir takes over the engines it finds.

The first agent shuts down without stopping its engines (what a kill -9
leaves behind, as far as the engines are concerned: they run in their own
sessions), and a second agent on the same state directory must report them
in its Register as the same replicas, keep supervising them and stop them
when told, without starting anything again.

One difference from a real restart is bridged by hand: here the engines are
children of the test process (the first agent ran in it), which never
reaps them, so a stopped engine would stay a zombie and its group alive. In
production the dead agent's engines are reparented to init, which reaps
them; :func:`reap_like_init` does that job here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import threading

import pytest

from llmgw.agent import statefile
from llmgw.agent.processes import group_members, process_start_ticks, same_process
from llmgw.v1 import agent_pb2 as pb

from .conftest import ENGINE_KEY, start_fields

READY = pb.REPLICA_STATE_READY
STARTING = pb.REPLICA_STATE_STARTING
FAILED = pb.REPLICA_STATE_FAILED
STOPPED = pb.REPLICA_STATE_STOPPED


async def run_then_leave(control, start_agent, state_dir, replica_id="r1", **start_extra):
    """An agent that starts ``replica_id``, waits for READY, then exits leaving it running."""
    agent = start_agent([control.address], stop_engines_on_exit=False, state_dir=str(state_dir))
    await control.wait_register()
    await control.wait_for("a live stream", lambda: control.connected)
    control.start_replica(**start_fields(replica_id, **start_extra))
    ready = await control.wait_state(replica_id, READY)
    await agent.shutdown()
    await control.wait_for("the stream to end", lambda: not control.connected)
    reap_like_init(ready.pid)
    return ready


def reap_like_init(pid: int) -> None:
    def wait() -> None:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)

    threading.Thread(target=wait, name=f"reap-{pid}", daemon=True).start()


async def test_restarted_agent_registers_running_engine_as_the_same_ready_replica(
    control, start_agent, tmp_path
):
    state = tmp_path / "shared-state"
    ready = await run_then_leave(control, start_agent, state, gpu_indices=[1])
    record = json.loads((state / "replicas" / "r1" / statefile.FILENAME).read_text())
    assert ENGINE_KEY not in json.dumps(record), "the state file must not hold the engine key"
    assert record["key_fingerprint"] == statefile.key_fingerprint(ENGINE_KEY)

    start_agent([control.address], state_dir=str(state))
    reg = await control.wait_register(count=2)
    [r] = reg.replicas
    assert (r.replica_id, r.state, r.pid, r.url) == ("r1", READY, ready.pid, ready.url)
    assert (r.model, r.served_name, r.engine, list(r.gpu_indices)) == ("llama", "llama-8b", "simulator", [1])

    # A StartReplica for it (a new leader re-sending) changes nothing and brings the key.
    await control.wait_for("a live stream", lambda: control.connected)
    before = len(control.statuses("r1"))
    control.start_replica(**start_fields("r1", gpu_indices=[1]))
    await control.wait_for("an answer to the repeated start", lambda: control.statuses("r1")[before:])
    assert [(s.state, s.pid) for s in control.statuses("r1")[before:]] == [(READY, ready.pid)]


async def test_adopted_engine_is_stopped_as_a_whole_group_when_the_control_plane_says_so(
    control, start_agent, tmp_path
):
    state = tmp_path / "shared-state"
    ready = await run_then_leave(control, start_agent, state, engine_args={"spawn-child": ""})
    assert len(group_members(ready.pid)) == 2, "engine and its child share the group"

    agent = start_agent([control.address], state_dir=str(state))
    await control.wait_register(count=2)
    await control.wait_for("a live stream", lambda: control.connected)
    control.stop_replica("r1", grace_seconds=1)
    await control.wait_state("r1", STOPPED)
    assert group_members(ready.pid) == [], "no process of the adopted engine's group may remain"
    assert not (agent.state_dir / "replicas" / "r1" / statefile.FILENAME).exists()


async def test_adopted_engine_that_exits_later_is_reported_failed(control, start_agent, tmp_path):
    state = tmp_path / "shared-state"
    ready = await run_then_leave(control, start_agent, state)
    start_agent([control.address], state_dir=str(state))
    await control.wait_register(count=2)
    await control.wait_for("a live stream", lambda: control.connected)
    os.kill(ready.pid, signal.SIGKILL)  # not the new agent's child: it must notice through /proc
    failed = await control.wait_state("r1", FAILED)
    assert "exit status is unknown" in failed.message and "while serving" in failed.message


async def test_dead_engine_is_not_adopted_and_its_dir_is_removed(control, start_agent, tmp_path):
    state = tmp_path / "shared-state"
    ready = await run_then_leave(control, start_agent, state)
    os.killpg(ready.pid, signal.SIGKILL)
    await asyncio.sleep(0.2)
    start_agent([control.address], state_dir=str(state))
    reg = await control.wait_register(count=2)
    assert list(reg.replicas) == []
    assert not (state / "replicas" / "r1").exists()


async def test_a_reused_pid_is_not_adopted_and_not_signalled(control, start_agent, tmp_path):
    state = tmp_path / "shared-state"
    await run_then_leave(control, start_agent, state)
    d = state / "replicas" / "r1"
    engine = statefile.read(d)
    assert engine is not None
    os.killpg(engine.pid, signal.SIGKILL)
    # Someone else's process now holds the pid the record names (stand-in:
    # a live process of ours, with a start time that cannot match).
    other = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import time; time.sleep(60)", start_new_session=True
    )
    try:
        statefile.write(d, statefile.EngineRecord(**{**engine.__dict__, "pid": other.pid}))
        assert not same_process(other.pid, engine.start_ticks)
        start_agent([control.address], state_dir=str(state))
        reg = await control.wait_register(count=2)
        assert list(reg.replicas) == []
        assert other.returncode is None, "a process that is not the engine must be left alone"
        assert not d.exists()
    finally:
        other.kill()
        await other.wait()


@pytest.mark.parametrize("content", ["", "{not json", '{"version": 99}'])
def test_state_file_that_does_not_parse_reads_as_absent(tmp_path, content):
    d = tmp_path / "r1"
    d.mkdir()
    (d / statefile.FILENAME).write_text(content)
    assert statefile.read(d) is None


def test_process_start_ticks_identifies_this_process():
    ticks = process_start_ticks(os.getpid())
    assert ticks is not None and same_process(os.getpid(), ticks)
    assert not same_process(os.getpid(), ticks + 1)
    assert process_start_ticks(2**22 + 1) is None
