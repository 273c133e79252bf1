"""CoordinatorCore: Sessions and bad input, leadership, drains, batching and ordering."""

from __future__ import annotations

from dataclasses import replace

import pytest
from core_harness import (
    Harness,
    directives,
    notices_of,
    of_type,
    persisted_nodes,
    persisted_tasks,
    sent,
)

from coordinator.core import (
    MAX_TXN_OPS,
    Assign,
    AssignReason,
    CloseSession,
    CoreSettings,
    Drain,
    DrainRequested,
    EmitEvent,
    GoodbyeReceived,
    HeartbeatAck,
    HeldTask,
    HeldTaskStatus,
    InvariantViolation,
    LeadershipLost,
    MoveReason,
    NodeRecord,
    NodeState,
    PersistFailed,
    PersistNodes,
    PersistTasks,
    Release,
    Released,
    ReplyToRequest,
    Revoke,
    RevokeReason,
    Role,
    SendDirective,
    SessionOpened,
    StatusCode,
    StepDown,
    TaskProgress,
    TaskRecord,
    TaskSpec,
    TaskState,
    UncordonRequested,
    UsageError,
    Welcome,
    batched,
    check_command_order,
)
from coordinator.core import notices as n

# -- Sessions and bad input -----------------------------------------------------------------------


def test_hello_is_answered_with_welcome_after_the_node_is_persisted() -> None:
    h = Harness()
    h.lead(term=9)
    commands = h.hello("a", slots=3)
    assert isinstance(commands[0], PersistNodes)
    record = commands[0].records[0]
    assert (record.node_id, record.state, record.capacity_slots, record.written_term) == (
        "a",
        NodeState.ALIVE,
        3,
        9,
    )
    assert directives(commands, Welcome) == [Welcome(9, 0.5, 2.0, 3.0, NodeState.ALIVE)]
    assert [j.node_id for j in notices_of(commands, n.NodeJoined)] == ["a"]


def test_the_welcome_echoes_the_hello_seq_it_answers() -> None:
    # The agent takes only the Welcome of its newest Hello (AgentCore.on_welcome).
    h = Harness()
    h.lead(term=9)
    assert [w.hello_seq for w in directives(h.hello("a", hello_seq=5), Welcome)] == [5]
    assert [w.hello_seq for w in directives(h.hello("a", hello_seq=6), Welcome)] == [6]


@pytest.mark.parametrize(
    ("node_id", "incarnation", "slots", "field"),
    [
        ("", "i", 1, "hello.node_id"),
        ("a", "", 1, "hello.incarnation"),
        ("a", "i", 0, "hello.capacity.slots"),
    ],
)
def test_a_bad_hello_closes_only_that_stream(
    node_id: str, incarnation: str, slots: int, field: str
) -> None:
    h = Harness()
    h.lead()
    h.hello("good")
    commands = h.step(SessionOpened("s-bad", node_id, incarnation, h.now, capacity_slots=slots))
    assert len(commands) == 1
    close = commands[0]
    assert isinstance(close, CloseSession)
    assert (close.session_id, close.code) == ("s-bad", StatusCode.INVALID_ARGUMENT)
    assert close.reason.startswith(field)
    view = h.core.node("good")
    assert view is not None
    assert view.connected


def test_a_heartbeat_seq_going_backwards_closes_the_session_and_suspects_the_node() -> None:
    h = Harness()
    h.lead()
    h.hello("a")
    h.heartbeat("a", seq=5)
    commands = h.heartbeat("a", seq=5)
    closes = of_type(commands, CloseSession)
    assert [(c.code, c.reason) for c in closes] == [
        (StatusCode.INVALID_ARGUMENT, "heartbeat.seq: 5 is not greater than the previous 5")
    ]
    assert [s.reason.name for s in notices_of(commands, n.NodeSuspected)] == ["STREAM_CLOSED"]
    # Later messages of that Session (and its close) are stale and ignored.
    assert h.heartbeat("a", seq=6) == []
    assert h.close("a") == []


def test_a_second_hello_on_one_session_is_refused() -> None:
    h = Harness()
    h.lead()
    h.hello("a")
    session = h.sessions["a"]
    commands = h.step(SessionOpened(session, "a", "a#1", h.now))
    assert [c.reason for c in of_type(commands, CloseSession)] == ["a second Hello"]


