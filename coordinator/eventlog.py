"""The leader's event log: a bounded ring buffer of cluster events and its watchers.

Theory of operation: the runtime appends every event the core emits (and a
``LeaderElected`` when it starts leading) as a records.proto ``Event``; the
log stamps it with a revision, keeps the newest ``capacity`` events and hands
each one to every open watcher (``WatchEvents`` streams). It decides nothing
about the cluster and does no IO; the gRPC servicer drains watchers.

**Revision scheme.** ``revision = term << 32 | counter``: the leader's term
(the etcd create revision of its election key, which only grows from one
leader to the next) in the high 32 bits and a per-term counter, 1, 2, 3, ...,
in the low 32 bits. Revisions therefore increase strictly across the
cluster's life, across failovers too, without any write to etcd, as long as
terms stay below 2**32 and one term emits fewer than 2**32 - 1 events (the
log refuses more: ``RevisionSpaceExhausted``). They are not dense: a new
term starts at ``term << 32 | 1``.

**Retention.** The log keeps the newest ``capacity`` (default 50,000) events
of the current term in the leader's memory. A new leader starts empty (its
first event is its ``LeaderElected``); the previous leader's tail is replayed
from the Redis archive (``coordinator.eventarchive``, fed through ``sink``) by
``WatchEvents``, not by this log.
``subscribe(from_revision)`` replays the retained events with revision >=
``from_revision`` and reports ``gap`` when ``from_revision`` is older than the
oldest retained event (the stream then starts at the oldest; see
``coordinator.api`` for how the gap is announced).

**Backpressure.** Each watcher has a bounded queue of live events
(``queue_limit``). ``append`` never waits: a watcher whose queue is full is
ended with RESOURCE_EXHAUSTED (its client resumes from its last revision + 1),
so a slow watcher cannot stall the leader. ``close_all`` ends every watcher
with UNAVAILABLE when leadership is lost.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import grpc

from lazarus.v1 import records_pb2

__all__ = [
    "COUNTER_BITS",
    "DEFAULT_CAPACITY",
    "DEFAULT_QUEUE_LIMIT",
    "EventFilter",
    "EventLog",
    "RevisionSpaceExhausted",
    "Watcher",
    "event_type",
    "make_revision",
]

DEFAULT_CAPACITY = 50_000
"""Events the leader retains for replay."""

DEFAULT_QUEUE_LIMIT = 10_000
"""Live events one watcher may have queued before it is ended (RESOURCE_EXHAUSTED)."""

COUNTER_BITS = 32
"""Low bits of a revision that count events within one term."""

_COUNTER_MAX = (1 << COUNTER_BITS) - 1

_NODE_FIELDS = ("node_id", "from_node_id", "to_node_id")


class RevisionSpaceExhausted(RuntimeError):
    """One term emitted 2**32 - 1 events, or a term does not fit in 32 bits."""


def make_revision(term: int, counter: int) -> int:
    """The revision of the ``counter``-th event (1-based) of ``term``.

    Raises:
        RevisionSpaceExhausted: the term or counter does not fit its bits.
    """
    if not 0 <= term < (1 << (64 - COUNTER_BITS)) or not 0 <= counter <= _COUNTER_MAX:
        raise RevisionSpaceExhausted(f"term {term} / counter {counter} out of range")
    return (term << COUNTER_BITS) | counter


def event_type(event: records_pb2.Event) -> int:
    """The EventType value of an event (its body's field number; 0 when unset)."""
    which = event.WhichOneof("body")
    if which is None:
        return 0
    return int(event.DESCRIPTOR.fields_by_name[which].number)


@dataclass(frozen=True, slots=True)
class EventFilter:
    """Which events a watcher wants; the parts combine with AND, empty matches all.

    Attributes:
        types: EventType values.
        task_id: events whose body names this task (``task_id``).
        node_id: events whose body names this node (``node_id``,
            ``from_node_id`` or ``to_node_id``).
    """

    types: frozenset[int] = frozenset()
    task_id: str = ""
    node_id: str = ""

    def matches(self, event: records_pb2.Event) -> bool:
        """True when the event passes every part of the filter."""
        if self.types and event_type(event) not in self.types:
            return False
        if not self.task_id and not self.node_id:
            return True
        which = event.WhichOneof("body")
        if which is None:
            return False
        body = getattr(event, which)
        names = body.DESCRIPTOR.fields_by_name
        if self.task_id and ("task_id" not in names or body.task_id != self.task_id):
            return False
        if self.node_id:
            return any(
                name in names and getattr(body, name) == self.node_id for name in _NODE_FIELDS
            )
        return True


class Watcher:
    """One subscriber: replayed events, then live ones, through a bounded queue.

    Attributes:
        filter: what it wants.
        gap: True when the replay could not start at the requested revision
            (it starts at ``first_revision`` instead).
        first_revision: the oldest retained revision at subscription (0: none).
        closed: the (code, message) that ends it, once ended.
    """

    def __init__(
        self, event_filter: EventFilter, cursor: int, queue_limit: int, *, gap: bool, first: int
    ) -> None:
        self.filter = event_filter
        self.gap = gap
        self.first_revision = first
        self.closed: tuple[grpc.StatusCode, str] | None = None
        self._queue: collections.deque[records_pb2.Event] = collections.deque()
        self._limit = queue_limit
        self._wake = asyncio.Event()
        self._cursor = cursor

    @property
    def cursor(self) -> int:
        """Every event up to this revision was offered (queued or filtered out)."""
        return self._cursor

    def _offer(self, event: records_pb2.Event, *, replay: bool = False) -> None:
        if self.closed is not None:
            return
        if self.filter.matches(event):
            if not replay and len(self._queue) >= self._limit:
                self._close(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"watcher fell {self._limit} events behind; resume from revision "
                    f"{self.delivered_revision() + 1}",
                )
                return
            self._queue.append(event)
            self._wake.set()
        self._cursor = max(self._cursor, event.revision)

    def _close(self, code: grpc.StatusCode, message: str) -> None:
        if self.closed is None:
            self.closed = (code, message)
            self._wake.set()

    def delivered_revision(self) -> int:
        """The revision a client has safely seen everything up to, given what is queued."""
        if self._queue:
            return self._queue[0].revision - 1
        return self._cursor

    def take(self, limit: int) -> tuple[list[records_pb2.Event], int]:
        """Up to ``limit`` queued events and the revision to report with them.

        Returns:
            (events, revision): ``revision`` is the cursor when the queue is now
            empty, else the last taken event's revision.
        """
        events: list[records_pb2.Event] = []
        while self._queue and len(events) < limit:
            events.append(self._queue.popleft())
        if not self._queue:
            self._wake.clear()
            return events, self._cursor
        return events, events[-1].revision

    @property
    def pending(self) -> int:
        """Events queued and not taken."""
        return len(self._queue)

    async def wait(self, timeout_s: float | None) -> bool:
        """Wait until an event is queued or the watcher is closed.

        Returns:
            False when ``timeout_s`` passed first.
        """
        if self._queue or self.closed is not None:
            return True
        try:
            async with asyncio.timeout(timeout_s):
                await self._wake.wait()
        except TimeoutError:
            return False
        return True


class EventLog:
    """The bounded, revisioned event buffer of the current leadership; see the module docstring.

    Args:
        capacity: events retained for replay (>= 1).
        queue_limit: live events a watcher may have queued (>= 1).
    """

    def __init__(
        self, capacity: int = DEFAULT_CAPACITY, queue_limit: int = DEFAULT_QUEUE_LIMIT
    ) -> None:
        if capacity < 1 or queue_limit < 1:
            raise ValueError("capacity and queue_limit must be >= 1")
        self.capacity = capacity
        self.queue_limit = queue_limit
        self._buffer: collections.deque[records_pb2.Event] = collections.deque(maxlen=capacity)
        self._term = 0
        self._counter = 0
        self._watchers: set[Watcher] = set()
        self.sink: Callable[[records_pb2.Event], None] | None = None
        """Called with every stamped event (the Redis archive's ``offer``); must not block."""

    @property
    def events(self) -> collections.deque[records_pb2.Event]:
        """The retained events, oldest first (read only)."""
        return self._buffer

    @property
    def term(self) -> int:
        """The term whose events the log holds (0 before the first)."""
        return self._term

    @property
    def last_revision(self) -> int:
        """Revision of the newest event, or of the term's start when it has none yet."""
        return make_revision(self._term, self._counter)

    @property
    def oldest_revision(self) -> int:
        """Revision of the oldest retained event (0 when empty)."""
        return self._buffer[0].revision if self._buffer else 0

    @property
    def watchers(self) -> int:
        """Open watchers."""
        return len(self._watchers)

    def begin_term(self, term: int) -> None:
        """Start a new leadership: end old watchers (UNAVAILABLE) and forget old events."""
        self.close_all("leadership changed; resume from your last revision + 1")
        make_revision(term, 0)  # checks the term fits
        self._buffer.clear()
        self._term = term
        self._counter = 0

    def append(self, event: records_pb2.Event) -> records_pb2.Event:
        """Stamp ``event`` with the next revision, retain it and offer it to every watcher.

        Returns:
            The same message, ``revision`` (and ``term``) set.

        Raises:
            RevisionSpaceExhausted: the term's counter is spent.
        """
        self._counter += 1
        event.revision = make_revision(self._term, self._counter)
        event.term = self._term
        self._buffer.append(event)
        if self.sink is not None:
            self.sink(event)
        for watcher in list(self._watchers):
            watcher._offer(event)
            if watcher.closed is not None:
                self._watchers.discard(watcher)
        return event

    def subscribe(self, from_revision: int, event_filter: EventFilter) -> Watcher:
        """Open a watcher: retained events with revision >= ``from_revision``, then live ones.

        ``from_revision`` 0 means live events only. A ``from_revision`` older
        than the oldest retained event starts at the oldest with ``gap`` set.
        """
        last = self.last_revision
        if from_revision == 0:
            watcher = Watcher(event_filter, last, self.queue_limit, gap=False, first=0)
            self._watchers.add(watcher)
            return watcher
        oldest = self.oldest_revision
        if self._buffer:
            gap = from_revision < oldest
        else:  # nothing retained: a revision of an older term missed what we cannot replay
            gap = from_revision <= make_revision(self._term, 0)
        cursor = max(0, min(from_revision - 1, last))
        watcher = Watcher(event_filter, cursor, self.queue_limit, gap=gap, first=oldest)
        for event in _since(self._buffer, from_revision):
            watcher._offer(event, replay=True)
        self._watchers.add(watcher)
        return watcher

    def unsubscribe(self, watcher: Watcher) -> None:
        """Forget a watcher (its stream ended)."""
        self._watchers.discard(watcher)

    def close_all(self, message: str) -> None:
        """End every watcher with UNAVAILABLE (this replica stopped leading)."""
        for watcher in list(self._watchers):
            watcher._close(grpc.StatusCode.UNAVAILABLE, message)
        self._watchers.clear()


def _since(
    buffer: collections.deque[records_pb2.Event], from_revision: int
) -> Iterable[records_pb2.Event]:
    if not buffer or buffer[-1].revision < from_revision:
        return ()
    if buffer[0].revision >= from_revision:
        return list(buffer)
    # Binary search on the (strictly increasing) revisions.
    lo, hi = 0, len(buffer) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if buffer[mid].revision >= from_revision:
            hi = mid
        else:
            lo = mid + 1
    return [buffer[i] for i in range(lo, len(buffer))]
