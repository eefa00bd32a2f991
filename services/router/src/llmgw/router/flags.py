"""The command line: flags, and how they combine with the configuration file.

``--config FILE`` is read first; every flag given then replaces that key of
the file (``--control`` and ``--backend`` replace the whole list, they do
not append to it), and the result is validated as one document, so a file
may lack what the flags supply and vice versa.

``--backend MODEL=URL[,key=KEY][,served=NAME][,alias=A][,weight=N][,priority=P]``
declares one engine directly; ``alias`` may repeat.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from llmgw.common.config import parse_config
from llmgw.common.errors import InvalidArgument

from .config import RouterConfig

_BACKEND_KEYS = {"key": "api_key", "served": "served_name", "weight": "weight", "priority": "priority"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmgw-router", description="llmgw router: the OpenAI-compatible data plane"
    )
    parser.add_argument("--config", metavar="FILE", help="YAML configuration file")
    parser.add_argument("--listen", metavar="HOST:PORT", help="address to serve HTTP on")
    parser.add_argument(
        "--control",
        metavar="HOST:PORT",
        action="append",
        help="control-plane gRPC address (repeatable; tried in turn)",
    )
    parser.add_argument(
        "--cluster-secret-file", metavar="PATH", help="cluster secret (engine keys derive from it)"
    )
    parser.add_argument(
        "--backend",
        metavar="MODEL=URL[,key=KEY][,served=NAME][,alias=A]",
        action="append",
        help="a static engine, no control plane needed (repeatable)",
    )
    parser.add_argument(
        "--workers", metavar="N", type=int, help="processes sharing the listen port (SO_REUSEPORT)"
    )
    parser.add_argument(
        "--auth", choices=["none", "keys"], help="require client API keys (keys) or not (none)"
    )
    parser.add_argument(
        "--tls-dir",
        metavar="DIR",
        help="mutual TLS to the control plane: DIR/ca.crt and DIR/router-NAME.crt/.key (with --router-name)",
    )
    parser.add_argument("--router-name", metavar="NAME", help="this router's name (its certificate's)")
    parser.add_argument(
        "--plaintext", action="store_true", help="no TLS to the control plane (development only)"
    )
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    return parser


def parse_backend(spec: str) -> dict[str, Any]:
    head, *options = spec.split(",")
    model, sep, url = head.partition("=")
    if not sep or not model or not url:
        raise InvalidArgument(f"--backend {spec!r}: start with MODEL=URL, e.g. tiny=http://h:9001")
    backend: dict[str, Any] = {"model": model, "url": url}
    for option in options:
        name, sep, value = option.partition("=")
        if name == "alias" and sep:
            backend.setdefault("aliases", []).append(value)
        elif name in _BACKEND_KEYS and sep:
            backend[_BACKEND_KEYS[name]] = value
        else:
            raise InvalidArgument(
                f"--backend {spec!r}: unknown option {option!r}; use key=, served=, alias=, "
                "weight= or priority="
            )
    return backend


def _read_file(path: str) -> dict[str, Any]:
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as err:
        raise InvalidArgument(f"cannot read config {p}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise InvalidArgument(f"{p} is not valid YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InvalidArgument(f"{p}: the configuration must be a mapping of settings")
    return data


def config_from_args(args: argparse.Namespace) -> RouterConfig:
    data = _read_file(args.config) if args.config else {}
    if args.listen is not None:
        data["listen"] = args.listen
    if args.control is not None:
        data["control"] = args.control
    if args.cluster_secret_file is not None:
        data["cluster_secret_file"] = args.cluster_secret_file
    if args.backend is not None:
        data["backends"] = [parse_backend(spec) for spec in args.backend]
    if args.log_level is not None:
        data["log_level"] = args.log_level
    if args.workers is not None:
        data["workers"] = args.workers
    if args.auth is not None:
        data["auth"] = args.auth
    if args.router_name is not None:
        data["router_id"] = args.router_name
    if args.plaintext:
        data["tls"] = {"plaintext": True}
    elif args.tls_dir is not None:
        name = args.router_name or data.get("router_id")
        if not name:
            raise InvalidArgument("--tls-dir needs --router-name: the certificate is router-NAME.crt")
        d = Path(args.tls_dir)
        data["tls"] = {
            "ca_file": str(d / "ca.crt"),
            "cert_file": str(d / f"router-{name}.crt"),
            "key_file": str(d / f"router-{name}.key"),
        }
    return parse_config(data, RouterConfig, args.config or "command line")
