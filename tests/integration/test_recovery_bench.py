"""The recovery benchmark's trial runs end to end and its results serialise.

Timings are not asserted here (benchmarks measure, tests check behaviour); this
keeps ``bench/recovery_bench.py`` from rotting between benchmark runs. One
SIGKILL trial with 20 tasks on a fresh cluster (etcd, Redis, 3 coordinators, 3
node agents, all stopped by pid when the trial ends); checkpoints every second
instead of every 10 s, so the set-up does not wait long for the first one.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "bench" / "recovery_bench.py"
N_TASKS = 20


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("recovery_bench", BENCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(90)
async def test_one_kill_trial_measures_and_serialises(tmp_path: Path) -> None:
    bench = _bench()
    lines: list[str] = []
    trial = await bench.run_trial(
        tmp_path / "trial",
        N_TASKS,
        "kill",
        say=lines.append,
        payload={"seconds": 600, "checkpoints": 600},
    )
    assert lines, "progress lines"
    # Measured, and in the order the protocol implies: the closed stream is
    # suspected before the DEAD verdict, and the tasks move only after it.
    assert trial["suspect_s"] is not None
    assert trial["dead_s"] is not None
    assert 0 <= trial["suspect_s"] < trial["dead_s"]
    assert trial["recovery_s"] is not None
    assert trial["recovery_s"] >= 0
    assert trial["recovery_polled_s"] is not None
    assert trial["fault_to_running_s"] > trial["dead_s"]
    # Every task recovered: RUNNING at epoch 2 on a survivor, none lost, no data loss.
    assert trial["tasks_lost"] == 0
    assert trial["tasks_recovered"] == N_TASKS
    assert trial["tasks_failed"] == 0
    assert trial["tasks_moved"] == N_TASKS
    assert sum(trial["moved_to"].values()) == N_TASKS
    assert trial["final_epochs"] == {"2": N_TASKS}
    assert trial["resumed_from_redis"] == N_TASKS
    assert trial["redone_checkpoints"] == 0
    assert trial["resumed_below_replicated"] == 0
    # The results serialise, summary included.
    summary = bench.summarize([trial])
    assert summary["dead_s"]["p99"] == trial["dead_s"]
    out = tmp_path / "recovery.json"
    bench.write_json(out, {"groups": {"killx20": summary}, "samples": {"killx20": [trial]}})
    back = json.loads(out.read_text())
    assert back["samples"]["killx20"][0]["tasks_lost"] == 0
    assert back["machine"]["cpus"] > 0
    assert "| SIGKILL | 20 | 1 |" in bench.table({"killx20": summary})


@pytest.mark.timeout(90)
async def test_one_restart_trial_takes_the_tasks_over_at_epoch_plus_one(tmp_path: Path) -> None:
    """``--modes restart`` (issue [identity]): SIGKILL + start on the same data dir."""
    bench = _bench()
    lines: list[str] = []
    trial = await bench.run_restart_trial(tmp_path / "restart", N_TASKS, say=lines.append)
    assert lines, "progress lines"
    # The new process's Hello proved the old one stopped: no DEAD verdict was
    # waited for, every task runs again on the same node at epoch 2.
    assert trial["kill_to_hello_s"] is not None
    assert trial["hello_to_running_s"] is not None
    assert 0 <= trial["hello_to_running_s"] < bench.DEAD_AFTER_S
    assert trial["tasks_lost"] == 0
    assert trial["final_epochs"] == {"2": N_TASKS}
    assert trial["resumed_below_replicated"] == 0
    summary = bench.summarize_restart([trial])
    assert summary["hello_to_running_s"]["p99"] == trial["hello_to_running_s"]
    assert "Restart in place" in bench.restart_readme(
        {"groups": {f"restartx{N_TASKS}": summary}, "trials": 1, "samples": {}, "code": {}}
    )
