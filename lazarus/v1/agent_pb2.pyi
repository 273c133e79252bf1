from lazarus.v1 import records_pb2 as _records_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HeldTaskStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HELD_TASK_STATUS_UNSPECIFIED: _ClassVar[HeldTaskStatus]
    HELD_TASK_STATUS_RUNNING: _ClassVar[HeldTaskStatus]
    HELD_TASK_STATUS_PAUSED: _ClassVar[HeldTaskStatus]
    HELD_TASK_STATUS_COMPLETED: _ClassVar[HeldTaskStatus]
    HELD_TASK_STATUS_FAILED: _ClassVar[HeldTaskStatus]
    HELD_TASK_STATUS_RELEASED: _ClassVar[HeldTaskStatus]

class AssignReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ASSIGN_REASON_UNSPECIFIED: _ClassVar[AssignReason]
    ASSIGN_REASON_NEW: _ClassVar[AssignReason]
    ASSIGN_REASON_RETRY: _ClassVar[AssignReason]
    ASSIGN_REASON_MOVED: _ClassVar[AssignReason]
    ASSIGN_REASON_REATTACH: _ClassVar[AssignReason]

class RevokeReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REVOKE_REASON_UNSPECIFIED: _ClassVar[RevokeReason]
    REVOKE_REASON_CANCELLED: _ClassVar[RevokeReason]
    REVOKE_REASON_REASSIGNED: _ClassVar[RevokeReason]
    REVOKE_REASON_STALE_EPOCH: _ClassVar[RevokeReason]
    REVOKE_REASON_UNKNOWN_TASK: _ClassVar[RevokeReason]
    REVOKE_REASON_FINISHED: _ClassVar[RevokeReason]
    REVOKE_REASON_DEADLINE_EXCEEDED: _ClassVar[RevokeReason]
    REVOKE_REASON_RELEASE_TIMEOUT: _ClassVar[RevokeReason]

class UpdateOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UPDATE_OUTCOME_UNSPECIFIED: _ClassVar[UpdateOutcome]
    UPDATE_OUTCOME_ACCEPTED: _ClassVar[UpdateOutcome]
    UPDATE_OUTCOME_DUPLICATE: _ClassVar[UpdateOutcome]
    UPDATE_OUTCOME_STALE_EPOCH: _ClassVar[UpdateOutcome]
    UPDATE_OUTCOME_UNKNOWN_TASK: _ClassVar[UpdateOutcome]
    UPDATE_OUTCOME_REJECTED: _ClassVar[UpdateOutcome]

class ReconcilePhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RECONCILE_PHASE_UNSPECIFIED: _ClassVar[ReconcilePhase]
    RECONCILE_PHASE_GATHER: _ClassVar[ReconcilePhase]
    RECONCILE_PHASE_VERIFY: _ClassVar[ReconcilePhase]
HELD_TASK_STATUS_UNSPECIFIED: HeldTaskStatus
HELD_TASK_STATUS_RUNNING: HeldTaskStatus
HELD_TASK_STATUS_PAUSED: HeldTaskStatus
HELD_TASK_STATUS_COMPLETED: HeldTaskStatus
HELD_TASK_STATUS_FAILED: HeldTaskStatus
HELD_TASK_STATUS_RELEASED: HeldTaskStatus
ASSIGN_REASON_UNSPECIFIED: AssignReason
ASSIGN_REASON_NEW: AssignReason
ASSIGN_REASON_RETRY: AssignReason
ASSIGN_REASON_MOVED: AssignReason
ASSIGN_REASON_REATTACH: AssignReason
REVOKE_REASON_UNSPECIFIED: RevokeReason
REVOKE_REASON_CANCELLED: RevokeReason
REVOKE_REASON_REASSIGNED: RevokeReason
REVOKE_REASON_STALE_EPOCH: RevokeReason
REVOKE_REASON_UNKNOWN_TASK: RevokeReason
REVOKE_REASON_FINISHED: RevokeReason
REVOKE_REASON_DEADLINE_EXCEEDED: RevokeReason
REVOKE_REASON_RELEASE_TIMEOUT: RevokeReason
UPDATE_OUTCOME_UNSPECIFIED: UpdateOutcome
UPDATE_OUTCOME_ACCEPTED: UpdateOutcome
UPDATE_OUTCOME_DUPLICATE: UpdateOutcome
UPDATE_OUTCOME_STALE_EPOCH: UpdateOutcome
UPDATE_OUTCOME_UNKNOWN_TASK: UpdateOutcome
UPDATE_OUTCOME_REJECTED: UpdateOutcome
RECONCILE_PHASE_UNSPECIFIED: ReconcilePhase
RECONCILE_PHASE_GATHER: ReconcilePhase
RECONCILE_PHASE_VERIFY: ReconcilePhase

