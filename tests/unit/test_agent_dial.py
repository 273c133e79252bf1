"""node_agent.core.dial: the agent's dial order and its hold-off of unreachable replicas."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node_agent.core.dial import (
    HOLD_OFF_S,
    MAX_RETRY_AFTER_S,
    DialEnd,
    DialPlan,
    spread_start,
)

A, B, C = "a:7070", "b:7070", "c:7070"
DOWN = DialEnd(status="UNAVAILABLE")  # connect refused, or the stream broke
CRASHED = DialEnd(welcomed=True, status="UNAVAILABLE")  # a Welcomed Session broke
REFUSED = DialEnd(status="FAILED_PRECONDITION")  # an answer with a status


def _dials(plan: DialPlan, now: float, count: int) -> list[str]:
    return [plan.next(now).address for _ in range(count)]


def test_without_failures_it_rotates_through_the_list() -> None:
    assert _dials(DialPlan([A, B, C]), 0.0, 5) == [A, B, C, A, B]
    assert _dials(DialPlan([A, B, C], start=1), 0.0, 3) == [B, C, A]


def test_an_unreachable_replica_is_skipped_until_its_hold_off_ends() -> None:
    plan = DialPlan([A, B, C], hold_off_s=3.0)
    assert plan.next(0.0).address == A
    plan.ended(A, 0.1, CRASHED)  # its Session broke: it crashed
    choices = [plan.next(1.0) for _ in range(4)]
    assert [c.address for c in choices] == [B, C, B, C]
    assert choices[1].skipped == ()
    assert choices[2].skipped == (A,)
    assert plan.held_off(1.0) == (A,)
    assert plan.next(3.1).address == A  # the hold-off ended
    assert plan.held_off(3.1) == ()


def test_a_replica_that_answers_is_cleared() -> None:
    plan = DialPlan([A, B], hold_off_s=3.0)
    plan.ended(A, 0.0, DOWN)
    plan.ended(A, 0.5, REFUSED)  # e.g. a refusal with a status
    assert _dials(plan, 1.0, 2) == [A, B]


def test_a_redirect_comes_first_unless_it_is_held_off() -> None:
    plan = DialPlan([A, B, C])
    plan.redirect(C)
    assert plan.redirect_pending
    choice = plan.next(0.0)
    assert (choice.address, choice.redirected) == (C, True)
    assert not plan.redirect_pending
    assert plan.next(0.0).address == A  # the rotation did not move

    plan.ended(B, 0.0, DOWN)
    plan.redirect(B)  # a NotLeader naming the replica that just refused us
    choice = plan.next(1.0)
    assert (choice.address, choice.redirected, choice.skipped) == (C, False, (B,))
    assert not plan.redirect_pending


def test_when_all_are_held_off_it_dials_the_one_whose_hold_off_ends_first() -> None:
    plan = DialPlan([A, B, C], hold_off_s=3.0)
    plan.ended(B, 0.0, DOWN)
    plan.ended(C, 1.0, DOWN)
    plan.ended(A, 2.0, DOWN)
    choice = plan.next(2.5)
    assert choice.address == B
    assert set(choice.skipped) == {A, C}


def test_one_address_is_always_dialled() -> None:
    plan = DialPlan(["coordinator.lazarus.svc:7070"])
    plan.ended("coordinator.lazarus.svc:7070", 0.0, DOWN)
    assert _dials(plan, 0.5, 2) == ["coordinator.lazarus.svc:7070"] * 2


def test_a_zero_hold_off_is_plain_rotation() -> None:
    plan = DialPlan([A, B, C], hold_off_s=0.0)
    plan.ended(B, 0.0, DOWN)
    assert _dials(plan, 0.0, 3) == [A, B, C]


def test_failures_count_dials_since_the_last_welcome_not_not_leaders() -> None:
    plan = DialPlan([A, B])
    plan.ended(A, 0.0, DOWN)
    plan.ended(B, 0.0, REFUSED)
    assert plan.failures == 2
    assert plan.ended(A, 0.0, DialEnd(not_leader=True, retry_after_s=0.2)) == 0.2
    assert plan.failures == 2  # a NotLeader that asked for a pause
    plan.redirect(B)
    assert plan.ended(A, 0.0, DialEnd(not_leader=True)) == 0.0  # dial the leader at once
    assert plan.failures == 2
    plan.ended(B, 0.0, CRASHED)
    assert plan.failures == 0


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        DialPlan([])
    with pytest.raises(ValueError, match="hold_off_s"):
        DialPlan([A], hold_off_s=-1.0)
    assert DialPlan([A]).hold_off_s == HOLD_OFF_S


@given(
    st.lists(
        st.tuples(
            st.sampled_from([A, B, C]),
            st.floats(0.0, 2.0),
            st.booleans(),
            st.booleans(),
        ),
        max_size=30,
    )
)
def test_it_never_dials_a_held_off_address_while_another_is_free(
    script: list[tuple[str, float, bool, bool]],
) -> None:
    plan = DialPlan([A, B, C], hold_off_s=1.0)
    now = 0.0
    for address, step, reachable, redirect in script:
        now += step
        if redirect:
            plan.redirect(address)
        held = set(plan.held_off(now))
        choice = plan.next(now)
        assert choice.address in (A, B, C)
        if held != {A, B, C}:
            assert choice.address not in held
        assert choice.address not in choice.skipped
        plan.ended(choice.address, now, REFUSED if reachable else DOWN)


def test_the_first_dial_spreads_a_fleet_over_the_list() -> None:
    starts = [spread_start(f"worker-{i}", 3) for i in range(3000)]
    assert set(starts) == {0, 1, 2}
    for index in (0, 1, 2):
        assert 900 <= starts.count(index) <= 1100, starts.count(index)
    assert spread_start("worker-7", 3) == spread_start("worker-7", 3)  # a restart starts there
    assert spread_start("worker-7", 0) == 0


def test_a_new_list_keeps_the_hold_offs_and_the_position() -> None:
    plan = DialPlan([A, B], hold_off_s=3.0)
    assert plan.next(0.0).address == A
    plan.ended(B, 0.0, DOWN)
    assert plan.set_addresses([A, B, C])
    assert _dials(plan, 1.0, 3) == [C, A, C]  # B still held off
    assert not plan.set_addresses([])  # a resolution that found nothing: unchanged
    assert not plan.set_addresses([A, B, C])
    assert plan.addresses == (A, B, C)


def test_hold_offs_of_addresses_gone_from_the_list_do_not_pile_up() -> None:
    plan = DialPlan([A], hold_off_s=3.0)
    for i in range(100):  # a pod restarted again and again, a new address each time
        address = f"10.0.0.{i}:7070"
        plan.set_addresses([address])
        plan.ended(address, float(i), DOWN)
    assert len(plan._held_until) <= 4


def test_the_first_dial_and_the_first_resolved_list_start_at_the_nodes_spread() -> None:
    node = next(f"n{i}" for i in range(100) if spread_start(f"n{i}", 3) == 2)
    plan = DialPlan([A, B, C], node_id=node)
    assert plan.next(0.0).address == C
    plan = DialPlan(["svc:7070"], node_id=node)  # a headless name, resolved later
    assert plan.set_addresses([A, B, C])
    assert plan.next(0.0).address == C
    assert plan.set_addresses([A, B])  # later lists go on from the position
    assert plan.next(0.0).address == A
    assert DialPlan([A, B, C], node_id=node, start=0).next(0.0).address == A


def test_how_a_dial_ended_is_judged() -> None:
    assert not DOWN.reachable
    assert not DialEnd(status="DEADLINE_EXCEEDED").reachable
    assert not DialEnd(silent=True).reachable
    assert not DialEnd(broken=True).reachable
    assert REFUSED.reachable
    assert DialEnd().reachable  # the coordinator ended the stream
    assert DialEnd(not_leader=True, status="UNAVAILABLE").reachable  # the abort after it
    plan = DialPlan([A, B])
    assert plan.ended(A, 0.0, DOWN) is None  # back off
    assert plan.ended(A, 0.0, DialEnd(not_leader=True, retry_after_s=60.0)) == MAX_RETRY_AFTER_S


def test_a_redirect_to_a_held_off_replica_is_not_usable() -> None:
    plan = DialPlan([A, B, C], hold_off_s=3.0)
    plan.ended(A, 0.0, CRASHED)  # the leader crashed
    plan.redirect(A)  # a follower still names it
    assert plan.redirect_pending
    assert not plan.redirect_usable(1.0)
    assert plan.redirect_usable(3.0)  # its hold-off ended
