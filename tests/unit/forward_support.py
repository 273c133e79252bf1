"""A bare ReplicaService.Forward on loopback for tests of the follower's link.

The handler stands in for a leader (one that refuses, hangs, ends the stream);
the tests drive a real ``_Link`` against it over real gRPC.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from coordinator.forwarding import REPLICA_SERVICE_NAME
from lazarus.v1 import replica_pb2

ForwardHandler = Callable[[AsyncIterator[replica_pb2.ForwardBatch], Any], Awaitable[None]]


async def serve_forward(handler: ForwardHandler) -> tuple[grpc.aio.Server, str]:
    """Start a server whose Forward method is ``handler``; (server, host:port)."""
    server = grpc.aio.server()
    method = grpc.stream_stream_rpc_method_handler(
        handler,
        request_deserializer=replica_pb2.ForwardBatch.FromString,
        response_serializer=replica_pb2.ForwardBatch.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(REPLICA_SERVICE_NAME, {"Forward": method}),)
    )
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    return server, address
