"""Replicator logic against an in-memory fake of the replica (no Redis).

The fake mirrors the Lua script's rules (fence, idempotence per (epoch, seq),
compaction) so the tests can check what Redis would hold after every batch.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
import redis.exceptions
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lazarus.storage.replica import _remote_state
from lazarus.v1 import records_pb2
from node_agent.replication import (
    Outcome,
    ReplicationItem,
    ReplicationResult,
    Replicator,
    ReplicatorClosed,
    absorbs,
)

# ---------------------------------------------------------------- helpers


def ev(task: str, seq: int, epoch: int = 1) -> records_pb2.JournalEventRecord:
    return records_pb2.JournalEventRecord(task_id=task, seq=seq, epoch=epoch)


def ck(task: str, seq: int, covers: int, epoch: int = 1) -> records_pb2.CheckpointRecord:
    return records_pb2.CheckpointRecord(
        task_id=task, seq=seq, epoch=epoch, covers_journal_seq=covers
    )


def item(
    task: str,
    seqs: Sequence[int] = (),
    checkpoint: records_pb2.CheckpointRecord | None = None,
    epoch: int = 1,
) -> ReplicationItem:
    return ReplicationItem(
        task, epoch, "node-a", tuple(ev(task, s, epoch) for s in seqs), checkpoint
    )


@dataclass
class TaskState:
    epoch: int = 0
    ckpt: tuple[int, int] = (0, 0)  # (epoch, seq)
    covers: int = 0
    journal_seq: int = 0
    events: dict[int, int] = field(default_factory=dict)  # seq -> epoch


class FakeReplica:
    """In-memory replica with the Lua script's semantics and injectable faults."""

    def __init__(self) -> None:
        self.tasks: dict[str, TaskState] = {}
        self.calls: list[list[ReplicationItem]] = []
        self.fail_next = 0
        self.lose_reply_next = 0
        self.noscript_next = 0
        self.gate: asyncio.Event | None = None
        self.script_error_for: set[int] = set()  # id(item)
        self.violations: list[str] = []

    def apply(self, it: ReplicationItem) -> ReplicationResult:
        s = self.tasks.setdefault(it.task_id, TaskState())
        if it.epoch < s.epoch:
            return ReplicationResult(Outcome.STALE, s.epoch)
        raised = it.epoch > s.epoch
        s.epoch = it.epoch
        changed = False
        for e in it.events:
            if e.seq > s.covers and s.events.get(e.seq, 0) < e.epoch:
                s.events[e.seq] = e.epoch
                s.journal_seq = max(s.journal_seq, e.seq)
                changed = True
        c = it.checkpoint
        if c is not None and (c.epoch, c.seq) > s.ckpt:
            s.ckpt = (c.epoch, c.seq)
            s.covers = c.covers_journal_seq
            s.events = {q: ep for q, ep in s.events.items() if q > s.covers}
            s.journal_seq = max(s.journal_seq, s.covers)
            changed = True
        self._check(it.task_id, s)
        del raised
        return ReplicationResult(Outcome.OK if changed else Outcome.DUPLICATE, s.epoch)

    def _check(self, task: str, s: TaskState) -> None:
        """Redis must hold a consistent prefix: a checkpoint then gap-free events."""
        expected = list(range(s.covers + 1, s.journal_seq + 1))
        if sorted(s.events) != expected:
            self.violations.append(f"{task}: events {sorted(s.events)} != {expected}")

    async def write_many(
        self, items: Sequence[ReplicationItem]
    ) -> list[ReplicationResult | Exception]:
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(0)
        if self.fail_next:
            self.fail_next -= 1
            raise redis.exceptions.ConnectionError("connection refused")
        if self.noscript_next:
            self.noscript_next -= 1
            return [redis.exceptions.NoScriptError("NOSCRIPT No matching script")] * len(items)
        self.calls.append(list(items))
        out: list[ReplicationResult | Exception] = []
        for it in items:
            if id(it) in self.script_error_for:
                out.append(redis.exceptions.ResponseError("ERR script blew up"))
            else:
                out.append(self.apply(it))
        if self.lose_reply_next:
            self.lose_reply_next -= 1
            raise redis.exceptions.TimeoutError("reply lost")
        return out

    def shipped(self, task: str) -> list[ReplicationItem]:
        return [it for call in self.calls for it in call if it.task_id == task]


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


