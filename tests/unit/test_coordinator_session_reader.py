"""coordinator.session's reader: a stream's messages are pipelined into the runtime, in order.

The runtime here is a fake of our own interface (enqueue -> future); the real
runtime and grpc are covered by tests/integration/test_coordinator_session.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import pytest

from coordinator import session as session_module
from coordinator.core import HeartbeatReceived, SessionOpened, TaskUpdateReceived
from coordinator.runtime import Channel, Close, CoordinatorRuntime
from coordinator.session import AgentSessionService
from lazarus.v1 import agent_pb2, records_pb2


class FakeRuntime:
    """Queues events; the test decides when (and how) each one is stepped."""

    def __init__(self) -> None:
        self.queued: list[tuple[Any, asyncio.Future[bool]]] = []
        self.leading = True
        self.beats: list[str] = []
        self.observer = self

    def enqueue(self, event: Any) -> asyncio.Future[bool]:
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.queued.append((event, future))
        return future

    def heartbeats_received(self, node_ids: Sequence[str], now_s: float) -> None:
        self.beats.extend(node_ids)

    def now_s(self) -> float:
        return 1.0

    count_heartbeats = CoordinatorRuntime.count_heartbeats  # the real rule, on this fake


def hello() -> bytes:
    return agent_pb2.AgentMessage(
        hello=agent_pb2.Hello(
            node_id="n1", incarnation="i1", capacity=records_pb2.NodeCapacity(slots=1)
        )
    ).SerializeToString()


def beat(seq: int) -> bytes:
    return agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=seq)).SerializeToString()


def started(task_id: str) -> bytes:
    return agent_pb2.AgentMessage(
        task_update=agent_pb2.TaskUpdate(
            task_id=task_id, epoch=1, update_seq=1, started=agent_pb2.TaskUpdate.Started()
        )
    ).SerializeToString()


async def stream(messages: list[bytes], hold: asyncio.Event | None = None) -> AsyncIterator[bytes]:
    for raw in messages:
        yield raw
    if hold is not None:
        await hold.wait()


async def outbound(channel: Channel) -> Any:
    return await asyncio.wait_for(channel.next(), 1.0)


async def test_messages_are_queued_in_order_without_waiting_for_earlier_steps() -> None:
    runtime = FakeRuntime()
    service = AgentSessionService(runtime)  # type: ignore[arg-type]
    channel = Channel("s1")
    messages = [hello()] + [started(f"t{i}") for i in range(300)] + [beat(1)]
    hold = asyncio.Event()
    reader = asyncio.create_task(service._read(stream(messages, hold), channel))
    async with asyncio.timeout(2):
        while len(runtime.queued) < len(messages):
            await asyncio.sleep(0.01)
    # Every message queued although none was stepped yet: the heartbeat does not
    # wait for 300 group commits.
    kinds = [type(e) for e, _ in runtime.queued]
    assert kinds[0] is SessionOpened
    assert kinds[1:-1] == [TaskUpdateReceived] * 300
    assert kinds[-1] is HeartbeatReceived
    assert [e.task_id for e, _ in runtime.queued[1:-1]] == [f"t{i}" for i in range(300)]
    assert runtime.beats == []
    for _, future in runtime.queued:
        future.set_result(True)
    await asyncio.sleep(0)
    assert runtime.beats == ["n1"]  # observed once the heartbeat was stepped
    hold.set()
    await asyncio.wait_for(reader, 1.0)
    assert await outbound(channel) is None  # half-close: the stream ends OK


async def test_back_pressure_bounds_the_messages_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(session_module, "MAX_IN_FLIGHT", 8)
    runtime = FakeRuntime()
    service = AgentSessionService(runtime)  # type: ignore[arg-type]
    channel = Channel("s1")
    reader = asyncio.create_task(
        service._read(stream([hello()] + [beat(i) for i in range(1, 50)]), channel)
    )
    await asyncio.sleep(0.05)
    assert len(runtime.queued) == 8  # waits for the oldest before reading on
    runtime.queued[0][1].set_result(True)
    await asyncio.sleep(0.05)
    assert len(runtime.queued) == 9
    for _ in range(100):
        for _, future in runtime.queued:
            if not future.done():
                future.set_result(True)
        await asyncio.sleep(0)
        if reader.done():
            break
    await asyncio.wait_for(reader, 1.0)
    assert len(runtime.queued) == 50


@pytest.mark.parametrize(
    ("outcome", "code"),
    [(False, grpc.StatusCode.UNAVAILABLE), (RuntimeError("core bug"), grpc.StatusCode.INTERNAL)],
)
async def test_a_failed_step_ends_the_stream_with_its_status(
    outcome: bool | Exception, code: grpc.StatusCode
) -> None:
    runtime = FakeRuntime()
    service = AgentSessionService(runtime)  # type: ignore[arg-type]
    channel = Channel("s1")
    hold = asyncio.Event()
    reader = asyncio.create_task(service._read(stream([hello(), beat(1)], hold), channel))
    async with asyncio.timeout(1):
        while len(runtime.queued) < 2:
            await asyncio.sleep(0.01)
    first = runtime.queued[0][1]
    if isinstance(outcome, Exception):
        first.set_exception(outcome)
    else:
        first.set_result(outcome)
    runtime.queued[1][1].set_result(True)
    hold.set()  # the next read makes the reader look at finished steps
    await asyncio.wait_for(reader, 1.0)
    closing = await outbound(channel)
    assert isinstance(closing, Close)
    assert closing.code == code


async def test_a_message_that_cannot_become_an_event_is_refused_before_queueing() -> None:
    runtime = FakeRuntime()
    service = AgentSessionService(runtime)  # type: ignore[arg-type]
    channel = Channel("s1")
    await asyncio.wait_for(service._read(stream([beat(1)]), channel), 1.0)
    closing = await outbound(channel)
    assert isinstance(closing, Close)
    assert closing.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "first message must be a hello" in closing.reason
    assert runtime.queued == []
