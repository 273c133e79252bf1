"""CoordinatorCore: MigrateRequested (live migration of one task to a chosen node).

A migration is a drain of one task: the owner gets a Release (MoveReason
MIGRATE, the target named), reports Released with its final replicated
checkpoint, and placement then puts the task on the target, not anywhere.
The transcript test at the end stores the whole exchange in
``transcripts/migrate_task_to_a_chosen_node.txt`` (regenerate with
``LAZARUS_UPDATE_TRANSCRIPTS=1``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from core_harness import Harness, directives, notices_of, of_type, persisted_tasks, render

from coordinator.core import (
    Assign,
    AssignReason,
    Checkpointed,
    CheckpointSummary,
    Completed,
    DrainRequested,
    HeartbeatAck,
    HeartbeatReceived,
    MigrateRequested,
    MoveReason,
    Release,
    Released,
    ReplyToRequest,
    Revoke,
    RevokeReason,
    SendDirective,
    Started,
    StatusCode,
    TaskProgress,
    TaskResult,
    TaskState,
    Tick,
)
from coordinator.core import notices as n
from coordinator.core.sim import SimConfig, Simulation

TRANSCRIPTS = Path(__file__).parent / "transcripts"


def three_nodes(*, seed: int = 0) -> Harness:
    """Leader with nodes a, b, c (4 slots each); task "t" RUNNING on a; c holds a filler task.

    The filler makes c the most loaded node, so ordinary placement would choose
    b: a task that lands on c did so because it was pinned there.
    """
    h = Harness(seed=seed)
    h.lead()
    h.at(0.1).hello("a")
    h.submit("r-t", task_id="t")
    h.update("a", "t", 1, Started())
    h.at(0.2).hello("c")
    h.submit("r-filler", task_id="filler")
    assert h.task("filler").owner_node_id == "c"
    h.at(0.3).hello("b")
    assert h.task("t").owner_node_id == "a"
    return h


def reply(commands: Sequence[object]) -> ReplyToRequest:
    replies = of_type(commands, ReplyToRequest)
    assert len(replies) == 1, replies
    return replies[0]


def test_migrate_releases_to_the_owner_and_places_on_the_target() -> None:
    h = three_nodes()
    commands = h.step(MigrateRequested("m-1", "t", h.now, target_node_id="c", reason="rebalance"))
    assert reply(commands).status is StatusCode.OK
    assert reply(commands).task_id == "t"
    releases = directives(commands, Release)
    assert [(r.task_id, r.epoch, r.reason, r.target_node_id) for r in releases] == [
        ("t", 1, MoveReason.MIGRATE, "c")
    ]
    task = h.task("t")
    assert task.move is not None
    assert (task.move.move_id, task.move.reason, task.move.target_node_id) == (
        "m-1",
        MoveReason.MIGRATE,
        "c",
    )
    assert [t.move for t in persisted_tasks(commands)] == [task.move]  # durable before the reply
    final = CheckpointSummary("t@3", epoch=1, seq=3, covers_journal_seq=11, replicated=True)
    moved = h.update("a", "t", 1, Released("m-1", final, journal_seq=14))
    task = h.task("t")
    assert (task.state, task.owner_node_id, task.epoch, task.attempt) == (
        TaskState.ASSIGNED,
        "c",
        2,
        1,
    )
    assert task.move is None
    assigns = directives(moved, Assign)
    assert len(assigns) == 1
    assign = assigns[0]
    assert (assign.reason, assign.move_reason, assign.previous_owner_node_id) == (
        AssignReason.MOVED,
        MoveReason.MIGRATE,
        "a",
    )
    assert assign.resume_from == final
    assert assign.replay_through_journal_seq == 14
    reassigned = notices_of(moved, n.TaskReassigned)
    assert [(r.from_node_id, r.to_node_id, r.reason, r.resume_seq) for r in reassigned] == [
        ("a", "c", MoveReason.MIGRATE, 3)
    ]
    started = h.update("c", "t", 2, Started(resumed_from=final))
    resumed = notices_of(started, n.TaskResumed)
    assert [(r.node_id, r.resumed_from_seq) for r in resumed] == [("c", 3)]


def test_migrate_without_a_target_avoids_the_current_owner() -> None:
    h = Harness()
    h.lead()
    h.at(0.1).hello("a", slots=1)
    h.submit("r", task_id="t")
    h.hello("b", slots=1)
    h.step(MigrateRequested("m", "t", h.now))
    h.update("a", "t", 1, Released("m"))
    assert h.task("t").owner_node_id == "b"


@pytest.mark.parametrize(
    ("build", "status", "fragment"),
    [
        (
            lambda h: MigrateRequested("m", "nope", h.now, target_node_id="b"),
            "NOT_FOUND",
            "task_id",
        ),
        (
            lambda h: MigrateRequested("m", "t", h.now, target_node_id="zz"),
            "NOT_FOUND",
            "target_node_id",
        ),
        (
            lambda h: MigrateRequested("m", "t", h.now, target_node_id="a"),
            "FAILED_PRECONDITION",
            "current owner",
        ),
        (
            lambda h: MigrateRequested("m", "t", h.now, target_node_id="b", expected_epoch=7),
            "ABORTED",
            "expected_epoch",
        ),
        (
            lambda h: MigrateRequested("m", "t", h.now, target_node_id="b", release_timeout_s=0.0),
            "INVALID_ARGUMENT",
            "release_timeout_ms",
        ),
    ],
)
def test_migrate_refusals(build: object, status: str, fragment: str) -> None:
    h = three_nodes()
    commands = h.step(build(h))  # type: ignore[operator]
    answer = reply(commands)
    assert answer.status is StatusCode[status]
    assert fragment in answer.message
    assert directives(commands, Release) == []
    assert persisted_tasks(commands) == []


def test_migrate_matching_epoch_is_accepted() -> None:
    h = three_nodes()
    ok = h.step(MigrateRequested("m", "t", h.now, target_node_id="b", expected_epoch=1))
    assert reply(ok).status is StatusCode.OK


def test_migrate_refuses_a_task_that_is_not_owned() -> None:
    h = three_nodes()
    h.update("a", "t", 1, Completed(TaskResult(b"x", size_bytes=1)))
    answer = reply(h.step(MigrateRequested("m", "t", h.now, target_node_id="b")))
    assert answer.status is StatusCode.FAILED_PRECONDITION
    assert "COMPLETED" in answer.message


def test_migrate_refuses_a_second_move_and_targets_that_cannot_take_it() -> None:
    h = three_nodes()
    assert reply(h.step(MigrateRequested("m1", "t", h.now, target_node_id="b"))).status is (
        StatusCode.OK
    )
    again = reply(h.step(MigrateRequested("m2", "t", h.now, target_node_id="c")))
    assert again.status is StatusCode.FAILED_PRECONDITION
    assert "already in progress" in again.message

    h = three_nodes()
    h.step(DrainRequested("d", "b", h.now))
    cordoned = reply(h.step(MigrateRequested("m", "t", h.now, target_node_id="b")))
    assert cordoned.status is StatusCode.FAILED_PRECONDITION
    assert "DRAINING" in cordoned.message or "cordoned" in cordoned.message

    h = three_nodes()
    h.close("b")
    gone = reply(h.step(MigrateRequested("m", "t", h.now, target_node_id="b")))
    assert gone.status is StatusCode.FAILED_PRECONDITION
    assert "not ALIVE" in gone.message

    h = Harness()
    h.lead()
    h.at(0.1).hello("a", slots=1)
    h.submit("r", task_id="t")
    h.hello("b", slots=1)
    h.submit("r2", task_id="t2")
    assert h.task("t2").owner_node_id == "b"
    full = reply(h.step(MigrateRequested("m", "t", h.now, target_node_id="b")))
    assert full.status is StatusCode.RESOURCE_EXHAUSTED

    h = Harness()
    h.lead()
    h.at(0.1).hello("a", labels=(("zone", "x"),))
    h.submit("r", task_id="t", node_selector=(("zone", "x"),))
    h.hello("b", labels=(("zone", "y"),))
    mismatch = reply(h.step(MigrateRequested("m", "t", h.now, target_node_id="b")))
    assert mismatch.status is StatusCode.FAILED_PRECONDITION
    assert "node_selector" in mismatch.message


def test_slots_of_a_migration_in_flight_are_reserved_on_the_target() -> None:
    h = Harness()
    h.lead()
    h.at(0.1).hello("a", slots=1)
    h.submit("r", task_id="t")
    h.hello("b", slots=1)
    assert reply(h.step(MigrateRequested("m", "t", h.now, target_node_id="b"))).status is (
        StatusCode.OK
    )
    # A new task does not take b's only slot while t is on its way there.
    h.submit("r2", task_id="late")
    assert h.task("late").state is TaskState.PENDING
    h.update("a", "t", 1, Released("m"))
    assert h.task("t").owner_node_id == "b"
    assert h.task("late").owner_node_id == "a"  # the slot t freed


def test_a_target_that_died_before_the_release_leaves_ordinary_placement() -> None:
    h = three_nodes()
    h.step(MigrateRequested("m", "t", h.now, target_node_id="c"))
    h.close("c")  # c is SUSPECT: it cannot take the task
    h.update("a", "t", 1, Released("m"))
    assert h.task("t").owner_node_id in ("a", "b")
    assert h.task("t").state is TaskState.ASSIGNED


def test_a_migration_release_timeout_revokes_then_resumes_on_the_target() -> None:
    h = three_nodes()
    h.at(10.0)
    for node in ("a", "b", "c"):
        h.heartbeat(node)
    ckpt = CheckpointSummary("t@2", epoch=1, seq=2, covers_journal_seq=5, replicated=True)
    h.update("a", "t", 1, Checkpointed(ckpt, journal_seq=6, replicated_journal_seq=6))
    h.step(MigrateRequested("m", "t", h.now, target_node_id="c", release_timeout_s=1.0))
    running = [TaskProgress("t", 1)]
    h.at(11.0).heartbeat("a", running)
    h.heartbeat("b")
    h.heartbeat("c", [TaskProgress("filler", 1)])
    revokes = directives(h.tick(), Revoke)
    assert [(r.task_id, r.reason) for r in revokes] == [("t", RevokeReason.RELEASE_TIMEOUT)]
    assert h.task("t").owner_node_id == "a"  # until a shows it stopped
    stopped = h.at(11.5).heartbeat("a", [])
    task = h.task("t")
    assert (task.owner_node_id, task.epoch) == ("c", 2)
    assert [(r.reason, r.to_node_id) for r in notices_of(stopped, n.TaskReassigned)] == [
        (MoveReason.RELEASE_TIMEOUT, "c")
    ]
    assert [a.resume_from for a in directives(stopped, Assign)] == [ckpt]


def test_the_simulator_exercises_migrations_and_keeps_every_invariant() -> None:
    migrated = 0
    for seed in range(24):
        report = Simulation(seed, SimConfig()).run()
        migrated += report.migrated_tasks
    assert migrated >= 1


# -- transcript ---------------------------------------------------------------------


def migrate_task_to_a_chosen_node() -> Harness:
    h = three_nodes(seed=11)
    ckpt = CheckpointSummary("t@4", epoch=1, seq=4, covers_journal_seq=20, replicated=True)
    h.at(1.0).update("a", "t", 1, Checkpointed(ckpt, journal_seq=22, replicated_journal_seq=22))
    h.at(1.1).step(MigrateRequested("mig-1", "t", h.now, target_node_id="c", reason="hotspot"))
    final = CheckpointSummary("t@5", epoch=1, seq=5, covers_journal_seq=23, replicated=True)
    h.at(1.3).update("a", "t", 1, Released("mig-1", final, journal_seq=23))
    h.at(1.4).update("c", "t", 2, Started(resumed_from=final))
    h.at(2.0).update("c", "t", 2, Completed(TaskResult(b"done", size_bytes=4)))
    return h


def transcript(h: Harness, title: str) -> str:
    lines = [f"# {title}", ""]
    for event, commands in h.log:
        quiet = all(
            isinstance(c, SendDirective) and isinstance(c.directive, HeartbeatAck) for c in commands
        )
        if isinstance(event, Tick | HeartbeatReceived) and quiet:
            continue
        lines.append(f"{event.now_s:7.3f} > {render(event)}")
        lines.extend(f"        < {render(c)}" for c in commands)
    return "\n".join(lines) + "\n"


def test_migrate_transcript() -> None:
    name = "migrate_task_to_a_chosen_node"
    text = transcript(
        migrate_task_to_a_chosen_node(),
        "Three nodes; an operator migrates a running task to the busiest node, which takes it "
        "at the released checkpoint.",
    )
    path = TRANSCRIPTS / f"{name}.txt"
    if os.environ.get("LAZARUS_UPDATE_TRANSCRIPTS") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"transcript {name} changed; review and regenerate"
