"""Fenced replication to a real redis-server: the Lua script and the Replicator under an outage."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

import pytest
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from lazarus.v1 import records_pb2
from lazarus_dev.localservers import RedisServer
from node_agent.replication import (
    ClaimBatcher,
    Outcome,
    RedisCheckpointReplica,
    ReplicationItem,
    ReplicationResult,
    Replicator,
    task_keys,
)

pytestmark = pytest.mark.integration

PREFIX = "lzt"
"""Key prefix of this file, so other tests' keys never collide."""


def ev(task: str, seq: int, epoch: int, payload: bytes = b"") -> records_pb2.JournalEventRecord:
    return records_pb2.JournalEventRecord(
        task_id=task, seq=seq, epoch=epoch, payload=payload or f"e{seq}@{epoch}".encode()
    )


def ck(task: str, seq: int, epoch: int, covers: int) -> records_pb2.CheckpointRecord:
    return records_pb2.CheckpointRecord(
        task_id=task,
        seq=seq,
        epoch=epoch,
        covers_journal_seq=covers,
        payload=f"state{seq}@{epoch}".encode(),
    )


def item(
    task: str,
    epoch: int,
    events: tuple[records_pb2.JournalEventRecord, ...] = (),
    checkpoint: records_pb2.CheckpointRecord | None = None,
    node: str = "node-a",
) -> ReplicationItem:
    return ReplicationItem(task, epoch, node, events, checkpoint)


def new_task() -> str:
    return f"task-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def replica(redis_client: redis.asyncio.Redis) -> RedisCheckpointReplica:
    return RedisCheckpointReplica(redis_client, prefix=PREFIX)


async def snapshot(client: redis.asyncio.Redis, task: str) -> list[object]:
    """DUMP of every key of the task plus the head as a dict."""
    keys = task_keys(task, PREFIX)
    out: list[object] = [await client.dump(k) for k in keys]
    out.append(await client.hgetall(keys[0]))
    return out


async def test_older_epoch_is_rejected_and_changes_nothing(
    replica: RedisCheckpointReplica, redis_client: redis.asyncio.Redis
) -> None:
    async with asyncio.timeout(5):
        t = new_task()
        ok = await replica.write(item(t, 2, (ev(t, 1, 2), ev(t, 2, 2)), ck(t, 1, 2, 1)))
        assert ok == ReplicationResult(Outcome.OK, 2)
        before = await snapshot(redis_client, t)
        stale = await replica.write(item(t, 1, (ev(t, 3, 1),), ck(t, 9, 1, 3), node="zombie"))
        assert stale == ReplicationResult(Outcome.STALE, 2)
        assert await snapshot(redis_client, t) == before


async def test_an_equal_epoch_from_another_incarnation_is_refused_and_changes_nothing(
    redis_client: redis.asyncio.Redis,
) -> None:
    """The fence is (epoch, owner): two processes cannot interleave at one epoch (DESIGN.md §4)."""
    owner = RedisCheckpointReplica(redis_client, prefix=PREFIX, owner="inc-1")
    other = RedisCheckpointReplica(redis_client, prefix=PREFIX, owner="inc-2")
    async with asyncio.timeout(5):
        t = new_task()
        claimed, _ = (await owner.claim_load_many([(t, 1, "w0")]))[0]  # type: ignore[misc]
        assert claimed == ReplicationResult(Outcome.OK, 1)
        assert (await owner.write(item(t, 1, (ev(t, 1, 1),), ck(t, 1, 1, 1)))).outcome is Outcome.OK
        before = await snapshot(redis_client, t)
        refused = await other.write(item(t, 1, (ev(t, 2, 1),), ck(t, 2, 1, 2)))
        assert refused == ReplicationResult(Outcome.STALE, 1)
        claim, state = (await other.claim_load_many([(t, 1, "w0")]))[0]  # type: ignore[misc]
        assert (claim.outcome, state) == (Outcome.STALE, None)
        assert await snapshot(redis_client, t) == before
        # The owner goes on; a newer epoch (a move) belongs to whoever claims it.
        assert (await owner.write(item(t, 1, (ev(t, 2, 1),)))).outcome is Outcome.OK
        assert (await other.claim(t, 2, "w0")).outcome is Outcome.OK
        assert (await owner.write(item(t, 1, (ev(t, 3, 1),)))).outcome is Outcome.STALE


