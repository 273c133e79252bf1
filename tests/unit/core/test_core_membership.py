"""The node state table, the cordon overlay and the mass-failure guard, on their own."""

from __future__ import annotations

import pytest

from coordinator.core import InvariantViolation, NodeRecord, NodeState
from coordinator.core.guard import GuardInput, MassFailureGuard
from coordinator.core.membership import NODE_TRANSITIONS, NodeEntry, NodeTrigger, next_node_state

A, S, D, R, L = (
    NodeState.ALIVE,
    NodeState.SUSPECT,
    NodeState.DEAD,
    NodeState.DRAINING,
    NodeState.LEFT,
)
T = NodeTrigger


@pytest.mark.parametrize(
    ("state", "trigger", "cordoned", "expected"),
    [
        (A, T.HEARTBEAT, False, A),
        (A, T.STREAM_CLOSED, False, S),
        (A, T.SUSPECTED, False, S),
        (A, T.DECLARED_DEAD, False, D),
        (A, T.CORDONED, True, R),
        (R, T.UNCORDONED, False, A),
        (R, T.HEARTBEAT, True, R),
        (R, T.STREAM_CLOSED, True, S),
        (S, T.HEARTBEAT, False, A),
        (S, T.HEARTBEAT, True, R),  # a cordoned node recovers into DRAINING
        (S, T.DECLARED_DEAD, True, D),
        (D, T.SESSION_OPENED, False, A),
        (D, T.SESSION_OPENED, True, R),
        (A, T.LEFT, False, L),
        (L, T.SESSION_OPENED, False, A),
    ],
)
def test_transitions(
    state: NodeState, trigger: NodeTrigger, cordoned: bool, expected: NodeState
) -> None:
    assert next_node_state(state, trigger, cordoned) is expected


@pytest.mark.parametrize(
    ("state", "trigger"),
    [(D, T.HEARTBEAT), (D, T.STREAM_CLOSED), (L, T.HEARTBEAT), (L, T.DECLARED_DEAD)],
)
def test_missing_rows_are_bugs(state: NodeState, trigger: NodeTrigger) -> None:
    assert (state, trigger) not in NODE_TRANSITIONS
    with pytest.raises(InvariantViolation, match=f"{state.name} on {trigger.name}"):
        next_node_state(state, trigger, False)


def test_only_a_session_brings_a_dead_or_left_node_back() -> None:
    for (state, trigger), target in NODE_TRANSITIONS.items():
        if state in (D, L) and target not in (D, L):
            assert trigger is T.SESSION_OPENED


def test_every_live_row_exists_for_both_live_states() -> None:
    for trigger in NodeTrigger:
        assert ((A, trigger) in NODE_TRANSITIONS) == ((R, trigger) in NODE_TRANSITIONS)


# -- the guard ------------------------------------------------------------------------------


def _nodes(
    alive: int, suspect: int = 0, dead: int = 0, dead_since: float = 10.0, left: int = 0
) -> list[GuardInput]:
    out = [GuardInput(f"a{i}", A, None) for i in range(alive)]
    out += [GuardInput(f"s{i}", S, None) for i in range(suspect)]
    out += [GuardInput(f"d{i}", D, dead_since) for i in range(dead)]
    out += [GuardInput(f"l{i}", L, None) for i in range(left)]
    return out


def _guard() -> MassFailureGuard:
    return MassFailureGuard(threshold_ratio=0.5, min_nodes=3, window_s=3.0)


def test_guard_engages_when_more_than_half_fail_together() -> None:
    g = _guard()
    status = g.evaluate(_nodes(alive=4, dead=5), 10.0)
    assert status.active
    assert status.changed
    assert (status.dead_nodes, status.total_nodes) == (5, 9)


