"""Forward streams are bounded both ways (DESIGN.md §11: queues are bounded, slow
consumers are closed, not buffered).

Before: the leader's Forward reader moved every batch into the runtime's queue
and the Sessions' inboxes at once, so a leader that fell behind (overload, an
etcd brownout holding its step lock) buffered its followers' traffic without
bound; a follower queued entries for a leader that did not read without bound.
Now a leader whose runtime backlog passes ``FEED_PAUSE_AT`` stops reading (HTTP/2
flow control holds the followers' writes) until it is down to
``FEED_RESUME_AT``, and a follower ends a link with ``MAX_QUEUED_ENTRIES``
entries unsent. Real gRPC on loopback; the runtime is a fake of our own
interface.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from forward_support import serve_forward

from coordinator import forwarding
from coordinator.forwarding import (
    FEED_PAUSE_AT,
    FEED_RESUME_AT,
    FORWARD_METHOD,
    _Link,
    _NullObserver,
    add_replica_service,
)
from lazarus.v1 import replica_pb2


class _Runtime:
    leading = True
    feed_backlog = 0


class _Observer(_NullObserver):
    def __init__(self) -> None:
        self.received = 0
        self.backpressure: list[str] = []

    def forward_batch(self, direction: str, entries: int) -> None:
        if direction == "received":
            self.received += 1

    def forward_backpressure(self, side: str) -> None:
        self.backpressure.append(side)


async def _never(requests: AsyncIterator[bytes], context: Any) -> None:
    async for _ in requests:
        pass


def _batch(n: int) -> replica_pb2.ForwardBatch:
    # The end of a Session the leader never saw: read and skipped, nothing queued.
    end = replica_pb2.SessionEnd(code=grpc.StatusCode.CANCELLED.value[0], reason="gone")
    return replica_pb2.ForwardBatch(entries=[replica_pb2.ForwardEntry(session_id=f"s{n}", end=end)])


async def _until(predicate: Any, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.01)


@pytest.mark.timeout(30)
async def test_a_leader_behind_on_its_backlog_stops_reading_until_it_catches_up() -> None:
    runtime, observer = _Runtime(), _Observer()
    server = grpc.aio.server()
    add_replica_service(server, runtime, _never, observer)  # type: ignore[arg-type]
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    channel = grpc.aio.insecure_channel(address)
    outgoing: asyncio.Queue[replica_pb2.ForwardBatch | None] = asyncio.Queue()

    async def requests() -> AsyncIterator[replica_pb2.ForwardBatch]:
        while (batch := await outgoing.get()) is not None:
            yield batch

    call = channel.stream_stream(
        FORWARD_METHOD,
        request_serializer=replica_pb2.ForwardBatch.SerializeToString,
        response_deserializer=replica_pb2.ForwardBatch.FromString,
    )(requests())
    try:
        runtime.feed_backlog = FEED_PAUSE_AT + 1
        outgoing.put_nowait(_batch(0))
        await _until(lambda: observer.received == 1)
        for n in range(1, 6):
            outgoing.put_nowait(_batch(n))
        await asyncio.sleep(0.5)
        assert observer.received == 1  # paused: the rest waits on the wire
        assert observer.backpressure == ["leader"]
        runtime.feed_backlog = FEED_RESUME_AT + 1
        await asyncio.sleep(0.3)
        assert observer.received == 1  # not down to the resume mark yet
        runtime.feed_backlog = FEED_RESUME_AT
        await _until(lambda: observer.received == 6)
        assert observer.backpressure == ["leader"]
    finally:
        outgoing.put_nowait(None)
        call.cancel()
        await channel.close()
        await server.stop(None)


async def _reads_nothing(requests: AsyncIterator[replica_pb2.ForwardBatch], context: Any) -> None:
    """A leader that hangs: it never reads its stream."""
    await asyncio.sleep(60)


@pytest.mark.timeout(30)
async def test_a_follower_ends_a_link_whose_leader_leaves_its_entries_unread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(forwarding, "MAX_QUEUED_ENTRIES", 200)
    server, address = await serve_forward(_reads_nothing)
    channel = grpc.aio.insecure_channel(address)
    observer = _Observer()
    failed: list[_Link] = []
    link = _Link(address, 7, channel, observer, 100, lambda held: None, failed.append)
    try:
        payload = b"x" * 4096
        for n in range(20_000):  # 80 MB: far past any flow-control window
            if failed:
                break
            link.send(replica_pb2.ForwardEntry(session_id=f"s{n}", message=payload))
            if n % 100 == 0:
                await asyncio.sleep(0)  # let the stream write what it can
        await _until(lambda: bool(failed))
        assert failed == [link]
        assert link.closed
        assert observer.backpressure == ["follower"]
    finally:
        await link.close()
        await channel.close()
        await server.stop(None)
