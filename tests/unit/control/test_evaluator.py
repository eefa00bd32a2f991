"""Eval suites: the documents, the built-in metrics, a real simulator asked, the scoring command's bounds."""

from __future__ import annotations

import asyncio
import sys
import time
from asyncio import base_subprocess

import aiohttp
import pytest
from pydantic import ValidationError

from llmgw.agent.simulator.server import SimulatorServer
from llmgw.agent.simulator.settings import SimulatorSettings
from llmgw.control.leader import evaluator
from llmgw.control.leader.evaluator import EngineUnreachable, EvalFailed, run_command, run_suite
from llmgw.control.spec.evalsuite import EvalSuite, builtin_score, parse_command_score

PY = sys.executable


def suite(**kw) -> EvalSuite:
    return EvalSuite.model_validate(
        {"metric": "contains", "cases": [{"prompt": "hi", "expected": "x"}], **kw}
    )


def test_a_suite_refuses_what_cannot_run():
    with pytest.raises(ValidationError, match="needs command"):
        suite(metric="command")
    with pytest.raises(ValidationError, match="only for metric command"):
        suite(command=["/bin/true"])
    with pytest.raises(ValidationError, match="is not a regex"):
        suite(metric="regex", cases=[{"prompt": "p", "expected": "("}])
    with pytest.raises(ValidationError, match="cases"):
        suite(cases=[])


def test_builtin_metrics_score_the_share_of_cases_that_pass():
    answers = ["  Paris ", "it is paris, I think", "Lyon"]
    assert builtin_score("exact", ["Paris", "Paris", "Paris"], answers) == pytest.approx(1 / 3)
    assert builtin_score("contains", ["paris", "Paris", "paris"], answers) == pytest.approx(2 / 3)
    assert builtin_score("regex", [r"^\s*Paris\s*$", r"\bparis\b", r"L.on"], answers) == 1.0


def test_a_command_score_is_one_finite_number():
    assert parse_command_score(b"judging...\n0.75\n") == 0.75
    for bad in (b"", b"good\n", b"nan", b"inf"):
        with pytest.raises(ValueError):
            parse_command_score(bad)


async def test_a_suite_asks_a_real_engine_with_its_key_and_scores_the_answers():
    settings = SimulatorSettings(
        served_model_names=("m",), api_key="k1", ttft_ms=1, itl_ms=0, output_tokens=4
    )
    async with SimulatorServer(settings) as sim, aiohttp.ClientSession() as session:
        # The simulator's words are lowercase English: "zebra" never, one of them always.
        s = EvalSuite.model_validate(
            {
                "metric": "regex",
                "cases": [
                    {"prompt": "one", "expected": r"^( [a-z]+)+$"},
                    {"prompt": "two", "expected": "zebra"},
                ],
            }
        )
        score = await run_suite(session, sim.url, "k1", "m", s)
        assert score.score == 0.5 and score.detail == "1 of 2 case(s) passed (regex)"
        with pytest.raises(EvalFailed, match="refused a prompt with 401"):
            await run_suite(session, sim.url, "wrong-key", "m", s)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(EngineUnreachable):
            await run_suite(session, sim.url, "k1", "m", s)


async def test_the_scoring_command_gets_the_cases_and_its_score_is_used():
    script = "import json,sys; d=json.load(sys.stdin); print(len(d['cases'][0]['answer'].split()) / 10)"
    settings = SimulatorSettings(served_model_names=("m",), ttft_ms=1, itl_ms=0, output_tokens=4)
    async with SimulatorServer(settings) as sim, aiohttp.ClientSession() as session:
        s = suite(metric="command", command=[PY, "-c", script])
        score = await run_suite(session, sim.url, "", "m", s)
    assert score.score == pytest.approx(0.4), "four words, scored by the command"


async def test_a_scoring_command_that_runs_too_long_is_killed_at_its_timeout():
    started = time.monotonic()
    with pytest.raises(EvalFailed, match="ran longer than 0.5s"):
        await run_command([PY, "-c", "import time; time.sleep(30)"], b"{}", 0.5, 1024)
    assert time.monotonic() - started < 10


async def test_a_scoring_command_that_prints_too_much_is_stopped():
    started = time.monotonic()
    with pytest.raises(EvalFailed, match="printed more than 1024 bytes"):
        await run_command([PY, "-c", "import sys\nwhile True: sys.stdout.write('x' * 4096)"], b"{}", 30, 1024)
    assert time.monotonic() - started < 10, "stopped at the limit, not at the timeout"


async def test_a_command_that_floods_its_output_before_it_is_read_is_still_stopped(monkeypatch):
    # On a busy machine the command can fill the reader's buffer before the first read, which
    # pauses the pipe: stopped at the limit, the pipe must still be read to its end, or
    # proc.wait() (which waits for every pipe to close) never returns. The delay makes it so here.
    real_read = evaluator._read

    async def late_read(stream, limit, drain=False):
        if limit == 1024:
            await asyncio.sleep(0.5)
        return await real_read(stream, limit, drain)

    monkeypatch.setattr(evaluator, "_read", late_read)
    # ... and the child watcher reports the exit late (its thread not yet scheduled), so
    # the final proc.wait() has to wait for the pipes to close.
    real_exited = base_subprocess.BaseSubprocessTransport._process_exited

    def late_exit(self, returncode):
        asyncio.get_running_loop().call_later(1.0, real_exited, self, returncode)

    monkeypatch.setattr(base_subprocess.BaseSubprocessTransport, "_process_exited", late_exit)
    flood = "import sys\nwhile True: sys.stdout.write('x' * 65536); sys.stdout.flush()"
    with pytest.raises(EvalFailed, match="printed more than 1024 bytes"):
        await asyncio.wait_for(run_command([PY, "-c", flood], b"{}", 30, 1024), 20)


async def test_a_scoring_command_that_fails_says_why():
    with pytest.raises(EvalFailed, match="exited with 3: no judge"):
        await run_command(
            [PY, "-c", "import sys; print('no judge', file=sys.stderr); sys.exit(3)"], b"", 5, 1024
        )
    with pytest.raises(EvalFailed, match="could not start"):
        await run_command(["/nonexistent/scorer"], b"", 5, 1024)
