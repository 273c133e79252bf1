"""What one leader remembers about revokes, recoveries and unrecorded owners shrinks back.

The core lives for a whole leadership term (months): every memory-only table
must drop an entry once it can no longer change a decision, and keep it until
then (no Revoke lost, no RecoveryCompleted lost).
"""

from __future__ import annotations

from core_harness import Harness, directives

from coordinator.core import (
    Assign,
    CancelRequested,
    CoreSettings,
    Revoke,
    RevokeReason,
    Started,
    TaskProgress,
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
