from lazarus.v1 import records_pb2 as _records_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubmitTaskRequest(_message.Message):
    __slots__ = ("request_id", "spec", "task_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    spec: _records_pb2.TaskSpec
    task_id: str
    def __init__(self, request_id: _Optional[str] = ..., spec: _Optional[_Union[_records_pb2.TaskSpec, _Mapping]] = ..., task_id: _Optional[str] = ...) -> None: ...

class SubmitTaskResponse(_message.Message):
    __slots__ = ("task", "created")
    TASK_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    task: _records_pb2.TaskRecord
    created: bool
    def __init__(self, task: _Optional[_Union[_records_pb2.TaskRecord, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class GetTaskResponse(_message.Message):
    __slots__ = ("task", "forks", "read_revision")
    TASK_FIELD_NUMBER: _ClassVar[int]
    FORKS_FIELD_NUMBER: _ClassVar[int]
    READ_REVISION_FIELD_NUMBER: _ClassVar[int]
    task: _records_pb2.TaskRecord
    forks: _containers.RepeatedCompositeFieldContainer[_records_pb2.ForkRecord]
    read_revision: int
    def __init__(self, task: _Optional[_Union[_records_pb2.TaskRecord, _Mapping]] = ..., forks: _Optional[_Iterable[_Union[_records_pb2.ForkRecord, _Mapping]]] = ..., read_revision: _Optional[int] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ("states", "node_id", "kind", "labels", "page_size", "page_token")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATES_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[_records_pb2.TaskState]
    node_id: str
    kind: str
    labels: _containers.ScalarMap[str, str]
    page_size: int
    page_token: str
    def __init__(self, states: _Optional[_Iterable[_Union[_records_pb2.TaskState, str]]] = ..., node_id: _Optional[str] = ..., kind: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListTasksResponse(_message.Message):
    __slots__ = ("tasks", "next_page_token", "read_revision")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    READ_REVISION_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[_records_pb2.TaskRecord]
    next_page_token: str
    read_revision: int
    def __init__(self, tasks: _Optional[_Iterable[_Union[_records_pb2.TaskRecord, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., read_revision: _Optional[int] = ...) -> None: ...

class CancelTaskRequest(_message.Message):
    __slots__ = ("task_id", "reason")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    reason: str
    def __init__(self, task_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelTaskResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: _records_pb2.TaskRecord
    def __init__(self, task: _Optional[_Union[_records_pb2.TaskRecord, _Mapping]] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ("states", "labels", "page_size", "page_token")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[_records_pb2.NodeState]
    labels: _containers.ScalarMap[str, str]
    page_size: int
    page_token: str
    def __init__(self, states: _Optional[_Iterable[_Union[_records_pb2.NodeState, str]]] = ..., labels: _Optional[_Mapping[str, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class NodeLiveness(_message.Message):
    __slots__ = ("connected", "last_heartbeat_at_unix_ms", "heartbeat_interarrival_ms", "phi", "load", "assigned_tasks", "session_replica")
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERARRIVAL_MS_FIELD_NUMBER: _ClassVar[int]
    PHI_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_TASKS_FIELD_NUMBER: _ClassVar[int]
    SESSION_REPLICA_FIELD_NUMBER: _ClassVar[int]
    connected: bool
    last_heartbeat_at_unix_ms: int
    heartbeat_interarrival_ms: float
    phi: float
    load: _records_pb2.NodeLoad
    assigned_tasks: int
    session_replica: str
    def __init__(self, connected: _Optional[bool] = ..., last_heartbeat_at_unix_ms: _Optional[int] = ..., heartbeat_interarrival_ms: _Optional[float] = ..., phi: _Optional[float] = ..., load: _Optional[_Union[_records_pb2.NodeLoad, _Mapping]] = ..., assigned_tasks: _Optional[int] = ..., session_replica: _Optional[str] = ...) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("record", "liveness")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_FIELD_NUMBER: _ClassVar[int]
    record: _records_pb2.NodeRecord
    liveness: NodeLiveness
    def __init__(self, record: _Optional[_Union[_records_pb2.NodeRecord, _Mapping]] = ..., liveness: _Optional[_Union[NodeLiveness, _Mapping]] = ...) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes", "next_page_token", "read_revision")
    NODES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    READ_REVISION_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    next_page_token: str
    read_revision: int
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., read_revision: _Optional[int] = ...) -> None: ...

class DrainNodeRequest(_message.Message):
    __slots__ = ("node_id", "reason", "release_timeout_ms")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RELEASE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    reason: str
    release_timeout_ms: int
    def __init__(self, node_id: _Optional[str] = ..., reason: _Optional[str] = ..., release_timeout_ms: _Optional[int] = ...) -> None: ...

class DrainNodeResponse(_message.Message):
    __slots__ = ("node", "drain_id", "tasks_to_move")
    NODE_FIELD_NUMBER: _ClassVar[int]
    DRAIN_ID_FIELD_NUMBER: _ClassVar[int]
    TASKS_TO_MOVE_FIELD_NUMBER: _ClassVar[int]
    node: _records_pb2.NodeRecord
    drain_id: str
    tasks_to_move: int
    def __init__(self, node: _Optional[_Union[_records_pb2.NodeRecord, _Mapping]] = ..., drain_id: _Optional[str] = ..., tasks_to_move: _Optional[int] = ...) -> None: ...

class UncordonNodeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class UncordonNodeResponse(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: _records_pb2.NodeRecord
    def __init__(self, node: _Optional[_Union[_records_pb2.NodeRecord, _Mapping]] = ...) -> None: ...

class MigrateTaskRequest(_message.Message):
    __slots__ = ("task_id", "target_node_id", "expected_epoch", "reason", "release_timeout_ms")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RELEASE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    target_node_id: str
    expected_epoch: int
    reason: str
    release_timeout_ms: int
    def __init__(self, task_id: _Optional[str] = ..., target_node_id: _Optional[str] = ..., expected_epoch: _Optional[int] = ..., reason: _Optional[str] = ..., release_timeout_ms: _Optional[int] = ...) -> None: ...

class MigrateTaskResponse(_message.Message):
    __slots__ = ("task", "move_id")
    TASK_FIELD_NUMBER: _ClassVar[int]
    MOVE_ID_FIELD_NUMBER: _ClassVar[int]
    task: _records_pb2.TaskRecord
    move_id: str
    def __init__(self, task: _Optional[_Union[_records_pb2.TaskRecord, _Mapping]] = ..., move_id: _Optional[str] = ...) -> None: ...

class GetClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeStateCount(_message.Message):
    __slots__ = ("state", "count")
    STATE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    state: _records_pb2.NodeState
    count: int
    def __init__(self, state: _Optional[_Union[_records_pb2.NodeState, str]] = ..., count: _Optional[int] = ...) -> None: ...

class TaskStateCount(_message.Message):
    __slots__ = ("state", "count")
    STATE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    state: _records_pb2.TaskState
    count: int
    def __init__(self, state: _Optional[_Union[_records_pb2.TaskState, str]] = ..., count: _Optional[int] = ...) -> None: ...

class GetClusterStatusResponse(_message.Message):
    __slots__ = ("cluster_name", "leader_id", "leader_address", "term", "members", "serving_member_id", "nodes_by_state", "tasks_by_state", "mass_failure_guard_active", "read_revision", "now_unix_ms", "sessions_by_replica", "quarantined")
    class SessionsByReplicaEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    SERVING_MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    NODES_BY_STATE_FIELD_NUMBER: _ClassVar[int]
    TASKS_BY_STATE_FIELD_NUMBER: _ClassVar[int]
    MASS_FAILURE_GUARD_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    READ_REVISION_FIELD_NUMBER: _ClassVar[int]
    NOW_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_BY_REPLICA_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_FIELD_NUMBER: _ClassVar[int]
    cluster_name: str
    leader_id: str
    leader_address: str
    term: int
    members: _containers.RepeatedCompositeFieldContainer[_records_pb2.MemberRecord]
    serving_member_id: str
    nodes_by_state: _containers.RepeatedCompositeFieldContainer[NodeStateCount]
    tasks_by_state: _containers.RepeatedCompositeFieldContainer[TaskStateCount]
    mass_failure_guard_active: bool
    read_revision: int
    now_unix_ms: int
    sessions_by_replica: _containers.ScalarMap[str, int]
    quarantined: _containers.RepeatedCompositeFieldContainer[_records_pb2.QuarantinedRecord]
    def __init__(self, cluster_name: _Optional[str] = ..., leader_id: _Optional[str] = ..., leader_address: _Optional[str] = ..., term: _Optional[int] = ..., members: _Optional[_Iterable[_Union[_records_pb2.MemberRecord, _Mapping]]] = ..., serving_member_id: _Optional[str] = ..., nodes_by_state: _Optional[_Iterable[_Union[NodeStateCount, _Mapping]]] = ..., tasks_by_state: _Optional[_Iterable[_Union[TaskStateCount, _Mapping]]] = ..., mass_failure_guard_active: _Optional[bool] = ..., read_revision: _Optional[int] = ..., now_unix_ms: _Optional[int] = ..., sessions_by_replica: _Optional[_Mapping[str, int]] = ..., quarantined: _Optional[_Iterable[_Union[_records_pb2.QuarantinedRecord, _Mapping]]] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("from_revision", "types", "task_id", "node_id", "progress_interval_ms")
    FROM_REVISION_FIELD_NUMBER: _ClassVar[int]
    TYPES_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    from_revision: int
    types: _containers.RepeatedScalarFieldContainer[_records_pb2.EventType]
    task_id: str
    node_id: str
    progress_interval_ms: int
    def __init__(self, from_revision: _Optional[int] = ..., types: _Optional[_Iterable[_Union[_records_pb2.EventType, str]]] = ..., task_id: _Optional[str] = ..., node_id: _Optional[str] = ..., progress_interval_ms: _Optional[int] = ...) -> None: ...

class WatchEventsResponse(_message.Message):
    __slots__ = ("events", "revision")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[_records_pb2.Event]
    revision: int
    def __init__(self, events: _Optional[_Iterable[_Union[_records_pb2.Event, _Mapping]]] = ..., revision: _Optional[int] = ...) -> None: ...

class GetCheckpointRequest(_message.Message):
    __slots__ = ("task_id", "seq", "checkpoint_ref", "at_or_before_journal_seq", "omit_payload", "include_journal", "max_journal_events")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_REF_FIELD_NUMBER: _ClassVar[int]
    AT_OR_BEFORE_JOURNAL_SEQ_FIELD_NUMBER: _ClassVar[int]
    OMIT_PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_JOURNAL_FIELD_NUMBER: _ClassVar[int]
    MAX_JOURNAL_EVENTS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    seq: int
    checkpoint_ref: str
    at_or_before_journal_seq: int
    omit_payload: bool
    include_journal: bool
    max_journal_events: int
    def __init__(self, task_id: _Optional[str] = ..., seq: _Optional[int] = ..., checkpoint_ref: _Optional[str] = ..., at_or_before_journal_seq: _Optional[int] = ..., omit_payload: _Optional[bool] = ..., include_journal: _Optional[bool] = ..., max_journal_events: _Optional[int] = ...) -> None: ...

class GetCheckpointResponse(_message.Message):
    __slots__ = ("checkpoint", "location", "journal_events", "journal_truncated")
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_EVENTS_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    checkpoint: _records_pb2.CheckpointRecord
    location: _records_pb2.CheckpointLocation
    journal_events: _containers.RepeatedCompositeFieldContainer[_records_pb2.JournalEventRecord]
    journal_truncated: bool
    def __init__(self, checkpoint: _Optional[_Union[_records_pb2.CheckpointRecord, _Mapping]] = ..., location: _Optional[_Union[_records_pb2.CheckpointLocation, str]] = ..., journal_events: _Optional[_Iterable[_Union[_records_pb2.JournalEventRecord, _Mapping]]] = ..., journal_truncated: _Optional[bool] = ...) -> None: ...

class ForkTaskRequest(_message.Message):
    __slots__ = ("request_id", "from_checkpoint_ref", "edits", "spec", "new_task_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_CHECKPOINT_REF_FIELD_NUMBER: _ClassVar[int]
    EDITS_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    NEW_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    from_checkpoint_ref: str
    edits: _containers.RepeatedCompositeFieldContainer[_records_pb2.StateEdit]
    spec: _records_pb2.TaskSpec
    new_task_id: str
    def __init__(self, request_id: _Optional[str] = ..., from_checkpoint_ref: _Optional[str] = ..., edits: _Optional[_Iterable[_Union[_records_pb2.StateEdit, _Mapping]]] = ..., spec: _Optional[_Union[_records_pb2.TaskSpec, _Mapping]] = ..., new_task_id: _Optional[str] = ...) -> None: ...

class ForkTaskResponse(_message.Message):
    __slots__ = ("task_id", "task", "checkpoint", "created")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    task: _records_pb2.TaskRecord
    checkpoint: _records_pb2.CheckpointSummary
    created: bool
    def __init__(self, task_id: _Optional[str] = ..., task: _Optional[_Union[_records_pb2.TaskRecord, _Mapping]] = ..., checkpoint: _Optional[_Union[_records_pb2.CheckpointSummary, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...
