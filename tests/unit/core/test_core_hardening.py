"""Unit tests of issue 16 in the pure core: intake limits, load screening, fork order, retention."""

from __future__ import annotations

from random import Random

from core_harness import Harness, directives, notices_of

from coordinator.core import (
    Assign,
    Command,
    CoordinatorCore,
    CoreSettings,
    ForkSeeded,
    HeldTask,
    HeldTaskStatus,
    LeadershipAcquired,
    NodeState,
    PersistTasks,
    ReplyToRequest,
    RetireRecords,
    Revoke,
    SeedFork,
    SendDirective,
    SessionOpened,
    StatusCode,
    TaskSpec,
    TaskState,
    TaskSubmitted,
    Tick,
    Welcome,
    notices,
)
from coordinator.core.commands import CloseSession
from coordinator.core.limits import LIMITS, MAX_RECORD_BYTES, Refusal, screen
from coordinator.core.loadcheck import screen_loaded
from coordinator.core.records import NodeRecord, TaskRecord


def _leader(**settings: float) -> CoordinatorCore:
    core = CoordinatorCore(CoreSettings(self_check=True, **settings), rng=Random(1))
    core.step(LeadershipAcquired(term=1, now_s=0.0))
    return core


def test_limits_keep_a_full_task_record_inside_one_etcd_request() -> None:
    labels = 2 * LIMITS.labels_per_map * (LIMITS.label_key_bytes + LIMITS.label_value_bytes)
    total = (
        LIMITS.spec_payload_bytes
        + LIMITS.result_payload_bytes
        + labels
        + LIMITS.error_message_bytes
        + LIMITS.error_traceback_bytes
        + 32 * LIMITS.checkpoint_ref_bytes
    )
    assert total < MAX_RECORD_BYTES < 1_500_000


def test_an_oversized_label_closes_that_session_naming_the_field() -> None:
    core = _leader()
    hello = SessionOpened("s1", "n1", "i1", 1.0, labels=(("zone", "x" * 10_000),))
    assert isinstance(screen(hello), Refusal)
    commands = core.step(hello)
    assert commands == [
        CloseSession("n1", "s1", StatusCode.INVALID_ARGUMENT, commands[0].reason)  # type: ignore[union-attr]
    ]
    assert "hello.labels" in commands[0].reason  # type: ignore[union-attr]
    assert core.node("n1") is None


def test_an_oversized_submission_is_refused_and_nothing_is_persisted() -> None:
    core = _leader()
    spec = TaskSpec(kind="k", node_selector=tuple((f"k{i}", "v") for i in range(100)))
    commands = core.step(TaskSubmitted("r1", spec, 1.0))
    assert [type(c) for c in commands] == [ReplyToRequest]
    assert commands[0].status is StatusCode.INVALID_ARGUMENT  # type: ignore[union-attr]
    assert "spec.node_selector" in commands[0].message  # type: ignore[union-attr]


def test_load_screening_quarantines_what_would_break_the_core() -> None:
    good = TaskRecord(task_id="t1", request_id="r", spec=TaskSpec(kind="k"))
    screened = screen_loaded(
        {"n1": NodeRecord("n1", "i"), "n2": NodeRecord("nX", "i"), "n3": "DecodeError: bad"},
        {
            "t1": good,
            "t2": TaskRecord(task_id="t2", request_id="r", spec=TaskSpec(kind="k")),
            "t3": TaskRecord(task_id="", request_id="r3", spec=TaskSpec(kind="k")),
            "t4": TaskRecord(task_id="t4", request_id="r4", spec=TaskSpec(kind="k"), epoch=-1),
        },
    )
    assert [n.node_id for n in screened.nodes] == ["n1"]
    assert screened.tasks == (good,)
    assert sorted((q.collection, q.name) for q in screened.quarantined) == [
        ("nodes", "n2"),
        ("nodes", "n3"),
        ("tasks", "t2"),
        ("tasks", "t3"),
        ("tasks", "t4"),
    ]
    core = CoordinatorCore(CoreSettings(self_check=True), rng=Random(1))
    core.step(LeadershipAcquired(1, 0.0, screened.nodes, screened.tasks, screened.quarantined))


