"""Round trips between core values and the wire / etcd messages (coordinator.convert)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator import convert
from coordinator.core import directives as d
from coordinator.core import events as ev
from coordinator.core import notices as n
from coordinator.core.commands import EmitEvent
from coordinator.core.records import (
    AssignReason,
    CheckpointDurability,
    CheckpointSummary,
    FenceSource,
    HeldTask,
    HeldTaskStatus,
    MoveReason,
    NodeLoad,
    NodeRecord,
    NodeState,
    RevokeReason,
    StateModel,
    SuspicionReason,
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

U32 = 2**32 - 1
U63 = 2**63 - 1
MS_MAX = 10**13  # year 2286 in Unix ms

text = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=12)
ids = st.text(alphabet="abcdefgh-0123456789", min_size=1, max_size=10)
u32 = st.integers(0, U32)
u64 = st.integers(0, U63)
ms_s = st.integers(1, MS_MAX).map(lambda ms: ms / 1000.0)
opt_s = st.none() | ms_s
labels = st.dictionaries(ids, text, max_size=3).map(as_labels)


def enum_of(kind: Any) -> st.SearchStrategy[Any]:
    return st.sampled_from(list(kind))


checkpoints = st.builds(
    CheckpointSummary,
    checkpoint_ref=text,
    epoch=u64,
    seq=u64,
    covers_journal_seq=u64,
    replicated=st.booleans(),
    terminal=st.booleans(),
    task_id=text,
    label=text,
    created_at_unix_ms=st.integers(0, MS_MAX),
    stored_bytes=u64,
    node_id=text,
    parent_ref=text,
)
specs = st.builds(
    TaskSpec,
    kind=text,
    payload=st.binary(max_size=16),
    content_type=text,
    labels=labels,
    node_selector=labels,
    slots=u32,
    priority=st.integers(-(2**31), 2**31 - 1),
    max_attempts=u32,
    deadline_s=opt_s,
    durability=enum_of(CheckpointDurability),
    state_model=enum_of(StateModel),
    checkpoint_interval_ms=u64,
)
errors = st.builds(
    TaskError,
    code=enum_of(TaskErrorCode),
    message=text,
    retryable=st.booleans(),
    exception_type=text,
    traceback=text,
    node_id=text,
    epoch=u64,
    attempt=u32,
    occurred_at_unix_ms=st.integers(0, MS_MAX),
)
results = st.builds(
    TaskResult,
    payload=st.binary(max_size=16),
    content_type=text,
    size_bytes=u64,
    redis_key=text,
    crc32=u32,
)
moves = st.builds(
    TaskMove,
    move_id=text,
    reason=enum_of(MoveReason),
    requested_at_s=ms_s,
    release_deadline_s=ms_s,
    target_node_id=text,
)
node_records = st.builds(
    NodeRecord,
    node_id=ids,
    incarnation=text,
    state=enum_of(NodeState),
    address=text,
    capacity_slots=u32,
    capacity_cpu_millicores=u32,
    capacity_memory_bytes=u64,
    labels=labels,
    kinds=st.lists(text, max_size=3).map(tuple),
    cordoned=st.booleans(),
    drain_id=text,
    drain_reason=text,
    registered_at_s=opt_s,
    incarnation_started_at_s=opt_s,
    state_changed_at_s=opt_s,
    last_heartbeat_at_s=opt_s,
    agent_version=text,
    written_term=u64,
)
task_records = st.builds(
    TaskRecord,
    task_id=ids,
    request_id=text,
    spec=specs,
    state=enum_of(TaskState),
    epoch=u64,
    attempt=u32,
    owner_node_id=text,
    owner_incarnation=text,
    submitted_at_s=opt_s,
    assigned_at_s=opt_s,
    started_at_s=opt_s,
    finished_at_s=opt_s,
    updated_at_s=opt_s,
    last_checkpoint=st.none() | checkpoints,
    last_replicated_checkpoint=st.none() | checkpoints,
    last_replicated_journal_seq=u64,
    result=st.none() | results,
    last_error=st.none() | errors,
    move=st.none() | moves,
    cancel_reason=text,
    forked_from_ref=text,
    fork_count=u32,
    previous_owner_node_ids=st.lists(ids, max_size=3).map(tuple),
    written_term=u64,
)
ms_dur = st.integers(0, 10**9).map(lambda ms: ms / 1000.0)
directives = st.one_of(
    st.builds(
        d.Welcome,
        term=u64,
        heartbeat_interval_s=ms_dur,
        fence_after_s=ms_dur,
        dead_after_s=ms_dur,
        node_state=enum_of(NodeState),
        hello_seq=u64,
    ),
    st.builds(d.HeartbeatAck, seq=u64, term=u64, node_state=enum_of(NodeState)),
    st.builds(
        d.Assign,
        task_id=ids,
        epoch=u64,
        attempt=u32,
        spec=specs,
        reason=enum_of(AssignReason),
        resume_from=st.none() | checkpoints,
        replay_through_journal_seq=u64,
        move_reason=st.none() | enum_of(MoveReason),
        previous_owner_node_id=text,
    ),
    st.builds(
        d.Revoke,
        task_id=ids,
        epoch=u64,
        current_epoch=u64,
        reason=enum_of(RevokeReason),
        current_owner_node_id=text,
        message=text,
    ),
    st.builds(
        d.Release,
        move_id=text,
        task_id=ids,
        epoch=u64,
        reason=enum_of(MoveReason),
        release_timeout_s=ms_dur,
        target_node_id=text,
    ),
    st.builds(d.Drain, drain_id=text, reason=text, cancelled=st.booleans()),
    st.builds(
        d.TaskUpdateAck,
        update_seq=u64,
        task_id=ids,
        epoch=u64,
        outcome=enum_of(UpdateOutcome),
        current_epoch=u64,
        message=text,
    ),
)


@settings(max_examples=200, deadline=None)
@given(node_records)
def test_node_record_round_trips_through_bytes(record: NodeRecord) -> None:
    data = convert.node_record_to_pb(record).SerializeToString()
    assert convert.node_record_from_pb(records_pb2.NodeRecord.FromString(data)) == record


@settings(max_examples=200, deadline=None)
@given(task_records)
def test_task_record_round_trips_through_bytes(record: TaskRecord) -> None:
    data = convert.task_record_to_pb(record).SerializeToString()
    assert convert.task_record_from_pb(records_pb2.TaskRecord.FromString(data)) == record


@settings(max_examples=100, deadline=None)
@given(task_records)
def test_task_record_pb_round_trips(record: TaskRecord) -> None:
    msg = convert.task_record_to_pb(record)
    assert convert.task_record_to_pb(convert.task_record_from_pb(msg)) == msg


@settings(max_examples=200, deadline=None)
@given(directives)
def test_directive_round_trips(directive: d.Directive) -> None:
    msg = convert.directive_to_pb(directive, now_s=1_700_000_000.5)
    data = msg.SerializeToString()
    back = convert.directive_from_pb(agent_pb2.CoordinatorMessage.FromString(data))
    assert back == directive


def test_enum_numbers_match_proto() -> None:
    assert NodeState.DEAD.value == records_pb2.NODE_STATE_DEAD
    assert TaskState.CANCELLED.value == records_pb2.TASK_STATE_CANCELLED
    assert RevokeReason.RELEASE_TIMEOUT.value == agent_pb2.REVOKE_REASON_RELEASE_TIMEOUT
    assert UpdateOutcome.REJECTED.value == agent_pb2.UPDATE_OUTCOME_REJECTED


def test_times_none_is_zero_and_ms_round_trip() -> None:
    assert convert.s_to_ms(None) == 0
    assert convert.ms_to_s(0) is None
    for ms in (1, 999, 1_700_000_000_123):
        assert convert.s_to_ms(convert.ms_to_s(ms)) == ms


def test_unspecified_enums_read_as_documented_defaults() -> None:
    node = convert.node_record_from_pb(records_pb2.NodeRecord(node_id="n"))
    assert node.state is NodeState.SUSPECT
    task = convert.task_record_from_pb(records_pb2.TaskRecord(task_id="t"))
    assert task.state is TaskState.PENDING
    assert task.last_checkpoint is None
    assert task.result is None
    assert task.move is None


def test_hello_to_event() -> None:
    hello = agent_pb2.Hello(
        node_id="n1",
        incarnation="i1",
        address="127.0.0.1:1",
        capacity=records_pb2.NodeCapacity(slots=4, cpu_millicores=2000, memory_bytes=1 << 30),
        labels={"zone": "b", "arch": "x"},
        held_tasks=[
            agent_pb2.HeldTask(
                task_id="t1",
                epoch=3,
                status=agent_pb2.HELD_TASK_STATUS_PAUSED,
                checkpoint=records_pb2.CheckpointSummary(seq=7),
                replicated_checkpoint_seq=5,
            ),
            agent_pb2.HeldTask(task_id="t2", epoch=1),
        ],
        agent_version="0.1",
        kinds=["a", "b"],
        hello_seq=4,
    )
    event = convert.hello_to_event("s1", hello, 10.0)
    assert event == ev.SessionOpened(
        session_id="s1",
        node_id="n1",
        incarnation="i1",
        now_s=10.0,
        address="127.0.0.1:1",
        capacity_slots=4,
        capacity_cpu_millicores=2000,
        capacity_memory_bytes=1 << 30,
        labels=(("arch", "x"), ("zone", "b")),
        kinds=("a", "b"),
        held_tasks=(
            HeldTask("t1", 3, HeldTaskStatus.PAUSED, checkpoint_seq=7, replicated_checkpoint_seq=5),
            HeldTask("t2", 1, HeldTaskStatus.RUNNING),
        ),
        agent_version="0.1",
        hello_seq=4,
    )


def test_heartbeat_to_event() -> None:
    hb = agent_pb2.Heartbeat(
        seq=9,
        tasks=[agent_pb2.TaskProgress(task_id="t", epoch=2, checkpoint_seq=4)],
        load=records_pb2.NodeLoad(running_tasks=1, used_slots=2),
    )
    event = convert.heartbeat_to_event("s", "n", hb, 3.5)
    assert event == ev.HeartbeatReceived(
        session_id="s",
        node_id="n",
        seq=9,
        now_s=3.5,
        load=NodeLoad(running_tasks=1, used_slots=2),
        tasks=(TaskProgress("t", 2, checkpoint_seq=4),),
    )


@pytest.mark.parametrize(
    ("update", "change"),
    [
        (agent_pb2.TaskUpdate(started=agent_pb2.TaskUpdate.Started()), ev.Started()),
        (
            agent_pb2.TaskUpdate(
                checkpointed=agent_pb2.TaskUpdate.Checkpointed(
                    checkpoint=records_pb2.CheckpointSummary(checkpoint_ref="c", seq=2),
                    journal_seq=5,
                )
            ),
            ev.Checkpointed(CheckpointSummary("c", 0, 2), journal_seq=5),
        ),
        (
            agent_pb2.TaskUpdate(
                completed=agent_pb2.TaskUpdate.Completed(
                    result=records_pb2.TaskResult(payload=b"x", size_bytes=1)
                )
            ),
            ev.Completed(TaskResult(payload=b"x", size_bytes=1)),
        ),
        (
            agent_pb2.TaskUpdate(
                failed=agent_pb2.TaskUpdate.Failed(
                    error=records_pb2.TaskError(
                        code=records_pb2.TASK_ERROR_CODE_HANDLER_ERROR, retryable=True
                    )
                )
            ),
            ev.Failed(TaskError(TaskErrorCode.HANDLER_ERROR, retryable=True)),
        ),
        (
            agent_pb2.TaskUpdate(released=agent_pb2.TaskUpdate.Released(move_id="m")),
            ev.Released(move_id="m"),
        ),
    ],
)
def test_task_update_to_event(update: agent_pb2.TaskUpdate, change: ev.TaskChange) -> None:
    update.update_seq = 1
    update.task_id = "t"
    update.epoch = 4
    event = convert.task_update_to_event("s", "n", update, 1.0)
    assert event == ev.TaskUpdateReceived("s", "n", 1, "t", 4, change, 1.0)


def test_task_update_without_change_is_refused() -> None:
    with pytest.raises(convert.UnknownChange, match="change"):
        convert.task_update_to_event("s", "n", agent_pb2.TaskUpdate(task_id="t"), 1.0)


NOTICES: list[n.Notice] = [
    n.NodeJoined("n", "i", held_tasks=2),
    n.NodeSuspected("n", "i", SuspicionReason.STREAM_CLOSED, 1.5),
    n.NodeRecovered("n", "i", NodeState.SUSPECT, 0.25),
    n.NodeDead("n", "i", 1.0, 3.0, 2),
    n.NodeDraining("n", "d", "r", 1),
    n.NodeUncordoned("n", "d"),
    n.NodeLeft("n", "i", "bye", 0),
    n.MassFailureGuardChanged(True, 3, 4, 0.5),
    n.TaskSubmitted("t", "k", "r"),
    n.TaskAssigned("t", "n", 1, 1),
    n.TaskReassigned("t", "a", "b", 2, 2, MoveReason.NODE_DEAD),
    n.TaskStarted("t", "n", 1, 1),
    n.TaskResumed("t", "n", 2, 5),
    n.TaskCompleted("t", "n", 1, 1, 10, 2.5),
    n.TaskFailed("t", "n", 1, TaskError(TaskErrorCode.INTERNAL), False),
    n.TaskCancelled("t", "n", "why"),
    n.ZombieFenced("n", "i", "t", 1, 2, "m", FenceSource.HELLO),
]


@pytest.mark.parametrize("notice", NOTICES, ids=lambda x: type(x).__name__)
def test_notice_to_pb_sets_the_matching_body(notice: n.Notice) -> None:
    msg = convert.notice_to_pb(EmitEvent(term=7, occurred_at_s=12.345, body=notice))
    expected = re.sub(r"(?<!^)(?=[A-Z])", "_", type(notice).__name__).lower()
    if expected == "mass_failure_guard_changed":
        expected = "mass_failure_guard"
    assert msg.WhichOneof("body") == expected
    assert msg.term == 7
    assert msg.occurred_at_unix_ms == 12345
    assert records_pb2.Event.FromString(msg.SerializeToString()) == msg
