"""The agent core's edge: protobuf <-> ``node_agent.core.records``, and the stored TaskMeta.

The shell (``node_agent.agent``) and the fleet simulator (``lazarus_dev.fleetsim``)
call these and nothing else to talk to ``AgentCore``: messages read from the
Session go through ``coordinator_message_from_pb``; what the core sends goes
through ``agent_message_to_pb``. The core never sees a protobuf (DESIGN.md
§2; the shared purity test checks it), as ``coordinator.convert`` does for the
coordinator's core.

Errors: ``decode_meta`` raises ``ValueError`` naming the field for a stored
meta it cannot read; everything else accepts any well-formed message (an
enum number this build does not know becomes ``UNSPECIFIED``).
"""

from __future__ import annotations

import json

from google.protobuf.message import DecodeError

from lazarus.v1 import agent_pb2, records_pb2
from node_agent.core import TaskMeta
from node_agent.core import records as r
from node_agent.core.core import SlotState

__all__ = [
    "agent_message_to_pb",
    "assign_to_pb",
    "checkpoint_from_pb",
    "checkpoint_to_pb",
    "coordinator_message_from_pb",
    "decode_meta",
    "decode_metas",
    "encode_meta",
    "error_from_pb",
    "hello_to_pb",
    "result_from_pb",
    "started_from_pb",
    "task_update_from_pb",
    "task_update_to_pb",
]


# ---------------------------------------------------------------------------
# Summaries
# ---------------------------------------------------------------------------


def checkpoint_from_pb(pb: records_pb2.CheckpointSummary) -> r.CheckpointSummary:
    """``records.CheckpointSummary`` -> record."""
    return r.CheckpointSummary(
        checkpoint_ref=pb.checkpoint_ref,
        task_id=pb.task_id,
        epoch=pb.epoch,
        seq=pb.seq,
        covers_journal_seq=pb.covers_journal_seq,
        terminal=pb.terminal,
        label=pb.label,
        created_at_unix_ms=pb.created_at_unix_ms,
        stored_bytes=pb.stored_bytes,
        replicated=pb.replicated,
        node_id=pb.node_id,
        parent_ref=pb.parent_ref,
    )


def checkpoint_to_pb(
    rec: r.CheckpointSummary, into: records_pb2.CheckpointSummary | None = None
) -> records_pb2.CheckpointSummary:
    """Record -> ``records.CheckpointSummary`` (filled into ``into`` when given)."""
    pb = into if into is not None else records_pb2.CheckpointSummary()
    pb.checkpoint_ref = rec.checkpoint_ref
    pb.task_id = rec.task_id
    pb.epoch = rec.epoch
    pb.seq = rec.seq
    pb.covers_journal_seq = rec.covers_journal_seq
    pb.terminal = rec.terminal
    pb.label = rec.label
    pb.created_at_unix_ms = rec.created_at_unix_ms
    pb.stored_bytes = rec.stored_bytes
    pb.replicated = rec.replicated
    pb.node_id = rec.node_id
    pb.parent_ref = rec.parent_ref
    return pb


def result_from_pb(pb: records_pb2.TaskResult) -> r.TaskResult:
    """``records.TaskResult`` -> record."""
    return r.TaskResult(pb.payload, pb.content_type, pb.size_bytes, pb.redis_key, pb.crc32)


def _result_to_pb(rec: r.TaskResult, pb: records_pb2.TaskResult) -> None:
    pb.payload = rec.payload
    pb.content_type = rec.content_type
    pb.size_bytes = rec.size_bytes
    pb.redis_key = rec.redis_key
    pb.crc32 = rec.crc32


def error_from_pb(pb: records_pb2.TaskError) -> r.TaskError:
    """``records.TaskError`` -> record (``code`` stays the wire number)."""
    return r.TaskError(
        code=pb.code,
        message=pb.message,
        exception_type=pb.exception_type,
        traceback=pb.traceback,
        retryable=pb.retryable,
        node_id=pb.node_id,
        epoch=pb.epoch,
        attempt=pb.attempt,
        occurred_at_unix_ms=pb.occurred_at_unix_ms,
    )


def _error_to_pb(rec: r.TaskError, pb: records_pb2.TaskError) -> None:
    pb.code = rec.code  # type: ignore[assignment]
    pb.message = rec.message
    pb.exception_type = rec.exception_type
    pb.traceback = rec.traceback
    pb.retryable = rec.retryable
    pb.node_id = rec.node_id
    pb.epoch = rec.epoch
    pb.attempt = rec.attempt
    pb.occurred_at_unix_ms = rec.occurred_at_unix_ms