class AgentMessage(_message.Message):
    __slots__ = ("hello", "heartbeat", "task_update", "state_vector_report", "delta_batch", "delta_ack", "document_interest", "lineage_report", "goodbye")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    TASK_UPDATE_FIELD_NUMBER: _ClassVar[int]
    STATE_VECTOR_REPORT_FIELD_NUMBER: _ClassVar[int]
    DELTA_BATCH_FIELD_NUMBER: _ClassVar[int]
    DELTA_ACK_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_INTEREST_FIELD_NUMBER: _ClassVar[int]
    LINEAGE_REPORT_FIELD_NUMBER: _ClassVar[int]
    GOODBYE_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    heartbeat: Heartbeat
    task_update: TaskUpdate
    state_vector_report: StateVectorReport
    delta_batch: DeltaBatch
    delta_ack: DeltaAck
    document_interest: DocumentInterest
    lineage_report: LineageReport
    goodbye: Goodbye
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., task_update: _Optional[_Union[TaskUpdate, _Mapping]] = ..., state_vector_report: _Optional[_Union[StateVectorReport, _Mapping]] = ..., delta_batch: _Optional[_Union[DeltaBatch, _Mapping]] = ..., delta_ack: _Optional[_Union[DeltaAck, _Mapping]] = ..., document_interest: _Optional[_Union[DocumentInterest, _Mapping]] = ..., lineage_report: _Optional[_Union[LineageReport, _Mapping]] = ..., goodbye: _Optional[_Union[Goodbye, _Mapping]] = ...) -> None: ...

