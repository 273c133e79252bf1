"""Leader election on etcd, compatible with etcd's Go ``concurrency.Election``.

Theory of operation
-------------------
A campaigner holds a *session*: an etcd lease of ``ttl_s`` seconds that a
background task keeps alive (one keepalive every ``ttl_s / 6``). To campaign it
puts the key ``<prefix>/<lease id in lowercase hex>`` (Go's ``%x``), holding its
value (the advertised address), under that lease — in one transaction that
puts only while the key does not exist (``create_revision == 0``) and otherwise
reads it back, so a campaign after an interrupted one reuses its key. The key's
create revision is the campaigner's *term*.

The leader is the key under ``<prefix>/`` with the lowest create revision. A
campaigner whose key is not the lowest waits for the deletion of the key with
the greatest create revision below its own — its predecessor only, so the exit
of a leader wakes one waiter, not the herd — then looks again, until no older
key is left. Then it leads and :meth:`Election.campaign` returns a
:class:`Leadership`. Go programs using ``concurrency.Election`` and ``etcdctl
elect`` read and write the same layout: ``etcdctl elect --listen <prefix>``
prints our leader, and a Go campaigner queues behind ours (and ours behind it).

Every write a leader makes is fenced by its term (:class:`Fence`, used by
``coordinator.etcd_store``): a transaction comparing the create revision of the
election key, so etcd itself refuses a deposed leader's writes.

This module reports facts — leadership acquired (``campaign`` returns), lost
(``Leadership.lost()`` returns a :class:`LossReason`) — and decides nothing:
stepping down is the caller's move.

Leadership loss
---------------
A :class:`Leadership` is lost at the first of:

* its key is deleted (we watch it): someone deleted it, or etcd revoked or
  expired the lease → ``KEY_DELETED``;
* a keepalive answers that the lease no longer exists → ``LEASE_EXPIRED``;
* no keepalive succeeded before the lease could have expired →
  ``LEASE_DEADLINE_PASSED`` (connection loss, below; also when the keepalive
  thread cannot make or connect its own client in that time);
* the keepalive thread ended on an unexpected error → ``KEEPALIVE_STOPPED``;
* a compare on the term failed (``proclaim``, or a fenced write reported by the
  caller through :meth:`Leadership.report_fence_rejected`) → ``FENCE_REJECTED``;
* ``resign()`` or ``close()`` → ``RESIGNED``.

Reaction to connection loss
---------------------------
The keepalive task keeps a *lease deadline*: the send time of the last
keepalive etcd answered plus the TTL it granted, shortened for clock-rate
drift: ``sent + ttl * (1 - rho) / (1 + rho)`` with ``rho`` =
:data:`LEASE_CLOCK_DRIFT` (:func:`coordinator.core.fanin.safe_lease_deadline`;
the proof is in ``docs/fan-in.md``). etcd extended the lease when it received
that request, which is no earlier than we sent it, and ``ttl`` seconds of
etcd's clock last at least as long as that many of ours, so the local deadline
passes before etcd's own expiry: a leader cut off from etcd reports
``LEASE_DEADLINE_PASSED`` before etcd can delete its key and let another
campaigner lead (etcd also renews every lease when its own raft leader
changes, which only moves its expiry later). Until the deadline a failed or
hung keepalive is retried every :data:`RETRY_INTERVAL_S`, and so is the
keepalive thread's setup of its own client (``client_factory()`` and
``connect()``: an unreadable TLS file, an auth call timing out in an etcd
flap) and a keepalive loop that failed. The session also holds a timer on the
caller's event loop at the lease deadline, a backstop that reports
``LEASE_DEADLINE_PASSED`` even when the keepalive itself is stuck. Watches (our key,
``observe``, the predecessor wait) start again from a fresh read after any
stream error or compaction. A
campaign still waiting when its session is lost raises :class:`LeadershipLost`;
a new campaign grants a new lease. The aetcd client's gRPC channel reconnects
by itself; close the :class:`Election` before the client, or its loops would
reopen it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, Self

import aetcd
import aetcd.utils

from coordinator.aetcd_compat import cancel_watch, open_watch, stop_task
from coordinator.core.admission import LagGuard, LagVerdict
from coordinator.core.fanin import safe_lease_deadline

__all__ = [
    "DEFAULT_TTL_S",
    "KEEPALIVES_PER_TTL",
    "KEEPALIVE_ATTEMPT_TIMEOUT_S",
    "LAG_SAMPLE_INTERVAL_S",
    "LEASE_CLOCK_DRIFT",
    "RETRY_INTERVAL_S",
    "Election",
    "ElectionError",
    "Fence",
    "KeepaliveThread",
    "Leader",
    "Leadership",
    "LeadershipLost",
    "LossReason",
    "NotLeader",
    "election_key",
]

LEASE_CLOCK_DRIFT = 0.001
"""Bound on the clock-rate difference between a coordinator's host and etcd's (0.1 %).

