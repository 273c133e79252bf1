"""A follower's link waits for the leader to accept its Forward stream (issue 20).

The election names the next leader before that replica's runtime leads (it is
still taking over); its ForwardService refuses the stream until then. The
follower sends its agents Reattaches only over a link the leader accepted, and
asks again soon (not after the 1 s hold-off of a leader that went). Real gRPC
on loopback; the runtime is a fake of our own interface (``leading``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any

import grpc
import pytest
from forward_support import serve_forward

from coordinator.core.relay import LinkChoice
from coordinator.forwarding import (
    LINK_CONNECT_TIMEOUT_S,
    SessionForwarder,
    _Link,
    _NullObserver,
    add_replica_service,
)
from lazarus.v1 import agent_pb2, replica_pb2


class _Runtime:
    leading = False
    feed_backlog = 0  # events queued, not yet stepped (the leader's read bound)


async def _never(requests: AsyncIterator[bytes], context: Any) -> None:
    async for _ in requests:
        pass


async def _old_release(requests: AsyncIterator[replica_pb2.ForwardBatch], context: Any) -> None:
    """An earlier release's leader: accepts without a word, writes only replies."""
    async for _ in requests:
        pass


async def _busy_then_refuses(
    requests: AsyncIterator[replica_pb2.ForwardBatch], context: Any
) -> None:
    """A leader still taking over whose loop answers only after the wait: then refuses."""
    await asyncio.sleep(0.5)
    await context.abort(grpc.StatusCode.UNAVAILABLE, "not the leader")


async def _server(handler: str, runtime: _Runtime) -> tuple[grpc.aio.Server, str]:
    if handler != "current":
        return await serve_forward(_old_release if handler == "old" else _busy_then_refuses)
    server = grpc.aio.server()
    add_replica_service(server, runtime, _never)  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def _accept(address: str, timeout_s: float = 0.5) -> tuple[bool, float, list[_Link]]:
    failed: list[_Link] = []
    channel = grpc.aio.insecure_channel(address)
    await asyncio.wait_for(channel.channel_ready(), 5)
    link = _Link(address, 7, channel, _NullObserver(), 100, lambda held: None, failed.append)
    started = time.monotonic()
    accepted = await link.accept(timeout_s)
    took = time.monotonic() - started
    if not accepted:
        link.fail("the leader did not accept the Forward stream")
    await link.close()
    await channel.close()
    return accepted, took, failed


@pytest.mark.timeout(30)
async def test_a_leader_still_taking_over_refuses_at_once_and_the_link_is_not_used() -> None:
    runtime = _Runtime()
    server, address = await _server("current", runtime)
    try:
        accepted, took, failed = await _accept(address)
        assert not accepted
        assert took < 0.4  # a refusal, not the timeout
        assert len(failed) == 1
        assert not failed[0].accepted  # so the policy's short retry applies
        runtime.leading = True
        accepted, took, failed = await _accept(address)
        assert accepted
        assert took < 0.4  # its word, not the wait running out
        assert failed == []
    finally:
        await server.stop(None)


@pytest.mark.timeout(30)
async def test_an_earlier_release_leader_that_keeps_the_stream_open_is_accepted() -> None:
    server, address = await _server("old", _Runtime())
    try:
        accepted, took, _ = await _accept(address, timeout_s=0.3)
        assert accepted
        assert took >= 0.25  # it said nothing: accepted once the wait ran out
    finally:
        await server.stop(None)


@pytest.mark.timeout(30)
async def test_a_link_accepted_by_silence_then_refused_did_not_lead() -> None:
    """The silent acceptance (an earlier release's leader) used, then refused with no
    reply: the policy must ask again soon (``refused_retry_s``), not hold off 1 s."""
    server, address = await _server("busy", _Runtime())
    failed: list[_Link] = []
    channel = grpc.aio.insecure_channel(address)
    try:
        await asyncio.wait_for(channel.channel_ready(), 5)
        link = _Link(address, 7, channel, _NullObserver(), 100, lambda held: None, failed.append)
        assert await link.accept(0.2)  # silent past the wait: used
        for _ in range(100):
            if failed:
                break
            await asyncio.sleep(0.05)
        assert failed == [link]
        assert link.accepted
        assert not link.led
        await link.close()
    finally:
        await channel.close()
        await server.stop(None)


