"""Fixtures for the agent's tests: a scripted control plane and in-process agents.

Agents run in the test's event loop through ``run_agent`` (the same
assembly the entry point uses) with the fake engine as the simulator's
program, so every replica is a real process on a real port. Teardown stops
the agents gracefully and then, as a backstop, kills any engine group still
named by a pid file, so no test leaves a process behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmgw.agent.config import AgentConfig
from llmgw.agent.engines import EngineLauncher
from llmgw.agent.node import run_agent
from llmgw.agent.weights import Hub

from .control import ScriptedControl

FAKE_ENGINE = Path(__file__).with_name("fake_engine.py")
FAKE_ENGINE_COMMAND = [sys.executable, str(FAKE_ENGINE)]
ENGINE_KEY = "llmgw-e-test-key-0123456789"


def start_fields(replica_id: str = "r1", **extra) -> dict:
    """A StartReplica's fields for the fake engine on GPU 0, overridable."""
    base = dict(
        replica_id=replica_id,
        model="llama",
        engine="simulator",
        served_name="llama-8b",
        gpu_indices=[0],
        engine_key=ENGINE_KEY,
    )
    return {**base, **extra}


def agent_config(tmp_path: Path, control: list[str], **overrides) -> AgentConfig:
    doc = {
        "node_id": "node-t",
        "control": control,
        "tls": {"plaintext": True},
        "state_dir": str(tmp_path / "state"),
        "labels": {"zone": "lab", "tier": "test"},
        "gpus": [
            {"count": 2, "name": "Sim A100", "memory_gb": 40},
            {"count": 1, "name": "Sim L4", "memory_gb": 24},
        ],
        "engines": {
            "simulator": {
                "command": FAKE_ENGINE_COMMAND,
                "args": {"color": "blue", "size": "s"},
                "start_timeout_seconds": 10,
            }
        },
        # Deliberately slow: the control plane's Registered sets the real interval.
        "heartbeat_interval_seconds": 30,
        "probe_interval_seconds": 0.05,
        "stop_grace_seconds": 3,
        **overrides,
    }
    return AgentConfig.model_validate(doc)


def engine_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def kill_leftover_engines(state_dir: Path) -> list[int]:
    """SIGKILL every engine group a pid file still names; return those pids."""
    pids = []
    for f in state_dir.glob("replicas/*/pid"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(f.read_text().strip())
            pids.append(pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
    return pids


@dataclass
class RunningAgent:
    config: AgentConfig
    stop: asyncio.Event
    task: asyncio.Task

    @property
    def state_dir(self) -> Path:
        return Path(self.config.state_dir)

    async def shutdown(self, within: float = 20.0) -> None:
        self.stop.set()
        async with asyncio.timeout(within):
            await asyncio.shield(self.task)


@pytest.fixture
async def control():
    server = ScriptedControl("control-a")
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def start_agent(tmp_path):
    agents: list[RunningAgent] = []

    def start(
        control: list[str],
        launchers: dict[str, EngineLauncher] | None = None,
        hub: Hub | None = None,
        **overrides,
    ) -> RunningAgent:
        config = agent_config(tmp_path / f"agent{len(agents)}", control, **overrides)
        stop = asyncio.Event()
        task = asyncio.create_task(
            run_agent(
                config, version="9.9.9-test", base_env=engine_env(), stop=stop, launchers=launchers, hub=hub
            )
        )
        agent = RunningAgent(config, stop, task)
        agents.append(agent)
        return agent

    yield start
    for agent in agents:
        if not agent.task.done():
            await agent.shutdown()
        else:
            agent.task.result()  # surface an agent that died during the test
    for agent in agents:
        left = kill_leftover_engines(agent.state_dir)
        assert not left, f"engines left running after the agent stopped: {left}"
