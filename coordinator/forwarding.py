"""Fan-in, first part: followers hold agents' Sessions and carry them to the leader.

Theory of operation (issue 20, ``docs/fan-in.md``; wire contract
``proto/lazarus/v1/replica.proto``). With ``--fan-in`` a follower that receives
a node agent's Session does not answer NotLeader: :class:`SessionForwarder`
keeps the agent's stream and carries it over the one ``ReplicaService.Forward``
stream it holds to the leader (:class:`_Link`), in batches: whatever entries
are queued when the stream can take a write go out as one ``ForwardBatch``, so
batching costs no added delay at low load and amortises the per-message cost
of a gRPC stream at high load. The leader (:class:`ForwardService`) runs every
forwarded Session through the same servicer as a Session opened on itself
(``AgentSessionService.Session``, with a :class:`_ForwardedContext` in place
of the gRPC one): same validation, same statuses, same core events, each
message stepped at its arrival on the leader's clock. What the leader writes
to it comes back verbatim, and so does the status it ends it with.

Why this is safe with no new rule: a follower writes to an agent only what
the leader wrote, so a HeartbeatAck still means that the leader heard the
heartbeat (``docs/fan-in.md`` rule (a), CONFIRMED), and a Welcome still means
the leader admitted the Hello. A follower never acks on its own here; the
interregnum rule (b) of ``coordinator.core.fanin`` is not used yet.

Failures. When the link ends (the leader crashed, resigned or stopped
leading, or the network broke) every Session it carried is ended with
UNAVAILABLE and the agents reconnect, as they do today when their leader
goes; a link is also dropped as soon as this replica's election watch shows
another leader (``CoordinatorRuntime.on_leader_observed``), so a paused old
leader does not keep Sessions hanging. When no leader is known, or this
replica is about to lead, the follower answers NotLeader as without fan-in.
An agent that does not read its replies, or a follower that does not read
the leader's, is ended with RESOURCE_EXHAUSTED when its queue passes
``max_outbound`` (never buffered without bound).

Identity: the follower's own auth interceptor checks the agent's identity and
that its Hello names only its own node (``coordinator.auth``), before anything
is forwarded; the Forward stream itself needs a member identity
(``coordinator.authz``). The leader therefore trusts a forwarded Hello's node
id because a member vouches for it, as it trusts a member's proxied writes.

Metrics (``coordinator.metrics``): ``lazarus_forwarded_sessions{side}``,
``lazarus_forward_batches_total{direction}``,
``lazarus_forward_entries_total{direction}`` and
``lazarus_forward_ack_seconds`` (follower: a heartbeat's arrival from the agent
to the leader's ack of it leaving for the agent).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, NoReturn, Protocol

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from coordinator.runtime import CoordinatorRuntime
from lazarus.tls import ClientTls
from lazarus.v1 import agent_pb2, replica_pb2

__all__ = [
    "FORWARD_METHOD",
    "MAX_BATCH_ENTRIES",
    "REPLICA_SERVICE_NAME",
    "ForwardObserver",
    "ForwardService",
    "SessionForwarder",
    "add_replica_service",
]

_log = logging.getLogger("lazarus.coordinator.forwarding")

REPLICA_SERVICE_NAME = "lazarus.v1.ReplicaService"
FORWARD_METHOD = f"/{REPLICA_SERVICE_NAME}/Forward"

MAX_BATCH_ENTRIES = 512
"""Entries in one ForwardBatch at most (a bigger backlog goes out as several)."""

MAX_QUEUED_ENTRIES = 50_000
"""Entries one side of a Forward stream may have queued and not yet written."""

LEADERSHIP_CHECK_S = 0.2
"""How often a leader's Forward stream checks that its replica still leads."""

LINK_CONNECT_TIMEOUT_S = 2.0
"""How long a follower waits for its channel to the leader to be ready."""

_OK = grpc.StatusCode.OK.value[0]


class ForwardObserver(Protocol):
    """What the forwarding shell reports, for metrics (``coordinator.metrics.Metrics``)."""

    def forwarded_sessions(self, side: str, delta: int) -> None:
        """Sessions held (side "follower") or served (side "leader") changed by ``delta``."""

    def forward_batch(self, direction: str, entries: int) -> None:
        """A ForwardBatch of ``entries`` was ``"sent"`` or ``"received"``."""

    def forward_ack(self, seconds: float) -> None:
        """A heartbeat's ack left for its agent ``seconds`` after the heartbeat arrived."""