def test_a_newer_session_replaces_the_old_one() -> None:
    h = Harness()
    h.lead()
    h.hello("a")
    old = h.sessions["a"]
    commands = h.hello("a")
    assert [(c.session_id, c.code) for c in of_type(commands, CloseSession)] == [
        (old, StatusCode.ABORTED)
    ]
    assert [c.session_id for c in of_type(commands, SendDirective)] == [h.sessions["a"]]


def test_a_node_that_left_cannot_return_under_the_same_incarnation() -> None:
    h = Harness()
    h.lead()
    h.hello("a")
    h.step(GoodbyeReceived(h.sessions["a"], "a", h.now, "SIGTERM"))
    view = h.core.node("a")
    assert view is not None
    assert view.record.state is NodeState.LEFT
    same = h.step(SessionOpened("s2", "a", "a#1", h.now))
    assert [c.code for c in of_type(same, CloseSession)] == [StatusCode.FAILED_PRECONDITION]
    assert directives(h.hello("a", new_incarnation=True), Welcome)


def test_heartbeats_are_acked_with_the_node_state() -> None:
    h = Harness()
    h.lead(term=3)
    h.hello("a")
    assert directives(h.heartbeat("a"), HeartbeatAck) == [HeartbeatAck(1, 3, NodeState.ALIVE)]


def test_a_dead_node_is_told_so_and_its_session_closed() -> None:
    h = Harness()
    h.lead()
    h.hello("a")
    h.hello("b")
    commands = h.run_until(3.5, heartbeating=["b"])
    closes = of_type(commands, CloseSession)
    assert [(c.node_id, c.code) for c in closes] == [("a", StatusCode.ABORTED)]
    dead = notices_of(commands, n.NodeDead)
    assert [(d.node_id, d.detection_s >= 3.0) for d in dead] == [("a", True)]


# -- Hello reconciliation -------------------------------------------------------------------------


def test_hello_reattaches_paused_tasks_and_revokes_lost_ones() -> None:
    h = Harness()
    h.lead()
    h.hello("a")
    h.submit("r1", task_id="keep")
    h.submit("r2", task_id="lost")
    h.hello("b")
    # "lost" moves to b while a is away; "keep" stays because ... a comes back in time.
    h.close("a")
    commands = h.hello(
        "a",
        held=[
            HeldTask("keep", 1, HeldTaskStatus.PAUSED),
            HeldTask("lost", 0, HeldTaskStatus.PAUSED),
            HeldTask("ghost", 4, HeldTaskStatus.RUNNING),
        ],
    )
    assigns = directives(commands, Assign)
    assert [(a.task_id, a.epoch, a.reason) for a in assigns] == [
        ("keep", 1, AssignReason.REATTACH),
        ("lost", 1, AssignReason.REATTACH),  # a holds an older epoch: sent the current one
    ]
    revokes = directives(commands, Revoke)
    assert [(r.task_id, r.epoch, r.reason) for r in revokes] == [
        ("ghost", 4, RevokeReason.UNKNOWN_TASK),
        ("lost", 0, RevokeReason.REASSIGNED),
    ]
    assert [z.source.name for z in notices_of(commands, n.ZombieFenced)] == ["HELLO"]


# -- Leadership -----------------------------------------------------------------------------------


def test_a_new_leader_finishes_half_done_work_after_the_grace() -> None:
    # The previous leader declared "gone" DEAD and crashed before moving its task.
    nodes = [
        NodeRecord("gone", "gone#1", state=NodeState.DEAD, state_changed_at_s=1.0),
        NodeRecord("alive", "alive#1"),
    ]
    tasks = [
        TaskRecord(
            "t1", "r1", TaskSpec(kind="k"), TaskState.RUNNING, epoch=3, owner_node_id="gone"
        ),
        TaskRecord(
            "t2", "r2", TaskSpec(kind="k"), TaskState.RUNNING, epoch=1, owner_node_id="nobody"
        ),
        TaskRecord("t3", "r3", TaskSpec(kind="k"), TaskState.PENDING, epoch=2, attempt=2),
    ]
    h = Harness(now_s=50.0)
    h.lead(term=2, nodes=nodes, tasks=tasks)
    commands = h.hello("alive")
    # The PENDING task is placed at once; the stranded ones wait for the grace.
    assert [(a.task_id, a.epoch) for a in directives(commands, Assign)] == [("t3", 3)]
    during = h.run_until(52.9, heartbeating=["alive"])
    assert directives(during, Assign) == []
    after = h.run_until(53.2, heartbeating=["alive"])
    moved = sorted((a.task_id, a.epoch, a.reason) for a in directives(after, Assign))
    assert moved == [("t1", 4, AssignReason.MOVED), ("t2", 2, AssignReason.MOVED)]
    assert [d.node_id for d in notices_of(after, n.NodeDead)] == []  # "gone" was DEAD already


