"""Channels to the leader: a leader change closes older leaders' channels, after a grace.

Real gRPC on loopback. The three "leaders" are one server reached under three
target strings (what the cache keys on); the API's proxy and the follower's
Forward links keep at most two channels however often the leader moves.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import grpc
import grpc.aio
import pytest

from coordinator.api import CoordinatorApi
from coordinator.forwarding import SessionForwarder, add_replica_service
from coordinator.leaderchannels import LeaderChannels

_METHOD = "/test.Slow/Sleep"


async def _sleep(request: bytes, context: Any) -> bytes:
    await asyncio.sleep(float(request.decode()))
    return b"done"


async def _slow_server() -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(_sleep)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("test.Slow", {"Sleep": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


def _targets(port: int) -> tuple[str, str, str]:
    return f"127.0.0.1:{port}", f"ipv4:127.0.0.1:{port}", f"dns:///127.0.0.1:{port}"


def _call(channel: grpc.aio.Channel, seconds: float) -> Any:
    return channel.unary_unary(_METHOD)(str(seconds).encode(), timeout=10)


@pytest.mark.timeout(30)
async def test_older_leaders_channels_close_after_their_calls_in_flight_finish() -> None:
    server, port = await _slow_server()
    a, b, c = _targets(port)
    channels = LeaderChannels(grpc.aio.insecure_channel, grace_s=1.0)
    try:
        first = channels.get(a)
        short = asyncio.ensure_future(_call(first, 0.3))
        long = asyncio.ensure_future(_call(first, 5.0))
        await asyncio.sleep(0.1)  # both in flight on the first leader's channel
        second = channels.get(b)
        assert channels.get(a) is first  # a stale read naming the previous leader: kept
        assert len(channels) == 2
        third = channels.get(c)  # a third leader: the least recently used (b) goes
        assert b not in channels
        assert channels.retired(second)
        fourth = channels.get(b)  # b again (a new channel), and a is now the oldest: goes
        assert fourth is not second
        assert a not in channels
        assert channels.retired(first)
        started = time.monotonic()
        assert await short == b"done"  # finished within the grace
        with pytest.raises(asyncio.CancelledError):  # how grpc.aio reports a local cancel
            await long
        assert time.monotonic() - started < 3.0  # cut at the grace, not after 5 s
        assert await _call(third, 0.0) == b"done"  # the current leader's channel works
        assert not channels.retired(third)
    finally:
        await channels.close()
        await server.stop(None)


@pytest.mark.timeout(30)
async def test_the_api_proxy_keeps_two_leader_channels() -> None:
    runtime = SimpleNamespace(fork_seeder=None)
    api = CoordinatorApi(runtime, None)  # type: ignore[arg-type]
    try:
        for port in range(20001, 20011):  # ten leader changes, ten pod IPs
            api._channel(f"127.0.0.1:{port}")
        assert len(api._channels) == 2
        assert "127.0.0.1:20010" in api._channels
        assert "127.0.0.1:20009" in api._channels
    finally:
        await api.close()


class _Leader:
    def __init__(self, value: str, term: int) -> None:
        self.value, self.term = value, term


class _Election:
    def __init__(self) -> None:
        self.leader_value = _Leader("", 0)

    async def leader(self) -> _Leader:
        return self.leader_value


class _FollowerRuntime:
    leading = False
    settings = SimpleNamespace(advertise_address="127.0.0.1:1", member_id="coordinator-2")

    def __init__(self) -> None:
        self.election = _Election()

    def on_leader_observed(self, callback: Any) -> None:
        pass


async def _never(requests: Any, context: Any) -> None:
    async for _ in requests:
        pass


@pytest.mark.timeout(30)
async def test_a_follower_keeps_two_channels_to_leaders_across_leader_changes() -> None:
    leader_runtime = SimpleNamespace(leading=True, feed_backlog=0)
    server = grpc.aio.server()
    add_replica_service(server, leader_runtime, _never)  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    runtime = _FollowerRuntime()
    forwarder = SessionForwarder(runtime)  # type: ignore[arg-type]
    try:
        links = []
        for term, address in enumerate(_targets(port), start=3):
            runtime.election.leader_value = _Leader(address, term)
            link = await forwarder._current_link()
            assert link is not None
            assert link.address == address
            links.append(link)
            link.fail("the election shows a new leader")  # what _leader_observed does
        assert len(forwarder._channels) == 2
        assert _targets(port)[0] not in forwarder._channels
    finally:
        await forwarder.close()
        await server.stop(None)


class _Aborted(Exception):
    pass


class _Context:
    """The server side of an orchestrator's call the API proxies (what ``_proxy`` uses)."""

    def __init__(self) -> None:
        self.status: tuple[grpc.StatusCode, str] | None = None

    def time_remaining(self) -> float | None:
        return None

    def set_trailing_metadata(self, metadata: Any) -> None:
        pass

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self.status = (code, details)
        raise _Aborted(details)


@pytest.mark.timeout(30)
async def test_a_proxied_write_cut_by_leader_changes_answers_unavailable() -> None:
    from coordinator.api import SERVICE_NAME
    from lazarus.v1 import coordinator_pb2

    async def slow(request: bytes, context: Any) -> bytes:
        await asyncio.sleep(5.0)  # the old leader, busy past the grace
        return b""

    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(slow)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE_NAME, {"Slow": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    a, b, c = _targets(port)
    election = _Election()
    election.leader_value = _Leader(a, 3)
    runtime = SimpleNamespace(
        fork_seeder=None, election=election, settings=SimpleNamespace(advertise_address="x:1")
    )
    api = CoordinatorApi(runtime, None)  # type: ignore[arg-type]
    api._channels = LeaderChannels(grpc.aio.insecure_channel, grace_s=0.5)
    context = _Context()
    try:
        request = coordinator_pb2.GetClusterStatusRequest()
        response_type = coordinator_pb2.GetClusterStatusResponse
        proxied = asyncio.ensure_future(
            api._proxy("Slow", request, response_type, context)  # type: ignore[arg-type]
        )
        await asyncio.sleep(0.2)
        election.leader_value = _Leader(c, 5)
        api._channel(b)
        api._channel(c)  # two leader changes later: a's channel closes after its grace
        with pytest.raises(_Aborted):
            await proxied
        assert context.status is not None
        assert context.status[0] is grpc.StatusCode.UNAVAILABLE  # the client asks again
        assert c in context.status[1]
    finally:
        await api.close()
        await server.stop(None)
