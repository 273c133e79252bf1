"""Fan-in: when a coordinator replica may ack a node's heartbeat ([fan-in] issue 20, rule 2).

Theory of operation: with fan-in a node agent holds its Session with any
replica; the replica forwards the node's heartbeats to the leader in batches.
A heartbeat ack keeps meaning what it means today (DESIGN.md §6): no authority
(the leader the ack came through, an older one, any next one) can declare the
node DEAD before the node's own fence deadline has passed, and each ack
extends that deadline to at most ``send time + heartbeat_interval_s +
fence_after_s`` on the node's clock. ``FollowerCore`` is the replica's side
of that contract, sans-IO: the shell feeds it what it observed (``step``), it
answers with commands. It acks a heartbeat on one of two grounds
(``AckBasis``):

(a) ``CONFIRMED``: the leader confirmed the batch that carried it. A leader
    confirms only while it holds authority (after it saw its election key
    lowest, before its *safe lease deadline*, ``safe_lease_deadline``), and
    records the batch's arrival on its own clock as the node's last heartbeat.
(b) ``INTERREGNUM``: the heartbeat arrived at most ``interregnum_window_s``
    (on this replica's clock) after the *anchor*: the send time of the newest
    linearizable etcd read of the election prefix that showed no leader key,
    or a leader key this replica has since seen deleted (a later read at a
    higher revision shows a higher leader key, or none). Every leader elected
    after the anchor read gives every node ``dead_after_s`` from its own
    election; the leader whose key was deleted lost authority before the
    deletion, so before any ack that relies on it. A replica cut off from
    etcd sees its anchor age, and its (b) acks stop ``interregnum_window_s``
    after it; cut off from the leader too, it acks nothing.

The proof, the defaults' inequalities and what the shell must do are in
``docs/fan-in.md``. Reads are ordered by etcd revision, never by when their
answers arrived; the core issues them itself (``ReadElection``) so it knows
each one's send time.

Pure: time is passed in (``now_s``, this replica's monotonic seconds, never
decreasing); nothing here reads a clock, a socket or a random source.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from coordinator.core.errors import UsageError

__all__ = [
    "Ack",
    "AckBasis",
    "BatchConfirmed",
    "Command",
    "ElectionObserved",
    "EntryKind",
    "Event",
    "FanInSettings",
    "FollowerCore",
    "ForwardBatch",
    "ForwardedEntry",
    "HeartbeatReceived",
    "ReadElection",
    "SessionEnded",
    "Tick",
    "safe_lease_deadline",
]


# ---------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FanInSettings:
    """Timing of fan-in; defaults make a leader crash a non-event (``docs/fan-in.md``).

    Attributes:
        heartbeat_interval_s: h, the nodes' heartbeat period (sent in Welcome).
        fence_after_s: f, a node pauses its tasks this long after an unacked
            heartbeat's send time (its ``fence_deadline`` rule).
        dead_after_s: D, silence (on the judging leader's clock) before DEAD;
            also the least a new leader gives every node from its election.
        new_leader_floor_s: g >= 0, extra time a new leader guarantees before
            any verdict on top of ``dead_after_s`` (0 with today's core, whose
            ``failover_reconnect_s`` yields to the first heartbeat heard).
        lease_ttl_s: the election lease TTL (``coordinator.election``'s 3 s:
            with a keepalive every TTL / 6, 2.5 s of lease outlast an etcd
            raft election).
        clock_drift: rho, the bound on every clock's rate error: each host's
            monotonic clock advances between ``1 - rho`` and ``1 + rho``
            seconds per real second (no shared clock is assumed).
        batch_interval_s: a replica forwards new heartbeats this often.
        election_read_interval_s: a replica reads the election prefix
            (linearizably) this often while its leader may be gone.
        idle_read_interval_s: this often instead while a leader's ack
            reached this replica's agents within ``leader_quiet_s`` (a read
            is a gRPC call to etcd, about 1 ms of CPU at ten a second by
            ``bench/grpc_roundtrip_bench.py``: 1 % of a core). The anchor is then up to this
            old when a leader's key goes with its acks still flowing; rule
            (b) stays safe, its window just starts earlier.
        leader_quiet_s: a leader whose last ack is older than this may be
            gone: read at the fast interval.
        resend_after_s: an unconfirmed entry is forwarded again after this long.
        max_pending_per_session: unacked heartbeats kept per Session (older
            ones are dropped: an ack of a newer seq covers them).
    """

    heartbeat_interval_s: float = 0.5
    fence_after_s: float = 5.0
    dead_after_s: float = 6.0
    new_leader_floor_s: float = 0.0
    lease_ttl_s: float = 3.0
    clock_drift: float = 0.01
    batch_interval_s: float = 0.05
    election_read_interval_s: float = 0.1
    idle_read_interval_s: float = 1.0
    leader_quiet_s: float = 1.0
    resend_after_s: float = 0.25
    max_pending_per_session: int = 8

    def __post_init__(self) -> None:
        positive = {
            "heartbeat_interval_s": self.heartbeat_interval_s,
            "fence_after_s": self.fence_after_s,
            "dead_after_s": self.dead_after_s,
            "lease_ttl_s": self.lease_ttl_s,
            "batch_interval_s": self.batch_interval_s,
            "election_read_interval_s": self.election_read_interval_s,
            "idle_read_interval_s": self.idle_read_interval_s,
            "leader_quiet_s": self.leader_quiet_s,
            "resend_after_s": self.resend_after_s,
        }
        for name, value in positive.items():
            if not (math.isfinite(value) and value > 0):
                raise UsageError(f"{name}: must be a finite number > 0, got {value!r}")
        if not (math.isfinite(self.new_leader_floor_s) and self.new_leader_floor_s >= 0):
            raise UsageError("new_leader_floor_s: must be a finite number >= 0")
        if not 0.0 <= self.clock_drift < 0.5:
            raise UsageError("clock_drift: must be in [0, 0.5)")
        if self.max_pending_per_session < 1:
            raise UsageError("max_pending_per_session: must be >= 1")
        if self.confirm_slack_s <= 0:
            raise UsageError(
                "dead_after_s: (heartbeat_interval_s + fence_after_s) / (1 - clock_drift) must be "
                "< dead_after_s / (1 + clock_drift) (I1 in docs/fan-in.md): "
                f"{self.heartbeat_interval_s} + {self.fence_after_s} vs {self.dead_after_s} "
                f"at drift {self.clock_drift}"
            )

    @property
    def confirm_slack_s(self) -> float:
        """Real seconds by which a confirmed ack's fence precedes the earliest verdict (I1).

        ``dead_after_s / (1 + rho) - (heartbeat_interval_s + fence_after_s) / (1 - rho)``;
        must be > 0.
        """
        rho = self.clock_drift
        return self.dead_after_s / (1 + rho) - (self.heartbeat_interval_s + self.fence_after_s) / (
            1 - rho
        )

    def covers(
        self, heartbeat_interval_s: float, fence_after_s: float, dead_after_s: float
    ) -> bool:
        """Whether rule (b) may ack a node Welcomed with these timings (seconds).

        ``interregnum_window_s`` assumes the node fences ``heartbeat_interval_s +
        fence_after_s`` after an acked send at most and that a leader gives it
        ``dead_after_s``: a Welcome announcing a longer fence bound or a shorter
        dead bound (replicas configured differently) is outside the proof, and
        such a node gets no (b) ack. Zero or negative values (not announced)
        are not covered either.
        """
        if not (heartbeat_interval_s > 0 and fence_after_s > 0 and dead_after_s > 0):
            return False
        return (
            heartbeat_interval_s + fence_after_s <= self.heartbeat_interval_s + self.fence_after_s
            and dead_after_s >= self.dead_after_s
        )

    @property
    def interregnum_window_s(self) -> float:
        """W: how long after the anchor (replica clock) a heartbeat may arrive to be acked by (b).

        ``(dead_after_s + new_leader_floor_s) (1 - rho) / (1 + rho) - heartbeat_interval_s
        - fence_after_s`` (I2 in ``docs/fan-in.md``); > 0 whenever I1 holds.
        """
        rho = self.clock_drift
        grace = self.dead_after_s + self.new_leader_floor_s
        return grace * (1 - rho) / (1 + rho) - self.heartbeat_interval_s - self.fence_after_s


def safe_lease_deadline(keepalive_sent_s: float, granted_ttl_s: float, clock_drift: float) -> float:
    """When a leader's authority ends, on its own clock: before etcd can expire its lease.

    etcd extends a lease to ``receipt + ttl`` on etcd's clock; the keepalive was
    received after it was sent, and ``ttl`` etcd-seconds last at least
    ``ttl / (1 + rho)`` real seconds, while ``ttl (1 - rho) / (1 + rho)`` local
    seconds last at most that long. ``coordinator.election`` uses ``sent + ttl``
    today (drift aside); fan-in needs this one (``docs/fan-in.md``).

    Args:
        keepalive_sent_s: leader clock, seconds, when the newest answered keepalive
            (or the lease grant) was sent.
        granted_ttl_s: the TTL etcd answered, seconds.
        clock_drift: rho, the clock rate bound.

    Returns:
        Leader clock, seconds: stop confirming and judging at this time.
    """
    return keepalive_sent_s + granted_ttl_s * (1 - clock_drift) / (1 + clock_drift)


# ---------------------------------------------------------------------------
# Events (past-tense facts) and commands (imperative)
# ---------------------------------------------------------------------------


class EntryKind(enum.Enum):
    """What a forwarded entry is: a Hello (its ack is the Welcome) or a heartbeat."""

    HELLO = "hello"
    HEARTBEAT = "heartbeat"


class AckBasis(enum.Enum):
    """Why an ack was allowed (rule (a) or (b) of the module docstring)."""

    CONFIRMED = "confirmed"
    INTERREGNUM = "interregnum"


@dataclass(frozen=True, slots=True)
class HeartbeatReceived:
    """A node's heartbeat (or Hello, seq 0) arrived on a Session this replica holds.

    ``now_s`` is the arrival time on this replica's clock: rule (b) bounds it.
    """

    node_id: str
    session_id: str
    seq: int
    now_s: float
    kind: EntryKind = EntryKind.HEARTBEAT


@dataclass(frozen=True, slots=True)
class SessionEnded:
    """A Session this replica held is gone (either side closed it)."""

    node_id: str
    session_id: str
    now_s: float


@dataclass(frozen=True, slots=True)
class BatchConfirmed:
    """The leader confirmed a forwarded batch; ``refused_nodes`` got no confirmation (DEAD)."""

    batch_id: int
    now_s: float
    refused_nodes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ElectionObserved:
    """A ``ReadElection`` was answered.

    Attributes:
        read_id: the read's id from ``ReadElection``.
        revision: etcd's header revision of the answer.
        leader_term: create revision of the lowest key under the election
            prefix (the leader's term), or None when there was no key.
        leader_id: the replica that key names ("" when none).
        now_s: when the answer arrived.
    """

    read_id: int
    revision: int
    leader_term: int | None
    leader_id: str
    now_s: float


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed; call every ``min(batch_interval_s, election_read_interval_s)`` or so.

    ``leader_acked_s``: when a leader's ack last reached one of this replica's
    agents (replica clock), for a shell that relays the leader's acks itself
    (``forward=False``); None: not known, reads run at the fast interval.
    """

    now_s: float
    leader_acked_s: float | None = None


Event = HeartbeatReceived | SessionEnded | BatchConfirmed | ElectionObserved | Tick


@dataclass(frozen=True, slots=True)
class ForwardedEntry:
    """One node's heartbeat (or Hello) in a batch."""

    node_id: str
    session_id: str
    seq: int
    kind: EntryKind


@dataclass(frozen=True, slots=True)
class ForwardBatch:
    """Send these entries to the leader ``leader_id`` (term ``leader_term``); it confirms by id."""

    batch_id: int
    leader_term: int
    leader_id: str
    entries: tuple[ForwardedEntry, ...]


@dataclass(frozen=True, slots=True)
class Ack:
    """Ack ``seq`` on the Session (a HeartbeatAck; for a Hello, the Welcome)."""

    node_id: str
    session_id: str
    seq: int
    kind: EntryKind
    basis: AckBasis


@dataclass(frozen=True, slots=True)
class ReadElection:
    """Read the election prefix linearizably; answer with ``ElectionObserved(read_id, ...)``."""

    read_id: int


Command = ForwardBatch | Ack | ReadElection


# ---------------------------------------------------------------------------
# The core
# ---------------------------------------------------------------------------

_HANDLERS: dict[type, str] = {
    HeartbeatReceived: "_on_received",
    SessionEnded: "_on_session_ended",
    BatchConfirmed: "_on_confirmed",
    ElectionObserved: "_on_election",
    Tick: "_on_tick",
}
"""Which method steps which event (one table, looked up by name so a test can patch one)."""

_KEPT_BATCHES = 256
"""Unconfirmed batches remembered; a confirmation of an older one acks nothing (safe)."""

_KEPT_READS = 64
"""Unanswered reads remembered; a later answer to an older one is ignored (safe)."""


@dataclass(slots=True)
class _Entry:
    seq: int
    kind: EntryKind
    received_s: float
    forwarded_s: float | None = None
    forwarded_term: int | None = None


@dataclass(slots=True)
class _Session:
    node_id: str
    session_id: str
    acked_seq: int = -1
    pending: list[_Entry] = field(default_factory=list)


class FollowerCore:
    """A replica's ack decisions for the Sessions it holds; see the module docstring.

    Args:
        settings: the fan-in timing.
        forward: False when the shell carries heartbeats to the leader and the
            leader's acks back on its own (``coordinator.forwarding`` relays
            each Session verbatim, so every rule (a) ack is the leader's
            own): the core then gives rule (b) only (election reads and
            interregnum acks) and never emits ``ForwardBatch``.
    """

    def __init__(self, settings: FanInSettings | None = None, *, forward: bool = True) -> None:
        self.settings = settings or FanInSettings()
        self._forwarding = forward
        self._now_s = -math.inf
        self._sessions: dict[tuple[str, str], _Session] = {}
        self._batches: dict[int, list[tuple[tuple[str, str], int]]] = {}
        self._next_batch_id = 1
        self._next_batch_s = -math.inf
        self._next_read_id = 1
        self._last_read_s = -math.inf
        self._reads: dict[int, float] = {}  # read id -> send time
        self._cut = -1  # every term below this is known deleted
        self._present_s: dict[int, float] = {}  # live-looking term -> newest read send time
        self._anchor_s = -math.inf
        self._newest_revision = -1
        self._leader: tuple[int, str] | None = None  # (term, replica) of the newest read

    # ------------------------------------------------------------------ views

    @property
    def anchor_s(self) -> float:
        """The interregnum anchor (replica clock; -inf before any)."""
        return self._anchor_s

    @property
    def leader(self) -> tuple[int, str] | None:
        """(term, replica id) of the leader the newest read named, or None."""
        return self._leader

    def acked_seq(self, node_id: str, session_id: str) -> int | None:
        """Newest seq acked on a Session (-1 before any), or None when not held."""
        session = self._sessions.get((node_id, session_id))
        return None if session is None else session.acked_seq

    # ------------------------------------------------------------------ steps

    def step(self, event: Event) -> list[Command]:
        """Feed one fact; returns the commands to run in order.

        Raises:
            UsageError: ``now_s`` went backwards, or an unknown event type.
        """
        if event.now_s < self._now_s:
            raise UsageError(f"time went backwards: {event.now_s} < {self._now_s}")
        self._now_s = event.now_s
        name = _HANDLERS.get(type(event))
        if name is None:
            raise UsageError(f"unknown event {event!r}")
        handler: Callable[[Event], list[Command]] = getattr(self, name)
        return handler(event)

    def tick(self, now_s: float) -> list[Command]:
        """Same as ``step(Tick(now_s))``."""
        return self.step(Tick(now_s))

    def _on_received(self, ev: HeartbeatReceived) -> list[Command]:
        key = (ev.node_id, ev.session_id)
        session = self._sessions.get(key)
        if session is None:
            session = self._sessions[key] = _Session(ev.node_id, ev.session_id)
        if ev.seq <= session.acked_seq or (session.pending and ev.seq <= session.pending[-1].seq):
            return []  # a duplicate or a reordered old one: a newer ack covers it
        session.pending.append(_Entry(ev.seq, ev.kind, ev.now_s))
        if len(session.pending) > self.settings.max_pending_per_session:
            del session.pending[0]
        if ev.now_s > self._interregnum_bound_s():
            # Past the bound nothing is ackable: this entry arrived too late, and
            # every older one was checked against the same bound on arrival (it
            # moves only with the anchor, and _on_election scans when it does).
            return []
        return self._interregnum_acks([session])

    def _on_session_ended(self, ev: SessionEnded) -> list[Command]:
        self._sessions.pop((ev.node_id, ev.session_id), None)
        return []

    def _on_confirmed(self, ev: BatchConfirmed) -> list[Command]:
        carried = self._batches.pop(ev.batch_id, None)
        if carried is None:
            return []
        refused = set(ev.refused_nodes)
        newest: dict[tuple[str, str], int] = {}
        for key, seq in carried:
            if key[0] not in refused:
                newest[key] = max(seq, newest.get(key, -1))
        out: list[Command] = []
        for key in sorted(newest):
            session = self._sessions.get(key)
            if session is not None:
                out += self._ack_through(session, newest[key], AckBasis.CONFIRMED)
        return out

    def _on_election(self, ev: ElectionObserved) -> list[Command]:
        sent_s = self._reads.pop(ev.read_id, None)
        if sent_s is None:
            return []
        anchor_before = self._anchor_s
        term = ev.leader_term
        if ev.revision > self._newest_revision:
            self._newest_revision = ev.revision
            self._leader = None if term is None else (term, ev.leader_id)
        # Terms are create revisions: a read at revision R showing leader L
        # proves every term below L deleted; showing none, every term <= R.
        cut = ev.revision + 1 if term is None else term
        if term is None or term < self._cut:
            self._raise_anchor(sent_s)  # no leader then, or one already seen deleted
        else:
            self._present_s[term] = max(sent_s, self._present_s.get(term, -math.inf))
        if cut > self._cut:
            self._cut = cut
            for gone in [t for t in self._present_s if t < cut]:
                self._raise_anchor(self._present_s.pop(gone))
        if self._anchor_s == anchor_before:
            # The bound moves only with the anchor, and every pending entry was
            # checked against the present bound when it was received.
            return []
        return self._interregnum_acks(self._sorted_sessions())

    def _on_tick(self, ev: Tick) -> list[Command]:
        now = ev.now_s
        out: list[Command] = []
        settings = self.settings
        answering = (
            ev.leader_acked_s is not None and now - ev.leader_acked_s <= settings.leader_quiet_s
        )
        interval = settings.idle_read_interval_s if answering else settings.election_read_interval_s
        if now >= self._last_read_s + interval:
            self._last_read_s = now
            read_id = self._next_read_id
            self._next_read_id += 1
            self._reads[read_id] = now
            for old in [r for r in self._reads if r <= read_id - _KEPT_READS]:
                del self._reads[old]  # unanswered (etcd cut off): its answer would be ignored
            out.append(ReadElection(read_id))
        if self._forwarding and now >= self._next_batch_s:
            self._next_batch_s = now + self.settings.batch_interval_s
            out += self._forward(now)
        # No (b) scan here: its bound moves only with the anchor (stepped in
        # _on_election), and each arrival is checked when it is received.
        return out

    # ---------------------------------------------------------------- helpers

    def _sorted_sessions(self) -> list[_Session]:
        return [self._sessions[key] for key in sorted(self._sessions)]

    def _raise_anchor(self, sent_s: float) -> None:
        self._anchor_s = max(self._anchor_s, sent_s)

    def _interregnum_bound_s(self) -> float:
        """Newest arrival time (replica clock) rule (b) may ack; -inf when none."""
        return self._anchor_s + self.settings.interregnum_window_s

    def _interregnum_acks(self, sessions: list[_Session]) -> list[Command]:
        bound = self._interregnum_bound_s()
        out: list[Command] = []
        for session in sessions:
            ackable = [
                e.seq
                for e in session.pending
                if e.kind is EntryKind.HEARTBEAT and e.received_s <= bound
            ]
            if ackable:
                out += self._ack_through(session, max(ackable), AckBasis.INTERREGNUM)
        return out

    def _ack_through(self, session: _Session, seq: int, basis: AckBasis) -> list[Command]:
        if seq <= session.acked_seq:
            return []
        kinds = {e.seq: e.kind for e in session.pending}
        kind = kinds.get(seq, EntryKind.HEARTBEAT)
        session.acked_seq = seq
        session.pending = [e for e in session.pending if e.seq > seq]
        return [Ack(session.node_id, session.session_id, seq, kind, basis)]

    def _forward(self, now: float) -> list[Command]:
        if self._leader is None:
            return []
        term, leader_id = self._leader
        entries: list[ForwardedEntry] = []
        carried: list[tuple[tuple[str, str], int]] = []
        for session in self._sorted_sessions():
            for e in session.pending:
                if (
                    e.forwarded_s is None
                    or e.forwarded_term != term  # a new leader: send it at once
                    or now - e.forwarded_s >= self.settings.resend_after_s
                ):
                    e.forwarded_s = now
                    e.forwarded_term = term
                    entries.append(
                        ForwardedEntry(session.node_id, session.session_id, e.seq, e.kind)
                    )
                    carried.append(((session.node_id, session.session_id), e.seq))
        if not entries:
            return []
        batch_id = self._next_batch_id
        self._next_batch_id += 1
        self._batches[batch_id] = carried
        for old in [b for b in self._batches if b <= batch_id - _KEPT_BATCHES]:
            del self._batches[old]  # never confirmed: its entries were resent or superseded
        return [ForwardBatch(batch_id, term, leader_id, tuple(entries))]
