"""Pure coordinator core: events in, commands out. No IO, no clocks, no global randomness.

Theory of operation: ``CoordinatorCore`` is the leader's whole decision logic
as a sans-IO state machine (h11, etcd-io/raft). The shell feeds it events
(``events``: Session messages, orchestrator requests, leadership changes, and
``Tick`` every ``CoreSettings.tick_interval_s``) and runs the commands it
returns (``commands``: persist records in leader-fenced etcd transactions of at
most ``MAX_TXN_OPS`` puts, emit cluster events, send directives, answer
requests, close Sessions) in order: persist before send.

Modules, one concept each:

- ``records``: node and task records and their enums (twins of records.proto);
- ``events`` / ``commands`` / ``directives`` / ``notices``: the vocabulary;
- ``detector``: fixed-timeout and phi accrual failure detectors;
- ``membership``: the node state table (ALIVE, SUSPECT, DEAD, DRAINING, LEFT);
- ``guard``: the mass-failure guard;
- ``tasks``: the task table and its lifecycle table;
- ``placement``: choosing nodes for PENDING tasks;
- ``core``: ``CoordinatorCore``, which ties them together;
- ``sim``: a seeded simulator of a fleet around one core, with invariant checks.
"""

from coordinator.core.commands import (
    MAX_TXN_OPS,
    CloseSession,
    Command,
    EmitEvent,
    PersistNodes,
    PersistTasks,
    ReplyToRequest,
    RetireRecords,
    SeedFork,
    SendDirective,
    StatusCode,
    StepDown,
    batched,
    check_command_order,
)
from coordinator.core.core import CoordinatorCore, CoreSnapshot, NodeView, Role
from coordinator.core.detector import (
    FailureDetector,
    FixedTimeoutDetector,
    Liveness,
    PhiAccrualDetector,
    Verdict,
    make_detector,
)
from coordinator.core.directives import (
    Assign,
    Directive,
    Drain,
    HeartbeatAck,
    Release,
    Revoke,
    TaskUpdateAck,
    Welcome,
)
from coordinator.core.errors import CoreError, InvariantViolation, UsageError
from coordinator.core.events import (
    CancelRequested,
    Checkpointed,
    Completed,
    DrainRequested,
    Event,
    Failed,
    ForkSeeded,
    GoodbyeReceived,
    HeartbeatDigest,
    HeartbeatReceived,
    LeadershipAcquired,
    LeadershipLost,
    LineageReported,
    MigrateRequested,
    PersistFailed,
    Released,
    ResignRequested,
    SessionClosed,
    SessionOpened,
    Started,
    TaskChange,
    TaskSubmitted,
    TaskUpdateReceived,
    Tick,
    UncordonRequested,
)
from coordinator.core.records import (
    AssignReason,
    CheckpointSummary,
    HeldTask,
    HeldTaskStatus,
    Labels,
    MoveReason,
    NodeLoad,
    NodeRecord,
    NodeState,
    RevokeReason,
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
from coordinator.core.settings import CoreSettings, DetectorKind

__all__ = [
    "MAX_TXN_OPS",
    "Assign",
    "AssignReason",
    "CancelRequested",
    "CheckpointSummary",
    "Checkpointed",
    "CloseSession",
    "Command",
    "Completed",
    "CoordinatorCore",
    "CoreError",
    "CoreSettings",
    "CoreSnapshot",
    "DetectorKind",
    "Directive",
    "Drain",
    "DrainRequested",
    "EmitEvent",
    "Event",
    "Failed",
    "FailureDetector",
    "FixedTimeoutDetector",
    "ForkSeeded",
    "GoodbyeReceived",
    "HeartbeatAck",
    "HeartbeatDigest",
    "HeartbeatReceived",
    "HeldTask",
    "HeldTaskStatus",
    "InvariantViolation",
    "Labels",
    "LeadershipAcquired",
    "LeadershipLost",
    "LineageReported",
    "Liveness",
    "MigrateRequested",
    "MoveReason",
    "NodeLoad",
    "NodeRecord",
    "NodeState",
    "NodeView",
    "PersistFailed",
    "PersistNodes",
    "PersistTasks",
    "PhiAccrualDetector",
    "Release",
    "Released",
    "ReplyToRequest",
    "ResignRequested",
    "RetireRecords",
    "Revoke",
    "RevokeReason",
    "Role",
    "SeedFork",
    "SendDirective",
    "SessionClosed",
    "SessionOpened",
    "Started",
    "StatusCode",
    "StepDown",
    "TaskChange",
    "TaskError",
    "TaskErrorCode",
    "TaskMove",
    "TaskProgress",
    "TaskRecord",
    "TaskResult",
    "TaskSpec",
    "TaskState",
    "TaskSubmitted",
    "TaskUpdateAck",
    "TaskUpdateReceived",
    "Tick",
    "UncordonRequested",
    "UpdateOutcome",
    "UsageError",
    "Verdict",
    "Welcome",
    "as_labels",
    "batched",
    "check_command_order",
    "make_detector",
]
