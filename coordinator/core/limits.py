"""Intake limits: one table bounding every input the coordinator accepts.

Theory of operation: anything a node agent or an orchestrator sends can end
up in an etcd value (a node record, a task record) or in the leader's memory.
etcd refuses a request over ``--max-request-bytes`` (1.5 MiB by default);
before this module one oversized label made the leader's fenced write fail
five times and step down, and the agent re-sent the update to every next
leader. So every input is bounded *at intake*, before the core decides
anything, by the values of :data:`LIMITS` (documented in ``docs/operator.md``).

:func:`screen` is the one place the core calls (``CoordinatorCore.step``). It
returns the event unchanged, a bounded replacement, or a :class:`Refusal`
naming the field:

- Hello (``SessionOpened``), heartbeat, lineage report: a refusal; the core
  closes that Session with INVALID_ARGUMENT.
- Orchestrator requests: a refusal; the core replies INVALID_ARGUMENT.
- TaskUpdate ``completed`` with a result over the limit: replaced by a
  ``Failed`` change with ``PAYLOAD_TOO_LARGE`` (non-retryable; the same
  handler would return the same result), so the task ends and the agent stops
  re-sending it. ``failed`` with over-long error text: the text is truncated
  (the failure is still recorded). Checkpoint refs and labels over the limit
  (``started``, ``checkpointed``, ``released``): a refusal; the core answers
  the update REJECTED naming the field and changes nothing.

Shared-document messages and WatchEvents filters never reach the core; their
adapters call :func:`document_problem` and :func:`watch_filter_problem`.

With the largest accepted values a task record stays below
``MAX_RECORD_BYTES``, well inside one etcd request (a test checks the sum).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from coordinator.core.events import (
    CancelRequested,
    Checkpointed,
    Completed,
    DrainRequested,
    Event,
    Failed,
    GoodbyeReceived,
    HeartbeatReceived,
    LineageReported,
    MigrateRequested,
    SessionOpened,
    Started,
    TaskSubmitted,
    TaskUpdateReceived,
    UncordonRequested,
)
from coordinator.core.records import CheckpointSummary, Labels, TaskError, TaskErrorCode

__all__ = [
    "LIMITS",
    "TRUNCATED_MARK",
    "IntakeLimits",
    "Refusal",
    "document_problem",
    "labels_problem",
    "screen",
    "text_problem",
    "truncate_text",
    "watch_filter_problem",
]

TRUNCATED_MARK = " [truncated]"
"""Appended to error text cut to its limit."""


@dataclass(frozen=True, slots=True)
class IntakeLimits:
    """The table of intake limits (sizes are UTF-8 bytes unless named otherwise).

    Attributes:
        id_bytes: node_id, task_id, request_id, incarnation, task kind, fork id.
        address_bytes: Hello.address.
        agent_version_bytes: Hello.agent_version.
        labels_per_map: entries of one label map (labels, node_selector).
        label_key_bytes: one label key.
        label_value_bytes: one label value.
        kinds_per_node: Hello.kinds entries.
        held_tasks_per_hello: Hello.held_tasks entries.
        tasks_per_heartbeat: Heartbeat.tasks entries.
        content_type_bytes: TaskSpec / TaskResult content_type.
        spec_payload_bytes: TaskSpec.payload (inputs; large ones go by reference).
        result_payload_bytes: TaskResult.payload (inline result).
        redis_key_bytes: TaskResult.redis_key.
        error_message_bytes: TaskError.message (longer is truncated).
        error_traceback_bytes: TaskError.traceback (longer is truncated).
        error_type_bytes: TaskError.exception_type (longer is truncated).
        checkpoint_ref_bytes: a checkpoint_ref / parent_ref.
        checkpoint_label_bytes: CheckpointSummary.label.
        reason_bytes: cancel / drain / migrate reasons, Goodbye reason.
        document_id_bytes: a shared document's doc_id.
        documents_per_message: documents in one DocumentInterest,
            StateVectorReport or DeltaAck; deltas in one DeltaBatch.
        state_vector_entries: replicas in one document state vector.
        delta_bytes: one DocumentDelta's ops.
        delta_batch_bytes: all ops of one DeltaBatch.
        watch_types: EventType values in one WatchEvents filter.
    """

    id_bytes: int = 128
    address_bytes: int = 256
    agent_version_bytes: int = 128
    labels_per_map: int = 64
    label_key_bytes: int = 128
    label_value_bytes: int = 256
    kinds_per_node: int = 256
    held_tasks_per_hello: int = 10_000
    tasks_per_heartbeat: int = 10_000
    content_type_bytes: int = 256
    spec_payload_bytes: int = 256 * 1024
    result_payload_bytes: int = 256 * 1024
    redis_key_bytes: int = 512
    error_message_bytes: int = 4096
    error_traceback_bytes: int = 16 * 1024
    error_type_bytes: int = 256
    checkpoint_ref_bytes: int = 256
    checkpoint_label_bytes: int = 256
    reason_bytes: int = 1024
    document_id_bytes: int = 256
    documents_per_message: int = 1024
    state_vector_entries: int = 1024
    delta_bytes: int = 256 * 1024
    delta_batch_bytes: int = 1024 * 1024
    watch_types: int = 64


LIMITS = IntakeLimits()
"""The limits in force (one table; ``docs/operator.md`` lists them)."""

MAX_RECORD_BYTES = 900_000
"""Bound on one task record with every field at its limit (etcd: 1.5 MiB per request)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """An input over a limit: the message names the field (INVALID_ARGUMENT)."""

    message: str


