"""Settings of the coordinator core, with the defaults of DESIGN.md §10.

Theory of operation: one frozen ``CoreSettings`` value holds every knob the
decision logic reads. It checks itself when built, including the fencing
arithmetic of DESIGN.md §6: a node agent pauses its tasks by ``s +
fence_after_s`` where ``s`` is the send time of its first heartbeat left
without an ack; that heartbeat was sent at most ``heartbeat_interval_s`` after
the last one the leader received. So the old owner has stopped by ``last
heartbeat + heartbeat_interval_s + fence_after_s``, and the leader may move
its tasks at ``last heartbeat + dead_after_s`` only if that is later:
``heartbeat_interval_s + fence_after_s < dead_after_s`` (0.5 + 2 < 3 at the
defaults, leaving 0.5 s for clock-rate drift and jitter).

The shell maps each field to a flag, a ``LAZARUS_*`` environment variable and
a Helm value; the core never reads the environment.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from coordinator.core.errors import UsageError

__all__ = ["CoreSettings", "DetectorKind"]


class DetectorKind(enum.Enum):
    """Which failure detector judges suspicion."""

    FIXED_TIMEOUT = "fixed"
    PHI_ACCRUAL = "phi"


@dataclass(frozen=True, slots=True)
class CoreSettings:
    """Every setting of the coordinator core; defaults from DESIGN.md §10.

    Attributes:
        heartbeat_interval_s: period node agents heartbeat at (sent in Welcome).
        dead_after_s: silence after which a node is DEAD and its tasks move.
        fence_after_s: agents pause their tasks this long after an unacked
            heartbeat (sent in Welcome); must satisfy
            ``heartbeat_interval_s + fence_after_s < dead_after_s``.
        tick_interval_s: the cadence the shell must call ``tick`` at (at most
            ``heartbeat_interval_s``); a silent node is then DEAD within
            ``dead_after_s + tick_interval_s`` of its last heartbeat.
        detector: FIXED_TIMEOUT or PHI_ACCRUAL (suspicion only; DEAD is always
            ``dead_after_s`` of silence, see ``coordinator.core.detector``).
        suspect_after_intervals: fixed timeout: SUSPECT after more than
            ``heartbeat_interval_s * suspect_after_intervals`` of silence.
        phi_threshold: phi accrual: SUSPECT once phi reaches this (Akka: 8).
        phi_window: phi accrual: inter-arrival samples kept per node.
        phi_min_std_deviation_s: phi accrual: floor of the standard deviation.
        phi_acceptable_pause_s: phi accrual: added to the mean inter-arrival.
        mass_failure_threshold_ratio: the guard engages when more than this
            share of the nodes fails within one window (0..1).
        mass_failure_min_nodes: the guard only judges populations this large.
        mass_failure_window_s: nodes turning DEAD within this window count as
            failing together.
        default_max_attempts: attempts for tasks whose spec says 0.
        release_timeout_s: time a draining owner gets to release a task.
        max_assignments_per_round: placements per step at most (a rate limit;
            the rest follow on the next tick).
        retention_s: time a terminal task (COMPLETED, FAILED, CANCELLED), or a
            DEAD or LEFT node that owns no task, stays in etcd before it moves
            to the Redis archive.
        self_check: run ``check_invariants`` after every step (tests, drills).
        failover_reconnect_s: a new leader gives each node this long beyond
            ``dead_after_s`` to come back before silence counts: a fair
            chance to find it (an agent may have waited out an RPC timeout on
            a frozen old leader and its reconnect backoff). 0: ``dead_after_s``
            alone (the CLI defaults to 7 s).
        progress_flush_interval_s: a Checkpointed update that keeps a RUNNING
            task RUNNING (only its checkpoint, replicated checkpoint and
            replicated journal seq advance; not the record's first checkpoint
            or first replicated one) is applied in memory, acked, and
            written to etcd with every other such record on the first tick at
            least this long after the oldest unwritten one: one transaction
            per interval instead of one per update. What it costs: after a
            leader crash (a graceful stop flushes first: ``ResignRequested``)
            the new leader may load progress up to this much (plus a tick)
            older; it only weakens the DATA_LOSS check of a resume (an older
            acknowledged seq), never raises a false one. State changes are
            written at once. 0: every update is written at once.
    """

    heartbeat_interval_s: float = 0.5
    dead_after_s: float = 3.0
    fence_after_s: float = 2.0
    tick_interval_s: float = 0.1
    detector: DetectorKind = DetectorKind.FIXED_TIMEOUT
    suspect_after_intervals: float = 2.0
    phi_threshold: float = 8.0
    phi_window: int = 100
    phi_min_std_deviation_s: float = 0.1
    phi_acceptable_pause_s: float = 0.0
    mass_failure_threshold_ratio: float = 0.5
    mass_failure_min_nodes: int = 3
    mass_failure_window_s: float = 3.0
    default_max_attempts: int = 3
    release_timeout_s: float = 10.0
    max_assignments_per_round: int = 1000
    retention_s: float = 24 * 3600.0
    self_check: bool = False
    failover_reconnect_s: float = 0.0
    progress_flush_interval_s: float = 1.0

    def __post_init__(self) -> None:
        positive = {
            "heartbeat_interval_s": self.heartbeat_interval_s,
            "dead_after_s": self.dead_after_s,
            "fence_after_s": self.fence_after_s,
            "tick_interval_s": self.tick_interval_s,
            "suspect_after_intervals": self.suspect_after_intervals,
            "phi_threshold": self.phi_threshold,
            "phi_min_std_deviation_s": self.phi_min_std_deviation_s,
            "mass_failure_window_s": self.mass_failure_window_s,
            "release_timeout_s": self.release_timeout_s,
            "retention_s": self.retention_s,
        }
        for name, value in positive.items():
            if not (math.isfinite(value) and value > 0):
                raise UsageError(f"{name}: must be a finite number > 0, got {value!r}")
        if not (math.isfinite(self.phi_acceptable_pause_s) and self.phi_acceptable_pause_s >= 0):
            raise UsageError("phi_acceptable_pause_s: must be a finite number >= 0")
        if self.heartbeat_interval_s + self.fence_after_s >= self.dead_after_s:
            raise UsageError(
                "fence_after_s: heartbeat_interval_s + fence_after_s must be < dead_after_s "
                f"({self.heartbeat_interval_s} + {self.fence_after_s} >= {self.dead_after_s}); "
                "otherwise a cut-off owner may still run when its tasks move"
            )
        if self.heartbeat_interval_s * self.suspect_after_intervals >= self.dead_after_s:
            raise UsageError(
                "suspect_after_intervals: suspicion must come before death "
                "(heartbeat_interval_s * suspect_after_intervals < dead_after_s)"
            )
        if self.tick_interval_s > self.heartbeat_interval_s:
            raise UsageError("tick_interval_s: must be <= heartbeat_interval_s")
        if not 0.0 < self.mass_failure_threshold_ratio < 1.0:
            raise UsageError("mass_failure_threshold_ratio: must be in (0, 1)")
        if self.mass_failure_min_nodes < 1:
            raise UsageError("mass_failure_min_nodes: must be >= 1")
        if self.phi_window < 2:
            raise UsageError("phi_window: must be >= 2")
        if self.default_max_attempts < 1:
            raise UsageError("default_max_attempts: must be >= 1")
        if not (math.isfinite(self.failover_reconnect_s) and self.failover_reconnect_s >= 0):
            raise UsageError("failover_reconnect_s: must be a finite number >= 0")
        if not (
            math.isfinite(self.progress_flush_interval_s) and self.progress_flush_interval_s >= 0
        ):
            raise UsageError("progress_flush_interval_s: must be a finite number >= 0")
        if self.max_assignments_per_round < 1:
            raise UsageError("max_assignments_per_round: must be >= 1")
