"""What one leader remembers about revokes, recoveries and unrecorded owners shrinks back.

The core lives for a whole leadership term (months): every memory-only table
must drop an entry once it can no longer change a decision, and keep it until
then (no Revoke lost, no RecoveryCompleted lost).
"""

from __future__ import annotations

from core_harness import Harness, directives, notices_of, sent

from coordinator.core import (
    Assign,
    CancelRequested,
    Command,
    CoreSettings,
    NodeState,
    RetireRecords,
    Revoke,
    RevokeReason,
    Started,
    TaskProgress,
    TaskRecord,
    TaskSpec,
    TaskState,
    notices,
)


def _settings(**overrides: float) -> CoreSettings:
    # A large guard population: the deaths below are single failures, never an episode.
    return CoreSettings(self_check=True, mass_failure_min_nodes=100, **overrides)  # type: ignore[arg-type]


def _revoked(h: Harness, node_id: str) -> set[tuple[str, int]]:
    return h.core._nodes[node_id].revoked


# -- revoked pairs ------------------------------------------------------------------------------


def test_revokes_of_tasks_cancelled_before_the_node_listed_them_go_with_the_tasks() -> None:
    h = Harness(_settings(retention_s=5.0))
    h.lead()
    h.hello("w0", slots=1)
    ids = [f"t{k}" for k in range(50)]
    for task_id in ids:
        assert directives(h.submit(f"r-{task_id}", task_id=task_id), Assign)
        commands = h.step(CancelRequested(f"c-{task_id}", task_id, h.now))
        assert [r.task_id for r in directives(commands, Revoke)] == [task_id]
        h.heartbeat("w0")  # may have left before the Assign arrived: proves nothing
    assert _revoked(h, "w0") == {(task_id, 1) for task_id in ids}
    # Still remembered, so a node that got the Assign late is not told twice.
    assert not directives(h.heartbeat("w0", [TaskProgress("t0", 1)]), Revoke)
    h.run_until(h.now + 6.0, heartbeating=["w0"])
    assert all(h.core.task(task_id) is None for task_id in ids)  # retired
    assert _revoked(h, "w0") == set()
    # A node still listing a retired task is revoked again: no revoke is lost.
    revokes = directives(h.heartbeat("w0", [TaskProgress("t1", 1)]), Revoke)
    assert [(r.task_id, r.epoch, r.reason) for r in revokes] == [
        ("t1", 1, RevokeReason.UNKNOWN_TASK)
    ]


def test_a_revoked_task_is_forgotten_once_a_heartbeat_shows_it_stopped() -> None:
    h = Harness(_settings())
    h.lead()
    h.hello("w0")
    h.submit("r1", task_id="t1")
    h.update("w0", "t1", 1, Started())
    h.heartbeat("w0", [TaskProgress("t1", 1)])
    commands = h.step(CancelRequested("c1", "t1", h.now))
    assert [(r.task_id, r.epoch) for r in directives(commands, Revoke)] == [("t1", 1)]
    # Stopping: listed, not told again.
    assert not directives(h.heartbeat("w0", [TaskProgress("t1", 1)]), Revoke)
    assert _revoked(h, "w0") == {("t1", 1)}
    h.heartbeat("w0")  # stopped
    assert _revoked(h, "w0") == set()
    # Were it listed again, it would be revoked again (the rule forgets nothing it needs).
    revokes = directives(h.heartbeat("w0", [TaskProgress("t1", 1)]), Revoke)
    assert [(r.task_id, r.epoch, r.reason) for r in revokes] == [("t1", 1, RevokeReason.CANCELLED)]


def test_a_revoke_of_an_unknown_task_is_forgotten_once_the_node_drops_it() -> None:
    h = Harness(_settings())
    h.lead()
    h.hello("w0")
    first = directives(h.heartbeat("w0", [TaskProgress("x", 3)]), Revoke)
    assert [(r.task_id, r.reason) for r in first] == [("x", RevokeReason.UNKNOWN_TASK)]
    assert not directives(h.heartbeat("w0", [TaskProgress("x", 3)]), Revoke)
    h.heartbeat("w0")
    assert _revoked(h, "w0") == set()


# -- recoveries ---------------------------------------------------------------------------------


