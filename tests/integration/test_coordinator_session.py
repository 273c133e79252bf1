"""Session server of the coordinator against real etcd, with raw stubs as fake node agents.

Each test starts in-process coordinators (``CoordinatorRuntime`` + grpc.aio
server on 127.0.0.1) on a unique cluster name of the shared etcd, and stops
them at teardown (runtime task cancelled, election closed, server stopped).
Settings are shortened (heartbeat 100 ms, dead_after 600 ms) to keep the
suite fast; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aetcd
import grpc
import grpc.aio
import pytest

from coordinator import convert
from coordinator.core import CoreSettings, NodeState
from coordinator.election import Election
from coordinator.etcd_store import EtcdStore, election_prefix
from coordinator.runtime import CoordinatorRuntime, RuntimeSettings
from coordinator.session import add_agent_service
from lazarus.v1 import agent_pb2, records_pb2

MakeEtcdClient = Callable[..., Awaitable[aetcd.Client]]

FAST = CoreSettings(
    heartbeat_interval_s=0.1,
    dead_after_s=0.6,
    fence_after_s=0.4,
    tick_interval_s=0.05,
    suspect_after_intervals=2.0,
)
WAIT_S = 5.0
SESSION_METHOD = "/lazarus.v1.AgentService/Session"


@dataclass
class Coordinator:
    runtime: CoordinatorRuntime
    server: grpc.aio.Server
    address: str
    task: asyncio.Task[None]


async def _start(
    make_etcd_client: MakeEtcdClient,
    endpoint: Any,
    cluster: str,
    member: str,
    settings: CoreSettings = FAST,
) -> Coordinator:
    client = await make_etcd_client(endpoint)
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    address = f"127.0.0.1:{port}"
    election = Election(client, election_prefix(cluster), ttl_s=2)
    runtime = CoordinatorRuntime(
        settings,
        RuntimeSettings(cluster=cluster, member_id=member, advertise_address=address),
        election=election,
        store=EtcdStore(client, cluster),
        seed=1,
    )
    add_agent_service(server, runtime)
    await server.start()
    task = asyncio.create_task(runtime.run())
    return Coordinator(runtime, server, address, task)


async def _stop(coordinator: Coordinator) -> None:
    coordinator.task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await coordinator.task
    with contextlib.suppress(Exception):
        await coordinator.runtime.election.close()
    await coordinator.server.stop(0)


@pytest.fixture
async def cluster_name() -> str:
    return f"sess-{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def start_coordinator(
    etcd: Any, make_etcd_client: MakeEtcdClient, cluster_name: str
) -> AsyncIterator[Callable[..., Awaitable[Coordinator]]]:
    started: list[Coordinator] = []

    async def start(member: str, settings: CoreSettings = FAST) -> Coordinator:
        coordinator = await _start(make_etcd_client, etcd.endpoint, cluster_name, member, settings)
        started.append(coordinator)
        return coordinator

    yield start
    for coordinator in reversed(started):
        await _stop(coordinator)


@pytest.fixture
async def leader(
    start_coordinator: Callable[..., Awaitable[Coordinator]],
) -> Coordinator:
    coordinator = await start_coordinator("c1")
    async with asyncio.timeout(WAIT_S):
        while not coordinator.runtime.leading:
            await asyncio.sleep(0.02)
    return coordinator


class FakeAgent:
    """A node agent made of a raw stream: write messages or bytes, read replies."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.aio.insecure_channel(address)
        self.call: Any = self.channel.stream_stream(
            SESSION_METHOD,
            request_serializer=None,
            response_deserializer=agent_pb2.CoordinatorMessage.FromString,
        )()
        self.seq = 0

    async def send(self, message: agent_pb2.AgentMessage | bytes) -> None:
        data = message if isinstance(message, bytes) else message.SerializeToString()
        await self.call.write(data)

    async def hello(
        self, node_id: str, incarnation: str = "i1", hello_seq: int = 0
    ) -> agent_pb2.Welcome:
        await self.send(
            agent_pb2.AgentMessage(
                hello=agent_pb2.Hello(
                    node_id=node_id,
                    incarnation=incarnation,
                    capacity=records_pb2.NodeCapacity(slots=2),
                    hello_seq=hello_seq,
                )
            )
        )
        reply = await self.recv()
        assert reply.WhichOneof("body") == "welcome", reply
        return reply.welcome

    async def heartbeat(self, seq: int | None = None) -> None:
        self.seq = self.seq + 1 if seq is None else seq
        await self.send(
            agent_pb2.AgentMessage(
                heartbeat=agent_pb2.Heartbeat(
                    seq=self.seq, sent_at_unix_ms=123, sent_at_monotonic_ms=456
                )
            )
        )

    async def recv(self) -> agent_pb2.CoordinatorMessage:
        async with asyncio.timeout(WAIT_S):
            message = await self.call.read()
        assert message is not grpc.aio.EOF, "stream ended"
        return message  # type: ignore[no-any-return]

    async def final_status(self) -> tuple[grpc.StatusCode, str]:
        """Read until the stream ends; its status and details."""
        async with asyncio.timeout(WAIT_S):
            with contextlib.suppress(grpc.aio.AioRpcError):
                while await self.call.read() is not grpc.aio.EOF:
                    pass
            return await self.call.code(), await self.call.details()

    async def close(self) -> None:
        await self.channel.close()


