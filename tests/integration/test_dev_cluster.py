"""`lazarus dev`: a whole cluster until Ctrl-C, and nothing left behind after it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LAZARUS = Path(sys.executable).parent / "lazarus"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def test_dev_prints_its_endpoints_serves_and_stops_everything_on_ctrl_c(tmp_path: Path) -> None:
    run_dir = tmp_path / "dev"
    # SIGINT at its default disposition (coreutils env): a job started in the
    # background by a non-interactive shell inherits it ignored.
    child = subprocess.Popen(
        [
            "env",
            "--default-signal=INT",
            str(LAZARUS),
            "dev",
            "--agents",
            "2",
            "--coordinators",
            "1",
            "--run-dir",
            str(run_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert child.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 60
        addresses = ""
        while time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"coordinators\s+(\S+)", line)
            if m:
                addresses = m.group(1)
            if "LAZARUS_COORDINATORS=" in line:
                break
        assert addresses, "".join(lines)
        env = dict(os.environ)  # the admin client certificate `lazarus dev` made (mTLS is on)
        for line in (run_dir / "tls" / "admin.env").read_text().splitlines():
            key, _, value = line.removeprefix("export ").partition("=")
            env[key] = value
        status = subprocess.run(
            [str(LAZARUS), "nodes", "--json", "--coordinators", addresses],
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
        )
        assert status.returncode == 0, status.stderr
        assert status.stdout.count("agent-") >= 2
        # etcd, redis-server, coordinators and agents: its direct children.
        children = subprocess.run(
            ["pgrep", "-P", str(child.pid)], capture_output=True, text=True
        ).stdout.split()
        descendants = [int(p) for p in children]
        assert len(descendants) >= 5, descendants
        os.killpg(child.pid, signal.SIGINT)
        child.wait(timeout=60)
        time.sleep(0.5)
        assert not [p for p in descendants if _alive(p)], "something it started still runs"
        assert (run_dir / "coordinator-0.log").exists()
        assert (run_dir / "agent-1.log").exists()
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(timeout=10)
