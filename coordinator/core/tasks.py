"""Task table: every task the cluster knows, its lifecycle table and its indexes.

Theory of operation: a task is PENDING until placed, ASSIGNED to a node at an
epoch, RUNNING once that node reports Started, and ends COMPLETED, FAILED or
CANCELLED. When its owner is lost (DEAD or LEFT) or an attempt fails with a
retryable error it goes back to PENDING with ``attempt + 1``, or to FAILED
when ``max_attempts`` or its deadline are used up ("Task Recovery" in
``shared/reference/state_recovery_patterns.md``); a graceful release (drain)
goes back to PENDING without spending an attempt.

Every legal change is a row of ``TASK_TRANSITIONS`` keyed by (state,
``TaskTrigger``). ``TaskTable.transition`` is the only way a stored task
changes, and it enforces the fencing rules on every write:

- the new state is the one the table names for the trigger;
- the epoch grows by exactly 1 on ASSIGN and never changes otherwise, so
  epochs strictly increase per task and each epoch has at most one owner;
- the owner is set exactly while ASSIGNED or RUNNING;
- ``attempt`` grows by exactly 1 on OWNER_LOST and RETRY and is kept otherwise;
- terminal states have no way out.

A broken rule raises ``InvariantViolation``. The table also keeps the indexes
the leader needs: request id -> task (idempotent submission), owner -> tasks,
the PENDING set, tasks with a deadline, tasks with a move in progress.
"""

from __future__ import annotations

import collections
import enum
import operator

from coordinator.core.errors import InvariantViolation
from coordinator.core.records import TaskRecord, TaskState

__all__ = ["TASK_TRANSITIONS", "TaskTable", "TaskTrigger", "check_task_shape"]


_STATE = operator.attrgetter("state")


class TaskTrigger(enum.Enum):
    """What can change a task."""

    ASSIGN = "assign"
    START = "start"
    CHECKPOINT = "checkpoint"
    COMPLETE = "complete"
    RETRY = "retry"
    FAIL = "fail"
    OWNER_LOST = "owner_lost"
    GIVE_UP = "give_up"
    RELEASE = "release"
    CANCEL = "cancel"
    EXPIRE = "expire"
    ANNOTATE = "annotate"


_P, _A, _R = TaskState.PENDING, TaskState.ASSIGNED, TaskState.RUNNING
_C, _F, _X = TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELLED
_T = TaskTrigger

TASK_TRANSITIONS: dict[tuple[TaskState, TaskTrigger], TaskState] = {
    (_P, _T.ASSIGN): _A,
    (_P, _T.CANCEL): _X,
    (_P, _T.EXPIRE): _F,
    (_P, _T.ANNOTATE): _P,
    # The owner of the current epoch finished just before it was declared
    # lost, and no new epoch was assigned yet: its result is taken.
    (_P, _T.COMPLETE): _C,
    (_A, _T.START): _R,
    (_A, _T.CHECKPOINT): _R,
    (_A, _T.COMPLETE): _C,
    (_A, _T.RETRY): _P,
    (_A, _T.FAIL): _F,
    (_A, _T.OWNER_LOST): _P,
    (_A, _T.GIVE_UP): _F,
    (_A, _T.RELEASE): _P,
    (_A, _T.CANCEL): _X,
    (_A, _T.EXPIRE): _F,
    (_A, _T.ANNOTATE): _A,
    (_R, _T.CHECKPOINT): _R,
    (_R, _T.COMPLETE): _C,
    (_R, _T.RETRY): _P,
    (_R, _T.FAIL): _F,
    (_R, _T.OWNER_LOST): _P,
    (_R, _T.GIVE_UP): _F,
    (_R, _T.RELEASE): _P,
    (_R, _T.CANCEL): _X,
    (_R, _T.EXPIRE): _F,
    (_R, _T.ANNOTATE): _R,
}

_ATTEMPT_SPENDING = frozenset({TaskTrigger.OWNER_LOST, TaskTrigger.RETRY})