async def settle(futures: Sequence[asyncio.Future[ReplicationResult]]) -> list[ReplicationResult]:
    async with asyncio.timeout(5):
        return list(await asyncio.gather(*futures))


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("make", "field_name"),
    [
        (lambda: ReplicationItem("", 1, "n", (ev("", 1),)), "task_id"),
        (lambda: ReplicationItem("t", 0, "n", (ev("t", 1),)), "epoch"),
        (lambda: ReplicationItem("t", 1, "", (ev("t", 1),)), "node_id"),
        (lambda: ReplicationItem("t", 1, "n", (ev("t", 0),)), "events[0].seq"),
        (lambda: ReplicationItem("t", 1, "n", (ev("t", 2), ev("t", 2))), "events[1].seq"),
        (lambda: ReplicationItem("t", 1, "n", (ev("t", 3), ev("t", 1))), "events[1].seq"),
        (lambda: ReplicationItem("t", 1, "n", (ev("t", 1, epoch=2),)), "events[0].epoch"),
        (lambda: ReplicationItem("t", 1, "n", (ev("u", 1),)), "events[0].task_id"),
        (lambda: ReplicationItem("t", 1, "n", (), ck("t", 0, 0)), "checkpoint.seq"),
        (lambda: ReplicationItem("t", 1, "n", (), ck("t", 1, 0, epoch=2)), "checkpoint.epoch"),
        (lambda: ReplicationItem("t", 1, "n", ()), "events"),
        (lambda: ReplicationItem("t\n", 1, "n", (ev("t\n", 1),)), "task_id"),
    ],
)
def test_bad_item_raises_value_error_naming_the_field(make: object, field_name: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(field_name) + ":"):
        make()  # type: ignore[operator]


def test_absorbs_rule() -> None:
    newer = item("t", (9,), ck("t", 3, 6))
    assert absorbs(newer, item("t", (5, 6)))
    assert absorbs(newer, item("t", (), ck("t", 2, 4)))
    assert not absorbs(newer, item("t", (6, 7)))  # 7 is not covered
    assert not absorbs(newer, item("t", (), ck("t", 3, 6)))  # not superseded
    assert not absorbs(newer, item("u", (1,)))  # other task
    assert not absorbs(newer, item("t", (1,), epoch=2))  # other epoch
    assert not absorbs(item("t", (9,)), item("t", (1,)))  # no checkpoint


# ---------------------------------------------------------------- ordering and batching


async def test_per_task_fifo_order_and_batching() -> None:
    fake = FakeReplica()
    rep = Replicator(fake, max_backlog=1000, max_batch_items=8)
    futures = []
    for s in range(1, 21):
        for t in ("a", "b"):
            futures.append(await rep.submit(item(t, (s,))))
    await rep.start()
    results = await settle(futures)
    await rep.close(1)
    assert {r.outcome for r in results} == {Outcome.OK}
    assert len(fake.calls) == 5  # 40 items, 8 per round trip
    for t in ("a", "b"):
        assert [it.events[0].seq for it in fake.shipped(t)] == list(range(1, 21))
    assert fake.violations == []
    assert rep.backlog_records == 0


# ---------------------------------------------------------------- linger


