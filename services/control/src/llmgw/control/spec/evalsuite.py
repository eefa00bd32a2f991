"""Evaluation suites: the prompts an eval gate sends and how it scores the answers.

A model's ``eval_gate: {suite: qa-v2, min_score: 0.8}`` names a suite of the
cluster settings' ``eval_suites``::

    eval_suites:
      qa-v2:
        metric: contains            # exact | contains | regex | command
        max_tokens: 32
        cases:
          - {prompt: "Capital of France? One word.", expected: Paris}
          - {prompt: "2 + 2 = ? Digits only.", expected: "4"}
      judged:
        metric: command             # a scoring program: JSON cases on stdin, a score on stdout
        command: [/usr/local/bin/score-qa, --strict]
        cases: [{prompt: "Summarise: ...", expected: "..."}]

Scores: for ``exact`` (answer and expected equal once whitespace at both ends
is removed), ``contains`` (expected is a substring of the answer, ignoring
case) and ``regex`` (expected is a pattern ``re.search`` finds in the
answer), the share of cases that pass, from 0 to 1. For ``command`` the
number the program prints (leader.evaluator runs it, with a timeout and a
limit on what it may print).

This module is pure: the documents and the built-in metrics. Sending the
prompts and running the command is the leader's (leader.evaluator).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from pydantic import Field, model_validator

from llmgw.common.config import Document

Metric = Literal["exact", "contains", "regex", "command"]
# An answer is cut to this many characters before it is scored: it bounds the
# work a regex does on what an engine sent.
MAX_ANSWER_CHARS = 16 * 1024


class EvalCase(Document):
    prompt: str = Field(
        min_length=1, max_length=16 * 1024, description="the user message sent to the replica"
    )
    expected: str = Field(
        default="", max_length=16 * 1024, description="the expected answer; for regex, a pattern"
    )


class EvalSuite(Document):
    metric: Metric = Field(description="exact, contains, regex, or command (a scoring program)")
    cases: list[EvalCase] = Field(min_length=1, max_length=1000, description="prompts with expected answers")
    command: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="metric command: the program and its arguments (no shell); cases as JSON on stdin",
    )
    max_tokens: int = Field(default=64, ge=1, le=4096, description="max_tokens of each request")
    request_timeout_seconds: float = Field(default=30.0, gt=0, le=600, description="per prompt")
    command_timeout_seconds: float = Field(default=60.0, gt=0, le=3600, description="the scoring command's")
    max_command_output_bytes: int = Field(
        default=64 * 1024, ge=16, le=16 * 1024 * 1024, description="more on its stdout fails the gate"
    )

    @model_validator(mode="after")
    def _consistent(self) -> EvalSuite:
        if self.metric == "command" and not self.command:
            raise ValueError("metric command needs command: [program, args...]")
        if self.metric != "command" and self.command:
            raise ValueError(f"command is only for metric command, not {self.metric}")
        if self.metric == "regex":
            for i, case in enumerate(self.cases):
                if len(case.expected) > 1024:
                    raise ValueError(f"case {i + 1}: a regex is at most 1024 characters")
                try:
                    re.compile(case.expected)
                except re.error as err:
                    raise ValueError(
                        f"case {i + 1}: expected {case.expected!r} is not a regex: {err}"
                    ) from None
        return self


def case_passes(metric: Metric, expected: str, answer: str) -> bool:
    """One case under a built-in metric (not ``command``)."""
    answer = answer[:MAX_ANSWER_CHARS]
    if metric == "exact":
        return answer.strip() == expected.strip()
    if metric == "contains":
        return expected.strip().casefold() in answer.casefold()
    if metric == "regex":
        return re.search(expected, answer) is not None
    raise ValueError(f"{metric} is not a built-in metric")


def builtin_score(metric: Metric, expected: Sequence[str], answers: Sequence[str]) -> float:
    """The share of cases whose answer passes, 0 to 1."""
    if not expected:
        return 0.0
    passed = sum(case_passes(metric, e, a) for e, a in zip(expected, answers, strict=True))
    return passed / len(expected)


def parse_command_score(output: bytes) -> float:
    """The scoring command's stdout: one number (its last non-empty line). ValueError says why not."""
    lines = [ln.strip() for ln in output.decode("utf-8", "replace").splitlines() if ln.strip()]
    if not lines:
        raise ValueError("the scoring command printed nothing; it must print a score")
    try:
        score = float(lines[-1])
    except ValueError:
        raise ValueError(f"the scoring command's last line {lines[-1][:80]!r} is not a number") from None
    if score != score or score in (float("inf"), float("-inf")):
        raise ValueError(f"the scoring command printed {lines[-1][:80]!r}, not a finite score")
    return score