class _Leader:
    def __init__(self, value: str, term: int) -> None:
        self.value, self.term = value, term


class _Election:
    def __init__(self, address: str) -> None:
        self.address = address

    async def leader(self) -> _Leader:
        return _Leader(self.address, 4)


class _Settings:
    advertise_address = "127.0.0.1:1"  # this follower
    member_id = "coordinator-2"


class _FollowerRuntime:
    leading = False
    settings = _Settings()

    def __init__(self, address: str) -> None:
        self.election = _Election(address)

    def on_leader_observed(self, callback: Any) -> None:
        pass


class _AgentStream:
    """The agent's side of a Session the follower holds: what it was sent."""

    def __init__(self) -> None:
        self.written: list[agent_pb2.CoordinatorMessage] = []

    async def write(self, raw: bytes) -> None:
        self.written.append(agent_pb2.CoordinatorMessage.FromString(raw))

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise AssertionError(f"the Session was ended: {code} {details}")


def _open_session(forwarder: SessionForwarder, stop: asyncio.Event) -> asyncio.Task[bool]:
    """A new Session whose agent says Hello, then keeps its stream open until ``stop``."""

    async def requests() -> AsyncIterator[bytes]:
        yield agent_pb2.AgentMessage(hello=agent_pb2.Hello(node_id="n1")).SerializeToString()
        await stop.wait()

    return asyncio.create_task(forwarder.hold(requests(), _AgentStream()))  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def _follower_of_a_leader(
    observer: _NullObserver,
) -> AsyncIterator[tuple[_Runtime, SessionForwarder, asyncio.Event]]:
    """A leader not leading yet (set ``leading``), a follower that names it, and ``stop``."""
    leader_runtime = _Runtime()
    server, address = await _server("current", leader_runtime)
    forwarder = SessionForwarder(_FollowerRuntime(address), observer=observer)  # type: ignore[arg-type]
    stop = asyncio.Event()
    try:
        yield leader_runtime, forwarder, stop
    finally:
        stop.set()
        await forwarder.close()
        await server.stop(None)