async def test_repeated_write_changes_nothing(
    replica: RedisCheckpointReplica, redis_client: redis.asyncio.Redis
) -> None:
    async with asyncio.timeout(5):
        t = new_task()
        it = item(t, 1, (ev(t, 1, 1), ev(t, 2, 1), ev(t, 3, 1)), ck(t, 1, 1, 2))
        assert (await replica.write(it)).outcome is Outcome.OK
        before = await snapshot(redis_client, t)
        assert await replica.write(it) == ReplicationResult(Outcome.DUPLICATE, 1)
        assert await snapshot(redis_client, t) == before
        # an older checkpoint of the same epoch is not newer either
        assert (await replica.write(item(t, 1, (), ck(t, 1, 1, 1)))).outcome is Outcome.DUPLICATE
        assert await snapshot(redis_client, t) == before


async def test_newer_epoch_overwrites_stale_events_at_same_seq(
    replica: RedisCheckpointReplica,
) -> None:
    async with asyncio.timeout(5):
        t = new_task()
        await replica.write(item(t, 1, (ev(t, 1, 1), ev(t, 2, 1), ev(t, 3, 1))))
        result = await replica.write(item(t, 2, (ev(t, 2, 2, b"new2"), ev(t, 3, 2, b"new3"))))
        assert result == ReplicationResult(Outcome.OK, 2)
        state = await replica.load(t)
        assert state is not None
        assert [(e.seq, e.epoch) for e in state.events] == [(1, 1), (2, 2), (3, 2)]
        assert [e.payload for e in state.events][1:] == [b"new2", b"new3"]
        assert state.epoch == 2
        assert state.journal_seq == 3
        # the fenced owner cannot put its version back
        assert (await replica.write(item(t, 1, (ev(t, 4, 1),)))).outcome is Outcome.STALE


async def test_claim_then_stale_write_is_refused(
    replica: RedisCheckpointReplica, redis_client: redis.asyncio.Redis
) -> None:
    async with asyncio.timeout(5):
        t = new_task()
        await replica.write(item(t, 1, (ev(t, 1, 1),), ck(t, 1, 1, 1)))
        assert await replica.claim(t, 2, "node-b") == ReplicationResult(Outcome.OK, 2)
        assert await replica.claim(t, 2, "node-b") == ReplicationResult(Outcome.DUPLICATE, 2)
        before = await snapshot(redis_client, t)
        late = await replica.write(item(t, 1, (ev(t, 2, 1),), ck(t, 2, 1, 2)))
        assert late == ReplicationResult(Outcome.STALE, 2)
        assert await snapshot(redis_client, t) == before
        assert await replica.claim(t, 1) == ReplicationResult(Outcome.STALE, 2)
        state = await replica.load(t)
        assert state is not None
        assert (state.epoch, state.node_id, state.ckpt_seq) == (2, "node-b", 1)
        with pytest.raises(ValueError, match="epoch"):
            await replica.claim(t, 0)
        with pytest.raises(ValueError, match="task_id"):
            await replica.claim("", 1)


async def test_claim_records_where_each_epoch_lineage_starts(
    replica: RedisCheckpointReplica,
) -> None:
    async with asyncio.timeout(5):
        t = new_task()
        assert await replica.lineage_bases(t) == {}
        await replica.write(item(t, 1, tuple(ev(t, s, 1) for s in range(1, 6)), ck(t, 1, 1, 3)))
        await replica.claim(t, 1, "node-a")  # not a raise: no base recorded
        assert await replica.lineage_bases(t) == {}
        assert (await replica.claim(t, 2, "node-b")).outcome is Outcome.OK
        await replica.claim(t, 2, "node-b")  # repeated: the base stays
        await replica.write(item(t, 2, (ev(t, 6, 2),), ck(t, 2, 2, 6)))
        assert (await replica.claim(t, 4, "node-c")).outcome is Outcome.OK
        # A fenced owner at epoch 1 diverged after journal seq 5 / checkpoint seq 1.
        assert await replica.lineage_bases(t) == {2: (5, 1), 4: (6, 2)}


