"""Replica lifecycle through the agent: real engine processes, real probes."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from pathlib import Path

import aiohttp
import pytest

from llmgw.agent.config import EngineSettings
from llmgw.agent.engines import LaunchPlan, SimulatorLauncher
from llmgw.agent.replicas import ReplicaSpec
from llmgw.v1 import agent_pb2 as pb

from .conftest import ENGINE_KEY, FAKE_ENGINE_COMMAND, start_fields

STARTING = pb.REPLICA_STATE_STARTING
READY = pb.REPLICA_STATE_READY
FAILED = pb.REPLICA_STATE_FAILED
STOPPING = pb.REPLICA_STATE_STOPPING
STOPPED = pb.REPLICA_STATE_STOPPED


@pytest.fixture
async def live(control, start_agent):
    """An agent registered with ``control`` and a live stream."""
    agent = start_agent([control.address])
    await control.wait_register()
    await control.wait_for("a live stream", lambda: control.connected)
    return agent


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


async def get_json(url: str, key: str | None = ENGINE_KEY) -> tuple[int, object]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


async def test_start_reports_starting_then_ready_with_url_pid_gpus_and_engine_key(control, live):
    control.start_replica(**start_fields("r1", gpu_indices=[2, 0], engine_args={"size": "xl"}))
    ready = await control.wait_state("r1", READY)
    states = [s.state for s in control.statuses("r1")]
    assert states[0] == STARTING and states[-1] == READY
    starting = control.statuses("r1")[0]
    assert starting.url == ready.url and starting.pid == ready.pid > 0
    port = int(ready.url.rsplit(":", 1)[1])
    assert ready.url == f"http://127.0.0.1:{port}"
    assert (ready.model, ready.served_name, ready.engine) == ("llama", "llama-8b", "simulator")
    assert list(ready.gpu_indices) == [2, 0]

    status, debug = await get_json(f"{ready.url}/debug")
    assert status == 200
    assert debug["pid"] == ready.pid
    assert debug["cuda"] == "2,0"
    # Node defaults overlaid by the profile's args, in that order.
    assert debug["extra"] == ["--color", "blue", "--size", "xl"]
    status, _ = await get_json(f"{ready.url}/v1/models", key=None)
    assert status == 401, "the engine must require the replica's key"
    status, _ = await get_json(f"{ready.url}/v1/models", key="llmgw-e-wrong")
    assert status == 401


async def test_engine_exiting_at_start_fails_with_reason_and_log_tail(control, live):
    control.start_replica(**start_fields("r1", engine_args={"fail-at-start": ""}))
    failed = await control.wait_state("r1", FAILED)
    assert "exited with code 3 before it became ready" in failed.message
    assert "cannot load weights for the model" in failed.message
    assert ENGINE_KEY not in failed.message, "the engine key must not leak into the log"
    assert READY not in [s.state for s in control.statuses("r1")]

    # FAILED stays listed, so every heartbeat repeats it until a stop.
    def failed_in_heartbeat():
        return [
            hb
            for hb in control.heartbeats()
            if [(r.replica_id, r.state) for r in hb.replicas] == [("r1", FAILED)]
        ]

    await control.wait_for("a heartbeat listing r1 FAILED", failed_in_heartbeat)
    assert not (live.state_dir / "replicas" / "r1" / "pid").exists()


# Long enough for the fake engine to start and answer a probe on a busy machine
# (its interpreter alone took over 1.5 s under load), or the failure message
# would name a refused connection instead of the answer these tests check.
NEVER_READY_TIMEOUT = 6.0


async def test_engine_never_healthy_fails_after_start_timeout_and_is_killed(control, start_agent):
    agent = start_agent(
        [control.address],
        engines={
            "simulator": {
                "command": FAKE_ENGINE_COMMAND,
                "start_timeout_seconds": NEVER_READY_TIMEOUT,
            }
        },
    )
    await control.wait_register()
    await control.wait_for("a live stream", lambda: control.connected)
    control.start_replica(**start_fields("r1", engine_args={"never-ready": ""}))
    starting = await control.wait_state("r1", STARTING)
    failed = await control.wait_state("r1", FAILED)
    assert f"did not become ready within {NEVER_READY_TIMEOUT:g}s" in failed.message
    assert "GET /health answered 503" in failed.message
    assert group_gone(starting.pid)
    assert agent.state_dir.exists()


async def test_engine_whose_models_list_lacks_the_served_name_stays_starting_then_fails(control, start_agent):
    start_agent(
        [control.address],
        engines={"simulator": {"command": FAKE_ENGINE_COMMAND, "start_timeout_seconds": NEVER_READY_TIMEOUT}},
    )
    await control.wait_register()
    await control.wait_for("a live stream", lambda: control.connected)
    control.start_replica(**start_fields("r1", engine_args={"other-name": ""}))
    failed = await control.wait_state("r1", FAILED)
    assert READY not in [s.state for s in control.statuses("r1")], "/health alone must not make it READY"
    assert "/v1/models lists ['some-other-model'], not 'llama-8b'" in failed.message


async def test_engine_exiting_after_ready_fails_with_exit_code_and_log_tail(control, live):
    control.start_replica(**start_fields("r1", engine_args={"exit-after": "0.3"}))
    await control.wait_state("r1", READY)
    failed = await control.wait_state("r1", FAILED)
    assert "exited with code 7 while serving" in failed.message
    assert "exiting on purpose with code 7" in failed.message


async def test_stop_reports_stopping_then_stopped_and_leaves_no_process_in_the_group(control, live):
    control.start_replica(**start_fields("r1", engine_args={"spawn-child": ""}))
    ready = await control.wait_state("r1", READY)
    _, debug = await get_json(f"{ready.url}/debug")
    assert debug["child"] > 0 and os.getpgid(debug["child"]) == ready.pid

    control.stop_replica("r1")
    await control.wait_state("r1", STOPPING)
    await control.wait_state("r1", STOPPED)
    assert group_gone(ready.pid), "the engine's whole process group must be gone"
    assert not (live.state_dir / "replicas" / "r1" / "pid").exists()
    # A STOPPED replica is reported once and then dropped from heartbeats.
    seen = len(control.heartbeats())
    await control.wait_for("a later heartbeat", lambda: len(control.heartbeats()) > seen)
    assert list(control.heartbeats()[-1].replicas) == []


async def test_stop_sends_sigkill_when_the_engine_ignores_sigterm_past_grace(control, live):
    control.start_replica(**start_fields("r1", engine_args={"ignore-sigterm": ""}))
    ready = await control.wait_state("r1", READY)
    loop = asyncio.get_running_loop()
    began = loop.time()
    control.stop_replica("r1", grace_seconds=0.4)
    await control.wait_state("r1", STOPPED)
    assert loop.time() - began >= 0.4, "SIGKILL must wait for the grace period"
    assert group_gone(ready.pid)


async def test_stop_of_an_unknown_replica_reports_stopped(control, live):
    control.stop_replica("never-started")
    stopped = await control.wait_state("never-started", STOPPED)
    assert stopped.message == "not on this node"


async def test_stop_of_a_failed_replica_reports_stopped_and_forgets_it(control, live):
    control.start_replica(**start_fields("r1", engine_args={"fail-at-start": ""}))
    await control.wait_state("r1", FAILED)
    control.stop_replica("r1")
    await control.wait_state("r1", STOPPED)
    seen = len(control.heartbeats())
    await control.wait_for("a later heartbeat", lambda: len(control.heartbeats()) > seen)
    assert list(control.heartbeats()[-1].replicas) == []


async def test_duplicate_start_is_a_no_op_that_reports_the_current_status(control, live):
    control.start_replica(**start_fields("r1"))
    ready = await control.wait_state("r1", READY)
    control.start_replica(**start_fields("r1"))
    await control.wait_for(
        "a second READY report", lambda: [s for s in control.statuses("r1") if s.state == READY][1:]
    )
    statuses = control.statuses("r1")
    assert [s.state for s in statuses].count(STARTING) == 1
    assert {s.pid for s in statuses} == {ready.pid}
    assert len(list((live.state_dir / "replicas").iterdir())) == 1


async def test_start_of_a_failed_replica_starts_it_afresh(control, live):
    control.start_replica(**start_fields("r1", engine_args={"fail-at-start": ""}))
    failed = await control.wait_state("r1", FAILED)
    control.start_replica(**start_fields("r1"))
    ready = await control.wait_state("r1", READY)
    assert ready.pid != failed.pid


async def test_start_naming_an_engine_or_gpu_this_node_lacks_fails_with_what_to_fix(control, live):
    control.start_replica(**start_fields("r1", engine="vllm"))
    control.start_replica(**start_fields("r2", gpu_indices=[0, 7]))
    control.start_replica(**start_fields("r3", engine_args={"port": "80"}))
    assert (
        "engine 'vllm' is not configured on this node (it runs: simulator)"
        in (await control.wait_state("r1", FAILED)).message
    )
    assert (
        "gpu indices [7] are not on this node, which has 3 GPU(s)"
        in (await control.wait_state("r2", FAILED)).message
    )
    assert "set by the agent" in (await control.wait_state("r3", FAILED)).message


class PortThief:
    """A launcher (the seam) that lets another listener take the first port it is given."""

    kind = "simulator"

    def __init__(self, inner: SimulatorLauncher):
        self._inner = inner
        self.stolen: list[int] = []
        self.sockets: list = []

    @property
    def version(self) -> str:
        return self._inner.version

    @property
    def start_timeout_seconds(self) -> float:
        return self._inner.start_timeout_seconds

    def plan(self, spec: ReplicaSpec, host: str, port: int) -> LaunchPlan:
        if not self.stolen:
            s = socket.socket()
            s.bind((host, port))
            s.listen()
            self.sockets.append(s)
            self.stolen.append(port)
        return self._inner.plan(spec, host, port)


async def test_engine_losing_its_port_to_another_process_is_started_again_on_a_fresh_port(
    control, start_agent
):
    thief = PortThief(SimulatorLauncher(EngineSettings(command=FAKE_ENGINE_COMMAND), "9.9.9-test"))
    start_agent([control.address], launchers={"simulator": thief})
    await control.wait_register()
    await control.wait_for("a live stream", lambda: control.connected)
    try:
        control.start_replica(**start_fields("r1"))
        ready = await control.wait_state("r1", READY)
        assert thief.stolen and not ready.url.endswith(f":{thief.stolen[0]}")
        assert [s.state for s in control.statuses("r1")].count(STARTING) == 2
        assert FAILED not in [s.state for s in control.statuses("r1")]
    finally:
        for s in thief.sockets:
            s.close()


async def test_agent_shutdown_stops_its_engines_first(control, start_agent):
    agent = start_agent([control.address])
    await control.wait_register()
    await control.wait_for("a live stream", lambda: control.connected)
    control.start_replica(**start_fields("r1"))
    ready = await control.wait_state("r1", READY)
    await agent.shutdown()
    # STOPPED reached the control plane before the stream closed.
    assert [s.state for s in control.statuses("r1")][-2:] == [STOPPING, STOPPED]
    assert group_gone(ready.pid)


async def test_agent_shutdown_without_stop_engines_on_exit_leaves_them_serving(control, start_agent):
    agent = start_agent([control.address], stop_engines_on_exit=False)
    await control.wait_register()
    await control.wait_for("a live stream", lambda: control.connected)
    control.start_replica(**start_fields("r1"))
    ready = await control.wait_state("r1", READY)
    await agent.shutdown()
    try:
        status, _ = await get_json(f"{ready.url}/health")
        assert status == 200
        assert (agent.state_dir / "replicas" / "r1" / "pid").read_text().strip() == str(ready.pid)
    finally:
        os.killpg(ready.pid, signal.SIGKILL)
        (agent.state_dir / "replicas" / "r1" / "pid").unlink()


def _states(control, replica_id: str) -> list[int]:
    return [s.state for s in control.statuses(replica_id)]


async def test_a_frozen_engine_is_reported_not_ready_and_ready_again_when_it_thaws(control, live):
    control.start_replica(**start_fields("r1"))
    ready = await control.wait_state("r1", READY)
    os.killpg(ready.pid, signal.SIGSTOP)
    try:
        withdrawn = await control.wait_for(
            "r1 reported not ready",
            lambda: _states(control, "r1")[-1] == STARTING and control.statuses("r1")[-1],
        )
    finally:
        os.killpg(ready.pid, signal.SIGCONT)
    assert "not answering its health probe" in withdrawn.message
    await control.wait_for("r1 ready again", lambda: _states(control, "r1")[-1] == READY)
    # Nothing was restarted: the same process serves.
    assert control.statuses("r1")[-1].pid == ready.pid
    assert FAILED not in _states(control, "r1")


async def test_an_engine_frozen_past_the_hang_grace_is_killed_and_failed(control, start_agent):
    start_agent([control.address], hang_grace_seconds=1.0)
    await control.wait_for("a live stream", lambda: control.connected)
    control.start_replica(**start_fields("r1"))
    ready = await control.wait_state("r1", READY)
    os.killpg(ready.pid, signal.SIGSTOP)
    failed = await control.wait_state("r1", FAILED)
    assert "stopped answering its health probe" in failed.message
    assert group_gone(ready.pid)


async def test_the_engine_key_is_in_no_command_line_only_in_the_engines_own_environment(control, start_agent):
    """ps (any local user) shows no key; /proc/PID/environ (the engine's user only) carries it."""
    agent = start_agent([control.address], engines={"simulator": {"start_timeout_seconds": 30}})
    await control.wait_register()
    await control.wait_for("a live stream", lambda: control.connected)
    control.start_replica(**start_fields("r1"))
    ready = await control.wait_state("r1", READY, within=30)
    proc = Path(f"/proc/{ready.pid}")
    cmdline = proc.joinpath("cmdline").read_bytes().split(b"\0")
    assert b"llmgw.agent.simulator" in cmdline, cmdline
    assert not any(ENGINE_KEY.encode() in arg for arg in cmdline), cmdline
    assert f"VLLM_API_KEY={ENGINE_KEY}".encode() in proc.joinpath("environ").read_bytes().split(b"\0")
    log = (agent.state_dir / "replicas" / "r1" / "engine.log").read_text()
    assert ENGINE_KEY not in log and "VLLM_API_KEY=***" in log
    # The shipped simulator took the key from there: it is required.
    status, _ = await get_json(f"{ready.url}/v1/models", key=None)
    assert status == 401
    status, _ = await get_json(f"{ready.url}/v1/models")
    assert status == 200
