"""The token counts read from an answer's bytes (:mod:`llmgw.router.tokens`).

The scan is held to the two regular expressions it replaced, which say
what it reads: from the last ``"usage"`` key, the first prompt (or input)
and completion (or output) key followed by a colon and digits. The suite
runs the compiled build; tests/unit/router/test_compiled.py runs this file
against the source too.
"""

from __future__ import annotations

import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.router.tokens import usage

_PROMPT = re.compile(rb'"(?:prompt|input)_tokens"\s*:\s*(\d+)')
_COMPLETION = re.compile(rb'"(?:completion|output)_tokens"\s*:\s*(\d+)')


def reference(body: bytes) -> tuple[int, int] | None:
    at = body.rfind(b'"usage"')
    if at < 0:
        return None
    prompt, completion = _PROMPT.search(body, at), _COMPLETION.search(body, at)
    if prompt is None and completion is None:
        return None
    return (int(prompt[1]) if prompt else 0, int(completion[1]) if completion else 0)


PIECES = [
    b'"usage"',
    b'"prompt_tokens"',
    b'"input_tokens"',
    b'"completion_tokens"',
    b'"output_tokens"',
    b'"prompt_tokens_details"',
    b":",
    b" ",
    b"\n",
    b"\t",
    b"\x0b",
    b"12",
    b"0",
    b"7",
    b"null",
    b"{",
    b"}",
    b",",
    b'"',
    b'"x"',
    b"-3",
    b"9" * 18,
    b"9" * 19,
    b"12345678901234567890123",
]


@settings(max_examples=3000)
@given(st.lists(st.sampled_from(PIECES), max_size=16), st.binary(max_size=8))
def test_the_scan_reads_what_the_regular_expressions_read(pieces, noise):
    body = b"".join(pieces)
    assert usage(body) == reference(body)
    assert usage(noise + body + noise) == reference(noise + body + noise)


def test_an_openai_answer_and_a_stream_are_counted_from_their_last_usage():
    answer = {
        "choices": [{"message": {"content": '"usage": {"prompt_tokens": 99}'}}],
        "usage": {"prompt_tokens": 12, "total_tokens": 19, "completion_tokens": 7},
    }
    assert usage(json.dumps(answer).encode()) == (12, 7)
    stream = (
        b'data: {"choices":[{"delta":{"content":"usage"}}],"usage":null}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":7}}\n\ndata: [DONE]\n\n'
    )
    assert usage(stream) == (12, 7)
    assert usage(b'data: {"usage":null}\n\n') is None
    assert usage(b'{"choices":[]}') is None


def test_the_responses_and_messages_apis_names_are_counted():
    assert usage(json.dumps({"usage": {"input_tokens": 5, "output_tokens": 7}}).encode()) == (5, 7)
    details = {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 2}, "output_tokens": 7}
    assert usage(json.dumps({"usage": details}).encode()) == (5, 7)


def test_a_key_without_a_number_is_passed_over_and_one_count_alone_is_read():
    assert usage(b'{"usage":{"prompt_tokens":null,"prompt_tokens":4}}') == (4, 0)
    assert usage(b'{"usage":{"completion_tokens" :\n 9}}') == (0, 9)
    assert usage(b'{"usage":{"prompt_tokens":"4"}}') is None
    # Past 18 digits the count is read whole, not in the compiled loop's C integer.
    assert usage(b'{"usage":{"prompt_tokens":123456789012345678901}}') == (123456789012345678901, 0)