# ---------------------------------------------------------------------------
# Task updates
# ---------------------------------------------------------------------------


def started_from_pb(pb: agent_pb2.TaskUpdate.Started) -> r.Started:
    """``TaskUpdate.Started`` -> record."""
    return r.Started(
        resumed_from=checkpoint_from_pb(pb.resumed_from) if pb.HasField("resumed_from") else None,
        location=pb.location,
        replayed_journal_events=pb.replayed_journal_events,
        restore_ms=pb.restore_ms,
        resume_point_unix_ms=pb.resume_point_unix_ms,
    )


def task_update_to_pb(rec: r.TaskUpdate) -> agent_pb2.TaskUpdate:
    """Record -> ``agent.TaskUpdate``."""
    pb = agent_pb2.TaskUpdate(
        update_seq=rec.update_seq,
        task_id=rec.task_id,
        epoch=rec.epoch,
        attempt=rec.attempt,
        occurred_at_unix_ms=rec.occurred_at_unix_ms,
    )
    change = rec.change
    if isinstance(change, r.Started):
        s = pb.started
        s.SetInParent()
        if change.resumed_from is not None:
            checkpoint_to_pb(change.resumed_from, s.resumed_from)
        s.location = change.location  # type: ignore[assignment]
        s.replayed_journal_events = change.replayed_journal_events
        s.restore_ms = change.restore_ms
        s.resume_point_unix_ms = change.resume_point_unix_ms
    elif isinstance(change, r.Checkpointed):
        c = pb.checkpointed
        checkpoint_to_pb(change.checkpoint, c.checkpoint)
        c.journal_seq = change.journal_seq
        c.replicated_journal_seq = change.replicated_journal_seq
    elif isinstance(change, r.Completed):
        done = pb.completed
        _result_to_pb(change.result, done.result)
        done.result.SetInParent()
        if change.final_checkpoint is not None:
            checkpoint_to_pb(change.final_checkpoint, done.final_checkpoint)
        done.run_ms = change.run_ms
    elif isinstance(change, r.Failed):
        failed = pb.failed
        _error_to_pb(change.error, failed.error)
        failed.error.SetInParent()
        if change.last_checkpoint is not None:
            checkpoint_to_pb(change.last_checkpoint, failed.last_checkpoint)
    elif isinstance(change, r.Released):
        rel = pb.released
        rel.SetInParent()
        rel.move_id = change.move_id
        if change.checkpoint is not None:
            checkpoint_to_pb(change.checkpoint, rel.checkpoint)
        rel.journal_seq = change.journal_seq
    return pb


def task_update_from_pb(pb: agent_pb2.TaskUpdate) -> r.TaskUpdate:
    """``agent.TaskUpdate`` -> record.

    Raises:
        ValueError: the update carries no change.
    """
    which = pb.WhichOneof("change")
    change: r.Change
    if which == "started":
        change = started_from_pb(pb.started)
    elif which == "checkpointed":
        c = pb.checkpointed
        change = r.Checkpointed(
            checkpoint_from_pb(c.checkpoint), c.journal_seq, c.replicated_journal_seq
        )
    elif which == "completed":
        d = pb.completed
        change = r.Completed(
            result_from_pb(d.result),
            checkpoint_from_pb(d.final_checkpoint) if d.HasField("final_checkpoint") else None,
            d.run_ms,
        )
    elif which == "failed":
        f = pb.failed
        change = r.Failed(
            error_from_pb(f.error),
            checkpoint_from_pb(f.last_checkpoint) if f.HasField("last_checkpoint") else None,
        )
    elif which == "released":
        rel = pb.released
        change = r.Released(
            rel.move_id,
            checkpoint_from_pb(rel.checkpoint) if rel.HasField("checkpoint") else None,
            rel.journal_seq,
        )
    else:
        raise ValueError("task update: no change set")
    return r.TaskUpdate(
        task_id=pb.task_id,
        epoch=pb.epoch,
        change=change,
        attempt=pb.attempt,
        update_seq=pb.update_seq,
        occurred_at_unix_ms=pb.occurred_at_unix_ms,
    )


# ---------------------------------------------------------------------------
# Session messages
# ---------------------------------------------------------------------------


