"""Fan-in's relay decisions, sans-IO: what a replica does with the agents' Sessions it carries.

Theory of operation (issue 20, ``docs/fan-in.md`` section 8). With fan-in a
follower holds agents' Session streams and carries each over its Forward
stream to the leader (``coordinator.forwarding``, the shell). When the leader
goes, the Sessions are *detached*, not ended; once a leader answers, each gets
a ``Reattach`` (at most ``reattach_rate_per_s``, the agent closest to its
fence first; one whose fence an interregnum ack moved waits until
``reattach_lead_s`` before it, so the next leader first serves the agents
that need its Welcome sooner), after which the agent's next
Hello opens a Session at the new leader on the same stream; an agent that
sends no Hello within ``reattach_hello_timeout_s`` is ended. The leader, for
its part, steps a forwarded heartbeat in the batch's liveness digest only
when that cannot reorder its Session (:func:`digest_eligible`).

:class:`SessionRelay` holds each carried Session's state and makes those
decisions; :class:`LinkPolicy` decides which leader to link to and when not
to redial one; the shell feeds it what it observed (a link lost, the leader's end
of a Session, an agent's message, time) and carries out what it answers. It
is generic in the shell's handle for a Session (any hashable key).

Pure: time is passed in (``now_s``, the replica's monotonic seconds); nothing
here reads a clock, a socket or a random source.
"""

from __future__ import annotations

import collections
import enum
import heapq
import itertools
import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from coordinator.core.errors import UsageError

__all__ = [
    "ELECTION_READ_TIMEOUT_S",
    "LEADERSHIP_CHECK_S",
    "LINK_CONNECT_TIMEOUT_S",
    "RELINK_INTERVAL_S",
    "UNAVAILABLE",
    "Carry",
    "LinkChoice",
    "LinkPolicy",
    "RelaySettings",
    "Route",
    "SessionRelay",
    "digest_eligible",
    "leader_end_detaches",
    "link_accepted",
    "link_led",
    "link_outdated",
    "newest_leader",
]

K = TypeVar("K", bound=Hashable)

UNAVAILABLE = 14
"""gRPC status code UNAVAILABLE: how a leader ends a Session when it stops leading."""

# The shell's timings (``coordinator.forwarding``), here so that the fan-in
# simulator (``lazarus_dev.fanin_sim``) models the same ones.

LEADERSHIP_CHECK_S = 0.2
"""How often a leader's Forward stream checks that its replica still leads."""

LINK_CONNECT_TIMEOUT_S = 0.5
"""How long a follower waits for its channel to the leader to be ready (a
paused leader accepts TCP and never answers; a crashed one refuses, and
gRPC retries until this passes)."""

ELECTION_READ_TIMEOUT_S = 1.0
"""A follower's election read not answered by then is given up (it acks nothing)."""

RELINK_INTERVAL_S = 0.1
"""How often a follower with detached Sessions looks for a leader to carry them to."""


class Carry(enum.Enum):
    """Where a carried Session stands."""

    ATTACHED = "attached"  # carried to a leader (or about to be)
    DETACHED = "detached"  # its leader went; waiting for the next to answer
    AWAITING_HELLO = "awaiting_hello"  # sent a Reattach; the agent's Hello is due


class Route(enum.Enum):
    """What to do with one message from an agent."""

    FORWARD = "forward"  # send it on the Session's link
    DROP = "drop"  # nobody to reach, or not the Hello awaited after a Reattach
    OPEN = "open"  # the awaited Hello: open a Session on the current link, then forward it
    DETACH = "detach"  # the awaited Hello, but that link is gone: detach again


