"""``llmgw-agent`` as a real process: flags over the file, SIGTERM, exit codes."""

from __future__ import annotations

import asyncio
import os
import signal

import yaml

from llmgw.agent.main import main
from llmgw.v1 import agent_pb2 as pb
from tests.support.procs import start, tool

from .conftest import FAKE_ENGINE_COMMAND, engine_env, kill_leftover_engines, start_fields


def write_config(path, **doc) -> str:
    # The scripted control plane is plaintext (identities: tests/unit/control/test_auth.py).
    doc.setdefault("tls", {"plaintext": True})
    path.write_text(yaml.safe_dump(doc))
    return str(path)


async def wait_exit(proc, within: float) -> int:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while proc.popen.poll() is None:
        if loop.time() > deadline:
            raise AssertionError(f"agent did not exit within {within}s:\n{proc.tail()}")
        await asyncio.sleep(0.05)
    return proc.popen.returncode


async def test_sigterm_stops_engines_then_closes_the_stream_and_exits_zero(control, tmp_path):
    state = tmp_path / "state"
    config = write_config(
        tmp_path / "agent.yaml",
        node_id="from-file",
        control=["127.0.0.1:1"],  # replaced by --control
        state_dir="/nonexistent/replaced-by-flag",
        gpus=[{"count": 1}],
        engines={"simulator": {"command": FAKE_ENGINE_COMMAND}},
        probe_interval_seconds=0.05,
    )
    argv = [tool("llmgw-agent"), "--config", config, "--node-id", "from-flag"]
    argv += ["--control", control.address, "--state-dir", str(state), "--advertise-host", "127.0.0.9"]
    agent = start("agent", argv, tmp_path, env=engine_env())
    try:
        reg = await control.wait_register(within=20)
        assert reg.node_id == "from-flag"
        assert reg.address == "127.0.0.9"  # what a DaemonSet passes as $(POD_IP)
        await control.wait_for("a live stream", lambda: control.connected)
        control.start_replica(**start_fields("r1"))
        ready = await control.wait_state("r1", pb.REPLICA_STATE_READY)
        assert (state / "replicas" / "r1" / "engine.log").exists()

        agent.signal(signal.SIGTERM)
        assert await wait_exit(agent, 15) == 0, agent.tail()
        states = [s.state for s in control.statuses("r1")]
        assert states[-2:] == [pb.REPLICA_STATE_STOPPING, pb.REPLICA_STATE_STOPPED]
        try:
            os.killpg(ready.pid, 0)
            raise AssertionError("the engine outlived the agent's graceful shutdown")
        except ProcessLookupError:
            pass
    finally:
        agent.stop()
        assert not kill_leftover_engines(state)


def test_invalid_config_exits_2_naming_the_problem(tmp_path, capsys):
    config = write_config(tmp_path / "agent.yaml", control=["x:1"], heartbeat_interval_second=1)
    assert main(["--config", config]) == 2
    assert "heartbeat_interval_second" in capsys.readouterr().err


def test_config_without_tls_exits_2_saying_how_to_make_certificates(tmp_path, capsys):
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({"control": ["x:1"]}))
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "llmgw certs" in err and "tls.plaintext: true for development only" in err


def test_invalid_flag_value_is_held_to_the_files_rules(tmp_path, capsys):
    config = write_config(tmp_path / "agent.yaml", control=["x:1"])
    assert main(["--config", config, "--node-id", "no spaces allowed"]) == 2
    assert "node_id" in capsys.readouterr().err


def test_engine_kind_without_a_launcher_exits_2(tmp_path, capsys):
    config = write_config(
        tmp_path / "agent.yaml",
        control=["127.0.0.1:1"],
        state_dir=str(tmp_path),
        engines={"tgi": {}},
    )
    assert main(["--config", config]) == 2
    assert "no launcher for engine kind 'tgi'" in capsys.readouterr().err


def test_a_join_without_the_ca_hash_or_without_a_token_exits_2_saying_what_to_set(
    tmp_path, capsys, monkeypatch
):
    tls = {k: str(tmp_path / f"node.{k}") for k in ("ca_file", "cert_file", "key_file")}
    no_hash = write_config(
        tmp_path / "a.yaml", node_id="n", control=["127.0.0.1:1"], tls=tls, join={"address": "127.0.0.1:2"}
    )
    assert main(["--config", no_hash]) == 2
    assert "join.ca_cert_hash" in capsys.readouterr().err
    no_token = write_config(
        tmp_path / "b.yaml",
        node_id="n",
        control=["127.0.0.1:1"],
        tls=tls,
        join={"address": "127.0.0.1:2", "ca_cert_hash": "sha256:" + "0" * 64},
    )
    monkeypatch.delenv("LLMGW_JOIN_TOKEN", raising=False)
    assert main(["--config", no_token]) == 2
    assert "no join token" in capsys.readouterr().err
