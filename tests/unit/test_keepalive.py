"""gRPC keepalive bounds how long a peer that went silent goes unnoticed (``lazarus.grpcopts``).

Before: no channel or server set keepalive, so a peer that stops answering
without a FIN or RST (a blackholed host, an asymmetric partition) left every
stream on it open until TCP gave up (~15 min): a follower kept handing new
Sessions to a forward link whose leader was gone, a ``lazarus watch`` hung on
a blackholed replica, and a leader's writer stuck on flow control towards a
vanished follower never ended. Each test puts a :class:`~blackhole.Blackhole`
relay between a real grpc client and server on 127.0.0.1, silences it, and
checks that the stream fails within twice the keepalive bound with the
options, and is still open after that long without them. Small keepalive
values (1 s, 1 s: bound 2 s) keep the tests short; production rates are
``lazarus.grpcopts``' defaults.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest
from blackhole import Blackhole

from coordinator import server
from coordinator.core import CoreSettings
from coordinator.forwarding import _Held, _Link, _NullObserver, add_replica_service
from coordinator.leaderchannels import LeaderChannels
from lazarus import client as client_module
from lazarus import grpcopts
from lazarus.client import Client
from lazarus.v1 import agent_pb2, coordinator_pb2, records_pb2, replica_pb2

FAST_CHANNEL = grpcopts.channel_options(keepalive_time_ms=1000, keepalive_timeout_ms=1000)
FAST_SERVER = grpcopts.server_options(
    keepalive_time_ms=1000, keepalive_timeout_ms=1000, min_ping_interval_ms=500
)
PERMISSIVE_SERVER = (("grpc.http2.min_ping_interval_without_data_ms", 500),)
"""A server that allows the fast channel's pings but sends none itself."""
BOUND_S = grpcopts.detection_bound_s(FAST_CHANNEL)


class _Runtime:
    leading = True
    feed_backlog = 0


def _retimed(options: grpcopts.Options, keepalive: bool) -> grpcopts.Options:
    """The product's own ``options``, keepalive sped up to ``FAST_CHANNEL`` (or taken out)."""
    fast = dict(FAST_CHANNEL)
    return tuple(
        (name, fast[name]) if name in fast else (name, value)
        for name, value in options
        if keepalive or name not in fast
    )


async def _until(predicate: Any, timeout_s: float) -> bool:
    """Whether ``predicate()`` turns true within ``timeout_s``."""
    try:
        async with asyncio.timeout(timeout_s):
            while not predicate():
                await asyncio.sleep(0.02)
    except TimeoutError:
        return False
    return True


# ------------------------------------------------------------------ options


def test_the_servers_permit_the_rate_the_channels_ping_at() -> None:
    channel = dict(grpcopts.channel_options())
    served = dict(grpcopts.server_options())
    # The key grpc reads (GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS);
    # a "min_recv_..." spelling is ignored and leaves the 5 min default.
    permitted_ms = served["grpc.http2.min_ping_interval_without_data_ms"]
    assert permitted_ms <= channel["grpc.keepalive_time_ms"]
    assert channel["grpc.http2.max_pings_without_data"] == 0  # idle streams keep pinging
    assert channel["grpc.http2.ping_timeout_ms"] == channel["grpc.keepalive_timeout_ms"]
    etcd = grpcopts.etcd_channel_options()
    assert etcd["grpc.keepalive_time_ms"] >= 2 * 5000  # etcd's --grpc-keepalive-min-time: 5 s
    assert etcd["grpc.keepalive_permit_without_calls"] == 0  # etcd strikes idle pings
    assert grpcopts.detection_bound_s(grpcopts.channel_options()) == 10.0


def test_every_etcd_client_kind_dials_with_keepalive() -> None:
    kinds = [
        server.ServerSettings(cluster="c", member_id="m", auth="none"),
        server.ServerSettings(
            cluster="c", member_id="m", auth="none", etcd_username="u", etcd_password="p"
        ),
        server.ServerSettings(
            cluster="c",
            member_id="m",
            auth="none",
            etcd_endpoints=("127.0.0.1:2379", "127.0.0.1:2380"),
        ),
    ]
    for settings in kinds:
        options = server.make_etcd_client(settings)._options
        assert grpcopts.etcd_channel_options().items() <= options.items(), settings


async def test_the_coordinator_server_is_built_with_the_server_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # async: grpc.aio.server() needs the running loop (a sync test only found one
    # when an earlier test of the session had left a loop set).
    seen: list[Any] = []
    real = grpc.aio.server

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("options"))
        return real(*args, **kwargs)

    monkeypatch.setattr(server.grpc.aio, "server", spy)
    coordinator = server.CoordinatorServer(
        server.ServerSettings(cluster="c", member_id="m", auth="none"), CoreSettings()
    )
    coordinator._bind()
    assert seen == [grpcopts.server_options()]


