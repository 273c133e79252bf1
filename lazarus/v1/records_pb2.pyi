from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_STATE_UNSPECIFIED: _ClassVar[NodeState]
    NODE_STATE_ALIVE: _ClassVar[NodeState]
    NODE_STATE_SUSPECT: _ClassVar[NodeState]
    NODE_STATE_DEAD: _ClassVar[NodeState]
    NODE_STATE_DRAINING: _ClassVar[NodeState]
    NODE_STATE_LEFT: _ClassVar[NodeState]

class TaskState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATE_UNSPECIFIED: _ClassVar[TaskState]
    TASK_STATE_PENDING: _ClassVar[TaskState]
    TASK_STATE_ASSIGNED: _ClassVar[TaskState]
    TASK_STATE_RUNNING: _ClassVar[TaskState]
    TASK_STATE_COMPLETED: _ClassVar[TaskState]
    TASK_STATE_FAILED: _ClassVar[TaskState]
    TASK_STATE_CANCELLED: _ClassVar[TaskState]

class CheckpointDurability(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECKPOINT_DURABILITY_UNSPECIFIED: _ClassVar[CheckpointDurability]
    CHECKPOINT_DURABILITY_LOCAL: _ClassVar[CheckpointDurability]
    CHECKPOINT_DURABILITY_REPLICATED: _ClassVar[CheckpointDurability]

class StateModel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATE_MODEL_UNSPECIFIED: _ClassVar[StateModel]
    STATE_MODEL_OPAQUE: _ClassVar[StateModel]
    STATE_MODEL_CRDT: _ClassVar[StateModel]

class PayloadEncoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PAYLOAD_ENCODING_UNSPECIFIED: _ClassVar[PayloadEncoding]
    PAYLOAD_ENCODING_RAW: _ClassVar[PayloadEncoding]
    PAYLOAD_ENCODING_ZSTD: _ClassVar[PayloadEncoding]

class ChecksumAlgorithm(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECKSUM_ALGORITHM_UNSPECIFIED: _ClassVar[ChecksumAlgorithm]
    CHECKSUM_ALGORITHM_CRC32: _ClassVar[ChecksumAlgorithm]
    CHECKSUM_ALGORITHM_SHA256: _ClassVar[ChecksumAlgorithm]
    CHECKSUM_ALGORITHM_CRC32C: _ClassVar[ChecksumAlgorithm]

class CheckpointLocation(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECKPOINT_LOCATION_UNSPECIFIED: _ClassVar[CheckpointLocation]
    CHECKPOINT_LOCATION_LOCAL: _ClassVar[CheckpointLocation]
    CHECKPOINT_LOCATION_REDIS: _ClassVar[CheckpointLocation]

class MoveReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MOVE_REASON_UNSPECIFIED: _ClassVar[MoveReason]
    MOVE_REASON_NODE_DEAD: _ClassVar[MoveReason]
    MOVE_REASON_DRAIN: _ClassVar[MoveReason]
    MOVE_REASON_MIGRATE: _ClassVar[MoveReason]
    MOVE_REASON_REBALANCE: _ClassVar[MoveReason]
    MOVE_REASON_ASSIGN_REJECTED: _ClassVar[MoveReason]
    MOVE_REASON_RELEASE_TIMEOUT: _ClassVar[MoveReason]

class TaskErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_ERROR_CODE_UNSPECIFIED: _ClassVar[TaskErrorCode]
    TASK_ERROR_CODE_HANDLER_ERROR: _ClassVar[TaskErrorCode]
    TASK_ERROR_CODE_UNKNOWN_KIND: _ClassVar[TaskErrorCode]
    TASK_ERROR_CODE_PAYLOAD_TOO_LARGE: _ClassVar[TaskErrorCode]
    TASK_ERROR_CODE_RESULT_NOT_SERIALIZABLE: _ClassVar[TaskErrorCode]
    TASK_ERROR_CODE_DEADLINE_EXCEEDED: _ClassVar[TaskErrorCode]
    TASK_ERROR_CODE_ATTEMPTS_EXHAUSTED: _ClassVar[TaskErrorCode]
    TASK_ERROR_CODE_CHECKPOINT_CORRUPTED: _ClassVar[TaskErrorCode]
    TASK_ERROR_CODE_RESTORE_FAILED: _ClassVar[TaskErrorCode]
    TASK_ERROR_CODE_INTERNAL: _ClassVar[TaskErrorCode]
    TASK_ERROR_CODE_DATA_LOSS: _ClassVar[TaskErrorCode]

class CrdtType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CRDT_TYPE_UNSPECIFIED: _ClassVar[CrdtType]
    CRDT_TYPE_G_COUNTER: _ClassVar[CrdtType]
    CRDT_TYPE_PN_COUNTER: _ClassVar[CrdtType]
    CRDT_TYPE_OR_SET: _ClassVar[CrdtType]
    CRDT_TYPE_LWW_MAP: _ClassVar[CrdtType]
    CRDT_TYPE_MV_MAP: _ClassVar[CrdtType]
    CRDT_TYPE_RGA: _ClassVar[CrdtType]

class ResolutionPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESOLUTION_POLICY_UNSPECIFIED: _ClassVar[ResolutionPolicy]
    RESOLUTION_POLICY_LWW_HLC: _ClassVar[ResolutionPolicy]
    RESOLUTION_POLICY_CRDT_MERGE: _ClassVar[ResolutionPolicy]
    RESOLUTION_POLICY_CUSTOM: _ClassVar[ResolutionPolicy]
    RESOLUTION_POLICY_KEEP_SIBLINGS: _ClassVar[ResolutionPolicy]

class ReconcileTrigger(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RECONCILE_TRIGGER_UNSPECIFIED: _ClassVar[ReconcileTrigger]
    RECONCILE_TRIGGER_NODE_RECONNECTED: _ClassVar[ReconcileTrigger]
    RECONCILE_TRIGGER_LEADER_CHANGED: _ClassVar[ReconcileTrigger]
    RECONCILE_TRIGGER_ZOMBIE_LINEAGE: _ClassVar[ReconcileTrigger]
    RECONCILE_TRIGGER_ANTI_ENTROPY: _ClassVar[ReconcileTrigger]
    RECONCILE_TRIGGER_MANUAL: _ClassVar[ReconcileTrigger]

class ForkResolution(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FORK_RESOLUTION_UNSPECIFIED: _ClassVar[ForkResolution]
    FORK_RESOLUTION_PENDING: _ClassVar[ForkResolution]
    FORK_RESOLUTION_KEPT: _ClassVar[ForkResolution]
    FORK_RESOLUTION_MERGED: _ClassVar[ForkResolution]
    FORK_RESOLUTION_UNRECOVERABLE: _ClassVar[ForkResolution]

class FenceSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FENCE_SOURCE_UNSPECIFIED: _ClassVar[FenceSource]
    FENCE_SOURCE_HELLO: _ClassVar[FenceSource]
    FENCE_SOURCE_TASK_UPDATE: _ClassVar[FenceSource]
    FENCE_SOURCE_CHECKPOINT_WRITE: _ClassVar[FenceSource]

class SuspicionReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUSPICION_REASON_UNSPECIFIED: _ClassVar[SuspicionReason]
    SUSPICION_REASON_STREAM_CLOSED: _ClassVar[SuspicionReason]
    SUSPICION_REASON_HEARTBEAT_TIMEOUT: _ClassVar[SuspicionReason]
    SUSPICION_REASON_PHI_THRESHOLD: _ClassVar[SuspicionReason]

class MemberRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMBER_ROLE_UNSPECIFIED: _ClassVar[MemberRole]
    MEMBER_ROLE_LEADER: _ClassVar[MemberRole]
    MEMBER_ROLE_FOLLOWER: _ClassVar[MemberRole]

class EventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_TYPE_UNSPECIFIED: _ClassVar[EventType]
    EVENT_TYPE_LEADER_ELECTED: _ClassVar[EventType]
    EVENT_TYPE_NODE_JOINED: _ClassVar[EventType]
    EVENT_TYPE_NODE_SUSPECTED: _ClassVar[EventType]
    EVENT_TYPE_NODE_RECOVERED: _ClassVar[EventType]
    EVENT_TYPE_NODE_DEAD: _ClassVar[EventType]
    EVENT_TYPE_NODE_DRAINING: _ClassVar[EventType]
    EVENT_TYPE_NODE_UNCORDONED: _ClassVar[EventType]
    EVENT_TYPE_NODE_LEFT: _ClassVar[EventType]
    EVENT_TYPE_MASS_FAILURE_GUARD: _ClassVar[EventType]
    EVENT_TYPE_IDENTITY_CONFLICT: _ClassVar[EventType]
    EVENT_TYPE_TASK_SUBMITTED: _ClassVar[EventType]
    EVENT_TYPE_TASK_ASSIGNED: _ClassVar[EventType]
    EVENT_TYPE_TASK_STARTED: _ClassVar[EventType]
    EVENT_TYPE_TASK_REASSIGNED: _ClassVar[EventType]
    EVENT_TYPE_TASK_RESUMED: _ClassVar[EventType]
    EVENT_TYPE_TASK_COMPLETED: _ClassVar[EventType]
    EVENT_TYPE_TASK_FAILED: _ClassVar[EventType]
    EVENT_TYPE_TASK_CANCELLED: _ClassVar[EventType]
    EVENT_TYPE_TASK_FORKED: _ClassVar[EventType]
    EVENT_TYPE_ZOMBIE_FENCED: _ClassVar[EventType]
    EVENT_TYPE_CONFLICT_DETECTED: _ClassVar[EventType]
    EVENT_TYPE_RECOVERY_COMPLETED: _ClassVar[EventType]
    EVENT_TYPE_RECONCILE_STARTED: _ClassVar[EventType]
    EVENT_TYPE_RECONCILE_COMPLETED: _ClassVar[EventType]
    EVENT_TYPE_RECORD_QUARANTINED: _ClassVar[EventType]
NODE_STATE_UNSPECIFIED: NodeState
NODE_STATE_ALIVE: NodeState
NODE_STATE_SUSPECT: NodeState
NODE_STATE_DEAD: NodeState
NODE_STATE_DRAINING: NodeState
NODE_STATE_LEFT: NodeState
TASK_STATE_UNSPECIFIED: TaskState
TASK_STATE_PENDING: TaskState
TASK_STATE_ASSIGNED: TaskState
TASK_STATE_RUNNING: TaskState
TASK_STATE_COMPLETED: TaskState
TASK_STATE_FAILED: TaskState
TASK_STATE_CANCELLED: TaskState
CHECKPOINT_DURABILITY_UNSPECIFIED: CheckpointDurability
CHECKPOINT_DURABILITY_LOCAL: CheckpointDurability
CHECKPOINT_DURABILITY_REPLICATED: CheckpointDurability
STATE_MODEL_UNSPECIFIED: StateModel
STATE_MODEL_OPAQUE: StateModel
STATE_MODEL_CRDT: StateModel
PAYLOAD_ENCODING_UNSPECIFIED: PayloadEncoding
PAYLOAD_ENCODING_RAW: PayloadEncoding
PAYLOAD_ENCODING_ZSTD: PayloadEncoding
CHECKSUM_ALGORITHM_UNSPECIFIED: ChecksumAlgorithm
CHECKSUM_ALGORITHM_CRC32: ChecksumAlgorithm
CHECKSUM_ALGORITHM_SHA256: ChecksumAlgorithm
CHECKSUM_ALGORITHM_CRC32C: ChecksumAlgorithm
CHECKPOINT_LOCATION_UNSPECIFIED: CheckpointLocation
CHECKPOINT_LOCATION_LOCAL: CheckpointLocation
CHECKPOINT_LOCATION_REDIS: CheckpointLocation
MOVE_REASON_UNSPECIFIED: MoveReason
MOVE_REASON_NODE_DEAD: MoveReason
MOVE_REASON_DRAIN: MoveReason
MOVE_REASON_MIGRATE: MoveReason
MOVE_REASON_REBALANCE: MoveReason
MOVE_REASON_ASSIGN_REJECTED: MoveReason
MOVE_REASON_RELEASE_TIMEOUT: MoveReason
TASK_ERROR_CODE_UNSPECIFIED: TaskErrorCode
TASK_ERROR_CODE_HANDLER_ERROR: TaskErrorCode
TASK_ERROR_CODE_UNKNOWN_KIND: TaskErrorCode
TASK_ERROR_CODE_PAYLOAD_TOO_LARGE: TaskErrorCode
TASK_ERROR_CODE_RESULT_NOT_SERIALIZABLE: TaskErrorCode
TASK_ERROR_CODE_DEADLINE_EXCEEDED: TaskErrorCode
TASK_ERROR_CODE_ATTEMPTS_EXHAUSTED: TaskErrorCode
TASK_ERROR_CODE_CHECKPOINT_CORRUPTED: TaskErrorCode
TASK_ERROR_CODE_RESTORE_FAILED: TaskErrorCode
TASK_ERROR_CODE_INTERNAL: TaskErrorCode
TASK_ERROR_CODE_DATA_LOSS: TaskErrorCode
CRDT_TYPE_UNSPECIFIED: CrdtType
CRDT_TYPE_G_COUNTER: CrdtType
CRDT_TYPE_PN_COUNTER: CrdtType
CRDT_TYPE_OR_SET: CrdtType
CRDT_TYPE_LWW_MAP: CrdtType
CRDT_TYPE_MV_MAP: CrdtType
CRDT_TYPE_RGA: CrdtType
RESOLUTION_POLICY_UNSPECIFIED: ResolutionPolicy
RESOLUTION_POLICY_LWW_HLC: ResolutionPolicy
RESOLUTION_POLICY_CRDT_MERGE: ResolutionPolicy
RESOLUTION_POLICY_CUSTOM: ResolutionPolicy
RESOLUTION_POLICY_KEEP_SIBLINGS: ResolutionPolicy
RECONCILE_TRIGGER_UNSPECIFIED: ReconcileTrigger
RECONCILE_TRIGGER_NODE_RECONNECTED: ReconcileTrigger
RECONCILE_TRIGGER_LEADER_CHANGED: ReconcileTrigger
RECONCILE_TRIGGER_ZOMBIE_LINEAGE: ReconcileTrigger
RECONCILE_TRIGGER_ANTI_ENTROPY: ReconcileTrigger
RECONCILE_TRIGGER_MANUAL: ReconcileTrigger
FORK_RESOLUTION_UNSPECIFIED: ForkResolution
FORK_RESOLUTION_PENDING: ForkResolution
FORK_RESOLUTION_KEPT: ForkResolution
FORK_RESOLUTION_MERGED: ForkResolution
FORK_RESOLUTION_UNRECOVERABLE: ForkResolution
FENCE_SOURCE_UNSPECIFIED: FenceSource
FENCE_SOURCE_HELLO: FenceSource
FENCE_SOURCE_TASK_UPDATE: FenceSource
FENCE_SOURCE_CHECKPOINT_WRITE: FenceSource
SUSPICION_REASON_UNSPECIFIED: SuspicionReason
SUSPICION_REASON_STREAM_CLOSED: SuspicionReason
SUSPICION_REASON_HEARTBEAT_TIMEOUT: SuspicionReason
SUSPICION_REASON_PHI_THRESHOLD: SuspicionReason
MEMBER_ROLE_UNSPECIFIED: MemberRole
MEMBER_ROLE_LEADER: MemberRole
MEMBER_ROLE_FOLLOWER: MemberRole
EVENT_TYPE_UNSPECIFIED: EventType
EVENT_TYPE_LEADER_ELECTED: EventType
EVENT_TYPE_NODE_JOINED: EventType
EVENT_TYPE_NODE_SUSPECTED: EventType
EVENT_TYPE_NODE_RECOVERED: EventType
EVENT_TYPE_NODE_DEAD: EventType
EVENT_TYPE_NODE_DRAINING: EventType
EVENT_TYPE_NODE_UNCORDONED: EventType
EVENT_TYPE_NODE_LEFT: EventType
EVENT_TYPE_MASS_FAILURE_GUARD: EventType
EVENT_TYPE_IDENTITY_CONFLICT: EventType
EVENT_TYPE_TASK_SUBMITTED: EventType
EVENT_TYPE_TASK_ASSIGNED: EventType
EVENT_TYPE_TASK_STARTED: EventType
EVENT_TYPE_TASK_REASSIGNED: EventType
EVENT_TYPE_TASK_RESUMED: EventType
EVENT_TYPE_TASK_COMPLETED: EventType
EVENT_TYPE_TASK_FAILED: EventType
EVENT_TYPE_TASK_CANCELLED: EventType
EVENT_TYPE_TASK_FORKED: EventType
EVENT_TYPE_ZOMBIE_FENCED: EventType
EVENT_TYPE_CONFLICT_DETECTED: EventType
EVENT_TYPE_RECOVERY_COMPLETED: EventType
EVENT_TYPE_RECONCILE_STARTED: EventType
EVENT_TYPE_RECONCILE_COMPLETED: EventType
EVENT_TYPE_RECORD_QUARANTINED: EventType

class NodeCapacity(_message.Message):
    __slots__ = ("slots", "cpu_millicores", "memory_bytes")
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLICORES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    slots: int
    cpu_millicores: int
    memory_bytes: int
    def __init__(self, slots: _Optional[int] = ..., cpu_millicores: _Optional[int] = ..., memory_bytes: _Optional[int] = ...) -> None: ...

class NodeLoad(_message.Message):
    __slots__ = ("running_tasks", "used_slots", "cpu_utilization_ratio", "memory_used_bytes", "replication_backlog_records", "replication_lag_ms")
    RUNNING_TASKS_FIELD_NUMBER: _ClassVar[int]
    USED_SLOTS_FIELD_NUMBER: _ClassVar[int]
    CPU_UTILIZATION_RATIO_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_BACKLOG_RECORDS_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_LAG_MS_FIELD_NUMBER: _ClassVar[int]
    running_tasks: int
    used_slots: int
    cpu_utilization_ratio: float
    memory_used_bytes: int
    replication_backlog_records: int
    replication_lag_ms: int
    def __init__(self, running_tasks: _Optional[int] = ..., used_slots: _Optional[int] = ..., cpu_utilization_ratio: _Optional[float] = ..., memory_used_bytes: _Optional[int] = ..., replication_backlog_records: _Optional[int] = ..., replication_lag_ms: _Optional[int] = ...) -> None: ...

class NodeRecord(_message.Message):
    __slots__ = ("node_id", "incarnation", "address", "capacity", "labels", "state", "cordoned", "drain_id", "drain_reason", "registered_at_unix_ms", "incarnation_started_at_unix_ms", "state_changed_at_unix_ms", "last_heartbeat_at_unix_ms", "agent_version", "written_term", "kinds", "incarnation_secret_sha256", "store_id")
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
    STATE_FIELD_NUMBER: _ClassVar[int]
    CORDONED_FIELD_NUMBER: _ClassVar[int]
    DRAIN_ID_FIELD_NUMBER: _ClassVar[int]
    DRAIN_REASON_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_STARTED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    STATE_CHANGED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    WRITTEN_TERM_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_SECRET_SHA256_FIELD_NUMBER: _ClassVar[int]
    STORE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    incarnation: str
    address: str
    capacity: NodeCapacity
    labels: _containers.ScalarMap[str, str]
    state: NodeState
    cordoned: bool
    drain_id: str
    drain_reason: str
    registered_at_unix_ms: int
    incarnation_started_at_unix_ms: int
    state_changed_at_unix_ms: int
    last_heartbeat_at_unix_ms: int
    agent_version: str
    written_term: int
    kinds: _containers.RepeatedScalarFieldContainer[str]
    incarnation_secret_sha256: bytes
    store_id: str
    def __init__(self, node_id: _Optional[str] = ..., incarnation: _Optional[str] = ..., address: _Optional[str] = ..., capacity: _Optional[_Union[NodeCapacity, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., state: _Optional[_Union[NodeState, str]] = ..., cordoned: _Optional[bool] = ..., drain_id: _Optional[str] = ..., drain_reason: _Optional[str] = ..., registered_at_unix_ms: _Optional[int] = ..., incarnation_started_at_unix_ms: _Optional[int] = ..., state_changed_at_unix_ms: _Optional[int] = ..., last_heartbeat_at_unix_ms: _Optional[int] = ..., agent_version: _Optional[str] = ..., written_term: _Optional[int] = ..., kinds: _Optional[_Iterable[str]] = ..., incarnation_secret_sha256: _Optional[bytes] = ..., store_id: _Optional[str] = ...) -> None: ...

class MemberRecord(_message.Message):
    __slots__ = ("member_id", "address", "metrics_address", "role", "lease_id", "candidacy_revision", "version", "started_at_unix_ms")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    METRICS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    CANDIDACY_REVISION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    address: str
    metrics_address: str
    role: MemberRole
    lease_id: int
    candidacy_revision: int
    version: str
    started_at_unix_ms: int
    def __init__(self, member_id: _Optional[str] = ..., address: _Optional[str] = ..., metrics_address: _Optional[str] = ..., role: _Optional[_Union[MemberRole, str]] = ..., lease_id: _Optional[int] = ..., candidacy_revision: _Optional[int] = ..., version: _Optional[str] = ..., started_at_unix_ms: _Optional[int] = ...) -> None: ...

class TaskSpec(_message.Message):
    __slots__ = ("kind", "payload", "content_type", "labels", "node_selector", "slots", "priority", "max_attempts", "deadline_unix_ms", "durability", "state_model", "checkpoint_interval_ms")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class NodeSelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    NODE_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    DURABILITY_FIELD_NUMBER: _ClassVar[int]
    STATE_MODEL_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    payload: bytes
    content_type: str
    labels: _containers.ScalarMap[str, str]
    node_selector: _containers.ScalarMap[str, str]
    slots: int
    priority: int
    max_attempts: int
    deadline_unix_ms: int
    durability: CheckpointDurability
    state_model: StateModel
    checkpoint_interval_ms: int
    def __init__(self, kind: _Optional[str] = ..., payload: _Optional[bytes] = ..., content_type: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., node_selector: _Optional[_Mapping[str, str]] = ..., slots: _Optional[int] = ..., priority: _Optional[int] = ..., max_attempts: _Optional[int] = ..., deadline_unix_ms: _Optional[int] = ..., durability: _Optional[_Union[CheckpointDurability, str]] = ..., state_model: _Optional[_Union[StateModel, str]] = ..., checkpoint_interval_ms: _Optional[int] = ...) -> None: ...

class TaskResult(_message.Message):
    __slots__ = ("payload", "content_type", "size_bytes", "redis_key", "crc32")
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    REDIS_KEY_FIELD_NUMBER: _ClassVar[int]
    CRC32_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    content_type: str
    size_bytes: int
    redis_key: str
    crc32: int
    def __init__(self, payload: _Optional[bytes] = ..., content_type: _Optional[str] = ..., size_bytes: _Optional[int] = ..., redis_key: _Optional[str] = ..., crc32: _Optional[int] = ...) -> None: ...

class TaskError(_message.Message):
    __slots__ = ("code", "message", "exception_type", "traceback", "retryable", "node_id", "epoch", "attempt", "occurred_at_unix_ms")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    EXCEPTION_TYPE_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    code: TaskErrorCode
    message: str
    exception_type: str
    traceback: str
    retryable: bool
    node_id: str
    epoch: int
    attempt: int
    occurred_at_unix_ms: int
    def __init__(self, code: _Optional[_Union[TaskErrorCode, str]] = ..., message: _Optional[str] = ..., exception_type: _Optional[str] = ..., traceback: _Optional[str] = ..., retryable: _Optional[bool] = ..., node_id: _Optional[str] = ..., epoch: _Optional[int] = ..., attempt: _Optional[int] = ..., occurred_at_unix_ms: _Optional[int] = ...) -> None: ...

class CheckpointSummary(_message.Message):
    __slots__ = ("checkpoint_ref", "task_id", "epoch", "seq", "covers_journal_seq", "terminal", "label", "created_at_unix_ms", "stored_bytes", "replicated", "node_id", "parent_ref")
    CHECKPOINT_REF_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    COVERS_JOURNAL_SEQ_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    REPLICATED_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_REF_FIELD_NUMBER: _ClassVar[int]
    checkpoint_ref: str
    task_id: str
    epoch: int
    seq: int
    covers_journal_seq: int
    terminal: bool
    label: str
    created_at_unix_ms: int
    stored_bytes: int
    replicated: bool
    node_id: str
    parent_ref: str
    def __init__(self, checkpoint_ref: _Optional[str] = ..., task_id: _Optional[str] = ..., epoch: _Optional[int] = ..., seq: _Optional[int] = ..., covers_journal_seq: _Optional[int] = ..., terminal: _Optional[bool] = ..., label: _Optional[str] = ..., created_at_unix_ms: _Optional[int] = ..., stored_bytes: _Optional[int] = ..., replicated: _Optional[bool] = ..., node_id: _Optional[str] = ..., parent_ref: _Optional[str] = ...) -> None: ...

class TaskMove(_message.Message):
    __slots__ = ("move_id", "reason", "target_node_id", "requested_at_unix_ms", "release_deadline_unix_ms")
    MOVE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TARGET_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    RELEASE_DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    move_id: str
    reason: MoveReason
    target_node_id: str
    requested_at_unix_ms: int
    release_deadline_unix_ms: int
    def __init__(self, move_id: _Optional[str] = ..., reason: _Optional[_Union[MoveReason, str]] = ..., target_node_id: _Optional[str] = ..., requested_at_unix_ms: _Optional[int] = ..., release_deadline_unix_ms: _Optional[int] = ...) -> None: ...

class TaskRecord(_message.Message):
    __slots__ = ("task_id", "spec", "state", "epoch", "attempt", "owner_node_id", "owner_incarnation", "request_id", "submitted_at_unix_ms", "assigned_at_unix_ms", "started_at_unix_ms", "finished_at_unix_ms", "updated_at_unix_ms", "last_checkpoint", "last_replicated_checkpoint", "last_replicated_journal_seq", "result", "last_error", "move", "cancel_reason", "forked_from_ref", "fork_count", "previous_owner_node_ids", "written_term")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    OWNER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_INCARNATION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    LAST_REPLICATED_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    LAST_REPLICATED_JOURNAL_SEQ_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    MOVE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REASON_FIELD_NUMBER: _ClassVar[int]
    FORKED_FROM_REF_FIELD_NUMBER: _ClassVar[int]
    FORK_COUNT_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_OWNER_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    WRITTEN_TERM_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    spec: TaskSpec
    state: TaskState
    epoch: int
    attempt: int
    owner_node_id: str
    owner_incarnation: str
    request_id: str
    submitted_at_unix_ms: int
    assigned_at_unix_ms: int
    started_at_unix_ms: int
    finished_at_unix_ms: int
    updated_at_unix_ms: int
    last_checkpoint: CheckpointSummary
    last_replicated_checkpoint: CheckpointSummary
    last_replicated_journal_seq: int
    result: TaskResult
    last_error: TaskError
    move: TaskMove
    cancel_reason: str
    forked_from_ref: str
    fork_count: int
    previous_owner_node_ids: _containers.RepeatedScalarFieldContainer[str]
    written_term: int
    def __init__(self, task_id: _Optional[str] = ..., spec: _Optional[_Union[TaskSpec, _Mapping]] = ..., state: _Optional[_Union[TaskState, str]] = ..., epoch: _Optional[int] = ..., attempt: _Optional[int] = ..., owner_node_id: _Optional[str] = ..., owner_incarnation: _Optional[str] = ..., request_id: _Optional[str] = ..., submitted_at_unix_ms: _Optional[int] = ..., assigned_at_unix_ms: _Optional[int] = ..., started_at_unix_ms: _Optional[int] = ..., finished_at_unix_ms: _Optional[int] = ..., updated_at_unix_ms: _Optional[int] = ..., last_checkpoint: _Optional[_Union[CheckpointSummary, _Mapping]] = ..., last_replicated_checkpoint: _Optional[_Union[CheckpointSummary, _Mapping]] = ..., last_replicated_journal_seq: _Optional[int] = ..., result: _Optional[_Union[TaskResult, _Mapping]] = ..., last_error: _Optional[_Union[TaskError, _Mapping]] = ..., move: _Optional[_Union[TaskMove, _Mapping]] = ..., cancel_reason: _Optional[str] = ..., forked_from_ref: _Optional[str] = ..., fork_count: _Optional[int] = ..., previous_owner_node_ids: _Optional[_Iterable[str]] = ..., written_term: _Optional[int] = ...) -> None: ...

class CheckpointRecord(_message.Message):
    __slots__ = ("task_id", "epoch", "seq", "covers_journal_seq", "checkpoint_ref", "terminal", "label", "payload", "encoding", "content_type", "decoded_bytes", "created_at_unix_ms", "node_id", "incarnation", "parent_ref", "state_vector", "checksum_algorithm", "checksum")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    COVERS_JOURNAL_SEQ_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_REF_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    DECODED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    PARENT_REF_FIELD_NUMBER: _ClassVar[int]
    STATE_VECTOR_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    epoch: int
    seq: int
    covers_journal_seq: int
    checkpoint_ref: str
    terminal: bool
    label: str
    payload: bytes
    encoding: PayloadEncoding
    content_type: str
    decoded_bytes: int
    created_at_unix_ms: int
    node_id: str
    incarnation: str
    parent_ref: str
    state_vector: StateVector
    checksum_algorithm: ChecksumAlgorithm
    checksum: bytes
    def __init__(self, task_id: _Optional[str] = ..., epoch: _Optional[int] = ..., seq: _Optional[int] = ..., covers_journal_seq: _Optional[int] = ..., checkpoint_ref: _Optional[str] = ..., terminal: _Optional[bool] = ..., label: _Optional[str] = ..., payload: _Optional[bytes] = ..., encoding: _Optional[_Union[PayloadEncoding, str]] = ..., content_type: _Optional[str] = ..., decoded_bytes: _Optional[int] = ..., created_at_unix_ms: _Optional[int] = ..., node_id: _Optional[str] = ..., incarnation: _Optional[str] = ..., parent_ref: _Optional[str] = ..., state_vector: _Optional[_Union[StateVector, _Mapping]] = ..., checksum_algorithm: _Optional[_Union[ChecksumAlgorithm, str]] = ..., checksum: _Optional[bytes] = ...) -> None: ...

class JournalEventRecord(_message.Message):
    __slots__ = ("task_id", "epoch", "seq", "payload", "content_type", "created_at_unix_ms", "node_id", "hlc", "checksum_algorithm", "checksum")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HLC_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    epoch: int
    seq: int
    payload: bytes
    content_type: str
    created_at_unix_ms: int
    node_id: str
    hlc: HybridTimestamp
    checksum_algorithm: ChecksumAlgorithm
    checksum: bytes
    def __init__(self, task_id: _Optional[str] = ..., epoch: _Optional[int] = ..., seq: _Optional[int] = ..., payload: _Optional[bytes] = ..., content_type: _Optional[str] = ..., created_at_unix_ms: _Optional[int] = ..., node_id: _Optional[str] = ..., hlc: _Optional[_Union[HybridTimestamp, _Mapping]] = ..., checksum_algorithm: _Optional[_Union[ChecksumAlgorithm, str]] = ..., checksum: _Optional[bytes] = ...) -> None: ...

class StateEdit(_message.Message):
    __slots__ = ("key", "value_json")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_JSON_FIELD_NUMBER: _ClassVar[int]
    key: str
    value_json: bytes
    def __init__(self, key: _Optional[str] = ..., value_json: _Optional[bytes] = ...) -> None: ...

class ForkRecord(_message.Message):
    __slots__ = ("fork_id", "task_id", "lineage_task_id", "node_id", "incarnation", "stale_epoch", "current_epoch", "base_checkpoint", "head_checkpoint", "divergent_checkpoints", "divergent_journal_events", "first_divergent_journal_seq", "last_divergent_journal_seq", "resolution", "merged_into_epoch", "error", "detected_at_unix_ms", "resolved_at_unix_ms", "written_term")
    FORK_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    LINEAGE_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    STALE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    CURRENT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    BASE_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    HEAD_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    DIVERGENT_CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    DIVERGENT_JOURNAL_EVENTS_FIELD_NUMBER: _ClassVar[int]
    FIRST_DIVERGENT_JOURNAL_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_DIVERGENT_JOURNAL_SEQ_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    MERGED_INTO_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DETECTED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    WRITTEN_TERM_FIELD_NUMBER: _ClassVar[int]
    fork_id: str
    task_id: str
    lineage_task_id: str
    node_id: str
    incarnation: str
    stale_epoch: int
    current_epoch: int
    base_checkpoint: CheckpointSummary
    head_checkpoint: CheckpointSummary
    divergent_checkpoints: int
    divergent_journal_events: int
    first_divergent_journal_seq: int
    last_divergent_journal_seq: int
    resolution: ForkResolution
    merged_into_epoch: int
    error: str
    detected_at_unix_ms: int
    resolved_at_unix_ms: int
    written_term: int
    def __init__(self, fork_id: _Optional[str] = ..., task_id: _Optional[str] = ..., lineage_task_id: _Optional[str] = ..., node_id: _Optional[str] = ..., incarnation: _Optional[str] = ..., stale_epoch: _Optional[int] = ..., current_epoch: _Optional[int] = ..., base_checkpoint: _Optional[_Union[CheckpointSummary, _Mapping]] = ..., head_checkpoint: _Optional[_Union[CheckpointSummary, _Mapping]] = ..., divergent_checkpoints: _Optional[int] = ..., divergent_journal_events: _Optional[int] = ..., first_divergent_journal_seq: _Optional[int] = ..., last_divergent_journal_seq: _Optional[int] = ..., resolution: _Optional[_Union[ForkResolution, str]] = ..., merged_into_epoch: _Optional[int] = ..., error: _Optional[str] = ..., detected_at_unix_ms: _Optional[int] = ..., resolved_at_unix_ms: _Optional[int] = ..., written_term: _Optional[int] = ...) -> None: ...

class HybridTimestamp(_message.Message):
    __slots__ = ("wall_ms", "logical", "node_id")
    WALL_MS_FIELD_NUMBER: _ClassVar[int]
    LOGICAL_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    wall_ms: int
    logical: int
    node_id: str
    def __init__(self, wall_ms: _Optional[int] = ..., logical: _Optional[int] = ..., node_id: _Optional[str] = ...) -> None: ...

class StateVector(_message.Message):
    __slots__ = ("counters",)
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    counters: _containers.ScalarMap[str, int]
    def __init__(self, counters: _Optional[_Mapping[str, int]] = ...) -> None: ...

class DocumentStateVector(_message.Message):
    __slots__ = ("doc_id", "crdt_type", "state_vector", "op_count")
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    CRDT_TYPE_FIELD_NUMBER: _ClassVar[int]
    STATE_VECTOR_FIELD_NUMBER: _ClassVar[int]
    OP_COUNT_FIELD_NUMBER: _ClassVar[int]
    doc_id: str
    crdt_type: CrdtType
    state_vector: StateVector
    op_count: int
    def __init__(self, doc_id: _Optional[str] = ..., crdt_type: _Optional[_Union[CrdtType, str]] = ..., state_vector: _Optional[_Union[StateVector, _Mapping]] = ..., op_count: _Optional[int] = ...) -> None: ...

class DocumentDelta(_message.Message):
    __slots__ = ("doc_id", "crdt_type", "since", "until", "ops", "codec", "op_count", "origin_node_id")
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    CRDT_TYPE_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    OP_COUNT_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    doc_id: str
    crdt_type: CrdtType
    since: StateVector
    until: StateVector
    ops: bytes
    codec: str
    op_count: int
    origin_node_id: str
    def __init__(self, doc_id: _Optional[str] = ..., crdt_type: _Optional[_Union[CrdtType, str]] = ..., since: _Optional[_Union[StateVector, _Mapping]] = ..., until: _Optional[_Union[StateVector, _Mapping]] = ..., ops: _Optional[bytes] = ..., codec: _Optional[str] = ..., op_count: _Optional[int] = ..., origin_node_id: _Optional[str] = ...) -> None: ...

class ReconcileConflict(_message.Message):
    __slots__ = ("doc_id", "key", "policy", "sibling_count", "winner_node_id")
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    SIBLING_COUNT_FIELD_NUMBER: _ClassVar[int]
    WINNER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    doc_id: str
    key: str
    policy: ResolutionPolicy
    sibling_count: int
    winner_node_id: str
    def __init__(self, doc_id: _Optional[str] = ..., key: _Optional[str] = ..., policy: _Optional[_Union[ResolutionPolicy, str]] = ..., sibling_count: _Optional[int] = ..., winner_node_id: _Optional[str] = ...) -> None: ...

class DocumentRecord(_message.Message):
    __slots__ = ("doc_id", "crdt_type", "state_vector", "state", "codec", "op_count", "updated_at_unix_ms", "checksum_algorithm", "checksum")
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    CRDT_TYPE_FIELD_NUMBER: _ClassVar[int]
    STATE_VECTOR_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    OP_COUNT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    doc_id: str
    crdt_type: CrdtType
    state_vector: StateVector
    state: bytes
    codec: str
    op_count: int
    updated_at_unix_ms: int
    checksum_algorithm: ChecksumAlgorithm
    checksum: bytes
    def __init__(self, doc_id: _Optional[str] = ..., crdt_type: _Optional[_Union[CrdtType, str]] = ..., state_vector: _Optional[_Union[StateVector, _Mapping]] = ..., state: _Optional[bytes] = ..., codec: _Optional[str] = ..., op_count: _Optional[int] = ..., updated_at_unix_ms: _Optional[int] = ..., checksum_algorithm: _Optional[_Union[ChecksumAlgorithm, str]] = ..., checksum: _Optional[bytes] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("revision", "occurred_at_unix_ms", "term", "leader_elected", "node_joined", "node_suspected", "node_recovered", "node_dead", "node_draining", "node_uncordoned", "node_left", "mass_failure_guard", "identity_conflict", "task_submitted", "task_assigned", "task_started", "task_reassigned", "task_resumed", "task_completed", "task_failed", "task_cancelled", "task_forked", "zombie_fenced", "conflict_detected", "recovery_completed", "reconcile_started", "reconcile_completed", "record_quarantined")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_ELECTED_FIELD_NUMBER: _ClassVar[int]
    NODE_JOINED_FIELD_NUMBER: _ClassVar[int]
    NODE_SUSPECTED_FIELD_NUMBER: _ClassVar[int]
    NODE_RECOVERED_FIELD_NUMBER: _ClassVar[int]
    NODE_DEAD_FIELD_NUMBER: _ClassVar[int]
    NODE_DRAINING_FIELD_NUMBER: _ClassVar[int]
    NODE_UNCORDONED_FIELD_NUMBER: _ClassVar[int]
    NODE_LEFT_FIELD_NUMBER: _ClassVar[int]
    MASS_FAILURE_GUARD_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_CONFLICT_FIELD_NUMBER: _ClassVar[int]
    TASK_SUBMITTED_FIELD_NUMBER: _ClassVar[int]
    TASK_ASSIGNED_FIELD_NUMBER: _ClassVar[int]
    TASK_STARTED_FIELD_NUMBER: _ClassVar[int]
    TASK_REASSIGNED_FIELD_NUMBER: _ClassVar[int]
    TASK_RESUMED_FIELD_NUMBER: _ClassVar[int]
    TASK_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    TASK_FAILED_FIELD_NUMBER: _ClassVar[int]
    TASK_CANCELLED_FIELD_NUMBER: _ClassVar[int]
    TASK_FORKED_FIELD_NUMBER: _ClassVar[int]
    ZOMBIE_FENCED_FIELD_NUMBER: _ClassVar[int]
    CONFLICT_DETECTED_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    RECONCILE_STARTED_FIELD_NUMBER: _ClassVar[int]
    RECONCILE_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    RECORD_QUARANTINED_FIELD_NUMBER: _ClassVar[int]
    revision: int
    occurred_at_unix_ms: int
    term: int
    leader_elected: LeaderElected
    node_joined: NodeJoined
    node_suspected: NodeSuspected
    node_recovered: NodeRecovered
    node_dead: NodeDead
    node_draining: NodeDraining
    node_uncordoned: NodeUncordoned
    node_left: NodeLeft
    mass_failure_guard: MassFailureGuardChanged
    identity_conflict: IdentityConflict
    task_submitted: TaskSubmitted
    task_assigned: TaskAssigned
    task_started: TaskStarted
    task_reassigned: TaskReassigned
    task_resumed: TaskResumed
    task_completed: TaskCompleted
    task_failed: TaskFailed
    task_cancelled: TaskCancelled
    task_forked: TaskForked
    zombie_fenced: ZombieFenced
    conflict_detected: ConflictDetected
    recovery_completed: RecoveryCompleted
    reconcile_started: ReconcileStarted
    reconcile_completed: ReconcileCompleted
    record_quarantined: RecordQuarantined
    def __init__(self, revision: _Optional[int] = ..., occurred_at_unix_ms: _Optional[int] = ..., term: _Optional[int] = ..., leader_elected: _Optional[_Union[LeaderElected, _Mapping]] = ..., node_joined: _Optional[_Union[NodeJoined, _Mapping]] = ..., node_suspected: _Optional[_Union[NodeSuspected, _Mapping]] = ..., node_recovered: _Optional[_Union[NodeRecovered, _Mapping]] = ..., node_dead: _Optional[_Union[NodeDead, _Mapping]] = ..., node_draining: _Optional[_Union[NodeDraining, _Mapping]] = ..., node_uncordoned: _Optional[_Union[NodeUncordoned, _Mapping]] = ..., node_left: _Optional[_Union[NodeLeft, _Mapping]] = ..., mass_failure_guard: _Optional[_Union[MassFailureGuardChanged, _Mapping]] = ..., identity_conflict: _Optional[_Union[IdentityConflict, _Mapping]] = ..., task_submitted: _Optional[_Union[TaskSubmitted, _Mapping]] = ..., task_assigned: _Optional[_Union[TaskAssigned, _Mapping]] = ..., task_started: _Optional[_Union[TaskStarted, _Mapping]] = ..., task_reassigned: _Optional[_Union[TaskReassigned, _Mapping]] = ..., task_resumed: _Optional[_Union[TaskResumed, _Mapping]] = ..., task_completed: _Optional[_Union[TaskCompleted, _Mapping]] = ..., task_failed: _Optional[_Union[TaskFailed, _Mapping]] = ..., task_cancelled: _Optional[_Union[TaskCancelled, _Mapping]] = ..., task_forked: _Optional[_Union[TaskForked, _Mapping]] = ..., zombie_fenced: _Optional[_Union[ZombieFenced, _Mapping]] = ..., conflict_detected: _Optional[_Union[ConflictDetected, _Mapping]] = ..., recovery_completed: _Optional[_Union[RecoveryCompleted, _Mapping]] = ..., reconcile_started: _Optional[_Union[ReconcileStarted, _Mapping]] = ..., reconcile_completed: _Optional[_Union[ReconcileCompleted, _Mapping]] = ..., record_quarantined: _Optional[_Union[RecordQuarantined, _Mapping]] = ...) -> None: ...

class LeaderElected(_message.Message):
    __slots__ = ("leader_id", "leader_address", "term", "previous_term")
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_TERM_FIELD_NUMBER: _ClassVar[int]
    leader_id: str
    leader_address: str
    term: int
    previous_term: int
    def __init__(self, leader_id: _Optional[str] = ..., leader_address: _Optional[str] = ..., term: _Optional[int] = ..., previous_term: _Optional[int] = ...) -> None: ...

class NodeJoined(_message.Message):
    __slots__ = ("node_id", "incarnation", "previous_incarnation", "address", "held_tasks")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_INCARNATION_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HELD_TASKS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    incarnation: str
    previous_incarnation: str
    address: str
    held_tasks: int
    def __init__(self, node_id: _Optional[str] = ..., incarnation: _Optional[str] = ..., previous_incarnation: _Optional[str] = ..., address: _Optional[str] = ..., held_tasks: _Optional[int] = ...) -> None: ...

class IdentityConflict(_message.Message):
    __slots__ = ("node_id", "holder_incarnation", "claimant_incarnation", "claimant_address", "holder_heard_ago_ms", "reason")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOLDER_INCARNATION_FIELD_NUMBER: _ClassVar[int]
    CLAIMANT_INCARNATION_FIELD_NUMBER: _ClassVar[int]
    CLAIMANT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HOLDER_HEARD_AGO_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    holder_incarnation: str
    claimant_incarnation: str
    claimant_address: str
    holder_heard_ago_ms: int
    reason: str
    def __init__(self, node_id: _Optional[str] = ..., holder_incarnation: _Optional[str] = ..., claimant_incarnation: _Optional[str] = ..., claimant_address: _Optional[str] = ..., holder_heard_ago_ms: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class NodeSuspected(_message.Message):
    __slots__ = ("node_id", "incarnation", "reason", "last_heartbeat_at_unix_ms", "phi")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    PHI_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    incarnation: str
    reason: SuspicionReason
    last_heartbeat_at_unix_ms: int
    phi: float
    def __init__(self, node_id: _Optional[str] = ..., incarnation: _Optional[str] = ..., reason: _Optional[_Union[SuspicionReason, str]] = ..., last_heartbeat_at_unix_ms: _Optional[int] = ..., phi: _Optional[float] = ...) -> None: ...

class NodeRecovered(_message.Message):
    __slots__ = ("node_id", "incarnation", "previous_state", "unavailable_ms")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_STATE_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_MS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    incarnation: str
    previous_state: NodeState
    unavailable_ms: int
    def __init__(self, node_id: _Optional[str] = ..., incarnation: _Optional[str] = ..., previous_state: _Optional[_Union[NodeState, str]] = ..., unavailable_ms: _Optional[int] = ...) -> None: ...

class NodeDead(_message.Message):
    __slots__ = ("node_id", "incarnation", "last_heartbeat_at_unix_ms", "detection_ms", "tasks_to_move")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    DETECTION_MS_FIELD_NUMBER: _ClassVar[int]
    TASKS_TO_MOVE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    incarnation: str
    last_heartbeat_at_unix_ms: int
    detection_ms: int
    tasks_to_move: int
    def __init__(self, node_id: _Optional[str] = ..., incarnation: _Optional[str] = ..., last_heartbeat_at_unix_ms: _Optional[int] = ..., detection_ms: _Optional[int] = ..., tasks_to_move: _Optional[int] = ...) -> None: ...

class NodeDraining(_message.Message):
    __slots__ = ("node_id", "drain_id", "reason", "tasks_to_move")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DRAIN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TASKS_TO_MOVE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    drain_id: str
    reason: str
    tasks_to_move: int
    def __init__(self, node_id: _Optional[str] = ..., drain_id: _Optional[str] = ..., reason: _Optional[str] = ..., tasks_to_move: _Optional[int] = ...) -> None: ...

class NodeUncordoned(_message.Message):
    __slots__ = ("node_id", "drain_id")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DRAIN_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    drain_id: str
    def __init__(self, node_id: _Optional[str] = ..., drain_id: _Optional[str] = ...) -> None: ...

class NodeLeft(_message.Message):
    __slots__ = ("node_id", "incarnation", "reason", "tasks_to_move")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TASKS_TO_MOVE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    incarnation: str
    reason: str
    tasks_to_move: int
    def __init__(self, node_id: _Optional[str] = ..., incarnation: _Optional[str] = ..., reason: _Optional[str] = ..., tasks_to_move: _Optional[int] = ...) -> None: ...

class MassFailureGuardChanged(_message.Message):
    __slots__ = ("active", "dead_nodes", "total_nodes", "threshold_ratio")
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    DEAD_NODES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NODES_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_RATIO_FIELD_NUMBER: _ClassVar[int]
    active: bool
    dead_nodes: int
    total_nodes: int
    threshold_ratio: float
    def __init__(self, active: _Optional[bool] = ..., dead_nodes: _Optional[int] = ..., total_nodes: _Optional[int] = ..., threshold_ratio: _Optional[float] = ...) -> None: ...

class TaskSubmitted(_message.Message):
    __slots__ = ("task_id", "kind", "request_id")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    kind: str
    request_id: str
    def __init__(self, task_id: _Optional[str] = ..., kind: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class TaskAssigned(_message.Message):
    __slots__ = ("task_id", "node_id", "epoch", "attempt")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    node_id: str
    epoch: int
    attempt: int
    def __init__(self, task_id: _Optional[str] = ..., node_id: _Optional[str] = ..., epoch: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...

class TaskStarted(_message.Message):
    __slots__ = ("task_id", "node_id", "epoch", "attempt", "replayed_journal_events")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_JOURNAL_EVENTS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    node_id: str
    epoch: int
    attempt: int
    replayed_journal_events: int
    def __init__(self, task_id: _Optional[str] = ..., node_id: _Optional[str] = ..., epoch: _Optional[int] = ..., attempt: _Optional[int] = ..., replayed_journal_events: _Optional[int] = ...) -> None: ...

class TaskReassigned(_message.Message):
    __slots__ = ("task_id", "from_node_id", "to_node_id", "epoch", "resume_seq", "resume_covers_journal_seq", "reason", "attempt")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TO_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RESUME_SEQ_FIELD_NUMBER: _ClassVar[int]
    RESUME_COVERS_JOURNAL_SEQ_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    from_node_id: str
    to_node_id: str
    epoch: int
    resume_seq: int
    resume_covers_journal_seq: int
    reason: MoveReason
    attempt: int
    def __init__(self, task_id: _Optional[str] = ..., from_node_id: _Optional[str] = ..., to_node_id: _Optional[str] = ..., epoch: _Optional[int] = ..., resume_seq: _Optional[int] = ..., resume_covers_journal_seq: _Optional[int] = ..., reason: _Optional[_Union[MoveReason, str]] = ..., attempt: _Optional[int] = ...) -> None: ...

class TaskResumed(_message.Message):
    __slots__ = ("task_id", "node_id", "epoch", "resumed_from_seq", "location", "replayed_journal_events", "interruption_ms", "redone_checkpoints", "work_redone_ms")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_JOURNAL_EVENTS_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTION_MS_FIELD_NUMBER: _ClassVar[int]
    REDONE_CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    WORK_REDONE_MS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    node_id: str
    epoch: int
    resumed_from_seq: int
    location: CheckpointLocation
    replayed_journal_events: int
    interruption_ms: int
    redone_checkpoints: int
    work_redone_ms: int
    def __init__(self, task_id: _Optional[str] = ..., node_id: _Optional[str] = ..., epoch: _Optional[int] = ..., resumed_from_seq: _Optional[int] = ..., location: _Optional[_Union[CheckpointLocation, str]] = ..., replayed_journal_events: _Optional[int] = ..., interruption_ms: _Optional[int] = ..., redone_checkpoints: _Optional[int] = ..., work_redone_ms: _Optional[int] = ...) -> None: ...

class TaskCompleted(_message.Message):
    __slots__ = ("task_id", "node_id", "epoch", "attempt", "result_bytes", "total_ms")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RESULT_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    node_id: str
    epoch: int
    attempt: int
    result_bytes: int
    total_ms: int
    def __init__(self, task_id: _Optional[str] = ..., node_id: _Optional[str] = ..., epoch: _Optional[int] = ..., attempt: _Optional[int] = ..., result_bytes: _Optional[int] = ..., total_ms: _Optional[int] = ...) -> None: ...

class TaskFailed(_message.Message):
    __slots__ = ("task_id", "node_id", "epoch", "error", "will_retry")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    WILL_RETRY_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    node_id: str
    epoch: int
    error: TaskError
    will_retry: bool
    def __init__(self, task_id: _Optional[str] = ..., node_id: _Optional[str] = ..., epoch: _Optional[int] = ..., error: _Optional[_Union[TaskError, _Mapping]] = ..., will_retry: _Optional[bool] = ...) -> None: ...

class TaskCancelled(_message.Message):
    __slots__ = ("task_id", "node_id", "reason")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    node_id: str
    reason: str
    def __init__(self, task_id: _Optional[str] = ..., node_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class TaskForked(_message.Message):
    __slots__ = ("task_id", "from_checkpoint_ref", "edits")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_CHECKPOINT_REF_FIELD_NUMBER: _ClassVar[int]
    EDITS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    from_checkpoint_ref: str
    edits: int
    def __init__(self, task_id: _Optional[str] = ..., from_checkpoint_ref: _Optional[str] = ..., edits: _Optional[int] = ...) -> None: ...

class ZombieFenced(_message.Message):
    __slots__ = ("node_id", "incarnation", "task_id", "stale_epoch", "current_epoch", "current_owner_node_id", "source")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STALE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    CURRENT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    CURRENT_OWNER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    incarnation: str
    task_id: str
    stale_epoch: int
    current_epoch: int
    current_owner_node_id: str
    source: FenceSource
    def __init__(self, node_id: _Optional[str] = ..., incarnation: _Optional[str] = ..., task_id: _Optional[str] = ..., stale_epoch: _Optional[int] = ..., current_epoch: _Optional[int] = ..., current_owner_node_id: _Optional[str] = ..., source: _Optional[_Union[FenceSource, str]] = ...) -> None: ...

class ConflictDetected(_message.Message):
    __slots__ = ("fork",)
    FORK_FIELD_NUMBER: _ClassVar[int]
    fork: ForkRecord
    def __init__(self, fork: _Optional[_Union[ForkRecord, _Mapping]] = ...) -> None: ...

class RecoveryCompleted(_message.Message):
    __slots__ = ("node_id", "incarnation", "tasks_recovered", "tasks_failed", "tasks_pending", "detection_ms", "recovery_ms")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    TASKS_RECOVERED_FIELD_NUMBER: _ClassVar[int]
    TASKS_FAILED_FIELD_NUMBER: _ClassVar[int]
    TASKS_PENDING_FIELD_NUMBER: _ClassVar[int]
    DETECTION_MS_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_MS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    incarnation: str
    tasks_recovered: int
    tasks_failed: int
    tasks_pending: int
    detection_ms: int
    recovery_ms: int
    def __init__(self, node_id: _Optional[str] = ..., incarnation: _Optional[str] = ..., tasks_recovered: _Optional[int] = ..., tasks_failed: _Optional[int] = ..., tasks_pending: _Optional[int] = ..., detection_ms: _Optional[int] = ..., recovery_ms: _Optional[int] = ...) -> None: ...

class ReconcileStarted(_message.Message):
    __slots__ = ("session_id", "trigger", "node_ids", "doc_ids")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    DOC_IDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    trigger: ReconcileTrigger
    node_ids: _containers.RepeatedScalarFieldContainer[str]
    doc_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_id: _Optional[str] = ..., trigger: _Optional[_Union[ReconcileTrigger, str]] = ..., node_ids: _Optional[_Iterable[str]] = ..., doc_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ReconcileCompleted(_message.Message):
    __slots__ = ("session_id", "trigger", "node_ids", "documents", "deltas", "conflicts", "conflict_details", "duration_ms", "converged")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    DELTAS_FIELD_NUMBER: _ClassVar[int]
    CONFLICTS_FIELD_NUMBER: _ClassVar[int]
    CONFLICT_DETAILS_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    CONVERGED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    trigger: ReconcileTrigger
    node_ids: _containers.RepeatedScalarFieldContainer[str]
    documents: int
    deltas: int
    conflicts: int
    conflict_details: _containers.RepeatedCompositeFieldContainer[ReconcileConflict]
    duration_ms: int
    converged: bool
    def __init__(self, session_id: _Optional[str] = ..., trigger: _Optional[_Union[ReconcileTrigger, str]] = ..., node_ids: _Optional[_Iterable[str]] = ..., documents: _Optional[int] = ..., deltas: _Optional[int] = ..., conflicts: _Optional[int] = ..., conflict_details: _Optional[_Iterable[_Union[ReconcileConflict, _Mapping]]] = ..., duration_ms: _Optional[int] = ..., converged: _Optional[bool] = ...) -> None: ...

class QuarantinedRecord(_message.Message):
    __slots__ = ("collection", "name", "reason", "value", "quarantined_at_unix_ms", "term")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    collection: str
    name: str
    reason: str
    value: bytes
    quarantined_at_unix_ms: int
    term: int
    def __init__(self, collection: _Optional[str] = ..., name: _Optional[str] = ..., reason: _Optional[str] = ..., value: _Optional[bytes] = ..., quarantined_at_unix_ms: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

class RecordQuarantined(_message.Message):
    __slots__ = ("collection", "name", "reason")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    collection: str
    name: str
    reason: str
    def __init__(self, collection: _Optional[str] = ..., name: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...
