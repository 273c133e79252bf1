"""The task table's rules, and the task lifecycle driven through CoordinatorCore."""

from __future__ import annotations

from dataclasses import replace

import pytest
from core_harness import Harness, directives, notices_of, persisted_tasks, sent

from coordinator.core import (
    Assign,
    AssignReason,
    Checkpointed,
    CheckpointSummary,
    Completed,
    CoreSettings,
    Failed,
    HeldTask,
    HeldTaskStatus,
    InvariantViolation,
    ReplyToRequest,
    Revoke,
    RevokeReason,
    Started,
    StatusCode,
    TaskError,
    TaskErrorCode,
    TaskProgress,
    TaskRecord,
    TaskResult,
    TaskSpec,
    TaskState,
    TaskUpdateAck,
    UpdateOutcome,
)
from coordinator.core import notices as n
from coordinator.core.tasks import TASK_TRANSITIONS, TaskTable, TaskTrigger


def record(task_id: str = "t", **fields: object) -> TaskRecord:
    return TaskRecord(task_id=task_id, request_id=f"r-{task_id}", spec=TaskSpec(kind="k"), **fields)  # type: ignore[arg-type]


# -- the table on its own ------------------------------------------------------------------


def test_assign_must_bump_the_epoch_by_exactly_one() -> None:
    table = TaskTable()
    table.insert(record())
    assigned = record(state=TaskState.ASSIGNED, epoch=1, owner_node_id="a")
    table.transition(TaskTrigger.ASSIGN, assigned)
    lost = replace(assigned, state=TaskState.PENDING, owner_node_id="", attempt=2)
    table.transition(TaskTrigger.OWNER_LOST, lost)
    with pytest.raises(InvariantViolation, match="epoch 1 -> 1"):
        table.transition(
            TaskTrigger.ASSIGN, replace(lost, state=TaskState.ASSIGNED, owner_node_id="b")
        )
    with pytest.raises(InvariantViolation, match="epoch 1 -> 3"):
        table.transition(
            TaskTrigger.ASSIGN, replace(lost, state=TaskState.ASSIGNED, owner_node_id="b", epoch=3)
        )


def test_owner_changes_only_with_a_new_epoch() -> None:
    table = TaskTable()
    table.insert(record(state=TaskState.RUNNING, epoch=4, owner_node_id="a"))
    with pytest.raises(InvariantViolation, match="owner changed"):
        table.transition(
            TaskTrigger.ANNOTATE, record(state=TaskState.RUNNING, epoch=4, owner_node_id="b")
        )


@pytest.mark.parametrize("state", [TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELLED])
def test_terminal_states_have_no_way_out(state: TaskState) -> None:
    assert not [k for k in TASK_TRANSITIONS if k[0] is state]
    table = TaskTable()
    table.insert(record(state=state, result=TaskResult()))
    with pytest.raises(InvariantViolation, match="no such transition"):
        table.transition(
            TaskTrigger.ASSIGN, record(state=TaskState.ASSIGNED, epoch=1, owner_node_id="a")
        )


def test_shape_rules() -> None:
    table = TaskTable()
    with pytest.raises(InvariantViolation, match="without an owner"):
        table.insert(record(state=TaskState.RUNNING, epoch=1))
    with pytest.raises(InvariantViolation, match="PENDING with owner"):
        table.insert(record(owner_node_id="a"))
    with pytest.raises(InvariantViolation, match="at epoch 0"):
        table.insert(record(state=TaskState.ASSIGNED, owner_node_id="a"))
    table.insert(record("x"))
    with pytest.raises(InvariantViolation, match="inserted twice"):
        table.insert(record("x"))


def test_attempts_only_grow_on_loss_or_retry() -> None:
    table = TaskTable()
    table.insert(record(state=TaskState.RUNNING, epoch=1, owner_node_id="a"))
    with pytest.raises(InvariantViolation, match="attempt 1 -> 1"):
        table.transition(TaskTrigger.OWNER_LOST, record(epoch=1))
    table.transition(TaskTrigger.RELEASE, record(epoch=1))  # a graceful move keeps the attempt


# -- through the core ------------------------------------------------------------------------


def two_nodes() -> Harness:
    h = Harness()
    h.lead()
    h.hello("a")
    h.hello("b")
    return h


