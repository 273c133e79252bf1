"""coordinator.eventarchive on a real redis-server: order, fencing by entry id, outage, paging."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio

from coordinator.eventarchive import EventArchive
from coordinator.eventlog import EventFilter, EventLog, make_revision
from lazarus.storage.keys import events_stream_key
from lazarus.v1 import records_pb2
from lazarus_dev.localservers import RedisServer

pytestmark = pytest.mark.integration


def submitted(task_id: str) -> records_pb2.Event:
    return records_pb2.Event(task_submitted=records_pb2.TaskSubmitted(task_id=task_id))


async def drained(archive: EventArchive) -> None:
    async with asyncio.timeout(5):
        while archive.backlog:
            await asyncio.sleep(0.01)


async def read_all(archive: EventArchive, start: int, before: int, page: int = 3) -> list[int]:
    out: list[int] = []
    cursor = start
    while cursor:
        events, cursor = await archive.read(cursor, before, page=page)
        out.extend(e.revision for e in events)
    return out


@pytest.fixture
def cluster() -> str:
    return f"arch-{uuid.uuid4().hex[:8]}"


async def test_two_terms_are_archived_in_order_and_read_back_by_revision_range(
    redis_client: redis.asyncio.Redis, cluster: str
) -> None:
    archive = EventArchive(redis_client, cluster)
    writer = asyncio.create_task(archive.run())
    try:
        log = EventLog()
        log.sink = archive.offer
        log.begin_term(7)
        first = [log.append(submitted(f"a{i}")).revision for i in range(25)]
        await drained(archive)
        log.begin_term(9)  # the next leader (another process in real life)
        second = [log.append(submitted(f"b{i}")).revision for i in range(10)]
        await drained(archive)
    finally:
        writer.cancel()
    assert first[0] == make_revision(7, 1)
    assert second[0] == make_revision(9, 1)
    assert archive.archived == 35
    assert await archive.oldest_revision() == first[0]
    # Everything, in pages of 3 entries; then a range across the term change.
    assert await read_all(archive, 1, 0) == first + second
    assert await read_all(archive, first[20], second[3]) == first[20:] + second[:3]
    assert await read_all(archive, second[9] + 1, 0) == []
    events, _ = await archive.read(first[3], first[5])
    assert [e.task_submitted.task_id for e in events] == ["a3", "a4"]


async def test_a_deposed_leader_cannot_archive_behind_a_newer_one(
    redis_client: redis.asyncio.Redis, cluster: str
) -> None:
    new, old = EventArchive(redis_client, cluster), EventArchive(redis_client, cluster)
    writers = [asyncio.create_task(a.run()) for a in (new, old)]
    try:
        newer = EventLog()
        newer.sink = new.offer
        newer.begin_term(20)
        newer.append(submitted("new"))
        await drained(new)
        deposed = EventLog()
        deposed.sink = old.offer
        deposed.begin_term(10)
        deposed.append(submitted("late"))  # emitted after the newer leader's first event
        await drained(old)
    finally:
        for w in writers:
            w.cancel()
    assert old.refused == 1
    assert old.archived == 0
    events, _ = await archive_events(redis_client, cluster)
    assert [e.task_submitted.task_id for e in events] == ["new"]


async def archive_events(
    client: redis.asyncio.Redis, cluster: str
) -> tuple[list[records_pb2.Event], int]:
    return await EventArchive(client, cluster).read(1, 0, page=1000)


async def test_a_redis_outage_keeps_the_backlog_and_a_corrupt_entry_is_skipped(
    make_redis_server: object, cluster: str
) -> None:
    server: RedisServer = make_redis_server()  # type: ignore[operator]
    client = redis.asyncio.Redis(
        host=server.host, port=server.port, socket_timeout=1, socket_connect_timeout=1
    )
    archive = EventArchive(client, cluster)
    writer = asyncio.create_task(archive.run())
    log = EventLog()
    log.sink = archive.offer
    log.begin_term(3)
    try:
        log.append(submitted("before"))
        await drained(archive)
        server.pause()  # SIGSTOP: writes time out
        for i in range(5):
            log.append(submitted(f"during{i}"))
        await asyncio.sleep(1.5)
        assert archive.backlog == 5  # kept, not lost
        server.resume()
        await drained(archive)
        await client.xadd(events_stream_key(cluster), {b"e": b"\xff not a batch"}, id="3-50")
        log.begin_term(4)
        log.append(submitted("after"))
        await drained(archive)
        events, _ = await archive.read(1, 0)
    finally:
        writer.cancel()
        server.resume()
        await client.aclose()
    # The corrupt entry is skipped (logged), never returned; nothing else is lost.
    names = [e.task_submitted.task_id for e in events if e.HasField("task_submitted")]
    assert names == ["before", *(f"during{i}" for i in range(5)), "after"]
    # The XADD sent into the outage may have been stored with its reply lost: the
    # re-sent batch is then refused as already there (5 events), never doubled.
    assert archive.refused in (0, 5)
    assert archive.dropped == 0


def test_event_filter_is_what_watch_applies_to_archived_events() -> None:
    event = submitted("t1")
    event.revision = make_revision(1, 1)
    assert EventFilter(task_id="t1").matches(event)
    assert not EventFilter(task_id="t2").matches(event)