async def test_load_returns_newest_checkpoint_and_events_after_covers(
    replica: RedisCheckpointReplica,
) -> None:
    async with asyncio.timeout(5):
        t = new_task()
        assert await replica.load(t) is None
        events = tuple(ev(t, s, 1) for s in range(1, 8))
        await replica.write(item(t, 1, events[:4], ck(t, 1, 1, 2)))
        await replica.write(item(t, 1, events[4:], ck(t, 2, 1, 5)))
        state = await replica.load(t)
        assert state is not None
        assert state.checkpoint is not None
        assert (state.checkpoint.seq, state.checkpoint.covers_journal_seq) == (2, 5)
        assert state.checkpoint.payload == b"state2@1"
        assert [e.seq for e in state.events] == [6, 7]
        assert (state.ckpt_seq, state.ckpt_epoch, state.covers_journal_seq) == (2, 1, 5)
        assert (state.journal_seq, state.node_id) == (7, "node-a")
        assert state.updated_unix_ms > 0


async def test_newer_checkpoint_compacts_the_journal(
    replica: RedisCheckpointReplica, redis_client: redis.asyncio.Redis
) -> None:
    async with asyncio.timeout(5):
        t = new_task()
        _, _, journal, jepoch = task_keys(t, PREFIX)
        await replica.write(item(t, 1, tuple(ev(t, s, 1) for s in range(1, 11))))
        assert await redis_client.zcard(journal) == 10
        await replica.write(item(t, 1, (), ck(t, 1, 1, 6)))
        assert await redis_client.zcard(journal) == 4
        assert sorted(int(f) for f in await redis_client.hkeys(jepoch)) == [7, 8, 9, 10]
        # events at or below covers are not stored again
        assert (await replica.write(item(t, 1, (ev(t, 3, 1),)))).outcome is Outcome.DUPLICATE
        assert await redis_client.zcard(journal) == 4


async def test_script_cache_flush_is_handled(
    replica: RedisCheckpointReplica, redis_client: redis.asyncio.Redis
) -> None:
    async with asyncio.timeout(5):
        t = new_task()
        await redis_client.script_flush()
        assert (await replica.write(item(t, 1, (ev(t, 1, 1),)))).outcome is Outcome.OK
        await redis_client.script_flush()
        results = await replica.write_many([item(t, 1, (ev(t, 2, 1),)), item(t, 1, (ev(t, 3, 1),))])
        assert results == [ReplicationResult(Outcome.OK, 1)] * 2


async def _script_exists_calls(client: redis.asyncio.Redis) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_script|exists", {}).get("calls", 0))


async def test_a_batch_is_one_round_trip_without_script_exists(
    replica: RedisCheckpointReplica, redis_client: redis.asyncio.Redis
) -> None:
    """redis-py sends SCRIPT EXISTS before a pipeline that runs a registered Script;
    the replica sends bare EVALSHAs and loads the script only on NOSCRIPT."""
    async with asyncio.timeout(5):
        t, u = new_task(), new_task()
        await replica.write(item(t, 1, (ev(t, 1, 1),)))  # the script is cached now
        before = await _script_exists_calls(redis_client)
        for seq in range(2, 6):
            results = await replica.write_many(
                [item(t, 1, (ev(t, seq, 1),)), item(u, 1, (ev(u, seq - 1, 1),))]
            )
            assert results == [ReplicationResult(Outcome.OK, 1)] * 2
        claimed = await replica.claim_load_many([(t, 2, "node-b")])
        assert claimed[0][0] == ReplicationResult(Outcome.OK, 2)  # type: ignore[index]
        assert await _script_exists_calls(redis_client) == before
        # after a flush the NOSCRIPT calls are sent again, in order, once loaded
        await redis_client.script_flush()
        results = await replica.write_many([item(u, 1, (ev(u, 5, 1),)), item(u, 1, (ev(u, 6, 1),))])
        assert results == [ReplicationResult(Outcome.OK, 1)] * 2
        assert await redis_client.zcard(task_keys(u, PREFIX)[2]) == 6