def test_submit_is_idempotent_on_request_id() -> None:
    h = two_nodes()
    first = h.submit("req-1", task_id="t1")
    replies = [c for c in first if isinstance(c, ReplyToRequest)]
    assert [(r.status, r.task_id, r.created) for r in replies] == [(StatusCode.OK, "t1", True)]
    again = h.submit("req-1", task_id="t1")
    assert again == [ReplyToRequest("req-1", StatusCode.OK, task_id="t1")]
    other_spec = h.submit("req-1", kind="other")
    assert [c.status for c in other_spec if isinstance(c, ReplyToRequest)] == [
        StatusCode.ALREADY_EXISTS
    ]
    taken = h.submit("req-2", task_id="t1")
    assert [c.status for c in taken if isinstance(c, ReplyToRequest)] == [StatusCode.ALREADY_EXISTS]
    assert len(h.core.snapshot().tasks) == 1


@pytest.mark.parametrize(
    ("request_id", "spec", "field"),
    [
        ("", {}, "request_id"),
        ("r", {"kind": ""}, "spec.kind"),
        ("r", {"slots": -1}, "spec.slots"),
        ("r", {"max_attempts": -2}, "spec.max_attempts"),
        ("r", {"deadline_s": 0.0}, "spec.deadline_unix_ms"),
    ],
)
def test_bad_submissions_are_refused_naming_the_field(
    request_id: str, spec: dict[str, object], field: str
) -> None:
    h = two_nodes()
    commands = h.submit(request_id, **spec)
    assert len(commands) == 1
    reply = commands[0]
    assert isinstance(reply, ReplyToRequest)
    assert reply.status is StatusCode.INVALID_ARGUMENT
    assert reply.message.startswith(field)


def test_generated_task_ids_come_from_the_injected_rng() -> None:
    one, two = Harness(seed=7), Harness(seed=7)
    for h in (one, two):
        h.lead()
        h.submit("req")
    assert one.core.snapshot().tasks == two.core.snapshot().tasks


def test_lifecycle_started_checkpointed_completed() -> None:
    h = two_nodes()
    h.submit("r", task_id="t")
    owner = h.task("t").owner_node_id
    assert h.task("t").state is TaskState.ASSIGNED
    assert h.task("t").epoch == 1
    h.update(owner, "t", 1, Started())
    assert h.task("t").state is TaskState.RUNNING
    ckpt = CheckpointSummary("t@1", epoch=1, seq=1, covers_journal_seq=4, replicated=True)
    commands = h.update(owner, "t", 1, Checkpointed(ckpt, journal_seq=5, replicated_journal_seq=5))
    assert h.task("t").last_replicated_checkpoint == ckpt
    assert h.task("t").last_replicated_journal_seq == 5
    assert [a.outcome for a in directives(commands, TaskUpdateAck)] == [UpdateOutcome.ACCEPTED]
    duplicate = h.update(owner, "t", 1, Checkpointed(ckpt, 5, 5))
    assert [a.outcome for a in directives(duplicate, TaskUpdateAck)] == [UpdateOutcome.DUPLICATE]
    done = h.update(owner, "t", 1, Completed(TaskResult(b"42", size_bytes=2)))
    assert h.task("t").state is TaskState.COMPLETED
    assert h.task("t").owner_node_id == ""
    assert notices_of(done, n.TaskCompleted)[0].result_bytes == 2
    resent = h.update(owner, "t", 1, Completed(TaskResult(b"42")))
    assert [a.outcome for a in directives(resent, TaskUpdateAck)] == [UpdateOutcome.DUPLICATE]


def test_an_update_with_an_older_epoch_is_refused_and_changes_nothing() -> None:
    h = Harness()
    h.lead()
    h.hello("a")
    h.submit("r", task_id="t")  # only a is there: it gets epoch 1
    h.update("a", "t", 1, Started())
    h.hello("b")
    h.close("a")
    h.run_until(4.0, heartbeating=["b"])  # a is DEAD, the task moves to b at epoch 2
    assert h.task("t").epoch == 2
    assert h.task("t").owner_node_id == "b"
    h.hello("a")  # the zombie is back with a new Session
    before = h.task("t")
    commands = h.update("a", "t", 1, Completed(TaskResult(b"stale")))
    assert h.task("t") == before
    assert persisted_tasks(commands) == []
    acks = directives(commands, TaskUpdateAck)
    assert [(a.outcome, a.current_epoch) for a in acks] == [(UpdateOutcome.STALE_EPOCH, 2)]
    revokes = sent(commands, Revoke)
    assert revokes == [("a", Revoke("t", 1, 2, RevokeReason.REASSIGNED, "b"))]
    assert [z.source.name for z in notices_of(commands, n.ZombieFenced)] == ["TASK_UPDATE"]


