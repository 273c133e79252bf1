"""Helpers of the hardening tests: an in-process replica and a raw-stream node agent.

``start_replica`` runs a whole :class:`~coordinator.server.CoordinatorServer`
(etcd election, store, read cache, gRPC services, health) in the test's event
loop against the session etcd and Redis; ``RawAgent`` is a Session stream the
test writes messages on and reads replies from.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import grpc
import grpc.aio

from coordinator.core import CoreSettings
from coordinator.server import CoordinatorServer, ServerSettings
from lazarus.v1 import agent_pb2, coordinator_pb2_grpc, records_pb2

WAIT_S = 10.0
SESSION_METHOD = "/lazarus.v1.AgentService/Session"


def cluster_name(prefix: str) -> str:
    """A cluster name unique to one test (its own etcd prefix and Redis keys)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def start_replica(
    etcd: Any,
    redis_server: Any,
    cluster: str,
    member_id: str = "c1",
    settings: CoreSettings | None = None,
    observer: Any = None,
    **server_settings: Any,
) -> CoordinatorServer:
    """Start one in-process replica; wait until it leads when it is the first.

    Args:
        etcd, redis_server: the session servers (their ``endpoint``).
        cluster: the cluster name.
        member_id: the replica's member id.
        settings: core settings (defaults of DESIGN.md §10 when None).
        server_settings: extra ``ServerSettings`` fields.

    Returns:
        The started replica; stop it with ``await replica.stop()``.
    """
    server = CoordinatorServer(
        ServerSettings(
            cluster=cluster,
            member_id=member_id,
            listen="127.0.0.1:0",
            etcd_endpoint=str(etcd.endpoint),
            redis_url=f"redis://{redis_server.endpoint}/0",
            **{"auth": "none", **server_settings},  # the subject is hardening; mTLS: test_security
        ),
        settings if settings is not None else CoreSettings(),
        observer=observer,
        seed=7,
    )
    await server.start()
    return server


async def wait_leading(server: CoordinatorServer, timeout_s: float = WAIT_S) -> None:
    """Wait until ``server`` leads."""
    assert server.runtime is not None
    async with asyncio.timeout(timeout_s):
        while not server.runtime.leading:
            await asyncio.sleep(0.02)


def api(address: str) -> tuple[grpc.aio.Channel, coordinator_pb2_grpc.CoordinatorServiceStub]:
    """A channel and CoordinatorService stub on ``address`` (close the channel)."""
    channel = grpc.aio.insecure_channel(address)
    return channel, coordinator_pb2_grpc.CoordinatorServiceStub(channel)  # type: ignore[no-untyped-call]


class RawAgent:
    """A node agent made of a raw Session stream."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.aio.insecure_channel(address)
        self.call: Any = self.channel.stream_stream(
            SESSION_METHOD,
            request_serializer=None,
            response_deserializer=agent_pb2.CoordinatorMessage.FromString,
        )()
        self.seq = 0
        self.update_seq = 0

    async def send(self, message: agent_pb2.AgentMessage | bytes) -> None:
        data = message if isinstance(message, bytes) else message.SerializeToString()
        await self.call.write(data)

    async def hello(self, node_id: str, **fields: Any) -> None:
        fields.setdefault("incarnation", "i1")
        fields.setdefault("capacity", records_pb2.NodeCapacity(slots=2))
        await self.send(agent_pb2.AgentMessage(hello=agent_pb2.Hello(node_id=node_id, **fields)))

    async def heartbeat(self) -> None:
        self.seq += 1
        await self.send(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=self.seq)))

    async def update(self, task_id: str, epoch: int, **change: Any) -> int:
        self.update_seq += 1
        await self.send(
            agent_pb2.AgentMessage(
                task_update=agent_pb2.TaskUpdate(
                    update_seq=self.update_seq, task_id=task_id, epoch=epoch, **change
                )
            )
        )
        return self.update_seq

    async def recv_until(
        self, body: str, timeout_s: float = WAIT_S
    ) -> agent_pb2.CoordinatorMessage:
        """Read until a message with this body arrives (others are skipped)."""
        async with asyncio.timeout(timeout_s):
            while True:
                message = await self.call.read()
                assert message is not grpc.aio.EOF, "stream ended"
                if message.WhichOneof("body") == body:
                    return message  # type: ignore[no-any-return]

    async def final_status(self, timeout_s: float = WAIT_S) -> tuple[grpc.StatusCode, str]:
        """Read until the stream ends; its status and details."""
        async with asyncio.timeout(timeout_s):
            with contextlib.suppress(grpc.aio.AioRpcError):
                while await self.call.read() is not grpc.aio.EOF:
                    pass
            return await self.call.code(), await self.call.details()

    async def close(self) -> None:
        await self.channel.close()