async def test_replicator_ships_in_order_and_coalesces(
    replica: RedisCheckpointReplica,
) -> None:
    async with asyncio.timeout(10):
        t = new_task()
        rep = Replicator(replica, max_backlog=100)
        futures = []
        for s in range(1, 21):
            cp = ck(t, s // 5, 1, s) if s % 5 == 0 else None
            futures.append(await rep.submit(item(t, 1, (ev(t, s, 1),), cp)))
        await rep.start()
        results = await asyncio.gather(*futures)
        assert {r.outcome for r in results} == {Outcome.OK}
        await rep.close(drain_timeout_s=1)
        state = await replica.load(t)
        assert state is not None
        assert (state.ckpt_seq, state.covers_journal_seq, state.journal_seq) == (4, 20, 20)
        assert state.events == ()


async def test_replicator_stale_resolves_queued_items(
    replica: RedisCheckpointReplica,
) -> None:
    async with asyncio.timeout(5):
        t = new_task()
        assert (await replica.claim(t, 5)).outcome is Outcome.OK
        rep = Replicator(replica, max_backlog=100)
        futures = [await rep.submit(item(t, 4, (ev(t, s, 4),))) for s in range(1, 6)]
        await rep.start()
        results = await asyncio.gather(*futures)
        assert results == [ReplicationResult(Outcome.STALE, 5)] * 5
        await rep.close(drain_timeout_s=1)


def _client_for(server: RedisServer) -> redis.asyncio.Redis:
    # No client-side retries: the Replicator does the retrying, with its own backoff.
    return redis.asyncio.Redis(
        host=server.host,
        port=server.port,
        socket_timeout=1.0,
        socket_connect_timeout=0.5,
        retry=Retry(NoBackoff(), 0),
    )


def in_outage(rep: Replicator) -> bool:
    """Read through a call, so a type checker does not narrow the property across awaits."""
    return rep.in_outage


async def _wait_for(predicate: Callable[[], bool], timeout_s: float) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.02)


