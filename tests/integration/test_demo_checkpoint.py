"""``lazarus demo checkpoint``: a real worker process, SIGKILLed, recovered, checked.

The command runs ``node_agent.demo_worker`` as a child process, kills it with
SIGKILL mid-run, reopens the store, restarts the worker and compares every
task's final state with a direct computation. Here it runs small (2 tasks x 600
items, a checkpoint every 50, one kill) with a fixed seed; the test then reopens
the store itself and checks the final states independently of the command's
own report.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lazarus.cli import app
from node_agent.checkpoint import Checkpoint, CheckpointStore, JsonCodec
from node_agent.demo_worker import ReplayMismatch, TaskState, direct_state, resume, task_ids

SEED = 7
TASKS = 2
ITEMS = 600
EVERY = 50


@pytest.mark.timeout(30)
def test_demo_kills_recovers_and_matches_the_direct_computation(tmp_path: Path) -> None:
    data_dir = tmp_path / "demo"
    args = ["demo", "checkpoint", "--data-dir", str(data_dir), "--tasks", str(TASKS)]
    args += ["--items", str(ITEMS), "--every", str(EVERY), "--kills", "1", "--seed", str(SEED)]
    started = time.monotonic()
    result = CliRunner().invoke(app, args)
    elapsed_s = time.monotonic() - started
    out = result.output
    assert result.exit_code == 0, f"seed={SEED}\n{out}\n{result.exception!r}"
    assert elapsed_s < 30, f"the small demo took {elapsed_s:.1f} s"

    # a real kill of a real process
    assert re.search(r"SIGKILL \(signal 9\) → pid \d+, exit status -9", out), out
    # every task recovered from a checkpoint, with journal replay after it
    for task in task_ids(TASKS):
        row = re.search(rf"^\s*{task}\s+1\s+{task}@(\d+)\s+([\d,]+)\s+([\d,]+)\s", out, re.M)
        assert row is not None, f"no recovery row for {task}:\n{out}"
        assert int(row.group(1)) >= 1
        assert int(row.group(2).replace(",", "")) % EVERY == 0
    assert "0 acknowledged items lost" in out
    assert "0 corrupt" in out
    assert out.count("PASS") == TASKS + 1  # one per task, one verdict
    assert "FAIL" not in out

    # check the final states ourselves, not only through the command's report
    with CheckpointStore(data_dir) as store:
        assert store.verify().ok
        for task in task_ids(TASKS):
            latest = store.load_latest(task)
            assert latest is not None
            assert latest.info.terminal
            assert TaskState.from_payload(latest.payload) == direct_state(task, ITEMS)
            assert len(store.replay(task)) == ITEMS  # every item journaled exactly once
            heads = {h.task_id: h for h in store.task_heads()}
            assert heads[task].epoch == 2  # one restart after the kill: a new incarnation


def test_demo_refuses_a_data_dir_that_holds_a_store(tmp_path: Path) -> None:
    with CheckpointStore(tmp_path) as store:
        store.append("demo-1", b"{}", epoch=1)
    result = CliRunner().invoke(app, ["demo", "checkpoint", "--data-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "already holds a checkpoint store" in result.output


def test_resume_rejects_a_journal_event_that_does_not_recompute(tmp_path: Path) -> None:
    with CheckpointStore(tmp_path) as store:
        state = TaskState.initial("demo-1")
        seq = store.append("demo-1", JsonCodec.encode({"i": 1, "digest": "00" * 32}), epoch=1)
        store.save(Checkpoint("demo-1", 1, state.to_payload(), covers_journal_seq=0))
        with pytest.raises(ReplayMismatch, match="item 1: journal digest 0000"):
            resume(store, "demo-1", items=3, every=1, epoch=2, work_ms=0)
        assert seq == 1


def test_demo_exits_non_zero_when_a_final_state_differs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def off_by_one(task_id: str, items: int) -> TaskState:
        state = direct_state(task_id, items)
        return TaskState(task_id, state.done, state.digest, state.total + 1, state.journal_seq)

    monkeypatch.setattr("node_agent.demo_worker.direct_state", off_by_one)
    args = ["demo", "checkpoint", "--data-dir", str(tmp_path / "d"), "--tasks", "1"]
    result = CliRunner().invoke(app, [*args, "--items", "100", "--every", "10", "--kills", "0"])
    assert result.exit_code == 1, result.output
    assert "FAIL" in result.output
    assert "demo-1: final state differs from the direct computation" in result.output