def test_leadership_lost_drops_everything_and_persist_failed_steps_down() -> None:
    h = Harness()
    h.lead()
    h.hello("a")
    assert h.step(LeadershipLost(h.now, "lease expired")) == []
    assert h.core.role is Role.FOLLOWER
    assert h.core.snapshot().nodes == ()
    h.lead(term=2)
    assert h.step(PersistFailed(h.now, "etcd unavailable")) == [
        StepDown("persist failed: etcd unavailable")
    ]
    assert h.core.role is Role.FOLLOWER
    with pytest.raises(UsageError, match="term went backwards"):
        h.lead(term=1)


def test_events_for_a_follower_are_a_usage_error() -> None:
    h = Harness()
    with pytest.raises(UsageError, match="not leading"):
        h.submit("r")


# -- Drain ----------------------------------------------------------------------------------------


def test_drain_releases_tasks_and_reassigns_them_without_spending_attempts() -> None:
    h = Harness()
    h.lead()
    h.hello("a")
    h.submit("r", task_id="t")
    h.hello("b")
    commands = h.step(DrainRequested("drain-1", "a", h.now, "maintenance"))
    view = h.core.node("a")
    assert view is not None
    assert view.record.state is NodeState.DRAINING
    assert view.record.cordoned
    assert directives(commands, Drain) == [Drain("drain-1", "maintenance")]
    releases = directives(commands, Release)
    assert [(r.task_id, r.epoch, r.reason) for r in releases] == [("t", 1, MoveReason.DRAIN)]
    assert [c.tasks_to_move for c in of_type(commands, ReplyToRequest)] == [1]
    moved = h.update("a", "t", 1, Released(releases[0].move_id))
    task = h.task("t")
    assert (task.owner_node_id, task.epoch, task.attempt) == ("b", 2, 1)
    reassigned = notices_of(moved, n.TaskReassigned)
    assert [(r.from_node_id, r.to_node_id, r.reason) for r in reassigned] == [
        ("a", "b", MoveReason.DRAIN)
    ]
    # Uncordon lets it take work again.
    uncordon = h.step(UncordonRequested("u-1", "a", h.now))
    assert directives(uncordon, Drain) == [Drain("drain-1", cancelled=True)]
    view = h.core.node("a")
    assert view is not None
    assert view.record.state is NodeState.ALIVE


def test_a_release_that_times_out_moves_only_after_the_owner_stops() -> None:
    h = Harness()
    h.lead()
    h.at(10.0)  # well past the new-leader grace
    h.hello("a")
    h.submit("r", task_id="t")
    h.hello("b")
    h.step(DrainRequested("d", "a", h.now, release_timeout_s=1.0))
    running = [TaskProgress("t", 1)]
    h.at(10.5).heartbeat("a", running)
    h.heartbeat("b")
    assert directives(h.tick(), Revoke) == []
    h.at(11.0).heartbeat("a", running)  # a never answers the Release
    h.heartbeat("b")
    revokes = directives(h.tick(), Revoke)
    assert [(r.task_id, r.reason) for r in revokes] == [("t", RevokeReason.RELEASE_TIMEOUT)]
    assert directives(h.at(11.1).tick(), Revoke) == []  # revoked once
    assert h.task("t").owner_node_id == "a"  # still a's until it shows it stopped
    h.at(11.5).heartbeat("a", running)
    assert h.task("t").owner_node_id == "a"
    stopped = h.at(12.0).heartbeat("a", [])
    assert h.task("t").owner_node_id == "b"
    assert h.task("t").epoch == 2
    assert [r.reason for r in notices_of(stopped, n.TaskReassigned)] == [MoveReason.RELEASE_TIMEOUT]


