"""Admission and overload decisions of a replica: pure, time passed in.

Theory of operation: a leader past its capacity must degrade (defer Hellos,
refuse surplus work with a retry hint) instead of losing its lease or its
nodes. Three small decisions, each a state machine the shell feeds with the
time it read:

- :class:`HelloAdmission` is a token bucket over Session Hellos: a burst of
  ``burst`` Hellos is admitted at once, then ``rate_per_s``; a Hello over the
  rate is told to come back after a delay (``NotLeader`` naming this replica
  with ``retry_after_ms``, which the agent honours without escalating its
  backoff), and the delay spreads the deferred ones over time so they do not
  return together. While the replica is saturated, no Hello is admitted at
  all: its process used ``defer_hellos_above_cpu`` of a core or more over
  the last second, or its event loop lags past ``degraded_after_lag_s``. The
  nodes already attached keep their acks, and newcomers come back later. A
  saturated leader starves its own keepalive thread of the GIL: the heartbeat
  bench's ``--overload`` lost the lease at 3,200-4,400 nodes joining, with
  keepalives timing out while the loop itself showed little lag.
- :class:`SessionCap` / :class:`ConcurrencyCap` count open Sessions and
  orchestrator RPCs in flight; past the cap the shell answers
  RESOURCE_EXHAUSTED.
- :class:`LagGuard` judges how late the leader's event loop runs its
  callbacks: OK, DEGRADED (late, keep leading), or RESIGN once the lag
  reaches ``resign_after_lag_s`` (a known, fast failover rather than acks so
  late every node fences itself while the lease, kept by its own thread, holds).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

__all__ = [
    "DEGRADED_RETRY_S",
    "AdmissionSettings",
    "ConcurrencyCap",
    "HelloAdmission",
    "LagGuard",
    "LagVerdict",
    "SessionCap",
]


DEGRADED_RETRY_S = 1.0
"""Shortest delay a Hello deferred for loop lag is told to wait, seconds."""


class AdmissionError(ValueError):
    """A setting of admission control is out of range."""


@dataclass(frozen=True, slots=True)
class AdmissionSettings:
    """Limits of one replica (each a flag and a ``LAZARUS_*`` variable).

    Attributes:
        hello_rate_per_s: Hellos admitted per second after the burst.
        hello_burst: Hellos admitted at once (bucket size).
        max_sessions: open Session streams at most on this replica.
        max_concurrent_rpcs: orchestrator RPCs served at once at most.
        max_outbound_messages: messages queued for one Session at most; a
            Session whose agent does not read is closed (RESOURCE_EXHAUSTED).
        degraded_after_lag_s: event-loop lag from which the leader reports
            itself degraded (and admits no Hello).
        resign_after_lag_s: event-loop lag from which the leader resigns.
        defer_hellos_above_cpu: CPU the replica's process used over the last
            second, in cores, from which it admits no Hello (a Python process
            with one event loop saturates near 1.0). Off (infinite) here, for
            in-process servers whose process runs other work too; ``lazarus
            coordinator`` sets 0.85 (``--defer-hellos-above-cpu``).
    """

    hello_rate_per_s: float = 500.0
    hello_burst: int = 500
    max_sessions: int = 20_000
    max_concurrent_rpcs: int = 64
    max_outbound_messages: int = 10_000
    degraded_after_lag_s: float = 0.5
    resign_after_lag_s: float = 5.0
    defer_hellos_above_cpu: float = math.inf

    def __post_init__(self) -> None:
        for name in (
            "hello_rate_per_s",
            "degraded_after_lag_s",
            "resign_after_lag_s",
            "defer_hellos_above_cpu",
        ):
            if not getattr(self, name) > 0:
                raise AdmissionError(f"{name} must be positive")
        for name in ("hello_burst", "max_sessions", "max_concurrent_rpcs", "max_outbound_messages"):
            if getattr(self, name) < 1:
                raise AdmissionError(f"{name} must be at least 1")
        if self.degraded_after_lag_s >= self.resign_after_lag_s:
            raise AdmissionError("degraded_after_lag_s must be below resign_after_lag_s")


class HelloAdmission:
    """Token bucket over Hellos.

    Args:
        rate_per_s: tokens added per second.
        burst: bucket size (and initial content).
    """

    def __init__(
        self,
        rate_per_s: float,
        burst: int,
        degraded_after_lag_s: float = math.inf,
        defer_above_cpu: float = math.inf,
    ) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise AdmissionError("rate_per_s must be positive and burst at least 1")
        if not degraded_after_lag_s > 0 or not defer_above_cpu > 0:
            raise AdmissionError("degraded_after_lag_s and defer_above_cpu must be positive")
        self._degraded_after_lag_s = degraded_after_lag_s
        self._defer_above_cpu = defer_above_cpu
        self._rate_per_s = rate_per_s
        self._burst = float(burst)
        self._tokens = float(burst)
        self._last_s = -math.inf
        self._deferred_until_s = -math.inf

    def admit(self, now_s: float, lag_s: float = 0.0, cpu: float = 0.0) -> float:
        """Judge one Hello arriving at ``now_s``.

        Args:
            now_s: the caller's clock, seconds (non-decreasing).
            lag_s: how late the event loop runs its callbacks now, seconds.
            cpu: cores the process used over the last second.

        Returns:
            0.0 when admitted; otherwise the delay in seconds after which the
            agent should come back (deferred Hellos are spread one token
            apart, so they return at the admitted rate). While ``lag_s`` is at
            or past ``degraded_after_lag_s``, or ``cpu`` at or past
            ``defer_above_cpu``, every Hello is deferred, by at least
            :data:`DEGRADED_RETRY_S` or twice the lag.
        """
        if self._last_s != -math.inf:
            elapsed_s = max(0.0, now_s - self._last_s)
            self._tokens = min(self._burst, self._tokens + elapsed_s * self._rate_per_s)
        self._last_s = max(now_s, self._last_s)
        if lag_s >= self._degraded_after_lag_s or cpu >= self._defer_above_cpu:
            slot_s = max(self._deferred_until_s, now_s + max(DEGRADED_RETRY_S, 2.0 * lag_s))
            self._deferred_until_s = slot_s + 1.0 / self._rate_per_s
            return slot_s - now_s
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        # The next free slot after those promised to earlier deferred Hellos.
        slot_s = max(self._deferred_until_s, now_s + (1.0 - self._tokens) / self._rate_per_s)
        self._deferred_until_s = slot_s + 1.0 / self._rate_per_s
        return slot_s - now_s


class ConcurrencyCap:
    """A counter with a ceiling: ``acquire`` says whether one more fits.

    Args:
        limit: most holders at once.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise AdmissionError("limit must be at least 1")
        self.limit = limit
        self.held = 0

    def acquire(self) -> bool:
        """Take a place; False (and nothing taken) when full."""
        if self.held >= self.limit:
            return False
        self.held += 1
        return True

    def release(self) -> None:
        """Give a place back."""
        self.held = max(0, self.held - 1)