class _NullObserver:
    def forwarded_sessions(self, side: str, delta: int) -> None:
        pass

    def forward_batch(self, direction: str, entries: int) -> None:
        pass

    def forward_ack(self, seconds: float) -> None:
        pass


def _end(session_id: str, code: grpc.StatusCode, reason: str) -> replica_pb2.ForwardEntry:
    return replica_pb2.ForwardEntry(
        session_id=session_id, end=replica_pb2.SessionEnd(code=code.value[0], reason=reason)
    )


def _status(code: int) -> grpc.StatusCode:
    for status in grpc.StatusCode:
        if status.value[0] == code:
            return status
    return grpc.StatusCode.UNKNOWN


async def _batches(
    queue: asyncio.Queue[replica_pb2.ForwardEntry],
) -> AsyncGenerator[replica_pb2.ForwardBatch, None]:
    """Everything queued when the stream can take a write, as one batch (bounded)."""
    while True:
        entries = [await queue.get()]
        while not queue.empty() and len(entries) < MAX_BATCH_ENTRIES:
            entries.append(queue.get_nowait())
        yield replica_pb2.ForwardBatch(entries=entries)


# ---------------------------------------------------------------------- leader


class _Ended(Exception):
    """A forwarded Session was ended (what ``context.abort`` raises in grpc)."""


class _ForwardedContext:
    """What the Session servicer uses of a ``grpc.aio.ServicerContext``, for a forwarded Session.

    ``write`` queues the reply for the follower; ``abort`` queues the end
    status and raises, as grpc's does.
    """

    def __init__(
        self, session_id: str, out: asyncio.Queue[replica_pb2.ForwardEntry], peer: str
    ) -> None:
        self._sid = session_id
        self._out = out
        self._peer = peer
        self.ended = False

    def peer(self) -> str:
        return self._peer

    async def write(self, message: agent_pb2.CoordinatorMessage | bytes) -> None:
        raw = message if isinstance(message, bytes) else message.SerializeToString()
        self._out.put_nowait(replica_pb2.ForwardEntry(session_id=self._sid, message=raw))

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        self.finish(code, details)
        raise _Ended(details)

    def finish(self, code: grpc.StatusCode, reason: str) -> None:
        if not self.ended:
            self.ended = True
            self._out.put_nowait(_end(self._sid, code, reason))


class _StreamBroke(Exception):
    """The follower reported the agent's stream broken (not half-closed)."""


Inbox = asyncio.Queue[bytes | replica_pb2.SessionEnd]
"""One forwarded Session's incoming side: agent messages, then how it ended."""

Held = dict[str, tuple[Inbox, "asyncio.Task[None]"]]
"""A leader's forwarded Sessions of one stream: inbox and the task serving it."""


async def _inbox_messages(inbox: Inbox) -> AsyncIterator[bytes]:
    while True:
        item = await inbox.get()
        if isinstance(item, bytes):
            yield item
            continue
        if item.code != _OK:
            raise _StreamBroke(item.reason)
        return


SessionHandler = Callable[[AsyncIterator[bytes], Any], Any]


