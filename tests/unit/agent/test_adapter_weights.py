"""A LoRA adapter's weights are in use while a replica holds or wants it: the cache keeps them."""

from __future__ import annotations

from llmgw.agent.adapters import AdapterRef, LoraSpec
from llmgw.agent.lifecycle import EngineHost, Replica
from llmgw.agent.replicas import ReplicaSpec, ReplicaState
from llmgw.agent.supervisor import Supervisor


class Quiet:
    def replica_changed(self, status) -> None:
        pass


def test_adapter_sources_count_as_weights_in_use(tmp_path):
    host = EngineHost({}, "127.0.0.1", "127.0.0.1", 0, 0.1, 1.0, {})
    sup = Supervisor(host=host, state_dir=tmp_path, listener=Quiet())
    lora = LoraSpec(1, 8, (AdapterRef("a", "/lora/a"),))
    spec = ReplicaSpec("r1", "m", "simulator", "m", (), "k", {}, lora)
    replica = Replica(spec, tmp_path / "r1", state=ReplicaState.READY)
    replica.want_adapters((AdapterRef("b", "hf://acme/b"),))
    sup._replicas["r1"] = replica  # a replica as the runner leaves it, without an engine
    assert sup.uses_weights("/lora/a") and sup.uses_weights("hf://acme/b")
    assert not sup.uses_weights("/lora/other")
