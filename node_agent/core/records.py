"""Plain records the agent core reads and writes: the Session's messages without the wire.

Each record mirrors the fields of an ``agent.proto`` / ``records.proto``
message that the core decides on or forwards; ``node_agent.convert`` is the
only place that turns them into protobuf and back (as ``coordinator.convert``
does for the coordinator's core). Records are frozen: the core builds a new
one (``dataclasses.replace``) instead of changing a message in place.

Enums carry the wire's numbers (``IntEnum``), so conversion is a lookup and a
value the wire adds later maps to ``UNSPECIFIED`` instead of failing.

Shapes and units: epochs, seqs and attempts are non-negative ints; ``*_ms``
fields are milliseconds (``*_unix_ms`` Unix wall time); byte fields are raw
bytes, never text.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class HeldTaskStatus(enum.IntEnum):
    """What the agent is doing with a task it lists in Hello (``agent.proto``)."""

    UNSPECIFIED = 0
    RUNNING = 1
    PAUSED = 2
    COMPLETED = 3
    FAILED = 4
    RELEASED = 5


class AssignReason(enum.IntEnum):
    """Why the leader assigned a task here (``agent.proto``)."""

    UNSPECIFIED = 0
    NEW = 1
    RETRY = 2
    MOVED = 3
    REATTACH = 4


class RevokeReason(enum.IntEnum):
    """Why the leader took a task away (``agent.proto``)."""

    UNSPECIFIED = 0
    CANCELLED = 1
    REASSIGNED = 2
    STALE_EPOCH = 3
    UNKNOWN_TASK = 4
    FINISHED = 5
    DEADLINE_EXCEEDED = 6
    RELEASE_TIMEOUT = 7


class UpdateOutcome(enum.IntEnum):
    """The leader's answer to a TaskUpdate (``agent.proto``)."""

    UNSPECIFIED = 0
    ACCEPTED = 1
    DUPLICATE = 2
    STALE_EPOCH = 3
    UNKNOWN_TASK = 4
    REJECTED = 5


def wire_enum(kind: type[enum.IntEnum], value: int) -> enum.IntEnum:
    """``kind(value)``, or its ``UNSPECIFIED`` member for a number this build does not know."""
    try:
        return kind(value)
    except ValueError:
        return kind(0)


# ---------------------------------------------------------------------------
# Checkpoint, result and error summaries (records.proto)
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckpointSummary:
    """Where a checkpoint is and what it covers (``records.CheckpointSummary``)."""

    checkpoint_ref: str = ""
    task_id: str = ""
    epoch: int = 0
    seq: int = 0
    covers_journal_seq: int = 0
    terminal: bool = False
    label: str = ""
    created_at_unix_ms: int = 0
    stored_bytes: int = 0
    replicated: bool = False
    node_id: str = ""
    parent_ref: str = ""


@dataclass(frozen=True, slots=True)
class TaskResult:
    """A handler's return value (``records.TaskResult``); ``payload`` is opaque here."""

    payload: bytes = b""
    content_type: str = ""
    size_bytes: int = 0
    redis_key: str = ""
    crc32: int = 0


@dataclass(frozen=True, slots=True)
class TaskError:
    """Why a task failed (``records.TaskError``); ``code`` is a ``TaskErrorCode`` number."""

    code: int = 0
    message: str = ""
    exception_type: str = ""
    traceback: str = ""
    retryable: bool = False
    node_id: str = ""
    epoch: int = 0
    attempt: int = 0
    occurred_at_unix_ms: int = 0


# ---------------------------------------------------------------------------
# Agent -> coordinator
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TaskProgress:
    """One running task's progress, as a Heartbeat lists it."""

    task_id: str = ""
    epoch: int = 0
    checkpoint_seq: int = 0
    covers_journal_seq: int = 0
    replicated_checkpoint_seq: int = 0
    journal_seq: int = 0
    replicated_journal_seq: int = 0
    progress_ratio: float = 0.0
    progress_message: str = ""


@dataclass(frozen=True, slots=True)
class HeldTask:
    """A task the agent still holds, as its Hello lists it."""

    task_id: str
    epoch: int
    attempt: int
    kind: str
    status: HeldTaskStatus
    checkpoint: CheckpointSummary | None = None
    replicated_checkpoint_seq: int = 0
    journal_seq: int = 0
    replicated_journal_seq: int = 0


