"""docs/configuration.md is what scripts/gen_config_docs.py writes from the schemas."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_configuration_reference_is_current():
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_config_docs.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr


def test_every_key_says_what_it_is_for():
    text = (ROOT / "docs" / "configuration.md").read_text()
    undescribed = [
        line.split("|")[1].strip()
        for line in text.splitlines()
        if line.startswith("| `") and line.rstrip().endswith("|  |")
    ]
    assert not undescribed, f"keys with no comment or description in their schema: {undescribed}"
