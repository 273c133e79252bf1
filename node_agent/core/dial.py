"""Which coordinator replica the agent dials next, and which it holds off.

With fan-in (issue 20) every replica terminates Sessions, so an agent given a
``--coordinators`` list may dial any of them. Rotating blindly through the
list sends it back to a crashed replica every ``len(list)``-th dial: each
such dial costs a refused connection (or, on a host that vanished, a silent
wait of the RPC timeout) plus a backoff step, while its fence clock runs. A
leader crash is exactly when that matters: a third of the fleet redials at
once, and the next leader's Welcome has about 0.7 s to spare
(``docs/fan-in.md`` §5, L2).

The rule (circuit breaking per endpoint, as a client-side load balancer's
outlier detection does; gRPC's pick_first skips an address whose connect
failed in the same way):

- A replica that could not be reached (connect refused or reset, the stream
  broke, or nothing came back for the RPC timeout) is **held off** for
  ``hold_off_s``; one that answered anything (a Welcome, a NotLeader, a
  refusal with a status) is cleared.
- ``next`` returns a NotLeader's redirect first unless its address is held
  off; otherwise the next address in list order that is not held off. A
  NotLeader naming a held-off address (followers name a crashed leader until
  its lease expires) counts as a failed dial (``redirect_usable``), so the
  backoff paces the dials that go elsewhere instead of their running back to
  back.
- When every address is held off, the one whose hold-off ends first (ties in
  list order): a hold-off only reorders dials, it never stops them, so an
  agent with one address (a Kubernetes Service) dials it as before.
- The first dial goes to ``spread_start(node_id, len(list))``: a fleet given
  one list spreads over the replicas (with fan-in each holds its share of
  the Sessions) instead of every agent starting at the first.
- The list may change (``set_addresses``: an agent that resolves a headless
  Service's name to every replica's address re-resolves it); hold-offs stay
  with their addresses.
- ``failures`` counts failed dials since the last Welcome (a NotLeader that
  asked for a pause or named a leader the agent can dial is not one); the
  shell's backoff (tenacity's ``wait_random_exponential``) grows with it.
- How a dial ended is judged here too (``DialEnd``, ``DialPlan.ended``):
  the shell reports what it saw (a Welcome, a NotLeader, the call's gRPC
  status, silence, a broken call) and gets back the pause before the next
  dial. The agent and the simulators' nodes share that one judgement.

Pure: times are the shell's monotonic seconds, passed in.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "HOLD_OFF_S",
    "MAX_RETRY_AFTER_S",
    "UNREACHABLE_STATUSES",
    "DialChoice",
    "DialEnd",
    "DialPlan",
    "spread_start",
]

HOLD_OFF_S = 3.0
"""How long an unreachable replica is skipped: one election lease TTL (3 s), the
time a crashed leader's replica stays the named leader at most, and about a
pod restart's lower bound."""

MAX_RETRY_AFTER_S = 10.0
"""Cap on a NotLeader's requested pause (``retry_after``), seconds: a coordinator
that asks for more (a bug, a hostile peer) does not park the agent."""

UNREACHABLE_STATUSES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED"})
"""gRPC status names that mean the replica was not reached (connect refused or
reset, the stream broke, no answer in time); any other status is an answer."""


def spread_start(node_id: str, count: int) -> int:
    """Index in ``[0, count)`` of this node's first dial: CRC-32 of the node id.

    Deterministic (a restarted agent starts where it did) and uniform over a
    fleet's node ids. ``count`` < 1 gives 0.
    """
    if count < 1:
        return 0
    return zlib.crc32(node_id.encode()) % count


@dataclass(frozen=True, slots=True)
class DialChoice:
    """The address to dial, and what was skipped to get there.

    Attributes:
        address: host:port to dial now.
        redirected: True when it is a NotLeader's redirect.
        skipped: addresses passed over because they are held off (a redirect
            among them when it was held off).
    """

    address: str
    redirected: bool = False
    skipped: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DialEnd:
    """What the shell saw of one dial, reported to ``DialPlan.ended`` unjudged.

    Attributes:
        welcomed: a Welcome came on it (a Session opened).
        not_leader: a NotLeader came; the abort that follows it is that answer.
        retry_after_s: the pause the coordinator asked for (NotLeader's
            ``retry_after``, through the core's CloseSession), seconds; 0: none.
        status: name of the gRPC status the call ended with (``"UNAVAILABLE"``);
            "" when it ended without one (EOF, closed by the agent).
        silent: nothing came for the RPC timeout.
        broken: the call failed outside gRPC's statuses (cancelled under the
            agent, an exception of the channel).
    """

    welcomed: bool = False
    not_leader: bool = False
    retry_after_s: float = 0.0
    status: str = ""
    silent: bool = False
    broken: bool = False

    @property
    def reachable(self) -> bool:
        """The replica answered: a NotLeader, or an end that is not a transport failure.

        Unreachable: silence, a broken call, or a status in
        ``UNREACHABLE_STATUSES`` (a Welcomed Session whose stream broke too:
        its replica is likely gone). Any other status (FAILED_PRECONDITION,
        RESOURCE_EXHAUSTED, ...) is an answer.
        """
        if self.not_leader:
            return True
        return not (self.silent or self.broken or self.status in UNREACHABLE_STATUSES)


