"""The leader-change benchmark runs end to end (--quick: 50 real agents) with no false DEAD.

Keeps ``bench/leader_change_bench.py`` from rotting between benchmark runs and
checks issue 16 item 9 at a small size: a SIGKILLed and a SIGTERMed leader, 50
real ``NodeAgent`` instances, no DEAD verdict. On a timeout the benchmark gets
SIGTERM first, so it stops its etcd, Redis, coordinator and worker processes by
pid itself; SIGKILL follows only if it does not exit.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from bench_support import run_quick

BOUND_S = 90


@pytest.mark.timeout(BOUND_S + 40)
def test_quick_benchmark_no_false_dead(tmp_path: Path) -> None:
    out = tmp_path / "leader_change.json"
    run_quick("leader_change_bench.py", out, BOUND_S)
    result = json.loads(out.read_text())
    assert result["config"]["nodes"] == 50
    assert set(result["trials"]) == {"sigkill", "sigterm"}
    for name, trials in result["trials"].items():
        assert len(trials) == 1
        t = trials[0]
        assert t["signal"] == name
        assert t["new_leader"] is not None
        assert t["new_leader"] != t["old_leader"]
        assert t["new_leader_after_s"] > 0
        assert t["reconnected"] == 50, t
        assert t["all_reconnected_s"] is not None
        assert t["dead_verdicts_metric_new_leader"] == 0, t
        assert t["nodes_seen_dead"] == [], t
        assert t["events"]["node_dead_nodes"] == [], t
        assert t["false_dead"] == 0, t
        assert t["final_not_alive"] == 0, t
    assert result["trials"]["sigkill"][0]["old_leader_exit_code"] == -signal.SIGKILL
    assert all(s["passed"] for s in result["summary"].values())
