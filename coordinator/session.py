"""The AgentService servicer: node agent Session streams on grpc.aio.

Theory of operation: each ``Session`` stream becomes a
:class:`~coordinator.runtime.Channel`. A reader task parses what the agent
sends, translates it into a core event (``coordinator.convert``) and feeds it
to the runtime; the handler itself writes what the runtime queues on the
channel (directives, then possibly a closing status). When the stream ends for
any reason the servicer feeds ``SessionClosed``; the core ignores it for a
Session it already closed or replaced.

What the core judges (a Hello without node_id or incarnation, a second Hello,
a heartbeat seq that does not increase, a Session replaced by a newer one) it
answers with ``CloseSession``; the servicer only carries that status out.
What cannot become an event is refused here with INVALID_ARGUMENT, as
agent.proto's contract says: bytes that do not parse as an ``AgentMessage``,
fields this coordinator does not know (the message names the field path), a
first message that is not a Hello, a message without a body, a TaskUpdate
without a change. An unsupported ``Hello.protocol_version`` is
FAILED_PRECONDITION. A replica that does not lead reads the Hello, then
writes ``NotLeader`` (the leader's address read from the election, or none
yet with ``retry_after_ms``) and ends with UNAVAILABLE — unless fan-in is on
(``coordinator.forwarding``): then it holds the Session and carries it to the
leader, which runs it through this same servicer.

Admission control (issue 16): a leader past ``max_sessions`` or receiving
Hellos over its admitted rate answers ``NotLeader`` naming itself with a
``retry_after_ms`` (RESOURCE_EXHAUSTED / UNAVAILABLE); the agent honours the
delay without growing its backoff. The outbound queue of a Session is
bounded: an agent that does not read is closed with RESOURCE_EXHAUSTED.

Shared-document messages (DocumentInterest, DeltaBatch, DeltaAck,
StateVectorReport) go to the ``coordinator.documents.DocumentService`` when
one is given, with the stream's channel; it is told when the stream ends.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from coordinator import convert
from coordinator.convert import unknown_field_path
from coordinator.core import GoodbyeReceived, SessionClosed
from coordinator.documents import DOCUMENT_MESSAGES, DocumentService
from coordinator.forwarding import SessionForwarder
from coordinator.runtime import Channel, Close, CoordinatorRuntime
from lazarus.v1 import agent_pb2

__all__ = [
    "SERVICE_NAME",
    "SUPPORTED_PROTOCOL_VERSIONS",
    "AgentSessionService",
    "add_agent_service",
    "unknown_field_path",
]

_log = logging.getLogger("lazarus.coordinator.session")

SERVICE_NAME = "lazarus.v1.AgentService"

SUPPORTED_PROTOCOL_VERSIONS = frozenset({0, 1})
"""Hello.protocol_version values accepted (0: an agent that does not say)."""

MAX_IN_FLIGHT = 1024
"""Messages of one stream queued on the runtime and not yet stepped, at most."""

NOT_LEADER_RETRY_AFTER_MS = 200
"""NotLeader.retry_after_ms: when to dial the leader (or retry here)."""


class AgentSessionService:
    """Serves ``AgentService.Session`` for one runtime."""

    def __init__(
        self,
        runtime: CoordinatorRuntime,
        documents: DocumentService | None = None,
        forwarder: SessionForwarder | None = None,
    ) -> None:
        self._runtime = runtime
        self._documents = documents
        self.forwarder = forwarder
        """Fan-in (``--fan-in``): a follower holds the Session and forwards it (None: NotLeader)."""

    async def Session(
        self, request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        """One node agent's Session; see the module docstring for the statuses."""
        runtime = self._runtime
        if not runtime.leading:
            forwarder = self.forwarder
            if forwarder is not None:
                # Admission at the replica that holds the Session (its Hello rate,
                # its CPU); the leader admits forwarded Sessions without asking.
                refused = runtime.admit_session()
                if refused is not None:
                    await self._defer(request_iterator, context, *refused)
                elif not await forwarder.hold(request_iterator, context):
                    await self._no_leader_to_forward_to(request_iterator, context)
                return
            await self._not_leader(request_iterator, context)
            return
        refused = None if getattr(context, "forwarded", False) else runtime.admit_session()
        if refused is not None:
            await self._defer(request_iterator, context, *refused)
            return
        channel = runtime.open_channel()
        channel.held_by = getattr(context, "held_by", "")
        bind = getattr(context, "bind", None)
        if bind is not None:
            bind(channel)  # a forwarded Session: its heartbeats may take the digest path
        channel.writer = asyncio.current_task()
        reader = asyncio.create_task(self._read(request_iterator, channel))
        try:
            while True:
                item = await channel.next()
                if item is None:
                    return
                if isinstance(item, Close):
                    await context.abort(item.code, item.reason)
                    return
                channel.writing = True
                try:
                    await context.write(item)
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    if not channel.overflowed or task is None or task.cancelling() != 1:
                        raise  # a real cancellation (the call ended, the server stops)
                    # Stuck on an agent that does not read: end it now (Channel.put).
                    task.uncancel()
                    await context.abort(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        "the agent does not read its stream; reconnect",
                    )
                    return
                finally:
                    channel.writing = False
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            if channel.hello_seen:
                # Shielded from the handler's own cancellation (client went away).
                closed = SessionClosed(
                    session_id=channel.session_id, node_id=channel.node_id, now_s=0.0
                )
                await asyncio.shield(runtime.feed(closed))
                if self._documents is not None:
                    self._documents.detached(channel)
            runtime.release_channel(channel)

    async def _not_leader(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        await _first_message(requests)
        leader = None
        with contextlib.suppress(Exception):
            leader = await self._runtime.election.leader()
        address = leader.value if leader is not None else ""
        await context.write(
            agent_pb2.CoordinatorMessage(
                not_leader=agent_pb2.NotLeader(
                    # Member ids of other replicas are unknown until MemberRecords exist.
                    leader_id="",
                    leader_address=address,
                    term=leader.term if leader is not None else 0,
                    retry_after_ms=NOT_LEADER_RETRY_AFTER_MS,
                )
            )
        )
        where = f"the leader is at {address}" if address else "no leader yet, retry in 200 ms"
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"not the leader; {where}")

    async def _no_leader_to_forward_to(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        """Fan-in, no leader reachable: NotLeader naming nobody; the agent dials its next address.

        Naming the leader would move the agent off the replicas that spread
        Sessions (and a leader that does not answer this replica may well be
        gone); with one Service address the agent comes back through it.
        """
        await _first_message(requests)
        await context.write(
            agent_pb2.CoordinatorMessage(
                not_leader=agent_pb2.NotLeader(retry_after_ms=NOT_LEADER_RETRY_AFTER_MS)
            )
        )
        await context.abort(
            grpc.StatusCode.UNAVAILABLE,
            f"no leader to forward this Session to yet; retry in {NOT_LEADER_RETRY_AFTER_MS} ms",
        )

    async def _defer(
        self,
        requests: AsyncIterator[bytes],
        context: grpc.aio.ServicerContext[Any, Any],
        code: grpc.StatusCode,
        retry_after_s: float,
    ) -> None:
        """Admission refused: NotLeader naming this replica, come back after a delay."""
        await _first_message(requests)
        retry_after_ms = max(1, int(retry_after_s * 1000))
        runtime = self._runtime
        await context.write(
            agent_pb2.CoordinatorMessage(
                not_leader=agent_pb2.NotLeader(
                    leader_id=runtime.settings.member_id,
                    leader_address=runtime.settings.advertise_address,
                    term=runtime.leadership.term if runtime.leadership is not None else 0,
                    retry_after_ms=retry_after_ms,
                )
            )
        )
        await context.abort(code, f"busy: Hello deferred; retry in {retry_after_ms} ms")

    async def _read(self, requests: AsyncIterator[bytes], channel: Channel) -> None:
        """Parse and queue the stream's messages, pipelined.

        Each message is queued on the runtime (``CoordinatorRuntime.enqueue``)
        in stream order without waiting for the previous one's group commit;
        at most ``MAX_IN_FLIGHT`` wait at once (back-pressure on the stream).
        A message found to have been queued on a replica that no longer leads
        ends the stream with UNAVAILABLE.
        """
        incoming = aiter(requests)
        pending: collections.deque[asyncio.Future[bool]] = collections.deque()
        while True:
            try:
                raw = await anext(incoming)
            except StopAsyncIteration:
                break  # the agent half-closed the stream
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a broken stream: the agent is gone
                _log.info("session %s: stream broke: %s", channel.session_id, exc)
                break
            try:
                outcome = await self._receive(channel, raw)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in the shell or the core: end this stream only
                _log.exception("session %s: handling a message failed", channel.session_id)
                channel.close(grpc.StatusCode.INTERNAL, "internal error; reconnect")
                return
            if isinstance(outcome, asyncio.Future):
                pending.append(outcome)
                if len(pending) >= MAX_IN_FLIGHT:
                    await asyncio.shield(pending[0])
                outcome = None
                while pending and pending[0].done() and outcome is None:
                    outcome = _outcome(pending.popleft(), channel)
            if outcome is not None:
                code, reason = outcome
                _log.info("session %s (%r): %s", channel.session_id, channel.node_id, reason)
                channel.close(code, reason)
                return
        for future in pending:  # let their acks and replies out before the stream ends
            await asyncio.wait([future])
            problem = _outcome(future, channel)
            if problem is not None:
                channel.close(*problem)
                return
        channel.end()

    async def _receive(
        self, channel: Channel, raw: bytes
    ) -> tuple[grpc.StatusCode, str] | asyncio.Future[bool] | None:
        """One message: a refusal (status, reason), the queued event's future, or None."""
        invalid = grpc.StatusCode.INVALID_ARGUMENT
        try:
            message = agent_pb2.AgentMessage.FromString(raw)
        except DecodeError as exc:
            return invalid, f"bytes do not parse as an AgentMessage: {exc}"
        unknown = unknown_field_path(message)
        if unknown is not None:
            return invalid, f"{unknown}: field unknown to this coordinator"
        runtime = self._runtime
        which = message.WhichOneof("body")
        sid = channel.session_id
        if which is None:
            return invalid, "AgentMessage.body: must be set"
        if not channel.hello_seen and which != "hello":
            return invalid, f"AgentMessage.{which}: the first message must be a hello"
        if which == "hello":
            hello = message.hello
            if hello.protocol_version not in SUPPORTED_PROTOCOL_VERSIONS:
                return (
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"hello.protocol_version: {hello.protocol_version} is not supported "
                    f"(supported: {sorted(SUPPORTED_PROTOCOL_VERSIONS)})",
                )
            opened = convert.hello_to_event(sid, hello, 0.0)
            if channel.hello_seen:
                # A second Hello: the stream stays bound to its first node; the core judges.
                opened = dataclasses.replace(opened, node_id=channel.node_id)
            else:
                channel.hello_seen = True
                channel.node_id = hello.node_id
            fed = runtime.enqueue(opened)
        elif which == "heartbeat":
            channel.remember_heartbeat(message.heartbeat)
            event = convert.heartbeat_to_event(sid, channel.node_id, message.heartbeat, 0.0)
            fed = runtime.enqueue(event)
            runtime.count_heartbeats(fed, [channel.node_id])
        elif which == "task_update":
            try:
                update = convert.task_update_to_event(
                    sid, channel.node_id, message.task_update, 0.0
                )
            except convert.UnknownChange as exc:
                return invalid, str(exc)
            fed = runtime.enqueue(update)
        elif which == "lineage_report":
            try:
                lineage = convert.lineage_report_to_event(
                    sid, channel.node_id, message.lineage_report, 0.0
                )
            except ValueError as exc:
                return invalid, str(exc)
            fed = runtime.enqueue(lineage)
        elif which == "goodbye":
            bye = message.goodbye
            fed = runtime.enqueue(
                GoodbyeReceived(
                    session_id=sid,
                    node_id=channel.node_id,
                    now_s=0.0,
                    reason=bye.reason,
                    released_all=bye.released_all,
                )
            )
        elif which in DOCUMENT_MESSAGES and self._documents is not None:
            await self._documents.receive(channel, message)
            return None
        else:
            _log.debug("session %s: %s not handled yet, ignored", sid, which)
            return None
        return fed


FIRST_MESSAGE_TIMEOUT_S = 1.0
"""How long a refusing replica waits for the agent's Hello before answering anyway."""


async def _first_message(requests: AsyncIterator[bytes]) -> None:
    """Wait (bounded) until the agent's first message arrived.

    A reply written and the call ended before the client finished writing its
    Hello turns, in grpc-python's aio client, into ``INTERNAL: Internal error
    from Core`` and the NotLeader message is lost (grpc issue #36066): read
    the Hello first, then answer.
    """
    with contextlib.suppress(Exception):
        async with asyncio.timeout(FIRST_MESSAGE_TIMEOUT_S):
            await anext(aiter(requests))


def _outcome(future: asyncio.Future[bool], channel: Channel) -> tuple[grpc.StatusCode, str] | None:
    """What a stepped message means for its stream: None (go on) or a closing status."""
    if future.cancelled():
        return grpc.StatusCode.UNAVAILABLE, "this coordinator is no longer leader"
    exc = future.exception()
    if exc is not None:  # a bug in the core: end this stream only
        _log.error(
            "session %s: stepping a message failed",
            channel.session_id,
            exc_info=(type(exc), exc, exc.__traceback__),
        )
        return grpc.StatusCode.INTERNAL, "internal error; reconnect"
    if not future.result():
        return grpc.StatusCode.UNAVAILABLE, "this coordinator is no longer leader"
    return None


def _serialize_reply(message: agent_pb2.CoordinatorMessage | bytes) -> bytes:
    """A reply's wire bytes (a forwarded Session's replies arrive serialized)."""
    return message if isinstance(message, bytes) else message.SerializeToString()


def add_agent_service(
    server: grpc.aio.Server,
    runtime: CoordinatorRuntime,
    documents: DocumentService | None = None,
    forwarder: SessionForwarder | None = None,
) -> AgentSessionService:
    """Register AgentService on ``server``; requests reach the servicer as raw bytes.

    Args:
        server: the gRPC server.
        runtime: the leader loop.
        documents: the shared-document service (None: those messages are ignored).
        forwarder: fan-in's follower side (None: a follower answers NotLeader).

    Returns:
        The servicer.
    """
    servicer = AgentSessionService(runtime, documents, forwarder)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.Session,
        request_deserializer=None,
        response_serializer=_serialize_reply,
    )
    generic = grpc.method_handlers_generic_handler(SERVICE_NAME, {"Session": handler})
    server.add_generic_rpc_handlers((generic,))
    return servicer
