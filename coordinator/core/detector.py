"""Failure detectors: judge a node ALIVE, SUSPECT or DEAD from its heartbeat arrivals.

Theory of operation: the leader records the arrival time of every heartbeat
(and of the Hello that opened the Session) and, on every tick, asks the
detector for a verdict on each node. Two detectors share one interface:

- ``FixedTimeoutDetector``: SUSPECT after more than ``heartbeat_interval_s *
  suspect_after_intervals`` of silence.
- ``PhiAccrualDetector``: the phi accrual failure detector of Hayashibara,
  Défago, Yared and Katayama, "The φ Accrual Failure Detector" (SRDS 2004;
  JAIST report IS-RR-2004-010). It keeps a window of inter-arrival times and
  outputs a suspicion level ``phi(t) = -log10(1 - F(t))``, where ``t`` is the
  time since the last heartbeat and ``F`` the CDF of the inter-arrival
  distribution. Like Akka's ``PhiAccrualFailureDetector`` (and Cassandra's
  ``FailureDetector``, which uses an exponential distribution instead), ``F``
  is the normal distribution fitted to the window's mean and standard
  deviation, computed with the logistic approximation of the normal CDF
  (Bowling et al., 2009) that Akka uses, with a floor on the standard
  deviation and an acceptable pause added to the mean. SUSPECT when phi
  reaches ``phi_threshold``. The window starts with two samples around the
  expected interval (Akka's first-heartbeat estimate).

DEAD is the same for both: ``dead_after_s`` of silence. That bound is a
contract with the node agents, not an estimate: agents pause their tasks by
``fence_after_s`` after an unacked heartbeat (see
``coordinator.core.settings``), so moving tasks earlier could leave two live
owners, and moving them later only delays recovery (the owner has paused
anyway). Suspicion is where detectors differ; it moves no task.

Both are pure: time is passed in, nothing is read from a clock.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from coordinator.core.errors import UsageError
from coordinator.core.records import SuspicionReason
from coordinator.core.settings import CoreSettings, DetectorKind

__all__ = [
    "FailureDetector",
    "FixedTimeoutDetector",
    "Liveness",
    "PhiAccrualDetector",
    "Verdict",
    "make_detector",
    "phi",
]

_LN10 = math.log(10.0)


class Liveness(enum.Enum):
    """A detector's verdict on one node."""

    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"


@dataclass(frozen=True, slots=True)
class Verdict:
    """Verdict on a node at one moment.

    Attributes:
        liveness: ALIVE, SUSPECT or DEAD.
        silent_s: time since the last heartbeat (or since watching began).
        phi: current phi (0.0 for the fixed timeout).
        reason: why SUSPECT / DEAD (None when ALIVE).
    """

    liveness: Liveness
    silent_s: float
    phi: float
    reason: SuspicionReason | None


def phi(elapsed_s: float, mean_s: float, std_s: float) -> float:
    """Suspicion level -log10(1 - F(elapsed)) for a normal F(mean, std), Akka's approximation.

    Args:
        elapsed_s: time since the last heartbeat, seconds (>= 0).
        mean_s: mean inter-arrival time, seconds (> 0).
        std_s: standard deviation of the inter-arrival time, seconds (> 0).

    Returns:
        phi >= 0; about 1 means a 10 % chance the node is still fine, 8 means 1e-8.
        Computed in log space, so it never overflows to an error for long silences.

    Raises:
        ValueError: ``std_s`` <= 0.
    """
    if std_s <= 0:
        raise ValueError("std_s: must be > 0")
    y = (elapsed_s - mean_s) / std_s
    # Logistic approximation of the normal CDF: 1 - F(y) ~= e / (1 + e),
    # e = exp(-a), a = y * (1.5976 + 0.070566 y^2)  (Bowling et al., 2009).
    a = y * (1.5976 + 0.070566 * y * y)
    if elapsed_s > mean_s:
        # -log10(e / (1 + e)) = (a + log(1 + exp(-a))) / ln 10, with a > 0 here.
        return (a + math.log1p(math.exp(-a))) / _LN10
    # -log10(1 - 1 / (1 + e)) = log10(1 + exp(a)) with a <= 0: no overflow.
    return math.log1p(math.exp(a)) / _LN10


