"""Commands: imperative outputs of ``CoordinatorCore.step``, and the rule for running them.

Theory of operation: the core decides, the shell acts. ``step`` returns a list
of commands; the shell runs them one by one, in list order, and runs the lists
in the order ``step`` returned them. The rule that makes this safe is the one
etcd/raft writes down for ``Ready``: **persist before send**.

Ordering rule (checked by ``check_command_order`` on every list the core
returns):

0. ``RetireRecords``: records past their retention, archived then deleted.

1. ``PersistNodes`` then ``PersistTasks``: the state changes of the step, each
   record once (its newest value), split into transactions of at most
   ``MAX_TXN_OPS`` puts (etcd's default ``--max-txn-ops``). Each is a
   leader-fenced etcd transaction (compare the election key's create revision
   to ``term``). The shell awaits each one before running the next command.
   Then ``SeedFork`` (a forked task's first checkpoint to Redis, only after
   its task is persisted; the shell feeds ``ForkSeeded`` with the outcome).
2. ``EmitEvent``: notices about what was just persisted (the shell may append
   them to the etcd event log; they carry the same term).
3. ``SendDirective``, ``ReplyToRequest``, ``CloseSession``: messages to node
   agents and orchestrators, in the order decided. They never precede a
   persist of the same list, so no node is told to run a task at an epoch
   that is not durable, and no orchestrator hears "accepted" before etcd has
   the task.
4. ``StepDown``, alone and last.

One step's own state changes are persisted in its list; the exception is
progress (a Checkpointed update of a task already RUNNING), which the core
writes with a later tick's flush (``CoreSettings.progress_flush_interval_s``).
Its TaskUpdateAck is sent at once: it tells no one to act (agents act only on
acks of terminal updates), and what the write carries (the newest checkpoint
Redis acknowledged) only matters to a later leader's DATA_LOSS check, which a
missing write makes weaker, never wrong.

When a persist fails, the shell retries it (records are whole values, so a
retry is idempotent) until it succeeds or the term comparison fails. If it
gives up, it must drop the rest of that list and of every later list, and feed
``PersistFailed`` (or ``LeadershipLost`` when the term no longer matches); the
core then steps down and a new leader rebuilds from etcd. Lists may be
pipelined (list k+1 starts while list k's directives are still being written)
as long as no command overtakes one returned before it.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from coordinator.core.directives import Directive
from coordinator.core.errors import InvariantViolation
from coordinator.core.notices import Notice
from coordinator.core.records import NodeRecord, TaskRecord

__all__ = [
    "MAX_TXN_OPS",
    "CloseSession",
    "Command",
    "EmitEvent",
    "PersistNodes",
    "PersistTasks",
    "ReplyToRequest",
    "RetireRecords",
    "SeedFork",
    "SendDirective",
    "StatusCode",
    "StepDown",
    "batched",
    "check_command_order",
    "merge_steps",
]

MAX_TXN_OPS = 128
"""Most put operations in one etcd transaction (etcd's default ``--max-txn-ops``)."""

_T = TypeVar("_T")


def batched(items: Sequence[_T], size: int = MAX_TXN_OPS) -> list[tuple[_T, ...]]:
    """Split ``items`` into consecutive chunks of at most ``size``, order kept.

    Args:
        items: the records to write.
        size: chunk size, >= 1.

    Returns:
        The chunks; empty when ``items`` is empty.

    Raises:
        ValueError: ``size`` < 1.
    """
    if size < 1:
        raise ValueError(f"size: must be >= 1, got {size}")
    return [tuple(items[i : i + size]) for i in range(0, len(items), size)]


class StatusCode(enum.Enum):
    """Outcome of a request or reason a Session is closed; names are gRPC status codes."""

    OK = 0
    INVALID_ARGUMENT = 3
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    UNAVAILABLE = 14


@dataclass(frozen=True, slots=True)
class PersistNodes:
    """Write these node records in one leader-fenced etcd transaction (<= MAX_TXN_OPS)."""

    term: int
    records: tuple[NodeRecord, ...]


@dataclass(frozen=True, slots=True)
class PersistTasks:
    """Write these task records in one leader-fenced etcd transaction (<= MAX_TXN_OPS)."""

    term: int
    records: tuple[TaskRecord, ...]


@dataclass(frozen=True, slots=True)
class RetireRecords:
    """Move these records out of etcd: archive them in Redis, then delete them (fenced).

    Terminal tasks and DEAD or LEFT nodes past ``CoreSettings.retention_s``; the core
    has already forgotten them. Runs before the persists of the same batch
    (a record re-created under a retired id must not be deleted after it).
    When the archive cannot be written the shell leaves them in etcd (a new
    leader retires them again).
    """

    term: int
    tasks: tuple[TaskRecord, ...] = ()
    nodes: tuple[NodeRecord, ...] = ()


@dataclass(frozen=True, slots=True)
class SeedFork:
    """Write a forked task's first checkpoint to Redis, then feed ``ForkSeeded``.

    Comes after the persist of the task it seeds (the fork was accepted and
    the id is durably taken) and before any directive: the task is placed
    only once the outcome is stepped. ``seed`` is the serialised
    ``CheckpointRecord`` the orchestrator request built.
    """

    term: int
    task_id: str
    seed: bytes


@dataclass(frozen=True, slots=True)
class EmitEvent:
    """Publish a cluster event (WatchEvents; the etcd event log)."""

    term: int
    occurred_at_s: float
    body: Notice


@dataclass(frozen=True, slots=True)
class SendDirective:
    """Write a directive on a node's Session (drop it if that Session is gone)."""

    node_id: str
    session_id: str
    directive: Directive


@dataclass(frozen=True, slots=True)
class ReplyToRequest:
    """Complete the orchestrator request ``request_id`` with this status.

    ``task_id`` / ``node_id`` name what the request touched (read the record
    from ``CoordinatorCore.snapshot`` for the response body); ``created`` is
    SubmitTask's flag; ``tasks_to_move`` is DrainNode's count.
    """

    request_id: str
    status: StatusCode
    message: str = ""
    task_id: str = ""
    node_id: str = ""
    created: bool = False
    tasks_to_move: int = 0


@dataclass(frozen=True, slots=True)
class CloseSession:
    """End a Session with a status (bad input, replaced, or its node declared DEAD)."""

    node_id: str
    session_id: str
    code: StatusCode
    reason: str


@dataclass(frozen=True, slots=True)
class StepDown:
    """Stop leading (resign the election); the core has already become a follower."""

    reason: str


Command = (
    RetireRecords
    | PersistNodes
    | PersistTasks
    | SeedFork
    | EmitEvent
    | SendDirective
    | ReplyToRequest
    | CloseSession
    | StepDown
)

_RANK: dict[type, int] = {
    RetireRecords: 0,
    PersistNodes: 1,
    PersistTasks: 2,
    SeedFork: 3,
    EmitEvent: 4,
    SendDirective: 5,
    ReplyToRequest: 5,
    CloseSession: 5,
    StepDown: 6,
}


def check_command_order(commands: Sequence[Command]) -> None:
    """Check a command list against the ordering rule of this module.

    Args:
        commands: one list returned by ``step``.

    Raises:
        InvariantViolation: a command of an earlier class follows a later one
            (e.g. a persist after a send), a persist exceeds MAX_TXN_OPS or is
            empty, or StepDown is not alone at the end.
    """
    rank = -1
    for index, command in enumerate(commands):
        this = _RANK[type(command)]
        if this < rank:
            raise InvariantViolation(
                f"command {index} ({type(command).__name__}) breaks persist-before-send order"
            )
        rank = this
        if isinstance(command, PersistNodes | PersistTasks) and not (
            0 < len(command.records) <= MAX_TXN_OPS
        ):
            raise InvariantViolation(
                f"command {index}: {len(command.records)} records, outside 1..{MAX_TXN_OPS}"
            )
        if isinstance(command, StepDown) and index != len(commands) - 1:
            raise InvariantViolation("StepDown must be the last command")


def merge_steps(steps: Sequence[Sequence[Command]]) -> list[Command]:
    """Several steps' commands as one Ready-style batch, for the shell to run as is.

    Group commit (as raft implementations batch their log appends): every
    ``RetireRecords`` first, then the steps' records merged (the newest value
    of each node and task wins) into as few ``PersistNodes`` / ``PersistTasks``
    as ``MAX_TXN_OPS`` allows, then every other command in the order the steps
    returned them. Persisting a record earlier than its place is safe: what the
    ordering rule protects is that nothing is sent before what it reports is in
    etcd, and every send here still follows every persist. A StepDown ends the
    batch (a core that stepped down returns nothing after it).

    Args:
        steps: the lists ``CoordinatorCore.step`` returned, in order; each one
            already passed ``check_command_order``.

    Returns:
        One list; a single step's list is returned as it is.
    """
    if len(steps) == 1:
        return list(steps[0])
    retire: list[RetireRecords] = []
    nodes: dict[str, NodeRecord] = {}
    tasks: dict[str, TaskRecord] = {}
    rest: list[Command] = []
    term = 0
    for command in itertools.chain.from_iterable(steps):
        if isinstance(command, RetireRecords):
            retire.append(command)
        elif isinstance(command, PersistNodes):
            term = command.term
            for node in command.records:
                nodes.pop(node.node_id, None)  # the newest value, at its newest place
                nodes[node.node_id] = node
        elif isinstance(command, PersistTasks):
            term = command.term
            for task in command.records:
                tasks.pop(task.task_id, None)
                tasks[task.task_id] = task
        else:
            rest.append(command)
            if isinstance(command, StepDown):
                break
    merged: list[Command] = [*retire]
    merged += [PersistNodes(term, chunk) for chunk in batched(list(nodes.values()))]
    merged += [PersistTasks(term, chunk) for chunk in batched(list(tasks.values()))]
    return merged + rest