def check_task_shape(task: TaskRecord) -> None:
    """Check the rules a single task record must satisfy on its own.

    Args:
        task: the record.

    Raises:
        InvariantViolation: owner set outside ASSIGNED / RUNNING (or missing in
            them), an owned task at epoch 0, attempt < 1, negative epoch, a
            COMPLETED task without a result, or an empty id.
    """
    state = task.state
    problem = ""
    if not task.task_id or not task.request_id:
        problem = "empty task_id or request_id"
    elif task.epoch < 0 or task.attempt < 1:
        problem = f"epoch {task.epoch}, attempt {task.attempt}"
    elif state is TaskState.ASSIGNED or state is TaskState.RUNNING:
        if not task.owner_node_id:
            problem = f"{state.name} without an owner"
        elif task.epoch < 1:
            problem = f"{state.name} at epoch 0"
    elif task.owner_node_id:
        problem = f"{state.name} with owner {task.owner_node_id!r}"
    elif state is TaskState.COMPLETED and task.result is None:
        problem = "COMPLETED without a result"
    if problem:
        raise InvariantViolation(f"task {task.task_id!r}: {problem}")


class TaskTable:
    """Every task, keyed by id, with the leader's indexes; changes go through ``transition``."""

    __slots__ = ("_by_request", "_deadlines", "_moving", "_owned", "_pending", "_tasks")

    def __init__(self) -> None:
        self._tasks: dict[str, TaskRecord] = {}
        self._by_request: dict[str, str] = {}
        self._owned: dict[str, set[str]] = {}
        self._pending: set[str] = set()
        self._deadlines: dict[str, float] = {}
        self._moving: set[str] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._tasks

    def get(self, task_id: str) -> TaskRecord | None:
        """The task with this id, or None."""
        return self._tasks.get(task_id)

    def by_request(self, request_id: str) -> TaskRecord | None:
        """The task a request id created, or None."""
        task_id = self._by_request.get(request_id)
        return None if task_id is None else self._tasks[task_id]

    def counts_by_state(self) -> dict[TaskState, int]:
        """Task counts for every state with at least one task (no sort, no copy)."""
        return collections.Counter(map(_STATE, self._tasks.values()))

    def records(self) -> list[TaskRecord]:
        """Every task, sorted by id."""
        return [self._tasks[k] for k in sorted(self._tasks)]

    def pending(self) -> list[TaskRecord]:
        """PENDING tasks, sorted by id."""
        return [self._tasks[k] for k in sorted(self._pending)]

    def owned_by(self, node_id: str) -> list[TaskRecord]:
        """ASSIGNED and RUNNING tasks owned by ``node_id``, sorted by id."""
        return [self._tasks[k] for k in sorted(self._owned.get(node_id, ()))]

    def owners(self) -> list[str]:
        """Nodes owning at least one task, sorted."""
        return sorted(node for node, ids in self._owned.items() if ids)

    def deadlines_due(self, now_s: float) -> list[TaskRecord]:
        """Non-terminal tasks whose deadline is at or before ``now_s``, sorted by id."""
        due = [k for k, deadline in self._deadlines.items() if deadline <= now_s]
        return [self._tasks[k] for k in sorted(due)]

    def moving(self) -> list[TaskRecord]:
        """Owned tasks with a graceful move in progress, sorted by id."""
        return [self._tasks[k] for k in sorted(self._moving)]

    def insert(self, task: TaskRecord) -> None:
        """Add a task that is new to the table (a submission, or a record loaded from etcd).

        Raises:
            InvariantViolation: the id or request id is taken, or the record is malformed.
        """
        check_task_shape(task)
        if task.task_id in self._tasks:
            raise InvariantViolation(f"task {task.task_id!r} inserted twice")
        if task.request_id in self._by_request:
            raise InvariantViolation(f"request id {task.request_id!r} used by two tasks")
        self._tasks[task.task_id] = task
        self._by_request[task.request_id] = task.task_id
        self._index(task)

    def remove(self, task_id: str) -> TaskRecord:
        """Forget a terminal task (retention moved it to the archive).

        Returns:
            The removed record.

        Raises:
            InvariantViolation: unknown task, or one that is not terminal.
        """
        task = self._tasks.get(task_id)
        if task is None or not task.state.terminal:
            raise InvariantViolation(f"only a known terminal task can be retired: {task_id!r}")
        del self._tasks[task_id]
        if self._by_request.get(task.request_id) == task_id:
            del self._by_request[task.request_id]
        self._unindex(task)
        return task

    def transition(self, trigger: TaskTrigger, new: TaskRecord) -> TaskRecord:
        """Replace a task by ``new``, which must follow from it by ``trigger``.

        Args:
            trigger: what happened.
            new: the task after it.

        Returns:
            ``new``.

        Raises:
            InvariantViolation: unknown task, a transition the table lacks, a
                state other than the table's, or a broken epoch / owner /
                attempt / identity rule.
        """
        old = self._tasks.get(new.task_id)
        if old is None:
            raise InvariantViolation(f"task {new.task_id!r} is not in the table")
        where = f"task {new.task_id!r} {old.state.name} --{trigger.name}-->"
        target = TASK_TRANSITIONS.get((old.state, trigger))
        if target is None:
            raise InvariantViolation(f"{where}: no such transition")
        if new.state is not target:
            raise InvariantViolation(f"{where} {new.state.name}: table says {target.name}")
        if new.request_id != old.request_id or new.spec != old.spec:
            raise InvariantViolation(f"{where}: request id or spec changed")
        want_epoch = old.epoch + 1 if trigger is TaskTrigger.ASSIGN else old.epoch
        if new.epoch != want_epoch:
            raise InvariantViolation(f"{where}: epoch {old.epoch} -> {new.epoch}")
        want_attempt = old.attempt + 1 if trigger in _ATTEMPT_SPENDING else old.attempt
        if new.attempt != want_attempt:
            raise InvariantViolation(f"{where}: attempt {old.attempt} -> {new.attempt}")
        if old.state.owned and new.state.owned and new.owner_node_id != old.owner_node_id:
            raise InvariantViolation(f"{where}: owner changed without a new epoch")
        check_task_shape(new)
        self._unindex(old)
        self._tasks[new.task_id] = new
        self._index(new)
        return new

    def check(self) -> None:
        """Check every task and every index against the tasks.

        Raises:
            InvariantViolation: a malformed task or a stale index entry.
        """
        owned: dict[str, set[str]] = {}
        pending: set[str] = set()
        moving: set[str] = set()
        by_request = self._by_request
        for task_id, task in self._tasks.items():
            check_task_shape(task)
            if task_id != task.task_id or by_request.get(task.request_id) != task_id:
                raise InvariantViolation(f"task {task_id!r}: id or request index out of date")
            state = task.state
            if state is TaskState.ASSIGNED or state is TaskState.RUNNING:
                owned.setdefault(task.owner_node_id, set()).add(task_id)
                if task.move is not None:
                    moving.add(task_id)
            elif state is TaskState.PENDING:
                pending.add(task_id)
        if len(self._by_request) != len(self._tasks):
            raise InvariantViolation("request index has entries for missing tasks")
        if {k: v for k, v in self._owned.items() if v} != owned:
            raise InvariantViolation("owner index out of date")
        if self._pending != pending or self._moving != moving:
            raise InvariantViolation("pending or moving index out of date")

    def _index(self, task: TaskRecord) -> None:
        if task.state.owned:
            self._owned.setdefault(task.owner_node_id, set()).add(task.task_id)
            if task.move is not None:
                self._moving.add(task.task_id)
        if task.state is TaskState.PENDING:
            self._pending.add(task.task_id)
        if not task.state.terminal and task.spec.deadline_s is not None:
            self._deadlines[task.task_id] = task.spec.deadline_s

    def _unindex(self, task: TaskRecord) -> None:
        if task.state.owned:
            ids = self._owned.get(task.owner_node_id)
            if ids is not None:
                ids.discard(task.task_id)
                if not ids:
                    del self._owned[task.owner_node_id]
        self._pending.discard(task.task_id)
        self._moving.discard(task.task_id)
        self._deadlines.pop(task.task_id, None)
