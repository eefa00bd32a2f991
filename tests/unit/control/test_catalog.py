"""The catalog constructor and the model document: what each refuses, and how it says so."""

from __future__ import annotations

import pytest

from llmgw.common.config import parse_config
from llmgw.common.errors import InvalidArgument
from llmgw.control.spec.catalog import Catalog
from llmgw.control.spec.model import ModelSpec


def spec(name: str, **kw) -> ModelSpec:
    if "profiles" not in kw and "external" not in kw:
        kw.setdefault("profile", {"engine": "simulator"})
    return parse_config({"name": name, **kw}, ModelSpec, name)


def test_shorthand_and_full_form_are_the_same_document():
    short = spec("m", min_replicas=2, profile={"engine": "vllm", "gpus": 2})
    full = parse_config(
        {"name": "m", "scaling": {"min": 2}, "profiles": [{"engine": "vllm", "gpus": 2}]}, ModelSpec
    )
    assert short == full
    assert short.scaling.upper == 2


def test_catalog_resolves_names_aliases_and_adapters():
    cat = Catalog.from_specs(
        [spec("base", aliases=["b"], adapters=[{"name": "base-sql", "source": "/lora/sql"}]), spec("other")]
    )
    assert cat.resolve("b").name == "base"
    assert cat.resolve("base-sql").name == "base"
    assert cat.names == ["base", "other"]


@pytest.mark.parametrize(
    "doc, fragment",
    [
        ({"profile": {"engine": "llama.cpp", "cpu_only": True}}, "must declare memory_gb"),
        ({"profile": {"engine": "vllm", "gpus": 0}}, "gpus: 0 needs cpu_only"),
        ({"scaling": {"min": 3, "max": 2}}, "scaling.max (2) is below scaling.min (3)"),
        ({"fallbacks": ["m"]}, "lists itself as a fallback"),
        ({"canary": {"model": "m", "percent": 5}}, "its own canary"),
        ({"profiles": []}, "at least one profile"),
        ({"external": {"url": "https://x.example"}}, "external model has no profiles"),
        ({"external": {"url": "ftp://x"}, "profiles": []}, "must start with http"),
        ({"name": "bad name"}, "not a valid model name"),
        ({"profile": {"engine": "vllm"}, "profiles": [{"engine": "vllm"}]}, "either profile or profiles"),
    ],
)
def test_model_document_refuses_with_a_message_that_says_what_to_fix(doc, fragment):
    data = {"name": "m", "profile": {"engine": "simulator"}, **doc}
    if "profiles" in doc and "profile" not in doc:
        data.pop("profile")
    with pytest.raises(InvalidArgument) as err:
        parse_config(data, ModelSpec, "m")
    assert fragment in str(err.value)


def test_catalog_reports_every_problem_at_once():
    with pytest.raises(InvalidArgument) as err:
        Catalog.from_specs(
            [
                spec("a", aliases=["shared"], fallbacks=["ghost"]),
                spec("b", aliases=["shared"], canary={"model": "nobody", "percent": 10}),
            ]
        )
    text = str(err.value)
    assert "3 problem(s)" in text
    assert "'shared' is used by both 'a' and 'b'" in text
    assert "falls back to 'ghost', which is not in the catalog" in text
    assert "canary 'nobody', which is not in the catalog" in text


def test_fallback_cycles_are_refused_and_named():
    with pytest.raises(InvalidArgument) as err:
        Catalog.from_specs(
            [
                spec("a", fallbacks=["b"]),
                spec("b", fallbacks=["c-alias"]),
                spec("c", aliases=["c-alias"], fallbacks=["a"]),
            ]
        )
    assert "fallbacks form a cycle: a -> b -> c -> a" in str(err.value)


def test_fallback_through_an_alias_to_itself_is_refused():
    with pytest.raises(InvalidArgument, match="one of its own names"):
        Catalog.from_specs([spec("a", aliases=["a2"], fallbacks=["a2"])])


def test_external_model_runs_no_replicas():
    m = Catalog.from_specs([spec("gpt", external={"url": "https://api.example"})])
    model = m.get("gpt")
    assert model.external and model.min_replicas == 0


def test_chains_without_cycles_are_fine():
    cat = Catalog.from_specs([spec("a", fallbacks=["b", "c"]), spec("b", fallbacks=["c"]), spec("c")])
    assert cat.get("a").fallbacks == ("b", "c")
