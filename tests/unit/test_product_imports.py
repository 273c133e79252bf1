"""The product never imports the development tooling (``lazarus_dev``).

The servers, the SDK, the client and the servers' and operators' commands are
imported in a fresh interpreter; no ``lazarus_dev`` module may come with them.
The whole CLI (``lazarus.cli.app``) does list the dev commands, from
``lazarus_dev.cli`` only: no drill, cluster or simulator module is imported.
"""

from __future__ import annotations

import json
import subprocess
import sys

PRODUCT = [
    "coordinator.main",
    "coordinator.server",
    "node_agent.main",
    "node_agent.agent",
    "node_agent.sdk",
    "node_agent.langgraph",
    "lazarus.client",
    "lazarus.cli.servers",
    "lazarus.cli.operator",
    "reconcile",
]


def _imported(code: str) -> list[str]:
    probe = (
        f"{code}\nimport json, sys\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'lazarus_dev')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_product_imports_no_development_module() -> None:
    assert _imported("\n".join(f"import {m}" for m in PRODUCT)) == []


def test_the_whole_cli_imports_only_the_dev_command_definitions() -> None:
    assert _imported("from lazarus.cli import app") == ["lazarus_dev", "lazarus_dev.cli"]


def test_the_checker_sees_a_development_import() -> None:
    assert "lazarus_dev.netns" in _imported("import lazarus_dev.netns")