class FailureDetector(Protocol):
    """What the core needs from a failure detector (one instance watches every node)."""

    def watch(self, node_id: str, now_s: float) -> None:
        """Start (or restart) judging a node as if it had been heard at ``now_s``."""

    def heartbeat(self, node_id: str, now_s: float) -> None:
        """Record a heartbeat arrival."""

    def forget(self, node_id: str) -> None:
        """Stop watching a node (it left, or was declared DEAD)."""

    def judge(self, node_id: str, now_s: float) -> Verdict:
        """Verdict on a watched node at ``now_s``."""

    @property
    def alive_within_s(self) -> float | None:
        """A watched node heard at most this long ago is judged ALIVE (None: no
        such bound). The leader's tick skips ``judge`` for those nodes: with
        thousands attached, a verdict per node per tick was its largest cost."""

    def phi(self, node_id: str, now_s: float) -> float:
        """Suspicion level of a watched node (0.0 for detectors without one)."""

    def last_heard_s(self, node_id: str) -> float | None:
        """When the node was last heard (None when not watched)."""

    def mean_interarrival_s(self, node_id: str) -> float | None:
        """Mean heartbeat inter-arrival time in the window (None when unknown)."""


class _SilenceTracker:
    """Last-heard bookkeeping shared by both detectors."""

    __slots__ = ("_dead_after_s", "_last")

    def __init__(self, dead_after_s: float) -> None:
        self._dead_after_s = dead_after_s
        self._last: dict[str, float] = {}

    def last_heard_s(self, node_id: str) -> float | None:
        return self._last.get(node_id)

    def _silence(self, node_id: str, now_s: float) -> float:
        last = self._last.get(node_id)
        if last is None:
            raise UsageError(f"node {node_id!r} is not watched by the failure detector")
        return max(0.0, now_s - last)

    def _dead(self, silent_s: float) -> bool:
        return silent_s >= self._dead_after_s


class FixedTimeoutDetector(_SilenceTracker):
    """SUSPECT after ``heartbeat_interval_s * k`` of silence; DEAD after ``dead_after_s``."""

    __slots__ = ("_interval_s", "_suspect_after_s")

    def __init__(
        self, *, heartbeat_interval_s: float, suspect_after_intervals: float, dead_after_s: float
    ) -> None:
        """Build the detector.

        Args:
            heartbeat_interval_s: expected heartbeat period.
            suspect_after_intervals: k; SUSPECT when silent for more than k periods.
            dead_after_s: DEAD when silent for at least this long.
        """
        super().__init__(dead_after_s)
        self._interval_s = heartbeat_interval_s
        self._suspect_after_s = heartbeat_interval_s * suspect_after_intervals

    def watch(self, node_id: str, now_s: float) -> None:
        """Start judging ``node_id`` as if heard at ``now_s``."""
        self._last[node_id] = now_s

    def heartbeat(self, node_id: str, now_s: float) -> None:
        """Record a heartbeat arrival at ``now_s``."""
        self._last[node_id] = now_s

    def forget(self, node_id: str) -> None:
        """Stop watching ``node_id``."""
        self._last.pop(node_id, None)

    def judge(self, node_id: str, now_s: float) -> Verdict:
        """Verdict at ``now_s``.

        Raises:
            UsageError: the node is not watched.
        """
        silent = self._silence(node_id, now_s)
        if self._dead(silent):
            return Verdict(Liveness.DEAD, silent, 0.0, SuspicionReason.HEARTBEAT_TIMEOUT)
        if silent > self._suspect_after_s:
            return Verdict(Liveness.SUSPECT, silent, 0.0, SuspicionReason.HEARTBEAT_TIMEOUT)
        return Verdict(Liveness.ALIVE, silent, 0.0, None)

    @property
    def alive_within_s(self) -> float | None:
        """The suspicion timeout: a node silent no longer is ALIVE."""
        return self._suspect_after_s

    def phi(self, node_id: str, now_s: float) -> float:
        """Always 0.0: the fixed timeout has no suspicion level."""
        return 0.0

    def mean_interarrival_s(self, node_id: str) -> float | None:
        """The configured interval (this detector keeps no history)."""
        return self._interval_s if node_id in self._last else None


class _Window:
    """Inter-arrival samples with running sums (mean and variance in O(1))."""

    __slots__ = ("_samples", "_sum", "_sum_sq")

    def __init__(self, size: int, first_estimate_s: float) -> None:
        self._samples: deque[float] = deque(maxlen=size)
        self._sum = 0.0
        self._sum_sq = 0.0
        # Akka's bootstrap: two samples at mean -/+ mean/4.
        std = first_estimate_s / 4.0
        self.add(first_estimate_s - std)
        self.add(first_estimate_s + std)

    def add(self, sample_s: float) -> None:
        samples = self._samples
        if len(samples) == samples.maxlen:
            old = samples[0]
            self._sum -= old
            self._sum_sq -= old * old
        samples.append(sample_s)
        self._sum += sample_s
        self._sum_sq += sample_s * sample_s

    @property
    def mean(self) -> float:
        return self._sum / len(self._samples)

    @property
    def std(self) -> float:
        mean = self.mean
        return math.sqrt(max(0.0, self._sum_sq / len(self._samples) - mean * mean))


