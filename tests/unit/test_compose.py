"""compose.yaml is a valid dev cluster: docker-compose accepts it, every role has
an image, and every config it mounts validates against that role's schema."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from llmgw.agent.config import AgentConfig
from llmgw.common.config import load_config
from llmgw.control.config import ControlConfig
from llmgw.router.config import RouterConfig

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = {"control": ControlConfig, "router": RouterConfig, "agent": AgentConfig}


def _compose() -> str:
    found = shutil.which("docker-compose")
    if not found:
        pytest.fail("docker-compose is not installed; `make setup` installs Debian's docker-compose")
    return found


def test_docker_compose_config_accepts_compose_yaml():
    out = subprocess.run(
        [_compose(), "-f", str(ROOT / "compose.yaml"), "config"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    services = yaml.safe_load(out.stdout)["services"]
    assert set(services) == {"etcd", "control", "router", "agent-a", "agent-b"}


def test_each_role_has_an_image_and_a_valid_mounted_config():
    doc = yaml.safe_load((ROOT / "compose.yaml").read_text())
    for name, svc in doc["services"].items():
        if name == "etcd":
            continue
        role = name.split("-")[0]
        build = svc.get("build") or doc["x-agent"]["build"]
        assert (ROOT / build["dockerfile"]).exists(), f"{name}: {build['dockerfile']} is missing"
        mounts = [v.split(":")[0] for v in svc["volumes"] if v.startswith("./")]
        assert mounts, f"{name} mounts no config"
        for m in mounts:
            load_config(ROOT / m, SCHEMAS[role])