@pytest.fixture
async def agents() -> AsyncIterator[Callable[[str], FakeAgent]]:
    made: list[FakeAgent] = []

    def make(address: str) -> FakeAgent:
        agent = FakeAgent(address)
        made.append(agent)
        return agent

    yield make
    for agent in made:
        await agent.close()


def _state(coordinator: Coordinator, node_id: str) -> NodeState | None:
    view = coordinator.runtime.core.node(node_id)
    return None if view is None else view.record.state


async def _wait_state(coordinator: Coordinator, node_id: str, state: NodeState) -> float:
    started = time.monotonic()
    async with asyncio.timeout(WAIT_S):
        while _state(coordinator, node_id) is not state:
            await asyncio.sleep(0.005)
    return time.monotonic() - started


async def test_hello_welcome_heartbeat_ack_and_persisted(
    leader: Coordinator, agents: Callable[[str], FakeAgent]
) -> None:
    agent = agents(leader.address)
    welcome = await agent.hello("n1", hello_seq=3)
    assert welcome.session_id
    assert welcome.hello_seq == 3  # the agent takes only its newest Hello's Welcome
    assert welcome.term == leader.runtime.leadership.term  # type: ignore[union-attr]
    assert welcome.heartbeat_interval_ms == 100
    assert welcome.dead_after_ms == 600
    assert welcome.fence_after_ms == 400
    assert welcome.node_state == records_pb2.NODE_STATE_ALIVE
    for _ in range(3):
        await agent.heartbeat()
        reply = await agent.recv()
        assert reply.WhichOneof("body") == "heartbeat_ack"
        assert reply.heartbeat_ack.seq == agent.seq
        assert reply.heartbeat_ack.sent_at_unix_ms == 123
        assert reply.heartbeat_ack.sent_at_monotonic_ms == 456
    snapshot = await leader.runtime.store.load()
    record = convert.node_record_from_pb(records_pb2.NodeRecord.FromString(snapshot.nodes["n1"]))
    assert record.state is NodeState.ALIVE
    assert record.written_term == leader.runtime.leadership.term  # type: ignore[union-attr]
    kinds = [event.WhichOneof("body") for event in leader.runtime.events]
    assert "node_joined" in kinds


async def test_closed_stream_is_suspect_at_once(
    leader: Coordinator, agents: Callable[[str], FakeAgent]
) -> None:
    agent = agents(leader.address)
    await agent.hello("n-closed")
    await agent.heartbeat()
    await agent.recv()
    await agent.call.done_writing()
    elapsed = await _wait_state(leader, "n-closed", NodeState.SUSPECT)
    assert elapsed < 0.2
    code, _ = await agent.final_status()
    assert code is grpc.StatusCode.OK