SessionCap = ConcurrencyCap
"""Open Sessions of a replica are capped the same way."""


class LagVerdict(enum.Enum):
    """What the leader's event-loop lag means."""

    OK = "ok"
    DEGRADED = "degraded"
    """Late (acks slower, Hellos deferred) but leading."""
    RESIGN = "resign"
    """So late the leader must give up leadership now."""


class LagGuard:
    """Judges event-loop lag samples.

    Args:
        degraded_after_lag_s: lag from which the verdict is DEGRADED.
        resign_after_lag_s: lag from which the verdict is RESIGN.
    """

    def __init__(self, degraded_after_lag_s: float, resign_after_lag_s: float) -> None:
        if not 0 < degraded_after_lag_s < resign_after_lag_s:
            raise AdmissionError("need 0 < degraded_after_lag_s < resign_after_lag_s")
        self._degraded_s = degraded_after_lag_s
        self._resign_s = resign_after_lag_s
        self.worst_lag_s = 0.0

    def observe(self, lag_s: float) -> LagVerdict:
        """Judge one sample: how long the loop has not run a callback posted to it.

        Args:
            lag_s: seconds since the oldest unanswered ping was posted (0: none).

        Returns:
            The verdict.
        """
        self.worst_lag_s = max(self.worst_lag_s, lag_s)
        if lag_s >= self._resign_s:
            return LagVerdict.RESIGN
        if lag_s >= self._degraded_s:
            return LagVerdict.DEGRADED
        return LagVerdict.OK
