"""Failure detectors on a simulated clock, alone and driven through CoordinatorCore.

Acceptance properties of issue 3 checked here, for both detectors:
- 50 nodes heartbeating every 0.5 s with up to 150 ms of jitter for 60 s are
  never declared DEAD (nor even SUSPECT);
- a node that stops sending is DEAD within dead_after_s + one heartbeat
  interval of its last heartbeat, and never before dead_after_s, for any tick
  cadence up to the heartbeat interval;
- a node whose stream closes is SUSPECT in that very step.
"""

from __future__ import annotations

import itertools
import math
from random import Random

import pytest
from core_harness import Harness, notices_of
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core import (
    CoreSettings,
    DetectorKind,
    FixedTimeoutDetector,
    HeartbeatReceived,
    Liveness,
    NodeState,
    PhiAccrualDetector,
    Tick,
    UsageError,
    make_detector,
)
from coordinator.core import notices as n
from coordinator.core.detector import phi
from coordinator.core.records import SuspicionReason

DETECTORS = [DetectorKind.FIXED_TIMEOUT, DetectorKind.PHI_ACCRUAL]


# -- phi ------------------------------------------------------------------------------


def test_phi_matches_the_normal_tail_near_the_mean() -> None:
    # 1 - Phi(0) = 0.5 -> phi = log10(2); the logistic approximation is exact there.
    assert phi(1.0, 1.0, 0.1) == pytest.approx(math.log10(2), abs=1e-9)
    # One and two standard deviations: 1 - Phi(1) = 0.1587, 1 - Phi(2) = 0.02275.
    assert phi(1.1, 1.0, 0.1) == pytest.approx(-math.log10(0.1587), abs=0.01)
    assert phi(1.2, 1.0, 0.1) == pytest.approx(-math.log10(0.02275), abs=0.02)


def test_phi_grows_with_silence_and_never_overflows() -> None:
    values = [phi(t / 10, 0.5, 0.1) for t in range(0, 400)]
    assert all(b >= a for a, b in itertools.pairwise(values))
    assert phi(0.0, 0.5, 0.1) >= 0.0
    assert math.isfinite(phi(1e6, 0.5, 0.01))
    assert phi(1e6, 0.5, 0.01) > 1e6
    with pytest.raises(ValueError, match="std_s"):
        phi(1.0, 0.5, 0.0)


# -- fixed timeout -----------------------------------------------------------------------


def test_fixed_timeout_verdicts_follow_the_silence() -> None:
    d = FixedTimeoutDetector(heartbeat_interval_s=0.5, suspect_after_intervals=2, dead_after_s=3.0)
    d.watch("a", 10.0)
    assert d.judge("a", 11.0).liveness is Liveness.ALIVE  # silent 1.0 s, not > 1.0
    assert d.judge("a", 11.01).liveness is Liveness.SUSPECT
    assert d.judge("a", 11.01).reason is SuspicionReason.HEARTBEAT_TIMEOUT
    assert d.judge("a", 12.99).liveness is Liveness.SUSPECT
    assert d.judge("a", 13.0).liveness is Liveness.DEAD
    d.heartbeat("a", 12.9)
    assert d.judge("a", 13.0).liveness is Liveness.ALIVE
    assert d.last_heard_s("a") == 12.9
    assert d.phi("a", 13.0) == 0.0
    d.forget("a")
    assert d.last_heard_s("a") is None
    with pytest.raises(UsageError):
        d.judge("a", 14.0)


@given(
    interval=st.floats(0.05, 5.0),
    intervals=st.floats(1.0, 4.0),
    margin=st.floats(0.01, 10.0),
    silent_share=st.floats(0.0, 1.0),
)
def test_fixed_timeout_judges_alive_every_node_heard_within_its_bound(
    interval: float, intervals: float, margin: float, silent_share: float
) -> None:
    # The leader's tick skips judge() below alive_within_s: that must be a verdict of ALIVE.
    dead_after = interval * intervals + margin
    d = FixedTimeoutDetector(
        heartbeat_interval_s=interval, suspect_after_intervals=intervals, dead_after_s=dead_after
    )
    bound = d.alive_within_s
    assert bound is not None
    d.watch("a", 100.0)
    for now in (100.0 + bound * silent_share, 100.0 + bound, 100.0 + bound + 1e-6):
        skipped = now - 100.0 <= bound  # the tick's own test, same float arithmetic
        assert (d.judge("a", now).liveness is Liveness.ALIVE) == skipped