@dataclass(frozen=True, slots=True)
class Hello:
    """The core's part of a Hello: who this process is and what it holds.

    The shell adds the static fields (address, capacity, labels, kinds, the
    incarnation secret, the store's identity) at the edge.
    """

    node_id: str
    incarnation: str
    protocol_version: int
    held_tasks: tuple[HeldTask, ...] = ()
    hello_seq: int = 0
    """This process's count of its Hellos, from 1; the answering Welcome echoes it."""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Liveness and progress, sent every heartbeat interval."""

    seq: int
    sent_at_unix_ms: int
    sent_at_monotonic_ms: int
    tasks: tuple[TaskProgress, ...] = ()
    running_tasks: int = 0
    used_slots: int = 0


@dataclass(frozen=True, slots=True)
class Started:
    """The handler started (``TaskUpdate.Started``); ``location`` is a CheckpointLocation number."""

    resumed_from: CheckpointSummary | None = None
    location: int = 0
    replayed_journal_events: int = 0
    restore_ms: int = 0
    resume_point_unix_ms: int = 0


@dataclass(frozen=True, slots=True)
class Checkpointed:
    """A coalesced progress report (``TaskUpdate.Checkpointed``)."""

    checkpoint: CheckpointSummary
    journal_seq: int = 0
    replicated_journal_seq: int = 0


@dataclass(frozen=True, slots=True)
class Completed:
    """The handler returned (``TaskUpdate.Completed``)."""

    result: TaskResult
    final_checkpoint: CheckpointSummary | None = None
    run_ms: int = 0


@dataclass(frozen=True, slots=True)
class Failed:
    """The handler failed (``TaskUpdate.Failed``)."""

    error: TaskError
    last_checkpoint: CheckpointSummary | None = None


@dataclass(frozen=True, slots=True)
class Released:
    """The task stopped for a graceful move (``TaskUpdate.Released``)."""

    move_id: str = ""
    checkpoint: CheckpointSummary | None = None
    journal_seq: int = 0


Change = Started | Checkpointed | Completed | Failed | Released


@dataclass(frozen=True, slots=True)
class TaskUpdate:
    """A change of one task at the epoch the agent holds it."""

    task_id: str
    epoch: int
    change: Change
    attempt: int = 0
    update_seq: int = 0
    occurred_at_unix_ms: int = 0

    @property
    def terminal(self) -> bool:
        """Completed, Failed or Released: kept until the leader acknowledges it."""
        return isinstance(self.change, Completed | Failed | Released)


@dataclass(frozen=True, slots=True)
class LineageReport:
    """A fork of a superseded owner, reported until the leader's LineageAck.

    ``wire`` is the serialized ``agent.LineageReport`` the shell built from the
    local store (without payloads): opaque here; the core keeps it to send
    again after every Welcome until the fork is acknowledged.
    """

    fork_id: str
    task_id: str
    epoch: int
    wire: bytes = b""


AgentMessage = Hello | Heartbeat | TaskUpdate | LineageReport
"""What the core sends on the Session (``Send.message``)."""


# ---------------------------------------------------------------------------
# Coordinator -> agent
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Welcome:
    """The leader accepted the Session; ``*_ms`` of 0 keep the core's defaults.

    ``hello_seq``: the ``Hello.hello_seq`` it answers (0: a leader that does
    not echo it).
    """

    term: int
    leader_id: str = ""
    session_id: str = ""
    heartbeat_interval_ms: int = 0
    fence_after_ms: int = 0
    dead_after_ms: int = 0
    hello_seq: int = 0


@dataclass(frozen=True, slots=True)
class NotLeader:
    """This coordinator does not lead: where to go, and after how long."""

    leader_id: str = ""
    leader_address: str = ""
    term: int = 0
    retry_after_ms: int = 0


@dataclass(frozen=True, slots=True)
class Reattach:
    """Fan-in: the replica holding the Session reached a new leader; say Hello again on it."""

    term: int = 0


@dataclass(frozen=True, slots=True)
class HeartbeatAck:
    """The leader received heartbeat ``seq``."""

    seq: int
    term: int = 0


@dataclass(frozen=True, slots=True)
class Assign:
    """Run ``task_id`` at ``epoch``.

    ``wire`` is the Assign as the leader sent it (serialized ``agent.Assign``):
    the runner's input (spec, payload, resume point), opaque to the core,
    which decides on the fields above only.
    """

    task_id: str
    epoch: int
    attempt: int = 0
    kind: str = ""
    reason: AssignReason = AssignReason.UNSPECIFIED
    wire: bytes = b""


@dataclass(frozen=True, slots=True)
class Revoke:
    """Stop ``task_id`` at or below ``epoch``; ``current_epoch`` owns it now."""

    task_id: str
    epoch: int
    current_epoch: int = 0
    reason: RevokeReason = RevokeReason.UNSPECIFIED
    current_owner_node_id: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class Release:
    """Stop ``task_id`` at ``epoch`` and hand over its final checkpoint (drain, migrate)."""

    task_id: str
    epoch: int
    move_id: str = ""


@dataclass(frozen=True, slots=True)
class Drain:
    """The node is being drained (or the drain was cancelled)."""

    drain_id: str = ""
    reason: str = ""
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class TaskUpdateAck:
    """The leader's answer to the update ``update_seq``."""

    update_seq: int
    task_id: str = ""
    epoch: int = 0
    outcome: UpdateOutcome = UpdateOutcome.UNSPECIFIED
    current_epoch: int = 0
    message: str = ""


@dataclass(frozen=True, slots=True)
class LineageAck:
    """The leader recorded the fork ``fork_id``."""

    fork_id: str
    task_id: str = ""
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class Unhandled:
    """A message the core has no rule for (its oneof name, for the log)."""

    body: str = ""


CoordinatorMessage = (
    Welcome
    | NotLeader
    | Reattach
    | HeartbeatAck
    | Assign
    | Revoke
    | Release
    | Drain
    | TaskUpdateAck
    | LineageAck
    | Unhandled
)
"""What the core reads from the Session (``AgentCore.on_message``)."""
