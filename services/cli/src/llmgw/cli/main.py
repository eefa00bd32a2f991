"""Entry point of ``llmgw``: parses arguments and dispatches; no logic of its own."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from .admin import AdminError, model_command
from .admin import run as admin_run
from .fleet import explain, node_command
from .keys import keys_command
from .localcluster import DEMO_ALIAS, DEMO_MODEL, ClusterError, LocalCluster, Ports
from .nodeops import logs as logs_command
from .nodeops import weights as weights_command


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmgw", description="llmgw operator CLI")
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="start a local cluster (etcd, control, router, 2 agents, demo model)")
    up.add_argument("--state-dir", default=".llmgw", help="configs, logs and etcd data (default .llmgw)")
    up.add_argument("--router-port", type=int, default=8080)
    up.add_argument("--control-port", type=int, default=50051)
    up.add_argument("--etcd-port", type=int, default=23790, help="client port; the peer port is one above")
    up.add_argument("--agents", type=int, default=2, choices=range(1, 9), metavar="N")
    up.add_argument("--gpus-per-agent", type=int, default=2, choices=range(1, 17), metavar="N")
    up.add_argument("--replicas", type=int, default=2, help="replicas of the demo model")
    up.add_argument("--ready-timeout", type=float, default=90.0)
    up.add_argument("--auth", choices=["none", "keys"], default="none", help="require client API keys")

    default_control = os.environ.get("LLMGW_CONTROL", "127.0.0.1:50051")
    for name, text in [
        ("status", "leader, counts and revisions"),
        ("models", "models and where their replicas stand"),
        ("nodes", "nodes, GPUs and engines"),
        ("replicas", "replicas and their state"),
    ]:
        c = sub.add_parser(name, help=text)
        c.add_argument(
            "--control", default=default_control, help="control plane host:port (env LLMGW_CONTROL)"
        )
        c.add_argument("--json", action="store_true", help="print the API response as JSON")
        if name == "replicas":
            c.add_argument("--model", default="", help="only this model's replicas")
        if name == "nodes":
            c.add_argument(
                "action",
                nargs="?",
                default="list",
                choices=["list", "hold", "release", "label"],
                help="list (default); hold NODE: drain it; release NODE; label NODE KEY=VALUE ...",
            )
            c.add_argument("node", nargs="?", default="", help="the node to hold, release or label")
            c.add_argument("labels", nargs="*", default=[], help="label: KEY=VALUE pairs to set")
            c.add_argument("--reason", default="", help="hold: why (shown with the node)")
            c.add_argument("--remove", action="append", default=[], metavar="KEY", help="label: remove KEY")
    e = sub.add_parser("explain", help="why a model is placed where it is, or cannot be, node by node")
    e.add_argument("model", help="model name or alias")
    e.add_argument("--control", default=default_control, help="control plane host:port (env LLMGW_CONTROL)")
    e.add_argument("--json", action="store_true", help="print the API response as JSON")
    m = sub.add_parser("model", help="add, update, get, remove or edit a model added at runtime")
    m.add_argument("action", choices=["add", "update", "get", "remove", "edit"])
    m.add_argument("target", help="add/update: a YAML or JSON model document file ('-': stdin); else: NAME")
    m.add_argument("--control", default=default_control, help="control plane host:port (env LLMGW_CONTROL)")
    m.add_argument("--json", action="store_true", help="print the API response as JSON")

    lg = sub.add_parser("logs", help="the last lines of a replica's engine log (asked of its node's agent)")
    lg.add_argument("replica", help="replica id (see llmgw replicas)")
    lg.add_argument("-n", "--lines", type=int, default=100, help="how many lines (default 100, max 10000)")
    lg.add_argument("--node", default="", help="the node, for a replica that failed and was replaced")
    w = sub.add_parser("weights", help="list, fetch or remove weights in nodes' caches")
    w.add_argument("action", nargs="?", default="list", choices=["list", "fetch", "remove"])
    w.add_argument("node", nargs="?", default="", help="list: only this node; fetch/remove: the node")
    w.add_argument("target", nargs="?", default="", help="fetch: hf://ORG/NAME[@REV] or a path; remove: NAME")
    w.add_argument("--name", default="", help="fetch: the entry's name (default from the source)")
    for c in (lg, w):
        c.add_argument(
            "--control", default=default_control, help="control plane host:port (env LLMGW_CONTROL)"
        )
        c.add_argument("--json", action="store_true", help="print the API response as JSON")
    k = sub.add_parser("keys", help="create, list or revoke client API keys")
    ks = k.add_subparsers(dest="action", required=True)
    create = ks.add_parser("create", help="make a key; its secret is printed once")
    create.add_argument("--name", default="", help="unique label (letters, digits, . _ @ -)")
    create.add_argument("--owner", default="", help="who the key is for")
    create.add_argument(
        "--model",
        dest="models",
        action="append",
        default=[],
        help="allowed model or alias (repeatable; default all)",
    )
    create.add_argument("--rpm", type=int, default=0, help="requests per minute across routers (0: no limit)")
    create.add_argument("--tpm", type=int, default=0, help="tokens per minute across routers (0: no limit)")
    create.add_argument(
        "--ttl", type=int, default=0, metavar="SECONDS", help="expire after this long (0: never)"
    )
    ks.add_parser("list", help="keys: id, name, prefix, models, limits")
    revoke = ks.add_parser(
        "revoke", help="revoke a key by id or name; every router refuses it within a second"
    )
    revoke.add_argument("key", help="key id (k-...) or name")
    for sp in (create, ks.choices["list"], revoke):
        sp.add_argument(
            "--control", default=default_control, help="control plane host:port (env LLMGW_CONTROL)"
        )
        sp.add_argument("--json", action="store_true", help="print the API response as JSON")
    return p


def _up(args: argparse.Namespace) -> int:
    cluster = LocalCluster(
        state_dir=Path(args.state_dir).resolve(),
        ports=Ports(router=args.router_port, control=args.control_port, etcd=args.etcd_port),
        agents=args.agents,
        gpus_per_agent=args.gpus_per_agent,
        replicas=args.replicas,
        ready_timeout=args.ready_timeout,
        auth=args.auth,
    )
    stopping = False

    def on_signal(signum, frame):
        nonlocal stopping
        if not stopping:
            stopping = True
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        cluster.start()
        url = cluster.router_url
        keys_hint = (
            "  Client keys are required (auth: keys). Make one; its secret is printed once:\n"
            f"    llmgw keys create --name me --control {cluster.control_address}\n"
            "  then send it: curl -H 'Authorization: Bearer <secret>' ..., "
            "or OpenAI(api_key=<secret>).\n\n"
            if args.auth == "keys"
            else ""
        )
        print(
            f"\nllmgw is up. Router: {url}/v1   model: {DEMO_MODEL} (alias {DEMO_ALIAS})\n\n"
            f"  curl -N {url}/v1/chat/completions -H 'Content-Type: application/json' \\\n"
            f'    -d \'{{"model": "{DEMO_MODEL}", "stream": true, '
            f'"messages": [{{"role": "user", "content": "Hello"}}]}}\'\n\n'
            + keys_hint
            + f"  llmgw status --control {cluster.control_address}\n"
            f"  logs: {cluster.state_dir / 'logs'}\n\n"
            "Ctrl-C stops everything.",
            flush=True,
        )
        signal.pause()
    except KeyboardInterrupt:
        print("\nstopping ...", flush=True)
    except ClusterError as err:
        print(f"llmgw up: {err}", file=sys.stderr)
        cluster.stop()
        return 1
    cluster.stop()
    print("stopped; no process left behind.", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "up":
        return _up(args)
    try:
        if args.command == "model":
            print(model_command(args.action, args.target, args.control, args.json))
        elif args.command == "explain":
            print(explain(args.model, args.control, args.json))
        elif args.command == "nodes" and args.action != "list":
            print(
                node_command(
                    args.action,
                    args.node,
                    args.control,
                    reason=args.reason,
                    labels=args.labels,
                    remove=args.remove,
                    as_json=args.json,
                )
            )
        elif args.command == "logs":
            print(logs_command(args.control, args.replica, args.lines, args.node, args.json))
        elif args.command == "weights":
            if args.action != "list" and not (args.node and args.target):
                raise AdminError(
                    f"weights {args.action} needs NODE and {'SOURCE' if args.action == 'fetch' else 'NAME'}"
                )
            print(weights_command(args.control, args.action, args.node, args.target, args.name, args.json))
        elif args.command == "keys":
            print(keys_command(args))
        else:
            print(admin_run(args.command, args.control, args.json, getattr(args, "model", "")))
    except AdminError as err:
        print(f"llmgw {args.command}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