async def test_silence_is_dead_within_dead_after_plus_interval(
    leader: Coordinator, agents: Callable[[str], FakeAgent]
) -> None:
    agent = agents(leader.address)
    await agent.hello("n-silent")
    await agent.heartbeat()
    await agent.recv()
    last_heartbeat = time.monotonic()
    await _wait_state(leader, "n-silent", NodeState.DEAD)
    detection_s = time.monotonic() - last_heartbeat
    print(f"MEASURED silence_to_dead {detection_s:.3f}")
    assert detection_s <= FAST.dead_after_s + FAST.heartbeat_interval_s
    code, details = await agent.final_status()
    assert code is grpc.StatusCode.ABORTED
    assert "DEAD" in details


def _hello(node_id: str = "n", incarnation: str = "i1") -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(
        hello=agent_pb2.Hello(
            node_id=node_id, incarnation=incarnation, capacity=records_pb2.NodeCapacity(slots=1)
        )
    )


def _heartbeat(seq: int) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=seq))


async def test_bad_input_closes_only_that_stream(
    leader: Coordinator, agents: Callable[[str], FakeAgent]
) -> None:
    healthy = agents(leader.address)
    await healthy.hello("n-healthy")

    async def expect(
        messages: list[agent_pb2.AgentMessage | bytes], code: grpc.StatusCode, needle: str
    ) -> None:
        agent = agents(leader.address)
        for message in messages:
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                await agent.send(message)
        got, details = await agent.final_status()
        assert got is code, (got, details)
        assert needle in details, details
        await healthy.heartbeat()
        reply = await healthy.recv()
        assert reply.WhichOneof("body") == "heartbeat_ack"

    invalid = grpc.StatusCode.INVALID_ARGUMENT
    await expect([_heartbeat(1)], invalid, "first message must be a hello")
    await expect([agent_pb2.AgentMessage()], invalid, "body: must be set")
    await expect([b"\xff\xff\xff\xff"], invalid, "do not parse")
    await expect([_hello("n-a").SerializeToString() + b"\xf8\x07\x01"], invalid, "unknown")
    await expect([_hello("n-b", incarnation="")], invalid, "hello.incarnation")
    await expect([_hello("n-c"), _hello("n-c")], invalid, "second Hello")
    await expect([_hello("n-d"), _heartbeat(5), _heartbeat(4)], invalid, "heartbeat.seq")
    await expect(
        [_hello("n-e"), agent_pb2.AgentMessage(task_update=agent_pb2.TaskUpdate(task_id="t"))],
        invalid,
        "change",
    )
    with_version = _hello("n-f")
    with_version.hello.protocol_version = 99
    await expect([with_version], grpc.StatusCode.FAILED_PRECONDITION, "protocol_version")
    assert leader.runtime.leading


async def test_follower_answers_not_leader(
    leader: Coordinator,
    start_coordinator: Callable[..., Awaitable[Coordinator]],
    agents: Callable[[str], FakeAgent],
) -> None:
    follower = await start_coordinator("c2")
    await asyncio.sleep(0.2)
    assert not follower.runtime.leading
    agent = agents(follower.address)
    await agent.send(_hello("n-f"))
    reply = await agent.recv()
    assert reply.WhichOneof("body") == "not_leader"
    assert reply.not_leader.leader_address == leader.address
    assert reply.not_leader.term == leader.runtime.leadership.term  # type: ignore[union-attr]
    code, details = await agent.final_status()
    assert code is grpc.StatusCode.UNAVAILABLE
    assert leader.address in details


async def test_new_leader_reloads_nodes_after_resign(
    leader: Coordinator,
    start_coordinator: Callable[..., Awaitable[Coordinator]],
    agents: Callable[[str], FakeAgent],
) -> None:
    agent = agents(leader.address)
    await agent.hello("n-move")
    follower = await start_coordinator("c2")
    await asyncio.sleep(0.1)
    await leader.runtime.resign()
    code, _ = await agent.final_status()
    assert code is grpc.StatusCode.UNAVAILABLE
    async with asyncio.timeout(WAIT_S):
        while not follower.runtime.leading:
            await asyncio.sleep(0.02)
    assert _state(follower, "n-move") is NodeState.ALIVE
    again = agents(follower.address)
    welcome = await again.hello("n-move")
    assert welcome.term == follower.runtime.leadership.term  # type: ignore[union-attr]