def test_phi_accrual_gives_no_alive_bound() -> None:
    assert PhiAccrualDetector(heartbeat_interval_s=0.5, dead_after_s=3.0).alive_within_s is None


# -- phi accrual ------------------------------------------------------------------------


def test_phi_accrual_learns_the_rhythm() -> None:
    d = PhiAccrualDetector(heartbeat_interval_s=0.5, dead_after_s=3.0, threshold=8.0)
    d.watch("a", 0.0)
    t = 0.0
    for _ in range(50):
        t += 0.5
        d.heartbeat("a", t)
    mean = d.mean_interarrival_s("a")
    assert mean == pytest.approx(0.5, abs=0.01)
    assert d.judge("a", t + 0.5).liveness is Liveness.ALIVE
    assert d.phi("a", t + 0.5) < 1.0
    # With the std floored at 0.1 s, phi reaches 8 near mean + 5.6 std (~1.06 s).
    assert d.judge("a", t + 1.2).liveness is Liveness.SUSPECT
    assert d.judge("a", t + 1.2).reason is SuspicionReason.PHI_THRESHOLD
    assert d.judge("a", t + 3.0).liveness is Liveness.DEAD


def test_phi_accrual_is_lenient_with_an_irregular_node() -> None:
    regular = PhiAccrualDetector(heartbeat_interval_s=0.5, dead_after_s=3.0)
    irregular = PhiAccrualDetector(heartbeat_interval_s=0.5, dead_after_s=3.0)
    rng = Random(4)
    regular.watch("a", 0.0)
    irregular.watch("a", 0.0)
    t1 = t2 = 0.0
    for _ in range(100):
        t1 += 0.5
        t2 += rng.uniform(0.1, 1.4)
        regular.heartbeat("a", t1)
        irregular.heartbeat("a", t2)
    assert regular.judge("a", t1 + 1.5).liveness is Liveness.SUSPECT
    assert irregular.judge("a", t2 + 1.5).liveness is Liveness.ALIVE


def test_watch_does_not_count_the_reconnect_gap_as_a_sample() -> None:
    d = PhiAccrualDetector(heartbeat_interval_s=0.5, dead_after_s=3.0)
    d.watch("a", 0.0)
    for i in range(1, 20):
        d.heartbeat("a", i * 0.5)
    before = d.mean_interarrival_s("a")
    d.watch("a", 100.0)  # a new Session after a long absence
    d.heartbeat("a", 100.5)
    assert d.mean_interarrival_s("a") == pytest.approx(before, abs=0.01)


def test_make_detector_follows_the_settings() -> None:
    assert isinstance(make_detector(CoreSettings()), FixedTimeoutDetector)
    phi_settings = CoreSettings(detector=DetectorKind.PHI_ACCRUAL)
    assert isinstance(make_detector(phi_settings), PhiAccrualDetector)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("fence_after_s", 2.6, "fence_after_s"),
        ("dead_after_s", 2.0, "fence_after_s"),
        ("tick_interval_s", 0.6, "tick_interval_s"),
        ("heartbeat_interval_s", -1.0, "heartbeat_interval_s"),
        ("mass_failure_threshold_ratio", 1.0, "mass_failure_threshold_ratio"),
        ("suspect_after_intervals", 6.0, "suspect_after_intervals"),
    ],
)
def test_settings_refuse_unsafe_values(field: str, value: float, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        CoreSettings(**{field: value})  # type: ignore[arg-type]


# -- through the core --------------------------------------------------------------------


@pytest.mark.parametrize("detector", DETECTORS)
@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**32), jitter_s=st.floats(0.0, 0.15))
def test_fifty_jittery_nodes_for_a_minute_are_never_declared_dead(
    detector: DetectorKind, seed: int, jitter_s: float
) -> None:
    rng = Random(seed)
    core_settings = CoreSettings(detector=detector)
    h = Harness(core_settings)
    h.lead()
    nodes = [f"n{i:02d}" for i in range(50)]
    # Each node heartbeats at its own phase; each arrival is off by up to +-jitter.
    arrivals: list[tuple[float, str]] = []
    for node in nodes:
        phase = rng.uniform(0.0, 0.5)
        arrivals += [(phase + k * 0.5 + rng.uniform(-jitter_s, jitter_s), node) for k in range(121)]
    arrivals = sorted(a for a in arrivals if a[0] > 0.0)
    for node in nodes:
        h.hello(node)
    t_tick = 0.0
    commands = []
    for when, node in arrivals:
        while t_tick + 0.1 <= when:
            t_tick = round(t_tick + 0.1, 9)
            h.at(t_tick)
            commands += h.tick()
        h.at(when)
        commands += h.heartbeat(node)
    assert h.now > 60.0
    assert notices_of(commands, n.NodeDead) == []
    assert notices_of(commands, n.NodeSuspected) == []
    assert all(v.record.state is NodeState.ALIVE for v in h.core.snapshot().nodes)