async def test_lingering_items_share_one_round_trip_after_the_linger() -> None:
    """local durability: nobody waits, so items wait up to linger_s for company."""
    fake = FakeReplica()
    rep = Replicator(fake, max_backlog=1000, linger_s=0.2)
    await rep.start()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    futures = [await rep.submit(item("a", (1,)), linger=True)]
    await asyncio.sleep(0.05)
    futures.append(await rep.submit(item("b", (1,)), linger=True))
    futures.append(await rep.submit(item("a", (2,)), linger=True))
    await asyncio.sleep(0.05)
    assert fake.calls == []  # still lingering
    results = await settle(futures)
    took = loop.time() - t0
    await rep.close(1)
    assert {r.outcome for r in results} == {Outcome.OK}
    assert len(fake.calls) == 1  # three items, one round trip
    assert [(it.task_id, it.events[0].seq) for it in fake.calls[0]] == [
        ("a", 1),
        ("b", 1),
        ("a", 2),
    ]
    assert 0.19 <= took < 1.0  # from the first item's submit, not the last's


async def test_an_urgent_item_ships_the_lingering_ones_with_it_at_once() -> None:
    fake = FakeReplica()
    rep = Replicator(fake, max_backlog=1000, linger_s=5.0)
    await rep.start()
    lazy = await rep.submit(item("a", (1,)), linger=True)
    await asyncio.sleep(0.02)
    assert fake.calls == []
    urgent = await rep.submit(item("b", (1,)))  # durability=replicated: its writer waits
    async with asyncio.timeout(1.0):
        await settle([lazy, urgent])
    await rep.close(1)
    assert [[it.task_id for it in call] for call in fake.calls] == [["a", "b"]]


async def test_flush_and_close_ship_what_lingers_at_once() -> None:
    fake = FakeReplica()
    rep = Replicator(fake, max_backlog=1000, linger_s=5.0)
    await rep.start()
    first = await rep.submit(item("a", (1,)), linger=True)
    await asyncio.sleep(0.02)
    rep.flush()  # a task stops with flush (SIGTERM, drain, migrate)
    async with asyncio.timeout(1.0):
        await settle([first])
    second = await rep.submit(item("a", (2,)), linger=True)  # lingers again
    await asyncio.sleep(0.02)
    assert len(fake.calls) == 1
    async with asyncio.timeout(1.0):
        await rep.close(2.0)
    assert (await settle([second]))[0].outcome is Outcome.OK
    assert [it.events[0].seq for it in fake.shipped("a")] == [1, 2]


async def test_a_flush_before_the_last_records_are_submitted_still_covers_them() -> None:
    """A stop flushes, then its handler thread's last records reach the queue."""
    fake = FakeReplica()
    rep = Replicator(fake, max_backlog=1000, linger_s=5.0)
    await rep.start()
    rep.flush()
    await asyncio.sleep(0.01)
    late = await rep.submit(item("a", (1,)), linger=True)
    async with asyncio.timeout(1.0):
        await settle([late])
    await rep.close(1)


async def test_without_linger_an_item_ships_at_once() -> None:
    fake = FakeReplica()
    rep = Replicator(fake, max_backlog=1000)  # linger_s=0: the default of the class
    await rep.start()
    fut = await rep.submit(item("a", (1,)), linger=True)
    async with asyncio.timeout(0.5):
        await settle([fut])
    await rep.close(1)


def test_linger_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="linger_s"):
        Replicator(FakeReplica(), linger_s=-0.1)


async def test_events_before_the_checkpoint_that_covers_them() -> None:
    fake = FakeReplica()
    rep = Replicator(fake, max_backlog=1000, max_batch_items=1)
    await rep.start()
    futures = [
        await rep.submit(item("t", (1, 2))),
        await rep.submit(item("t", (3,), ck("t", 1, 3))),
    ]
    await settle(futures)
    await rep.close(1)
    assert fake.tasks["t"].covers == 3
    assert fake.violations == []


# ---------------------------------------------------------------- coalescing