class ForwardService:
    """Serves ``ReplicaService.Forward`` on every replica; only a leader accepts a stream.

    Args:
        runtime: the replica's runtime (``leading`` says whether to accept).
        session: the Session servicer (``AgentSessionService.Session``).
        observer: metrics.
    """

    def __init__(
        self,
        runtime: CoordinatorRuntime,
        session: SessionHandler,
        observer: ForwardObserver | None = None,
    ) -> None:
        self._runtime = runtime
        self._session = session
        self._observer: ForwardObserver = observer if observer is not None else _NullObserver()

    async def Forward(
        self,
        requests: AsyncIterator[replica_pb2.ForwardBatch],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> None:
        """One follower's stream; see replica.proto for the statuses."""
        runtime = self._runtime
        if not runtime.leading:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "not the leader; forward to the current leader"
            )
        peer = context.peer()
        out: asyncio.Queue[replica_pb2.ForwardEntry] = asyncio.Queue()
        sessions: Held = {}
        reader = asyncio.create_task(self._read(requests, sessions, out, peer))
        # One pending get, kept across rounds: cancelling it could drop an entry.
        get: asyncio.Future[replica_pb2.ForwardEntry] = asyncio.ensure_future(out.get())
        problem: tuple[grpc.StatusCode, str] | None = None
        try:
            while problem is None:
                waiting: set[asyncio.Future[Any]] = {get, reader}
                done, _ = await asyncio.wait(
                    waiting, timeout=LEADERSHIP_CHECK_S, return_when=asyncio.FIRST_COMPLETED
                )
                if get in done:
                    entries = [get.result()]
                    while not out.empty() and len(entries) < MAX_BATCH_ENTRIES:
                        entries.append(out.get_nowait())
                    get = asyncio.ensure_future(out.get())
                    await context.write(replica_pb2.ForwardBatch(entries=entries))
                    self._observer.forward_batch("sent", len(entries))
                    continue
                if reader.done():
                    exc = reader.exception() if not reader.cancelled() else None
                    if isinstance(exc, _InvalidEntry):
                        problem = (grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                    elif out.empty() and not sessions:
                        return  # the follower ended the stream and every Session is over
                    else:
                        await asyncio.sleep(0.01)  # the Sessions are ending: let them write
                elif not runtime.leading:
                    problem = (grpc.StatusCode.UNAVAILABLE, "this replica stopped leading")
                elif out.qsize() > MAX_QUEUED_ENTRIES:
                    problem = (
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"{out.qsize()} replies unread: the follower does not read its stream",
                    )
        finally:
            get.cancel()
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            for _, task in list(sessions.values()):
                task.cancel()
            for _, task in list(sessions.values()):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if problem is not None:
            await context.abort(*problem)

    async def _read(
        self,
        requests: AsyncIterator[replica_pb2.ForwardBatch],
        sessions: Held,
        out: asyncio.Queue[replica_pb2.ForwardEntry],
        peer: str,
    ) -> None:
        try:
            async for batch in requests:
                self._observer.forward_batch("received", len(batch.entries))
                for entry in batch.entries:
                    which = entry.WhichOneof("body")
                    if not entry.session_id or which is None:
                        raise _InvalidEntry("ForwardEntry: session_id and a body are required")
                    held = sessions.get(entry.session_id)
                    if held is None:
                        if which == "end":
                            continue  # a Session that ended before the leader saw it
                        held = self._open(entry.session_id, sessions, out, peer)
                    held[0].put_nowait(entry.message if which == "message" else entry.end)
        finally:
            # The follower's side is over: every Session it carried ends.
            for inbox, _ in list(sessions.values()):
                inbox.put_nowait(
                    replica_pb2.SessionEnd(
                        code=grpc.StatusCode.UNAVAILABLE.value[0], reason="link ended"
                    )
                )

    def _open(
        self,
        sid: str,
        sessions: Held,
        out: asyncio.Queue[replica_pb2.ForwardEntry],
        peer: str,
    ) -> tuple[Inbox, asyncio.Task[None]]:
        inbox: Inbox = asyncio.Queue()
        context = _ForwardedContext(sid, out, f"{peer} (forwarded)")

        async def run() -> None:
            self._observer.forwarded_sessions("leader", 1)
            try:
                await self._session(_inbox_messages(inbox), context)
                context.finish(grpc.StatusCode.OK, "")
            except _Ended:
                pass
            except asyncio.CancelledError:
                context.finish(grpc.StatusCode.UNAVAILABLE, "the forwarding stream ended")
                raise
            except Exception:
                _log.exception("forwarded session %s failed", sid)
                context.finish(grpc.StatusCode.INTERNAL, "internal error; reconnect")
            finally:
                sessions.pop(sid, None)
                self._observer.forwarded_sessions("leader", -1)

        held = (inbox, asyncio.create_task(run(), name=f"forwarded-{sid}"))
        sessions[sid] = held
        return held


class _InvalidEntry(Exception):
    """A ForwardEntry the leader cannot route (INVALID_ARGUMENT)."""


# ---------------------------------------------------------------------- follower


class _Link:
    """A follower's one Forward stream to the leader at ``address`` (term ``term``)."""

    def __init__(
        self,
        address: str,
        term: int,
        channel: grpc.aio.Channel,
        observer: ForwardObserver,
        max_outbound: int,
    ) -> None:
        self.address = address
        self.term = term
        self.closed = False
        self._observer = observer
        self._max_outbound = max_outbound
        self._send: asyncio.Queue[replica_pb2.ForwardEntry] = asyncio.Queue()
        self.sessions: dict[str, Inbox] = {}
        self._ids = itertools.count(1)
        call = channel.stream_stream(
            FORWARD_METHOD,
            request_serializer=replica_pb2.ForwardBatch.SerializeToString,
            response_deserializer=replica_pb2.ForwardBatch.FromString,
        )
        self._call = call(self._requests())
        self._reader = asyncio.create_task(self._read(), name=f"forward-link-{address}")

    async def _requests(self) -> AsyncIterator[replica_pb2.ForwardBatch]:
        async for batch in _batches(self._send):
            self._observer.forward_batch("sent", len(batch.entries))
            yield batch

    async def _read(self) -> None:
        reason = "the leader ended the stream"
        try:
            async for batch in self._call:
                self._observer.forward_batch("received", len(batch.entries))
                for entry in batch.entries:
                    inbox = self.sessions.get(entry.session_id)
                    if inbox is None:
                        continue  # the agent already went
                    if entry.WhichOneof("body") == "message":
                        if inbox.qsize() >= self._max_outbound:
                            self.sessions.pop(entry.session_id, None)
                            inbox.put_nowait(
                                replica_pb2.SessionEnd(
                                    code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
                                    reason=f"{self._max_outbound} messages unread: "
                                    "the agent does not read its stream",
                                )
                            )
                            self.send(_end(entry.session_id, grpc.StatusCode.CANCELLED, "unread"))
                            continue
                        inbox.put_nowait(entry.message)
                    else:
                        self.sessions.pop(entry.session_id, None)
                        inbox.put_nowait(entry.end)
        except grpc.aio.AioRpcError as exc:
            reason = f"{exc.code().name}: {exc.details()}"
        except asyncio.CancelledError:
            reason = "the link was dropped"
            raise
        finally:
            self.fail(reason)

    def open(self) -> tuple[str, Inbox]:
        sid = f"s{next(self._ids)}"
        inbox: Inbox = asyncio.Queue()
        self.sessions[sid] = inbox
        return sid, inbox

    def send(self, entry: replica_pb2.ForwardEntry) -> None:
        if not self.closed:
            self._send.put_nowait(entry)

    def forget(self, sid: str) -> None:
        if self.sessions.pop(sid, None) is not None:
            self.send(_end(sid, grpc.StatusCode.CANCELLED, "the agent's stream ended"))

    def fail(self, reason: str) -> None:
        """End the link and every Session on it (UNAVAILABLE; the agents reconnect)."""
        if self.closed:
            return
        self.closed = True
        _log.info("forward link to %s (term %d) ended: %s", self.address, self.term, reason)
        sessions, self.sessions = self.sessions, {}
        for inbox in sessions.values():
            inbox.put_nowait(
                replica_pb2.SessionEnd(
                    code=grpc.StatusCode.UNAVAILABLE.value[0],
                    reason=f"this replica lost its link to the leader at {self.address} "
                    f"({reason}); reconnect",
                )
            )
        self._call.cancel()

    async def close(self) -> None:
        self.fail("closed")
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader


class SessionForwarder:
    """A follower's side of fan-in: holds agents' Sessions, forwards them to the leader.

    Args:
        runtime: the replica's runtime (its election names the leader).
        member_tls: how to dial the leader (the member certificate; plaintext if off).
        observer: metrics.
        max_outbound: replies for one agent queued and unread, at most.
    """

    def __init__(
        self,
        runtime: CoordinatorRuntime,
        member_tls: ClientTls | None = None,
        observer: ForwardObserver | None = None,
        max_outbound: int = 10_000,
    ) -> None:
        self._runtime = runtime
        self._tls = member_tls or ClientTls()
        self._observer: ForwardObserver = observer if observer is not None else _NullObserver()
        self._max_outbound = max_outbound
        self._link: _Link | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._connecting = asyncio.Lock()
        runtime.on_leader_observed(self._leader_observed)

    @property
    def held(self) -> int:
        """Sessions this replica holds and forwards now."""
        link = self._link
        return len(link.sessions) if link is not None and not link.closed else 0

    def _leader_observed(self, address: str, term: int) -> None:
        link = self._link
        if link is not None and not link.closed and (link.term != term or link.address != address):
            link.fail(f"the election shows a new leader, term {term} at {address or '?'}")

    async def _current_link(self) -> _Link | None:
        async with self._connecting:
            link = self._link
            if link is not None and not link.closed:
                return link
            try:
                leader = await self._runtime.election.leader()
            except Exception as exc:  # etcd unreachable: no leader we can name
                _log.warning("reading the leader to forward to failed: %s", exc)
                return None
            own = self._runtime.settings.advertise_address
            if leader is None or not leader.value or leader.value == own:
                return None
            channel = self._channels.get(leader.value)
            if channel is None:
                channel = self._tls.aio_channel(leader.value)
                self._channels[leader.value] = channel
            try:
                await asyncio.wait_for(channel.channel_ready(), LINK_CONNECT_TIMEOUT_S)
            except TimeoutError:
                _log.warning("the leader at %s does not answer; not forwarding", leader.value)
                return None
            link = _Link(leader.value, leader.term, channel, self._observer, self._max_outbound)
            self._link = link
            _log.info("forwarding Sessions to the leader at %s (term %d)", link.address, link.term)
            return link

    async def hold(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> bool:
        """Hold one agent's Session for as long as the leader serves it.

        Returns:
            False at once when there is no leader to forward to (the caller
            answers NotLeader, as a replica without fan-in does); True once
            the Session is over (ended as the leader ended it, or with
            UNAVAILABLE when the link to the leader ended).
        """
        link = await self._current_link()
        if link is None:
            return False
        sid, inbox = link.open()
        observer = self._observer
        observer.forwarded_sessions("follower", 1)
        heard: dict[int, float] = {}
        reader = asyncio.create_task(self._pump(requests, link, sid, heard))
        try:
            while True:
                item = await inbox.get()
                if isinstance(item, bytes):
                    if heard:
                        self._time_ack(item, heard)
                    await context.write(item)
                    continue
                if item.code == _OK:
                    return True
                await context.abort(_status(item.code), item.reason)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            link.forget(sid)
            observer.forwarded_sessions("follower", -1)

    async def _pump(
        self, requests: AsyncIterator[bytes], link: _Link, sid: str, heard: dict[int, float]
    ) -> None:
        """The agent's messages, verbatim, onto the link; then the stream's end."""
        code, reason = grpc.StatusCode.OK, ""
        try:
            async for raw in requests:
                self._note_heartbeat(raw, heard)
                link.send(replica_pb2.ForwardEntry(session_id=sid, message=raw))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the agent's stream broke
            code, reason = grpc.StatusCode.CANCELLED, f"the agent's stream broke: {exc}"
        if sid in link.sessions:
            link.send(_end(sid, code, reason))

    @staticmethod
    def _note_heartbeat(raw: bytes, heard: dict[int, float]) -> None:
        try:
            message = agent_pb2.AgentMessage.FromString(raw)
        except DecodeError:
            return  # the leader refuses it with its own words
        if message.WhichOneof("body") == "heartbeat":
            heard[message.heartbeat.seq] = time.monotonic()
            while len(heard) > 64:
                heard.pop(next(iter(heard)))

    def _time_ack(self, raw: bytes, heard: dict[int, float]) -> None:
        try:
            message = agent_pb2.CoordinatorMessage.FromString(raw)
        except DecodeError:
            return
        if message.WhichOneof("body") == "heartbeat_ack":
            arrived = heard.pop(message.heartbeat_ack.seq, None)
            if arrived is not None:
                self._observer.forward_ack(time.monotonic() - arrived)

    async def close(self) -> None:
        """End the link (its Sessions end with UNAVAILABLE) and the channels."""
        if self._link is not None:
            await self._link.close()
        for channel in self._channels.values():
            with contextlib.suppress(Exception):
                await channel.close()
        self._channels.clear()


def add_replica_service(
    server: grpc.aio.Server,
    runtime: CoordinatorRuntime,
    session: SessionHandler,
    observer: ForwardObserver | None = None,
) -> ForwardService:
    """Register ReplicaService on ``server`` (every replica; only a leader accepts).

    Args:
        server: the gRPC server (its auth interceptor admits members only).
        runtime: the replica's runtime.
        session: the Session servicer forwarded Sessions run through.
        observer: metrics.

    Returns:
        The servicer.
    """
    servicer = ForwardService(runtime, session, observer)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.Forward,
        request_deserializer=replica_pb2.ForwardBatch.FromString,
        response_serializer=replica_pb2.ForwardBatch.SerializeToString,
    )
    generic = grpc.method_handlers_generic_handler(REPLICA_SERVICE_NAME, {"Forward": handler})
    server.add_generic_rpc_handlers((generic,))
    return servicer