@pytest.mark.parametrize("detector", DETECTORS)
@settings(max_examples=12, deadline=None)
@given(
    cadence_s=st.sampled_from([0.02, 0.1, 0.25, 0.5]),
    stop_after_s=st.floats(3.0, 20.0),
    jitter_s=st.floats(0.0, 0.15),
    seed=st.integers(0, 2**16),
)
def test_a_silent_node_is_dead_within_dead_after_plus_one_interval(
    detector: DetectorKind, cadence_s: float, stop_after_s: float, jitter_s: float, seed: int
) -> None:
    core_settings = CoreSettings(detector=detector, tick_interval_s=cadence_s)
    rng = Random(seed)
    h = Harness(core_settings)
    h.lead()
    h.hello("quiet")
    h.hello("steady")
    last_heartbeat = 0.0
    dead_at: float | None = None
    next_quiet = 0.5 + rng.uniform(-jitter_s, jitter_s)
    t = 0.0
    while dead_at is None and t < stop_after_s + 10.0:
        t = round(t + cadence_s, 9)
        while next_quiet <= t and next_quiet < stop_after_s:
            h.at(max(h.now, next_quiet))
            h.heartbeat("quiet")
            last_heartbeat = h.now
            next_quiet += 0.5 + rng.uniform(-jitter_s, jitter_s) * 0.5
        h.at(t)
        h.heartbeat("steady")
        if notices_of(h.tick(), n.NodeDead):
            dead_at = t
    assert dead_at is not None
    silence = dead_at - last_heartbeat
    dead_after = core_settings.dead_after_s
    assert dead_after <= silence <= dead_after + core_settings.heartbeat_interval_s
    assert silence <= dead_after + cadence_s + 1e-9


@pytest.mark.parametrize("detector", DETECTORS)
def test_a_closed_stream_is_suspect_at_once(detector: DetectorKind) -> None:
    h = Harness(CoreSettings(detector=detector, self_check=True))
    h.lead()
    h.hello("a")
    h.at(0.2).heartbeat("a")
    commands = h.at(0.25).close("a")
    suspected = notices_of(commands, n.NodeSuspected)
    assert [s.reason for s in suspected] == [SuspicionReason.STREAM_CLOSED]
    view = h.core.node("a")
    assert view is not None
    assert view.record.state is NodeState.SUSPECT
    assert not view.connected


def test_grace_after_a_leader_change_gives_every_node_a_full_dead_after() -> None:
    h = Harness(now_s=100.0)
    h.lead(nodes=[h_record("a"), h_record("b")])
    # Nobody reconnects: no verdict before 103.0, both DEAD at the first tick at or after it.
    early = h.run_until(102.9)
    assert notices_of(early, n.NodeSuspected) == []
    assert notices_of(early, n.NodeDead) == []
    late = h.run_until(103.0)
    assert sorted(d.node_id for d in notices_of(late, n.NodeDead)) == ["a", "b"]


def test_a_heartbeat_revives_a_suspect_node() -> None:
    h = Harness()
    h.lead()
    h.hello("a")
    h.run_until(4.0, heartbeating=["a"])  # past the new-leader grace
    assert notices_of(h.run_until(5.0), n.NodeSuspected) == []  # silent 1.0 s: not > 1.0
    suspected = h.run_until(5.1)
    assert [s.node_id for s in notices_of(suspected, n.NodeSuspected)] == ["a"]
    commands = h.at(5.25).heartbeat("a")
    recovered = notices_of(commands, n.NodeRecovered)
    assert [(r.node_id, r.previous_state) for r in recovered] == [("a", NodeState.SUSPECT)]
    assert recovered[0].unavailable_s == pytest.approx(0.15, abs=1e-6)


def test_ticks_are_harmless_for_a_follower_and_time_never_goes_back() -> None:
    h = Harness()
    assert h.step(Tick(5.0)) == []
    with pytest.raises(UsageError, match="not leading"):
        h.step(HeartbeatReceived("s", "a", 1, 5.0))
    with pytest.raises(UsageError, match="backwards"):
        h.step(Tick(4.0))


def h_record(node_id: str) -> object:
    from coordinator.core import NodeRecord

    return NodeRecord(node_id=node_id, incarnation=f"{node_id}#1")
