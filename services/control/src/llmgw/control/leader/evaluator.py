"""Running an eval suite against one replica: the prompts, then the score.

The leader calls :func:`run_suite` for a replica the eval gate holds back
(leader.lifecycle). It talks to the engine directly (the replica is not
published, so no router would send it anything), with the replica's own
engine key, one prompt at a time at temperature 0.

Bounds, since both the engine's answers and the scoring program are
outside this process: every request has the suite's
``request_timeout_seconds`` and an answer body of at most
``MAX_ANSWER_BYTES``; the scoring command runs without a shell, in its own
process group, with ``command_timeout_seconds`` (then the group is killed)
and at most ``max_command_output_bytes`` on stdout (more kills it too);
stderr is kept to its first 4 KiB for the reason.

Errors: :class:`EngineUnreachable` means the replica could not be asked
(it may have died): the caller retries later and records nothing.
:class:`EvalFailed` means the suite ran and cannot pass (a malformed
answer, a scoring command that failed): the caller records a failure with
the message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from ..spec.evalsuite import MAX_ANSWER_CHARS, EvalSuite, builtin_score, parse_command_score

MAX_ANSWER_BYTES = 1024 * 1024
STDERR_KEPT = 4096


class EvalError(Exception):
    pass


class EngineUnreachable(EvalError):
    """The replica did not answer: nothing is known about the version."""


class EvalFailed(EvalError):
    """The suite ran and the version fails it, for the reason in the message."""


@dataclass(frozen=True)
class Score:
    score: float
    # What was measured, for operators ("3 of 4 cases passed").
    detail: str


async def run_suite(
    session: aiohttp.ClientSession, url: str, key: str, served_name: str, suite: EvalSuite
) -> Score:
    """Ask every case's prompt, then score the answers by the suite's metric."""
    answers = [await ask(session, url, key, served_name, case.prompt, suite) for case in suite.cases]
    expected = [c.expected for c in suite.cases]
    if suite.metric == "command":
        payload = json.dumps(
            {
                "cases": [
                    {"prompt": c.prompt, "expected": c.expected, "answer": a}
                    for c, a in zip(suite.cases, answers, strict=True)
                ]
            }
        ).encode()
        out = await run_command(
            suite.command, payload, suite.command_timeout_seconds, suite.max_command_output_bytes
        )
        try:
            score = parse_command_score(out)
        except ValueError as err:
            raise EvalFailed(str(err)) from None
        return Score(score, f"scored {score:g} by {os.path.basename(suite.command[0])}")
    # A regex runs off the event loop: a slow pattern must not stall the leader. Python
    # cannot stop the thread, but the gate gets its verdict at the command timeout.
    try:
        async with asyncio.timeout(suite.command_timeout_seconds):
            score = await asyncio.to_thread(builtin_score, suite.metric, expected, answers)
    except TimeoutError:
        raise EvalFailed(f"scoring took longer than {suite.command_timeout_seconds:g}s") from None
    passed = round(score * len(expected))
    return Score(score, f"{passed} of {len(expected)} case(s) passed ({suite.metric})")


async def ask(
    session: aiohttp.ClientSession, url: str, key: str, served_name: str, prompt: str, suite: EvalSuite
) -> str:
    body = {
        "model": served_name,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": suite.max_tokens,
        "temperature": 0,
        "stream": False,
    }
    try:
        async with (
            asyncio.timeout(suite.request_timeout_seconds),
            session.post(
                url.rstrip("/") + "/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {key}"},
            ) as resp,
        ):
            data = await resp.content.read(MAX_ANSWER_BYTES + 1)
            status = resp.status
    except TimeoutError:
        raise EngineUnreachable(f"no answer within {suite.request_timeout_seconds:g}s") from None
    except aiohttp.ClientError as err:
        raise EngineUnreachable(f"{type(err).__name__}: {err}") from None
    if len(data) > MAX_ANSWER_BYTES:
        raise EvalFailed(f"an answer was larger than {MAX_ANSWER_BYTES} bytes")
    if status >= 500:
        raise EngineUnreachable(f"the engine answered {status}")
    if status != 200:
        raise EvalFailed(
            f"the engine refused a prompt with {status}: {data[:200].decode('utf-8', 'replace')}"
        )
    try:
        content = json.loads(data)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise EvalFailed("an answer is not a chat completion") from None
    return str(content or "")[:MAX_ANSWER_CHARS]


async def run_command(argv: Sequence[str], payload: bytes, seconds: float, limit: int) -> bytes:
    """Run the scoring command with ``payload`` on stdin; its stdout, within the bounds."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as err:
        raise EvalFailed(f"the scoring command {argv[0]!r} could not start: {err}") from None
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    stdout = proc.stdout

    async def read_out() -> bytes | None:
        out = await _read(stdout, limit)
        if out is None:  # past the limit: stop it now, or it blocks on a full pipe until the timeout
            _kill(proc.pid)
            # Read the pipe to its end all the same: a reader paused on a full buffer never
            # sees EOF, and (Python 3.11) proc.wait() waits for every pipe to close.
            await _read(stdout, 0, drain=True)
        return out

    try:
        async with asyncio.timeout(seconds):
            _, out, errout = await asyncio.gather(
                _feed(proc.stdin, payload), read_out(), _read(proc.stderr, STDERR_KEPT, drain=True)
            )
            if out is None:
                raise EvalFailed(f"the scoring command printed more than {limit} bytes; it was stopped")
            code = await proc.wait()
    except TimeoutError:
        raise EvalFailed(f"the scoring command ran longer than {seconds:g}s; it was stopped") from None
    finally:
        if proc.returncode is None:
            _kill(proc.pid)
            await proc.wait()
    if code != 0:
        tail = (errout or b"").decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        raise EvalFailed(f"the scoring command exited with {code}: {tail[0][:200]}")
    return out


def _kill(pid: int) -> None:
    """The whole group: a shell script's children go with it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def _feed(stdin: asyncio.StreamWriter, payload: bytes) -> None:
    # A program that exits without reading its input is not an error here.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        stdin.write(payload)
        await stdin.drain()
    stdin.close()


async def _read(stream: asyncio.StreamReader, limit: int, drain: bool = False) -> bytes | None:
    """Up to ``limit`` bytes; None when there is more (unless ``drain``: then the rest is discarded)."""
    kept = b""
    while chunk := await stream.read(65536):
        if len(kept) + len(chunk) > limit:
            if not drain:
                return None
            kept += chunk[: max(0, limit - len(kept))]
            continue
        kept += chunk
    return kept
