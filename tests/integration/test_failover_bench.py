"""The failover benchmark runs end to end and writes complete results.

Timings are not asserted here (benchmarks measure, tests check behaviour); this
keeps ``bench/failover_bench.py`` from rotting between benchmark runs. On a
timeout the benchmark gets SIGTERM first, so it stops its etcd and coordinator
processes by pid itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_support import run_quick

BOUND_S = 150


@pytest.mark.timeout(BOUND_S + 30)
def test_quick_benchmark_writes_both_modes(tmp_path: Path) -> None:
    out = tmp_path / "failover.json"
    run_quick("failover_bench.py", out, BOUND_S)
    result = json.loads(out.read_text())
    assert result["trials_per_signal"] == 2
    modes = result["modes"]
    assert set(modes) == {"sigkill", "sigterm"}
    for mode in modes.values():
        assert len(mode["samples_s"]) == 2
        assert all(s is not None and s > 0 for s in mode["samples_s"])
        assert len(mode["trials"]) == 2
        assert all(t["new_leader"] != t["old_leader"] for t in mode["trials"])
        assert mode["median_s"] > 0
        assert mode["max_s"] > 0
        assert mode["limit_s"] > 0
    assert modes["sigkill"]["limit_s"] == result["lease_ttl_s"] + 1
    assert modes["sigterm"]["limit_s"] == 1
    assert result["etcdctl_elect_listen"]["shows_new_leader"] is True