def _size(text: str) -> int:
    return len(text.encode("utf-8", errors="surrogatepass"))


def text_problem(field: str, value: str, limit_bytes: int) -> str:
    """The problem with a string over its limit, or "".

    Args:
        field: the field path for the message.
        value: the string.
        limit_bytes: its limit in UTF-8 bytes.

    Returns:
        "" when within the limit, else a message naming the field.
    """
    size = _size(value)
    if size > limit_bytes:
        return f"{field}: {size} bytes, over the limit of {limit_bytes}"
    return ""


def labels_problem(field: str, labels: Labels, limits: IntakeLimits = LIMITS) -> str:
    """The problem with a label map over its limits, or "".

    Args:
        field: the field path (``spec.labels``, ``hello.labels``).
        labels: the (key, value) pairs.
        limits: the table.

    Returns:
        "" when within the limits, else a message naming the field (and key).
    """
    if len(labels) > limits.labels_per_map:
        return f"{field}: {len(labels)} entries, over the limit of {limits.labels_per_map}"
    for key, value in labels:
        problem = text_problem(f"{field} key", key, limits.label_key_bytes) or text_problem(
            f"{field}[{key[:32]!r}]", value, limits.label_value_bytes
        )
        if problem:
            return problem
    return ""


def _count_problem(field: str, count: int, limit: int) -> str:
    return f"{field}: {count} entries, over the limit of {limit}" if count > limit else ""


def _first(problems: Iterable[str]) -> str:
    return next((p for p in problems if p), "")


def _checkpoint_problem(
    field: str, ckpt: CheckpointSummary | None, limits: IntakeLimits = LIMITS
) -> str:
    if ckpt is None:
        return ""
    return _first(
        (
            text_problem(
                f"{field}.checkpoint_ref", ckpt.checkpoint_ref, limits.checkpoint_ref_bytes
            ),
            text_problem(f"{field}.parent_ref", ckpt.parent_ref, limits.checkpoint_ref_bytes),
            text_problem(f"{field}.label", ckpt.label, limits.checkpoint_label_bytes),
            text_problem(f"{field}.task_id", ckpt.task_id, limits.id_bytes),
            text_problem(f"{field}.node_id", ckpt.node_id, limits.id_bytes),
        )
    )


def truncate_text(value: str, limit_bytes: int) -> str:
    """``value`` cut to at most ``limit_bytes`` UTF-8 bytes, marked when cut.

    Args:
        value: the text.
        limit_bytes: the limit, larger than the mark.

    Returns:
        ``value`` itself when short enough, else a prefix plus ``TRUNCATED_MARK``.
    """
    if _size(value) <= limit_bytes:
        return value
    room = max(0, limit_bytes - len(TRUNCATED_MARK))
    cut = value.encode("utf-8", errors="surrogatepass")[:room]
    return cut.decode("utf-8", errors="ignore") + TRUNCATED_MARK


def _bounded_error(error: TaskError, limits: IntakeLimits) -> TaskError:
    return replace(
        error,
        message=truncate_text(error.message, limits.error_message_bytes),
        traceback=truncate_text(error.traceback, limits.error_traceback_bytes),
        exception_type=truncate_text(error.exception_type, limits.error_type_bytes),
        node_id=truncate_text(error.node_id, limits.id_bytes),
    )