def test_a_fork_is_seeded_after_its_persist_and_placed_only_once_seeded() -> None:
    core = _leader()
    core.step(SessionOpened("s1", "n1", "i1", 0.5))
    fork = TaskSubmitted("r1", TaskSpec(kind="k"), 1.0, "f1", forked_from_ref="t@1", fork_seed=b"x")
    commands = core.step(fork)
    kinds = [type(c) for c in commands]
    assert kinds.index(PersistTasks) < kinds.index(SeedFork)
    assert not any(isinstance(c, SendDirective) and c.directive.task_id == "f1" for c in commands)  # type: ignore[attr-defined]
    assert core.task("f1").state is TaskState.PENDING  # type: ignore[union-attr]
    seeded = core.step(ForkSeeded("f1", 1.1, ok=True))
    assert any(isinstance(c, SendDirective) for c in seeded)
    assert core.task("f1").state is TaskState.ASSIGNED  # type: ignore[union-attr]


def test_a_refused_fork_asks_for_no_seed_and_a_failed_seed_fails_the_task() -> None:
    core = _leader()
    refused = core.step(
        TaskSubmitted("r1", TaskSpec(kind=""), 1.0, "f1", forked_from_ref="t@1", fork_seed=b"x")
    )
    assert not any(isinstance(c, SeedFork) for c in refused)
    core.step(
        TaskSubmitted("r2", TaskSpec(kind="k"), 1.0, "f2", forked_from_ref="t@1", fork_seed=b"x")
    )
    core.step(ForkSeeded("f2", 1.2, ok=False, reason="Redis down"))
    assert core.task("f2").state is TaskState.FAILED  # type: ignore[union-attr]


def test_terminal_tasks_are_retired_after_the_retention_period() -> None:
    core = _leader(retention_s=10.0)
    core.step(TaskSubmitted("r1", TaskSpec(kind="k"), 1.0, "t1"))
    from coordinator.core import CancelRequested

    core.step(CancelRequested("c1", "t1", 2.0))
    assert not any(isinstance(c, RetireRecords) for c in core.step(Tick(11.0)))
    commands = core.step(Tick(12.5))
    retired = [c for c in commands if isinstance(c, RetireRecords)]
    assert [t.task_id for t in retired[0].tasks] == ["t1"]
    assert core.task("t1") is None


# -- retention of gone nodes: a crashed pod that never comes back leaves etcd --------------------


def _four_tasks(h: Harness) -> list[str]:
    """Submit t0..t3 (placed on the nodes said Hello so far); their ids."""
    ids = [f"t{k}" for k in range(4)]
    for task_id in ids:
        h.submit(f"r-{task_id}", task_id=task_id)
    return ids


def _two_nodes_one_dies(h: Harness) -> list[str]:
    """w0 and w1 run four tasks; w0's stream closes at t=1 and it is never heard again.

    Returns:
        The tasks w0 ran (w1 has room for them).
    """
    h.lead()
    h.hello("w0", slots=2)
    h.hello("w1", slots=4)
    ids = _four_tasks(h)
    on_w0 = [t for t in ids if h.task(t).owner_node_id == "w0"]
    assert on_w0
    assert all(h.task(t).epoch == 1 for t in ids)
    h.run_until(1.0, heartbeating=["w0", "w1"])
    h.close("w0")
    return on_w0


def _retired_nodes(commands: list[Command]) -> list[str]:
    return [n.node_id for c in commands if isinstance(c, RetireRecords) for n in c.nodes]