async def test_checkpoint_absorbs_covered_queued_items() -> None:
    fake = FakeReplica()
    rep = Replicator(fake, max_backlog=1000)
    futures = [await rep.submit(item("t", (s,))) for s in range(1, 5)]
    futures.append(await rep.submit(item("t", (5,), ck("t", 1, 5))))
    assert rep.backlog_items == 1
    assert rep.backlog_records == 2
    await rep.start()
    results = await settle(futures)
    await rep.close(1)
    assert results == [ReplicationResult(Outcome.OK, 1)] * 5
    assert len(fake.shipped("t")) == 1
    assert fake.tasks["t"].covers == 5


async def test_coalescing_never_drops_uncovered_events() -> None:
    fake = FakeReplica()
    rep = Replicator(fake, max_backlog=1000)
    f1 = await rep.submit(item("t", (1, 2)))
    f2 = await rep.submit(item("t", (3, 4)))  # 4 is not covered by the checkpoint below
    f3 = await rep.submit(item("t", (), ck("t", 1, 3)))
    # only a contiguous suffix merges: f2 blocks, so f1 stays too
    assert rep.backlog_items == 3
    await rep.start()
    await settle([f1, f2, f3])
    await rep.close(1)
    assert sorted(fake.tasks["t"].events) == [4]
    assert fake.violations == []


async def test_items_of_other_tasks_and_epochs_are_not_merged() -> None:
    fake = FakeReplica()
    rep = Replicator(fake, max_backlog=1000)
    fa = await rep.submit(item("a", (1,)))
    fb = await rep.submit(item("b", (1,), epoch=1))
    await rep.submit(item("b", (2,), ck("b", 1, 2, epoch=2), epoch=2))
    await rep.submit(item("a", (2,), ck("a", 1, 2)))
    assert rep.backlog_items == 3  # "a"#1 merged; "b" at epoch 1 kept
    await rep.start()
    assert (await settle([fa, fb]))[0].outcome is Outcome.OK
    await rep.close(1)


# ---------------------------------------------------------------- backpressure


async def test_submit_waits_while_backlog_is_full() -> None:
    fake = FakeReplica()
    rep = Replicator(fake, max_backlog=3)
    futures = [await rep.submit(item("t", (s,))) for s in range(1, 4)]
    blocked = asyncio.create_task(rep.submit(item("t", (4,))))
    await asyncio.sleep(0.05)
    assert not blocked.done()
    assert rep.backlog_records == 3
    await rep.start()
    async with asyncio.timeout(5):
        futures.append(await blocked)
    await settle(futures)
    await rep.close(1)
    assert [it.events[0].seq for it in fake.shipped("t")] == [1, 2, 3, 4]


async def test_a_covering_checkpoint_is_admitted_into_a_full_backlog() -> None:
    rep = Replicator(FakeReplica(), max_backlog=3)
    for s in range(1, 4):
        await rep.submit(item("t", (s,)))
    async with asyncio.timeout(1):
        await rep.submit(item("t", (), ck("t", 1, 3)))  # frees 3, adds 1
    assert (rep.backlog_items, rep.backlog_records) == (1, 1)
    await rep.close(0)


async def test_item_larger_than_the_bound_goes_alone() -> None:
    fake = FakeReplica()
    rep = Replicator(fake, max_backlog=2)
    async with asyncio.timeout(1):
        f = await rep.submit(item("t", (1, 2, 3, 4)))
    await rep.start()
    assert (await settle([f]))[0].outcome is Outcome.OK
    await rep.close(1)


# ---------------------------------------------------------------- fencing


async def test_stale_resolves_the_fenced_writers_queued_items() -> None:
    fake = FakeReplica()
    fake.tasks["t"] = TaskState(epoch=5)
    rep = Replicator(fake, max_backlog=1000, max_batch_items=1)
    stale = [await rep.submit(item("t", (s,), epoch=4)) for s in range(1, 5)]
    current = await rep.submit(item("t", (1,), epoch=5))
    other = await rep.submit(item("u", (1,), epoch=4))
    await rep.start()
    results = await settle([*stale, current, other])
    await rep.close(1)
    assert results[:4] == [ReplicationResult(Outcome.STALE, 5)] * 4
    assert results[4:] == [ReplicationResult(Outcome.OK, 5), ReplicationResult(Outcome.OK, 4)]
    # only the first stale item went to Redis; the rest were resolved locally
    assert len(fake.shipped("t")) == 2


