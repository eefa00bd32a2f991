#!/usr/bin/env python3
"""Generate the Python gRPC code for proto/ into libs/common/src.

The generated modules land at ``llmgw/v1/*_pb2*.py`` inside libs/common, so
they import as ``llmgw.v1.agent_pb2`` and their own cross-imports
(``from llmgw.v1 import agent_pb2``) resolve without rewriting. They are
committed, never edited; tests/unit/common/test_generated_code.py fails when
they differ from what this script produces.

The admin services carry ``google.api.http`` annotations (the REST mapping
the control plane's HTTP port serves, :mod:`llmgw.control.http`); their
proto, google/api/annotations.proto, comes from googleapis-common-protos
(a pinned dependency of llmgw-common), whose wheel ships the .proto files.
The generated code imports ``google.api.annotations_pb2`` from that package;
nothing of google/ is generated here.

Usage: python scripts/gen_proto.py [OUTPUT_ROOT]
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
DEFAULT_OUT = ROOT / "libs" / "common" / "src"


def _googleapis_root() -> Path:
    """The folder holding google/api/*.proto (googleapis-common-protos' wheel)."""
    import google.api

    return Path(google.api.__path__[0]).parent.parent


def _well_known_root() -> Path:
    """google/protobuf/*.proto (descriptor.proto, which annotations.proto imports), from grpcio-tools."""
    return Path(protoc.__file__).parent / "_proto"


def generate(out_root: Path) -> list[Path]:
    protos = sorted(PROTO_ROOT.rglob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {PROTO_ROOT}")
    out_root.mkdir(parents=True, exist_ok=True)
    rel = [str(p.relative_to(PROTO_ROOT)) for p in protos]
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{_googleapis_root()}",
        f"-I{_well_known_root()}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *rel,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed; see the messages above")
    written = []
    for r in rel:
        pkg_dir = out_root / Path(r).parent
        init = pkg_dir / "__init__.py"
        if not init.exists():
            init.write_text('"""Generated from proto/ by scripts/gen_proto.py. Do not edit."""\n')
        written.append(pkg_dir)
    return sorted(set(written))


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    for d in generate(out):
        print(f"generated {d}")


if __name__ == "__main__":
    main()