async def _cancel(task: asyncio.Task[bool]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


@pytest.mark.timeout(30)
async def test_a_new_session_is_sent_away_while_the_leader_takes_over_then_forwarded() -> None:
    """After a leader change, the next leader named by the election but not
    leading yet: a new Session gets NotLeader (``hold`` returns False) rather
    than a place in the paced Reattach queue; once the leader accepts the
    link, the next one is forwarded directly."""
    async with _follower_of_a_leader(_NullObserver()) as (leader_runtime, forwarder, stop):
        forwarder._policy.failed("127.0.0.1:9", 3, time.monotonic(), accepted=True)  # the old one
        assert await _open_session(forwarder, stop) is False
        leader_runtime.leading = True
        await asyncio.sleep(0.25)  # the refusal's retry hold-off (0.2 s)
        holding = _open_session(forwarder, stop)
        await asyncio.sleep(0.5)
        assert not holding.done()  # forwarded: held for as long as the leader serves it
        # Linked once: from now on a new Session waits briefly for an attempt.
        assert forwarder._policy.session_wait_s(None) == 0.25
        await _cancel(holding)


@pytest.mark.timeout(30)
async def test_at_start_up_a_new_session_waits_for_the_leader_to_finish_taking_over() -> None:
    """Start-up (this replica never linked): the leader refuses the link until
    it leads; the new Session waits (attempts every 0.2 s) and is forwarded,
    instead of being sent away to dial the leader itself (CI at 02fd09a: 20
    agents on the leader where 10 belong)."""
    observer = _SentAway()
    async with _follower_of_a_leader(observer) as (leader_runtime, forwarder, stop):
        holding = _open_session(forwarder, stop)
        await asyncio.sleep(0.6)
        assert not holding.done()  # refused so far, still waiting
        leader_runtime.leading = True
        await asyncio.sleep(1.0)
        assert not holding.done()  # forwarded: held for as long as the leader serves it
        assert observer.reasons == []
        assert forwarder._link is not None
        assert not forwarder._link.closed
        await _cancel(holding)


@pytest.mark.timeout(30)
async def test_with_no_leader_named_a_new_session_is_sent_away_at_once() -> None:
    forwarder = SessionForwarder(_FollowerRuntime(""))  # type: ignore[arg-type]

    async def requests() -> AsyncIterator[bytes]:
        yield agent_pb2.AgentMessage(hello=agent_pb2.Hello(node_id="n1")).SerializeToString()

    try:
        assert await forwarder.hold(requests(), _AgentStream()) is False  # type: ignore[arg-type]
    finally:
        await forwarder.close()


def _choose_dial(forwarder: SessionForwarder, address: str) -> LinkChoice:
    return forwarder._policy.choose(
        address, 4, "127.0.0.1:1", leading=False, to_self=False, now_s=time.monotonic()
    )


@pytest.fixture
def silent_leader() -> Iterator[str]:
    """The address of a leader that does not answer: a socket that never speaks HTTP/2."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    try:
        yield f"127.0.0.1:{silent.getsockname()[1]}"
    finally:
        silent.close()


async def _one_hello() -> AsyncIterator[bytes]:
    yield agent_pb2.AgentMessage(hello=agent_pb2.Hello(node_id="n1")).SerializeToString()


def _hold(forwarder: SessionForwarder) -> Coroutine[Any, Any, bool]:
    """A new Session's ``hold``: one Hello, the agent's side recorded."""
    return forwarder.hold(_one_hello(), _AgentStream())  # type: ignore[arg-type]


class _SentAway(_NullObserver):
    """Counts the reasons new Sessions were sent away (the metric's labels)."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def sessions_sent_away(self, reason: str) -> None:
        self.reasons.append(reason)


class _ObservedRuntime(_FollowerRuntime):
    """The election names ``address``; the test plays the election watch."""

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.listeners: list[Any] = []

    def on_leader_observed(self, callback: Any) -> None:
        self.listeners.append(callback)


@pytest.mark.timeout(30)
async def test_new_sessions_do_not_queue_behind_a_dial_the_election_then_abandons(
    silent_leader: str,
) -> None:
    """A crashed leader's key outlives it: the follower dials a leader that does
    not answer (here a socket that never speaks HTTP/2), up to
    LINK_CONNECT_TIMEOUT_S. A new Session meanwhile is sent away at once (the
    agent is back in 0.2 s), not queued behind the dial; and the dial ends as
    soon as the election watch shows another leader (measured before:
    ``bench/fanin_failover_bench.py``, victims' Hellos held up to 3 s)."""
    address = silent_leader
    runtime = _ObservedRuntime(address)
    observer = _SentAway()
    forwarder = SessionForwarder(runtime, observer=observer)  # type: ignore[arg-type]
    # It led (term 4, as the election names it) and its link broke 2 s ago.
    forwarder._policy.failed(address, 4, time.monotonic() - 2.0, accepted=True)

    try:
        started = time.monotonic()
        dialling = asyncio.create_task(_hold(forwarder))
        await asyncio.sleep(0.05)
        assert not dialling.done()  # waiting on the silent leader
        assert await _hold(forwarder) is False
        assert not dialling.done()  # the second Session did not wait for the dial
        for listener in runtime.listeners:
            listener("127.0.0.1:2", 5)  # the next leader's key: the old one is gone
        assert await dialling is False
        assert time.monotonic() - started < LINK_CONNECT_TIMEOUT_S  # abandoned, not timed out
        # Abandoned, not failed: no new hold-off (the election names another leader).
        assert _choose_dial(forwarder, address) is LinkChoice.DIAL
        assert observer.reasons == ["leader_gone", "no_leader"]
    finally:
        await forwarder.close()


@pytest.mark.timeout(30)
async def test_new_sessions_wait_for_the_first_dial_of_a_leader(silent_leader: str) -> None:
    """A leader never linked before is usually alive (start-up): a new Session
    waits for that dial, and for the attempts after it while the leader named
    does not take the link, so its agent stays on the replica it dialled
    instead of spilling over to the leader; it is sent away once 2.5 s pass."""
    address = silent_leader
    runtime = _ObservedRuntime(address)
    observer = _SentAway()
    forwarder = SessionForwarder(runtime, observer=observer)  # type: ignore[arg-type]

    try:
        started = time.monotonic()
        first = asyncio.create_task(_hold(forwarder))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(_hold(forwarder))
        await asyncio.sleep(0.1)
        assert not first.done()
        assert not second.done()  # queued behind the first dial
        for listener in runtime.listeners:
            listener("127.0.0.1:2", 5)  # the next leader: nothing answers there either
        await asyncio.sleep(0.5)
        assert not first.done()  # the dial was abandoned; the next attempts are waited for
        assert not second.done()
        assert await first is False
        assert await second is False  # then sent away: no leader named took the link
        assert 2.0 <= time.monotonic() - started <= 4.0
        assert len(observer.reasons) == 2
        assert set(observer.reasons) <= {"no_leader", "link_busy"}
    finally:
        await forwarder.close()


class _SlowElection(_Election):
    async def leader(self) -> _Leader:
        await asyncio.sleep(1.0)  # etcd (or this replica's loop) loaded
        return _Leader("", 0)


@pytest.mark.timeout(30)
async def test_a_new_session_waits_a_bounded_time_for_a_slow_link_attempt() -> None:
    """After a leader change (this replica had a link), a new Session waits at
    most 0.25 s for an attempt in progress: the fleet redials at once."""
    runtime = _ObservedRuntime("")
    runtime.election = _SlowElection("")
    observer = _SentAway()
    forwarder = SessionForwarder(runtime, observer=observer)  # type: ignore[arg-type]
    forwarder._policy.linked()  # it forwarded to a leader before

    try:
        first = asyncio.create_task(_hold(forwarder))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        assert await _hold(forwarder) is False
        assert time.monotonic() - started < 0.9  # not the whole read
        assert observer.reasons == ["link_busy"]
        assert await first is False
        assert observer.reasons == ["link_busy", "no_leader"]
    finally:
        await forwarder.close()


@pytest.mark.timeout(30)
async def test_before_its_first_link_a_new_session_waits_out_a_slow_attempt() -> None:
    """At start-up the leader is alive and only this replica is slow: a new
    Session waits for the attempt (up to 2.5 s) instead of being sent away,
    which would send its agent on to the leader (CI at 02fd09a: 20 agents on
    the leader, 10 expected, in ``test_quick_leader_crash_keeps_the_followers_sessions``)."""
    runtime = _ObservedRuntime("")
    runtime.election = _SlowElection("")
    observer = _SentAway()
    forwarder = SessionForwarder(runtime, observer=observer)  # type: ignore[arg-type]

    try:
        first = asyncio.create_task(_hold(forwarder))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        assert await _hold(forwarder) is False  # the read found no leader
        assert time.monotonic() - started >= 0.9  # it waited for the read
        assert await first is False
        assert observer.reasons == ["no_leader", "no_leader"]  # never link_busy
    finally:
        await forwarder.close()


async def _ends_the_stream(requests: AsyncIterator[replica_pb2.ForwardBatch], context: Any) -> None:
    """A leader that stops leading: reads one batch, then ends the stream."""
    await anext(aiter(requests))
    await context.abort(grpc.StatusCode.UNAVAILABLE, "stopped leading")


def _request_pollers() -> list[asyncio.Task[Any]]:
    """grpc.aio's tasks that feed a call's request iterator to the wire, still running."""
    return [
        t
        for t in asyncio.all_tasks()
        if not t.done() and "_consume_request_iterator" in repr(t.get_coro())
    ]


@pytest.mark.timeout(30)
async def test_a_link_the_leader_ended_leaves_no_request_poller_pending() -> None:
    server, address = await serve_forward(_ends_the_stream)
    channel = grpc.aio.insecure_channel(address)
    try:
        failed: list[_Link] = []
        link = _Link(address, 7, channel, _NullObserver(), 100, lambda held: None, failed.append)
        link.send(replica_pb2.ForwardEntry(session_id="s1"))
        for _ in range(200):
            if failed:
                break
            await asyncio.sleep(0.01)
        assert failed == [link]  # the leader ended it; the reader failed the link
        for _ in range(100):
            if not _request_pollers():
                break
            await asyncio.sleep(0.01)
        assert _request_pollers() == []
        link.send(replica_pb2.ForwardEntry(session_id="s1"))  # after the end: dropped
        await link.close()
    finally:
        await channel.close()
        await server.stop(None)
