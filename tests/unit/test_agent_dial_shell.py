"""The agent shell follows ``DialPlan``: a replica it could not reach is not redialled at once.

Three real gRPC servers on loopback stand in for coordinator replicas (our
own AgentService interface, faked): ``down`` ends every Session UNAVAILABLE
before any message (as a crashed replica's address does), ``b`` and ``c``
refuse the Hello with FAILED_PRECONDITION (an answer). Over 1 s the agent,
listing ``down`` first, dials it once and then only ``b`` and ``c`` (its
3 s hold-off); with the hold-off off it comes back to ``down`` every third
dial, which is what the test would see if the shell ignored the plan.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from lazarus.v1 import agent_pb2, agent_pb2_grpc
from node_agent.agent import NodeAgent
from node_agent.core.dial import DialPlan
from node_agent.sdk import Agent
from node_agent.settings import AgentSettings


class _Replica(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self, name: str, code: grpc.StatusCode, dials: collections.Counter[str]) -> None:
        self.name, self.code, self.dials = name, code, dials

    async def Session(
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        self.dials[self.name] += 1
        await context.abort(self.code, f"{self.name} says no")
        yield agent_pb2.CoordinatorMessage()  # pragma: no cover (abort raised)


async def _dials_in(tmp_path: Path, seconds: float, hold_off_s: float | None) -> dict[str, int]:
    dials: collections.Counter[str] = collections.Counter()
    servers, addresses = [], []
    for name, code in (
        ("down", grpc.StatusCode.UNAVAILABLE),
        ("b", grpc.StatusCode.FAILED_PRECONDITION),
        ("c", grpc.StatusCode.FAILED_PRECONDITION),
    ):
        server = grpc.aio.server()
        agent_pb2_grpc.add_AgentServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _Replica(name, code, dials), server
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        addresses.append(f"127.0.0.1:{port}")
    settings = AgentSettings(
        node_id="n1",
        coordinators=tuple(addresses),
        data_dir=tmp_path,
        reconnect_max_backoff_s=0.1,
    )
    agent = NodeAgent(settings, app=Agent())
    if hold_off_s is not None:
        agent._dial = DialPlan(settings.coordinators, hold_off_s=hold_off_s)
    loop = asyncio.create_task(agent._session_loop())
    try:
        await asyncio.sleep(seconds)
    finally:
        agent._stopping = True
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        for server in servers:
            await server.stop(None)
    assert not loop.done() or loop.cancelled()
    dials["held_off_metric"] = int(agent.metrics.dials_held_off._value.get())
    return dict(dials)


async def test_an_unreachable_replica_is_held_off(tmp_path: Path) -> None:
    async with asyncio.timeout(20):
        dials = await _dials_in(tmp_path, 1.0, hold_off_s=None)
    assert dials.get("down") == 1, dials
    assert dials.get("b", 0) >= 3, dials
    assert dials.get("c", 0) >= 3, dials
    assert dials["held_off_metric"] >= 1, dials


async def test_without_the_hold_off_it_returns_to_the_unreachable_replica(
    tmp_path: Path,
) -> None:
    async with asyncio.timeout(20):
        dials = await _dials_in(tmp_path, 1.0, hold_off_s=0.0)
    assert dials.get("down", 0) >= 3, dials
    assert dials["held_off_metric"] == 0, dials


def test_the_plan_follows_the_settings(tmp_path: Path) -> None:
    settings = AgentSettings(node_id="n1", coordinators=("x:1", "y:1"), data_dir=tmp_path)
    agent = NodeAgent(settings, app=Agent())
    assert agent._dial.addresses == ("x:1", "y:1")
