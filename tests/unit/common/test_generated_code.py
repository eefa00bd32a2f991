"""The committed gRPC code is exactly what scripts/gen_proto.py makes from proto/."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
COMMITTED = ROOT / "libs" / "common" / "src" / "llmgw" / "v1"


def test_generated_code_matches_proto_sources(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_proto.py"), str(tmp_path)], check=True)
    fresh = tmp_path / "llmgw" / "v1"
    names = sorted(p.name for p in fresh.iterdir() if p.is_file())
    committed = sorted(p.name for p in COMMITTED.iterdir() if p.is_file())
    assert names == committed, "generated file set differs; run `python scripts/gen_proto.py`"
    _, mismatch, errors = filecmp.cmpfiles(fresh, COMMITTED, names, shallow=False)
    assert not mismatch and not errors, (
        f"stale generated code in {COMMITTED}: {mismatch + errors}; run `python scripts/gen_proto.py`"
    )


def test_every_service_in_proto_is_importable():
    from llmgw.v1 import admin_pb2, agent_pb2, endpoints_pb2

    services = {
        s.full_name
        for mod in (admin_pb2, agent_pb2, endpoints_pb2)
        for s in mod.DESCRIPTOR.services_by_name.values()
    }
    assert services == {
        "llmgw.v1.AdminService",
        "llmgw.v1.AgentService",
        "llmgw.v1.EndpointService",
        "llmgw.v1.CatalogService",
    }
