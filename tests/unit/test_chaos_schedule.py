"""Chaos schedules: seeded, deterministic, recoverable by construction."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lazarus_dev.chaos import Fault, FaultKind, make_schedule, schedule_lines


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    a = make_schedule(7, 60.0, agents=4)
    assert a == make_schedule(7, 60.0, agents=4)
    assert a != make_schedule(8, 60.0, agents=4)
    assert len(a) >= 5
    assert schedule_lines(7, a)[0] == f"chaos seed 7: {len(a)} faults"


def test_the_fixed_seed_of_the_integration_test_cuts_an_agent_off() -> None:
    # tests/integration/test_chaos_drill.py relies on this seed cutting an agent off
    # (partition or pause) for longer than dead_after: the mutation check needs it.
    for netns in (True, False):
        faults = make_schedule(1, 40.0, agents=4, netns=netns)
        assert any(
            f.kind in (FaultKind.PARTITION_AGENT, FaultKind.STOP_AGENT) and f.duration_s > 4
            for f in faults
        )


def test_no_partition_without_namespaces_and_no_etcd_fault_with_one_member() -> None:
    for seed in range(30):
        for f in make_schedule(seed, 60.0, agents=3, netns=False, etcd_members=1):
            assert f.kind is not FaultKind.PARTITION_AGENT
            assert f.kind.group != "etcd"


def _overlap(a: Fault, b: Fault) -> bool:
    return a.at_s <= b.end_s and b.at_s <= a.end_s


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    duration=st.floats(5.0, 300.0),
    agents=st.integers(2, 6),
    netns=st.booleans(),
)
def test_every_schedule_keeps_the_cluster_recoverable(
    seed: int, duration: float, agents: int, netns: bool
) -> None:
    faults = make_schedule(seed, duration, agents=agents, netns=netns)
    assert list(faults) == sorted(faults, key=lambda f: (f.at_s, f.kind.value, f.target))
    for f in faults:
        assert f.at_s >= 0
        assert f.end_s <= duration + 0.01
        if f.kind is FaultKind.PARTITION_AGENT:
            assert netns
            assert f.target == agents - 1
        if f.kind.group == "agent":
            assert 0 <= f.target < agents
    for i, a in enumerate(faults):
        overlapping = [b for b in faults[:i] + faults[i + 1 :] if _overlap(a, b)]
        if a.kind.group == "agent":
            assert all(b.target != a.target for b in overlapping if b.kind.group == "agent")
        else:
            assert all(b.kind.group != a.kind.group for b in overlapping)
    for t in {f.at_s for f in faults}:  # the most faults at once happen at some start
        now = [f for f in faults if f.at_s <= t <= f.end_s and f.kind.group == "agent"]
        assert len({f.target for f in now}) <= agents - 1  # one agent always untouched


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="duration_s"):
        make_schedule(1, 0.0)
    with pytest.raises(ValueError, match="agents"):
        make_schedule(1, 10.0, agents=1)
