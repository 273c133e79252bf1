"""Field-by-field conversion between the core's values and the wire / etcd messages.

Theory of operation: ``coordinator.core`` never imports generated stubs; this
module is the one place that knows both sides. It is mechanical and decides
nothing:

- enums map by number (``NodeState.DEAD.value == pb.NODE_STATE_DEAD``); an
  ``*_UNSPECIFIED`` (0) read from the wire becomes ``None`` where the core field
  is optional, and otherwise the core's default member, which the docstring of
  each reader names;
- times: the core's ``*_s`` floats are seconds on the leader's clock, anchored to
  Unix time (see ``coordinator.core.core``); the wire's ``*_unix_ms`` are
  integers. ``None`` <-> ``0`` ("never"); ``s -> ms`` rounds to the nearest
  millisecond, so ``ms -> s -> ms`` is exact and ``s -> ms -> s`` is exact for
  whole milliseconds;
- durations: core ``*_s`` <-> wire ``*_ms`` the same way;
- maps <-> sorted ``Labels`` tuples; optional messages <-> ``None`` by presence.

Readers (``*_from_pb``) never reject input: the core judges content (empty ids,
non-increasing seqs) and closes the Session if it must.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

from coordinator.core import directives as d
from coordinator.core import events as ev
from coordinator.core import notices as n
from coordinator.core.commands import EmitEvent
from coordinator.core.records import (
    AssignReason,
    CheckpointDurability,
    CheckpointSummary,
    HeldTask,
    HeldTaskStatus,
    Labels,
    MoveReason,
    NodeLoad,
    NodeRecord,
    NodeState,
    RevokeReason,
    StateModel,
    TaskError,
    TaskErrorCode,
    TaskMove,
    TaskProgress,
    TaskRecord,
    TaskResult,
    TaskSpec,
    TaskState,
    UpdateOutcome,
    as_labels,
)
from lazarus.v1 import agent_pb2, records_pb2

__all__ = [
    "UnknownChange",
    "checkpoint_from_pb",
    "checkpoint_to_pb",
    "directive_to_pb",
    "heartbeat_ack_to_pb",
    "heartbeat_to_event",
    "held_task_from_pb",
    "hello_to_event",
    "labels_of",
    "ms_to_s",
    "node_load_from_pb",
    "node_load_to_pb",
    "node_record_from_pb",
    "node_record_to_pb",
    "notice_to_pb",
    "s_to_ms",
    "task_error_from_pb",
    "task_error_to_pb",
    "task_record_from_pb",
    "task_record_to_pb",
    "task_spec_from_pb",
    "task_spec_to_pb",
    "task_update_to_event",
    "unknown_field_path",
]


class UnknownChange(ValueError):
    """A TaskUpdate carries no ``change`` (empty oneof); maps to INVALID_ARGUMENT."""


# ---------------------------------------------------------------------------
# Scalars.
# ---------------------------------------------------------------------------


def s_to_ms(value_s: float | None) -> int:
    """Seconds (None: never) to whole milliseconds (0: never), rounded to nearest."""
    return 0 if value_s is None else round(value_s * 1000.0)


def ms_to_s(value_ms: int) -> float | None:
    """Whole milliseconds (0: never) to seconds (None: never)."""
    return None if value_ms == 0 else value_ms / 1000.0


def _dur_ms(value_s: float) -> int:
    return max(0, round(value_s * 1000.0))


def labels_of(mapping: Mapping[str, str]) -> Labels:
    """A proto ``map<string, string>`` -> sorted ``Labels``."""
    return as_labels(dict(mapping))


# ---------------------------------------------------------------------------
# Record parts.
# ---------------------------------------------------------------------------


def checkpoint_to_pb(value: CheckpointSummary) -> records_pb2.CheckpointSummary:
    """Core CheckpointSummary -> records.proto CheckpointSummary."""
    return records_pb2.CheckpointSummary(
        checkpoint_ref=value.checkpoint_ref,
        task_id=value.task_id,
        epoch=value.epoch,
        seq=value.seq,
        covers_journal_seq=value.covers_journal_seq,
        terminal=value.terminal,
        label=value.label,
        created_at_unix_ms=value.created_at_unix_ms,
        stored_bytes=value.stored_bytes,
        replicated=value.replicated,
        node_id=value.node_id,
        parent_ref=value.parent_ref,
    )


def checkpoint_from_pb(msg: records_pb2.CheckpointSummary) -> CheckpointSummary:
    """records.proto CheckpointSummary -> core CheckpointSummary."""
    return CheckpointSummary(
        checkpoint_ref=msg.checkpoint_ref,
        epoch=msg.epoch,
        seq=msg.seq,
        covers_journal_seq=msg.covers_journal_seq,
        replicated=msg.replicated,
        terminal=msg.terminal,
        task_id=msg.task_id,
        label=msg.label,
        created_at_unix_ms=msg.created_at_unix_ms,
        stored_bytes=msg.stored_bytes,
        node_id=msg.node_id,
        parent_ref=msg.parent_ref,
    )


def _opt_checkpoint(
    parent: records_pb2.TaskRecord
    | agent_pb2.HeldTask
    | agent_pb2.TaskUpdate.Started
    | agent_pb2.TaskUpdate.Released,
    name: str,
) -> CheckpointSummary | None:
    if not parent.HasField(name):
        return None
    msg: records_pb2.CheckpointSummary = getattr(parent, name)
    return checkpoint_from_pb(msg)


def task_result_to_pb(value: TaskResult) -> records_pb2.TaskResult:
    """Core TaskResult -> records.proto TaskResult."""
    return records_pb2.TaskResult(
        payload=value.payload,
        content_type=value.content_type,
        size_bytes=value.size_bytes,
        redis_key=value.redis_key,
        crc32=value.crc32,
    )


def task_result_from_pb(msg: records_pb2.TaskResult) -> TaskResult:
    """records.proto TaskResult -> core TaskResult."""
    return TaskResult(
        payload=msg.payload,
        content_type=msg.content_type,
        size_bytes=msg.size_bytes,
        redis_key=msg.redis_key,
        crc32=msg.crc32,
    )


def task_error_to_pb(value: TaskError) -> records_pb2.TaskError:
    """Core TaskError -> records.proto TaskError."""
    return records_pb2.TaskError(
        code=value.code.value,  # type: ignore[arg-type]
        message=value.message,
        exception_type=value.exception_type,
        traceback=value.traceback,
        retryable=value.retryable,
        node_id=value.node_id,
        epoch=value.epoch,
        attempt=value.attempt,
        occurred_at_unix_ms=value.occurred_at_unix_ms,
    )


def task_error_from_pb(msg: records_pb2.TaskError) -> TaskError:
    """records.proto TaskError -> core TaskError; code UNSPECIFIED reads as INTERNAL."""
    code = TaskErrorCode(msg.code) if msg.code else TaskErrorCode.INTERNAL
    return TaskError(
        code=code,
        message=msg.message,
        retryable=msg.retryable,
        exception_type=msg.exception_type,
        traceback=msg.traceback,
        node_id=msg.node_id,
        epoch=msg.epoch,
        attempt=msg.attempt,
        occurred_at_unix_ms=msg.occurred_at_unix_ms,
    )


def task_spec_to_pb(value: TaskSpec) -> records_pb2.TaskSpec:
    """Core TaskSpec -> records.proto TaskSpec."""
    return records_pb2.TaskSpec(
        kind=value.kind,
        payload=value.payload,
        content_type=value.content_type,
        labels=dict(value.labels),
        node_selector=dict(value.node_selector),
        slots=value.slots,
        priority=value.priority,
        max_attempts=value.max_attempts,
        deadline_unix_ms=s_to_ms(value.deadline_s),
        durability=value.durability.value,  # type: ignore[arg-type]
        state_model=value.state_model.value,  # type: ignore[arg-type]
        checkpoint_interval_ms=value.checkpoint_interval_ms,
    )


def task_spec_from_pb(msg: records_pb2.TaskSpec) -> TaskSpec:
    """records.proto TaskSpec -> core TaskSpec (``slots`` kept as sent; 0 means 1)."""
    return TaskSpec(
        kind=msg.kind,
        payload=msg.payload,
        content_type=msg.content_type,
        labels=labels_of(msg.labels),
        node_selector=labels_of(msg.node_selector),
        slots=msg.slots,
        priority=msg.priority,
        max_attempts=msg.max_attempts,
        deadline_s=ms_to_s(msg.deadline_unix_ms),
        durability=CheckpointDurability(msg.durability),
        state_model=StateModel(msg.state_model),
        checkpoint_interval_ms=msg.checkpoint_interval_ms,
    )


def task_move_to_pb(value: TaskMove) -> records_pb2.TaskMove:
    """Core TaskMove -> records.proto TaskMove."""
    return records_pb2.TaskMove(
        move_id=value.move_id,
        reason=value.reason.value,  # type: ignore[arg-type]
        target_node_id=value.target_node_id,
        requested_at_unix_ms=s_to_ms(value.requested_at_s),
        release_deadline_unix_ms=s_to_ms(value.release_deadline_s),
    )


def task_move_from_pb(msg: records_pb2.TaskMove) -> TaskMove:
    """records.proto TaskMove -> core TaskMove (reason UNSPECIFIED reads as MIGRATE)."""
    return TaskMove(
        move_id=msg.move_id,
        reason=MoveReason(msg.reason) if msg.reason else MoveReason.MIGRATE,
        requested_at_s=msg.requested_at_unix_ms / 1000.0,
        release_deadline_s=msg.release_deadline_unix_ms / 1000.0,
        target_node_id=msg.target_node_id,
    )


def node_load_to_pb(value: NodeLoad) -> records_pb2.NodeLoad:
    """Core NodeLoad -> records.proto NodeLoad."""
    return records_pb2.NodeLoad(
        running_tasks=value.running_tasks,
        used_slots=value.used_slots,
        cpu_utilization_ratio=value.cpu_utilization_ratio,
        memory_used_bytes=value.memory_used_bytes,
        replication_backlog_records=value.replication_backlog_records,
        replication_lag_ms=value.replication_lag_ms,
    )


_LOADS: dict[bytes, NodeLoad] = {}
"""Recently converted loads by their wire bytes (bounded by :data:`_MAX_LOADS`)."""
_MAX_LOADS = 4096


def node_load_from_pb(msg: records_pb2.NodeLoad) -> NodeLoad:
    """records.proto NodeLoad -> core NodeLoad.

    Loads repeat from heartbeat to heartbeat (an idle node's is the same for
    hours), and NodeLoad is immutable: a load seen recently is reused by its
    wire bytes instead of built again, which is most of a heartbeat's
    conversion on the leader.
    """
    key = msg.SerializeToString(deterministic=True)
    load = _LOADS.get(key)
    if load is None:
        if len(_LOADS) >= _MAX_LOADS:
            _LOADS.clear()
        load = _LOADS[key] = _node_load_from_pb(msg)
    return load


def _node_load_from_pb(msg: records_pb2.NodeLoad) -> NodeLoad:
    return NodeLoad(
        running_tasks=msg.running_tasks,
        used_slots=msg.used_slots,
        cpu_utilization_ratio=msg.cpu_utilization_ratio,
        memory_used_bytes=msg.memory_used_bytes,
        replication_backlog_records=msg.replication_backlog_records,
        replication_lag_ms=msg.replication_lag_ms,
    )


# ---------------------------------------------------------------------------
# Records (etcd values).
# ---------------------------------------------------------------------------


def node_record_to_pb(value: NodeRecord) -> records_pb2.NodeRecord:
    """Core NodeRecord -> records.proto NodeRecord (the etcd value of ``nodes/<id>``)."""
    return records_pb2.NodeRecord(
        node_id=value.node_id,
        incarnation=value.incarnation,
        address=value.address,
        capacity=records_pb2.NodeCapacity(
            slots=value.capacity_slots,
            cpu_millicores=value.capacity_cpu_millicores,
            memory_bytes=value.capacity_memory_bytes,
        ),
        labels=dict(value.labels),
        state=value.state.value,  # type: ignore[arg-type]
        cordoned=value.cordoned,
        drain_id=value.drain_id,
        drain_reason=value.drain_reason,
        registered_at_unix_ms=s_to_ms(value.registered_at_s),
        incarnation_started_at_unix_ms=s_to_ms(value.incarnation_started_at_s),
        state_changed_at_unix_ms=s_to_ms(value.state_changed_at_s),
        last_heartbeat_at_unix_ms=s_to_ms(value.last_heartbeat_at_s),
        agent_version=value.agent_version,
        written_term=value.written_term,
        kinds=list(value.kinds),
        incarnation_secret_sha256=value.incarnation_secret_sha256,
        store_id=value.store_id,
    )


def public_node_record_to_pb(value: NodeRecord) -> records_pb2.NodeRecord:
    """``node_record_to_pb`` for API replies: without the incarnation secret's hash.

    The hash is kept for the leader's identity checks only (DESIGN.md §4); no
    caller of the orchestrator API needs it.
    """
    msg = node_record_to_pb(value)
    msg.ClearField("incarnation_secret_sha256")
    return msg


def node_record_from_pb(msg: records_pb2.NodeRecord) -> NodeRecord:
    """records.proto NodeRecord -> core NodeRecord (state UNSPECIFIED reads as SUSPECT)."""
    return NodeRecord(
        node_id=msg.node_id,
        incarnation=msg.incarnation,
        state=NodeState(msg.state) if msg.state else NodeState.SUSPECT,
        address=msg.address,
        capacity_slots=msg.capacity.slots,
        capacity_cpu_millicores=msg.capacity.cpu_millicores,
        capacity_memory_bytes=msg.capacity.memory_bytes,
        labels=labels_of(msg.labels),
        kinds=tuple(msg.kinds),
        cordoned=msg.cordoned,
        drain_id=msg.drain_id,
        drain_reason=msg.drain_reason,
        registered_at_s=ms_to_s(msg.registered_at_unix_ms),
        incarnation_started_at_s=ms_to_s(msg.incarnation_started_at_unix_ms),
        state_changed_at_s=ms_to_s(msg.state_changed_at_unix_ms),
        last_heartbeat_at_s=ms_to_s(msg.last_heartbeat_at_unix_ms),
        agent_version=msg.agent_version,
        written_term=msg.written_term,
        incarnation_secret_sha256=bytes(msg.incarnation_secret_sha256),
        store_id=msg.store_id,
    )


def task_record_to_pb(value: TaskRecord) -> records_pb2.TaskRecord:
    """Core TaskRecord -> records.proto TaskRecord (the etcd value of ``tasks/<id>``)."""
    msg = records_pb2.TaskRecord(
        task_id=value.task_id,
        spec=task_spec_to_pb(value.spec),
        state=value.state.value,  # type: ignore[arg-type]
        epoch=value.epoch,
        attempt=value.attempt,
        owner_node_id=value.owner_node_id,
        owner_incarnation=value.owner_incarnation,
        request_id=value.request_id,
        submitted_at_unix_ms=s_to_ms(value.submitted_at_s),
        assigned_at_unix_ms=s_to_ms(value.assigned_at_s),
        started_at_unix_ms=s_to_ms(value.started_at_s),
        finished_at_unix_ms=s_to_ms(value.finished_at_s),
        updated_at_unix_ms=s_to_ms(value.updated_at_s),
        last_replicated_journal_seq=value.last_replicated_journal_seq,
        cancel_reason=value.cancel_reason,
        forked_from_ref=value.forked_from_ref,
        fork_count=value.fork_count,
        previous_owner_node_ids=list(value.previous_owner_node_ids),
        written_term=value.written_term,
    )
    if value.last_checkpoint is not None:
        msg.last_checkpoint.CopyFrom(checkpoint_to_pb(value.last_checkpoint))
    if value.last_replicated_checkpoint is not None:
        msg.last_replicated_checkpoint.CopyFrom(checkpoint_to_pb(value.last_replicated_checkpoint))
    if value.result is not None:
        msg.result.CopyFrom(task_result_to_pb(value.result))
    if value.last_error is not None:
        msg.last_error.CopyFrom(task_error_to_pb(value.last_error))
    if value.move is not None:
        msg.move.CopyFrom(task_move_to_pb(value.move))
    return msg


def task_record_from_pb(msg: records_pb2.TaskRecord) -> TaskRecord:
    """records.proto TaskRecord -> core TaskRecord (state UNSPECIFIED reads as PENDING)."""
    return TaskRecord(
        task_id=msg.task_id,
        request_id=msg.request_id,
        spec=task_spec_from_pb(msg.spec),
        state=TaskState(msg.state) if msg.state else TaskState.PENDING,
        epoch=msg.epoch,
        attempt=msg.attempt,
        owner_node_id=msg.owner_node_id,
        owner_incarnation=msg.owner_incarnation,
        submitted_at_s=ms_to_s(msg.submitted_at_unix_ms),
        assigned_at_s=ms_to_s(msg.assigned_at_unix_ms),
        started_at_s=ms_to_s(msg.started_at_unix_ms),
        finished_at_s=ms_to_s(msg.finished_at_unix_ms),
        updated_at_s=ms_to_s(msg.updated_at_unix_ms),
        last_checkpoint=_opt_checkpoint(msg, "last_checkpoint"),
        last_replicated_checkpoint=_opt_checkpoint(msg, "last_replicated_checkpoint"),
        last_replicated_journal_seq=msg.last_replicated_journal_seq,
        result=task_result_from_pb(msg.result) if msg.HasField("result") else None,
        last_error=task_error_from_pb(msg.last_error) if msg.HasField("last_error") else None,
        move=task_move_from_pb(msg.move) if msg.HasField("move") else None,
        cancel_reason=msg.cancel_reason,
        forked_from_ref=msg.forked_from_ref,
        fork_count=msg.fork_count,
        previous_owner_node_ids=tuple(msg.previous_owner_node_ids),
        written_term=msg.written_term,
    )


# ---------------------------------------------------------------------------
# Agent -> coordinator (Session messages to events).
# ---------------------------------------------------------------------------


def held_task_from_pb(msg: agent_pb2.HeldTask) -> HeldTask:
    """agent.proto HeldTask -> core HeldTask (status UNSPECIFIED reads as RUNNING)."""
    return HeldTask(
        task_id=msg.task_id,
        epoch=msg.epoch,
        status=HeldTaskStatus(msg.status) if msg.status else HeldTaskStatus.RUNNING,
        checkpoint_seq=msg.checkpoint.seq if msg.HasField("checkpoint") else 0,
        replicated_checkpoint_seq=msg.replicated_checkpoint_seq,
    )


def task_progress_from_pb(msg: agent_pb2.TaskProgress) -> TaskProgress:
    """agent.proto TaskProgress -> core TaskProgress (the fields the core uses)."""
    return TaskProgress(
        task_id=msg.task_id,
        epoch=msg.epoch,
        checkpoint_seq=msg.checkpoint_seq,
        replicated_checkpoint_seq=msg.replicated_checkpoint_seq,
    )


def hello_to_event(session_id: str, msg: agent_pb2.Hello, now_s: float) -> ev.SessionOpened:
    """A Hello on a Session -> SessionOpened (capacity.slots passed as sent; the core checks).

    The incarnation secret is hashed here (SHA-256) and never passed further:
    the leader keeps only the hash (DESIGN.md §4).
    """
    secret = bytes(msg.incarnation_secret)
    return ev.SessionOpened(
        session_id=session_id,
        node_id=msg.node_id,
        incarnation=msg.incarnation,
        now_s=now_s,
        address=msg.address,
        capacity_slots=msg.capacity.slots,
        capacity_cpu_millicores=msg.capacity.cpu_millicores,
        capacity_memory_bytes=msg.capacity.memory_bytes,
        labels=labels_of(msg.labels),
        kinds=tuple(msg.kinds),
        held_tasks=tuple(held_task_from_pb(h) for h in msg.held_tasks),
        agent_version=msg.agent_version,
        incarnation_secret_sha256=hashlib.sha256(secret).digest() if secret else b"",
        store_id=msg.store_id,
        store_previous_incarnation=msg.store_previous_incarnation,
        hello_seq=msg.hello_seq,
    )


def heartbeat_to_event(
    session_id: str, node_id: str, msg: agent_pb2.Heartbeat, now_s: float
) -> ev.HeartbeatReceived:
    """A Heartbeat on a Session bound to ``node_id`` -> HeartbeatReceived."""
    return ev.HeartbeatReceived(
        session_id=session_id,
        node_id=node_id,
        seq=msg.seq,
        now_s=now_s,
        load=node_load_from_pb(msg.load),
        tasks=tuple(task_progress_from_pb(p) for p in msg.tasks) if msg.tasks else (),
    )


def _change_from_pb(msg: agent_pb2.TaskUpdate) -> ev.TaskChange:
    which = msg.WhichOneof("change")
    if which == "started":
        return ev.Started(
            resumed_from=_opt_checkpoint(msg.started, "resumed_from"),
            from_redis=msg.started.location == records_pb2.CHECKPOINT_LOCATION_REDIS,
            replayed_journal_events=msg.started.replayed_journal_events,
            resume_point_s=msg.started.resume_point_unix_ms / 1000.0
            if msg.started.resume_point_unix_ms
            else None,
        )
    if which == "checkpointed":
        c = msg.checkpointed
        return ev.Checkpointed(
            checkpoint=checkpoint_from_pb(c.checkpoint),
            journal_seq=c.journal_seq,
            replicated_journal_seq=c.replicated_journal_seq,
        )
    if which == "completed":
        return ev.Completed(result=task_result_from_pb(msg.completed.result))
    if which == "failed":
        return ev.Failed(error=task_error_from_pb(msg.failed.error))
    if which == "released":
        r = msg.released
        return ev.Released(
            move_id=r.move_id,
            checkpoint=_opt_checkpoint(r, "checkpoint"),
            journal_seq=r.journal_seq,
        )
    raise UnknownChange("task_update.change: must be set")


def lineage_report_to_event(
    session_id: str, node_id: str, msg: agent_pb2.LineageReport, now_s: float
) -> ev.LineageReported:
    """A LineageReport -> ``LineageReported`` (counts and ranges; the records stay in Redis).

    Raises:
        ValueError: ``fork_id`` or ``task_id`` empty, or ``epoch`` < 1 (names the field).
    """
    if not msg.fork_id:
        raise ValueError("lineage_report.fork_id: must not be empty")
    if not msg.task_id:
        raise ValueError("lineage_report.task_id: must not be empty")
    if msg.epoch < 1:
        raise ValueError("lineage_report.epoch: must be >= 1")
    seqs = [e.seq for e in msg.journal_events]
    return ev.LineageReported(
        session_id=session_id,
        node_id=node_id,
        now_s=now_s,
        fork_id=msg.fork_id,
        task_id=msg.task_id,
        epoch=msg.epoch,
        divergent_checkpoints=len(msg.checkpoints),
        divergent_events=len(msg.journal_events),
        first_journal_seq=min(seqs, default=0),
        last_journal_seq=max(seqs, default=0),
        head_checkpoint_seq=max((c.seq for c in msg.checkpoints), default=0),
    )


def task_update_to_event(
    session_id: str, node_id: str, msg: agent_pb2.TaskUpdate, now_s: float
) -> ev.TaskUpdateReceived:
    """A TaskUpdate on a Session bound to ``node_id`` -> TaskUpdateReceived.

    Raises:
        UnknownChange: the ``change`` oneof is empty (INVALID_ARGUMENT).
    """
    return ev.TaskUpdateReceived(
        session_id=session_id,
        node_id=node_id,
        update_seq=msg.update_seq,
        task_id=msg.task_id,
        epoch=msg.epoch,
        change=_change_from_pb(msg),
        now_s=now_s,
    )


# ---------------------------------------------------------------------------
# Coordinator -> agent (directives to CoordinatorMessage).
# ---------------------------------------------------------------------------


def heartbeat_ack_to_pb(
    directive: d.HeartbeatAck,
    now_s: float | None,
    echo: tuple[int, int] = (0, 0),
    into: agent_pb2.HeartbeatAck | None = None,
) -> agent_pb2.HeartbeatAck:
    """A HeartbeatAck directive -> its message, received at ``now_s`` (leader clock).

    Args:
        directive: the core's ack.
        now_s: the leader's clock (``received_at_unix_ms``; None: 0).
        echo: the heartbeat's (sent_at_unix_ms, sent_at_monotonic_ms), echoed.
        into: fill this message (a CoordinatorMessage's ``heartbeat_ack``: no
            copy) instead of a new one.

    Returns:
        The filled message.
    """
    ack = into if into is not None else agent_pb2.HeartbeatAck()
    ack.seq = directive.seq
    ack.sent_at_unix_ms, ack.sent_at_monotonic_ms = echo
    ack.received_at_unix_ms = s_to_ms(now_s)
    ack.term = directive.term
    ack.node_state = directive.node_state.value  # type: ignore[assignment]
    return ack


def directive_to_pb(
    directive: d.Directive,
    *,
    session_id: str = "",
    leader_id: str = "",
    cluster_name: str = "",
    now_s: float | None = None,
    max_message_bytes: int = 0,
    max_payload_bytes: int = 0,
    protocol_version: int = 1,
) -> agent_pb2.CoordinatorMessage:
    """A core directive -> the matching CoordinatorMessage member.

    Args:
        directive: what the core decided to send.
        session_id, leader_id, cluster_name, max_*_bytes, protocol_version:
            Welcome fields the core does not decide, from the shell.
        now_s: the leader's clock, for Welcome.server_time_unix_ms and
            HeartbeatAck.received_at_unix_ms.

    Returns:
        A CoordinatorMessage with exactly one body member set.
    """
    now_ms = s_to_ms(now_s)
    if isinstance(directive, d.Welcome):
        return agent_pb2.CoordinatorMessage(
            welcome=agent_pb2.Welcome(
                session_id=session_id,
                term=directive.term,
                leader_id=leader_id,
                heartbeat_interval_ms=_dur_ms(directive.heartbeat_interval_s),
                fence_after_ms=_dur_ms(directive.fence_after_s),
                dead_after_ms=_dur_ms(directive.dead_after_s),
                node_state=directive.node_state.value,  # type: ignore[arg-type]
                cluster_name=cluster_name,
                server_time_unix_ms=now_ms,
                max_message_bytes=max_message_bytes,
                max_payload_bytes=max_payload_bytes,
                protocol_version=protocol_version,
                hello_seq=directive.hello_seq,
            )
        )
    if isinstance(directive, d.HeartbeatAck):
        message = agent_pb2.CoordinatorMessage()
        heartbeat_ack_to_pb(directive, now_s, into=message.heartbeat_ack)
        return message
    if isinstance(directive, d.Assign):
        assign = agent_pb2.Assign(
            task_id=directive.task_id,
            epoch=directive.epoch,
            attempt=directive.attempt,
            spec=task_spec_to_pb(directive.spec),
            reason=directive.reason.value,  # type: ignore[arg-type]
            move_reason=(
                0 if directive.move_reason is None else directive.move_reason.value  # type: ignore[arg-type]
            ),
            previous_owner_node_id=directive.previous_owner_node_id,
            assigned_at_unix_ms=now_ms,
        )
        resume = directive.resume_from
        if resume is not None:
            assign.resume_from.checkpoint.CopyFrom(checkpoint_to_pb(resume))
            assign.resume_from.location = (
                records_pb2.CHECKPOINT_LOCATION_REDIS
                if resume.replicated
                else records_pb2.CHECKPOINT_LOCATION_LOCAL
            )
        if directive.replay_through_journal_seq:
            assign.resume_from.replay_through_journal_seq = directive.replay_through_journal_seq
        return agent_pb2.CoordinatorMessage(assign=assign)
    if isinstance(directive, d.Revoke):
        return agent_pb2.CoordinatorMessage(
            revoke=agent_pb2.Revoke(
                task_id=directive.task_id,
                epoch=directive.epoch,
                current_epoch=directive.current_epoch,
                reason=directive.reason.value,  # type: ignore[arg-type]
                current_owner_node_id=directive.current_owner_node_id,
                message=directive.message,
            )
        )
    if isinstance(directive, d.Release):
        return agent_pb2.CoordinatorMessage(
            release=agent_pb2.Release(
                move_id=directive.move_id,
                task_id=directive.task_id,
                epoch=directive.epoch,
                reason=directive.reason.value,  # type: ignore[arg-type]
                target_node_id=directive.target_node_id,
                release_deadline_ms=_dur_ms(directive.release_timeout_s),
            )
        )
    if isinstance(directive, d.Drain):
        return agent_pb2.CoordinatorMessage(
            drain=agent_pb2.Drain(
                drain_id=directive.drain_id,
                reason=directive.reason,
                cancelled=directive.cancelled,
            )
        )
    if isinstance(directive, d.LineageAck):
        return agent_pb2.CoordinatorMessage(
            lineage_ack=agent_pb2.LineageAck(
                fork_id=directive.fork_id,
                task_id=directive.task_id,
                epoch=directive.epoch,
                resolution=records_pb2.FORK_RESOLUTION_KEPT,
            )
        )
    return agent_pb2.CoordinatorMessage(
        task_update_ack=agent_pb2.TaskUpdateAck(
            update_seq=directive.update_seq,
            task_id=directive.task_id,
            epoch=directive.epoch,
            outcome=directive.outcome.value,  # type: ignore[arg-type]
            current_epoch=directive.current_epoch,
            message=directive.message,
        )
    )


def directive_from_pb(msg: agent_pb2.CoordinatorMessage) -> d.Directive:
    """A CoordinatorMessage -> core directive (for tests and fake agents).

    Raises:
        ValueError: the body is not one of the core's directives.
    """
    which = msg.WhichOneof("body")
    if which == "welcome":
        w = msg.welcome
        return d.Welcome(
            term=w.term,
            heartbeat_interval_s=w.heartbeat_interval_ms / 1000.0,
            fence_after_s=w.fence_after_ms / 1000.0,
            dead_after_s=w.dead_after_ms / 1000.0,
            node_state=NodeState(w.node_state),
            hello_seq=w.hello_seq,
        )
    if which == "heartbeat_ack":
        a = msg.heartbeat_ack
        return d.HeartbeatAck(seq=a.seq, term=a.term, node_state=NodeState(a.node_state))
    if which == "assign":
        s = msg.assign
        has_resume = s.resume_from.HasField("checkpoint")
        return d.Assign(
            task_id=s.task_id,
            epoch=s.epoch,
            attempt=s.attempt,
            spec=task_spec_from_pb(s.spec),
            reason=AssignReason(s.reason),
            resume_from=checkpoint_from_pb(s.resume_from.checkpoint) if has_resume else None,
            replay_through_journal_seq=s.resume_from.replay_through_journal_seq,
            move_reason=MoveReason(s.move_reason) if s.move_reason else None,
            previous_owner_node_id=s.previous_owner_node_id,
        )
    if which == "revoke":
        r = msg.revoke
        return d.Revoke(
            task_id=r.task_id,
            epoch=r.epoch,
            current_epoch=r.current_epoch,
            reason=RevokeReason(r.reason),
            current_owner_node_id=r.current_owner_node_id,
            message=r.message,
        )
    if which == "release":
        rel = msg.release
        return d.Release(
            move_id=rel.move_id,
            task_id=rel.task_id,
            epoch=rel.epoch,
            reason=MoveReason(rel.reason),
            release_timeout_s=rel.release_deadline_ms / 1000.0,
            target_node_id=rel.target_node_id,
        )
    if which == "drain":
        dr = msg.drain
        return d.Drain(drain_id=dr.drain_id, reason=dr.reason, cancelled=dr.cancelled)
    if which == "task_update_ack":
        k = msg.task_update_ack
        return d.TaskUpdateAck(
            update_seq=k.update_seq,
            task_id=k.task_id,
            epoch=k.epoch,
            outcome=UpdateOutcome(k.outcome),
            current_epoch=k.current_epoch,
            message=k.message,
        )
    if which == "lineage_ack":
        la = msg.lineage_ack
        return d.LineageAck(fork_id=la.fork_id, task_id=la.task_id, epoch=la.epoch)
    raise ValueError(f"CoordinatorMessage.{which}: not a core directive")


# ---------------------------------------------------------------------------
# Notices (EmitEvent) -> records.proto Event.
# ---------------------------------------------------------------------------


def notice_to_pb(command: EmitEvent, revision: int = 0) -> records_pb2.Event:
    """An EmitEvent command -> a records.proto Event with the matching body.

    Args:
        command: the core's EmitEvent (term, time, notice).
        revision: the event log revision, when the shell has one (0: none).
    """
    out = records_pb2.Event(
        revision=revision,
        occurred_at_unix_ms=s_to_ms(command.occurred_at_s),
        term=command.term,
    )
    b = command.body
    if isinstance(b, n.NodeJoined):
        out.node_joined.CopyFrom(
            records_pb2.NodeJoined(
                node_id=b.node_id,
                incarnation=b.incarnation,
                previous_incarnation=b.previous_incarnation,
                address=b.address,
                held_tasks=b.held_tasks,
            )
        )
    elif isinstance(b, n.IdentityConflict):
        out.identity_conflict.CopyFrom(
            records_pb2.IdentityConflict(
                node_id=b.node_id,
                holder_incarnation=b.holder_incarnation,
                claimant_incarnation=b.claimant_incarnation,
                claimant_address=b.claimant_address,
                holder_heard_ago_ms=_dur_ms(b.holder_heard_ago_s or 0.0),
                reason=b.reason,
            )
        )
    elif isinstance(b, n.NodeSuspected):
        out.node_suspected.CopyFrom(
            records_pb2.NodeSuspected(
                node_id=b.node_id,
                incarnation=b.incarnation,
                reason=b.reason.value,  # type: ignore[arg-type]
                last_heartbeat_at_unix_ms=s_to_ms(b.last_heartbeat_at_s),
                phi=b.phi,
            )
        )
    elif isinstance(b, n.NodeRecovered):
        out.node_recovered.CopyFrom(
            records_pb2.NodeRecovered(
                node_id=b.node_id,
                incarnation=b.incarnation,
                previous_state=b.previous_state.value,  # type: ignore[arg-type]
                unavailable_ms=_dur_ms(b.unavailable_s),
            )
        )
    elif isinstance(b, n.NodeDead):
        out.node_dead.CopyFrom(
            records_pb2.NodeDead(
                node_id=b.node_id,
                incarnation=b.incarnation,
                last_heartbeat_at_unix_ms=s_to_ms(b.last_heartbeat_at_s),
                detection_ms=_dur_ms(b.detection_s),
                tasks_to_move=b.tasks_to_move,
            )
        )
    elif isinstance(b, n.NodeDraining):
        out.node_draining.CopyFrom(
            records_pb2.NodeDraining(
                node_id=b.node_id,
                drain_id=b.drain_id,
                reason=b.reason,
                tasks_to_move=b.tasks_to_move,
            )
        )
    elif isinstance(b, n.NodeUncordoned):
        out.node_uncordoned.CopyFrom(
            records_pb2.NodeUncordoned(node_id=b.node_id, drain_id=b.drain_id)
        )
    elif isinstance(b, n.NodeLeft):
        out.node_left.CopyFrom(
            records_pb2.NodeLeft(
                node_id=b.node_id,
                incarnation=b.incarnation,
                reason=b.reason,
                tasks_to_move=b.tasks_to_move,
            )
        )
    elif isinstance(b, n.MassFailureGuardChanged):
        out.mass_failure_guard.CopyFrom(
            records_pb2.MassFailureGuardChanged(
                active=b.active,
                dead_nodes=b.dead_nodes,
                total_nodes=b.total_nodes,
                threshold_ratio=b.threshold_ratio,
            )
        )
    elif isinstance(b, n.TaskSubmitted):
        out.task_submitted.CopyFrom(
            records_pb2.TaskSubmitted(task_id=b.task_id, kind=b.kind, request_id=b.request_id)
        )
    elif isinstance(b, n.TaskForked):
        out.task_forked.CopyFrom(
            records_pb2.TaskForked(
                task_id=b.task_id, from_checkpoint_ref=b.from_checkpoint_ref, edits=b.edits
            )
        )
    elif isinstance(b, n.TaskAssigned):
        out.task_assigned.CopyFrom(
            records_pb2.TaskAssigned(
                task_id=b.task_id, node_id=b.node_id, epoch=b.epoch, attempt=b.attempt
            )
        )
    elif isinstance(b, n.TaskReassigned):
        out.task_reassigned.CopyFrom(
            records_pb2.TaskReassigned(
                task_id=b.task_id,
                from_node_id=b.from_node_id,
                to_node_id=b.to_node_id,
                epoch=b.epoch,
                resume_seq=b.resume_seq,
                resume_covers_journal_seq=b.resume_covers_journal_seq,
                reason=b.reason.value,  # type: ignore[arg-type]
                attempt=b.attempt,
            )
        )
    elif isinstance(b, n.TaskStarted):
        out.task_started.CopyFrom(
            records_pb2.TaskStarted(
                task_id=b.task_id, node_id=b.node_id, epoch=b.epoch, attempt=b.attempt
            )
        )
    elif isinstance(b, n.TaskResumed):
        out.task_resumed.CopyFrom(
            records_pb2.TaskResumed(
                task_id=b.task_id,
                node_id=b.node_id,
                epoch=b.epoch,
                resumed_from_seq=b.resumed_from_seq,
                location=records_pb2.CHECKPOINT_LOCATION_REDIS
                if b.from_redis
                else records_pb2.CHECKPOINT_LOCATION_LOCAL,
                replayed_journal_events=b.replayed_journal_events,
                interruption_ms=round(b.interruption_s * 1000),
                work_redone_ms=round(b.work_redone_s * 1000),
                redone_checkpoints=b.redone_checkpoints,
            )
        )
    elif isinstance(b, n.RecoveryCompleted):
        out.recovery_completed.CopyFrom(
            records_pb2.RecoveryCompleted(
                node_id=b.node_id,
                incarnation=b.incarnation,
                tasks_recovered=b.tasks_recovered,
                tasks_failed=b.tasks_failed,
                detection_ms=round(b.detection_s * 1000),
                recovery_ms=round(b.recovery_s * 1000),
            )
        )
    elif isinstance(b, n.TaskCompleted):
        out.task_completed.CopyFrom(
            records_pb2.TaskCompleted(
                task_id=b.task_id,
                node_id=b.node_id,
                epoch=b.epoch,
                attempt=b.attempt,
                result_bytes=b.result_bytes,
                total_ms=_dur_ms(b.total_s),
            )
        )
    elif isinstance(b, n.TaskFailed):
        out.task_failed.CopyFrom(
            records_pb2.TaskFailed(
                task_id=b.task_id,
                node_id=b.node_id,
                epoch=b.epoch,
                error=task_error_to_pb(b.error),
                will_retry=b.will_retry,
            )
        )
    elif isinstance(b, n.TaskCancelled):
        out.task_cancelled.CopyFrom(
            records_pb2.TaskCancelled(task_id=b.task_id, node_id=b.node_id, reason=b.reason)
        )
    elif isinstance(b, n.ConflictDetected):
        out.conflict_detected.fork.CopyFrom(
            records_pb2.ForkRecord(
                fork_id=b.fork_id,
                task_id=b.task_id,
                lineage_task_id=b.task_id,
                node_id=b.node_id,
                stale_epoch=b.stale_epoch,
                current_epoch=b.current_epoch,
                divergent_checkpoints=b.divergent_checkpoints,
                divergent_journal_events=b.divergent_events,
                first_divergent_journal_seq=b.first_journal_seq,
                last_divergent_journal_seq=b.last_journal_seq,
                head_checkpoint=records_pb2.CheckpointSummary(
                    task_id=b.task_id, seq=b.head_checkpoint_seq, epoch=b.stale_epoch
                )
                if b.head_checkpoint_seq
                else None,
                resolution=records_pb2.FORK_RESOLUTION_KEPT,
                detected_at_unix_ms=out.occurred_at_unix_ms,
                written_term=out.term,
            )
        )
    elif isinstance(b, n.RecordQuarantined):
        out.record_quarantined.CopyFrom(
            records_pb2.RecordQuarantined(collection=b.collection, name=b.name, reason=b.reason)
        )
    else:
        out.zombie_fenced.CopyFrom(
            records_pb2.ZombieFenced(
                node_id=b.node_id,
                incarnation=b.incarnation,
                task_id=b.task_id,
                stale_epoch=b.stale_epoch,
                current_epoch=b.current_epoch,
                current_owner_node_id=b.current_owner_node_id,
                source=b.source.value,  # type: ignore[arg-type]
            )
        )
    return out


# ---------------------------------------------------------------------------
# Validation.
# ---------------------------------------------------------------------------


def unknown_field_path(message: Message, path: str = "") -> str | None:
    """The path of the first field ``message`` holds that its schema does not know.

    Args:
        message: a parsed message.
        path: prefix for the returned path.

    Returns:
        ``"<path>#<field number>"``, or None when every field is known.
    """
    unknown = UnknownFieldSet(message)
    if len(unknown):
        return f"{path or message.DESCRIPTOR.name}#{unknown[0].field_number}"
    for field, value in message.ListFields():
        name = f"{path}.{field.name}" if path else field.name
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            values = list(value.values()) if value_field.message_type is not None else []
        elif field.is_repeated:
            values = list(value)
        else:
            values = [value]
        for item in values:
            found = unknown_field_path(item, name)
            if found is not None:
                return found
    return None