class HeldTask(_message.Message):
    __slots__ = ("task_id", "epoch", "attempt", "kind", "status", "checkpoint", "replicated_checkpoint_seq", "journal_seq", "replicated_journal_seq")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    REPLICATED_CHECKPOINT_SEQ_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_SEQ_FIELD_NUMBER: _ClassVar[int]
    REPLICATED_JOURNAL_SEQ_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    epoch: int
    attempt: int
    kind: str
    status: HeldTaskStatus
    checkpoint: _records_pb2.CheckpointSummary
    replicated_checkpoint_seq: int
    journal_seq: int
    replicated_journal_seq: int
    def __init__(self, task_id: _Optional[str] = ..., epoch: _Optional[int] = ..., attempt: _Optional[int] = ..., kind: _Optional[str] = ..., status: _Optional[_Union[HeldTaskStatus, str]] = ..., checkpoint: _Optional[_Union[_records_pb2.CheckpointSummary, _Mapping]] = ..., replicated_checkpoint_seq: _Optional[int] = ..., journal_seq: _Optional[int] = ..., replicated_journal_seq: _Optional[int] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("node_id", "incarnation", "address", "capacity", "labels", "held_tasks", "agent_version", "protocol_version", "started_at_unix_ms", "kinds", "incarnation_secret", "store_id", "store_previous_incarnation", "hello_seq")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    HELD_TASKS_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_SECRET_FIELD_NUMBER: _ClassVar[int]
    STORE_ID_FIELD_NUMBER: _ClassVar[int]
    STORE_PREVIOUS_INCARNATION_FIELD_NUMBER: _ClassVar[int]
    HELLO_SEQ_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    incarnation: str
    address: str
    capacity: _records_pb2.NodeCapacity
    labels: _containers.ScalarMap[str, str]
    held_tasks: _containers.RepeatedCompositeFieldContainer[HeldTask]
    agent_version: str
    protocol_version: int
    started_at_unix_ms: int
    kinds: _containers.RepeatedScalarFieldContainer[str]
    incarnation_secret: bytes
    store_id: str
    store_previous_incarnation: str
    hello_seq: int
    def __init__(self, node_id: _Optional[str] = ..., incarnation: _Optional[str] = ..., address: _Optional[str] = ..., capacity: _Optional[_Union[_records_pb2.NodeCapacity, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., held_tasks: _Optional[_Iterable[_Union[HeldTask, _Mapping]]] = ..., agent_version: _Optional[str] = ..., protocol_version: _Optional[int] = ..., started_at_unix_ms: _Optional[int] = ..., kinds: _Optional[_Iterable[str]] = ..., incarnation_secret: _Optional[bytes] = ..., store_id: _Optional[str] = ..., store_previous_incarnation: _Optional[str] = ..., hello_seq: _Optional[int] = ...) -> None: ...

class TaskProgress(_message.Message):
    __slots__ = ("task_id", "epoch", "checkpoint_seq", "covers_journal_seq", "replicated_checkpoint_seq", "journal_seq", "replicated_journal_seq", "progress_ratio", "progress_message")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_SEQ_FIELD_NUMBER: _ClassVar[int]
    COVERS_JOURNAL_SEQ_FIELD_NUMBER: _ClassVar[int]
    REPLICATED_CHECKPOINT_SEQ_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_SEQ_FIELD_NUMBER: _ClassVar[int]
    REPLICATED_JOURNAL_SEQ_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_RATIO_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    epoch: int
    checkpoint_seq: int
    covers_journal_seq: int
    replicated_checkpoint_seq: int
    journal_seq: int
    replicated_journal_seq: int
    progress_ratio: float
    progress_message: str
    def __init__(self, task_id: _Optional[str] = ..., epoch: _Optional[int] = ..., checkpoint_seq: _Optional[int] = ..., covers_journal_seq: _Optional[int] = ..., replicated_checkpoint_seq: _Optional[int] = ..., journal_seq: _Optional[int] = ..., replicated_journal_seq: _Optional[int] = ..., progress_ratio: _Optional[float] = ..., progress_message: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("seq", "sent_at_unix_ms", "sent_at_monotonic_ms", "tasks", "load")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_MONOTONIC_MS_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    seq: int
    sent_at_unix_ms: int
    sent_at_monotonic_ms: int
    tasks: _containers.RepeatedCompositeFieldContainer[TaskProgress]
    load: _records_pb2.NodeLoad
    def __init__(self, seq: _Optional[int] = ..., sent_at_unix_ms: _Optional[int] = ..., sent_at_monotonic_ms: _Optional[int] = ..., tasks: _Optional[_Iterable[_Union[TaskProgress, _Mapping]]] = ..., load: _Optional[_Union[_records_pb2.NodeLoad, _Mapping]] = ...) -> None: ...

class TaskUpdate(_message.Message):
    __slots__ = ("update_seq", "task_id", "epoch", "attempt", "occurred_at_unix_ms", "started", "checkpointed", "completed", "failed", "released")
    class Started(_message.Message):
        __slots__ = ("resumed_from", "location", "replayed_journal_events", "restore_ms", "resume_point_unix_ms")
        RESUMED_FROM_FIELD_NUMBER: _ClassVar[int]
        LOCATION_FIELD_NUMBER: _ClassVar[int]
        REPLAYED_JOURNAL_EVENTS_FIELD_NUMBER: _ClassVar[int]
        RESTORE_MS_FIELD_NUMBER: _ClassVar[int]
        RESUME_POINT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
        resumed_from: _records_pb2.CheckpointSummary
        location: _records_pb2.CheckpointLocation
        replayed_journal_events: int
        restore_ms: int
        resume_point_unix_ms: int
        def __init__(self, resumed_from: _Optional[_Union[_records_pb2.CheckpointSummary, _Mapping]] = ..., location: _Optional[_Union[_records_pb2.CheckpointLocation, str]] = ..., replayed_journal_events: _Optional[int] = ..., restore_ms: _Optional[int] = ..., resume_point_unix_ms: _Optional[int] = ...) -> None: ...
    class Checkpointed(_message.Message):
        __slots__ = ("checkpoint", "journal_seq", "replicated_journal_seq")
        CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
        JOURNAL_SEQ_FIELD_NUMBER: _ClassVar[int]
        REPLICATED_JOURNAL_SEQ_FIELD_NUMBER: _ClassVar[int]
        checkpoint: _records_pb2.CheckpointSummary
        journal_seq: int
        replicated_journal_seq: int
        def __init__(self, checkpoint: _Optional[_Union[_records_pb2.CheckpointSummary, _Mapping]] = ..., journal_seq: _Optional[int] = ..., replicated_journal_seq: _Optional[int] = ...) -> None: ...
    class Completed(_message.Message):
        __slots__ = ("result", "final_checkpoint", "run_ms")
        RESULT_FIELD_NUMBER: _ClassVar[int]
        FINAL_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
        RUN_MS_FIELD_NUMBER: _ClassVar[int]
        result: _records_pb2.TaskResult
        final_checkpoint: _records_pb2.CheckpointSummary
        run_ms: int
        def __init__(self, result: _Optional[_Union[_records_pb2.TaskResult, _Mapping]] = ..., final_checkpoint: _Optional[_Union[_records_pb2.CheckpointSummary, _Mapping]] = ..., run_ms: _Optional[int] = ...) -> None: ...
    class Failed(_message.Message):
        __slots__ = ("error", "last_checkpoint")
        ERROR_FIELD_NUMBER: _ClassVar[int]
        LAST_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
        error: _records_pb2.TaskError
        last_checkpoint: _records_pb2.CheckpointSummary
        def __init__(self, error: _Optional[_Union[_records_pb2.TaskError, _Mapping]] = ..., last_checkpoint: _Optional[_Union[_records_pb2.CheckpointSummary, _Mapping]] = ...) -> None: ...
    class Released(_message.Message):
        __slots__ = ("move_id", "checkpoint", "journal_seq")
        MOVE_ID_FIELD_NUMBER: _ClassVar[int]
        CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
        JOURNAL_SEQ_FIELD_NUMBER: _ClassVar[int]
        move_id: str
        checkpoint: _records_pb2.CheckpointSummary
        journal_seq: int
        def __init__(self, move_id: _Optional[str] = ..., checkpoint: _Optional[_Union[_records_pb2.CheckpointSummary, _Mapping]] = ..., journal_seq: _Optional[int] = ...) -> None: ...
    UPDATE_SEQ_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTED_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    update_seq: int
    task_id: str
    epoch: int
    attempt: int
    occurred_at_unix_ms: int
    started: TaskUpdate.Started
    checkpointed: TaskUpdate.Checkpointed
    completed: TaskUpdate.Completed
    failed: TaskUpdate.Failed
    released: TaskUpdate.Released
    def __init__(self, update_seq: _Optional[int] = ..., task_id: _Optional[str] = ..., epoch: _Optional[int] = ..., attempt: _Optional[int] = ..., occurred_at_unix_ms: _Optional[int] = ..., started: _Optional[_Union[TaskUpdate.Started, _Mapping]] = ..., checkpointed: _Optional[_Union[TaskUpdate.Checkpointed, _Mapping]] = ..., completed: _Optional[_Union[TaskUpdate.Completed, _Mapping]] = ..., failed: _Optional[_Union[TaskUpdate.Failed, _Mapping]] = ..., released: _Optional[_Union[TaskUpdate.Released, _Mapping]] = ...) -> None: ...

class Goodbye(_message.Message):
    __slots__ = ("reason", "released_all")
    REASON_FIELD_NUMBER: _ClassVar[int]
    RELEASED_ALL_FIELD_NUMBER: _ClassVar[int]
    reason: str
    released_all: bool
    def __init__(self, reason: _Optional[str] = ..., released_all: _Optional[bool] = ...) -> None: ...

class CoordinatorMessage(_message.Message):
    __slots__ = ("welcome", "heartbeat_ack", "assign", "revoke", "release", "drain", "not_leader", "task_update_ack", "reconcile_request", "delta_request", "delta_batch", "delta_ack", "reconcile_done", "lineage_request", "lineage_ack", "reattach", "documents_persisted")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_ACK_FIELD_NUMBER: _ClassVar[int]
    ASSIGN_FIELD_NUMBER: _ClassVar[int]
    REVOKE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    NOT_LEADER_FIELD_NUMBER: _ClassVar[int]
    TASK_UPDATE_ACK_FIELD_NUMBER: _ClassVar[int]
    RECONCILE_REQUEST_FIELD_NUMBER: _ClassVar[int]
    DELTA_REQUEST_FIELD_NUMBER: _ClassVar[int]
    DELTA_BATCH_FIELD_NUMBER: _ClassVar[int]
    DELTA_ACK_FIELD_NUMBER: _ClassVar[int]
    RECONCILE_DONE_FIELD_NUMBER: _ClassVar[int]
    LINEAGE_REQUEST_FIELD_NUMBER: _ClassVar[int]
    LINEAGE_ACK_FIELD_NUMBER: _ClassVar[int]
    REATTACH_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_PERSISTED_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    heartbeat_ack: HeartbeatAck
    assign: Assign
    revoke: Revoke
    release: Release
    drain: Drain
    not_leader: NotLeader
    task_update_ack: TaskUpdateAck
    reconcile_request: ReconcileRequest
    delta_request: DeltaRequest
    delta_batch: DeltaBatch
    delta_ack: DeltaAck
    reconcile_done: ReconcileDone
    lineage_request: LineageRequest
    lineage_ack: LineageAck
    reattach: Reattach
    documents_persisted: DocumentsPersisted
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., heartbeat_ack: _Optional[_Union[HeartbeatAck, _Mapping]] = ..., assign: _Optional[_Union[Assign, _Mapping]] = ..., revoke: _Optional[_Union[Revoke, _Mapping]] = ..., release: _Optional[_Union[Release, _Mapping]] = ..., drain: _Optional[_Union[Drain, _Mapping]] = ..., not_leader: _Optional[_Union[NotLeader, _Mapping]] = ..., task_update_ack: _Optional[_Union[TaskUpdateAck, _Mapping]] = ..., reconcile_request: _Optional[_Union[ReconcileRequest, _Mapping]] = ..., delta_request: _Optional[_Union[DeltaRequest, _Mapping]] = ..., delta_batch: _Optional[_Union[DeltaBatch, _Mapping]] = ..., delta_ack: _Optional[_Union[DeltaAck, _Mapping]] = ..., reconcile_done: _Optional[_Union[ReconcileDone, _Mapping]] = ..., lineage_request: _Optional[_Union[LineageRequest, _Mapping]] = ..., lineage_ack: _Optional[_Union[LineageAck, _Mapping]] = ..., reattach: _Optional[_Union[Reattach, _Mapping]] = ..., documents_persisted: _Optional[_Union[DocumentsPersisted, _Mapping]] = ...) -> None: ...

class Reattach(_message.Message):
    __slots__ = ("term",)
    TERM_FIELD_NUMBER: _ClassVar[int]
    term: int
    def __init__(self, term: _Optional[int] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("session_id", "term", "leader_id", "heartbeat_interval_ms", "fence_after_ms", "dead_after_ms", "node_state", "cluster_name", "server_time_unix_ms", "max_message_bytes", "max_payload_bytes", "protocol_version", "hello_seq")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    FENCE_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    DEAD_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    NODE_STATE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    SERVER_TIME_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    HELLO_SEQ_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    term: int
    leader_id: str
    heartbeat_interval_ms: int
    fence_after_ms: int
    dead_after_ms: int
    node_state: _records_pb2.NodeState
    cluster_name: str
    server_time_unix_ms: int
    max_message_bytes: int
    max_payload_bytes: int
    protocol_version: int
    hello_seq: int
    def __init__(self, session_id: _Optional[str] = ..., term: _Optional[int] = ..., leader_id: _Optional[str] = ..., heartbeat_interval_ms: _Optional[int] = ..., fence_after_ms: _Optional[int] = ..., dead_after_ms: _Optional[int] = ..., node_state: _Optional[_Union[_records_pb2.NodeState, str]] = ..., cluster_name: _Optional[str] = ..., server_time_unix_ms: _Optional[int] = ..., max_message_bytes: _Optional[int] = ..., max_payload_bytes: _Optional[int] = ..., protocol_version: _Optional[int] = ..., hello_seq: _Optional[int] = ...) -> None: ...

class HeartbeatAck(_message.Message):
    __slots__ = ("seq", "sent_at_unix_ms", "sent_at_monotonic_ms", "received_at_unix_ms", "term", "node_state")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_MONOTONIC_MS_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    NODE_STATE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    sent_at_unix_ms: int
    sent_at_monotonic_ms: int
    received_at_unix_ms: int
    term: int
    node_state: _records_pb2.NodeState
    def __init__(self, seq: _Optional[int] = ..., sent_at_unix_ms: _Optional[int] = ..., sent_at_monotonic_ms: _Optional[int] = ..., received_at_unix_ms: _Optional[int] = ..., term: _Optional[int] = ..., node_state: _Optional[_Union[_records_pb2.NodeState, str]] = ...) -> None: ...

class ResumePoint(_message.Message):
    __slots__ = ("checkpoint", "location", "replay_through_journal_seq")
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    REPLAY_THROUGH_JOURNAL_SEQ_FIELD_NUMBER: _ClassVar[int]
    checkpoint: _records_pb2.CheckpointSummary
    location: _records_pb2.CheckpointLocation
    replay_through_journal_seq: int
    def __init__(self, checkpoint: _Optional[_Union[_records_pb2.CheckpointSummary, _Mapping]] = ..., location: _Optional[_Union[_records_pb2.CheckpointLocation, str]] = ..., replay_through_journal_seq: _Optional[int] = ...) -> None: ...

class Assign(_message.Message):
    __slots__ = ("task_id", "epoch", "attempt", "spec", "resume_from", "reason", "move_reason", "previous_owner_node_id", "assigned_at_unix_ms")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    RESUME_FROM_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MOVE_REASON_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_OWNER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    epoch: int
    attempt: int
    spec: _records_pb2.TaskSpec
    resume_from: ResumePoint
    reason: AssignReason
    move_reason: _records_pb2.MoveReason
    previous_owner_node_id: str
    assigned_at_unix_ms: int
    def __init__(self, task_id: _Optional[str] = ..., epoch: _Optional[int] = ..., attempt: _Optional[int] = ..., spec: _Optional[_Union[_records_pb2.TaskSpec, _Mapping]] = ..., resume_from: _Optional[_Union[ResumePoint, _Mapping]] = ..., reason: _Optional[_Union[AssignReason, str]] = ..., move_reason: _Optional[_Union[_records_pb2.MoveReason, str]] = ..., previous_owner_node_id: _Optional[str] = ..., assigned_at_unix_ms: _Optional[int] = ...) -> None: ...

class Revoke(_message.Message):
    __slots__ = ("task_id", "epoch", "current_epoch", "reason", "current_owner_node_id", "message")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CURRENT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CURRENT_OWNER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    epoch: int
    current_epoch: int
    reason: RevokeReason
    current_owner_node_id: str
    message: str
    def __init__(self, task_id: _Optional[str] = ..., epoch: _Optional[int] = ..., current_epoch: _Optional[int] = ..., reason: _Optional[_Union[RevokeReason, str]] = ..., current_owner_node_id: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class Release(_message.Message):
    __slots__ = ("move_id", "task_id", "epoch", "reason", "target_node_id", "release_deadline_ms")
    MOVE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TARGET_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASE_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    move_id: str
    task_id: str
    epoch: int
    reason: _records_pb2.MoveReason
    target_node_id: str
    release_deadline_ms: int
    def __init__(self, move_id: _Optional[str] = ..., task_id: _Optional[str] = ..., epoch: _Optional[int] = ..., reason: _Optional[_Union[_records_pb2.MoveReason, str]] = ..., target_node_id: _Optional[str] = ..., release_deadline_ms: _Optional[int] = ...) -> None: ...

class Drain(_message.Message):
    __slots__ = ("drain_id", "reason", "cancelled")
    DRAIN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    drain_id: str
    reason: str
    cancelled: bool
    def __init__(self, drain_id: _Optional[str] = ..., reason: _Optional[str] = ..., cancelled: _Optional[bool] = ...) -> None: ...

class NotLeader(_message.Message):
    __slots__ = ("leader_id", "leader_address", "term", "retry_after_ms")
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    leader_id: str
    leader_address: str
    term: int
    retry_after_ms: int
    def __init__(self, leader_id: _Optional[str] = ..., leader_address: _Optional[str] = ..., term: _Optional[int] = ..., retry_after_ms: _Optional[int] = ...) -> None: ...

class TaskUpdateAck(_message.Message):
    __slots__ = ("update_seq", "task_id", "epoch", "outcome", "current_epoch", "message")
    UPDATE_SEQ_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    CURRENT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    update_seq: int
    task_id: str
    epoch: int
    outcome: UpdateOutcome
    current_epoch: int
    message: str
    def __init__(self, update_seq: _Optional[int] = ..., task_id: _Optional[str] = ..., epoch: _Optional[int] = ..., outcome: _Optional[_Union[UpdateOutcome, str]] = ..., current_epoch: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ReconcileRequest(_message.Message):
    __slots__ = ("session_id", "trigger", "phase", "doc_ids", "include_task_states")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    DOC_IDS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_TASK_STATES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    trigger: _records_pb2.ReconcileTrigger
    phase: ReconcilePhase
    doc_ids: _containers.RepeatedScalarFieldContainer[str]
    include_task_states: bool
    def __init__(self, session_id: _Optional[str] = ..., trigger: _Optional[_Union[_records_pb2.ReconcileTrigger, str]] = ..., phase: _Optional[_Union[ReconcilePhase, str]] = ..., doc_ids: _Optional[_Iterable[str]] = ..., include_task_states: _Optional[bool] = ...) -> None: ...

class StateVectorReport(_message.Message):
    __slots__ = ("session_id", "phase", "documents")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    phase: ReconcilePhase
    documents: _containers.RepeatedCompositeFieldContainer[_records_pb2.DocumentStateVector]
    def __init__(self, session_id: _Optional[str] = ..., phase: _Optional[_Union[ReconcilePhase, str]] = ..., documents: _Optional[_Iterable[_Union[_records_pb2.DocumentStateVector, _Mapping]]] = ...) -> None: ...

class DeltaRequest(_message.Message):
    __slots__ = ("session_id", "have")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    HAVE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    have: _containers.RepeatedCompositeFieldContainer[_records_pb2.DocumentStateVector]
    def __init__(self, session_id: _Optional[str] = ..., have: _Optional[_Iterable[_Union[_records_pb2.DocumentStateVector, _Mapping]]] = ...) -> None: ...

class DeltaBatch(_message.Message):
    __slots__ = ("session_id", "batch_id", "deltas", "last")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    DELTAS_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    batch_id: int
    deltas: _containers.RepeatedCompositeFieldContainer[_records_pb2.DocumentDelta]
    last: bool
    def __init__(self, session_id: _Optional[str] = ..., batch_id: _Optional[int] = ..., deltas: _Optional[_Iterable[_Union[_records_pb2.DocumentDelta, _Mapping]]] = ..., last: _Optional[bool] = ...) -> None: ...

class DeltaAck(_message.Message):
    __slots__ = ("batch_id", "merged")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    MERGED_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    merged: _containers.RepeatedCompositeFieldContainer[_records_pb2.DocumentStateVector]
    def __init__(self, batch_id: _Optional[int] = ..., merged: _Optional[_Iterable[_Union[_records_pb2.DocumentStateVector, _Mapping]]] = ...) -> None: ...

class DocumentsPersisted(_message.Message):
    __slots__ = ("documents",)
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    documents: _containers.RepeatedCompositeFieldContainer[_records_pb2.DocumentStateVector]
    def __init__(self, documents: _Optional[_Iterable[_Union[_records_pb2.DocumentStateVector, _Mapping]]] = ...) -> None: ...

class DocumentInterest(_message.Message):
    __slots__ = ("subscribe", "unsubscribe_doc_ids")
    SUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    UNSUBSCRIBE_DOC_IDS_FIELD_NUMBER: _ClassVar[int]
    subscribe: _containers.RepeatedCompositeFieldContainer[_records_pb2.DocumentStateVector]
    unsubscribe_doc_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, subscribe: _Optional[_Iterable[_Union[_records_pb2.DocumentStateVector, _Mapping]]] = ..., unsubscribe_doc_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ReconcileDone(_message.Message):
    __slots__ = ("session_id", "converged", "documents", "conflicts", "duration_ms")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CONVERGED_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    CONFLICTS_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    converged: bool
    documents: int
    conflicts: int
    duration_ms: int
    def __init__(self, session_id: _Optional[str] = ..., converged: _Optional[bool] = ..., documents: _Optional[int] = ..., conflicts: _Optional[int] = ..., duration_ms: _Optional[int] = ...) -> None: ...

class LineageRequest(_message.Message):
    __slots__ = ("fork_id", "task_id", "epoch", "base_checkpoint", "base_journal_seq")
    FORK_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    BASE_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    BASE_JOURNAL_SEQ_FIELD_NUMBER: _ClassVar[int]
    fork_id: str
    task_id: str
    epoch: int
    base_checkpoint: _records_pb2.CheckpointSummary
    base_journal_seq: int
    def __init__(self, fork_id: _Optional[str] = ..., task_id: _Optional[str] = ..., epoch: _Optional[int] = ..., base_checkpoint: _Optional[_Union[_records_pb2.CheckpointSummary, _Mapping]] = ..., base_journal_seq: _Optional[int] = ...) -> None: ...

class LineageReport(_message.Message):
    __slots__ = ("fork_id", "task_id", "epoch", "chunk_index", "last", "checkpoints", "journal_events", "error")
    FORK_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CHUNK_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_EVENTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    fork_id: str
    task_id: str
    epoch: int
    chunk_index: int
    last: bool
    checkpoints: _containers.RepeatedCompositeFieldContainer[_records_pb2.CheckpointRecord]
    journal_events: _containers.RepeatedCompositeFieldContainer[_records_pb2.JournalEventRecord]
    error: str
    def __init__(self, fork_id: _Optional[str] = ..., task_id: _Optional[str] = ..., epoch: _Optional[int] = ..., chunk_index: _Optional[int] = ..., last: _Optional[bool] = ..., checkpoints: _Optional[_Iterable[_Union[_records_pb2.CheckpointRecord, _Mapping]]] = ..., journal_events: _Optional[_Iterable[_Union[_records_pb2.JournalEventRecord, _Mapping]]] = ..., error: _Optional[str] = ...) -> None: ...

class LineageAck(_message.Message):
    __slots__ = ("fork_id", "task_id", "epoch", "resolution")
    FORK_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    fork_id: str
    task_id: str
    epoch: int
    resolution: _records_pb2.ForkResolution
    def __init__(self, fork_id: _Optional[str] = ..., task_id: _Optional[str] = ..., epoch: _Optional[int] = ..., resolution: _Optional[_Union[_records_pb2.ForkResolution, str]] = ...) -> None: ...
