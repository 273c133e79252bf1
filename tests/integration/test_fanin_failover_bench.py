"""The fan-in failover benchmark runs end to end (small) and writes complete results.

Timings are not asserted (benchmarks measure, tests check behaviour). What is
checked, from the simulated agents' side: with fan-in off every node was on
the leader and lost its Session with it; with fan-in on the followers kept
theirs (Reattach, none dropped) and no DEAD verdict was given. It starts its
own etcd, Redis and coordinators and stops them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "fanin_failover_bench.py"
SMALL = [sys.executable, str(BENCH), "--nodes", "30", "--hold-s", "3", "--after-s", "10"]


@pytest.mark.timeout(300)
def test_small_leader_crash_keeps_the_followers_sessions(tmp_path: Path) -> None:
    out = tmp_path / "fanin-failover.json"
    readme = BENCH.parent / "README.md"
    before = readme.read_text()
    proc = subprocess.run(
        [*SMALL, "--out", str(out), "--no-readme"],
        capture_output=True,
        text=True,
        timeout=290,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    off, on = result["runs"]
    assert (off["fan_in"], on["fan_in"]) == (False, True)
    # Without fan-in the followers redirect every agent to the leader: all 30 drop.
    assert off["sessions_dropped_on_victim"] == 30
    assert off["reattaches"] == 0
    # With it, the 20 agents on the followers keep their streams and say Hello again.
    assert on["sessions_dropped_on_victim"] == 10
    assert on["sessions_dropped_on_survivors"] == 0
    assert on["reattaches"] == 20
    assert on["dead_verdicts"] == 0
    assert readme.read_text() == before