class DialPlan:
    """The agent's dial order over ``addresses`` with a hold-off per unreachable address.

    Args:
        addresses: the ``--coordinators`` list, host:port each, at least one.
        hold_off_s: seconds an unreachable address is skipped (>= 0; 0 turns
            the hold-off off: plain rotation, the agent before this module).
        node_id: the agent's node id: the first dial, and the first list that
            replaces this one (``set_addresses``), start at
            ``spread_start(node_id, len(list))``; "": at 0.
        start: index of the first address to dial, overriding ``node_id``'s.

    Raises:
        ValueError: no address, or a negative ``hold_off_s``.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        hold_off_s: float = HOLD_OFF_S,
        *,
        node_id: str = "",
        start: int | None = None,
    ) -> None:
        if not addresses:
            raise ValueError("DialPlan needs at least one coordinator address")
        if hold_off_s < 0:
            raise ValueError(f"hold_off_s must be >= 0, got {hold_off_s}")
        self.addresses = tuple(addresses)
        self.hold_off_s = hold_off_s
        self.node_id = node_id
        self.failures = 0
        if start is None:
            start = spread_start(node_id, len(self.addresses)) if node_id else 0
        self._index = start % len(self.addresses)
        self._replaced = False
        self._redirect = ""
        self._held_until: dict[str, float] = {}

    def set_addresses(self, addresses: Sequence[str]) -> bool:
        """Replace the list (a re-resolved name); hold-offs stay with their addresses.

        The first replacement starts the rotation at ``spread_start`` of the
        node id (a fleet given one name spreads over what it resolves to);
        later ones go on from the current position, modulo the new length.

        Args:
            addresses: the new list; empty or equal to the current one: no change.

        Returns:
            True when the list changed.
        """
        new = tuple(addresses)
        if not new or new == self.addresses:
            return False
        first, self._replaced = not self._replaced, True
        self.addresses = new
        if first and self.node_id:
            self._index = spread_start(self.node_id, len(new))
        else:
            self._index %= len(new)
        return True

    def redirect(self, address: str) -> None:
        """A NotLeader named ``address`` (the leader): dial it next unless held off."""
        self._redirect = address

    @property
    def redirect_pending(self) -> bool:
        """True while a redirect waits to be dialled."""
        return bool(self._redirect)

    def redirect_usable(self, now: float) -> bool:
        """A redirect waits and its address is not held off: dial it at once.

        A NotLeader naming a held-off replica (followers name a crashed
        leader until its lease expires) is no reason to redial without a
        pause: the next dial goes elsewhere in the list, after the backoff.
        """
        return bool(self._redirect) and not self._held(self._redirect, now)

    def held_off(self, now: float) -> tuple[str, ...]:
        """Addresses of the list skipped at ``now``, in list order."""
        return tuple(a for a in self.addresses if self._held(a, now))

    def next(self, now: float) -> DialChoice:
        """The address to dial at ``now`` (monotonic seconds); consumes a redirect."""
        skipped: list[str] = []
        redirect, self._redirect = self._redirect, ""
        if redirect:
            if not self._held(redirect, now):
                return DialChoice(redirect, redirected=True)
            skipped.append(redirect)
        n = len(self.addresses)
        for k in range(n):
            address = self.addresses[(self._index + k) % n]
            if not self._held(address, now):
                self._index = (self._index + k + 1) % n
                return DialChoice(address, skipped=tuple(skipped))
            if address not in skipped:
                skipped.append(address)
        # Everything held off: the soonest to end it, ties in rotation order.
        order = [(self._index + k) % n for k in range(n)]
        pick = min(order, key=lambda i: self._held_until.get(self.addresses[i], 0.0))
        self._index = (pick + 1) % n
        address = self.addresses[pick]
        return DialChoice(address, skipped=tuple(a for a in skipped if a != address))

    def ended(self, address: str, now: float, end: DialEnd) -> float | None:
        """Record how the dial of ``address`` ended at ``now``; the pause before the next.

        An unreachable end (``DialEnd.reachable`` False) holds ``address`` off
        for ``hold_off_s``; any answer clears it. A Welcome restarts
        ``failures`` at 0. A NotLeader that asked for a pause, or a redirect
        that can be dialled at once (``redirect_usable``), keeps it: the
        coordinator asked for the redial, nothing failed. Anything else adds
        one.

        Returns:
            Seconds to wait before the next dial: the requested pause (capped
            at ``MAX_RETRY_AFTER_S``), 0.0 to dial a usable redirect at once;
            None: back off by ``failures`` (the shell's jittered exponential
            backoff).
        """
        # Drop expired hold-offs: one of an address a re-resolution dropped (a
        # pod back under a new address) is never read again, and would stay.
        self._held_until = {a: t for a, t in self._held_until.items() if t > now}
        if not end.reachable:
            if self.hold_off_s > 0:
                self._held_until[address] = now + self.hold_off_s
        else:
            self._held_until.pop(address, None)
        redirect_now = self.redirect_usable(now)
        if end.welcomed:
            self.failures = 0
        elif not (end.retry_after_s > 0 or redirect_now):
            self.failures += 1
        if end.retry_after_s > 0:
            return min(end.retry_after_s, MAX_RETRY_AFTER_S)
        if redirect_now:
            return 0.0
        return None

    def _held(self, address: str, now: float) -> bool:
        until = self._held_until.get(address)
        if until is None:
            return False
        if now >= until:
            del self._held_until[address]
            return False
        return True
