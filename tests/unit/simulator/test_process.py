"""The simulator as the agent runs it: a real process, its CLI, its listening line, SIGTERM."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest

from llmgw.agent.simulator.main import parse_settings

LISTENING = re.compile(r"^simulator listening on (http://127\.0\.0\.1:(\d+))$")


@asynccontextmanager
async def simulator_process(*args: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """Start ``python -m llmgw.agent.simulator --port 0 ...``; yield it and its URL; never leak it."""
    # stderr (a few log lines) is piped and read only to explain a failed start.
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmgw.agent.simulator", "--port", "0", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=30)
        match = LISTENING.match(line.decode().strip())
        if not match:
            proc.kill()
            stderr = await asyncio.wait_for(proc.stderr.read(), timeout=10)
            raise AssertionError(f"no listening line on stdout, got {line!r}; stderr:\n{stderr.decode()}")
        assert int(match.group(2)) > 0
        yield proc, match.group(1)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_process_prints_listening_line_serves_health_and_exits_0_on_sigterm():
    async with simulator_process("--served-model-name", "sim-a", "sim-b") as (proc, url):
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/health") as resp:
                assert resp.status == 200
            async with http.get(url + "/v1/models") as resp:
                assert [m["id"] for m in (await resp.json())["data"]] == ["sim-a", "sim-b"]
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=10) == 0


async def test_sigterm_with_a_stream_in_flight_exits_0_within_the_shutdown_timeout():
    args = ("--itl-ms", "10", "--output-tokens", "100000", "--shutdown-timeout", "0.5", "--dtype", "auto")
    async with simulator_process(*args) as (proc, url):
        async with aiohttp.ClientSession() as http:
            body = {"prompt": "hi", "stream": True}
            async with http.post(url + "/v1/completions", json=body) as resp:
                await resp.content.readline()  # streaming has begun
                proc.send_signal(signal.SIGTERM)
                started = time.monotonic()
                assert await asyncio.wait_for(proc.wait(), timeout=10) == 0
        assert time.monotonic() - started < 5


def test_cli_refuses_unknown_flags(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_settings(["--port", "0", "--no-such-flag", "1"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_cli_requires_port():
    with pytest.raises(SystemExit):
        parse_settings([])


def test_cli_accepts_template_flags_and_uses_model_as_served_name():
    settings, _ = parse_settings(
        ["--port", "0", "--model", "meta/llama", "--tensor-parallel-size", "2",
         "--gpu-memory-utilization", "0.9", "--dtype", "bfloat16", "--max-num-seqs", "4"]
    )  # fmt: skip
    assert settings.served_model_names == ("meta/llama",)
    assert settings.model_root == "meta/llama"
    assert settings.max_num_seqs == 4


def test_cli_served_model_names_take_several_and_the_first_is_primary():
    settings, _ = parse_settings(["--port", "8000", "--served-model-name", "a", "b", "--model", "/w"])
    assert settings.served_model_names == ("a", "b")
    assert settings.primary_model == "a"
    assert settings.model_root == "/w"


def test_cli_refuses_out_of_range_values(capsys):
    with pytest.raises(SystemExit):
        parse_settings(["--port", "0", "--max-num-seqs", "0"])
    assert "--max-num-seqs" in capsys.readouterr().err