def test_leader_channels_dial_with_keepalive() -> None:
    dialled: list[tuple[str, Any]] = []

    def dial(address: str, options: Any) -> Any:
        dialled.append((address, options))
        return object()

    LeaderChannels(dial).get("10.0.0.1:7070")
    assert dialled == [("10.0.0.1:7070", grpcopts.channel_options())]
    assert grpcopts.channel_options()[0] in client_module.CHANNEL_OPTIONS


async def _idle(requests: AsyncIterator[bytes], context: Any) -> None:
    await asyncio.sleep(3600)


@pytest.mark.timeout(30)
async def test_an_idle_stream_pinging_at_the_permitted_rate_is_never_told_too_many_pings() -> None:
    """Pings at twice the server's minimum spacing (the production ratio) for
    6 s of silence: no GOAWAY too_many_pings, the stream stays open."""
    srv = grpc.aio.server(options=FAST_SERVER)
    handler = grpc.unary_stream_rpc_method_handler(_idle)
    srv.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.Idle", {"W": handler}),))
    port = srv.add_insecure_port("127.0.0.1:0")
    await srv.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=FAST_CHANNEL)
    call = channel.unary_stream("/t.Idle/W")(b"")
    try:
        await channel.channel_ready()
        await asyncio.sleep(6.0)
        assert not call.done()
    finally:
        call.cancel()
        await channel.close()
        await srv.stop(None)


# ------------------------------------------------------------ forward link


async def _silent_session(requests: AsyncIterator[bytes], context: Any) -> None:
    async for _ in requests:
        pass


@pytest.mark.timeout(30)
@pytest.mark.parametrize("keepalive", [True, False], ids=["keepalive", "none"])
async def test_a_forward_link_to_a_blackholed_leader_fails_within_the_bound(
    keepalive: bool,
) -> None:
    leader = grpc.aio.server(options=FAST_SERVER if keepalive else PERMISSIVE_SERVER)
    add_replica_service(leader, _Runtime(), _silent_session)  # type: ignore[arg-type]
    port = leader.add_insecure_port("127.0.0.1:0")
    await leader.start()
    hole = await Blackhole(port).start()
    channels = LeaderChannels(grpc.aio.insecure_channel)  # as the follower's forwarder makes them
    channels.options = _retimed(channels.options, keepalive)
    detached: list[_Held] = []
    failed: list[_Link] = []
    channel = channels.get(hole.address)
    link = _Link(hole.address, 3, channel, _NullObserver(), 100, detached.append, failed.append)
    try:
        assert await link.accept(5.0)
        held = _Held()
        link.open(held)
        await asyncio.sleep(1.5)  # an idle link: the pings must go on without data
        assert not link.closed
        hole.swallow()
        started = time.monotonic()
        noticed = await _until(lambda: link.closed, 2 * BOUND_S)
        waited_s = time.monotonic() - started
        assert noticed is keepalive, f"closed={link.closed} after {waited_s:.1f} s"
        if keepalive:
            assert failed == [link]
            assert detached == [held]  # to be carried to the next leader
    finally:
        await link.close()
        await channels.close()
        await hole.close()
        await leader.stop(None)


# ----------------------------------------------- leader writer on flow control


@pytest.mark.timeout(30)
@pytest.mark.parametrize("keepalive", [True, False], ids=["keepalive", "none"])
async def test_a_leader_writing_to_a_vanished_follower_is_unstuck_by_its_pings(
    keepalive: bool,
) -> None:
    """The leader's Forward writer blocks on HTTP/2 flow control once the
    follower stops reading; only the server's own keepalive can end the call
    (the follower's cancel never arrives through the blackhole)."""
    ended = asyncio.Event()

    async def chatty(requests: AsyncIterator[bytes], context: Any) -> None:
        try:
            async for _ in requests:
                break
            for _ in range(20_000):  # 20 MB of replies: far past the flow-control windows
                await context.write(b"r" * 1024)
                await asyncio.sleep(0)
            await asyncio.sleep(3600)
        finally:
            ended.set()

    leader = grpc.aio.server(options=FAST_SERVER if keepalive else PERMISSIVE_SERVER)
    add_replica_service(leader, _Runtime(), chatty)  # type: ignore[arg-type]
    port = leader.add_insecure_port("127.0.0.1:0")
    await leader.start()
    hole = await Blackhole(port).start()
    channel = grpc.aio.insecure_channel(hole.address, options=PERMISSIVE_SERVER)
    link = _Link(hole.address, 3, channel, _NullObserver(), 1_000_000, lambda held: None)
    try:
        assert await link.accept(5.0)
        held = _Held()
        sid = link.open(held)
        hello = agent_pb2.AgentMessage().SerializeToString()
        link.send(replica_pb2.ForwardEntry(session_id=sid, message=hello))
        assert await _until(lambda: held.inbox.qsize() >= 100, 5.0)  # the replies flow
        hole.swallow()  # the follower vanishes while the leader writes
        started = time.monotonic()
        noticed = await _until(ended.is_set, 2 * grpcopts.detection_bound_s(FAST_SERVER))
        waited_s = time.monotonic() - started
        assert noticed is keepalive, f"ended={ended.is_set()} after {waited_s:.1f} s"
        assert held.inbox.qsize() < 20_000  # it was stuck, not done
    finally:
        await link.close()
        await channel.close()
        await hole.close()
        await leader.stop(None)


