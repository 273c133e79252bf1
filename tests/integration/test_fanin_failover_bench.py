"""The fan-in failover benchmark runs end to end (``--quick``) and writes complete results.

Timings are not asserted (benchmarks measure, tests check behaviour). What is
checked, from the simulated agents' side: with fan-in off every node was on
the leader and lost its Session with it; with fan-in on the followers kept
theirs (Reattach, none dropped) and no DEAD verdict was given. It starts its
own etcd, Redis and coordinators and stops them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_support import run_quick


@pytest.mark.timeout(320)
def test_quick_leader_crash_keeps_the_followers_sessions(tmp_path: Path) -> None:
    out = tmp_path / "fanin-failover.json"
    run_quick("fanin_failover_bench.py", out, bound_s=280)
    result = json.loads(out.read_text())
    off, on = result["runs"]
    assert (off["fan_in"], on["fan_in"]) == (False, True)
    # Without fan-in the followers redirect every agent to the leader: all 30 drop.
    assert off["sessions_dropped_on_victim"] == 30
    assert off["reattaches"] == 0
    # With it, the 20 agents on the followers keep their streams and say Hello again.
    # (More on the leader: the followers sent agents away at start-up; by reason:)
    assert on["sessions_dropped_on_victim"] == 10, on["sessions_sent_away"]
    assert on["sessions_dropped_on_survivors"] == 0, on["survivor_end_reasons"]
    assert on["reattaches"] == 20
    assert on["dead_verdicts"] == 0
