"""The node agent's decisions, sans-IO (DESIGN.md §2), as ``coordinator.core`` is the leader's.

- ``core``: ``AgentCore``, the Session and task state machine (self-fence,
  directives, updates), its commands and ``TaskMeta``;
- ``records``: the plain records it reads and writes (``node_agent.convert``
  turns them into protobuf at the edge);
- ``restore``: where a task resumes from (local store vs Redis), and when
  resuming would lose acknowledged work;
- ``redisloss``: the rules for a Redis that lost data;
- ``spooled``: which spooled checkpoints the agent still ships to Redis when
  worker processes write them there themselves;
- ``history``: when and how far the local store's history of a running task is
  pruned (``--keep-checkpoints``).

Nothing here reads a clock, a socket, a file or a random source; the shared
purity test (``tests/unit/test_core_purity.py``) checks every module.
"""

from .core import (
    PROTOCOL_VERSION,
    AgentCore,
    CloseSession,
    Command,
    ForgetTask,
    Notice,
    Ownership,
    PersistMeta,
    PersistMetas,
    ReportLineage,
    Send,
    SessionState,
    SlotState,
    StartTask,
    StopReason,
    StopTask,
    TaskMeta,
    check_command_order,
    ready_batch,
)

__all__ = [
    "PROTOCOL_VERSION",
    "AgentCore",
    "CloseSession",
    "Command",
    "ForgetTask",
    "Notice",
    "Ownership",
    "PersistMeta",
    "PersistMetas",
    "ReportLineage",
    "Send",
    "SessionState",
    "SlotState",
    "StartTask",
    "StopReason",
    "StopTask",
    "TaskMeta",
    "check_command_order",
    "ready_batch",
]
