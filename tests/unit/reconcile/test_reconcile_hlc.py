"""Hybrid logical clocks: monotonic, causal, bounded drift; the drift guard; encoding."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from reconcile_strategies import examples

from reconcile import ClockDriftError, HLCTimestamp, HybridLogicalClock

T = HLCTimestamp


def test_send_and_receive_follow_the_paper() -> None:
    clock = HybridLogicalClock("a", max_drift_ms=100)
    assert clock.send(10) == T(10, 0)
    assert clock.send(10) == T(10, 1)
    assert clock.send(5) == T(10, 2)  # physical clock stepped back: logical ticks
    assert clock.send(11) == T(11, 0)
    assert clock.receive(T(50, 3), 11) == T(50, 4)  # remote ahead (within drift)
    assert clock.receive(T(50, 9), 20) == T(50, 10)  # same l: max(c) + 1
    assert clock.receive(T(1, 0), 20) == T(50, 11)  # remote behind: our l, c + 1
    assert clock.receive(T(1, 0), 60) == T(60, 0)  # physical time moved past both
    assert clock.peek() == T(60, 0)


def test_the_drift_guard_names_the_field_and_leaves_the_clock_alone() -> None:
    clock = HybridLogicalClock("node-a", max_drift_ms=1_000)
    clock.send(5_000)
    with pytest.raises(ClockDriftError, match=r"remote\.wall_ms=7001 is 2001 ms ahead") as err:
        clock.receive(T(7_001), 5_000)
    assert isinstance(err.value, ValueError)
    assert "max_drift_ms=1000" in str(err.value)
    assert "'node-a'" in str(err.value)
    assert clock.peek() == T(5_000, 0)
    assert clock.receive(T(6_000), 5_000) == T(6_000, 1)  # exactly at the bound: accepted


def test_bad_arguments_name_the_field() -> None:
    clock = HybridLogicalClock("a")
    with pytest.raises(TypeError, match="physical_ms must be int"):
        clock.send(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="physical_ms"):
        clock.send(-1)
    with pytest.raises(TypeError, match="remote must be HLCTimestamp"):
        clock.receive((1, 2), 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="wall_ms"):
        T(-1)
    with pytest.raises(TypeError, match="logical"):
        T(1, "2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_drift_ms"):
        HybridLogicalClock("a", max_drift_ms=-5)


def test_resume_from_a_persisted_timestamp() -> None:
    clock = HybridLogicalClock("a", last=T(100, 7))
    assert clock.send(50) == T(100, 8)
    assert HybridLogicalClock.compare(T(1, 2), T(1, 3)) == -1
    assert T(2, 0).compare(T(1, 9)) == 1
    assert T(2, 0).compare(T(2, 0)) == 0


# A simulated cluster: each node's physical clock is true time plus a skew
# within +-skew_ms; events are local ticks, sends and receives.
events = st.lists(
    st.tuples(
        st.sampled_from(["local", "send", "recv"]),
        st.integers(0, 3),  # node
        st.integers(0, 40),  # true time advance (ms)
        st.integers(0, 20),  # message pick
    ),
    max_size=60,
)


@examples(120)
@given(
    n=st.integers(2, 4),
    skew_ms=st.integers(0, 50),
    skews=st.lists(st.integers(-50, 50), min_size=4, max_size=4),
    script=events,
    backsteps=st.lists(st.integers(0, 30), min_size=4, max_size=4),
)
def test_monotonic_causal_and_bounded(
    n: int,
    skew_ms: int,
    skews: list[int],
    script: list[tuple[str, int, int, int]],
    backsteps: list[int],
) -> None:
    offsets = [max(-skew_ms, min(skew_ms, s)) + 1_000 for s in skews]
    nodes = [HybridLogicalClock(f"n{i}", max_drift_ms=2 * skew_ms) for i in range(n)]
    last = [T(0)] * n
    max_pt = [0] * n
    true_ms = 0
    in_flight: list[tuple[int, HLCTimestamp]] = []
    for kind, who, advance, pick in script:
        true_ms += advance
        p = who % n
        # Physical clocks may step back a little (NTP slew); HLC must not.
        pt = max(0, true_ms + offsets[p] - (backsteps[p] if advance == 0 else 0))
        max_pt[p] = max(max_pt[p], pt)
        if kind == "recv" and in_flight:
            to, sent = in_flight.pop(pick % len(in_flight))
            pt = max(0, true_ms + offsets[to])
            max_pt[to] = max(max_pt[to], pt)
            ts = nodes[to].receive(sent, pt)
            assert ts > sent  # causality: receive after send
            assert ts > last[to]  # monotonic
            last[to] = ts
            p = to
        else:
            ts = nodes[p].send(pt)
            assert ts > last[p]
            last[p] = ts
            if kind == "send":
                in_flight.append(((p + 1 + pick) % n, ts))
        # Bounded: l is always some physical reading taken so far, never
        # below ours, so it is ahead of ours by at most the clocks' spread.
        assert ts.wall_ms >= pt
        assert ts.wall_ms <= max(max_pt)
        assert ts.wall_ms - pt <= 2 * skew_ms + max(backsteps)


@examples(80)
@given(remote=st.integers(0, 10_000), pt=st.integers(0, 10_000), drift=st.integers(0, 5_000))
def test_drift_guard_accepts_exactly_what_is_within_bound(remote: int, pt: int, drift: int) -> None:
    clock = HybridLogicalClock("a", max_drift_ms=drift)
    if remote - pt > drift:
        with pytest.raises(ClockDriftError, match=r"remote\.wall_ms"):
            clock.receive(T(remote), pt)
    else:
        ts = clock.receive(T(remote), pt)
        assert ts.wall_ms - pt <= drift


@examples(100)
@given(wall=st.integers(0, 2**64 - 1), logical=st.integers(0, 2**64 - 1))
def test_timestamp_encoding_round_trips(wall: int, logical: int) -> None:
    ts = T(wall, logical)
    assert T.decode(ts.encode()) == ts


@examples(150)
@given(blob=st.binary(max_size=24))
def test_timestamp_garbage_raises_value_error_only(blob: bytes) -> None:
    try:
        ts = T.decode(blob)
    except ValueError:
        return
    assert ts.encode() == blob