def _moved_twice(h: Harness) -> list[Command]:
    """t1 runs on a; a dies; t1 goes to b, which dies before starting it; t1 goes to c.

    Returns:
        Every command up to c's Assign of t1 (epoch 3), not yet started.
    """
    h.lead()
    h.hello("a", slots=1)
    h.submit("r1", task_id="t1")
    h.update("a", "t1", 1, Started())
    out = h.run_until(1.0, heartbeating=["a"])
    h.close("a")
    h.hello("b", slots=1)
    out += h.run_until(6.0, heartbeating=["b"])
    assert h.core.node("a").record.state is NodeState.DEAD  # type: ignore[union-attr]
    assert (h.task("t1").owner_node_id, h.task("t1").epoch) == ("b", 2)
    h.close("b")
    h.hello("c", slots=2)
    out += h.run_until(12.0, heartbeating=["c"])
    assert h.core.node("b").record.state is NodeState.DEAD  # type: ignore[union-attr]
    assert (h.task("t1").owner_node_id, h.task("t1").epoch) == ("c", 3)
    return out


def test_a_task_moved_on_from_a_second_dead_owner_completes_both_recoveries() -> None:
    h = Harness(_settings())
    before = _moved_twice(h)
    assert not notices_of(before, notices.RecoveryCompleted)  # t1 runs nowhere yet
    commands = h.update("c", "t1", 3, Started())
    done = notices_of(commands, notices.RecoveryCompleted)
    assert sorted((n.node_id, n.tasks_recovered, n.tasks_failed) for n in done) == [
        ("a", 1, 0),
        ("b", 1, 0),
    ]
    assert h.core._recoveries == {}
    assert h.core._recovering == {}


def test_a_node_id_that_dies_again_after_its_task_moved_twice_reports_its_recovery() -> None:
    h = Harness(_settings())
    _moved_twice(h)
    h.update("c", "t1", 3, Started())
    h.hello("a", new_incarnation=True, slots=1)
    h.submit("r2", task_id="t2")
    assert h.task("t2").owner_node_id == "a"
    h.update("a", "t2", 1, Started())
    h.run_until(13.0, heartbeating=["a", "c"])
    h.close("a")
    h.run_until(20.0, heartbeating=["c"])
    assert (h.task("t2").owner_node_id, h.task("t2").epoch) == ("c", 2)
    done = notices_of(h.update("c", "t2", 2, Started()), notices.RecoveryCompleted)
    assert [(n.node_id, n.incarnation, n.tasks_recovered) for n in done] == [("a", "a#2", 1)]


def test_a_retired_node_leaves_no_recovery_behind() -> None:
    h = Harness(_settings(retention_s=10.0))
    h.lead()
    h.hello("a", slots=1)
    h.submit("r1", task_id="t1")
    h.update("a", "t1", 1, Started())
    h.run_until(1.0, heartbeating=["a"])
    h.close("a")
    h.run_until(20.0)  # no node to run t1: it waits PENDING, a's recovery with it
    assert h.task("t1").state is TaskState.PENDING
    assert h.core.node("a") is None  # retired: it owns nothing
    assert "a" not in h.core._recoveries


# -- a placeholder for an owner etcd has no record of -------------------------------------------


def test_a_placeholder_for_an_unrecorded_owner_is_retired_once_its_task_moved() -> None:
    h = Harness(_settings(retention_s=5.0))
    orphan = TaskRecord(
        task_id="t1",
        request_id="r1",
        spec=TaskSpec(kind="work"),
        state=TaskState.RUNNING,
        epoch=1,
        attempt=1,
        owner_node_id="ghost",
        owner_incarnation="ghost#1",
    )
    h.lead(tasks=[orphan])
    assert h.core.node("ghost").record.state is NodeState.DEAD  # type: ignore[union-attr]
    h.hello("w1")
    commands = h.run_until(20.0, heartbeating=["w1"])
    assert [(node_id, a.task_id, a.epoch) for node_id, a in sent(commands, Assign)] == [
        ("w1", "t1", 2)
    ]
    retired = [n.node_id for c in commands if isinstance(c, RetireRecords) for n in c.nodes]
    assert retired == ["ghost"]
    assert h.core.node("ghost") is None
    assert [v.record.node_id for v in h.core.snapshot().nodes] == ["w1"]
