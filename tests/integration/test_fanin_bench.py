"""The fan-in benchmark runs end to end (``--quick``) and writes complete results.

Timings are not asserted (benchmarks measure, tests check behaviour). What is
checked: both placements were measured, every simulated node's heartbeats were
acked in both (through a follower, only a leader's ack can come back: the
Session is forwarded), and no stream ended. It starts its own etcd, Redis and
coordinator processes and stops them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_support import run_quick


@pytest.mark.timeout(200)
def test_quick_fan_in_benchmark_measures_both_placements(tmp_path: Path) -> None:
    out = tmp_path / "fanin.json"
    run_quick("fanin_bench.py", out, bound_s=170)
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