# ------------------------------------------------------------- client watch


class _Replica:
    """A CoordinatorService with WatchEvents only: an event every 0.1 s from the asked revision."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.calls = 0
        self.fail_after = fail_after
        self.server = grpc.aio.server(options=PERMISSIVE_SERVER)
        handler = grpc.unary_stream_rpc_method_handler(
            self._watch,
            request_deserializer=coordinator_pb2.WatchEventsRequest.FromString,
            response_serializer=coordinator_pb2.WatchEventsResponse.SerializeToString,
        )
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(client_module.SERVICE, {"WatchEvents": handler}),)
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    async def _watch(
        self, request: coordinator_pb2.WatchEventsRequest, context: Any
    ) -> AsyncIterator[coordinator_pb2.WatchEventsResponse]:
        self.calls += 1
        revision = max(1, request.from_revision)
        sent = 0
        while True:
            yield coordinator_pb2.WatchEventsResponse(
                events=[records_pb2.Event(revision=revision)], revision=revision
            )
            revision += 1
            sent += 1
            if self.fail_after is not None and sent >= self.fail_after:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "dropped")
            await asyncio.sleep(0.1)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("keepalive", [True, False], ids=["keepalive", "none"])
async def test_a_watch_on_a_blackholed_replica_moves_to_the_next_within_the_bound(
    keepalive: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        client_module, "CHANNEL_OPTIONS", _retimed(client_module.CHANNEL_OPTIONS, keepalive)
    )
    first, second = _Replica(), _Replica()
    await first.server.start()
    await second.server.start()
    hole = await Blackhole(first.port).start()
    client = Client([hole.address, f"127.0.0.1:{second.port}"], retry_max_s=30.0)
    stream = client.watch(1)
    try:
        async with asyncio.timeout(5.0):
            for _ in range(3):
                event = await anext(stream)
        assert (first.calls, second.calls) == (1, 0)
        hole.swallow()
        started = time.monotonic()
        seen: list[int] = []

        async def read_on() -> None:
            async for event in stream:
                seen.append(event.revision)

        reader = asyncio.create_task(read_on())
        noticed = await _until(lambda: second.calls == 1 and seen, 2 * BOUND_S)
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        assert noticed is keepalive, f"after {time.monotonic() - started:.1f} s: {seen}"
        if keepalive:
            assert seen == list(range(event.revision + 1, event.revision + 1 + len(seen)))
            assert stream.reconnects == 1
    finally:
        await stream.aclose()
        await client.close()
        await hole.close()
        await first.server.stop(None)
        await second.server.stop(None)


@pytest.mark.timeout(30)
async def test_a_replica_that_drops_every_watch_at_once_is_retried_with_backoff() -> None:
    """Before: an answered stream reset the failure count, so a replica that
    answered once and dropped the stream was redialled with no delay at all."""
    replica = _Replica(fail_after=1)
    await replica.server.start()
    client = Client(
        [f"127.0.0.1:{replica.port}"], backoff_initial_s=0.05, backoff_max_s=0.5, retry_max_s=5.0
    )
    stream = client.watch(1)

    async def read() -> None:
        async for _ in stream:
            pass

    reader = asyncio.create_task(read())
    try:
        await asyncio.sleep(2.0)
        # With the backoff: about 0.05, 0.1, 0.2, then up to 0.5 s apart (jittered).
        assert 2 <= replica.calls <= 30, replica.calls
        assert not reader.done()  # the replica answers: no Unavailable raised
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        await stream.aclose()
        await client.close()
        await replica.server.stop(None)