def test_drain_of_unknown_or_dead_nodes() -> None:
    h = Harness()
    h.lead()
    missing = h.step(DrainRequested("d", "nope", h.now))
    assert [c.status for c in of_type(missing, ReplyToRequest)] == [StatusCode.NOT_FOUND]


# -- Batching and ordering ------------------------------------------------------------------------


def test_batched_splits_at_max_txn_ops() -> None:
    assert MAX_TXN_OPS == 128
    chunks = batched(list(range(300)))
    assert [len(c) for c in chunks] == [128, 128, 44]
    assert [x for c in chunks for x in c] == list(range(300))
    assert batched([]) == []
    with pytest.raises(ValueError, match="size"):
        batched([1], 0)


def test_moving_300_tasks_is_written_in_transactions_of_at_most_128() -> None:
    h = Harness(CoreSettings(self_check=True))
    h.lead()
    h.hello("doomed", slots=400)
    for i in range(300):
        h.submit(f"r{i}", task_id=f"t{i:03d}")
    h.hello("survivor", slots=400)
    commands = h.run_until(3.5, heartbeating=["survivor"])
    task_batches = [len(c.records) for c in commands if isinstance(c, PersistTasks)]
    assert task_batches == [128, 128, 44]
    for _, step_commands in h.log:
        check_command_order(step_commands)
    assert all(t.owner_node_id == "survivor" for t in h.core.snapshot().tasks)


def test_persist_comes_before_every_send_in_each_list() -> None:
    h = Harness()
    h.lead()
    h.hello("a")
    commands = h.submit("r", task_id="t")
    kinds = [type(c).__name__ for c in commands]
    assert kinds == ["PersistTasks", "EmitEvent", "EmitEvent", "ReplyToRequest", "SendDirective"]


def test_check_command_order_catches_a_send_before_a_persist() -> None:
    h = Harness()
    h.lead()
    h.hello("a")
    commands = h.submit("r", task_id="t")
    bad = [commands[-1], *commands[:-1]]
    with pytest.raises(InvariantViolation, match="persist-before-send"):
        check_command_order(bad)
    too_big = PersistNodes(1, tuple(NodeRecord(f"n{i}", "i") for i in range(129)))
    with pytest.raises(InvariantViolation, match=r"outside 1\.\.128"):
        check_command_order([too_big])


def test_each_record_is_written_once_per_step_with_its_newest_value() -> None:
    h = Harness()
    h.lead()
    h.hello("a")
    commands = h.submit("r", task_id="t")  # created PENDING, then ASSIGNED in the same step
    records = persisted_tasks(commands)
    assert [(r.task_id, r.state) for r in records] == [("t", TaskState.ASSIGNED)]
    assert persisted_nodes(commands) == []
    assert all(isinstance(c, EmitEvent) for c in commands[1:3])


def test_snapshot_is_immutable_and_consistent() -> None:
    h = Harness()
    h.lead(term=4)
    h.hello("a", slots=2)
    h.submit("r", task_id="t")
    snap = h.core.snapshot()
    assert snap.term == 4
    assert snap.role is Role.LEADER
    assert snap.tasks_by_state() == {TaskState.ASSIGNED: 1}
    assert snap.nodes_by_state() == {NodeState.ALIVE: 1}
    view = snap.node("a")
    assert view is not None
    assert (view.assigned_tasks, view.assigned_slots) == (1, 1)
    h.at(1.0).heartbeat("a")
    assert snap.task("t") == h.core.task("t")
    with pytest.raises(AttributeError):
        snap.term = 5  # type: ignore[misc]
    assert replace(snap, term=5).term == 5


def test_revokes_go_to_the_session_the_node_has_now() -> None:
    h = Harness()
    h.lead()
    h.hello("a")
    commands = h.heartbeat("a", [TaskProgress("ghost", 2)])
    assert [(node, r.task_id) for node, r in sent(commands, Revoke)] == [("a", "ghost")]
    assert {c.session_id for c in of_type(commands, SendDirective)} == {h.sessions["a"]}