def _task_update(ev: TaskUpdateReceived, limits: IntakeLimits) -> Event | Refusal:
    change = ev.change
    field = "task_update"
    if problem := text_problem(f"{field}.task_id", ev.task_id, limits.id_bytes):
        return Refusal(problem)
    if isinstance(change, Completed):
        result = change.result
        problem = _first(
            (
                f"{field}.completed.result.payload: {len(result.payload)} bytes, over the "
                f"limit of {limits.result_payload_bytes} (store large results in Redis and "
                "return a reference)"
                if len(result.payload) > limits.result_payload_bytes
                else "",
                text_problem(
                    f"{field}.completed.result.content_type",
                    result.content_type,
                    limits.content_type_bytes,
                ),
                text_problem(
                    f"{field}.completed.result.redis_key", result.redis_key, limits.redis_key_bytes
                ),
            )
        )
        if problem:
            # The same handler would return the same result: end the task, so the
            # agent's update is answered and never re-sent to the next leader.
            error = TaskError(
                code=TaskErrorCode.PAYLOAD_TOO_LARGE,
                message=problem,
                retryable=False,
                node_id=truncate_text(ev.node_id, limits.id_bytes),
                epoch=ev.epoch,
            )
            return replace(ev, change=Failed(error))
        return ev
    if isinstance(change, Failed):
        bounded = _bounded_error(change.error, limits)
        return ev if bounded == change.error else replace(ev, change=Failed(bounded))
    if isinstance(change, Started):
        problem = _checkpoint_problem(f"{field}.started.resumed_from", change.resumed_from, limits)
    elif isinstance(change, Checkpointed):
        problem = _checkpoint_problem(f"{field}.checkpointed.checkpoint", change.checkpoint, limits)
    else:
        problem = _first(
            (
                text_problem(f"{field}.released.move_id", change.move_id, limits.reason_bytes),
                _checkpoint_problem(f"{field}.released.checkpoint", change.checkpoint, limits),
            )
        )
    return Refusal(problem) if problem else ev


def _session_opened(ev: SessionOpened, limits: IntakeLimits) -> str:
    return _first(
        (
            text_problem("hello.node_id", ev.node_id, limits.id_bytes),
            text_problem("hello.incarnation", ev.incarnation, limits.id_bytes),
            text_problem("hello.address", ev.address, limits.address_bytes),
            text_problem("hello.agent_version", ev.agent_version, limits.agent_version_bytes),
            text_problem("hello.store_id", ev.store_id, limits.id_bytes),
            text_problem(
                "hello.store_previous_incarnation", ev.store_previous_incarnation, limits.id_bytes
            ),
            f"hello.incarnation_secret: {len(ev.incarnation_secret_sha256)} bytes, over the "
            f"limit of {limits.id_bytes}"
            if len(ev.incarnation_secret_sha256) > limits.id_bytes
            else "",
            labels_problem("hello.labels", ev.labels, limits),
            _count_problem("hello.kinds", len(ev.kinds), limits.kinds_per_node),
            _first(
                text_problem(f"hello.kinds[{i}]", kind, limits.id_bytes)
                for i, kind in enumerate(ev.kinds)
            ),
            _count_problem("hello.held_tasks", len(ev.held_tasks), limits.held_tasks_per_hello),
            _first(
                text_problem(f"hello.held_tasks[{i}].task_id", held.task_id, limits.id_bytes)
                for i, held in enumerate(ev.held_tasks)
            ),
        )
    )


def _task_submitted(ev: TaskSubmitted, limits: IntakeLimits) -> str:
    spec = ev.spec
    return _first(
        (
            text_problem("request_id", ev.request_id, limits.id_bytes),
            text_problem("task_id", ev.task_id, limits.id_bytes),
            text_problem("spec.kind", spec.kind, limits.id_bytes),
            f"spec.payload: {len(spec.payload)} bytes, over the limit of "
            f"{limits.spec_payload_bytes} (store large inputs elsewhere and pass a reference)"
            if len(spec.payload) > limits.spec_payload_bytes
            else "",
            text_problem("spec.content_type", spec.content_type, limits.content_type_bytes),
            labels_problem("spec.labels", spec.labels, limits),
            labels_problem("spec.node_selector", spec.node_selector, limits),
            text_problem("from_checkpoint_ref", ev.forked_from_ref, limits.checkpoint_ref_bytes),
        )
    )


