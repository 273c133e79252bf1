"""Ship task checkpoints and journal events to Redis, fenced by epoch.

The Redis layout, the Lua script and the fenced client live in
:mod:`lazarus.storage.replica` (re-exported here for the agent's callers).
:class:`Replicator` is the node agent's background shipper: a FIFO of
:class:`ReplicationItem` bounded by ``max_backlog`` records, shipped in
pipelined batches (one EVALSHA per item; a pipeline runs its commands in order
on one connection, so per-task order holds), retried with jittered exponential
backoff while Redis is unreachable, coalesced when a newer checkpoint of the
same epoch covers everything queued before it.

Ordering rule: an item's events are written before its checkpoint, and an item
is written only after every earlier item of its task was acknowledged (or
merged into a later one, see :func:`absorbs`). Hence Redis always holds a
consistent prefix of the task's history: a checkpoint plus journal events
after its covers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import redis.exceptions
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_never,
    wait_random_exponential,
)

from lazarus.storage.errors import InvalidArgument
from lazarus.storage.replica import (
    DEFAULT_PREFIX,
    MAX_SAFE_INT,
    REPLICATE_LUA,
    RETRYABLE_ERRORS,
    CheckpointReplica,
    ClaimBatcher,
    Outcome,
    RedisCheckpointReplica,
    RemoteState,
    ReplicationItem,
    ReplicationResult,
    absorbs,
    task_keys,
)

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_REPLICATION_LINGER_S",
    "MAX_SAFE_INT",
    "REPLICATE_LUA",
    "RETRYABLE_ERRORS",
    "CheckpointReplica",
    "ClaimBatcher",
    "Outcome",
    "RedisCheckpointReplica",
    "RemoteState",
    "ReplicationItem",
    "ReplicationObserver",
    "ReplicationResult",
    "Replicator",
    "ReplicatorClosed",
    "absorbs",
    "task_keys",
]

_log = logging.getLogger("lazarus.replication")

DEFAULT_REPLICATION_LINGER_S = 0.5
"""The agent's default ``linger_s`` for records of ``local``-durability tasks.

Their writers never wait for Redis, so a record may wait this long for others
to share its round trip, and a task's checkpoints queued meanwhile coalesce
into its newest. At a few checkpoints per second per agent, 0.1 s still left
about one record per round trip; 0.5 s cut the agent's CPU per checkpoint from
1.27 to 0.87 ms and Redis's from 0.20 to 0.07 ms (CPU-bound handlers, process
isolation, 2 agents x 2 slots; ``bench/taskpath_bench.py``). The price: the
Redis copy a new owner resumes from after a node loss lags by at most this
much more (a stop with flush ships at once).
"""


def _log_notify_failure(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        _log.error("replicator wake-up failed: %r", task.exception())


class ReplicatorClosed(RuntimeError):
    """The replicator is closed: submit refused, or an item left unacknowledged at close."""


class ReplicationObserver:
    """Metrics hooks of a :class:`Replicator`; subclass and override what you need (no-ops)."""

    def batch_shipped(self, items: int, records: int, round_trip_s: float) -> None:
        """A batch was acknowledged by Redis; ``round_trip_s`` in seconds."""

    def item_resolved(self, outcome: Outcome) -> None:
        """An item's future resolved with ``outcome`` (once per submitted item)."""

    def item_failed(self, error: BaseException) -> None:
        """An item's future failed with a non-retryable error."""

    def outage_started(self) -> None:
        """The first retryable error after a success."""

    def outage_ended(self, duration_s: float) -> None:
        """The backlog drained after an outage that lasted ``duration_s`` seconds."""


@dataclass(eq=False, slots=True)
class _Entry:
    item: ReplicationItem
    futures: list[asyncio.Future[ReplicationResult]]
    enqueued_s: float
    attempts: int = 0
    urgent: bool = True  # someone may wait for it: ship without lingering