@pytest.mark.parametrize(
    ("alive", "suspect", "dead", "left"),
    [(4, 0, 5, 0), (5, 0, 5, 0), (0, 0, 2, 0), (1, 7, 1, 0), (3, 0, 1, 5), (9, 1, 0, 2)],
)
def test_healthy_nodes_passed_as_a_count_judge_as_passed_one_by_one(
    alive: int, suspect: int, dead: int, left: int
) -> None:
    # The leader passes ALIVE nodes as a count (no input per node per tick).
    listed, counted = _guard(), _guard()
    for now in (10.0, 11.0, 20.0):
        nodes = _nodes(alive=alive, suspect=suspect, dead=dead, left=left)
        unhealthy = [n for n in nodes if n.state is not A]
        assert counted.evaluate(unhealthy, now, healthy=alive) == listed.evaluate(nodes, now)


def test_guard_stays_off_at_exactly_the_threshold_and_for_small_clusters() -> None:
    assert not _guard().evaluate(_nodes(alive=5, dead=5), 10.0).active  # 0.5 is not > 0.5
    assert not _guard().evaluate(_nodes(alive=0, dead=2), 10.0).active  # 2 nodes < 3
    assert not _guard().evaluate(_nodes(alive=1, suspect=5), 10.0).active  # nobody DEAD yet


def test_suspects_count_so_the_first_verdict_of_a_cut_off_leader_moves_nothing() -> None:
    status = _guard().evaluate(_nodes(alive=1, suspect=7, dead=1), 10.0)
    assert status.active
    assert status.failing_nodes == 8


def test_old_deaths_and_left_nodes_are_not_part_of_the_failure() -> None:
    g = _guard()
    old = [GuardInput(f"old{i}", D, 1.0) for i in range(10)]  # dead long before the window
    status = g.evaluate(old + _nodes(alive=3, dead=1, left=5), 10.0)
    assert not status.active
    assert status.total_nodes == 4


def test_guard_holds_its_episode_until_nodes_come_back() -> None:
    g = _guard()
    assert g.evaluate(_nodes(alive=2, dead=3, dead_since=10.0), 10.0).active
    # Much later the same nodes are still DEAD: the window start is frozen, so it holds.
    held = g.evaluate(_nodes(alive=2, dead=3, dead_since=10.0), 100.0)
    assert held.active
    assert not held.changed
    # Two come back: 1 failing of 5.
    released = g.evaluate(_nodes(alive=4, dead=1, dead_since=10.0), 101.0)
    assert not released.active
    assert released.changed


# -- revoked pairs: remembered only while a heartbeat may still list them ------------------------


def _entry() -> NodeEntry:
    return NodeEntry(record=NodeRecord(node_id="n", incarnation="n#1"))


def test_a_revoked_pair_the_node_reported_is_forgotten_once_a_heartbeat_omits_it() -> None:
    entry = _entry()
    entry.note_revoked(("t", 1), held=True)
    entry.prune_revoked({("t", 1)})  # still stopping: still skipped
    assert entry.revoked == {("t", 1)}
    entry.prune_revoked(set())
    assert entry.revoked == set()
    assert entry.revoked_held == set()


def test_a_revoke_that_may_overtake_its_assign_waits_until_a_heartbeat_lists_it() -> None:
    entry = _entry()
    entry.note_revoked(("t", 2), held=False)  # a cancel right after the Assign
    entry.prune_revoked(set())  # sent before the Assign arrived: proves nothing
    assert entry.revoked == {("t", 2)}
    entry.prune_revoked({("t", 2)})  # the node has it (and is stopping it)
    assert entry.revoked_held == {("t", 2)}
    entry.prune_revoked({("u", 1)})
    assert entry.revoked == set()


def test_forgetting_a_pair_and_a_new_session_clear_both_sets() -> None:
    entry = _entry()
    entry.note_revoked(("t", 1), held=False)
    entry.note_revoked(("u", 1), held=True)
    entry.forget_revoked(("t", 1))
    assert entry.revoked == {("u", 1)}
    entry.new_session()
    assert entry.revoked == set()
    assert entry.revoked_held == set()
