"""The leader's Forward outbox: replies built in place as the next batch."""

from __future__ import annotations

import asyncio

import pytest

from coordinator.forwarding import MAX_BATCH_ENTRIES, Outbox


async def test_entries_go_out_in_order_as_one_batch() -> None:
    out = Outbox()
    out.entry("a").message = b"1"
    out.entry("b").heartbeat_ack.seq = 7
    end = out.entry("a").end
    end.code, end.reason = 14, "gone"
    assert out.qsize() == 3
    batch = await out.take()
    assert batch is not None
    assert [(e.session_id, e.WhichOneof("body")) for e in batch.entries] == [
        ("a", "message"),
        ("b", "heartbeat_ack"),
        ("a", "end"),
    ]
    assert batch.entries[1].heartbeat_ack.seq == 7
    assert batch.entries[2].end.reason == "gone"
    assert out.empty()


async def test_a_batch_holds_at_most_the_bound() -> None:
    out = Outbox()
    for i in range(MAX_BATCH_ENTRIES + 3):
        out.entry(str(i))
    first, second = await out.take(), await out.take()
    assert first is not None
    assert second is not None
    assert len(first.entries) == MAX_BATCH_ENTRIES
    assert [e.session_id for e in second.entries] == [
        str(i) for i in range(MAX_BATCH_ENTRIES, MAX_BATCH_ENTRIES + 3)
    ]
    assert out.qsize() == 0


async def test_take_waits_for_an_entry() -> None:
    out = Outbox()
    taking = asyncio.ensure_future(out.take())
    await asyncio.sleep(0.01)
    assert not taking.done()
    out.entry("a")
    batch = await asyncio.wait_for(taking, 1)
    assert batch is not None
    assert batch.entries[0].session_id == "a"


async def test_stop_sends_what_was_queued_then_ends() -> None:
    out = Outbox()
    out.entry("before")
    out.stop()
    for _ in range(MAX_BATCH_ENTRIES + 1):
        out.entry("after")  # not sent: the stream is ending
    batch = await out.take()
    assert batch is not None
    assert [e.session_id for e in batch.entries] == ["before"]
    assert await out.take() is None
    assert await out.take() is None


async def test_stop_wakes_a_waiting_writer() -> None:
    out = Outbox()
    taking = asyncio.ensure_future(out.take())
    await asyncio.sleep(0.01)
    out.stop()
    assert await asyncio.wait_for(taking, 1) is None


@pytest.mark.parametrize("queued", [0, 1, MAX_BATCH_ENTRIES + 1])
async def test_qsize_counts_entries_not_taken(queued: int) -> None:
    out = Outbox()
    for i in range(queued):
        out.entry(str(i))
    assert out.qsize() == queued
    taken = 0
    while not out.empty():
        batch = await out.take()
        assert batch is not None
        taken += len(batch.entries)
    assert taken == queued
