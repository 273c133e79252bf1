"""Progress flush: Checkpointed updates of RUNNING tasks reach etcd in one write per interval.

``CoreSettings.progress_flush_interval_s``: a progress-only update is applied
in memory and acked at once, and written with every other held-back record on
the first tick one interval after the oldest of them; any state change, and a
record's first (replicated) checkpoint, is written at once and carries the
newest record.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from core_harness import Harness, directives, persisted_tasks

from coordinator.core import (
    CancelRequested,
    Checkpointed,
    CheckpointSummary,
    Completed,
    CoreSettings,
    LeadershipLost,
    MigrateRequested,
    PersistTasks,
    ResignRequested,
    Started,
    TaskRecord,
    TaskResult,
    TaskState,
    TaskUpdateAck,
    UpdateOutcome,
)

INTERVAL_S = 1.0


def running(tasks: int = 3, interval_s: float = INTERVAL_S, *, start: bool = True) -> Harness:
    """A leader with nodes a and b and ``tasks`` tasks t0..: ASSIGNED, or with ``start``
    RUNNING with a first replicated checkpoint (seq 1) in etcd."""
    h = Harness(CoreSettings(self_check=True, progress_flush_interval_s=interval_s))
    h.lead()
    h.hello("a")
    h.hello("b")
    for i in range(tasks):
        h.submit(f"r{i}", task_id=f"t{i}")
        if start:
            h.update(h.task(f"t{i}").owner_node_id, f"t{i}", 1, Started())
            assert seqs(persisted_tasks(checkpoint(h, f"t{i}", 1))) == {f"t{i}": 1}
    return h


def checkpoint(h: Harness, task_id: str, seq: int) -> list:
    """The owner reports checkpoint ``seq`` of ``task_id``, replicated, journal seq = 10 * seq."""
    task = h.task(task_id)
    ckpt = CheckpointSummary(f"{task_id}@{seq}", epoch=task.epoch, seq=seq, replicated=True)
    change = Checkpointed(ckpt, journal_seq=10 * seq, replicated_journal_seq=10 * seq)
    return h.update(task.owner_node_id, task_id, task.epoch, change)


def idle(h: Harness, until_s: float) -> list:
    """Ticks up to ``until_s`` while both nodes heartbeat."""
    return h.run_until(until_s, heartbeating=("a", "b"))


def accepted(commands: list) -> bool:
    return [a.outcome for a in directives(commands, TaskUpdateAck)] == [UpdateOutcome.ACCEPTED]


def persists(commands: list) -> list[PersistTasks]:
    return [c for c in commands if isinstance(c, PersistTasks)]


def seqs(records: list[TaskRecord]) -> dict[str, int]:
    return {
        r.task_id: r.last_replicated_checkpoint.seq if r.last_replicated_checkpoint else 0
        for r in records
    }


def test_progress_of_running_tasks_is_written_in_one_persist_per_interval() -> None:
    h = running(3)
    for i, at in enumerate((1.0, 1.2, 1.4)):
        commands = checkpoint(h.at(at), f"t{i}", 2)
        assert accepted(commands)
        assert persists(commands) == []  # acked, held back
        assert h.task(f"t{i}").last_replicated_checkpoint.seq == 2  # applied in memory
    checkpoint(h.at(1.5), "t0", 3)  # a newer one of t0 replaces the held-back one
    held = idle(h, 1.95)
    assert persists(held) == []
    due = idle(h, 2.0)  # one interval after the oldest (t0 at 1.0)
    assert len(persists(due)) == 1
    assert seqs(persisted_tasks(due)) == {"t0": 3, "t1": 2, "t2": 2}
    assert persisted_tasks(due) == [h.task(f"t{i}") for i in range(3)]  # the newest records
    assert persists(idle(h, 5.0)) == []  # nothing left to write

    # 10 s of updates every 0.25 s per task (120): a write at most once per
    # interval, each carrying all three tasks, none later than interval + a tick.
    written_at: list[float] = []
    t, seq = 5.0, 3
    while t < 15.0:
        seq += 1
        for i in range(3):
            assert persists(checkpoint(h.at(t), f"t{i}", seq)) == []
        h.heartbeat("a")
        h.heartbeat("b")
        for _ in range(2):
            h.at(round(h.now + 0.125, 9))
            for w in persists(h.tick()):
                assert seqs(list(w.records)) == {"t0": seq, "t1": seq, "t2": seq}
                written_at.append(h.now)
        t += 0.25
    gaps = [b - a for a, b in itertools.pairwise(written_at)]
    assert 8 <= len(written_at) <= 10
    assert all(INTERVAL_S <= gap <= INTERVAL_S + 0.25 for gap in gaps), gaps


def test_a_checkpoint_that_starts_an_assigned_task_is_written_at_once() -> None:
    h = running(1, start=False)
    assert h.task("t0").state is TaskState.ASSIGNED
    commands = checkpoint(h.at(1.0), "t0", 1)
    assert accepted(commands)
    assert [(r.state, seqs([r])["t0"]) for r in persisted_tasks(commands)] == [
        (TaskState.RUNNING, 1)
    ]
    assert persists(idle(h, 3.0)) == []  # nothing held back


def test_the_first_checkpoint_and_the_first_replicated_one_are_written_at_once() -> None:
    h = running(1, start=False)
    owner = h.task("t0").owner_node_id
    h.update(owner, "t0", 1, Started())
    local = CheckpointSummary("t0@1", epoch=1, seq=1)
    first = h.at(1.0).update(owner, "t0", 1, Checkpointed(local, journal_seq=5))
    assert [r.last_checkpoint for r in persisted_tasks(first)] == [local]
    second = h.at(1.1).update(owner, "t0", 1, Checkpointed(replace(local, seq=2), 6))
    assert persists(second) == []  # local progress only: held back
    assert seqs(persisted_tasks(checkpoint(h.at(1.2), "t0", 3))) == {"t0": 3}  # first replicated
    assert persists(checkpoint(h.at(1.3), "t0", 4)) == []


def test_a_state_change_writes_the_newest_record_and_the_flush_never_writes_an_older_one() -> None:
    h = running(2)
    checkpoint(h.at(1.0), "t0", 2)
    checkpoint(h.at(1.0), "t1", 2)
    checkpoint(h.at(1.1), "t0", 3)  # held back
    done = h.at(1.2).update(
        h.task("t0").owner_node_id, "t0", 1, Completed(TaskResult(b"ok", size_bytes=2))
    )
    [final] = persisted_tasks(done)
    assert final.state is TaskState.COMPLETED
    assert seqs([final]) == {"t0": 3}  # the progress held back went with it
    later = idle(h, 3.0)
    # The flush writes t1 only: never t0's held-back RUNNING record over COMPLETED.
    assert [r.task_id for r in persisted_tasks(later)] == ["t1"]

    # A move annotation writes t1 at once; progress after it is held back again
    # and flushed on its own: the last write of t1 is its newest record.
    checkpoint(h.at(3.1), "t1", 3)
    moved = h.at(3.2).step(MigrateRequested("m1", "t1", h.now))
    [annotated] = persisted_tasks(moved)
    assert annotated.move is not None
    assert seqs([annotated]) == {"t1": 3}
    checkpoint(h.at(3.3), "t1", 4)
    flushed = idle(h, 5.0)
    assert persisted_tasks(flushed)[-1] == h.task("t1")
    assert seqs(persisted_tasks(flushed)) == {"t1": 4}


def test_a_cancel_in_the_same_interval_is_not_undone_by_the_flush() -> None:
    h = running(1)
    checkpoint(h.at(1.0), "t0", 2)
    cancelled = h.at(1.5).step(CancelRequested("c1", "t0", h.now))
    assert [r.state for r in persisted_tasks(cancelled)] == [TaskState.CANCELLED]
    assert persists(idle(h, 4.0)) == []


def test_interval_zero_writes_every_update_at_once() -> None:
    h = running(2, interval_s=0.0)
    for seq in (2, 3, 4):
        commands = checkpoint(h.at(float(seq)), "t0", seq)
        assert accepted(commands)
        assert seqs(persisted_tasks(commands)) == {"t0": seq}


def test_a_lost_leadership_drops_held_back_progress_and_a_new_leader_sees_it_older() -> None:
    h = running(1)
    etcd: dict[str, TaskRecord] = {}

    def apply(commands: list) -> None:
        for r in persisted_tasks(commands):
            etcd[r.task_id] = r

    h.after_step = apply
    checkpoint(h.at(1.0), "t0", 2)
    idle(h, 2.0)
    assert seqs([etcd["t0"]]) == {"t0": 2}
    checkpoint(h.at(2.5), "t0", 3)  # held back when the leader goes
    h.step(LeadershipLost(h.now))
    nodes = h.core.snapshot().nodes  # empty: a follower forgets everything
    assert nodes == ()
    successor = Harness(CoreSettings(self_check=True), now_s=h.now)
    successor.lead(term=2, tasks=[etcd["t0"]])
    # Older than the old leader knew (3), never newer: DATA_LOSS checks only weaken.
    assert seqs([successor.task("t0")]) == {"t0": 2}


def test_a_resign_request_writes_the_held_back_progress_at_once() -> None:
    h = running(2)
    checkpoint(h.at(1.0), "t0", 2)
    checkpoint(h.at(1.1), "t1", 2)
    flushed = h.at(1.2).step(ResignRequested(h.now))
    assert len(persists(flushed)) == 1
    assert seqs(persisted_tasks(flushed)) == {"t0": 2, "t1": 2}
    assert persists(idle(h, 3.0)) == []  # nothing left for the tick
    assert persists(h.step(ResignRequested(h.now))) == []  # nothing held back: no write
    h.step(LeadershipLost(h.now))
    assert h.step(ResignRequested(h.now)) == []  # a follower has nothing to write
