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
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from lazarus.v1 import agent_pb2, agent_pb2_grpc
from node_agent.agent import NodeAgent
from node_agent.core.dial import DialPlan, spread_start
from node_agent.sdk import Agent
from node_agent.settings import AgentSettings


class _Replica(agent_pb2_grpc.AgentServiceServicer):
    def __init__(
        self,
        name: str,
        code: grpc.StatusCode,
        dials: collections.Counter[str],
        names_leader: str = "",
    ) -> None:
        self.name, self.code, self.dials = name, code, dials
        self.names_leader = names_leader  # answer NotLeader naming this address first

    async def Session(
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        self.dials[self.name] += 1
        if self.names_leader:
            await context.write(
                agent_pb2.CoordinatorMessage(
                    not_leader=agent_pb2.NotLeader(leader_address=self.names_leader)
                )
            )
        await context.abort(self.code, f"{self.name} says no")
        yield agent_pb2.CoordinatorMessage()  # pragma: no cover (abort raised)


async def _serve(replica: _Replica, host: str = "127.0.0.1", port: int = 0) -> tuple[Any, str]:
    """A started gRPC server answering as ``replica`` on ``host:port`` (0: any), and its address."""
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServiceServicer_to_server(replica, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    return server, f"{host}:{port}"


async def _dial_for(agent: NodeAgent, servers: list[grpc.aio.Server], seconds: float) -> None:
    """Run the agent's dial loop ``seconds``, then stop it and the servers."""
    loop = asyncio.create_task(agent._session_loop())
    try:
        await asyncio.sleep(seconds)
        assert not loop.done(), loop  # the loop outlived every refusal
    finally:
        agent._stopping = True
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        for server in servers:
            await server.stop(None)


REPLICAS = (
    ("down", grpc.StatusCode.UNAVAILABLE),
    ("b", grpc.StatusCode.FAILED_PRECONDITION),
    ("c", grpc.StatusCode.FAILED_PRECONDITION),
)


async def _dials_in(
    tmp_path: Path,
    seconds: float,
    hold_off_s: float | None,
    resolve: bool = False,
    monkeypatch: pytest.MonkeyPatch | None = None,
) -> dict[str, int]:
    """Run the agent's dial loop ``seconds`` against the three replicas; dials by name.

    With ``resolve`` the agent is given one name, ``replicas.test:<port>``,
    which resolves (a fake ``getaddrinfo``: a headless Service's answer) to
    the three replicas on 127.0.0.1-3.
    """
    dials: collections.Counter[str] = collections.Counter()
    servers, addresses = [], []
    port = 0
    for i, (name, code) in enumerate(REPLICAS):
        host = f"127.0.0.{i + 1}" if resolve else "127.0.0.1"
        server, address = await _serve(_Replica(name, code, dials), host, port if resolve else 0)
        port = int(address.rpartition(":")[2])
        servers.append(server)
        addresses.append(address)
    coordinators = (f"replicas.test:{port}",) if resolve else tuple(addresses)
    if resolve:
        assert monkeypatch is not None
        loop = asyncio.get_running_loop()

        async def headless(host: str, port: int, **kw: Any) -> list[Any]:
            assert host == "replicas.test"
            return [
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", (f"127.0.0.{i}", port))
                for i in (3, 1, 2)
            ]

        monkeypatch.setattr(loop, "getaddrinfo", headless)
    settings = AgentSettings(
        node_id="n1",
        coordinators=coordinators,
        data_dir=tmp_path,
        reconnect_max_backoff_s=0.1,
        resolve_coordinators=resolve,
    )
    agent = NodeAgent(settings, app=Agent())
    if hold_off_s is not None:
        agent._dial = DialPlan(settings.coordinators, hold_off_s=hold_off_s)
    await _dial_for(agent, servers, seconds)
    dials["held_off_metric"] = int(agent.metrics.dials_held_off._value.get())
    if resolve:
        assert agent._dial.addresses == tuple(sorted(addresses))
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


async def test_a_resolved_name_is_dialled_at_every_address_it_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with asyncio.timeout(20):
        dials = await _dials_in(tmp_path, 1.0, None, resolve=True, monkeypatch=monkeypatch)
    assert dials.get("down") == 1, dials
    assert dials.get("b", 0) >= 3, dials
    assert dials.get("c", 0) >= 3, dials


async def test_resolution_uses_the_system_resolver_and_keeps_a_name_it_cannot_resolve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = AgentSettings(
        node_id="n1",
        coordinators=("localhost:7070", "[::1]:7071", "gone.test:7072"),
        data_dir=tmp_path,
        resolve_coordinators=True,
    )
    agent = NodeAgent(settings, app=Agent())
    loop = asyncio.get_running_loop()
    real = loop.getaddrinfo

    async def resolver(host: str, port: int, **kw: Any) -> Any:
        if host == "gone.test":  # no DNS query leaves this host
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return await real(host, port, **kw)

    monkeypatch.setattr(loop, "getaddrinfo", resolver)
    await agent._resolve_coordinators()
    assert set(agent._dial.addresses) == {"127.0.0.1:7070", "[::1]:7071", "gone.test:7072"}


def test_the_plan_follows_the_settings(tmp_path: Path) -> None:
    settings = AgentSettings(node_id="n1", coordinators=("x:1", "y:1"), data_dir=tmp_path)
    agent = NodeAgent(settings, app=Agent())
    assert agent._dial.addresses == ("x:1", "y:1")
    assert agent._dial.next(0.0).address == ("x:1", "y:1")[spread_start("n1", 2)]


async def test_followers_naming_a_crashed_leader_do_not_make_the_agent_spin(
    tmp_path: Path,
) -> None:
    # Followers name the crashed leader (held off) with no retry_after: the
    # agent dials them paced by its backoff, not back to back (with the
    # redirect treated as usable it dialled them 57 times in this second).
    dials: collections.Counter[str] = collections.Counter()
    down, down_address = await _serve(_Replica("down", grpc.StatusCode.UNAVAILABLE, dials))
    servers, addresses = [down], [down_address]
    for name in ("b", "c"):
        server, address = await _serve(
            _Replica(name, grpc.StatusCode.UNAVAILABLE, dials, names_leader=down_address)
        )
        servers.append(server)
        addresses.append(address)
    settings = AgentSettings(node_id="n1", coordinators=tuple(addresses), data_dir=tmp_path)
    agent = NodeAgent(settings, app=Agent())
    agent._dial = DialPlan(settings.coordinators)  # down first
    await _dial_for(agent, servers, 1.0)
    assert dials["down"] == 1, dials
    assert 1 <= dials["b"] + dials["c"] <= 25, dials
