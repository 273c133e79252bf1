"""The agent's background loops never die silently (audit: loop supervision).

Before: the directive processor of a Session ended on the first exception of
``_execute`` (a ``StoreIOError`` of ``put_meta`` on a full disk) and nothing
read its exception until the Session ended; heartbeat acks were handled
inline, so the Session looked healthy while every later Assign, Revoke or
Release piled up unapplied. The session, tick and Redis-generation loops had
no supervisor: a tick loop that raised left a process whose handlers ran on
with no heartbeats and no self-fence.

Now a processor failure ends the Session (and, when the core had stepped past
the directives, stops the agent), and a loop's end outside ``stop`` stops the
agent, whose ``node_agent.main`` exits 1. The fakes are of the gRPC channel
the agent's TLS settings open; the agent itself is the real ``NodeAgent``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path
from typing import Any

import pytest
from agent_channel_fakes import FakeTls

from lazarus.storage.errors import StoreIOError
from lazarus.v1 import agent_pb2
from node_agent import agent as agent_module
from node_agent import main as main_module
from node_agent.agent import NodeAgent
from node_agent.core import AgentCore, SessionState
from node_agent.sdk import Agent
from node_agent.settings import AgentSettings


class _ScriptedCall:
    """A Session call that answers with ``script``, then stays silent (never ends)."""

    def __init__(self, script: list[agent_pb2.CoordinatorMessage]) -> None:
        self.script = list(script)
        self.written: list[Any] = []
        self.cancelled = False
        self._never = asyncio.Event()

    async def write(self, message: Any) -> None:
        self.written.append(message)

    async def read(self) -> Any:
        if self.script:
            return self.script.pop(0)
        await self._never.wait()
        return None

    async def done_writing(self) -> None:
        return None

    def cancel(self) -> bool:
        self.cancelled = True
        return True


def _tls(script: list[agent_pb2.CoordinatorMessage] | None = None) -> FakeTls[_ScriptedCall]:
    """Every Session call answers with ``script``, then stays silent."""
    return FakeTls(lambda: _ScriptedCall(script or []))


class _FullDiskAio:
    async def put_meta(self, task_id: str, meta: bytes) -> None:
        raise StoreIOError("database or disk is full")

    async def close(self) -> None:
        return None


class _FullDiskStore:
    aio = _FullDiskAio()


def _settings(tmp_path: Path, tls: FakeTls[_ScriptedCall]) -> AgentSettings:
    settings = AgentSettings(
        node_id="n1",
        coordinators=("c1:1",),
        data_dir=tmp_path,
        redis_url="redis://127.0.0.1:1/0",  # nothing listens: replication just queues
        rpc_timeout_s=30.0,  # longer than every test: silence never ends a Session here
    )
    return dataclasses.replace(settings, tls=tls)  # type: ignore[arg-type]


def _welcome_and_assign() -> list[agent_pb2.CoordinatorMessage]:
    welcome = agent_pb2.CoordinatorMessage(
        welcome=agent_pb2.Welcome(session_id="s1", term=3, leader_id="c1")
    )
    assign = agent_pb2.CoordinatorMessage(assign=agent_pb2.Assign(task_id="t1", epoch=1))
    assign.assign.spec.kind = "sleep"
    return [welcome, assign]


async def test_a_failed_directive_ends_the_session_and_stops_the_agent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """put_meta fails (a full disk) while applying an Assign: logged, Session over, agent stops."""
    tls = _tls(_welcome_and_assign())
    agent = NodeAgent(_settings(tmp_path, tls), app=Agent())
    agent._store = _FullDiskStore()  # type: ignore[assignment]
    caplog.set_level(logging.ERROR, logger="lazarus.agent")
    async with asyncio.timeout(10):  # before: the Session stayed up, the Assign unapplied
        end = await agent._one_session("c1:1")
    assert end.welcomed
    assert tls.calls[0].cancelled
    # The Session is lost as any other: tasks run on to the fence deadline.
    assert agent.core.session is SessionState.RECONNECTING
    assert agent.core.fence_deadline() is not None
    failures = [r for r in caplog.records if "applying directive(s)" in r.getMessage()]
    assert failures, caplog.text
    assert "assign" in failures[0].getMessage()
    assert failures[0].exc_info is not None
    assert failures[0].exc_info[0] is StoreIOError
    assert agent.metrics.directive_failures._value.get() == 1
    # The core stepped past the Assign it could not persist: only a restart
    # from the store re-syncs it with the runner, so the agent stops itself.
    async with asyncio.timeout(10):
        reason = await agent.failed()
    assert "StoreIOError" in reason
    assert agent.stopping


async def test_an_unreadable_directive_ends_the_session_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing of the batch reached the core: the Session ends, the agent stays up."""

    def unreadable(msg: agent_pb2.CoordinatorMessage) -> Any:
        raise ValueError("a field this build cannot read")

    monkeypatch.setattr(agent_module.convert, "coordinator_message_from_pb", unreadable)
    tls = _tls(_welcome_and_assign()[:1])
    agent = NodeAgent(_settings(tmp_path, tls), app=Agent())
    caplog.set_level(logging.ERROR, logger="lazarus.agent")
    async with asyncio.timeout(10):
        end = await agent._one_session("c1:1")
    assert end.welcomed
    assert not end.broken
    errors = [r for r in caplog.records if "unreadable" in r.getMessage()]
    assert errors, caplog.text
    assert "welcome" in errors[0].getMessage()
    assert errors[0].exc_info is not None
    assert errors[0].exc_info[0] is ValueError
    assert agent.metrics.directive_failures._value.get() == 1
    assert agent.failure is None
    assert not agent.stopping


async def test_a_tick_loop_that_raises_stops_the_agent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tls = _tls(_welcome_and_assign()[:1])
    agent = NodeAgent(_settings(tmp_path, tls), app=Agent())
    caplog.set_level(logging.ERROR, logger="lazarus.agent")
    await agent.start()
    try:

        def broken_tick(now: float, wall_ms: int) -> Any:
            raise RuntimeError("tick broke")

        agent.core.tick = broken_tick  # type: ignore[method-assign]
        async with asyncio.timeout(10):  # before: the process ran on with no tick loop
            while not agent.stopping:
                await asyncio.sleep(0.02)
            reason = await agent.failed()
        assert "agent-tick" in reason
        assert "tick broke" in reason
        errors = [r for r in caplog.records if "agent loop agent-tick failed" in r.getMessage()]
        assert errors, caplog.text
        assert errors[0].exc_info is not None
        assert errors[0].exc_info[0] is RuntimeError
        assert agent.metrics.loop_failures.labels(loop="agent-tick")._value.get() == 1
        assert not agent._tasks  # stop() ran: the other loops are gone too
    finally:
        await agent.stop(goodbye=False)


async def test_main_exits_1_when_a_loop_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_tick(self: AgentCore, now: float, wall_ms: int) -> Any:
        raise RuntimeError("tick broke")

    monkeypatch.setattr(AgentCore, "tick", broken_tick)
    settings = _settings(tmp_path, _tls(_welcome_and_assign()[:1]))
    async with asyncio.timeout(20):  # before: it waited for a signal forever
        code = await main_module._main(settings)
    assert code == 1
