#!/usr/bin/env python3
"""Generate the admin REST API's OpenAPI 3 document from proto/ (llmgw.control.http.openapi).

Writes docs/openapi.json and the copy the control plane serves at
/openapi.json (services/control/src/llmgw/control/http/openapi.json);
tests/unit/control/test_http_openapi.py fails when either is stale.

Usage: python scripts/gen_openapi.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2
from grpc_tools import protoc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_proto import PROTO_ROOT, ROOT, _googleapis_root, _well_known_root  # noqa: E402

from llmgw.control.http.openapi import SERVED, build, dumps  # noqa: E402

DOCS = ROOT / "docs" / "openapi.json"


def descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{_googleapis_root()}",
            f"-I{_well_known_root()}",
            "--include_source_info",
            "--include_imports",
            f"--descriptor_set_out={out}",
            *protos,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed; see the messages above")
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def text() -> str:
    return dumps(build(descriptor_set()))


def main() -> None:
    t = text()
    for path in (DOCS, SERVED):
        path.write_text(t)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
