"""The event archive: the leaders' events in a Redis stream, so a watch survives failover.

Theory of operation: the leader's :class:`~coordinator.eventlog.EventLog` keeps
the current term's events in memory and hands each appended event to
:meth:`EventArchive.offer` (its sink). A background writer (:meth:`run`) ships
them in order to the Redis stream ``lazarus:{<cluster>}:events``: one ``XADD``
per write of up to :data:`WRITE_BATCH` events (a ``WatchEventsResponse``
holding them), whose explicit entry id ``<term>-<counter>`` is the revision
(``term << 32 | counter``) of the batch's last event, trimmed to about
``maxlen`` entries. One entry per batch keeps a recovery's burst of thousands
of events to a few round trips and little CPU on the leader. ``WatchEvents`` reads it back
(:meth:`read`) to replay what the leader's memory no longer holds: the tail of
the previous leader after a failover, or events pushed out of the ring buffer.

Redis stream ids must grow, and revisions grow across terms, so Redis itself
fences the archive: once a newer leader appended, a deposed leader's late
entries are refused ("equal or smaller than the target stream top item") and
dropped; the same reply for a batch re-sent after a lost reply means it was
already stored (a batch re-sent with more events after it gets a new id; a
reader drops the events it already returned). A Redis outage keeps the
backlog (bounded by ``max_backlog``; the oldest events are dropped beyond it,
and counted) and retries with backoff; the leader never waits for the archive.

What is not archived: events a leader emitted less than one write round trip
before it died (still in its backlog), and events dropped by the backlog
bound. A watcher that resumes from such a revision gets the events after it
without a gap notice, because revisions are not dense and the hole cannot be
seen; the archive is a best-effort replay, not a second source of truth (etcd
holds the state).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
from typing import Any

import redis.asyncio
import redis.exceptions

from coordinator.eventlog import COUNTER_BITS
from lazarus.storage.keys import events_stream_key
from lazarus.v1 import coordinator_pb2, records_pb2

__all__ = ["DEFAULT_MAXLEN", "EventArchive", "entry_id"]

_log = logging.getLogger("lazarus.coordinator.eventarchive")

DEFAULT_MAXLEN = 20_000
"""Entries (batches of events) the stream keeps, about (``XADD MAXLEN ~``)."""

DEFAULT_MAX_BACKLOG = 100_000
"""Events waiting for Redis at most; older ones are dropped beyond it."""

WRITE_BATCH = 512
"""Events per pipeline."""

READ_PAGE = 64
"""Entries (batches) per XRANGE when reading back."""

_FIELD = b"e"
_MASK = (1 << COUNTER_BITS) - 1


def entry_id(revision: int) -> str:
    """The stream entry id of an event revision: ``<term>-<counter>``."""
    return f"{revision >> COUNTER_BITS}-{revision & _MASK}"


def _revision(entry: bytes | str) -> int:
    text = entry.decode() if isinstance(entry, bytes) else entry
    term, _, counter = text.partition("-")
    return int(term) << COUNTER_BITS | int(counter)


class EventArchive:
    """Ships a leader's events to a Redis stream and reads them back.

    Args:
        client: a ``redis.asyncio.Redis`` (bytes replies).
        cluster: the cluster name.
        maxlen: entries the stream keeps, about.
        max_backlog: events held while Redis is unreachable, at most.
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        cluster: str,
        *,
        maxlen: int = DEFAULT_MAXLEN,
        max_backlog: int = DEFAULT_MAX_BACKLOG,
    ) -> None:
        if maxlen < 1 or max_backlog < 1:
            raise ValueError("maxlen and max_backlog must be >= 1")
        self._client = client
        self.key = events_stream_key(cluster)
        self._maxlen = maxlen
        self._backlog: collections.deque[records_pb2.Event] = collections.deque()
        self._max_backlog = max_backlog
        self._wake = asyncio.Event()
        self.dropped = 0
        """Events dropped by the backlog bound (never archived)."""
        self.refused = 0
        """Events Redis refused because a newer leader had archived past them."""
        self.archived = 0
        """Events stored (in entries Redis accepted)."""

    @property
    def backlog(self) -> int:
        """Events waiting for Redis."""
        return len(self._backlog)

    def offer(self, event: records_pb2.Event) -> None:
        """Queue a stamped event (revision set); never waits. The EventLog's sink."""
        self._backlog.append(event)
        if len(self._backlog) > self._max_backlog:
            self._backlog.popleft()
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 10_000 == 0:
                _log.warning(
                    "event archive backlog full (%d): %d events dropped so far",
                    self._max_backlog,
                    self.dropped,
                )
        self._wake.set()

    async def run(self) -> None:
        """Write the backlog until cancelled; Redis errors are retried with backoff."""
        failures = 0
        while True:
            if not self._backlog:
                self._wake.clear()
                await self._wake.wait()
            batch = [self._backlog[i] for i in range(min(WRITE_BATCH, len(self._backlog)))]
            try:
                stored = await self._write(batch)
            except (redis.exceptions.RedisError, OSError) as exc:
                failures += 1
                if failures == 1 or failures % 20 == 0:
                    _log.warning("event archive: Redis write failed (%s); retrying", exc)
                await asyncio.sleep(min(2.0, 0.1 * 2 ** min(failures, 5)) * random.uniform(0.5, 1))
                continue
            if failures:
                _log.info("event archive: Redis writes back after %d failures", failures)
            failures = 0
            written = batch[-1].revision  # offer() may have dropped some of the head meanwhile
            while self._backlog and self._backlog[0].revision <= written:
                self._backlog.popleft()
            self.archived += stored

    async def _write(self, batch: list[records_pb2.Event]) -> int:
        entry = coordinator_pb2.WatchEventsResponse(events=batch, revision=batch[-1].revision)
        try:
            await self._client.xadd(
                self.key,
                {_FIELD: entry.SerializeToString()},
                id=entry_id(batch[-1].revision),
                maxlen=self._maxlen,
                approximate=True,
            )
        except redis.exceptions.ResponseError as exc:
            if "equal or smaller" not in str(exc):
                raise
            self.refused += len(batch)  # a newer leader archived past it, or it is stored
            return 0
        return len(batch)

    async def oldest_revision(self) -> int:
        """Revision of the oldest archived event; 0 when the stream is empty.

        Raises:
            redis.exceptions.RedisError: Redis unreachable or failing (UNAVAILABLE).
        """
        entries: Any = await self._client.xrange(self.key, "-", "+", count=1)
        if not entries:
            return 0
        events = self._parse(entries[0][0], entries[0][1])
        return events[0].revision if events else _revision(entries[0][0])

    async def read(
        self, from_revision: int, before_revision: int, page: int = READ_PAGE
    ) -> tuple[list[records_pb2.Event], int]:
        """One page of archived events with ``from_revision <= revision < before_revision``.

        ``before_revision`` 0 means no upper bound. Entries that do not parse
        are skipped with an error log (never returned); events are returned
        once each, in increasing revision.

        Returns:
            The events, and the revision to read the next page from (0 when
            there is nothing more below ``before_revision``).

        Raises:
            redis.exceptions.RedisError: Redis unreachable or failing (UNAVAILABLE).
        """
        from_revision = max(from_revision, 1)
        # An entry's id is its last event's revision: the first entry holding
        # from_revision is the first whose id is >= it.
        entries: Any = await self._client.xrange(self.key, entry_id(from_revision), "+", count=page)
        out: list[records_pb2.Event] = []
        last = from_revision - 1
        for entry, fields in entries:
            for event in self._parse(entry, fields):
                if before_revision and event.revision >= before_revision:
                    return out, 0
                if event.revision > last:
                    out.append(event)
                    last = event.revision
        if len(entries) < page:
            return out, 0
        return out, _revision(entries[-1][0]) + 1

    def _parse(self, entry: Any, fields: Any) -> list[records_pb2.Event]:
        raw = (fields or {}).get(_FIELD)
        try:
            batch = coordinator_pb2.WatchEventsResponse.FromString(raw or b"")
        except Exception as exc:  # a corrupt entry: report it, never hand it out
            _log.error("event archive entry %r unreadable: %s", entry, exc)
            return []
        if not batch.events or batch.events[-1].revision != _revision(entry):
            _log.error("event archive entry %r does not end at its id", entry)
            return []
        return list(batch.events)