@dataclass(frozen=True, slots=True)
class RelaySettings:
    """Pacing and patience of the relay.

    Attributes:
        reattach_rate_per_s: Reattaches sent per second at most, after a
            leader change (spreads the new leader's Hellos).
        reattach_hello_timeout_s: an agent that sends no Hello this long after
            its Reattach is ended (UNAVAILABLE; it redials).
        failed_leader_hold_off_s: after the link to a leader (address, term)
            broke, that leader is not dialled again for this long while the
            election still names it (a crashed leader's key outlives it by up
            to the lease TTL; redialling it only delays the next one).
        refused_retry_s: the hold-off instead when that leader never
            accepted the link (named by the election, still taking over:
            its runtime refuses Forward until it leads, and may be slow to
            answer at all): ask again soon rather than lose a second.
        fence_after_ack_s: how long an agent runs at least after the arrival
            of the heartbeat this replica last acked for it (its heartbeat
            interval + fence_after - the agent's fence lead); None: unknown,
            every detached Session is reattached as soon as the rate allows.
        reattach_lead_s: with ``fence_after_ack_s``, a detached Session is
            reattached no later than this long, plus the time the Sessions
            queued with it take at the rate, before its agent would fence;
            one whose fence is further away (an interregnum ack moved it)
            waits, so the next leader's first seconds go to the agents
            closest to fencing (the crashed leader's own, which redial).
        new_session_wait_s: how long a new Session waits for a link attempt
            already in progress (election read, dial, accept) once this
            replica has had a link: after a leader change the fleet redials
            at once, and an agent sent away (NotLeader, back in 0.2 s) is
            served sooner than one queued behind a slow read or dial.
        first_link_wait_s: the wait instead while this replica never had a
            link (start-up): the leader is alive, only it or this replica
            may be slow (finishing its takeover, a loaded host); sending
            agents away then spills them onto the leader, which fan-in
            exists to spare. Attempts that find the named leader not ready
            are repeated within it (:meth:`LinkPolicy.retry_new_session_s`).
    """

    reattach_rate_per_s: float = 500.0
    reattach_hello_timeout_s: float = 5.0
    failed_leader_hold_off_s: float = 1.0
    refused_retry_s: float = 0.2
    fence_after_ack_s: float | None = None
    reattach_lead_s: float = 2.0
    new_session_wait_s: float = 0.25
    first_link_wait_s: float = 2.5

    def __post_init__(self) -> None:
        for name in (
            "reattach_rate_per_s",
            "reattach_hello_timeout_s",
            "failed_leader_hold_off_s",
            "refused_retry_s",
            "new_session_wait_s",
            "first_link_wait_s",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise UsageError(f"{name}: must be finite and > 0, got {value!r}")
        if self.fence_after_ack_s is not None and not (
            math.isfinite(self.fence_after_ack_s) and self.fence_after_ack_s > 0
        ):
            raise UsageError("fence_after_ack_s: must be None or finite and > 0")
        if not (math.isfinite(self.reattach_lead_s) and self.reattach_lead_s >= 0):
            raise UsageError("reattach_lead_s: must be finite and >= 0")


class LinkChoice(enum.Enum):
    """What a replica does about its link to the leader when it needs one."""

    DIAL = "dial"  # link to the leader the election names
    NO_LEADER = "no_leader"  # the election names none: nobody to forward to
    HOLD_OFF = "hold_off"  # the link to that very leader just broke: wait for the election
    RETRY_SOON = "retry_soon"  # that leader refused the link moments ago: still taking over
    OWN = "own"  # this replica is named: it serves its Sessions itself, no link


class LinkPolicy:
    """Which leader a replica's relay links to, and when it must not redial (sans-IO).

    The shell reads the election (the leader's advertised address and term)
    and asks :meth:`choose`; it reports a broken link with :meth:`failed`, and
    fails an open link that :func:`link_outdated` says the election moved past.
    """

    def __init__(self, settings: RelaySettings | None = None) -> None:
        self._settings = settings if settings is not None else RelaySettings()
        # address, term, held off until, and whether that leader never accepted the link
        self._failed: tuple[str, int, float, bool] | None = None
        self._ever_linked = False

    def linked(self) -> None:
        """A leader accepted this replica's link (see :meth:`session_wait_s`)."""
        self._ever_linked = True

    def retry_new_session_s(self, why: LinkChoice, waited_s: float) -> float | None:
        """After an attempt made no link: when a waiting new Session tries again (None: never).

        Args:
            why: why the attempt made none: the policy's choice, or RETRY_SOON
                when a leader was named but did not take the link (it refused,
                did not answer in time, the election moved on while dialling,
                or could not be read).
            waited_s: how long the Session has waited so far, seconds.

        Returns:
            ``refused_retry_s`` while this replica never had a link, ``why`` is
            RETRY_SOON and the next try starts within ``first_link_wait_s``:
            at start-up the leader is alive but may be finishing its takeover
            or slow on a loaded host, and an agent sent away would go on to
            the leader. Otherwise None: the agent is sent away (NotLeader):
            nobody is named, this replica is, or a leader change is under way
            (the fleet redials at once; a queue would hold them longer).
        """
        if self._ever_linked or why is not LinkChoice.RETRY_SOON:
            return None
        settings = self._settings
        if waited_s + settings.refused_retry_s > settings.first_link_wait_s:
            return None
        return settings.refused_retry_s

    def session_wait_s(self, dialling: tuple[str, int] | None) -> float:
        """How long a new Session waits for the link attempt in progress (0: not at all).

        Args:
            dialling: the leader (address, term) that attempt is dialling; None
                while it reads the election or waits for the leader to accept.

        Returns:
            0 when the attempt redials a leader that :meth:`went` (a crashed
            leader's key outlives it: its agent is sent away at once);
            ``first_link_wait_s`` while this replica never had a link
            (start-up: agents stay on the replica they dialled instead of
            spilling onto the leader when this host is slow);
            ``new_session_wait_s`` otherwise (a leader change: the fleet
            redials at once, and NotLeader serves it sooner than a queue).
            Seconds; the shell answers NotLeader when the attempt outlasts it.
        """
        if dialling is not None and self.went(*dialling):
            return 0.0
        settings = self._settings
        return settings.new_session_wait_s if self._ever_linked else settings.first_link_wait_s

    def failed(self, address: str, term: int, now_s: float, *, accepted: bool = True) -> None:
        """The link to the leader at ``address`` in ``term`` failed at ``now_s``.

        ``accepted``: the leader had accepted the link (it led, then went:
        hold off ``failed_leader_hold_off_s``). False when it never did (it
        refused the link, being named by the election but still taking
        over, or did not answer in time, as a replica busy taking over may
        not): ask again after ``refused_retry_s``. Unless that very leader
        (address and term) had accepted the link before this failure: a
        leader that led, lost its link and does not answer a redial crashed
        or is cut off, and the election names it until its lease expires
        (up to the lease TTL); redialling it every ``refused_retry_s`` only
        keeps the dialler waiting on it (``LINK_CONNECT_TIMEOUT_S`` each
        time) while the next leader takes over, so it is held off
        ``failed_leader_hold_off_s`` again.
        """
        settings = self._settings
        previous = self._failed
        led = accepted or (
            previous is not None and previous[:2] == (address, term) and not previous[3]
        )
        wait = settings.failed_leader_hold_off_s if led else settings.refused_retry_s
        self._failed = (address, term, now_s + wait, not led)
        if accepted:
            self._ever_linked = True

    def went(self, address: str, term: int) -> bool:
        """Whether the last link that failed was to this leader, and it had led on it.

        A redial of such a leader (a crashed one whose key outlives it, until
        its lease expires) is not worth waiting for: a new Session is sent
        away (NotLeader, back in 0.2 s) rather than queued behind the dial.
        The first dial of a leader is waited for (it is usually alive: at
        start-up, or after an election), so agents stay on the replica they
        dialled instead of spilling over to the leader.
        """
        failed = self._failed
        return failed is not None and failed[:2] == (address, term) and not failed[3]

    def choose(
        self,
        leader_address: str,
        leader_term: int,
        own_address: str,
        *,
        leading: bool,
        to_self: bool,
        now_s: float,
    ) -> LinkChoice:
        """Whether to dial the leader the election names.

        Args:
            leader_address: the leader's advertised address ("" when none).
            leader_term: its term.
            own_address: this replica's advertised address.
            leading: this replica's runtime leads now.
            to_self: the link is for carrying detached Sessions: when this
                replica leads, it links to itself (its Sessions stay on their
                streams and are served here). A new Session is not (the
                replica's own Session servicer serves it directly).
            now_s: monotonic seconds.

        Returns:
            DIAL, or why not: NO_LEADER, HOLD_OFF (that leader's link broke
            less than ``failed_leader_hold_off_s`` ago), RETRY_SOON (it did
            not accept one, less than ``refused_retry_s`` ago), OWN.
        """
        if not leader_address:
            return LinkChoice.NO_LEADER
        failed = self._failed
        if (
            failed is not None
            and failed[0] == leader_address
            and failed[1] == leader_term
            and now_s < failed[2]
        ):
            return LinkChoice.RETRY_SOON if failed[3] else LinkChoice.HOLD_OFF
        if leader_address == own_address and not (to_self and leading):
            return LinkChoice.OWN
        return LinkChoice.DIAL


def newest_leader(
    read: tuple[str, int] | None, observed: tuple[str, int] | None
) -> tuple[str, int] | None:
    """The leader (address, term) to link to: the election read's, unless the watch knows better.

    Args:
        read: what a read of the election answered (None: nobody campaigns).
        observed: the last leader the election watch showed (None: none yet).

    A read sent before the old leader's key was deleted can be answered after
    the watch already showed the next leader (a loaded etcd or event loop);
    terms only grow, so the higher one is the newer (the watch's, when its
    term is higher). A read showing nobody is taken as it is: the watch
    yields nothing when nobody campaigns, so it cannot say the read is old.
    Liveness only: a leader accepts a link only while it leads.
    """
    if read is None or observed is None:
        return read
    return observed if observed[1] > read[1] else read


def link_outdated(link_address: str, link_term: int, leader_address: str, term: int) -> bool:
    """Whether an open link must be failed because the election shows another leader.

    A paused old leader keeps its streams open; a follower that waited for
    them to break would keep its Sessions hanging, so any change of the
    leader's (address, term) in the election ends the link at once.
    """
    return link_term != term or link_address != leader_address


def link_accepted(said_accepted: bool | None, ended: bool) -> bool:
    """Whether a Forward stream the leader answered (or not) within the wait counts as accepted.

    Args:
        said_accepted: the leader's initial metadata arrived in time and
            carried ``lazarus-forward-accepted`` (True), arrived without it
            (False), or did not arrive in time (None).
        ended: the stream had ended by the end of the wait.

    A leader says so when it leads; one that does not lead refuses at once
    (the stream ends). A leader of an earlier release says nothing and keeps
    the stream open when it leads, so an open stream counts as accepted at
    the end of the wait (a rolling upgrade keeps forwarding).
    """
    if said_accepted:
        return True
    return not ended


def link_led(said_accepted: bool | None, replied: bool) -> bool:
    """Whether the leader of a link that ended had led on it (for ``LinkPolicy.failed``).

    Args:
        said_accepted: as for :func:`link_accepted`.
        replied: the leader sent at least one batch on the link.

    A link accepted by silence (``link_accepted``'s rule for an earlier
    release) may have been a leader still taking over whose event loop was
    too busy to refuse within the wait: when it then refuses, with no reply
    ever sent, it did not lead, and it is asked again after
    ``refused_retry_s``, not held off as a leader that went
    (``bench/fanin_failover_bench.py`` saw a 1.1 s gap at a takeover).
    """
    return bool(said_accepted) or replied


def leader_end_detaches(code: int) -> bool:
    """Whether the leader's end of a forwarded Session detaches it (True) or ends the agent's.

    UNAVAILABLE means the leader stopped leading: the agent's Session is
    carried to the next one. Any other status is the leader's verdict on the
    Session (a refusal, a bad message, a replaced Session) and ends it.
    """
    return code == UNAVAILABLE


def digest_eligible(backlog: int, hello_stepped: bool, closed: bool) -> bool:
    """Whether the leader may step a forwarded heartbeat in its batch's liveness digest.

    Args:
        backlog: the Session's messages queued before it and not yet stepped.
        hello_stepped: the Session's Hello was stepped (it is bound to a node).
        closed: the Session is closing.

    Returns:
        True only when nothing older of its Session waits, so stepping it
        now cannot reorder the Session; otherwise it queues behind.
    """
    return backlog == 0 and hello_stepped and not closed


class SessionRelay(Generic[K]):
    """The carried Sessions of one replica and their relay state; see the module docstring."""

    def __init__(self, settings: RelaySettings | None = None) -> None:
        self._settings = settings if settings is not None else RelaySettings()
        self._state: dict[K, Carry] = {}
        self._since: dict[K, float] = {}  # AWAITING_HELLO: when the Reattach went
        # DETACHED: key -> its token in a queue; the queue orders the acked by
        # urgency (earliest acked first), then detach order; the never-acked
        # wait in detach order. Entries whose token no longer matches are
        # stale (released, re-queued).
        self._detached: dict[K, int] = {}
        self._queue: list[tuple[float, int, K]] = []
        self._deferred: list[tuple[float, int, K]] = []
        self._never_acked: collections.deque[tuple[int, K]] = collections.deque()
        self._tokens = itertools.count()
        self._next_reattach_s = -math.inf

    @property
    def settings(self) -> RelaySettings:
        """The settings in force."""
        return self._settings

    def state(self, key: K) -> Carry | None:
        """The Session's state (None when not carried)."""
        return self._state.get(key)

    @property
    def detached(self) -> int:
        """Sessions waiting for a leader."""
        return len(self._detached)

    @property
    def pending(self) -> bool:
        """Some Session is detached or awaits its Hello: the reattach loop has work."""
        return bool(self._detached) or bool(self._since)

    def held(self, key: K) -> None:
        """A new Session is carried, attached to the current link."""
        self._state[key] = Carry.ATTACHED

    def released(self, key: K) -> None:
        """The Session is over (its stream ended): forget it."""
        self._state.pop(key, None)
        self._since.pop(key, None)
        self._detached.pop(key, None)
        if not self._detached:
            self._queue.clear()  # only stale entries are left
            self._deferred.clear()
            self._never_acked.clear()

    def detach(self, key: K, acked_s: float | None = None, *, deferrable: bool = False) -> None:
        """Its link went (the leader crashed, resigned, another leads): wait for the next leader.

        Args:
            key: the Session.
            acked_s: when this replica last relayed a heartbeat ack to its
                agent (monotonic seconds; None: never, so its agent has no
                fence deadline running). The agent fences a fixed time after
                its newest acked heartbeat, so the Session acked longest ago
                is the one closest to fencing: Reattaches go earliest-acked
                first (Jackson's rule: earliest due date first minimises the
                largest lateness on one server, here the paced Reattaches),
                never-acked last, each group in detach order.
            deferrable: an interregnum ack (rule (b)) moved the agent's fence
                to ``acked_s + fence_after_ack_s``: with ``fence_after_ack_s``
                set, its Reattach waits until ``reattach_lead_s`` (plus the
                queue at the rate) before that fence. Call ``detach`` again
                for a detached Session acked meanwhile: it is queued anew.
        """
        if key not in self._state:
            return
        self._state[key] = Carry.DETACHED
        self._since.pop(key, None)
        token = next(self._tokens)
        self._detached[key] = token
        if acked_s is None:
            self._never_acked.append((token, key))
        elif deferrable and self._settings.fence_after_ack_s is not None:
            heapq.heappush(self._deferred, (acked_s, token, key))
        else:
            heapq.heappush(self._queue, (acked_s, token, key))

    def route(self, key: K, *, hello: bool, link_open: bool, attached: bool) -> Route:
        """What to do with a message from the agent of Session ``key``.

        Args:
            key: the Session.
            hello: the message is a Hello.
            link_open: the link the Session was last given is open.
            attached: the Session has a forwarded Session on that link.

        Returns:
            The route; an OPEN or DETACH also moves the Session's state.
        """
        state = self._state.get(key)
        if state is Carry.AWAITING_HELLO:
            if not hello:
                return Route.DROP  # everything before the new Hello is dropped
            self._since.pop(key, None)
            if not link_open:
                self.detach(key)
                return Route.DETACH
            self._state[key] = Carry.ATTACHED
            return Route.OPEN
        if state is Carry.ATTACHED and attached:
            return Route.FORWARD
        return Route.DROP  # detached (or not carried): its messages have nobody to reach

    def reattach(self, now_s: float) -> list[K]:
        """Detached Sessions due a Reattach now that a leader answers, at most the rate,
        most urgent first (see :meth:`detach`); a deferrable one waits while
        its agent's fence is further away than ``reattach_lead_s`` plus the
        queue's length at the rate.

        Each returned Session awaits its agent's Hello from ``now_s``.
        """
        due: list[K] = []
        interval = 1.0 / self._settings.reattach_rate_per_s
        while self._detached and self._next_reattach_s <= now_s:
            key = self._next_due(now_s)
            if key is None:
                break  # every one left waits for its fence to come closer
            del self._detached[key]
            self._state[key] = Carry.AWAITING_HELLO
            self._since[key] = now_s
            self._next_reattach_s = max(self._next_reattach_s, now_s) + interval
            due.append(key)
        return due

    def _drop_stale(self) -> None:
        """Pop entries released or detached again since from the fronts of the queues."""
        for heap in (self._queue, self._deferred):
            while heap and self._detached.get(heap[0][2]) != heap[0][1]:
                heapq.heappop(heap)
        while self._never_acked:
            token, key = self._never_acked[0]
            if self._detached.get(key) == token:
                break
            self._never_acked.popleft()

    def _start_by(self, acked_s: float) -> float:
        """When a deferrable Session must be reattached at the latest (its agent's fence
        less ``reattach_lead_s`` less the queue's length at the rate)."""
        settings = self._settings
        if settings.fence_after_ack_s is None:
            return -math.inf
        queued_s = len(self._detached) / settings.reattach_rate_per_s
        return acked_s + settings.fence_after_ack_s - settings.reattach_lead_s - queued_s

    def _next_due(self, now_s: float) -> K | None:
        """Pop the most urgent detached Session that may go now, or None.

        The acked first (earliest acked first); a deferred one (its fence
        moved by an interregnum ack) once its start time has come; then the
        never-acked. The deferred were acked later than anything still in
        the first queue, so their wait delays nobody closer to fencing.
        """
        self._drop_stale()
        if self._queue:
            return heapq.heappop(self._queue)[2]
        if self._deferred and self._start_by(self._deferred[0][0]) <= now_s:
            return heapq.heappop(self._deferred)[2]
        if self._never_acked:
            return self._never_acked.popleft()[1]
        return None

    def next_reattach_s(self) -> float:
        """When :meth:`reattach` may next return a Session (-inf: now)."""
        self._drop_stale()
        if self._deferred and not self._queue and not self._never_acked:
            return max(self._next_reattach_s, self._start_by(self._deferred[0][0]))
        return self._next_reattach_s

    def expired(self, now_s: float) -> list[K]:
        """Sessions whose agent sent no Hello in time after its Reattach; they are released."""
        timeout = self._settings.reattach_hello_timeout_s
        late = [key for key, since in self._since.items() if now_s - since > timeout]
        for key in late:
            self.released(key)
        return late
