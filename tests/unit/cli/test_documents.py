"""The CLI's KEY=VALUE editing of documents, and where it finds the admin token."""

from __future__ import annotations

import pytest

from llmgw.cli import connection
from llmgw.cli.connection import AdminError, resolve_token
from llmgw.cli.documents import get_path, parse_assignment, set_path, unset_path


def test_assignments_are_dotted_paths_with_yaml_values():
    doc = {"name": "m", "profiles": [{"engine": "vllm", "gpus": 1}]}
    for pair in ("profiles.0.gpus=2", "scaling.max=4", "fallbacks=[a, b]", "canary={model: x, percent: 5}"):
        set_path(doc, *parse_assignment(pair))
    assert doc["profiles"][0]["gpus"] == 2
    assert doc["scaling"] == {"max": 4}
    assert doc["fallbacks"] == ["a", "b"]
    assert doc["canary"] == {"model": "x", "percent": 5}
    unset_path(doc, "canary")
    assert "canary" not in doc
    assert get_path(doc, "profiles.0.engine") == "vllm"


@pytest.mark.parametrize(
    "action, message",
    [
        (lambda d: parse_assignment("no-equals-sign"), "is not KEY=VALUE"),
        (lambda d: set_path(d, "profiles.3.gpus", 1), "no such list item"),
        (lambda d: set_path(d, "name.first", "x"), "single value"),
        (lambda d: unset_path(d, "canary"), "canary is not set"),
        (lambda d: get_path(d, "weights.source"), "weights is not set"),
    ],
)
def test_bad_paths_say_what_is_wrong(action, message):
    with pytest.raises(AdminError, match=message):
        action({"name": "m", "profiles": [{"engine": "vllm"}]})


def test_the_token_comes_from_the_flag_then_the_file_then_the_environment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    f = tmp_path / "t"
    f.write_text("from-file\n")
    env = {"LLMGW_ADMIN_TOKEN": "from-env"}
    assert resolve_token("flag", str(f), env) == "flag"
    assert resolve_token(None, str(f), env) == "from-file"
    assert resolve_token(None, None, env) == "from-env"
    assert resolve_token(None, None, {"LLMGW_ADMIN_TOKEN_FILE": str(f)}) == "from-file"
    # The token itself before a file named in the environment, as the docs list them.
    assert resolve_token(None, None, {**env, "LLMGW_ADMIN_TOKEN_FILE": str(f)}) == "from-env"
    assert resolve_token(None, None, {}) == ""
    (tmp_path / ".llmgw").mkdir()
    (tmp_path / connection.DEFAULT_TOKEN_FILE).write_text("from-llmgw-up\n")
    assert resolve_token(None, None, {}) == "from-llmgw-up"
    with pytest.raises(AdminError, match="cannot read the admin token file"):
        resolve_token(None, str(tmp_path / "missing"), {})
