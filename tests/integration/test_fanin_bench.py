"""The fan-in benchmark runs end to end (small) and writes complete results.

Timings are not asserted (benchmarks measure, tests check behaviour). What is
checked: both placements were measured, every simulated node's heartbeats were
acked in both (through a follower, only a leader's ack can come back: the
Session is forwarded), and no stream ended. It starts its own etcd, Redis and
coordinator processes and stops them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "fanin_bench.py"
SMALL = [sys.executable, str(BENCH), "--nodes", "40", "--rounds", "1", "--hold-s", "3"]


@pytest.mark.timeout(180)
def test_small_fan_in_benchmark_measures_both_placements(tmp_path: Path) -> None:
    out = tmp_path / "fanin.json"
    readme = BENCH.parent / "README.md"
    before = readme.read_text()
    proc = subprocess.run(
        [*SMALL, "--out", str(out), "--no-readme"],
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["machine"]["cpus"] > 0
    assert {r["placement"] for r in result["rounds"]} == {"leader", "followers"}
    for r in result["rounds"]:
        assert r["nodes"] == 40
        # 40 nodes at one heartbeat per second for about 3 s
        assert r["acks_per_s"] > 20, r
        assert r["streams_ended"] == 0, r
        assert 0 < r["p50_ms"] <= r["p99_ms"]
        assert r["leader_cpu_us_per_heartbeat"] > 0
    followers = result["summary"]["followers"]
    assert followers["follower_cpu_us_per_heartbeat"] > 0
    assert result["leader_cpu_ratio"] > 0
    assert readme.read_text() == before