def test_a_dead_node_leaves_etcd_after_the_retention_period_and_its_id_comes_back_new() -> None:
    h = Harness(CoreSettings(self_check=True, retention_s=10.0))
    moved = _two_nodes_one_dies(h)
    h.run_until(4.0, heartbeating=["w1"])
    dead = h.core.node("w0")
    assert dead is not None
    assert dead.record.state is NodeState.DEAD
    assert all(h.task(t).epoch == 2 for t in moved)
    assert all(h.task(t).owner_node_id == "w1" for t in moved)
    dead_at = dead.record.state_changed_at_s
    assert dead_at is not None
    commands = h.run_until(dead_at + 9.9, heartbeating=["w1"])
    assert _retired_nodes(commands) == []  # not before the retention period
    commands = h.run_until(dead_at + 10.5, heartbeating=["w1"])
    assert _retired_nodes(commands) == ["w0"]
    assert h.core.node("w0") is None
    assert h.core.node("w1") is not None  # the live one stays
    # The DEAD incarnation itself, back after the retention period (a partition
    # that lasted a day) and still holding its tasks at epoch 1: a new node to
    # this leader, and its old epochs are revoked; the tasks stay where they moved.
    held = tuple(HeldTask(t, 1, HeldTaskStatus.PAUSED) for t in moved)
    commands = h.hello("w0", held=held)
    assert directives(commands, Welcome)
    (joined,) = notices_of(commands, notices.NodeJoined)
    assert joined.previous_incarnation == ""
    assert not [a for a in directives(commands, Assign) if a.task_id in moved]
    assert sorted(r.task_id for r in directives(commands, Revoke)) == sorted(moved)
    assert all(h.task(t).epoch == 2 and h.task(t).owner_node_id == "w1" for t in moved)


def test_a_gone_node_that_still_owns_tasks_under_the_guard_is_retired_only_after_they_move() -> (
    None
):
    # Both nodes silent together: the mass-failure guard keeps their tasks where
    # they are, so neither record may go while it owns them.
    h = Harness(CoreSettings(self_check=True, retention_s=10.0, mass_failure_min_nodes=2))
    _two_nodes_one_dies(h)
    ids = [f"t{k}" for k in range(4)]
    h.close("w1")
    h.run_until(20.0)
    assert h.core.guard_active
    assert {h.task(t).owner_node_id for t in ids} == {"w0", "w1"}
    assert h.core.node("w0") is not None
    assert h.core.node("w1") is not None
    # Two live nodes: half the population failing no longer engages it; it
    # releases and the tasks move to them.
    h.hello("w2", slots=4)
    h.hello("w3", slots=4)
    commands = h.run_until(21.0, heartbeating=["w2", "w3"])
    assert not h.core.guard_active
    assert {h.task(t).owner_node_id for t in ids} <= {"w2", "w3"}
    assert _retired_nodes(commands) == []
    commands = h.run_until(32.0, heartbeating=["w2", "w3"])  # a retention period after the check
    assert sorted(_retired_nodes(commands)) == ["w0", "w1"]
    assert h.core.node("w2") is not None


def test_a_dead_node_counted_by_an_active_guard_is_not_retired_under_it() -> None:
    # w0 owns nothing, but its DEAD verdict is part of the episode that keeps the
    # guard engaged: retiring it would shrink the population under min_nodes and
    # release the guard, moving tasks while the leader may be the one cut off.
    h = Harness(CoreSettings(self_check=True, retention_s=10.0, mass_failure_min_nodes=3))
    h.lead()
    h.hello("w1", slots=2)
    h.hello("w2", slots=2)
    ids = _four_tasks(h)  # placed before w0 joins: it owns none
    h.hello("w0", slots=2)
    h.run_until(1.0, heartbeating=["w0", "w1", "w2"])
    for node_id in ("w0", "w1", "w2"):
        h.close(node_id)
    commands = h.run_until(30.0)
    assert h.core.guard_active
    assert _retired_nodes(commands) == []
    assert h.core.node("w0") is not None
    assert {h.task(t).owner_node_id for t in ids} == {"w1", "w2"}