class PhiAccrualDetector(_SilenceTracker):
    """Phi accrual suspicion (Hayashibara et al., 2004); DEAD after ``dead_after_s``."""

    __slots__ = ("_acceptable_pause_s", "_interval_s", "_min_std_s", "_size", "_threshold", "_win")

    def __init__(
        self,
        *,
        heartbeat_interval_s: float,
        dead_after_s: float,
        threshold: float = 8.0,
        window: int = 100,
        min_std_deviation_s: float = 0.1,
        acceptable_pause_s: float = 0.0,
    ) -> None:
        """Build the detector.

        Args:
            heartbeat_interval_s: expected period; seeds each node's window.
            dead_after_s: DEAD when silent for at least this long.
            threshold: SUSPECT once phi reaches it.
            window: inter-arrival samples kept per node (>= 2).
            min_std_deviation_s: floor of the standard deviation.
            acceptable_pause_s: added to the mean before computing phi.
        """
        super().__init__(dead_after_s)
        self._interval_s = heartbeat_interval_s
        self._threshold = threshold
        self._size = window
        self._min_std_s = min_std_deviation_s
        self._acceptable_pause_s = acceptable_pause_s
        self._win: dict[str, _Window] = {}

    def watch(self, node_id: str, now_s: float) -> None:
        """Start judging ``node_id`` as if heard at ``now_s``; the gap before is no sample."""
        self._last[node_id] = now_s
        if node_id not in self._win:
            self._win[node_id] = _Window(self._size, self._interval_s)

    def heartbeat(self, node_id: str, now_s: float) -> None:
        """Record a heartbeat arrival at ``now_s`` (its inter-arrival joins the window)."""
        last = self._last.get(node_id)
        if last is None:
            self.watch(node_id, now_s)
            return
        self._win[node_id].add(max(0.0, now_s - last))
        self._last[node_id] = now_s

    def forget(self, node_id: str) -> None:
        """Stop watching ``node_id`` and drop its history."""
        self._last.pop(node_id, None)
        self._win.pop(node_id, None)

    def phi(self, node_id: str, now_s: float) -> float:
        """Current phi of a watched node.

        Raises:
            UsageError: the node is not watched.
        """
        silent = self._silence(node_id, now_s)
        win = self._win[node_id]
        return phi(silent, win.mean + self._acceptable_pause_s, max(win.std, self._min_std_s))

    @property
    def alive_within_s(self) -> float | None:
        """None: phi depends on each node's window; every node is judged."""
        return None

    def judge(self, node_id: str, now_s: float) -> Verdict:
        """Verdict at ``now_s``.

        Raises:
            UsageError: the node is not watched.
        """
        silent = self._silence(node_id, now_s)
        level = self.phi(node_id, now_s)
        if self._dead(silent):
            return Verdict(Liveness.DEAD, silent, level, SuspicionReason.PHI_THRESHOLD)
        if level >= self._threshold:
            return Verdict(Liveness.SUSPECT, silent, level, SuspicionReason.PHI_THRESHOLD)
        return Verdict(Liveness.ALIVE, silent, level, None)

    def mean_interarrival_s(self, node_id: str) -> float | None:
        """Mean of the node's window (None when not watched)."""
        win = self._win.get(node_id)
        return None if win is None else win.mean


def make_detector(settings: CoreSettings) -> FailureDetector:
    """Build the detector ``settings.detector`` names, configured from ``settings``.

    Args:
        settings: the core settings.

    Returns:
        A fresh detector watching no node.
    """
    if settings.detector is DetectorKind.PHI_ACCRUAL:
        return PhiAccrualDetector(
            heartbeat_interval_s=settings.heartbeat_interval_s,
            dead_after_s=settings.dead_after_s,
            threshold=settings.phi_threshold,
            window=settings.phi_window,
            min_std_deviation_s=settings.phi_min_std_deviation_s,
            acceptable_pause_s=settings.phi_acceptable_pause_s,
        )
    return FixedTimeoutDetector(
        heartbeat_interval_s=settings.heartbeat_interval_s,
        suspect_after_intervals=settings.suspect_after_intervals,
        dead_after_s=settings.dead_after_s,
    )