def hello_to_pb(rec: r.Hello, base: agent_pb2.Hello | None = None) -> agent_pb2.AgentMessage:
    """The core's Hello merged over the shell's static fields (``base``), as an AgentMessage."""
    hello = agent_pb2.Hello()
    if base is not None:
        hello.CopyFrom(base)
    hello.node_id = rec.node_id
    hello.incarnation = rec.incarnation
    hello.protocol_version = rec.protocol_version
    hello.hello_seq = rec.hello_seq
    del hello.held_tasks[:]
    for held in rec.held_tasks:
        pb = hello.held_tasks.add(
            task_id=held.task_id,
            epoch=held.epoch,
            attempt=held.attempt,
            kind=held.kind,
            status=int(held.status),
            journal_seq=held.journal_seq,
            replicated_journal_seq=held.replicated_journal_seq,
            replicated_checkpoint_seq=held.replicated_checkpoint_seq,
        )
        if held.checkpoint is not None:
            checkpoint_to_pb(held.checkpoint, pb.checkpoint)
    return agent_pb2.AgentMessage(hello=hello)


def _heartbeat_to_pb(rec: r.Heartbeat) -> agent_pb2.Heartbeat:
    hb = agent_pb2.Heartbeat(
        seq=rec.seq,
        sent_at_unix_ms=rec.sent_at_unix_ms,
        sent_at_monotonic_ms=rec.sent_at_monotonic_ms,
    )
    for t in rec.tasks:
        hb.tasks.add(
            task_id=t.task_id,
            epoch=t.epoch,
            checkpoint_seq=t.checkpoint_seq,
            covers_journal_seq=t.covers_journal_seq,
            replicated_checkpoint_seq=t.replicated_checkpoint_seq,
            journal_seq=t.journal_seq,
            replicated_journal_seq=t.replicated_journal_seq,
            progress_ratio=t.progress_ratio,
            progress_message=t.progress_message,
        )
    hb.load.running_tasks = rec.running_tasks
    hb.load.used_slots = rec.used_slots
    return hb


def agent_message_to_pb(
    rec: r.AgentMessage, hello_base: agent_pb2.Hello | None = None
) -> agent_pb2.AgentMessage:
    """What the core sends (``Send.message``) -> ``agent.AgentMessage``.

    ``hello_base`` holds the shell's static Hello fields (used for a Hello only).
    """
    if isinstance(rec, r.Heartbeat):
        return agent_pb2.AgentMessage(heartbeat=_heartbeat_to_pb(rec))
    if isinstance(rec, r.TaskUpdate):
        return agent_pb2.AgentMessage(task_update=task_update_to_pb(rec))
    if isinstance(rec, r.Hello):
        return hello_to_pb(rec, hello_base)
    if isinstance(rec, r.LineageReport):
        return agent_pb2.AgentMessage(lineage_report=agent_pb2.LineageReport.FromString(rec.wire))
    raise TypeError(f"not an agent message record: {type(rec).__name__}")


def assign_to_pb(rec: r.Assign) -> agent_pb2.Assign:
    """The Assign the runner starts: the leader's message, parsed back from ``rec.wire``."""
    if rec.wire:
        return agent_pb2.Assign.FromString(rec.wire)
    pb = agent_pb2.Assign(
        task_id=rec.task_id,
        epoch=rec.epoch,
        attempt=rec.attempt,
        reason=int(rec.reason),  # type: ignore[arg-type]
    )
    pb.spec.kind = rec.kind
    return pb


