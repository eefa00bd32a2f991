"""The simulator's LoRA adapters, as vLLM serves them, and the agent's adapter client against it."""

from __future__ import annotations

import json

import pytest

from llmgw.agent.adapters import APIS, AdapterClient, AdapterRef, sync
from llmgw.agent.simulator.main import parse_settings
from tests.unit.simulator.support import openai_client


def adapter(tmp_path, name):
    d = tmp_path / name
    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps({"r": 8}))
    return str(d)


def base(sim):
    return f"http://127.0.0.1:{sim.port}"


async def test_runtime_load_lists_serves_and_unloads_an_adapter(start_simulator, http, tmp_path):
    sim = await start_simulator(enable_lora=True, runtime_lora_updating=True, served_model_names=("base",))
    path = adapter(tmp_path, "sql")
    async with http.post(
        base(sim) + "/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": path}
    ) as r:
        assert r.status == 200
    async with http.post(
        base(sim) + "/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": path}
    ) as r:
        assert r.status == 400, "loading a loaded name again is refused, as vLLM does"
    async with http.get(base(sim) + "/v1/models") as r:
        listed = {m["id"]: m for m in (await r.json())["data"]}
    assert listed["sql"]["parent"] == "base" and listed["sql"]["root"] == path
    answer = await openai_client(sim).chat.completions.create(
        model="sql", messages=[{"role": "user", "content": "hi"}]
    )
    assert answer.model == "sql", "the answer names the adapter that served it"
    async with http.post(base(sim) + "/v1/unload_lora_adapter", json={"lora_name": "sql"}) as r:
        assert r.status == 200
    async with http.post(base(sim) + "/v1/unload_lora_adapter", json={"lora_name": "sql"}) as r:
        assert r.status == 404


async def test_a_path_without_an_adapter_and_a_bad_body_are_4xx(start_simulator, http, tmp_path):
    sim = await start_simulator(enable_lora=True, runtime_lora_updating=True)
    body = {"lora_name": "x", "lora_path": str(tmp_path)}
    async with http.post(base(sim) + "/v1/load_lora_adapter", json=body) as r:
        assert r.status == 400 and "adapter_config.json" in (await r.json())["error"]["message"]
    async with http.post(base(sim) + "/v1/load_lora_adapter", data=b"{not json") as r:
        assert r.status == 400


async def test_runtime_routes_exist_only_with_the_environment_switch(start_simulator, http, tmp_path):
    sim = await start_simulator(enable_lora=True)
    body = {"lora_name": "x", "lora_path": adapter(tmp_path, "x")}
    async with http.post(base(sim) + "/v1/load_lora_adapter", json=body) as r:
        assert r.status == 404


def test_flags_take_vllms_spelling_and_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    path = adapter(tmp_path, "a")
    settings, _ = parse_settings(
        [
            "--port",
            "0",
            "--enable-lora",
            "--max-loras",
            "3",
            "--max-lora-rank",
            "8",
            "--lora-modules",
            f"a={path}",
        ]
    )
    assert settings.enable_lora and settings.runtime_lora_updating
    assert settings.max_loras == 3 and settings.lora_modules == (("a", path),)
    with pytest.raises(SystemExit):
        parse_settings(["--port", "0", "--lora-modules", f"a={path}"])


async def test_agent_sync_unloads_loads_and_reads_back_what_the_engine_holds(start_simulator, http, tmp_path):
    paths = {n: adapter(tmp_path, n) for n in ("a", "b")}
    sim = await start_simulator(
        enable_lora=True, runtime_lora_updating=True, lora_modules=(("a", paths["a"]),), api_key="k"
    )
    client = AdapterClient(http, base(sim), "k", APIS["simulator"])
    assert await client.loaded() == {"a"}
    problems: list[str] = []

    async def resolve(wanted):
        return list(wanted)

    wanted = [AdapterRef("b", paths["b"]), AdapterRef("broken", str(tmp_path))]
    holds = await sync(client, {"a"}, wanted, resolve, problems.append)
    assert holds == {"b"}
    assert len(problems) == 1 and "broken" in problems[0], "one failing adapter does not stop the others"
