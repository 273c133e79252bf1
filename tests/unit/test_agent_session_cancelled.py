"""A gRPC call that grpc-python cancels under the agent ends one Session, never the loop.

Found by bench/leader_change_bench.py at 500 agents: when the Hello's
``wait_for(call.write(...))`` timed out under an overloaded leader, grpc-python
cancelled the whole call and the next ``read`` ended cancelled; the
``CancelledError`` escaped ``_one_session`` and ended ``_session_loop`` while the
process kept running (a live node that never dials again turns DEAD). The
fakes below are of the gRPC channel the agent's TLS settings open; the agent
itself is the real ``NodeAgent``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

from agent_channel_fakes import FakeTls

from node_agent.agent import NodeAgent
from node_agent.sdk import Agent
from node_agent.settings import AgentSettings


class _CancelledCall:
    def __init__(self) -> None:
        self.cancelled = False

    async def write(self, message: Any) -> None:
        return None

    async def read(self) -> Any:
        raise asyncio.CancelledError  # what grpc-python does on a call it cancelled

    async def done_writing(self) -> None:
        return None

    def cancel(self) -> bool:
        self.cancelled = True
        return True


def _tls() -> FakeTls[_CancelledCall]:
    return FakeTls(_CancelledCall)


def _agent(tmp_path: Path, tls: FakeTls[_CancelledCall]) -> NodeAgent:
    settings = AgentSettings(node_id="n1", coordinators=("c1:1", "c2:1"), data_dir=tmp_path)
    return NodeAgent(dataclasses.replace(settings, tls=tls), app=Agent())  # type: ignore[arg-type]


async def test_a_cancelled_call_ends_the_session_not_the_agent(tmp_path: Path) -> None:
    tls = _tls()
    agent = _agent(tmp_path, tls)
    async with asyncio.timeout(10):
        end = await agent._one_session("c1:1")  # returns: does not raise
    assert (end.welcomed, end.reachable, end.broken) == (False, False, True)
    assert tls.calls
    assert tls.calls[0].cancelled


async def test_the_session_loop_dials_again_after_a_cancelled_call(tmp_path: Path) -> None:
    tls = _tls()
    agent = _agent(tmp_path, tls)
    loop = asyncio.create_task(agent._session_loop())
    try:
        async with asyncio.timeout(20):
            while len(tls.calls) < 3:  # the loop survived two cancelled calls
                assert not loop.done(), loop
                await asyncio.sleep(0.05)
    finally:
        agent._stopping = True
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
