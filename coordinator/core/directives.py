"""Directives: messages the leader sends down a node agent's Session.

Theory of operation: a ``SendDirective`` command carries one of these values;
the shell's adapter converts it into the matching ``CoordinatorMessage`` member
of ``agent.proto`` and writes it on the named Session. Fields the core does not
decide (cluster name, size limits, the echo of a heartbeat's send times) are
added by the adapter, which has the message at hand when it runs the command.
Durations are seconds here (``*_s``); the adapter converts them to the wire's
milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.core.records import (
    AssignReason,
    CheckpointSummary,
    MoveReason,
    NodeState,
    RevokeReason,
    TaskSpec,
    UpdateOutcome,
)

__all__ = [
    "Assign",
    "Directive",
    "Drain",
    "HeartbeatAck",
    "LineageAck",
    "Release",
    "Revoke",
    "TaskUpdateAck",
    "Welcome",
]


@dataclass(frozen=True, slots=True)
class Welcome:
    """Answer to Hello: the Session's parameters.

    ``hello_seq`` echoes the Hello's (``SessionOpened.hello_seq``): the agent
    ignores a Welcome that does not answer its newest Hello.
    """

    term: int
    heartbeat_interval_s: float
    fence_after_s: float
    dead_after_s: float
    node_state: NodeState
    hello_seq: int = 0


@dataclass(frozen=True, slots=True)
class HeartbeatAck:
    """Acknowledges one heartbeat; the agent's fencing timer for it stops."""

    seq: int
    term: int
    node_state: NodeState


@dataclass(frozen=True, slots=True)
class Assign:
    """Run a task at an epoch, resuming from ``resume_from`` when set."""

    task_id: str
    epoch: int
    attempt: int
    spec: TaskSpec
    reason: AssignReason
    resume_from: CheckpointSummary | None = None
    replay_through_journal_seq: int = 0
    move_reason: MoveReason | None = None
    previous_owner_node_id: str = ""


@dataclass(frozen=True, slots=True)
class Revoke:
    """Stop a task: the agent drops it if it holds it at ``epoch`` or older."""

    task_id: str
    epoch: int
    current_epoch: int
    reason: RevokeReason
    current_owner_node_id: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class Release:
    """Checkpoint, replicate and stop a task for a graceful move, within ``release_timeout_s``."""

    move_id: str
    task_id: str
    epoch: int
    reason: MoveReason
    release_timeout_s: float
    target_node_id: str = ""


@dataclass(frozen=True, slots=True)
class Drain:
    """The node was cordoned (``cancelled`` False) or its cordon lifted (True)."""

    drain_id: str
    reason: str = ""
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class TaskUpdateAck:
    """Verdict on one TaskUpdate; ACCEPTED is only sent after the change is persisted."""

    update_seq: int
    task_id: str
    epoch: int
    outcome: UpdateOutcome
    current_epoch: int
    message: str = ""


@dataclass(frozen=True, slots=True)
class LineageAck:
    """The leader recorded a reported fork (resolution KEPT: kept, not merged)."""

    fork_id: str
    task_id: str
    epoch: int


Directive = Welcome | HeartbeatAck | Assign | Revoke | Release | Drain | TaskUpdateAck | LineageAck