async def test_outage_loses_nothing_and_lag_recovers(
    make_redis_server: Callable[..., RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="lazarus.replication")
    # AOF with fsync always: what Redis acknowledged survives the SIGKILL below.
    server = make_redis_server(extra_args=["--appendonly", "yes", "--appendfsync", "always"])
    client = _client_for(server)
    replica = RedisCheckpointReplica(client, prefix=PREFIX)
    rep = Replicator(replica, max_backlog=500, retry_max_s=0.5)
    tasks = [new_task() for _ in range(3)]
    futures: list[asyncio.Future[ReplicationResult]] = []
    last_seq = dict.fromkeys(tasks, 0)
    last_covers = dict.fromkeys(tasks, 0)
    stop = asyncio.Event()

    async def produce() -> None:
        s = 0
        while not stop.is_set():
            s += 1
            for t in tasks:
                cp = ck(t, s // 7, 1, s) if s % 7 == 0 else None
                futures.append(await rep.submit(item(t, 1, (ev(t, s, 1),), cp)))
                last_seq[t] = s
                if cp is not None:
                    last_covers[t] = s
            await asyncio.sleep(0.02)

    try:
        async with asyncio.timeout(25):
            await rep.start()
            producer = asyncio.create_task(produce())
            await asyncio.sleep(1.0)
            assert rep.lag_seconds < 1.0
            server.kill()
            await asyncio.sleep(1.5)
            assert in_outage(rep)
            assert rep.lag_seconds > 1.0
            # coalescing: each queued checkpoint absorbed the covered items before it, so
            # at most one in-flight batch (64) plus < 8 items per task are unacknowledged
            assert rep.backlog_items < 64 + 3 * 8 < len(futures)
            await asyncio.sleep(3.5)
            await asyncio.to_thread(server.start)
            await asyncio.sleep(1.0)
            stop.set()
            await producer
            await _wait_for(lambda: rep.backlog_items == 0, timeout_s=10)
            assert rep.lag_seconds == 0.0
            assert not in_outage(rep)
            results = await asyncio.gather(*futures)
            assert {r.outcome for r in results} == {Outcome.OK}
            for t in tasks:
                state = await replica.load(t)
                assert state is not None
                assert state.covers_journal_seq == last_covers[t]
                assert [e.seq for e in state.events] == list(
                    range(last_covers[t] + 1, last_seq[t] + 1)
                )
                assert state.journal_seq == last_seq[t]
            await rep.close(drain_timeout_s=1)
    finally:
        await rep.close(drain_timeout_s=0)
        await client.aclose()
    records = [r for r in caplog.records if r.name == "lazarus.replication"]
    assert [r.levelno for r in records] == [logging.WARNING, logging.INFO]


async def test_claim_load_many_claims_and_reads_each_task_in_one_round_trip(
    replica: RedisCheckpointReplica, redis_client: redis.asyncio.Redis
) -> None:
    """claim_load = claim + load, atomically, for many tasks; one task's trouble stays its own."""
    async with asyncio.timeout(5):
        fresh, moved, fenced, corrupt = new_task(), new_task(), new_task(), new_task()
        await replica.write(
            item(moved, 1, tuple(ev(moved, s, 1) for s in (1, 2, 3)), ck(moved, 1, 1, 2))
        )
        await replica.write(item(fenced, 5, (ev(fenced, 1, 5),)))
        await replica.write(item(corrupt, 1, (ev(corrupt, 1, 1),), ck(corrupt, 1, 1, 1)))
        await redis_client.set(task_keys(corrupt, PREFIX)[1], b"\xff\xff not a record")
        replies = await replica.claim_load_many(
            [
                (fresh, 1, "node-b"),
                (moved, 2, "node-b"),
                (fenced, 3, "node-b"),
                (corrupt, 2, "node-b"),
            ]
        )
        assert len(replies) == 4
        # Redis held nothing of it: the claim created its head, the state is that head.
        first_result, first_state = replies[0]  # type: ignore[misc]
        assert first_result == ReplicationResult(Outcome.OK, 1)
        assert first_state is not None
        assert first_state.checkpoint is None
        assert (first_state.epoch, first_state.journal_seq, first_state.events) == (1, 0, ())
        result, state = replies[1]  # type: ignore[misc]
        assert result == ReplicationResult(Outcome.OK, 2)
        assert state == await replica.load(moved)
        assert state is not None
        assert state.epoch == 2
        assert state.node_id == "node-b"
        assert state.checkpoint is not None
        assert state.checkpoint.seq == 1
        assert [e.seq for e in state.events] == [3]
        assert replies[2] == (ReplicationResult(Outcome.STALE, 5), None)
        assert isinstance(replies[3], Exception)
        assert "checkpoint" in str(replies[3])
        # The claim raised the fence like claim() does: the old owner is refused.
        assert (await replica.write(item(moved, 1, (ev(moved, 4, 1),)))).outcome is Outcome.STALE
        assert await replica.lineage_bases(moved) == {2: (3, 1)}
        assert state.bases == {2: (3, 1)}  # read with the claim, for the restore's adopt
        again = await replica.claim_load_many([(moved, 2, "node-b")])
        assert again[0] == (ReplicationResult(Outcome.DUPLICATE, 2), state)
        with pytest.raises(ValueError, match="epoch"):
            await replica.claim_load_many([(moved, 0, "node-b")])


async def test_claim_batcher_sends_a_wave_of_claims_together(
    replica: RedisCheckpointReplica,
) -> None:
    calls: list[int] = []
    original = replica.claim_load_many

    async def counting(requests: list[tuple[str, int, str]]) -> list[object]:
        calls.append(len(requests))
        return await original(requests)  # type: ignore[return-value]

    replica.claim_load_many = counting  # type: ignore[method-assign,assignment]
    batcher = ClaimBatcher(replica, max_batch=50)
    async with asyncio.timeout(5):
        tasks = [new_task() for _ in range(120)]
        for t in tasks:
            await replica.write(item(t, 1, (ev(t, 1, 1),)))
        replies = await asyncio.gather(*(batcher.claim_load(t, 2, "node-b") for t in tasks))
    assert all(r.outcome is Outcome.OK and s is not None and s.journal_seq == 1 for r, s in replies)
    assert sum(calls) == 120
    assert len(calls) <= 4, calls  # 120 concurrent claims in ceil(120 / 50) round trips, not 120
