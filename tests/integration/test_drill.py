"""`lazarus drill all` end to end: every scenario on a fresh local cluster, invariants held."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

LAZARUS = Path(sys.executable).parent / "lazarus"

FIVE = "kill-node,kill-leader,partition-heal,etcd-member-loss,redis-restart"
"""The drills this test runs (``drill all`` adds duplicate-identity, complete-failure and
a 60 s chaos run; test_drill_chaos.py covers chaos within the test budget)."""


def test_the_drills_hold_every_invariant_and_write_their_report(tmp_path: Path) -> None:
    run_dir = tmp_path / "drill"
    proc = subprocess.run(
        [str(LAZARUS), "drill", FIVE, "--tasks", "16", "--run-dir", str(run_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    assert report["held"] is True
    assert report["mtls"] == "on"  # the local cluster runs mutual TLS, as every LocalCluster
    assert "mTLS: on" in proc.stderr
    drills = {d["scenario"]: d for d in report["drills"]}
    assert set(drills) == {
        "kill-node",
        "kill-leader",
        "partition-heal",
        "etcd-member-loss",
        "redis-restart",
    }
    for d in drills.values():
        assert (d["tasks_lost"], d["duplicate_completions"], d["wrong_results"]) == (0, 0, 0)
        # Judged from the tasks' own side effects, not the coordinator's bookkeeping.
        assert d["effects_checked"] is True
        assert d["effect_records"] > 0
        assert (d["safety_violations"], d["dup_exec"]) == (0, 0), d["violations"][:5]
    # partition-heal writes shared documents on both sides of the cut; the reconcile
    # session after the heal must be measured (this fails when the column is n/a).
    assert drills["partition-heal"]["reconcile_convergence_s"] is not None
    assert drills["partition-heal"]["shared_ops"] > 0
    assert drills["partition-heal"]["shared_mismatches"] == 0
    assert drills["kill-node"]["detection_s"] is not None
    assert drills["kill-node"]["recovery_s"] is not None
    assert drills["kill-node"]["tasks_moved"] >= 1
    assert drills["kill-leader"]["leader_failover_s"] is not None
    assert drills["partition-heal"]["detection_s"] is not None
    assert (run_dir / "timeline.png").stat().st_size > 10_000
    assert json.loads((run_dir / "report.json").read_text())["held"] is True
    print("\n" + proc.stderr[-2500:])