def screen(event: Event, limits: IntakeLimits = LIMITS) -> Event | Refusal:
    """Bound one event at intake.

    Args:
        event: the event the shell fed.
        limits: the table (tests pass smaller ones).

    Returns:
        ``event`` itself when every field is within its limit; a bounded copy
        (an over-large result turned into a PAYLOAD_TOO_LARGE failure, error
        text truncated); or a :class:`Refusal` whose message names the field
        (the core answers INVALID_ARGUMENT, or REJECTED for a task update).
    """
    problem = ""
    if isinstance(event, TaskUpdateReceived):
        return _task_update(event, limits)
    if isinstance(event, SessionOpened):
        problem = _session_opened(event, limits)
    elif isinstance(event, HeartbeatReceived):
        problem = _count_problem("heartbeat.tasks", len(event.tasks), limits.tasks_per_heartbeat)
    elif isinstance(event, LineageReported):
        problem = _first(
            (
                text_problem("lineage_report.fork_id", event.fork_id, limits.id_bytes),
                text_problem("lineage_report.task_id", event.task_id, limits.id_bytes),
            )
        )
    elif isinstance(event, GoodbyeReceived):
        if _size(event.reason) > limits.reason_bytes:
            return replace(event, reason=truncate_text(event.reason, limits.reason_bytes))
    elif isinstance(event, TaskSubmitted):
        problem = _task_submitted(event, limits)
    elif isinstance(event, CancelRequested):
        problem = _first(
            (
                text_problem("task_id", event.task_id, limits.id_bytes),
                text_problem("reason", event.reason, limits.reason_bytes),
            )
        )
    elif isinstance(event, DrainRequested):
        problem = _first(
            (
                text_problem("node_id", event.node_id, limits.id_bytes),
                text_problem("reason", event.reason, limits.reason_bytes),
            )
        )
    elif isinstance(event, MigrateRequested):
        problem = _first(
            (
                text_problem("task_id", event.task_id, limits.id_bytes),
                text_problem("target_node_id", event.target_node_id, limits.id_bytes),
                text_problem("reason", event.reason, limits.reason_bytes),
            )
        )
    elif isinstance(event, UncordonRequested):
        problem = text_problem("node_id", event.node_id, limits.id_bytes)
    return Refusal(problem) if problem else event


def document_problem(
    field: str,
    doc_ids: Sequence[str],
    *,
    vector_sizes: Sequence[int] = (),
    delta_sizes_bytes: Sequence[int] = (),
    limits: IntakeLimits = LIMITS,
) -> str:
    """The problem with a shared-document message, or "".

    Args:
        field: the message's field path (``document_interest.subscribe``).
        doc_ids: every document id the message names.
        vector_sizes: entries of each state vector it carries.
        delta_sizes_bytes: ops size of each delta (DeltaBatch).
        limits: the table.

    Returns:
        "" when within the limits, else a message naming the field
        (the Session is closed with INVALID_ARGUMENT).
    """
    return _first(
        (
            _count_problem(field, len(doc_ids), limits.documents_per_message),
            _first(
                text_problem(f"{field}[{i}].doc_id", doc_id, limits.document_id_bytes)
                for i, doc_id in enumerate(doc_ids)
            ),
            _first(
                _count_problem(f"{field}[{i}].state_vector", size, limits.state_vector_entries)
                for i, size in enumerate(vector_sizes)
            ),
            _first(
                f"{field}[{i}].ops: {size} bytes, over the limit of {limits.delta_bytes}"
                if size > limits.delta_bytes
                else ""
                for i, size in enumerate(delta_sizes_bytes)
            ),
            f"{field}: {sum(delta_sizes_bytes)} bytes of ops, over the limit of "
            f"{limits.delta_batch_bytes}"
            if sum(delta_sizes_bytes) > limits.delta_batch_bytes
            else "",
        )
    )


def watch_filter_problem(
    types_count: int, task_id: str, node_id: str, limits: IntakeLimits = LIMITS
) -> str:
    """The problem with a WatchEvents filter, or "".

    Args:
        types_count: entries of ``types``.
        task_id, node_id: the id filters.
        limits: the table.

    Returns:
        "" when within the limits, else a message naming the field (INVALID_ARGUMENT).
    """
    return _first(
        (
            _count_problem("types", types_count, limits.watch_types),
            text_problem("task_id", task_id, limits.id_bytes),
            text_problem("node_id", node_id, limits.id_bytes),
        )
    )
