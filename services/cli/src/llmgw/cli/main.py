"""Entry point of ``llmgw``: parses arguments and dispatches; no logic of its own."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from .admin import run as admin_run
from .certs import add_parser as add_certs_parser
from .certs import certs_command
from .connection import AdminError
from .fleet import explain, node_command, usage
from .keys import keys_command
from .localcluster import DEMO_ALIAS, DEMO_MODEL, ClusterError, LocalCluster, Ports
from .models import model_command
from .nodeops import logs as logs_command
from .nodeops import weights as weights_command
from .peers import peers_command
from .settings import settings_command
from .trust import join_token_command
from .upgrade import upgrade as upgrade_command


def _admin_flags(default_control: str) -> argparse.ArgumentParser:
    """The flags every admin command takes, as a parent parser (``parents=[admin]``)."""
    c = argparse.ArgumentParser(add_help=False)
    c.add_argument("--control", default=default_control, help="control plane host:port (env LLMGW_CONTROL)")
    c.add_argument("--token", help="admin token (else --token-file, $LLMGW_ADMIN_TOKEN, .llmgw/admin.token)")
    c.add_argument("--token-file", help="file holding the admin token (env LLMGW_ADMIN_TOKEN_FILE)")
    c.add_argument("--json", action="store_true", help="print the API response as JSON")
    c.add_argument(
        "--tls-dir", help="ca.crt and an admin-NAME.crt/.key (env LLMGW_TLS_DIR; default .llmgw/tls)"
    )
    c.add_argument("--tls-ca", help="the cluster CA file (instead of --tls-dir's ca.crt)")
    c.add_argument("--tls-cert", help="the certificate to call with (instead of --tls-dir's admin-*.crt)")
    c.add_argument("--tls-key", help="that certificate's key")
    c.add_argument("--plaintext", action="store_true", help="no TLS: a cluster with tls.plaintext only")
    return c


def _change_flags(c: argparse.ArgumentParser) -> None:
    c.add_argument("-m", "--reason", default="", help="why: kept with the version (default: a summary)")
    c.add_argument("--author", default="", help="who: kept with the version (default: $USER@host)")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmgw", description="llmgw operator CLI")
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="start a local cluster (etcd, control, router, 2 agents, demo model)")
    up.add_argument("--state-dir", default=".llmgw", help="configs, logs and etcd data (default .llmgw)")
    up.add_argument("--router-port", type=int, default=8080)
    up.add_argument("--control-port", type=int, default=50051)
    up.add_argument(
        "--console-port",
        type=int,
        default=8081,
        help="the control plane's HTTP port: web console and REST API",
    )
    up.add_argument("--etcd-port", type=int, default=23790, help="client port; the peer port is one above")
    up.add_argument("--agents", type=int, default=2, choices=range(1, 9), metavar="N")
    up.add_argument("--gpus-per-agent", type=int, default=2, choices=range(1, 17), metavar="N")
    up.add_argument("--replicas", type=int, default=2, help="replicas of the demo model")
    up.add_argument("--ready-timeout", type=float, default=90.0)
    up.add_argument("--auth", choices=["none", "keys"], default="none", help="require client API keys")
    up.add_argument(
        "--plaintext", action="store_true", help="development only: no TLS and no identities on gRPC links"
    )

    admin = _admin_flags(os.environ.get("LLMGW_CONTROL", "127.0.0.1:50051"))
    for name, text in [
        ("status", "leader, counts and revisions"),
        ("models", "models and where their replicas stand"),
        ("nodes", "nodes, GPUs and engines"),
        ("replicas", "replicas and their state"),
        ("routers", "routers reporting to the leader: load, requests and errors"),
    ]:
        c = sub.add_parser(name, help=text, parents=[admin])
        if name == "replicas":
            c.add_argument("--model", default="", help="only this model's replicas")
        if name == "nodes":
            c.add_argument(
                "action",
                nargs="?",
                default="list",
                choices=[
                    "list",
                    "hold",
                    "release",
                    "label",
                    "domains",
                    "upgrade",
                    "join-token",
                    "fabric-test",
                ],
                help="list (default); hold NODE: drain it; release NODE; label NODE KEY=VALUE ...; "
                "hold|release --domain LABEL=VALUE: a rack, row, power feed, zone; domains: the held "
                "domains; upgrade [NODE ...] --version V --command PATH: roll agents to a new version, "
                "one node at a time; join-token create|list|revoke ID: tokens new nodes join with "
                "(docs/security.md); fabric-test A B [C ...] | --all: bandwidth and latency between nodes",
            )
            c.add_argument(
                "node",
                nargs="?",
                default="",
                help="the node to hold, release, label or upgrade; join-token: the action",
            )
            c.add_argument(
                "labels",
                nargs="*",
                default=[],
                help="label: KEY=VALUE pairs to set; upgrade: more nodes; join-token revoke: ID",
            )
            c.add_argument(
                "--ttl", default="24h", help="join-token create: valid for (90, 30m, 24h, 7d; at most 30d)"
            )
            c.add_argument(
                "--uses", type=int, default=1, help="join-token create: joins it allows (default 1)"
            )
            c.add_argument(
                "--for-node", default="", metavar="NODE", help="join-token create: only this node id"
            )
            c.add_argument(
                "--replace",
                action="store_true",
                help="join-token create --for-node NODE: may take over NODE's live identity (revokes it)",
            )
            c.add_argument(
                "--host",
                action="append",
                default=[],
                help="join-token create: a host the node's certificate may name (repeatable; default none: "
                "the node publishes on the address it connects from)",
            )
            c.add_argument("--description", default="", help="join-token create: a note shown by list")
            c.add_argument("--version", default="", help="upgrade: the version the new agent reports")
            c.add_argument(
                "--command",
                dest="agent_command",
                default="",
                help="upgrade: the new agent's program on each node, absolute (and any leading args)",
            )
            c.add_argument(
                "--timeout",
                type=float,
                default=60.0,
                help="upgrade: seconds a node's new agent has to be back",
            )
            c.add_argument("--reason", default="", help="hold: why (shown with the node)")
            c.add_argument(
                "--domain", default="", metavar="LABEL=VALUE", help="hold|release every node with this label"
            )
            c.add_argument(
                "--drain",
                action="store_true",
                help="hold --domain: also move its replicas out (without gaps)",
            )
            c.add_argument("--remove", action="append", default=[], metavar="KEY", help="label: remove KEY")
            c.add_argument("--all", action="store_true", help="fabric-test: every pair of connected nodes")
            c.add_argument(
                "--bytes", type=int, default=0, help="fabric-test: bytes sent per pair (default 64 MiB)"
            )
            c.add_argument(
                "--pings", type=int, default=0, help="fabric-test: round trips per pair (default 20)"
            )
    e = sub.add_parser(
        "explain", help="why a model is placed where it is, or cannot be, node by node", parents=[admin]
    )
    e.add_argument("model", help="model name or alias")
    u = sub.add_parser(
        "usage",
        help="what each owner (org/team/project) holds against its quotas, GPU-hours, requests and tokens",
        parents=[admin],
    )
    u.add_argument("--owner", default="", help="only this owner path and the scopes under it")
    u.add_argument(
        "--period",
        default="",
        metavar="DURATION",
        help="requests and tokens over the last 90s, 15m, 2h, 1d (default: since the leader's term began)",
    )

    m = sub.add_parser("model", help="add, change, scale or remove a model added at runtime")
    msub = m.add_subparsers(dest="action", required=True)
    for action, target_help, text in [
        ("add", "a YAML or JSON model document file ('-': stdin)", "add a model"),
        ("update", "a YAML or JSON model document file ('-': stdin)", "replace a model's document"),
        ("get", "NAME (or alias)", "print a model's document"),
        ("remove", "NAME", "remove a model (traffic leaves first, then replicas stop)"),
        ("edit", "NAME", "edit a model's document in $EDITOR"),
        ("scale", "NAME", "change a model's scaling bounds"),
        ("set", "NAME", "set fields of a model's document: KEY=VALUE ..."),
        ("unset", "NAME", "remove fields of a model's document: KEY ..."),
    ]:
        c = msub.add_parser(action, help=text, parents=[admin])
        c.add_argument("target", help=target_help)
        if action == "scale":
            c.add_argument("--min", type=int, help="replicas kept running (0: on demand)")
            c.add_argument("--max", type=int, help="upper bound")
            c.add_argument("--idle-timeout", type=float, help="seconds idle before an on-demand model stops")
        if action in ("set", "unset"):
            c.add_argument(
                "pairs", nargs="+", metavar="KEY=VALUE" if action == "set" else "KEY", help="dotted paths"
            )

    st = sub.add_parser("settings", help="the cluster settings: show, change, history, rollback")
    ssub = st.add_subparsers(dest="action", required=True)
    c = ssub.add_parser("show", help="print the settings (the newest version)", parents=[admin])
    c.add_argument("--version", type=int, default=0, help="another version")
    c.add_argument("--effective", action="store_true", help="with every default filled in")
    c = ssub.add_parser("get", help="print one setting (defaults included)", parents=[admin])
    c.add_argument("key", help="a key or dotted path (models.0.name)")
    c = ssub.add_parser("set", help="change settings: KEY=VALUE ... (values are YAML)", parents=[admin])
    c.add_argument("pairs", nargs="+", metavar="KEY=VALUE")
    _change_flags(c)
    c = ssub.add_parser("unset", help="back to the default: KEY ...", parents=[admin])
    c.add_argument("keys", nargs="+", metavar="KEY")
    _change_flags(c)
    c = ssub.add_parser("edit", help="edit the settings in $EDITOR", parents=[admin])
    _change_flags(c)
    c = ssub.add_parser("history", help="every version: who, when, what changed, why", parents=[admin])
    c.add_argument("--limit", type=int, default=0, help="only the newest N")
    c = ssub.add_parser("rollback", help="make an earlier version the newest again", parents=[admin])
    c.add_argument("version", type=int)
    _change_flags(c)

    lg = sub.add_parser(
        "logs", help="the last lines of a replica's engine log (asked of its node's agent)", parents=[admin]
    )
    lg.add_argument("replica", help="replica id (see llmgw replicas)")
    lg.add_argument("-n", "--lines", type=int, default=100, help="how many lines (default 100, max 10000)")
    lg.add_argument("--node", default="", help="the node, for a replica that failed and was replaced")
    w = sub.add_parser("weights", help="list, fetch or remove weights in nodes' caches", parents=[admin])
    w.add_argument("action", nargs="?", default="list", choices=["list", "fetch", "remove"])
    w.add_argument("node", nargs="?", default="", help="list: only this node; fetch/remove: the node")
    w.add_argument("target", nargs="?", default="", help="fetch: hf://ORG/NAME[@REV] or a path; remove: NAME")
    w.add_argument("--name", default="", help="fetch: the entry's name (default from the source)")
    k = sub.add_parser("keys", help="create, list or revoke client API keys")
    ks = k.add_subparsers(dest="action", required=True)
    create = ks.add_parser("create", help="make a key; its secret is printed once", parents=[admin])
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
    ks.add_parser("list", help="keys: id, name, prefix, models, limits", parents=[admin])
    revoke = ks.add_parser(
        "revoke", help="revoke a key by id or name; every router refuses it within a second", parents=[admin]
    )
    revoke.add_argument("key", help="key id (k-...) or name")
    pr = sub.add_parser(
        "peers", help="federated peer clusters: list (health, models offered), add, remove", parents=[admin]
    )
    pr.add_argument("action", nargs="?", default="list", choices=["list", "add", "remove"])
    pr.add_argument("name", nargs="?", default="", help="add/remove: the peer's name")
    pr.add_argument("--url", default="", help="add: the peer's router URL, without /v1")
    pr.add_argument("--key-file", default="", help="add: file holding a client API key of the peer's")
    pr.add_argument(
        "--model",
        dest="models",
        action="append",
        default=[],
        help="add: a model to offer (repeatable; default: all)",
    )
    pr.add_argument("--send-tags", action="store_true", help="add: tag requests with this cluster's name")
    _change_flags(pr)
    add_certs_parser(sub, admin)
    return p


def _up(args: argparse.Namespace) -> int:
    cluster = LocalCluster(
        state_dir=Path(args.state_dir).resolve(),
        ports=Ports(
            router=args.router_port, control=args.control_port, etcd=args.etcd_port, console=args.console_port
        ),
        agents=args.agents,
        gpus_per_agent=args.gpus_per_agent,
        replicas=args.replicas,
        ready_timeout=args.ready_timeout,
        auth=args.auth,
        plaintext=args.plaintext,
    )
    stopping = False

    def on_signal(signum, frame):
        nonlocal stopping
        if not stopping:
            stopping = True
            raise KeyboardInterrupt

    # Both set here, SIGINT too: Python turns SIGINT into KeyboardInterrupt only when it was not
    # ignored at start, and a shell starts a background job (`llmgw up &`, a CI step) with SIGINT
    # ignored; Ctrl-C or `kill -INT` would then leave the cluster running.
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        cluster.start()
        url = cluster.router_url
        cluster_flags = "--plaintext" if args.plaintext else f"--tls-dir {cluster.tls_dir}"
        keys_hint = (
            "  Client keys are required (auth: keys). Make one; its secret is printed once:\n"
            f"    llmgw keys create --name me --control {cluster.control_address} {cluster_flags}\n"
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
            + f"  llmgw status --control {cluster.control_address} {cluster_flags}\n"
            f"  console and REST API: {cluster.console_url}/ (sign in with {cluster.token_file})\n"
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


# Each command group takes the parsed arguments and returns what to print.
_COMMANDS: dict[str, Callable[[argparse.Namespace], str]] = {
    "status": admin_run,
    "models": admin_run,
    "nodes": admin_run,
    "replicas": admin_run,
    "routers": admin_run,
    "explain": explain,
    "usage": usage,
    "model": model_command,
    "settings": settings_command,
    "logs": logs_command,
    "weights": weights_command,
    "keys": keys_command,
    "peers": peers_command,
    "certs": certs_command,
}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "up":
        return _up(args)
    command = _COMMANDS[args.command]
    if args.command == "nodes" and args.action == "join-token":
        command = join_token_command
    elif args.command == "nodes" and args.action == "upgrade":
        command = upgrade_command
    elif args.command == "nodes" and args.action != "list":
        command = node_command
    try:
        print(command(args))
    except AdminError as err:
        print(f"llmgw {args.command}: {err}", file=sys.stderr)
        return 1
    return 0


def run() -> None:
    """The ``llmgw`` command: :func:`main` as a process."""
    if sys.argv[1:2] != ["up"]:
        # `llmgw settings show | head` ends quietly, as other commands' output does.
        # Here, not in main(): tests call main() in their own process, which must
        # keep Python's SIGPIPE handling (a write to a closed socket raises).
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())


if __name__ == "__main__":
    run()