# ---------------------------------------------------------------- lag, outages, errors


async def test_lag_is_the_age_of_the_oldest_unacknowledged_item() -> None:
    fake = FakeReplica()
    fake.gate = asyncio.Event()
    clock = FakeClock()
    rep = Replicator(fake, max_backlog=100, clock=clock)
    assert rep.lag_seconds == 0.0
    f1 = await rep.submit(item("t", (1,)))
    clock.now_s += 2.0
    f2 = await rep.submit(item("t", (2,)))
    await rep.start()
    await asyncio.sleep(0.01)  # in flight, waiting on the gate
    clock.now_s += 1.5
    assert rep.lag_seconds == pytest.approx(3.5)
    fake.gate.set()
    await settle([f1, f2])
    assert rep.lag_seconds == 0.0
    await rep.close(1)


async def test_merged_item_keeps_the_oldest_enqueue_time() -> None:
    clock = FakeClock()
    rep = Replicator(FakeReplica(), max_backlog=100, clock=clock)
    await rep.submit(item("t", (1,)))
    clock.now_s += 4.0
    await rep.submit(item("t", (2,), ck("t", 1, 2)))
    assert rep.backlog_items == 1
    assert rep.lag_seconds == pytest.approx(4.0)
    await rep.close(0)


async def test_connection_errors_keep_items_and_log_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="lazarus.replication")
    fake = FakeReplica()
    fake.fail_next = 6
    rep = Replicator(fake, max_backlog=100, retry_initial_s=0.001, retry_max_s=0.005)
    futures = [await rep.submit(item("t", (s,))) for s in range(1, 6)]
    await rep.start()
    results = await settle(futures)
    await rep.close(1)
    assert results == [ReplicationResult(Outcome.OK, 1)] * 5
    assert rep.errors_total == 6
    assert not rep.in_outage
    levels = [r.levelno for r in caplog.records if r.name == "lazarus.replication"]
    assert levels == [logging.WARNING, logging.INFO]


async def test_lost_reply_then_duplicate_is_reported_ok() -> None:
    fake = FakeReplica()
    fake.lose_reply_next = 1
    rep = Replicator(fake, max_backlog=100, retry_initial_s=0.001, retry_max_s=0.005)
    f = await rep.submit(item("t", (1,)))
    await rep.start()
    assert (await settle([f])) == [ReplicationResult(Outcome.OK, 1)]
    assert len(fake.calls) == 2
    await rep.close(1)


async def test_noscript_in_a_batch_is_retried_not_failed() -> None:
    fake = FakeReplica()
    fake.noscript_next = 2
    rep = Replicator(fake, max_backlog=100, retry_initial_s=0.001, retry_max_s=0.005)
    futures = [await rep.submit(item("t", (s,))) for s in (1, 2)]
    await rep.start()
    assert await settle(futures) == [ReplicationResult(Outcome.OK, 1)] * 2
    await rep.close(1)


async def test_script_error_fails_only_that_item() -> None:
    fake = FakeReplica()
    rep = Replicator(fake, max_backlog=100)
    bad = item("t", (1,))
    fake.script_error_for.add(id(bad))
    f_bad = await rep.submit(bad)
    f_good = await rep.submit(item("u", (1,)))
    await rep.start()
    async with asyncio.timeout(5):
        with pytest.raises(redis.exceptions.ResponseError, match="blew up"):
            await f_bad
        assert (await f_good).outcome is Outcome.OK
    assert rep.errors_total == 1
    await rep.close(1)