def test_owner_lost_spends_an_attempt_then_fails_when_none_are_left() -> None:
    h = Harness(CoreSettings(default_max_attempts=2, self_check=True))
    h.lead()
    h.hello("a")
    h.submit("r", task_id="t")
    h.close("a")
    h.run_until(4.0)  # a is DEAD after 3 s of silence (and the grace)
    assert h.task("t").state is TaskState.PENDING
    assert h.task("t").attempt == 2
    h.hello("b")
    assert h.task("t").owner_node_id == "b"
    assert h.task("t").epoch == 2
    h.close("b")
    commands = h.run_until(8.0)
    task = h.task("t")
    assert task.state is TaskState.FAILED
    assert task.last_error is not None
    assert task.last_error.code is TaskErrorCode.ATTEMPTS_EXHAUSTED
    failed = notices_of(commands, n.TaskFailed)
    assert [(f.task_id, f.will_retry) for f in failed] == [("t", False)]


def test_a_retryable_failure_retries_and_a_final_one_fails() -> None:
    h = two_nodes()
    h.submit("r", task_id="t")
    owner = h.task("t").owner_node_id
    err = TaskError(TaskErrorCode.HANDLER_ERROR, "boom", retryable=True)
    commands = h.update(owner, "t", 1, Failed(err))
    task = h.task("t")
    assert task.state is TaskState.ASSIGNED
    assert task.epoch == 2
    assert task.attempt == 2
    assert [a.reason for a in directives(commands, Assign)] == [AssignReason.RETRY]
    h.update(task.owner_node_id, "t", 2, Failed(replace(err, retryable=False)))
    assert h.task("t").state is TaskState.FAILED


def test_the_deadline_fails_a_task_and_revokes_it() -> None:
    h = two_nodes()
    h.submit("r", task_id="t", deadline_s=5.0)
    owner = h.task("t").owner_node_id
    commands = h.run_until(5.0, heartbeating=["a", "b"])
    assert h.task("t").state is TaskState.FAILED
    assert sent(commands, Revoke) == [(owner, Revoke("t", 1, 1, RevokeReason.DEADLINE_EXCEEDED))]


def test_cancel() -> None:
    h = two_nodes()
    h.submit("r", task_id="t")
    owner = h.task("t").owner_node_id
    from coordinator.core import CancelRequested

    commands = h.step(CancelRequested("c1", "t", h.now, "no longer needed"))
    assert h.task("t").state is TaskState.CANCELLED
    assert h.task("t").cancel_reason == "no longer needed"
    assert sent(commands, Revoke) == [(owner, Revoke("t", 1, 1, RevokeReason.CANCELLED))]
    assert h.step(CancelRequested("c2", "t", h.now))[-1] == ReplyToRequest(
        "c2", StatusCode.OK, task_id="t"
    )
    missing = h.step(CancelRequested("c3", "nope", h.now))
    assert [c.status for c in missing if isinstance(c, ReplyToRequest)] == [StatusCode.NOT_FOUND]


def test_a_late_completion_of_the_current_epoch_is_kept() -> None:
    # The owner finished just before it was declared DEAD; no new epoch was assigned
    # (nobody else can take it), so its result is accepted instead of redoing the work.
    h = Harness()
    h.lead()
    h.hello("a", slots=1)
    h.submit("r", task_id="t")
    h.close("a")
    h.run_until(4.0)
    assert h.task("t").state is TaskState.PENDING
    assert h.task("t").epoch == 1
    held = HeldTask("t", 1, HeldTaskStatus.COMPLETED)
    # It comes back handling other kinds only, so "t" cannot be placed on it again.
    hello = h.hello("a", held=[held], kinds=("other",))
    assert h.task("t").state is TaskState.PENDING
    assert sent(hello, Revoke) == []  # its Completed follows after Welcome
    commands = h.update("a", "t", 1, Completed(TaskResult(b"ok")))
    assert h.task("t").state is TaskState.COMPLETED
    assert [a.outcome for a in directives(commands, TaskUpdateAck)] == [UpdateOutcome.ACCEPTED]


def test_heartbeat_progress_at_a_stale_epoch_is_revoked_once() -> None:
    h = two_nodes()
    h.submit("r", task_id="t")
    owner = h.task("t").owner_node_id
    other = "b" if owner == "a" else "a"
    commands = h.heartbeat(other, [TaskProgress("t", 1), TaskProgress("ghost", 3)])
    revokes = sorted(sent(commands, Revoke), key=lambda x: x[1].task_id)
    assert [(r.task_id, r.reason) for _, r in revokes] == [
        ("ghost", RevokeReason.UNKNOWN_TASK),
        ("t", RevokeReason.STALE_EPOCH),
    ]
    again = h.heartbeat(other, [TaskProgress("t", 1), TaskProgress("ghost", 3)])
    assert sent(again, Revoke) == []
    assert sent(h.heartbeat(owner, [TaskProgress("t", 1)]), Revoke) == []