class Replicator:
    """Background shipper of :class:`ReplicationItem` to a replica, in order, bounded.

    Args:
        replica: usually a :class:`RedisCheckpointReplica`. Give its client few
            or no retries of its own; this class retries forever.
        max_backlog: bound on queued + in-flight records (events + checkpoints);
            ``submit`` waits while it would be exceeded (an item larger than the
            bound is admitted alone into an empty backlog).
        max_batch_items: items per pipelined round trip.
        retry_initial_s: first backoff bound, seconds (tenacity's
            ``wait_random_exponential``: full jitter, as in the AWS architecture blog).
        retry_max_s: backoff cap, seconds.
        observer: metrics hooks.
        clock: monotonic seconds, for lag.
        linger_s: how long an item submitted with ``linger=True`` may wait in the
            queue for others to share its round trip, seconds (0 = none). As
            Kafka's producer ``linger.ms``: at a few checkpoints per second per
            agent every item otherwise pays a whole round trip (loop wake-ups,
            redis-py's pipeline, a Redis read and write) for one EVALSHA. An
            urgent item, :meth:`flush` or :meth:`close` ships everything queued
            at once.
    """

    def __init__(
        self,
        replica: CheckpointReplica,
        *,
        max_backlog: int = 10_000,
        max_batch_items: int = 64,
        retry_initial_s: float = 0.02,
        retry_max_s: float = 1.0,
        observer: ReplicationObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
        linger_s: float = 0.0,
    ) -> None:
        if max_backlog < 1:
            raise InvalidArgument("max_backlog", f"{max_backlog} < 1")
        if max_batch_items < 1:
            raise InvalidArgument("max_batch_items", f"{max_batch_items} < 1")
        if retry_initial_s <= 0 or retry_max_s < retry_initial_s:
            raise InvalidArgument("retry_max_s", "need 0 < retry_initial_s <= retry_max_s")
        if not 0 <= linger_s <= 10:
            raise InvalidArgument("linger_s", f"{linger_s} not in [0, 10]")
        self._linger_s = linger_s
        self._flush_all = False  # flush(): ship what is queued now, lingering or not
        self._blocked = 0  # submitters waiting for room in the backlog
        self._replica = replica
        self._max_backlog = max_backlog
        self._max_batch_items = max_batch_items
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self._observer = observer or ReplicationObserver()
        self._clock = clock
        self._queue: OrderedDict[int, _Entry] = OrderedDict()
        self._by_task: dict[str, list[int]] = {}
        self._next_id = 0
        self._inflight: list[_Entry] = []
        self._backlog = 0
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._outage_since: float | None = None
        self.errors_total = 0
        """Items failed with a non-retryable error, plus failed round trips (retried)."""

    # -- observation

    @property
    def linger_s(self) -> float:
        """Seconds a lingering item may wait for company (``linger_s`` of the constructor)."""
        return self._linger_s

    @property
    def backlog_records(self) -> int:
        """Records (events + checkpoints) queued or in flight."""
        return self._backlog

    @property
    def backlog_items(self) -> int:
        """Items queued or in flight."""
        return len(self._queue) + len(self._inflight)

    @property
    def lag_seconds(self) -> float:
        """Age of the oldest unacknowledged item, seconds; 0.0 when empty."""
        oldest = [e.enqueued_s for e in self._inflight]
        oldest += [e.enqueued_s for e in self._queue.values()]
        if not oldest:
            return 0.0
        return max(0.0, self._clock() - min(oldest))

    @property
    def in_outage(self) -> bool:
        """True from a failed round trip until the backlog drains again."""
        return self._outage_since is not None

    # -- lifecycle

    async def start(self) -> None:
        """Start the background sender task (idempotent)."""
        if self._closed:
            raise ReplicatorClosed("replicator is closed")
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="lazarus-replicator")

    async def close(self, drain_timeout_s: float = 5.0) -> None:
        """Stop accepting items, wait up to ``drain_timeout_s`` seconds for the backlog, stop.

        Futures still unacknowledged then fail with :class:`ReplicatorClosed`;
        the items stay in the local store and are shipped again after a restart.
        """
        if self._closed:
            return
        self._closed = True
        async with self._changed:
            self._changed.notify_all()
            if self._task is not None and not self._task.done():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(drain_timeout_s):
                        await self._changed.wait_for(lambda: self.backlog_items == 0)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        leftover = [*self._inflight, *self._queue.values()]
        self._inflight = []
        self._queue.clear()
        self._by_task.clear()
        self._backlog = 0
        for entry in leftover:
            self._fail(entry, ReplicatorClosed("closed before Redis acknowledged the item"))

    # -- submit

    async def submit(
        self, item: ReplicationItem, *, linger: bool = False, age_s: float = 0.0
    ) -> asyncio.Future[ReplicationResult]:
        """Queue an item; wait while the backlog is full.

        With ``linger``, the item may wait up to ``linger_s`` for others to share
        its round trip: for writers that do not wait for the answer (local
        durability). Per-task order holds either way (the queue is FIFO).
        ``age_s`` (seconds, >= 0) is how long the item already waited before it
        was submitted (its writer committed it that long ago): the linger and
        the lag count from then.

        Returns:
            A future resolving with the item's :class:`ReplicationResult` once
            Redis acknowledged it (or a later item it was merged into): OK, or
            DUPLICATE when Redis already held it before this replicator sent it
            (both mean "replicated"; DUPLICATE after our own retry of a batch
            whose reply was lost is reported as OK); STALE when the task's
            writer was fenced. Fails with a Redis ``ResponseError`` (script
            error, counted in ``errors_total``) or :class:`ReplicatorClosed`.

        Raises:
            ReplicatorClosed: the replicator is closed.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ReplicationResult] = loop.create_future()
        async with self._changed:
            while True:
                if self._closed:
                    raise ReplicatorClosed("replicator is closed")
                merge_ids = self._mergeable(item)
                freed = sum(self._queue[i].item.records for i in merge_ids)
                after = self._backlog - freed + item.records
                if after <= self._max_backlog or self._backlog - freed == 0:
                    break
                self._blocked += 1  # the queue ships at once, lingering or not
                try:
                    await self._changed.wait()
                finally:
                    self._blocked -= 1
            was_empty = not self._queue
            entry = _Entry(item, [future], self._clock() - max(0.0, age_s), urgent=not linger)
            for i in merge_ids:
                old = self._remove(i)
                entry.futures.extend(old.futures)
                entry.enqueued_s = min(entry.enqueued_s, old.enqueued_s)
                entry.urgent = entry.urgent or old.urgent
            entry_id = self._next_id
            self._next_id += 1
            self._queue[entry_id] = entry
            self._by_task.setdefault(item.task_id, []).append(entry_id)
            self._backlog += item.records
            # Wake the sender only when this item moves its deadline: an urgent
            # item, the first one, a full batch, a blocked submitter (a merge
            # may have freed room). A lingering item joining a lingering queue
            # keeps the oldest entry's deadline: waking for it would cost the
            # loop a task step per checkpoint for nothing.
            if (
                not linger
                or was_empty
                or self._blocked
                or len(self._queue) >= self._max_batch_items
            ):
                self._changed.notify_all()
        return future

    def _mergeable(self, item: ReplicationItem) -> list[int]:
        """Ids of the contiguous suffix of the task's queued entries that ``item`` absorbs."""
        if item.checkpoint is None:
            return []
        ids = self._by_task.get(item.task_id, [])
        out: list[int] = []
        for i in reversed(ids):
            if not absorbs(item, self._queue[i].item):
                break
            out.append(i)
        return out

    def _remove(self, entry_id: int) -> _Entry:
        entry = self._queue.pop(entry_id)
        ids = self._by_task[entry.item.task_id]
        ids.remove(entry_id)
        if not ids:
            del self._by_task[entry.item.task_id]
        self._backlog -= entry.item.records
        return entry

    # -- sending

    def flush(self) -> None:
        """Ship what is queued, and what is submitted before the next round trip,
        without waiting out its linger (a stop may flush just before its last
        records are submitted)."""
        if not self._flush_all:
            self._flush_all = True
            self._wake()

    def _wake(self) -> None:
        asyncio.ensure_future(self._notify()).add_done_callback(_log_notify_failure)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _linger_left_s(self) -> float:
        """Seconds until the queue must be shipped; 0 = now (call with the lock held)."""
        if self._closed or self._flush_all or self._blocked or not self._linger_s:
            return 0.0
        if len(self._queue) >= self._max_batch_items:
            return 0.0
        oldest = None
        for entry in self._queue.values():
            if entry.urgent:
                return 0.0
            if oldest is None or entry.enqueued_s < oldest:
                oldest = entry.enqueued_s
        if oldest is None:
            return 0.0
        return max(0.0, oldest + self._linger_s - self._clock())

    async def _run(self) -> None:
        while True:
            async with self._changed:
                while True:
                    await self._changed.wait_for(lambda: bool(self._queue))
                    left = self._linger_left_s()
                    if left <= 0:
                        break
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(left):
                            await self._changed.wait()
                batch: list[_Entry] = []
                while self._queue and len(batch) < self._max_batch_items:
                    batch.append(self._remove(next(iter(self._queue))))
                if not self._queue:
                    self._flush_all = False
                self._inflight = batch
                self._backlog += sum(e.item.records for e in batch)
            try:
                results = await self._ship(batch)
            except Exception as e:  # not retryable and not per item: the whole batch fails
                _log.error("replication batch of %d items failed: %r", len(batch), e)
                results = [e] * len(batch)
            async with self._changed:
                self._inflight = []
                self._backlog -= sum(e.item.records for e in batch)
                for entry, result in zip(batch, results, strict=True):
                    self._settle(entry, result)
                if self._outage_since is not None and self.backlog_items == 0:
                    duration_s = self._clock() - self._outage_since
                    self._outage_since = None
                    _log.info("replication caught up after a Redis outage of %.1f s", duration_s)
                    self._observer.outage_ended(duration_s)
                self._changed.notify_all()

    async def _ship(self, batch: list[_Entry]) -> list[ReplicationResult | Exception]:
        """Send the batch until Redis answers; retryable errors back off and repeat.

        The first attempt goes without tenacity's machinery (the common case, once
        per round trip); after a retryable failure tenacity backs off and repeats.
        """
        items = [e.item for e in batch]
        try:
            return await self._attempt(batch, items)
        except RETRYABLE_ERRORS as exc:
            self._retried(exc)
            await asyncio.sleep(random.uniform(0, self._retry_initial_s))
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(RETRYABLE_ERRORS),
            wait=wait_random_exponential(multiplier=self._retry_initial_s, max=self._retry_max_s),
            stop=stop_never,
            before_sleep=self._on_retry,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await self._attempt(batch, items)
        raise AssertionError("unreachable: stop_never")  # pragma: no cover

    async def _attempt(
        self, batch: list[_Entry], items: list[ReplicationItem]
    ) -> list[ReplicationResult | Exception]:
        for entry in batch:
            entry.attempts += 1
        started = self._clock()
        results = await self._replica.write_many(items)
        if len(results) != len(items):
            raise redis.exceptions.ResponseError(
                f"replica answered {len(results)} results for {len(items)} items"
            )
        for r in results:
            if isinstance(r, redis.exceptions.NoScriptError | redis.exceptions.ReadOnlyError):
                # Script cache flushed mid-batch, or a failover left us on a replica:
                # writes are idempotent, so send the whole batch again.
                raise r
        records = sum(i.records for i in items)
        self._observer.batch_shipped(len(items), records, self._clock() - started)
        return results

    def _on_retry(self, state: RetryCallState) -> None:
        self._retried(state.outcome.exception() if state.outcome is not None else None)

    def _retried(self, error: BaseException | None) -> None:
        self.errors_total += 1
        if self._outage_since is None:
            self._outage_since = self._clock()
            _log.warning(
                "Redis unreachable (%s: %s); keeping %d records queued and retrying",
                type(error).__name__,
                error,
                self._backlog,
            )
            self._observer.outage_started()

    def _settle(self, entry: _Entry, result: ReplicationResult | Exception) -> None:
        if isinstance(result, Exception):
            self.errors_total += 1
            self._fail(entry, result)
            return
        if result.outcome is Outcome.DUPLICATE and entry.attempts > 1:
            # An earlier attempt of this very batch landed but its reply was lost.
            result = ReplicationResult(Outcome.OK, result.current_epoch, result.gap)
        self._resolve(entry, result)
        if result.outcome is Outcome.STALE:
            self._fence(entry.item.task_id, result.current_epoch)

    def _fence(self, task_id: str, current_epoch: int) -> None:
        """Resolve queued items of a fenced writer (epoch below the fence) with STALE."""
        stale = ReplicationResult(Outcome.STALE, current_epoch)
        for i in list(self._by_task.get(task_id, [])):
            if self._queue[i].item.epoch < current_epoch:
                self._resolve(self._remove(i), stale)

    def _resolve(self, entry: _Entry, result: ReplicationResult) -> None:
        for f in entry.futures:
            if not f.done():
                f.set_result(result)
                self._observer.item_resolved(result.outcome)

    def _fail(self, entry: _Entry, error: BaseException) -> None:
        for f in entry.futures:
            if not f.done():
                f.set_exception(error)
                self._observer.item_failed(error)