async def test_close_fails_unacknowledged_items_and_refuses_submit() -> None:
    fake = FakeReplica()
    fake.fail_next = 10**6
    rep = Replicator(fake, max_backlog=100, retry_initial_s=0.001, retry_max_s=0.005)
    await rep.start()
    f = await rep.submit(item("t", (1,)))
    async with asyncio.timeout(2):
        await rep.close(drain_timeout_s=0.05)
    with pytest.raises(ReplicatorClosed):
        f.result()
    with pytest.raises(ReplicatorClosed):
        await rep.submit(item("t", (2,)))


async def test_close_wakes_a_blocked_submitter() -> None:
    rep = Replicator(FakeReplica(), max_backlog=1)
    await rep.submit(item("t", (1,)))
    blocked = asyncio.create_task(rep.submit(item("t", (2,))))
    await asyncio.sleep(0.01)
    await rep.close(0)
    with pytest.raises(ReplicatorClosed):
        async with asyncio.timeout(1):
            await blocked


# ---------------------------------------------------------------- property


@st.composite
def task_histories(draw: st.DrawFn) -> list[ReplicationItem]:
    """Interleaved histories of 1..3 tasks: contiguous events, monotone checkpoint covers."""
    n_tasks = draw(st.integers(1, 3))
    per_task: list[list[ReplicationItem]] = []
    for k in range(n_tasks):
        task = f"t{k}"
        seq = covers = ckpt_seq = 0
        items: list[ReplicationItem] = []
        for _ in range(draw(st.integers(1, 15))):
            n_events = draw(st.integers(0, 3))
            seqs = list(range(seq + 1, seq + 1 + n_events))
            seq += n_events
            cp = None
            if n_events == 0 or draw(st.booleans()):
                covers = draw(st.integers(covers, seq))
                ckpt_seq += 1
                cp = ck(task, ckpt_seq, covers)
            items.append(item(task, seqs, cp))
        per_task.append(items)
    order = draw(st.permutations([k for k, items in enumerate(per_task) for _ in items]))
    cursors = [0] * n_tasks
    out: list[ReplicationItem] = []
    for k in order:
        out.append(per_task[k][cursors[k]])
        cursors[k] += 1
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    history=task_histories(),
    submitted_before_start=st.integers(0, 40),
    max_backlog=st.integers(1, 12),
    max_batch_items=st.integers(1, 5),
)
def test_coalescing_preserves_what_redis_ends_up_holding(
    history: list[ReplicationItem],
    submitted_before_start: int,
    max_backlog: int,
    max_batch_items: int,
) -> None:
    """Whatever merges happen, Redis always holds a gap-free prefix and ends as if none did."""

    async def scenario() -> tuple[FakeReplica, list[ReplicationResult]]:
        fake = FakeReplica()
        rep = Replicator(fake, max_backlog=max_backlog, max_batch_items=max_batch_items)
        futures = []
        for n, it in enumerate(history):
            if n == submitted_before_start:
                await rep.start()
            if n < submitted_before_start:
                # not started yet: a full backlog would block forever, so start now
                try:
                    async with asyncio.timeout(0.01):
                        futures.append(await rep.submit(it))
                    continue
                except TimeoutError:
                    await rep.start()
            futures.append(await rep.submit(it))
        await rep.start()
        results = await settle(futures)
        await rep.close(1)
        return fake, results

    fake, results = asyncio.run(scenario())
    reference = FakeReplica()
    for it in history:
        reference.apply(it)
    assert fake.violations == []
    assert {r.outcome for r in results} <= {Outcome.OK}
    assert fake.tasks == reference.tasks


def test_a_read_state_carries_where_each_claimed_epoch_started() -> None:
    head = {b"epoch": b"3", b"base:2": b"1,1", b"base:3": b"3,3", b"base:x": b"9"}
    state = _remote_state("t", head, None, [])
    assert state is not None
    assert state.bases == {2: (1, 1), 3: (3, 3)}
    assert _remote_state("t", {b"epoch": b"1"}, None, []).bases == {}  # type: ignore[union-attr]
