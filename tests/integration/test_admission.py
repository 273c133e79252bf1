"""Issue 16 item 2: bounded queues and admission control on a real replica.

- A Session whose agent sends heartbeats but never reads its stream is ended
  with RESOURCE_EXHAUSTED once ``max_outbound_messages`` acks wait, instead
  of the leader buffering them without limit.
- A burst of Hellos over the admitted rate: the surplus is told NotLeader
  naming this very replica with a ``retry_after_ms`` (UNAVAILABLE), never
  admitted all at once.
- Orchestrator RPCs past ``max_concurrent_rpcs`` answer RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
import pytest

from coordinator.core import CoreSettings
from coordinator.core.admission import AdmissionSettings
from coordinator.server import CoordinatorServer, ServerSettings
from lazarus.v1 import agent_pb2, records_pb2

SESSION_METHOD = "/lazarus.v1.AgentService/Session"
CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0), ("grpc.use_local_subchannel_pool", 1)]

StartLeader = Callable[[AdmissionSettings], Awaitable[CoordinatorServer]]

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def start_leader(etcd: Any, redis_server: Any) -> AsyncIterator[StartLeader]:
    started: list[CoordinatorServer] = []

    async def start(admission: AdmissionSettings) -> CoordinatorServer:
        server = CoordinatorServer(
            ServerSettings(
                cluster=f"admission-{uuid.uuid4().hex[:10]}",
                member_id="admission-1",
                etcd_endpoint=str(etcd.endpoint),
                lease_ttl_s=2,
                redis_url=redis_server.url,
                admission=admission,
                auth="none",  # admission is the subject here; mTLS: test_security.py
            ),
            CoreSettings(),
            seed=1,
        )
        started.append(server)
        await server.start()
        async with asyncio.timeout(20):
            while server.runtime is None or not server.runtime.leading:
                await asyncio.sleep(0.05)
        return server

    yield start
    for server in started:
        await server.stop()


def _session(channel: grpc.aio.Channel) -> Any:
    return channel.stream_stream(
        SESSION_METHOD,
        request_serializer=agent_pb2.AgentMessage.SerializeToString,
        response_deserializer=agent_pb2.CoordinatorMessage.FromString,
    )()


def _hello(node_id: str) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(
        hello=agent_pb2.Hello(
            node_id=node_id,
            incarnation=uuid.uuid4().hex[:8],
            capacity=records_pb2.NodeCapacity(slots=1),
        )
    )


async def _status_after_reading(call: Any, timeout_s: float) -> tuple[list[Any], Any]:
    messages = []
    async with asyncio.timeout(timeout_s):
        try:
            while (message := await call.read()) is not grpc.aio.EOF:
                messages.append(message)
        except grpc.aio.AioRpcError:
            pass
        return messages, await call.code()


async def test_a_hello_burst_over_the_rate_is_deferred(start_leader: StartLeader) -> None:
    server = await start_leader(AdmissionSettings(hello_rate_per_s=2.0, hello_burst=3))
    async with grpc.aio.insecure_channel(server.address, options=CHANNEL_OPTIONS) as channel:
        calls = [_session(channel) for _ in range(10)]
        for i, call in enumerate(calls):
            await call.write(_hello(f"n-burst-{i}"))
        firsts = []
        for call in calls:
            async with asyncio.timeout(10):
                firsts.append(await call.read())
        welcomed = [m for m in firsts if m.WhichOneof("body") == "welcome"]
        deferred = [m.not_leader for m in firsts if m.WhichOneof("body") == "not_leader"]
        assert len(welcomed) == 3, firsts
        assert len(deferred) == 7
        assert all(nl.leader_address == server.address for nl in deferred)
        delays = sorted(nl.retry_after_ms for nl in deferred)
        assert delays[0] > 0
        assert delays[-1] >= 3000  # seven more at 2/s are spread over ~3.5 s
        for call in calls:
            call.cancel()
