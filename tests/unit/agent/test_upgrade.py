"""The agent's side of ``llmgw nodes upgrade``: what it checks before it hands over, and how.

Real programs on disk (shell scripts staged in a tmp dir), real subprocesses
for ``--version``; no control plane (the hand-over over a real stream is
tests/integration/test_builds_and_upgrade.py).
"""

from __future__ import annotations

import json
import os

import pytest

from llmgw.agent import statefile
from llmgw.agent.config import UpgradeSettings
from llmgw.agent.main import main
from llmgw.agent.upgrade import Handover, Upgrader
from llmgw.common.errors import FailedPrecondition, InvalidArgument


def release(directory, version_line: str = "llmgw-agent 2.0", sleep: float = 0) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "llmgw-agent"
    path.write_text(
        f"#!/bin/sh\nsleep {sleep}\n"
        f'for a in "$@"; do [ "$a" = --version ] && echo "{version_line}"; done\nexit 0\n'
    )
    path.chmod(0o755)
    return str(path)


def upgrader(tmp_path, **settings) -> tuple[Upgrader, list[str]]:
    asked: list[str] = []
    settings.setdefault("allowed_dirs", [str(tmp_path / "releases")])
    return Upgrader(UpgradeSettings(**settings), lambda: asked.append("stop")), asked


async def test_a_staged_release_reporting_the_version_is_handed_over_to_and_the_agent_asked_to_stop(tmp_path):
    up, asked = upgrader(tmp_path, handover="exit")
    program = release(tmp_path / "releases" / "2.0")
    handover = await up.check("2.0", [program, "--flag"])
    assert handover == Handover("2.0", (program, "--flag"), "exit")
    assert asked == []  # checking changes nothing
    up.hand_over(handover)
    assert asked == ["stop"] and up.handover == handover
    with pytest.raises(FailedPrecondition, match="already handing over"):
        await up.check("2.0", [program])


async def test_a_node_without_allowed_dirs_takes_no_upgrade(tmp_path):
    up, _ = upgrader(tmp_path, allowed_dirs=[])
    with pytest.raises(FailedPrecondition, match="no upgrade.allowed_dirs"):
        await up.check("2.0", [release(tmp_path / "releases")])


async def test_a_program_outside_the_allowed_dirs_is_refused_even_through_a_symlink(tmp_path):
    up, _ = upgrader(tmp_path)
    outside = release(tmp_path / "elsewhere")
    with pytest.raises(FailedPrecondition, match="outside upgrade.allowed_dirs"):
        await up.check("2.0", [outside])
    (tmp_path / "releases").mkdir()
    os.symlink(outside, tmp_path / "releases" / "link")
    with pytest.raises(FailedPrecondition, match="outside upgrade.allowed_dirs"):
        await up.check("2.0", [str(tmp_path / "releases" / "link")])
    with pytest.raises(InvalidArgument, match="not an absolute path"):
        await up.check("2.0", ["releases/llmgw-agent"])


async def test_a_release_that_is_not_executable_or_reports_another_version_is_refused(tmp_path):
    up, _ = upgrader(tmp_path, check_timeout_seconds=0.5)
    program = release(tmp_path / "releases" / "a", "llmgw-agent 1.9")
    with pytest.raises(FailedPrecondition, match="reports '1.9', not '2.0'"):
        await up.check("2.0", [program])
    os.chmod(program, 0o644)
    with pytest.raises(FailedPrecondition, match="not an executable file"):
        await up.check("1.9", [program])
    slow = release(tmp_path / "releases" / "slow", sleep=5)
    with pytest.raises(FailedPrecondition, match="did not answer within 0.5s"):
        await up.check("2.0", [slow])
    with pytest.raises(InvalidArgument, match="version must be"):
        await up.check("", [program])


def test_the_agent_tells_its_version_and_a_release_script_can_name_its_own(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"], version="9.9.9")
    assert done.value.code == 0 and capsys.readouterr().out.strip() == "llmgw-agent 9.9.9"


def test_an_engine_record_written_by_a_newer_agent_is_still_adopted(tmp_path):
    d = tmp_path / "r1"
    d.mkdir()
    doc = {
        "replica_id": "r1", "model": "m", "engine": "simulator", "served_name": "m", "gpu_indices": [0],
        "engine_args": {}, "key_fingerprint": "", "pid": os.getpid(), "start_ticks": 1, "boot_id": "b",
        "port": 8000, "url": "http://h:8000", "version": statefile.VERSION, "field_of_a_later_agent": 1,
    }  # fmt: skip
    (d / statefile.FILENAME).write_text(json.dumps(doc))
    record = statefile.read(d)
    assert record is not None and record.pid == os.getpid() and record.build == ""