def coordinator_message_from_pb(msg: agent_pb2.CoordinatorMessage) -> r.CoordinatorMessage:
    """``agent.CoordinatorMessage`` -> the record ``AgentCore.on_message`` takes."""
    body = msg.WhichOneof("body")
    if body == "welcome":
        w = msg.welcome
        return r.Welcome(
            term=w.term,
            leader_id=w.leader_id,
            session_id=w.session_id,
            heartbeat_interval_ms=w.heartbeat_interval_ms,
            fence_after_ms=w.fence_after_ms,
            dead_after_ms=w.dead_after_ms,
            hello_seq=w.hello_seq,
        )
    if body == "heartbeat_ack":
        return r.HeartbeatAck(seq=msg.heartbeat_ack.seq, term=msg.heartbeat_ack.term)
    if body == "assign":
        a = msg.assign
        return r.Assign(
            task_id=a.task_id,
            epoch=a.epoch,
            attempt=a.attempt,
            kind=a.spec.kind,
            reason=r.wire_enum(r.AssignReason, a.reason),  # type: ignore[arg-type]
            wire=a.SerializeToString(),
        )
    if body == "revoke":
        v = msg.revoke
        return r.Revoke(
            task_id=v.task_id,
            epoch=v.epoch,
            current_epoch=v.current_epoch,
            reason=r.wire_enum(r.RevokeReason, v.reason),  # type: ignore[arg-type]
            current_owner_node_id=v.current_owner_node_id,
            message=v.message,
        )
    if body == "release":
        rel = msg.release
        return r.Release(task_id=rel.task_id, epoch=rel.epoch, move_id=rel.move_id)
    if body == "drain":
        d = msg.drain
        return r.Drain(drain_id=d.drain_id, reason=d.reason, cancelled=d.cancelled)
    if body == "not_leader":
        nl = msg.not_leader
        return r.NotLeader(
            leader_id=nl.leader_id,
            leader_address=nl.leader_address,
            term=nl.term,
            retry_after_ms=nl.retry_after_ms,
        )
    if body == "reattach":
        return r.Reattach(term=msg.reattach.term)
    if body == "task_update_ack":
        ack = msg.task_update_ack
        return r.TaskUpdateAck(
            update_seq=ack.update_seq,
            task_id=ack.task_id,
            epoch=ack.epoch,
            outcome=r.wire_enum(r.UpdateOutcome, ack.outcome),  # type: ignore[arg-type]
            current_epoch=ack.current_epoch,
            message=ack.message,
        )
    if body == "lineage_ack":
        la = msg.lineage_ack
        return r.LineageAck(fork_id=la.fork_id, task_id=la.task_id, epoch=la.epoch)
    return r.Unhandled(body or "")


# ---------------------------------------------------------------------------
# TaskMeta: what the store keeps of a task across restarts
# ---------------------------------------------------------------------------


def encode_meta(meta: TaskMeta) -> bytes:
    """JSON bytes; the unacked terminal update as hex of its serialized protobuf.

    The format is the one agents have always written, so metas survive an upgrade.
    """
    update = task_update_to_pb(meta.update).SerializeToString().hex() if meta.update else ""
    return json.dumps(
        {
            "epoch": meta.epoch,
            "attempt": meta.attempt,
            "kind": meta.kind,
            "state": meta.state,
            "update": update,
        },
        sort_keys=True,
    ).encode()


def decode_meta(raw: bytes) -> TaskMeta:
    """Inverse of ``encode_meta``.

    Raises:
        ValueError: not a TaskMeta (names the field).
    """
    meta, update_error = _decode_meta(raw)
    if update_error:
        raise ValueError(update_error)
    return meta


def _decode_meta(raw: bytes) -> tuple[TaskMeta, str]:
    try:
        d = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"meta: not JSON: {exc}") from exc
    if not isinstance(d, dict):
        raise ValueError("meta: not an object")
    for name, kind in (
        ("epoch", int),
        ("attempt", int),
        ("kind", str),
        ("state", str),
        ("update", str),
    ):
        if name not in d:
            raise ValueError(f"meta.{name}: missing")
        value = d[name]
        # bool is an int subclass; a float, a string or an object is not a count.
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(f"meta.{name}: expected {kind.__name__}, got {value!r:.40}")
        if isinstance(value, int) and value < 0:
            raise ValueError(f"meta.{name}: negative {value}")
    if d["state"] not in {s.value for s in SlotState}:
        raise ValueError(f"meta.state: unknown {d['state']!r}")
    update = None
    error = ""
    if d["update"]:
        pb = agent_pb2.TaskUpdate()
        try:
            pb.ParseFromString(bytes.fromhex(d["update"]))
            update = task_update_from_pb(pb)
        except (ValueError, DecodeError) as exc:
            error = f"meta.update: unreadable: {exc}"
    return TaskMeta(d["epoch"], d["attempt"], d["kind"], d["state"], update), error


def decode_metas(raw: dict[str, bytes]) -> tuple[dict[str, TaskMeta], dict[str, str]]:
    """Every stored meta decoded: (readable by task id, unreadable task id -> why).

    A meta whose only fault is an unreadable update is in both: kept without
    the update (the core then holds the task PAUSED, so the leader re-attaches
    it), and reported.
    """
    metas: dict[str, TaskMeta] = {}
    unreadable: dict[str, str] = {}
    for task_id, blob in raw.items():
        try:
            meta, update_error = _decode_meta(blob)
        except ValueError as exc:
            unreadable[task_id] = str(exc)
            continue
        metas[task_id] = meta
        if update_error:
            unreadable[task_id] = update_error
    return metas, unreadable