The lease deadline is shortened by it (6 ms of a 3 s TTL), so that a leader's
authority ends before etcd can expire the lease even when the two monotonic
clocks run at different rates within this bound. Linux slews CLOCK_MONOTONIC
by at most 500 ppm for NTP, and a crystal's own error is of the order of
100 ppm, so 0.1 % holds with room. A larger bound costs lease margin during an
etcd raft election (``tests/integration/test_etcd_endpoints.py`` runs on the
3 s TTL with about 2.5 s to spare)."""

DEFAULT_TTL_S = 3
"""Lease TTL of a campaigner (DESIGN.md §10: election lease 3 s)."""

KEEPALIVES_PER_TTL = 6
"""Keepalives sent per TTL (every ``ttl_s / 6``; Go's client sends every ``ttl_s / 3``).

When the etcd member that is raft leader dies, no lease request is answered
until the others elect a new one (about 1-2 s with the 1 s election timeout).
At ``ttl_s / 3`` a leader could enter that gap with only 2 s of its 3 s lease
left and lose it (seen in the etcd-member-loss drill: a failover of 5.2 s for
the loss of one member of three); at ``ttl_s / 6`` at least 2.5 s remain."""

KEEPALIVE_ATTEMPT_TIMEOUT_S = 0.75
"""Longest one keepalive request waits before it is abandoned and sent again."""

RETRY_INTERVAL_S = 0.2
"""Pause before retrying a failed keepalive, read or watch."""

CLEANUP_TIMEOUT_S = 2.0
"""Bound on best-effort cleanup calls (revoke, delete) made while giving up."""

LAG_SAMPLE_INTERVAL_S = 0.1
"""How often the keepalive thread measures the event loop's lag."""

_log = logging.getLogger(__name__)


def election_key(prefix: str, lease_id: int) -> str:
    """Return the election key of a lease, as Go's ``fmt.Sprintf("%s/%x", prefix, lease)``.

    Args:
        prefix: the election prefix, e.g. ``"/lazarus/prod/election"``.
        lease_id: the etcd lease id (int64).

    Returns:
        ``"<prefix>/<lease id in lowercase hex>"``.
    """
    return f"{prefix}/{lease_id:x}"


class LossReason(enum.Enum):
    """Why a leadership (or a campaign's session) ended."""

    KEY_DELETED = "key_deleted"
    """The election key was deleted: by someone, or by etcd revoking or expiring the lease."""
    LEASE_EXPIRED = "lease_expired"
    """A keepalive answered that the lease does not exist any more."""
    LEASE_DEADLINE_PASSED = "lease_deadline_passed"
    """No keepalive succeeded before the lease could have expired (etcd unreachable)."""
    FENCE_REJECTED = "fence_rejected"
    """A transaction comparing the term failed: the key is gone or is another campaign's."""
    RESIGNED = "resigned"
    """We resigned or closed the election."""
    LOOP_LAGGED = "loop_lagged"
    """The event loop lagged past the lag guard's bound: the lease was revoked (resigned)."""
    KEEPALIVE_STOPPED = "keepalive_stopped"
    """The keepalive thread ended on an unexpected error: nothing renews the lease any more."""


class ElectionError(Exception):
    """Base class of the errors this module raises.

    Attributes:
        grpc_code: name of the ``grpc.StatusCode`` this error maps to.
    """

    grpc_code: str = "INTERNAL"


class LeadershipLost(ElectionError):
    """We are not (or no longer) the leader; the caller steps down (maps to UNAVAILABLE).

    Attributes:
        key: the election key that was ours.
        term: its create revision while it was ours.
        reason: why, when known.
    """

    grpc_code = "UNAVAILABLE"

    def __init__(self, key: str, term: int, reason: LossReason | None, detail: str = "") -> None:
        self.key = key
        self.term = term
        self.reason = reason
        why = reason.value if reason is not None else "unknown"
        super().__init__(
            f"leadership of term {term} ({key}) lost: {why}" + (f"; {detail}" if detail else "")
        )


class NotLeader(ElectionError):
    """A leader-only verb was called without a won campaign (maps to FAILED_PRECONDITION)."""

    grpc_code = "FAILED_PRECONDITION"


@dataclass(frozen=True, slots=True)
class Fence:
    """What a fenced write compares: ``create_revision(key) == term``.

    Attributes:
        key: the leader's election key, as stored in etcd.
        term: its create revision.
    """

    key: bytes
    term: int


@dataclass(frozen=True, slots=True)
class Leader:
    """The leader as read from etcd.

    Attributes:
        key: its election key, ``<prefix>/<lease id hex>``.
        value: its value, the advertised address (UTF-8; undecodable bytes replaced).
        term: the key's create revision.
        lease_id: the lease the key lives under.
    """

    key: str
    value: str
    term: int
    lease_id: int

    @classmethod
    def from_kv(cls, kv: Any) -> Leader:
        """Build from an aetcd ``KeyValue``.

        Args:
            kv: an ``aetcd.KeyValue`` of an election key.

        Returns:
            The leader it describes.
        """
        return cls(
            key=bytes(kv.key).decode(errors="replace"),
            value=bytes(kv.value).decode(errors="replace"),
            term=int(kv.create_revision),
            lease_id=int(kv.lease),
        )


class Leadership:
    """A won campaign: its key, lease and term, and the fact of its loss.

    Created by :meth:`Election.campaign`. ``lost()`` returns once the
    leadership is over (see the module docstring for when); it never comes back.
    """

    def __init__(self, key: str, lease_id: int, term: int, value: str) -> None:
        self._key = key
        self._lease_id = lease_id
        self._term = term
        self._value = value
        self._since_revision = 0
        self._reason: LossReason | None = None
        self._lost: asyncio.Future[LossReason] = asyncio.get_running_loop().create_future()
        self._won_at_s = time.monotonic()

    def __repr__(self) -> str:
        state = self._reason.value if self._reason is not None else "leading"
        return f"Leadership(key={self._key!r}, term={self._term}, {state})"

    @property
    def key(self) -> str:
        """The election key, ``<prefix>/<lease id hex>``."""
        return self._key

    @property
    def lease_id(self) -> int:
        """The lease the key lives under."""
        return self._lease_id

    @property
    def term(self) -> int:
        """The key's create revision: the fencing token of every leader write."""
        return self._term

    @property
    def since_revision(self) -> int:
        """An etcd revision at which this campaigner already led (the read that confirmed it).

        The term is older: a campaigner's key is created when it starts
        waiting. Every write of an earlier leader has a lower mod revision
        than this one (its key was gone by then).
        """
        return self._since_revision

    @property
    def value(self) -> str:
        """The value last stored in the key (campaign or proclaim)."""
        return self._value

    @property
    def fence(self) -> Fence:
        """The compare every fenced write carries."""
        return Fence(self._key.encode(), self._term)

    @property
    def is_lost(self) -> bool:
        """True once the leadership is over."""
        return self._reason is not None

    @property
    def reason(self) -> LossReason | None:
        """Why it was lost, or None while it lasts."""
        return self._reason

    async def lost(self) -> LossReason:
        """Wait until the leadership is lost.

        Returns:
            Why it was lost.
        """
        return await asyncio.shield(self._lost)

    def report_fence_rejected(self) -> None:
        """Record that a write fenced by this leadership's term was refused by etcd.

        ``coordinator.etcd_store`` raises its own error for the refused write;
        callers report it here so every waiter on ``lost()`` learns at once.
        """
        self._lose(LossReason.FENCE_REJECTED)

    def _lose(self, reason: LossReason) -> None:
        if self._reason is not None:
            return
        self._reason = reason
        self._lost.set_result(reason)
        held_s = time.monotonic() - self._won_at_s
        _log.warning(
            "leadership lost: key=%s term=%d reason=%s held_s=%.3f",
            self._key,
            self._term,
            reason.value,
            held_s,
        )


class _Session:
    """A lease and the task that keeps it alive until it is closed or lost."""

    def __init__(
        self,
        client: aetcd.Client,
        lease_id: int,
        ttl_s: int,
        deadline_s: float,
        on_lost: Callable[[LossReason], None],
        keepalive: KeepaliveThread | None = None,
    ) -> None:
        self.client = client
        self.lease_id = lease_id
        self.ttl_s = ttl_s
        self.lost_reason: LossReason | None = None
        self.lost_event = asyncio.Event()
        self._deadline_s = deadline_s
        self._on_lost = on_lost
        self._closed = False
        self._thread: _KeepaliveThreadRun | None = None
        self._task: asyncio.Task[None] | None = None
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._check_deadline()
        if keepalive is None:
            self._task = asyncio.create_task(self._keepalive(), name=f"etcd-keepalive-{lease_id:x}")
        else:
            self._thread = _KeepaliveThreadRun(self, keepalive, asyncio.get_running_loop())
            self._thread.start()

    @classmethod
    async def grant(
        cls,
        client: aetcd.Client,
        ttl_s: int,
        on_lost: Callable[[LossReason], None],
        keepalive: KeepaliveThread | None = None,
    ) -> _Session:
        sent_s = time.monotonic()
        lease = await client.lease(ttl_s)
        granted_ttl_s = int(lease.ttl)
        deadline_s = safe_lease_deadline(sent_s, granted_ttl_s, LEASE_CLOCK_DRIFT)
        return cls(client, int(lease.id), granted_ttl_s, deadline_s, on_lost, keepalive)

    @property
    def lag_s(self) -> float:
        """The event loop's lag last measured by the keepalive thread (0 without one)."""
        return self._thread.lag_s if self._thread is not None else 0.0

    @property
    def alive(self) -> bool:
        return self.lost_reason is None and not self._closed

    async def _keepalive(self) -> None:
        interval_s = self.ttl_s / KEEPALIVES_PER_TTL
        failures = 0
        while True:
            sent_s = time.monotonic()
            remaining_s = self._deadline_s - sent_s
            if remaining_s <= 0:
                self._lose(LossReason.LEASE_DEADLINE_PASSED)
                return
            try:
                async with asyncio.timeout(min(KEEPALIVE_ATTEMPT_TIMEOUT_S, remaining_s)):
                    reply = await self.client.refresh_lease(self.lease_id)
            except Exception as exc:
                failures += 1
                if failures == 1:
                    _log.warning(
                        "lease %x keepalive failed (%r); retrying until the lease deadline "
                        "in %.2f s",
                        self.lease_id,
                        exc,
                        self._deadline_s - time.monotonic(),
                    )
                pause_s = min(RETRY_INTERVAL_S, self._deadline_s - time.monotonic())
                await asyncio.sleep(max(0.0, pause_s))
                continue
            granted_ttl_s = int(reply.TTL) if reply is not None else 0
            if granted_ttl_s <= 0:
                self._lose(LossReason.LEASE_EXPIRED)
                return
            if failures:
                _log.info("lease %x keepalive back after %d failures", self.lease_id, failures)
                failures = 0
            self._deadline_s = safe_lease_deadline(sent_s, granted_ttl_s, LEASE_CLOCK_DRIFT)
            await asyncio.sleep(interval_s)

    def _check_deadline(self) -> None:
        """Lose the session once its lease deadline passed; else look again at the deadline.

        A backstop on the caller's loop: the keepalive reports the deadline
        itself, but a keepalive that is stuck or gone (a thread hung in its
        client's setup) must not leave the session alive past it. The
        keepalive moves ``_deadline_s`` later; each firing re-arms at the
        current one, so this costs one timer per lease TTL.
        """
        self._deadline_timer = None
        if not self.alive:
            return
        remaining_s = self._deadline_s - time.monotonic()
        if remaining_s <= 0:
            self._lose(LossReason.LEASE_DEADLINE_PASSED)
            return
        self._deadline_timer = asyncio.get_running_loop().call_later(
            remaining_s, self._check_deadline
        )

    def _lose(self, reason: LossReason) -> None:
        if self.lost_reason is not None or self._closed:
            return
        self.lost_reason = reason
        self.lost_event.set()
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        _log.warning("lease %x lost: %s", self.lease_id, reason.value)
        self._on_lost(reason)

    async def close(self, *, revoke: bool) -> None:
        """Stop the keepalive; with ``revoke``, revoke the lease (deleting its keys) at once.

        A campaign still waiting on this session is woken (``RESIGNED``).
        """
        was_lost = self.lost_reason is not None
        self._closed = True
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        if not was_lost:
            self.lost_reason = LossReason.RESIGNED
            self.lost_event.set()
        if self._task is not None:
            await stop_task(self._task)
        if self._thread is not None:
            await self._thread.stop()
        if not revoke or was_lost:
            return
        try:
            async with asyncio.timeout(CLEANUP_TIMEOUT_S):
                await self.client.revoke_lease(self.lease_id)
        except Exception as exc:
            _log.warning(
                "revoking lease %x failed (%r); it expires within %d s",
                self.lease_id,
                exc,
                self.ttl_s,
            )


@dataclass(frozen=True, slots=True)
class KeepaliveThread:
    """Run a lease's keepalive on its own thread and event loop, with a lag guard.

    A saturated event loop (a flood of Hellos or reads, a long step) cannot
    then starve the keepalive: the lease outlives any lag below the guard's
    bound, and a lag past it revokes the lease from the thread (a clean,
    fast failover, ``LOOP_LAGGED``) even while the loop itself cannot run.

    Attributes:
        client_factory: makes an unconnected etcd client for the thread (its
            own gRPC channel; the same endpoints and credentials).
        degraded_after_lag_s: lag from which the leader is reported degraded.
        resign_after_lag_s: lag from which the lease is revoked.
    """

    client_factory: Callable[[], aetcd.Client]
    degraded_after_lag_s: float = 0.5
    resign_after_lag_s: float = 5.0


class _KeepaliveThreadRun:
    """One session's keepalive thread (see :class:`KeepaliveThread`)."""

    def __init__(
        self, session: _Session, spec: KeepaliveThread, main_loop: asyncio.AbstractEventLoop
    ) -> None:
        self._session = session
        self._spec = spec
        self._main_loop = main_loop
        self._guard = LagGuard(spec.degraded_after_lag_s, spec.resign_after_lag_s)
        self._stopping = threading.Event()
        self._ping_posted_s: float | None = None
        self.lag_s = 0.0
        self._degraded = False
        self._thread = threading.Thread(
            target=self._run, name=f"etcd-keepalive-{session.lease_id:x}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    async def stop(self) -> None:
        self._stopping.set()
        await asyncio.to_thread(self._thread.join, CLEANUP_TIMEOUT_S + 1.0)

    # ---------------------------------------------------------------- in the thread

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception as exc:
            _log.error("lease %x keepalive thread failed: %r", self._session.lease_id, exc)
        finally:
            if not self._stopping.is_set():
                # However the thread ends, nothing renews the lease after it:
                # say so. A loss the thread reported before wins (first report).
                self._report(LossReason.KEEPALIVE_STOPPED)

    async def _main(self) -> None:
        """Keep the lease alive until stopped or lost, setting up the client again as needed.

        Making or connecting the client (``client_factory()``, ``connect()``:
        an unreadable TLS file, an auth call timing out while etcd flaps) and
        a keepalive loop that raised are retried like a failed keepalive:
        every :data:`RETRY_INTERVAL_S` until the lease deadline, which then
        is reported (``LEASE_DEADLINE_PASSED``).
        """
        session = self._session
        failures = 0
        while not self._stopping.is_set():
            remaining_s = session._deadline_s - time.monotonic()
            if remaining_s <= 0:
                self._report(LossReason.LEASE_DEADLINE_PASSED)
                return
            client: aetcd.Client | None = None
            try:
                client = self._spec.client_factory()
                async with asyncio.timeout(remaining_s):
                    await client.connect()
                failures = 0
                if await self._serve(client):
                    return
            except Exception as exc:
                failures += 1
                if failures == 1:
                    _log.warning(
                        "lease %x keepalive thread cannot set up its etcd client (%r); "
                        "retrying until the lease deadline in %.2f s",
                        session.lease_id,
                        exc,
                        session._deadline_s - time.monotonic(),
                    )
            finally:
                if client is not None:
                    with contextlib.suppress(Exception):
                        await client.close()
            pause_s = min(RETRY_INTERVAL_S, session._deadline_s - time.monotonic())
            await asyncio.sleep(max(0.0, pause_s))

    async def _serve(self, client: aetcd.Client) -> bool:
        """Run the keepalive and lag loops on ``client``.

        Returns:
            True once stopped or a loop reported the session lost; False when
            a loop raised (logged), so the caller sets a client up again.
        """
        jobs = [
            asyncio.create_task(self._keepalive(client)),
            asyncio.create_task(self._watch_lag(client)),
        ]
        try:
            while not self._stopping.is_set() and not any(j.done() for j in jobs):
                await asyncio.sleep(LAG_SAMPLE_INTERVAL_S / 2)
        finally:
            for job in jobs:
                job.cancel()
            results = await asyncio.gather(*jobs, return_exceptions=True)
        failed = [r for r in results if isinstance(r, Exception)]
        if failed and not self._stopping.is_set():
            _log.error(
                "lease %x keepalive loop failed (%r); starting it again",
                self._session.lease_id,
                failed[0],
            )
            return False
        return True

    def _report(self, reason: LossReason) -> None:
        with contextlib.suppress(RuntimeError):  # the main loop is closed: nobody to tell
            self._main_loop.call_soon_threadsafe(self._session._lose, reason)

    def _pong(self) -> None:
        self._ping_posted_s = None

    async def _keepalive(self, client: aetcd.Client) -> None:
        session = self._session
        interval_s = session.ttl_s / KEEPALIVES_PER_TTL
        failures = 0
        while not self._stopping.is_set():
            sent_s = time.monotonic()
            remaining_s = session._deadline_s - sent_s
            if remaining_s <= 0:
                self._report(LossReason.LEASE_DEADLINE_PASSED)
                return
            try:
                async with asyncio.timeout(min(KEEPALIVE_ATTEMPT_TIMEOUT_S, remaining_s)):
                    reply = await client.refresh_lease(session.lease_id)
            except Exception as exc:
                failures += 1
                if failures == 1:
                    _log.warning(
                        "lease %x keepalive failed (%r); retrying until the lease deadline "
                        "in %.2f s",
                        session.lease_id,
                        exc,
                        session._deadline_s - time.monotonic(),
                    )
                pause_s = min(RETRY_INTERVAL_S, session._deadline_s - time.monotonic())
                await asyncio.sleep(max(0.0, pause_s))
                continue
            granted_ttl_s = int(reply.TTL) if reply is not None else 0
            if granted_ttl_s <= 0:
                self._report(LossReason.LEASE_EXPIRED)
                return
            if failures:
                _log.info("lease %x keepalive back after %d failures", session.lease_id, failures)
                failures = 0
            session._deadline_s = safe_lease_deadline(sent_s, granted_ttl_s, LEASE_CLOCK_DRIFT)
            await asyncio.sleep(interval_s)

    async def _watch_lag(self, client: aetcd.Client) -> None:
        session = self._session
        while not self._stopping.is_set():
            now_s = time.monotonic()
            if self._ping_posted_s is None:
                self._ping_posted_s = now_s
                with contextlib.suppress(RuntimeError):
                    self._main_loop.call_soon_threadsafe(self._pong)
            posted_s = self._ping_posted_s
            self.lag_s = 0.0 if posted_s is None else max(0.0, now_s - posted_s)
            verdict = self._guard.observe(self.lag_s)
            if verdict is LagVerdict.RESIGN:
                _log.error(
                    "lease %x: the event loop lags %.2f s (bound %.2f s); revoking the lease",
                    session.lease_id,
                    self.lag_s,
                    self._spec.resign_after_lag_s,
                )
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(CLEANUP_TIMEOUT_S):
                        await client.revoke_lease(session.lease_id)
                self._report(LossReason.LOOP_LAGGED)
                return
            degraded = verdict is LagVerdict.DEGRADED
            if degraded != self._degraded:
                self._degraded = degraded
                _log.warning(
                    "lease %x: event loop %s (lag %.2f s)",
                    session.lease_id,
                    "degraded" if degraded else "back to normal",
                    self.lag_s,
                )
            await asyncio.sleep(LAG_SAMPLE_INTERVAL_S)


class Election:
    """One campaigner in the election under ``prefix``; the verbs of Go's ``concurrency.Election``.

    Args:
        client: a connected (or connectable) ``aetcd.Client``. Its ``timeout``
            bounds each unary call; close this election before the client.
        prefix: the election prefix, e.g. ``"/lazarus/prod/election"``; the
            same string ``etcdctl elect`` is given. Keys are ``<prefix>/<hex>``.
        ttl_s: lease TTL in whole seconds (etcd may grant more: its floor is
            1.5 raft election timeouts).
        keepalive: run each lease's keepalive on its own thread with a lag
            guard (None: a task on the caller's event loop).

    Raises:
        ValueError: empty ``prefix`` or ``ttl_s`` < 1.
    """

    def __init__(
        self,
        client: aetcd.Client,
        prefix: str,
        *,
        ttl_s: int = DEFAULT_TTL_S,
        keepalive: KeepaliveThread | None = None,
    ) -> None:
        if not prefix:
            raise ValueError("the election prefix must not be empty")
        if ttl_s < 1:
            raise ValueError(f"ttl_s must be at least 1, not {ttl_s}")
        self._client = client
        self._prefix = prefix
        self._key_prefix = (prefix + "/").encode()
        self._ttl_s = ttl_s
        self._keepalive = keepalive
        self._session: _Session | None = None
        self._leadership: Leadership | None = None
        self._monitor: asyncio.Task[None] | None = None
        self._campaigning = False
        self._closed = False

    def __repr__(self) -> str:
        return f"Election(prefix={self._prefix!r}, leadership={self._leadership!r})"

    @property
    def prefix(self) -> str:
        """The election prefix."""
        return self._prefix

    @property
    def lease_id(self) -> int | None:
        """The id of this campaigner's live lease, or None before a campaign / after loss."""
        session = self._session
        return session.lease_id if session is not None and session.alive else None

    @property
    def loop_lag_s(self) -> float:
        """The event loop's lag as the keepalive thread last measured it (0 without one)."""
        session = self._session
        return session.lag_s if session is not None else 0.0

    @property
    def leadership(self) -> Leadership | None:
        """The leadership won by the last campaign, until resigned (it may be lost)."""
        return self._leadership

    # ------------------------------------------------------------ verbs

    async def campaign(self, value: str) -> Leadership:
        """Campaign with ``value`` and wait until this campaigner leads.

        Cancelling the call (e.g. by a timeout) withdraws the candidacy: the key
        is deleted, best effort, bounded by :data:`CLEANUP_TIMEOUT_S`.

        Args:
            value: the value to store in the key: the advertised address.

        Returns:
            The leadership; already leading, the same one (proclaiming ``value``).

        Raises:
            LeadershipLost: the session (lease) or the key was lost while
                waiting (UNAVAILABLE); campaign again.
            aetcd.ClientError: etcd refused or did not answer a call
                (ConnectionFailedError, ConnectionTimeoutError → UNAVAILABLE).
            RuntimeError: the election is closed, or another campaign runs.
        """
        if self._closed:
            raise RuntimeError("the election is closed")
        if self._campaigning:
            raise RuntimeError("a campaign is already running on this election")
        current = self._leadership
        if current is not None and not current.is_lost:
            if current.value != value:
                await self.proclaim(value)
            return current
        self._campaigning = True
        try:
            session = await self._live_session()
            key = election_key(self._prefix, session.lease_id)
            term, stored = await self._create_or_reuse(key, value, session.lease_id)
            leadership = Leadership(key, session.lease_id, term, stored)
            try:
                if stored != value:
                    await self._put_fenced(leadership, value)
                await self._unless_session_lost(
                    self._wait_for_predecessors(term), session, key, term
                )
                await self._confirm_key(leadership)
            except LeadershipLost:
                raise
            except BaseException:
                await self._delete_key_quietly(key, term)
                raise
            self._leadership = leadership
            self._monitor = asyncio.create_task(
                self._watch_own_key(leadership), name=f"election-monitor-{key}"
            )
            _log.info("leading: key=%s term=%d value=%s", key, term, leadership.value)
            return leadership
        finally:
            self._campaigning = False

    async def proclaim(self, value: str) -> None:
        """Store a new value in the leader's key, only while it is still ours.

        Args:
            value: the new value (advertised address).

        Raises:
            NotLeader: no campaign was won (FAILED_PRECONDITION).
            LeadershipLost: the leadership is lost, or the compare on the term
                failed (UNAVAILABLE).
            aetcd.ClientError: etcd refused or did not answer (UNAVAILABLE).
        """
        leadership = self._leadership
        if leadership is None:
            raise NotLeader("proclaim needs a won campaign")
        if leadership.is_lost:
            raise LeadershipLost(leadership.key, leadership.term, leadership.reason)
        await self._put_fenced(leadership, value)

    async def resign(self) -> None:
        """Give up leadership at once: delete our key if it is still ours.

        The lease stays (a later ``campaign`` reuses it). The leadership is
        marked lost (``RESIGNED``) before the delete is sent. Without a
        leadership this does nothing; to withdraw a campaign that is still
        waiting, cancel it.

        Raises:
            aetcd.ClientError: etcd refused or did not answer; the key then
                goes with the lease, within the TTL (UNAVAILABLE).
        """
        leadership = self._leadership
        if leadership is None:
            return
        self._leadership = None
        leadership._lose(LossReason.RESIGNED)
        await self._stop_monitor()
        await self._delete_key(leadership.key, leadership.term)
        _log.info("resigned: key=%s term=%d", leadership.key, leadership.term)

    async def leader(self) -> Leader | None:
        """Read the current leader: the key under the prefix with the lowest create revision.

        Returns:
            The leader, or None when nobody campaigns.

        Raises:
            aetcd.ClientError: etcd refused or did not answer (UNAVAILABLE).
        """
        return (await self.read_leader())[1]

    async def read_leader(self) -> tuple[int, Leader | None]:
        """A linearizable read of the election prefix (fan-in's ``ReadElection``).

        Returns:
            (etcd's header revision of the answer, the key with the lowest
            create revision or None when nobody campaigns). Ordered by the
            revision, never by when the answer arrived (``docs/fan-in.md``
            section 3).

        Raises:
            aetcd.ClientError: etcd refused or did not answer (UNAVAILABLE).
        """
        response = await self._candidates()  # a Range without serializable: linearizable
        leader = next((Leader.from_kv(kv) for kv in response), None)
        return int(response.header.revision), leader

    async def observe(self) -> AsyncIterator[Leader]:
        """Yield the leader each time it changes (a new key, or a new value proclaimed).

        Like Go's ``Observe``: nothing is yielded while nobody campaigns.
        Errors are not raised: after a failed read or watch it reads again
        after :data:`RETRY_INTERVAL_S` and yields only what changed. Stop it by
        cancelling or closing the iterator (``contextlib.aclosing``).

        Returns:
            An async iterator of :class:`Leader`.
        """
        last: Leader | None = None
        while True:
            try:
                response = await self._candidates()
                current = next((Leader.from_kv(kv) for kv in response), None)
                if current is None:
                    await self._wait_for_put(self._key_prefix, int(response.header.revision))
                    continue
                if current != last:
                    last = current
                    yield current
                watch = await open_watch(
                    self._client,
                    current.key.encode(),
                    start_revision=int(response.header.revision) + 1,
                )
                try:
                    async for event in watch:
                        if event.kind == aetcd.EventKind.DELETE:
                            break
                        changed = replace(
                            current, value=bytes(event.kv.value).decode(errors="replace")
                        )
                        if changed != last:
                            last = changed
                            yield changed
                    else:
                        await asyncio.sleep(RETRY_INTERVAL_S)  # stream ended: read again
                finally:
                    await cancel_watch(watch)
            except aetcd.ClientError as exc:
                _log.warning("observing %s failed (%r); reading again", self._prefix, exc)
                await asyncio.sleep(RETRY_INTERVAL_S)

    async def close(self) -> None:
        """Leave the election at once: revoke the lease, which deletes our key.

        Marks a current leadership lost (``RESIGNED``) first. Never raises on
        etcd errors (logged; the lease then expires within its TTL). Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        leadership, self._leadership = self._leadership, None
        if leadership is not None:
            leadership._lose(LossReason.RESIGNED)
        await self._stop_monitor()
        session, self._session = self._session, None
        if session is not None:
            await session.close(revoke=True)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ------------------------------------------------------------ recipe steps

    async def _live_session(self) -> _Session:
        session = self._session
        if session is not None and session.alive:
            return session
        if session is not None:
            await session.close(revoke=False)
        self._session = await _Session.grant(
            self._client, self._ttl_s, self._on_session_lost, self._keepalive
        )
        _log.info("lease %x granted, ttl %d s", self._session.lease_id, self._session.ttl_s)
        return self._session

    def _on_session_lost(self, reason: LossReason) -> None:
        leadership = self._leadership
        if leadership is not None:
            leadership._lose(reason)
        if self._monitor is not None:
            self._monitor.cancel()

    async def _create_or_reuse(self, key: str, value: str, lease_id: int) -> tuple[int, str]:
        """Put the key if absent, else read it; return (create revision, stored value)."""
        tx = self._client.transactions
        key_b = key.encode()
        succeeded, responses = await self._client.transaction(
            compare=[tx.create(key_b) == 0],
            success=[tx.put(key_b, value.encode(), lease=lease_id)],
            failure=[tx.get(key_b)],
        )
        if succeeded:
            return int(responses[0].response_put.header.revision), value
        _, kv = responses[0][0]
        return int(kv.create_revision), bytes(kv.value).decode(errors="replace")

    async def _put_fenced(self, leadership: Leadership, value: str) -> None:
        tx = self._client.transactions
        key_b = leadership.key.encode()
        succeeded, _ = await self._client.transaction(
            compare=[tx.create(key_b) == leadership.term],
            success=[tx.put(key_b, value.encode(), lease=leadership.lease_id)],
            failure=[],
        )
        if not succeeded:
            leadership._lose(LossReason.FENCE_REJECTED)
            raise LeadershipLost(
                leadership.key, leadership.term, LossReason.FENCE_REJECTED, "proclaim refused"
            )
        leadership._value = value

    async def _candidates(self) -> Any:
        return await self._client.get_prefix(
            self._key_prefix, sort_order="ascend", sort_target="create"
        )

    async def _wait_for_predecessors(self, term: int) -> None:
        """Return once no key under the prefix is older than ``term``."""
        while True:
            try:
                response = await self._candidates()
                predecessor = None
                for kv in response:  # ascending create revision: keep the last one below ours
                    if int(kv.create_revision) < term:
                        predecessor = kv
                if predecessor is None:
                    return
                _log.info(
                    "term %d waits for the deletion of %s (term %d)",
                    term,
                    bytes(predecessor.key).decode(errors="replace"),
                    int(predecessor.create_revision),
                )
                deleted = await self._wait_for_delete(
                    bytes(predecessor.key), int(response.header.revision)
                )
                if not deleted:
                    await asyncio.sleep(RETRY_INTERVAL_S)
            except aetcd.ClientError as exc:
                _log.warning("waiting for predecessors of term %d failed (%r)", term, exc)
                await asyncio.sleep(RETRY_INTERVAL_S)

    async def _wait_for_delete(self, key: bytes, revision: int) -> bool:
        """Watch ``key`` after ``revision`` (when it existed); True once it is deleted."""
        watch = await open_watch(self._client, key, start_revision=revision + 1)
        try:
            async for event in watch:
                if event.kind == aetcd.EventKind.DELETE:
                    return True
            return False
        finally:
            await cancel_watch(watch)

    async def _wait_for_put(self, prefix: bytes, revision: int) -> None:
        """Return at the first put under ``prefix`` after ``revision`` (or if the stream ends)."""
        watch = await open_watch(
            self._client,
            prefix,
            range_end=aetcd.utils.prefix_range_end(prefix),
            start_revision=revision + 1,
        )
        try:
            async for event in watch:
                if event.kind == aetcd.EventKind.PUT:
                    return
            await asyncio.sleep(RETRY_INTERVAL_S)
        finally:
            await cancel_watch(watch)

    async def _unless_session_lost(
        self, waiting: Coroutine[Any, Any, None], session: _Session, key: str, term: int
    ) -> None:
        """Run ``waiting``; raise LeadershipLost if the session is lost first."""
        wait_task = asyncio.create_task(waiting)
        lost_task = asyncio.create_task(session.lost_event.wait())
        try:
            await asyncio.wait({wait_task, lost_task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not wait_task.done():
                await stop_task(wait_task)
            await stop_task(lost_task)
        if session.lost_reason is not None:
            if not wait_task.cancelled():
                wait_task.exception()  # retrieved: the loss is what the caller hears
            raise LeadershipLost(key, term, session.lost_reason, "session lost while campaigning")
        wait_task.result()

    async def _confirm_key(self, leadership: Leadership) -> None:
        got = await self._client.get(leadership.key.encode())
        if got is None or int(got.create_revision) != leadership.term:
            raise LeadershipLost(
                leadership.key,
                leadership.term,
                LossReason.KEY_DELETED,
                "the key vanished while campaigning",
            )
        leadership._since_revision = int(got.header.revision)

    async def _watch_own_key(self, leadership: Leadership) -> None:
        """Mark ``leadership`` lost (KEY_DELETED) once its key is deleted or replaced."""
        key_b = leadership.key.encode()
        while not leadership.is_lost:
            try:
                got = await self._client.get(key_b)
                if got is None or int(got.create_revision) != leadership.term:
                    leadership._lose(LossReason.KEY_DELETED)
                    return
                if await self._wait_for_delete(key_b, int(got.header.revision)):
                    leadership._lose(LossReason.KEY_DELETED)
                    return
                await asyncio.sleep(RETRY_INTERVAL_S)
            except aetcd.ClientError as exc:
                _log.warning("watching our key %s failed (%r); again", leadership.key, exc)
                await asyncio.sleep(RETRY_INTERVAL_S)

    async def _stop_monitor(self) -> None:
        monitor, self._monitor = self._monitor, None
        if monitor is not None:
            await stop_task(monitor)

    async def _delete_key(self, key: str, term: int) -> None:
        tx = self._client.transactions
        key_b = key.encode()
        await self._client.transaction(
            compare=[tx.create(key_b) == term], success=[tx.delete(key_b)], failure=[]
        )

    async def _delete_key_quietly(self, key: str, term: int) -> None:
        try:
            async with asyncio.timeout(CLEANUP_TIMEOUT_S):
                await self._delete_key(key, term)
        except Exception as exc:
            _log.warning("withdrawing candidacy %s failed (%r); it goes with the lease", key, exc)
