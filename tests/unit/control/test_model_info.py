"""What the control plane publishes of a model for routers: names, and how to route around it."""

from __future__ import annotations

from llmgw.control.leader.publisher import model_info
from llmgw.control.spec.catalog import Model
from llmgw.control.spec.model import ModelSpec


def test_model_info_carries_fallbacks_canary_and_external_provider_to_routers():
    spec = ModelSpec.model_validate(
        {
            "name": "big",
            "aliases": ["b"],
            "profile": {"engine": "simulator"},
            "fallbacks": ["small", "gpt"],
            "canary": {"model": "big-next", "percent": 12.5},
        }
    )
    info = model_info(Model.from_spec(spec), created=7)
    assert (info.name, list(info.aliases), info.created) == ("big", ["b"], 7)
    assert list(info.fallbacks) == ["small", "gpt"]
    assert (info.canary.model, info.canary.percent) == ("big-next", 12.5)
    assert not info.HasField("external")

    ext = ModelSpec.model_validate(
        {"name": "gpt", "external": {"url": "https://p.example/", "model": "gpt-4o", "api_key_file": "/k"}}
    )
    info = model_info(Model.from_spec(ext), created=7)
    assert not info.HasField("canary")
    assert (info.external.url, info.external.api, info.external.model, info.external.api_key_file) == (
        "https://p.example",
        "openai",
        "gpt-4o",
        "/k",
    )


def test_model_info_carries_the_apis_a_model_serves_and_none_means_every_api():
    spec = ModelSpec.model_validate(
        {"name": "ranker", "profile": {"engine": "simulator"}, "apis": ["rerank", "score"]}
    )
    assert list(model_info(Model.from_spec(spec), created=7).apis) == ["rerank", "score"]
    plain = ModelSpec.model_validate({"name": "chat", "profile": {"engine": "simulator"}})
    assert list(model_info(Model.from_spec(plain), created=7).apis) == []


def test_unknown_or_repeated_apis_are_refused_saying_which():
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="speech"):
        ModelSpec.model_validate({"name": "x", "profile": {"engine": "simulator"}, "apis": ["speech"]})
    with pytest.raises(ValidationError, match="lists an API twice"):
        ModelSpec.model_validate({"name": "x", "profile": {"engine": "simulator"}, "apis": ["chat", "chat"]})
