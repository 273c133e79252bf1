"""The drills' invariant checker: clean logs hold, each kind of violating log fails."""

from __future__ import annotations

import json
from pathlib import Path

from lazarus_dev.drill_invariants import (
    EffectRecord,
    ViolationKind,
    check,
    effect_line,
    parse_records,
    pauses,
    read_sink,
)


def rec(
    t: float,
    ev: str,
    step: int,
    *,
    epoch: int = 1,
    pid: int = 100,
    node: str = "a0",
    task: str = "t1",
) -> EffectRecord:
    return EffectRecord(t=t, pid=pid, node=node, task=task, epoch=epoch, ev=ev, step=step)


def run(
    t0: float,
    *,
    epoch: int,
    pid: int,
    node: str,
    start: int,
    end: int,
    every: int = 2,
    done: bool = True,
    task: str = "t1",
) -> list[EffectRecord]:
    """One handler run: start, steps start..end-1 (checkpoint every ``every``), maybe done."""
    out = [rec(t0, "start", start, epoch=epoch, pid=pid, node=node, task=task)]
    t = t0
    for i in range(start, end):
        t += 0.01
        out.append(rec(t, "step", i, epoch=epoch, pid=pid, node=node, task=task))
        if (i + 1) % every == 0:
            out.append(rec(t + 0.001, "ckpt", i + 1, epoch=epoch, pid=pid, node=node, task=task))
    if done:
        out.append(rec(t + 0.005, "done", end, epoch=epoch, pid=pid, node=node, task=task))
    return out


def kinds(records: list[EffectRecord]) -> set[ViolationKind]:
    return {v.kind for v in check(records).violations}


def test_an_uninterrupted_task_and_a_clean_move_hold() -> None:
    clean = run(0.0, epoch=1, pid=1, node="a0", start=0, end=10)
    moved = run(10.0, epoch=1, pid=1, node="a0", start=0, end=5, done=False, task="t2")
    moved += run(11.0, epoch=2, pid=2, node="a1", start=4, end=10, task="t2")
    report = check(clean + moved)
    assert report.held, report.violations
    assert report.tasks == 2
    assert report.executions == {"t1": 1, "t2": 1}
    assert report.dup_exec == 0


def test_two_processes_at_one_epoch_fail() -> None:
    one = run(0.0, epoch=1, pid=1, node="w0", start=0, end=10)
    two = run(0.05, epoch=1, pid=2, node="w0", start=0, end=10)
    report = check(one + two)
    assert not report.held
    assert ViolationKind.TWO_OWNERS in {v.kind for v in report.violations}
    assert report.dup_exec == 1
    assert ViolationKind.DUPLICATE_EXECUTION in {v.kind for v in report.violations}


def test_a_restart_at_the_same_epoch_by_another_process_fails_even_when_sequential() -> None:
    first = run(0.0, epoch=1, pid=1, node="w0", start=0, end=4, done=False)
    second = run(5.0, epoch=1, pid=2, node="w0", start=4, end=10)
    assert kinds(first + second) == {ViolationKind.TWO_OWNERS}


def test_an_epoch_going_down_fails() -> None:
    recs = run(0.0, epoch=2, pid=1, node="a0", start=0, end=4, done=False)
    recs += run(1.0, epoch=1, pid=2, node="a1", start=4, end=10)
    assert ViolationKind.EPOCH_REGRESSED in kinds(recs)


def test_a_step_of_the_old_epoch_after_the_new_one_began_fails() -> None:
    old = run(0.0, epoch=1, pid=1, node="a0", start=0, end=3, done=False)
    new = run(1.0, epoch=2, pid=2, node="a1", start=2, end=10)
    zombie = [rec(1.5, "step", 3, epoch=1, pid=1, node="a0")]
    report = check(old + new + zombie)
    assert {v.kind for v in report.violations} == {ViolationKind.STALE_STEP}
    assert "step 3 at epoch 1" in str(report.violations[0])


def test_a_completion_executed_twice_fails_and_is_counted() -> None:
    recs = run(0.0, epoch=1, pid=1, node="a0", start=0, end=4)
    recs += run(1.0, epoch=2, pid=2, node="a1", start=4, end=4)
    report = check(recs)
    assert report.executions["t1"] == 2
    assert report.dup_exec == 1
    assert {v.kind for v in report.violations} == {ViolationKind.DUPLICATE_EXECUTION}


def test_resuming_before_an_acknowledged_checkpoint_fails() -> None:
    recs = run(0.0, epoch=1, pid=1, node="a0", start=0, end=6, done=False)  # ckpt at 6
    recs += run(1.0, epoch=2, pid=2, node="a1", start=2, end=10)
    report = check(recs)
    assert {v.kind for v in report.violations} == {ViolationKind.PROGRESS_LOST}
    assert report.counts()["PROGRESS_LOST"] == 1


def test_resuming_past_the_checkpoint_from_a_replicated_journal_holds() -> None:
    recs = run(0.0, epoch=1, pid=1, node="a0", start=0, end=5, done=False)  # ckpt at 4
    recs += run(1.0, epoch=2, pid=2, node="a1", start=5, end=10)
    assert check(recs).held


def test_torn_and_foreign_lines_are_skipped(tmp_path: Path) -> None:
    line = effect_line(t=1.0, pid=3, node="a0", task="t9", epoch=1, ev="step", step=0)
    (tmp_path / "effects-a0-3.jsonl").write_text(
        line + json.dumps({"doc": "x"}) + "\n" + line[:20] + "\n"
    )
    records = read_sink(tmp_path)
    assert records == [EffectRecord(1.0, 3, "a0", "t9", 1, "step", 0)]
    assert read_sink(tmp_path, tasks={"other"}) == []
    assert parse_records(["", "not json", '{"t": 1}']) == []


def test_a_task_that_stood_still_past_a_step_plus_a_second_is_a_pause() -> None:
    steady = run(0.0, epoch=1, pid=1, node="a0", start=0, end=40)
    # t2 stops stepping for 1.5 s in its own process (a self-fence), then goes on.
    fenced = run(0.0, epoch=1, pid=1, node="a0", start=0, end=20, done=False, task="t2")
    fenced += run(1.7, epoch=1, pid=1, node="a0", start=20, end=40, task="t2")
    # t3 is moved: the 0.9 s between its owners is under a step plus 1 s.
    moved = run(0.0, epoch=1, pid=1, node="a0", start=0, end=10, done=False, task="t3")
    moved += run(1.0, epoch=2, pid=2, node="a1", start=10, end=20, task="t3")
    found = pauses(steady + fenced + moved)
    assert [(p.task, round(p.gap_s, 2)) for p in found] == [("t2", 1.51)]
    assert round(found[0].step_s, 3) == 0.01
    assert pauses(steady + moved) == []
