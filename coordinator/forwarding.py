"""Fan-in: followers hold agents' Sessions and carry them to the leader, across leader changes.

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
the leader admitted the Hello. The one ack a follower gives on its own is
rule (b), INTERREGNUM (:class:`_Interregnum`, the pure
``coordinator.core.fanin.FollowerCore`` deciding): once a linearizable read
of the election prefix shows the leader's key deleted, a heartbeat that
arrived at most ``interregnum_window_s`` after the newest read that still
showed it is acked, so agents do not fence while no leader can ack them.
Every later leader gives every node ``dead_after_s`` from its own election,
which comes after that deletion; ``docs/fan-in.md`` section 4 has the proof.
No Welcome is ever given by (b).

Failures. When the link ends (the leader crashed, resigned or stopped
leading, or the network broke: a leader gone silent without closing the
connection is noticed by the channel's keepalive, ``lazarus.grpcopts``, within
10 s; or this replica's election watch shows
another leader, ``CoordinatorRuntime.on_leader_observed``, so a paused old
leader does not keep Sessions hanging) the Sessions it carried are
*detached*, not ended: the agents' streams stay open. Once a leader answers
(this replica itself, over a link to itself, if it now leads), each detached
agent gets a ``Reattach`` (agent.proto), paced by :data:`RELAY_SETTINGS`;
the agent ends its session with the old leader as on a reconnect and sends a
fresh Hello on the same stream, which opens a forwarded Session at the new
leader. A channel to a leader is waited for at most
:data:`LINK_CONNECT_TIMEOUT_S`; which leader to link to, and not redialling
one whose link just broke (``RelaySettings.failed_leader_hold_off_s``), is
the pure ``coordinator.core.relay.LinkPolicy``'s decision. When no leader is known for a
new Session, the follower answers NotLeader naming nobody (the agent tries
its next address). Admission (Hello rate, CPU) runs on the replica that holds
the Session; the leader admits forwarded Sessions without asking. An agent
that does not read its replies, or a follower that does not read the
leader's, is ended with RESOURCE_EXHAUSTED when its queue passes
``max_outbound`` (never buffered without bound).

Identity: the follower's own auth interceptor checks the agent's identity and
that its Hello names only its own node (``coordinator.auth``), before anything
is forwarded; the Forward stream itself needs a member identity
(``coordinator.authz``). The leader therefore trusts a forwarded Hello's node
id because a member vouches for it, as it trusts a member's proxied writes.
The follower names itself in the call's :data:`MEMBER_ID_METADATA`, which
ListNodes reports as each node's ``session_replica``.

Metrics (``coordinator.metrics``): ``lazarus_forwarded_sessions{side}``,
``lazarus_forward_batches_total{direction}``,
``lazarus_forward_entries_total{direction}`` and
``lazarus_forward_ack_seconds`` (follower: a heartbeat's arrival from the agent
to the leader's ack of it leaving for the agent).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from coordinator import convert
from coordinator.core import HeartbeatDigest, HeartbeatReceived
from coordinator.core.errors import UsageError
from coordinator.core.fanin import (
    Ack,
    AckBasis,
    ElectionObserved,
    FanInSettings,
    FollowerCore,
    ReadElection,
    SessionEnded,
    Tick,
)
from coordinator.core.fanin import Command as FanInCommand
from coordinator.core.fanin import HeartbeatReceived as ArrivedAtReplica
from coordinator.core.relay import (
    ELECTION_READ_TIMEOUT_S,
    LEADERSHIP_CHECK_S,
    LINK_CONNECT_TIMEOUT_S,
    RELINK_INTERVAL_S,
    Carry,
    LinkChoice,
    LinkPolicy,
    RelaySettings,
    Route,
    SessionRelay,
    digest_eligible,
    leader_end_detaches,
    link_accepted,
    link_led,
    link_outdated,
    newest_leader,
)
from coordinator.leaderchannels import LeaderChannels
from coordinator.runtime import Channel, CoordinatorRuntime
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
    "interregnum_settings",
]

_log = logging.getLogger("lazarus.coordinator.forwarding")

REPLICA_SERVICE_NAME = "lazarus.v1.ReplicaService"
FORWARD_METHOD = f"/{REPLICA_SERVICE_NAME}/Forward"

MAX_BATCH_ENTRIES = 512
"""Entries in one ForwardBatch at most (a bigger backlog goes out as several)."""

BATCH_LINGER_S = 0.05
"""A follower holds a batch this long after its first entry before it goes out
(docs/fan-in.md section 5 budgets 50 ms for a batch): at 2,000 heartbeats/s a
batch carries about 40 of them, so the leader reads, steps and answers one
batch where it would otherwise handle 40 (the liveness digest)."""

MAX_QUEUED_ENTRIES = 50_000
"""Entries one side of a Forward stream may have queued and not yet written."""

FEED_PAUSE_AT = 20_000
"""Events the leader's runtime may have queued, not yet stepped, before its Forward
streams stop reading (DESIGN.md §11: queues are bounded). A stream that does not
read lets HTTP/2 flow control hold the followers' writes, so a leader that falls
behind (overload, an etcd brownout holding its step lock) pushes back instead of
buffering without bound; its followers' unsent entries are bounded in turn by
``MAX_QUEUED_ENTRIES``."""

FEED_RESUME_AT = 10_000
"""The runtime backlog below which paused Forward streams read again."""

PAUSE_POLL_S = 0.01
"""How often a paused Forward stream looks at the runtime's backlog, seconds."""

_OK = grpc.StatusCode.OK.value[0]

ACCEPTED_METADATA = "lazarus-forward-accepted"
"""Initial metadata a leader sends on a Forward stream it accepts (it leads now):
a follower sends its agents Reattaches only once it has seen it."""

MEMBER_ID_METADATA = "lazarus-member-id"
"""Call metadata of a Forward stream: the follower's member id (``lazarus nodes`` shows it)."""

INTERREGNUM_CLOCK_DRIFT = 0.01
"""rho of rule (b)'s window: every clock involved (agents', replicas') runs
within 1 % of real time. Linux slews CLOCK_MONOTONIC by at most 0.05 %; the
lease deadline uses 0.1 % (``coordinator.election.LEASE_CLOCK_DRIFT``); the
window takes the simulator's more cautious 1 % (``docs/fan-in.md`` section 7)."""


class ForwardObserver(Protocol):
    """What the forwarding shell reports, for metrics (``coordinator.metrics.Metrics``)."""

    def forwarded_sessions(self, side: str, delta: int) -> None:
        """Sessions held (side "follower") or served (side "leader") changed by ``delta``."""

    def forward_batch(self, direction: str, entries: int) -> None:
        """A ForwardBatch of ``entries`` was ``"sent"`` or ``"received"``."""

    def forward_ack(self, seconds: float) -> None:
        """A heartbeat's ack left for its agent ``seconds`` after the heartbeat arrived."""

    def forward_heartbeats(self, path: str, count: int) -> None:
        """The leader stepped ``count`` forwarded heartbeats by ``path``: "digest"
        (one core event per batch) or "message" (behind an older message of
        their Session, through the Session servicer)."""

    def interregnum_acks(self, count: int) -> None:
        """A follower acked ``count`` heartbeats by rule (b) (no leader could)."""

    def sessions_sent_away(self, reason: str) -> None:
        """A new Session was answered NotLeader: "no_leader", "leader_gone" or "link_busy"."""

    def forward_backpressure(self, side: str) -> None:
        """A bound was reached: side "leader", a Forward stream paused its reads
        (``FEED_PAUSE_AT``); side "follower", a link was ended because the leader
        left ``MAX_QUEUED_ENTRIES`` of its entries unread."""


class _NullObserver:
    def forwarded_sessions(self, side: str, delta: int) -> None:
        pass

    def forward_batch(self, direction: str, entries: int) -> None:
        pass

    def forward_ack(self, seconds: float) -> None:
        pass

    def forward_heartbeats(self, path: str, count: int) -> None:
        pass

    def interregnum_acks(self, count: int) -> None:
        pass

    def sessions_sent_away(self, reason: str) -> None:
        pass

    def forward_backpressure(self, side: str) -> None:
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
    queue: asyncio.Queue[replica_pb2.ForwardEntry | None], linger_s: float = 0.0
) -> AsyncGenerator[replica_pb2.ForwardBatch, None]:
    """Everything queued ``linger_s`` after the first entry, as one batch (bounded).

    The linger (Kafka's ``linger.ms``) is what makes a batch hold many nodes'
    heartbeats at a steady load, where without it each would go alone: the
    leader's cost is per batch as much as per entry. A ``None`` queued ends
    the generator (the link failed: what is still queued is not sent), so
    the gRPC call's request poller ends with it rather than waiting forever.
    """
    while True:
        first = await queue.get()
        if first is None:
            return
        entries = [first]
        if linger_s > 0 and queue.qsize() < MAX_BATCH_ENTRIES:
            await asyncio.sleep(linger_s)
        while not queue.empty() and len(entries) < MAX_BATCH_ENTRIES:
            entry = queue.get_nowait()
            if entry is None:
                return
            entries.append(entry)
        yield replica_pb2.ForwardBatch(entries=entries)


# ---------------------------------------------------------------------- leader


class Outbox:
    """A leader's replies on one Forward stream, built in place as the next batch.

    Each reply is a new entry of the batch the writer sends next (filled by
    the caller: no message built and then copied into the batch, which
    profiling showed to be much of a leader's cost per forwarded heartbeat).
    A batch holds at most :data:`MAX_BATCH_ENTRIES`; past that a new one is
    started behind it. ``stop`` ends the writer once what was queued before
    it is written; entries added after it are not sent.
    """

    def __init__(self) -> None:
        self._batch = replica_pb2.ForwardBatch()
        self._full: collections.deque[replica_pb2.ForwardBatch] = collections.deque()
        self._queued = 0
        self._ready = asyncio.Event()
        self._stopped = False

    def entry(self, session_id: str) -> replica_pb2.ForwardEntry:
        """A new entry of ``session_id`` in the next batch, for the caller to fill
        (once stopped, a loose entry that is never sent)."""
        if self._stopped:
            return replica_pb2.ForwardEntry(session_id=session_id)
        if len(self._batch.entries) >= MAX_BATCH_ENTRIES:
            self._full.append(self._batch)
            self._batch = replica_pb2.ForwardBatch()
        entry = self._batch.entries.add()
        entry.session_id = session_id
        self._queued += 1
        self._ready.set()
        return entry

    def qsize(self) -> int:
        """Entries queued and not yet taken by the writer."""
        return self._queued

    def empty(self) -> bool:
        return self._queued == 0

    def stop(self) -> None:
        """The writer sends what is queued now, then ends."""
        if not self._stopped:
            self._stopped = True
            if len(self._batch.entries):
                self._full.append(self._batch)
                self._batch = replica_pb2.ForwardBatch()
            self._ready.set()

    async def take(self) -> replica_pb2.ForwardBatch | None:
        """The next batch to write; None once stopped and what preceded it is taken."""
        while True:
            if self._full:
                batch = self._full.popleft()
            elif self._stopped:
                return None
            elif len(self._batch.entries):
                batch, self._batch = self._batch, replica_pb2.ForwardBatch()
            else:
                self._ready.clear()
                await self._ready.wait()
                continue
            self._queued -= len(batch.entries)
            return batch


class _Ended(Exception):
    """A forwarded Session was ended (what ``context.abort`` raises in grpc)."""


class _ForwardedContext:
    """What the Session servicer uses of a ``grpc.aio.ServicerContext``, for a forwarded Session.

    ``write`` queues the reply for the follower; ``abort`` queues the end
    status and raises, as grpc's does.
    """

    def __init__(
        self,
        session_id: str,
        out: Outbox,
        peer: str,
        held_by: str,
    ) -> None:
        self._sid = session_id
        self._out = out
        self._peer = peer
        self.held_by = held_by
        """Member id of the follower holding the Session (``lazarus nodes`` shows it)."""
        self.ended = False
        self.forwarded = True
        """The Session servicer skips the leader's admission: the follower admitted it."""
        self.channel: Channel | None = None
        """The runtime's channel of the Session, once the servicer opened it."""
        self.backlog = 0
        """Entries put in the Session's inbox whose handling (up to their enqueue
        on the runtime) is not finished: a heartbeat may take the digest path
        only at 0, so that it cannot overtake an older message of its Session."""

    def peer(self) -> str:
        return self._peer

    def digest_event(self, heartbeat: agent_pb2.Heartbeat) -> HeartbeatReceived | None:
        """The heartbeat as a digest entry, or None when it must queue behind its Session
        (``coordinator.core.relay.digest_eligible``)."""
        channel = self.channel
        if channel is None or not digest_eligible(self.backlog, channel.hello_seen, channel.closed):
            return None
        channel.remember_heartbeat(heartbeat)
        return convert.heartbeat_to_event(channel.session_id, channel.node_id, heartbeat, 0.0)

    def bind(self, channel: Channel) -> None:
        """The servicer opened ``channel`` for this Session: acks may go straight out."""
        self.channel = channel
        channel.ack_sink = self.ack

    def ack(self) -> agent_pb2.HeartbeatAck | None:
        """The heartbeat ack to fill for the follower (``Channel.ack_sink``): one small
        entry of the next batch; None once the Session ended (the ack is dropped)."""
        if self.ended:
            return None
        return self._out.entry(self._sid).heartbeat_ack

    async def write(self, message: agent_pb2.CoordinatorMessage | bytes) -> None:
        raw = message if isinstance(message, bytes) else message.SerializeToString()
        self._out.entry(self._sid).message = raw

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        self.finish(code, details)
        raise _Ended(details)

    def finish(self, code: grpc.StatusCode, reason: str) -> None:
        if not self.ended:
            self.ended = True
            end = self._out.entry(self._sid).end
            end.code, end.reason = code.value[0], reason


class _StreamBroke(Exception):
    """The follower reported the agent's stream broken (not half-closed)."""


Inbox = asyncio.Queue[bytes | replica_pb2.SessionEnd]
"""One forwarded Session's incoming side: agent messages, then how it ended."""


@dataclass(slots=True)
class _Served:
    """One forwarded Session the leader serves: its inbox, the task serving it, its context."""

    inbox: Inbox
    task: asyncio.Task[None]
    context: _ForwardedContext

    def queue(self, item: bytes | replica_pb2.SessionEnd) -> None:
        """Hand ``item`` to the Session servicer, behind what is already queued."""
        self.context.backlog += 1
        self.inbox.put_nowait(item)


Held = dict[str, _Served]
"""A leader's forwarded Sessions of one stream, by the follower's Session id."""


async def _inbox_messages(inbox: Inbox, context: _ForwardedContext) -> AsyncIterator[bytes]:
    """The Session's messages; the servicer asks for the next one only once it
    queued the previous one on the runtime, which is when it leaves the backlog."""
    while True:
        item = await inbox.get()
        if isinstance(item, bytes):
            yield item
            context.backlog -= 1
            continue
        context.backlog -= 1
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
        await context.send_initial_metadata(((ACCEPTED_METADATA, "1"),))
        peer = context.peer()
        metadata = dict(context.invocation_metadata() or ())
        member = str(metadata.get(MEMBER_ID_METADATA, "")) or peer
        out = Outbox()
        sessions: Held = {}
        reader = asyncio.create_task(self._read(requests, sessions, out, peer, member))
        verdict: list[tuple[grpc.StatusCode, str]] = []
        watchdog = asyncio.create_task(self._watch(reader, sessions, out, verdict))
        try:
            # The writer: whatever is queued when the stream can take a write, as
            # one batch, until the watchdog's stop.
            while (batch := await out.take()) is not None:
                await context.write(batch)
                self._observer.forward_batch("sent", len(batch.entries))
        finally:
            watchdog.cancel()
            reader.cancel()
            for task in (watchdog, reader):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            for served in list(sessions.values()):
                served.task.cancel()
            for served in list(sessions.values()):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await served.task
        if verdict:
            await context.abort(*verdict[0])

    async def _watch(
        self,
        reader: asyncio.Task[None],
        sessions: Held,
        out: Outbox,
        verdict: list[tuple[grpc.StatusCode, str]],
    ) -> None:
        """End the stream when it must end: put the writer's stop (None) on ``out``.

        Checked every :data:`LEADERSHIP_CHECK_S` and when the follower's side
        ends: an invalid entry (INVALID_ARGUMENT), this replica no longer
        leading (UNAVAILABLE), replies piling up unread (RESOURCE_EXHAUSTED),
        or the follower's side over and every Session ended (OK).
        """
        runtime = self._runtime
        while True:
            await asyncio.wait([reader], timeout=LEADERSHIP_CHECK_S)
            if reader.done():
                exc = reader.exception() if not reader.cancelled() else None
                if isinstance(exc, _InvalidEntry):
                    verdict.append((grpc.StatusCode.INVALID_ARGUMENT, str(exc)))
                    break
                if out.empty() and not sessions:
                    break  # the follower ended the stream and every Session is over
                await asyncio.sleep(0.01)  # the Sessions are ending: let them write
            elif not runtime.leading:
                verdict.append((grpc.StatusCode.UNAVAILABLE, "this replica stopped leading"))
                break
            elif out.qsize() > MAX_QUEUED_ENTRIES:
                verdict.append(
                    (
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"{out.qsize()} replies unread: the follower does not read its stream",
                    )
                )
                break
        out.stop()

    async def _read(
        self,
        requests: AsyncIterator[replica_pb2.ForwardBatch],
        sessions: Held,
        out: Outbox,
        peer: str,
        member: str,
    ) -> None:
        runtime = self._runtime
        try:
            async for batch in requests:
                self._observer.forward_batch("received", len(batch.entries))
                digest: list[HeartbeatReceived] = []
                for entry in batch.entries:
                    which = entry.WhichOneof("body")
                    if not entry.session_id or which is None or which == "heartbeat_ack":
                        raise _InvalidEntry(
                            "ForwardEntry: session_id and a body (message, end, heartbeat) "
                            "are required"
                        )
                    served = sessions.get(entry.session_id)
                    if which == "heartbeat" and served is not None:
                        event = served.context.digest_event(entry.heartbeat)
                        if event is not None:
                            digest.append(event)
                            continue
                    if served is None:
                        if which == "end":
                            continue  # a Session that ended before the leader saw it
                        served = self._open(entry.session_id, sessions, out, peer, member)
                    if which == "message":
                        served.queue(entry.message)
                    elif which == "heartbeat":
                        # Something older of its Session is still queued: keep the order.
                        self._observer.forward_heartbeats("message", 1)
                        served.queue(
                            agent_pb2.AgentMessage(heartbeat=entry.heartbeat).SerializeToString()
                        )
                    else:
                        served.queue(entry.end)
                if digest:
                    self._step_digest(digest)
                if runtime.feed_backlog > FEED_PAUSE_AT:
                    await self._pause(runtime)
        finally:
            # The follower's side is over: every Session it carried ends.
            for served in list(sessions.values()):
                served.inbox.put_nowait(
                    replica_pb2.SessionEnd(
                        code=grpc.StatusCode.UNAVAILABLE.value[0], reason="link ended"
                    )
                )

    async def _pause(self, runtime: CoordinatorRuntime) -> None:
        """Read nothing more until the runtime's backlog is down to ``FEED_RESUME_AT``."""
        self._observer.forward_backpressure("leader")
        _log.warning(
            "%d events queued and not yet stepped: Forward streams pause their reads",
            runtime.feed_backlog,
        )
        while runtime.feed_backlog > FEED_RESUME_AT and runtime.leading:
            await asyncio.sleep(PAUSE_POLL_S)

    def _step_digest(self, digest: list[HeartbeatReceived]) -> None:
        """Queue a batch's digest heartbeats as one core event (``HeartbeatDigest``).

        Queued before any later entry of the batch reaches the runtime (those
        go through their Session's task), so each Session's order holds.
        """
        self._observer.forward_heartbeats("digest", len(digest))
        runtime = self._runtime
        stepped = runtime.enqueue(HeartbeatDigest(tuple(digest), 0.0))
        runtime.count_heartbeats(stepped, [hb.node_id for hb in digest])

    def _open(
        self,
        sid: str,
        sessions: Held,
        out: Outbox,
        peer: str,
        member: str,
    ) -> _Served:
        inbox: Inbox = asyncio.Queue()
        context = _ForwardedContext(sid, out, f"{peer} (forwarded)", member)

        async def run() -> None:
            self._observer.forwarded_sessions("leader", 1)
            try:
                await self._session(_inbox_messages(inbox, context), context)
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

        served = _Served(inbox, asyncio.create_task(run(), name=f"forwarded-{sid}"), context)
        sessions[sid] = served
        return served


class _InvalidEntry(Exception):
    """A ForwardEntry the leader cannot route (INVALID_ARGUMENT)."""


# ---------------------------------------------------------------------- follower


_HELD_IDS = itertools.count(1)


class _Held:
    """One agent's Session that this replica holds, attached to a link or detached.

    ``inbox`` is what to write to the agent: CoordinatorMessage bytes, or the
    SessionEnd to end its stream with.
    """

    def __init__(self) -> None:
        self.inbox: Inbox = asyncio.Queue()
        self.link: _Link | None = None
        self.sid = ""
        self.heard: dict[int, float] = {}
        self.acked_at: float | None = None
        """When a heartbeat ack was last relayed to the agent (monotonic; None: never):
        the Reattach order after a leader change (``SessionRelay.detach``)."""
        self.extended = False
        """Its newest ack was this replica's own (rule (b)): its Reattach may wait."""
        self.ident = f"h{next(_HELD_IDS)}"
        self.interregnum_key: tuple[str, str] | None = None
        """Its key in ``_Interregnum``'s core while rule (b) may ack it (its
        Welcome's timings are covered), else None."""
        self.term = 0
        """The term of the leader that Welcomed the agent's present Session."""
        self.sent_at: dict[int, tuple[int, int, float]] = {}
        """Recent heartbeats by seq: send times (Unix ms, agent-monotonic ms),
        echoed in a (b) ack, and arrival here (monotonic s)."""


class _Link:
    """A follower's one Forward stream to the leader at ``address`` (term ``term``).

    ``detached(held)`` is called for each Session the link stops carrying
    without the leader having ended it: the link broke, or the leader ended
    the Session with UNAVAILABLE (it stopped leading).
    """

    def __init__(
        self,
        address: str,
        term: int,
        channel: grpc.aio.Channel,
        observer: ForwardObserver,
        max_outbound: int,
        detached: Callable[[_Held], None],
        failed: Callable[[_Link], None] | None = None,
        member_id: str = "",
        welcomed: Callable[[_Held, agent_pb2.Welcome], None] | None = None,
    ) -> None:
        self.address = address
        self._welcomed = welcomed
        self._failed = failed
        self.term = term
        self.closed = False
        self.accepted = False
        """The stream is to be used: the leader accepted it (``link_accepted``)."""
        self._said_accepted: bool | None = None
        self._replied = False
        self.last_ack_s: float | None = None
        """When a heartbeat ack of the leader's last came through (monotonic)."""
        self._observer = observer
        self._max_outbound = max_outbound
        self._detached = detached
        self._overflowed = False
        self._send: asyncio.Queue[replica_pb2.ForwardEntry | None] = asyncio.Queue()
        """Entries for the leader; ``None`` (put by ``fail``) ends the request stream."""
        self.sessions: dict[str, _Held] = {}
        self._ids = itertools.count(1)
        call = channel.stream_stream(
            FORWARD_METHOD,
            request_serializer=replica_pb2.ForwardBatch.SerializeToString,
            response_deserializer=replica_pb2.ForwardBatch.FromString,
        )
        self._call = call(self._requests(), metadata=((MEMBER_ID_METADATA, member_id),))
        self._reader = asyncio.create_task(self._read(), name=f"forward-link-{address}")

    async def accept(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the leader's answer to the stream.

        True when it accepted it (``ACCEPTED_METADATA``: it leads), False when
        it ended the stream at once (not leading yet, or no longer). A leader
        of an earlier release sends no such metadata and refuses at once when
        it does not lead: a stream it keeps open counts as accepted, so a
        rolling upgrade keeps forwarding.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        # Shielded: waiting on the call's own futures must not cancel them (the
        # shielded waits stay pending until the call ends; nothing awaits them).
        metadata = asyncio.shield(self._call.initial_metadata())
        done, _ = await asyncio.wait({metadata}, timeout=timeout_s)
        said: bool | None = None
        if done:
            said = metadata.exception() is None and any(
                key == ACCEPTED_METADATA for key, _ in metadata.result()
            )
        if said:
            ended = False
        elif done:
            # Initial metadata without the word: a refusal (the status follows
            # at once) or an earlier release's leader writing a reply.
            code = asyncio.shield(self._call.code())
            finished, _ = await asyncio.wait({code}, timeout=max(0.0, deadline - loop.time()))
            ended = bool(finished)
        else:
            ended = self._call.done()
        self._said_accepted = said
        self.accepted = link_accepted(said, ended)
        return self.accepted

    @property
    def led(self) -> bool:
        """Whether the leader led on this link: its word, or a reply (``link_led``)."""
        return link_led(self._said_accepted, self._replied)

    async def _requests(self) -> AsyncIterator[replica_pb2.ForwardBatch]:
        async for batch in _batches(self._send, BATCH_LINGER_S):
            self._observer.forward_batch("sent", len(batch.entries))
            yield batch

    async def _read(self) -> None:
        reason = "the leader ended the stream"
        try:
            async for batch in self._call:
                self._replied = True
                self._observer.forward_batch("received", len(batch.entries))
                for entry in batch.entries:
                    self._route(entry)
        except grpc.aio.AioRpcError as exc:
            reason = f"{exc.code().name}: {exc.details()}"
        except asyncio.CancelledError:
            reason = "the link was dropped"
            raise
        finally:
            self.fail(reason)

    def _route(self, entry: replica_pb2.ForwardEntry) -> None:
        held = self.sessions.get(entry.session_id)
        if held is None:
            return  # the agent already went
        which = entry.WhichOneof("body")
        if which == "heartbeat_ack":
            # The leader confirmed the heartbeat (rule (a)): the agent's ack.
            ack = entry.heartbeat_ack
            self._acked(held, ack.seq)
            message = agent_pb2.CoordinatorMessage(heartbeat_ack=ack)
            self._deliver(held, entry.session_id, message.SerializeToString())
            return
        if which == "message":
            if held.heard or self._welcomed is not None:
                self._inspect(entry.message, held)
            self._deliver(held, entry.session_id, entry.message)
            return
        del self.sessions[entry.session_id]
        held.link, held.sid = None, ""
        if leader_end_detaches(entry.end.code):
            self._detached(held)  # the leader stopped leading: carry it to the next one
        else:
            held.inbox.put_nowait(entry.end)

    def _acked(self, held: _Held, seq: int) -> None:
        now = time.monotonic()
        self.last_ack_s = now
        held.acked_at = now
        held.extended = False
        arrived = held.heard.pop(seq, None)
        if arrived is not None:
            self._observer.forward_ack(now - arrived)

    def _inspect(self, raw: bytes, held: _Held) -> None:
        """A verbatim reply: time a heartbeat ack; tell rule (b) of a Welcome."""
        try:
            message = agent_pb2.CoordinatorMessage.FromString(raw)
        except DecodeError:
            return
        body = message.WhichOneof("body")
        if body == "heartbeat_ack":
            self._acked(held, message.heartbeat_ack.seq)
        elif body == "welcome" and self._welcomed is not None:
            self._welcomed(held, message.welcome)

    def _deliver(self, held: _Held, sid: str, raw: bytes) -> None:
        """Queue ``raw`` for the agent, or end a Session whose agent does not read."""
        if held.inbox.qsize() >= self._max_outbound:
            self.forget(sid)
            held.inbox.put_nowait(
                replica_pb2.SessionEnd(
                    code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
                    reason=f"{self._max_outbound} messages unread: "
                    "the agent does not read its stream",
                )
            )
            return
        held.inbox.put_nowait(raw)

    def open(self, held: _Held) -> str:
        """Carry ``held`` on this link from now on; its new forwarded Session id."""
        sid = f"s{next(self._ids)}"
        self.sessions[sid] = held
        held.link, held.sid = self, sid
        return sid

    def send(self, entry: replica_pb2.ForwardEntry) -> None:
        """Queue ``entry`` for the leader; past ``MAX_QUEUED_ENTRIES`` unsent, end the link.

        A leader that does not read its stream (it paused on its own backlog,
        or it hangs) is a slow consumer: its link is ended, not buffered without
        bound, and its Sessions are carried again once a link is made.
        """
        if self.closed:
            return
        if self._send.qsize() >= MAX_QUEUED_ENTRIES:
            if not self._overflowed:
                self._overflowed = True
                self._observer.forward_backpressure("follower")
                # Not from inside a caller that may be walking ``sessions``.
                asyncio.get_running_loop().call_soon(
                    self.fail, f"{MAX_QUEUED_ENTRIES} entries unsent: the leader does not read"
                )
            return
        self._send.put_nowait(entry)

    def forget(self, sid: str) -> None:
        """The agent's stream ended: end its forwarded Session at the leader."""
        held = self.sessions.pop(sid, None)
        if held is not None:
            held.link, held.sid = None, ""
            self.send(_end(sid, grpc.StatusCode.CANCELLED, "the agent's stream ended"))

    def fail(self, reason: str) -> None:
        """End the link; every Session it carried is detached (to be carried to the next leader)."""
        if self.closed:
            return
        self.closed = True
        _log.info("forward link to %s (term %d) ended: %s", self.address, self.term, reason)
        if self._failed is not None and reason != "closed":
            self._failed(self)
        sessions, self.sessions = self.sessions, {}
        for held in sessions.values():
            held.link, held.sid = None, ""
            self._detached(held)
        # End the request iterator: on a call the leader already ended,
        # cancel() does nothing (grpc 1.85 returns False) and would leave the
        # call's request poller waiting on this queue until garbage collection
        # ("Task was destroyed but it is pending!").
        self._send.put_nowait(None)
        self._call.cancel()

    async def close(self) -> None:
        self.fail("closed")
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader


RELAY_SETTINGS = RelaySettings(
    reattach_rate_per_s=500.0,
    reattach_hello_timeout_s=5.0,
    failed_leader_hold_off_s=1.0,
    refused_retry_s=0.2,
)
"""At most 500 Reattaches a second after a leader change; an agent that sends no
Hello 5 s after its Reattach has its stream ended (UNAVAILABLE); a leader whose
link just broke is not redialled for 1 s while the election still names it (nor
for 1 s after each redial it does not answer), one that never led on a link (not
leading yet, or not answering in time) for 0.2 s (``LinkPolicy``)."""

AGENT_FENCE_LEAD_S = 0.5
"""How long before its fence deadline an agent starts pausing (``node_agent``'s
default ``fence_lead_s``): the Reattach schedule plans with it."""


def interregnum_settings(
    heartbeat_interval_s: float, fence_after_s: float, dead_after_s: float, lease_ttl_s: float
) -> FanInSettings | None:
    """Rule (b)'s timing from a replica's own settings (seconds), or None when outside the proof.

    The floor ``g`` is 0 whatever ``failover_reconnect_s`` is: a new leader
    gives a node it loaded ``dead_after_s + failover_reconnect_s``, but only
    ``dead_after_s`` from its election once the node said Hello to it
    (``CoordinatorCore``: the grace ends at election + ``dead_after_s``; a
    Hello makes the node "heard"). None when the settings break I1 of
    ``docs/fan-in.md`` at :data:`INTERREGNUM_CLOCK_DRIFT` (the window would
    be empty): the follower then acks only what the leader confirmed.
    """
    try:
        return FanInSettings(
            heartbeat_interval_s=heartbeat_interval_s,
            fence_after_s=fence_after_s,
            dead_after_s=dead_after_s,
            new_leader_floor_s=0.0,
            lease_ttl_s=lease_ttl_s,
            clock_drift=INTERREGNUM_CLOCK_DRIFT,
        )
    except UsageError as exc:
        _log.warning("interregnum acks (fan-in rule (b)) are off: %s", exc)
        return None


class _Interregnum:
    """Rule (b) of ``docs/fan-in.md`` in a follower: ack heartbeats while no leader can.

    The decisions are the pure ``FollowerCore``'s (built with ``forward=False``:
    the relay carries heartbeats and the leader's acks itself); this class
    feeds it each held agent's heartbeats (with their arrival on this
    replica's monotonic clock) and its Sessions' ends, runs the linearizable
    election reads it asks for (every ``election_read_interval_s``, one at a
    time, while this replica holds Sessions and ``needed()``: it does not lead,
    or some Session still waits to be carried to the leader), and
    writes the acks it answers to the agents' streams. A Session is fed only
    once a Welcome whose timings the window covers
    (``FanInSettings.covers``) came through: every ack then extends its
    agent's fence within the bound the proof allows.

    Args:
        settings: the window's timing (:func:`interregnum_settings`).
        runtime: the replica's runtime (its election).
        observer: metrics (``interregnum_acks``).
        needed: whether reads are worth running now (a leader whose Sessions
            are all carried to itself acks them itself).
        extended: told of each (b) ack: the held Session and its heartbeat's
            arrival (monotonic s), from which its agent's fence now runs.
        leader_acked: when a leader's ack last came through the open link
            (monotonic s; None: no link, or none yet): the core reads the
            election slowly while the leader answers.
    """

    def __init__(
        self,
        settings: FanInSettings,
        runtime: CoordinatorRuntime,
        observer: ForwardObserver,
        needed: Callable[[], bool],
        extended: Callable[[_Held, float], None],
        leader_acked: Callable[[], float | None],
    ) -> None:
        self.core = FollowerCore(settings, forward=False)
        self._leader_acked = leader_acked
        self._runtime = runtime
        self._needed = needed
        self._extended = extended
        self._observer = observer
        self._held: dict[tuple[str, str], _Held] = {}
        self._reader: asyncio.Task[None] | None = None
        self._uncovered: set[tuple[int, int, int]] = set()

    def welcomed(self, held: _Held, welcome: agent_pb2.Welcome) -> None:
        """A Welcome came through for ``held``: a new Session, fed if the window covers it."""
        self.ended(held)
        held.term = welcome.term
        held.sent_at.clear()
        covered = self.core.settings.covers(
            welcome.heartbeat_interval_ms / 1000.0,
            welcome.fence_after_ms / 1000.0,
            welcome.dead_after_ms / 1000.0,
        )
        if not covered:
            timings = (welcome.heartbeat_interval_ms, welcome.fence_after_ms, welcome.dead_after_ms)
            if timings not in self._uncovered:  # once per set of timings, not per agent
                self._uncovered.add(timings)
                _log.warning(
                    "no interregnum acks for Sessions Welcomed with heartbeat %d ms, "
                    "fence %d ms, dead %d ms: not this replica's timings; configure "
                    "every replica alike (docs/fan-in.md section 8)",
                    *timings,
                )
            return
        key = (held.ident, welcome.session_id)
        held.interregnum_key = key
        self._held[key] = held
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read_election(), name="fan-in-interregnum")

    def heartbeat(self, held: _Held, heartbeat: agent_pb2.Heartbeat) -> None:
        """``held``'s agent sent ``heartbeat``; it arrived now."""
        key = held.interregnum_key
        if key is None:
            return
        now = time.monotonic()
        held.sent_at[heartbeat.seq] = (
            heartbeat.sent_at_unix_ms,
            heartbeat.sent_at_monotonic_ms,
            now,
        )
        while len(held.sent_at) > self.core.settings.max_pending_per_session:
            held.sent_at.pop(next(iter(held.sent_at)))
        self._run(self.core.step(ArrivedAtReplica(key[0], key[1], heartbeat.seq, now)))

    def ended(self, held: _Held) -> None:
        """``held``'s Session is over (its stream ended, or a new Welcome replaces it)."""
        key, held.interregnum_key = held.interregnum_key, None
        if key is not None and self._held.pop(key, None) is not None:
            self._run(self.core.step(SessionEnded(key[0], key[1], time.monotonic())))

    def _run(self, commands: list[FanInCommand]) -> None:
        acks = 0
        for command in commands:
            if not isinstance(command, Ack) or command.basis is not AckBasis.INTERREGNUM:
                continue  # ReadElection is run by the reader; no ForwardBatch with forward=False
            held = self._held.get((command.node_id, command.session_id))
            if held is None:
                continue
            unix_ms, mono_ms, arrived_s = held.sent_at.get(command.seq, (0, 0, -math.inf))
            ack = agent_pb2.HeartbeatAck(
                seq=command.seq,
                sent_at_unix_ms=unix_ms,
                sent_at_monotonic_ms=mono_ms,
                received_at_unix_ms=int(time.time() * 1000),
                term=held.term,
            )
            held.inbox.put_nowait(
                agent_pb2.CoordinatorMessage(heartbeat_ack=ack).SerializeToString()
            )
            acks += 1
            if arrived_s > -math.inf:
                self._extended(held, arrived_s)
        if acks:
            self._observer.interregnum_acks(acks)

    async def _read_election(self) -> None:
        """Run the core's election reads while there is a Session to ack and a need."""
        interval_s = self.core.settings.election_read_interval_s
        while self._held:
            if self._needed():
                tick = Tick(time.monotonic(), self._leader_acked())
                for command in self.core.step(tick):
                    if isinstance(command, ReadElection):
                        await self._read(command.read_id)
            await asyncio.sleep(interval_s)

    async def _read(self, read_id: int) -> None:
        try:
            revision, leader = await asyncio.wait_for(
                self._runtime.election.read_leader(), ELECTION_READ_TIMEOUT_S
            )
        except Exception as exc:  # etcd cut off or slow: the anchor ages, (b) acks stop
            _log.debug("election read %d failed: %r", read_id, exc)
            return
        before = self.core.anchor_s
        commands = self.core.step(
            ElectionObserved(
                read_id,
                revision,
                None if leader is None else leader.term,
                "" if leader is None else leader.value,
                time.monotonic(),
            )
        )
        if self.core.anchor_s > before:
            _log.info(
                "the leader's election key was seen gone (revision %d): acking heartbeats "
                "that arrive within %.3f s of the last read that showed it (rule (b))",
                revision,
                self.core.settings.interregnum_window_s,
            )
        self._run(commands)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader


async def _connected(channel: grpc.aio.Channel, moved: asyncio.Event, timeout_s: float) -> bool:
    """Whether ``channel`` connects within ``timeout_s`` and before ``moved`` is set."""
    ready = asyncio.ensure_future(channel.channel_ready())
    aborted = asyncio.ensure_future(moved.wait())
    try:
        await asyncio.wait({ready, aborted}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        return ready.done() and not ready.cancelled() and ready.exception() is None
    finally:
        for waiter in (ready, aborted):
            if not waiter.done():
                waiter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiter


class SessionForwarder:
    """A follower's side of fan-in: holds agents' Sessions, forwards them to the leader.

    When the leader goes (its link breaks, the election shows another one, or
    it ends a Session with UNAVAILABLE), the Sessions it carried are
    *detached*, not ended: the agents' streams stay open. As soon as a leader
    answers again, each detached agent gets a ``Reattach`` (paced by
    :data:`RELAY_SETTINGS`, spreading the new leader's Hellos) and its next
    Hello opens a forwarded Session there; until then its messages are
    dropped (the agent re-sends what matters after the Welcome, as after any
    reconnect). An agent that does not answer a Reattach with a Hello in time
    is ended with UNAVAILABLE. Those decisions are the pure
    ``coordinator.core.relay.SessionRelay``'s; this class carries them out.

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
        interregnum: FanInSettings | None = None,
    ) -> None:
        self._runtime = runtime
        self._tls = member_tls or ClientTls()
        self._observer: ForwardObserver = observer if observer is not None else _NullObserver()
        self._max_outbound = max_outbound
        self._link: _Link | None = None
        # By leader address; a leader change closes the channels of older leaders.
        self._channels = LeaderChannels(self._tls.aio_channel)
        self._connecting = asyncio.Lock()
        # Done when the link attempt in progress (election read, dial, accept) ends.
        self._attempt: asyncio.Future[None] | None = None
        # Why the last attempt made no link (LinkPolicy.retry_new_session_s).
        self._why_unlinked = LinkChoice.NO_LEADER
        # The leader being dialled (address, term) and what aborts the dial once
        # the election shows another one (a crashed leader does not answer).
        self._dialling: tuple[str, int, asyncio.Event] | None = None
        self._observed: tuple[str, int] | None = None  # the election watch's last leader
        self._held: set[_Held] = set()
        relay_settings = RELAY_SETTINGS
        if interregnum is not None:  # (b) acks move fences: those Reattaches may wait
            relay_settings = dataclasses.replace(
                RELAY_SETTINGS,
                fence_after_ack_s=interregnum.heartbeat_interval_s
                + interregnum.fence_after_s
                - AGENT_FENCE_LEAD_S,
            )
        self._relay: SessionRelay[_Held] = SessionRelay(relay_settings)
        self._reattacher: asyncio.Task[None] | None = None
        self._policy = LinkPolicy(relay_settings)
        self._interregnum = (
            _Interregnum(
                interregnum,
                runtime,
                self._observer,
                lambda: not runtime.leading or self._relay.pending,
                self._extended,
                self._leader_acked_s,
            )
            if interregnum is not None
            else None
        )
        runtime.on_leader_observed(self._leader_observed)

    def _leader_observed(self, address: str, term: int) -> None:
        self._observed = (address, term)
        dialling = self._dialling
        if dialling is not None and link_outdated(dialling[0], dialling[1], address, term):
            dialling[2].set()  # stop waiting on a leader the election moved past
        link = self._link
        if (
            link is not None
            and not link.closed
            and link_outdated(link.address, link.term, address, term)
        ):
            link.fail(f"the election shows a new leader, term {term} at {address or '?'}")

    def _link_failed(self, link: _Link) -> None:
        self._policy.failed(link.address, link.term, time.monotonic(), accepted=link.led)

    def _detach(self, held: _Held) -> None:
        if held in self._held:
            self._relay.detach(held, held.acked_at, deferrable=held.extended)
            self._wake_reattacher()

    def _leader_acked_s(self) -> float | None:
        link = self._link
        return link.last_ack_s if link is not None and not link.closed else None

    def _extended(self, held: _Held, arrived_s: float) -> None:
        """A (b) ack moved ``held``'s agent's fence: a detached one's Reattach may wait."""
        held.acked_at = max(held.acked_at if held.acked_at is not None else -math.inf, arrived_s)
        held.extended = True
        if held in self._held and self._relay.state(held) is Carry.DETACHED:
            self._relay.detach(held, held.acked_at, deferrable=True)

    def _wake_reattacher(self) -> None:
        if self._reattacher is None or self._reattacher.done():
            self._reattacher = asyncio.create_task(self._reattach(), name="fan-in-reattach")

    async def _current_link(self, to_self: bool = False) -> _Link | None:
        """The open link to the leader, or a new one; None when no leader answers.

        ``to_self``: when this replica leads, link to itself (the Sessions it
        held as a follower stay on their streams and are served here).
        """
        async with self._connecting:
            link = self._link
            if link is not None and not link.closed:
                return link
            attempt = asyncio.get_running_loop().create_future()
            self._attempt = attempt
            try:
                return await self._attempt_link(to_self)
            finally:
                self._attempt = None
                attempt.set_result(None)

    async def _link_for_new_session(self) -> _Link | None:
        """The link a new Session is forwarded over, or None (the agent gets NotLeader).

        One attempt serves every new Session (single flight): while one is in
        progress, a new Session waits for its outcome instead of queueing for
        an election read and dial of its own (with a thousand agents
        redialling after a leader crash, those queued reads held their
        NotLeader for seconds: ``bench/fanin_failover_bench.py``). How long it
        waits is ``LinkPolicy.session_wait_s``: not at all on the redial of a
        leader whose link broke, 0.25 s after a leader change, up to 2.5 s
        before this replica's first link (start-up), during which attempts
        that find the named leader not ready are repeated every 0.2 s
        (``LinkPolicy.retry_new_session_s``).
        """
        policy = self._policy
        started = time.monotonic()
        while True:
            link = self._link
            if link is not None and not link.closed:
                return link
            attempt = self._attempt
            if attempt is None:
                link = await self._current_link()
            else:
                dialling = self._dialling
                wait_s = policy.session_wait_s(dialling[:2] if dialling is not None else None)
                if wait_s <= 0:
                    # A crashed leader's key outlives it: its redial can take up to
                    # LINK_CONNECT_TIMEOUT_S. NotLeader now; the agent is back in
                    # NOT_LEADER_RETRY_AFTER_MS.
                    self._observer.sessions_sent_away("leader_gone")
                    return None
                left_s = max(0.0, wait_s - (time.monotonic() - started))
                try:
                    await asyncio.wait_for(asyncio.shield(attempt), left_s)
                except TimeoutError:  # a slow election read (etcd or this loop loaded)
                    self._observer.sessions_sent_away("link_busy")
                    return None
                link = self._link
            if link is not None and not link.closed:
                return link
            retry_s = policy.retry_new_session_s(self._why_unlinked, time.monotonic() - started)
            if retry_s is None:
                self._observer.sessions_sent_away("no_leader")
                return None
            await asyncio.sleep(retry_s)  # start-up: the named leader is not ready yet

    async def _attempt_link(self, to_self: bool) -> _Link | None:
        """One attempt to open the link (under ``_connecting``): read, choose, dial, accept."""
        self._why_unlinked = LinkChoice.RETRY_SOON  # unless the choice says otherwise
        try:
            read = await self._runtime.election.leader()
        except Exception as exc:  # etcd unreachable: no leader we can name
            _log.warning("reading the leader to forward to failed: %s", exc)
            return None
        leader = newest_leader(
            (read.value, read.term) if read is not None else None, self._observed
        )
        choice = self._policy.choose(
            leader[0] if leader is not None else "",
            leader[1] if leader is not None else 0,
            self._runtime.settings.advertise_address,
            leading=self._runtime.leading,
            to_self=to_self,
            now_s=time.monotonic(),
        )
        if choice is not LinkChoice.DIAL or leader is None:
            self._why_unlinked = choice if choice is not LinkChoice.DIAL else LinkChoice.NO_LEADER
            return None  # none named, held off, or this replica
        address, term = leader
        # No link is open now (this runs only when the last one closed), so a
        # channel this closes (two leaders back) carries no live call of ours.
        channel = self._channels.get(address)
        moved = asyncio.Event()
        self._dialling = (address, term, moved)
        try:
            connected = await _connected(channel, moved, LINK_CONNECT_TIMEOUT_S)
        finally:
            self._dialling = None
        if not connected:
            if moved.is_set():  # the election named another leader meanwhile
                _log.info("the election moved past the leader at %s; not dialled", address)
                return None
            _log.warning("the leader at %s does not answer; not forwarding", address)
            self._policy.failed(address, term, time.monotonic(), accepted=False)
            return None
        link = _Link(
            address,
            term,
            channel,
            self._observer,
            self._max_outbound,
            self._detach,
            self._link_failed,
            self._runtime.settings.member_id,
            self._interregnum.welcomed if self._interregnum is not None else None,
        )
        if not await link.accept(LINK_CONNECT_TIMEOUT_S):
            # Named by the election but not leading yet (its runtime is still
            # taking over), or paused: ask again soon (``LinkPolicy``).
            link.fail("the leader did not accept the Forward stream")
            return None
        self._link = link
        self._policy.linked()
        _log.info("forwarding Sessions to the leader at %s (term %d)", link.address, link.term)
        return link

    async def _reattach(self) -> None:
        """Carry detached Sessions to the next leader that answers; until none is left."""
        relay = self._relay
        timeout_s = relay.settings.reattach_hello_timeout_s
        announced: _Link | None = None
        while relay.pending:
            for held in relay.expired(time.monotonic()):
                self._end(held, f"no Hello {timeout_s:g} s after Reattach")
            if not relay.detached:
                await asyncio.sleep(RELINK_INTERVAL_S)
                continue
            link = await self._current_link(to_self=True)
            if link is None:
                await asyncio.sleep(RELINK_INTERVAL_S)
                continue
            if announced is not link:
                announced = link
                _log.info(
                    "carrying %d Session(s) to the leader at %s (term %d)",
                    relay.detached,
                    link.address,
                    link.term,
                )
            reattach = agent_pb2.CoordinatorMessage(
                reattach=agent_pb2.Reattach(term=link.term)
            ).SerializeToString()
            for held in relay.reattach(time.monotonic()):
                held.link = link
                held.inbox.put_nowait(reattach)
            wait_s = relay.next_reattach_s() - time.monotonic()
            await asyncio.sleep(min(RELINK_INTERVAL_S, max(0.0, wait_s)))

    def _end(self, held: _Held, reason: str) -> None:
        self._relay.released(held)
        held.inbox.put_nowait(
            replica_pb2.SessionEnd(code=grpc.StatusCode.UNAVAILABLE.value[0], reason=reason)
        )

    async def hold(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> bool:
        """Hold one agent's Session for as long as a leader serves it (or may again).

        Returns:
            False at once when there is no leader to forward to (the caller
            answers NotLeader, as a replica without fan-in does); True once
            the Session is over (ended as the leader ended it, or with
            UNAVAILABLE when it cannot be carried to a leader). Also False
            while the leader the election names is still taking over (it
            refused the link): holding the Session would put its agent in
            the paced Reattach queue behind the Sessions already held, where
            answering NotLeader lets it open a Session directly a moment
            later (measured: ``bench/README.md``, fan-in failover).
        """
        link = await self._link_for_new_session()
        if link is None:
            return False
        held = _Held()
        self._held.add(held)
        self._relay.held(held)
        link.open(held)
        observer = self._observer
        observer.forwarded_sessions("follower", 1)
        reader = asyncio.create_task(self._pump(requests, held))
        try:
            while True:
                item = await held.inbox.get()
                if isinstance(item, bytes):
                    await context.write(item)
                    continue
                if item.code == _OK:
                    return True
                await context.abort(_status(item.code), item.reason)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            self._held.discard(held)
            self._relay.released(held)
            if self._interregnum is not None:
                self._interregnum.ended(held)
            if held.link is not None and held.sid:
                held.link.forget(held.sid)
            observer.forwarded_sessions("follower", -1)

    async def _pump(self, requests: AsyncIterator[bytes], held: _Held) -> None:
        """The agent's messages, verbatim, onto its link; then the stream's end."""
        code, reason = grpc.StatusCode.OK, ""
        interregnum = self._interregnum
        try:
            async for raw in requests:
                message = _parse_agent_message(raw)
                if (
                    interregnum is not None
                    and message is not None
                    and message.WhichOneof("body") == "heartbeat"
                ):
                    interregnum.heartbeat(held, message.heartbeat)  # arrived, linked or not
                link = held.link
                route = self._relay.route(
                    held,
                    hello=message is not None and message.WhichOneof("body") == "hello",
                    link_open=link is not None and not link.closed,
                    attached=link is not None and bool(held.sid),
                )
                if route is Route.DETACH:
                    self._wake_reattacher()  # the awaited Hello, its link gone: next leader
                    continue
                if route is Route.DROP or link is None:
                    continue  # detached, or not the Hello awaited after a Reattach
                if route is Route.OPEN:
                    link.open(held)
                if message is not None and message.WhichOneof("body") == "heartbeat":
                    held.heard[message.heartbeat.seq] = time.monotonic()
                    while len(held.heard) > 64:
                        held.heard.pop(next(iter(held.heard)))
                    if convert.unknown_field_path(message) is None:
                        # A liveness digest entry; one the leader's schema would
                        # refuse goes verbatim, for the leader to refuse in its words.
                        link.send(
                            replica_pb2.ForwardEntry(
                                session_id=held.sid, heartbeat=message.heartbeat
                            )
                        )
                        continue
                link.send(replica_pb2.ForwardEntry(session_id=held.sid, message=raw))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the agent's stream broke
            code, reason = grpc.StatusCode.CANCELLED, f"the agent's stream broke: {exc}"
        if held.link is not None and held.sid and code is grpc.StatusCode.OK:
            # Half-closed: the leader answers what it still has, then ends the Session.
            held.link.send(_end(held.sid, code, reason))
            return
        # Broken, or nobody to wait for: end now (``hold`` ends the forwarded Session).
        held.inbox.put_nowait(replica_pb2.SessionEnd(code=code.value[0], reason=reason))

    async def close(self) -> None:
        """End every held Session (UNAVAILABLE: its agent reconnects elsewhere) and the link."""
        for held in list(self._held):
            self._end(held, "this replica is stopping; reconnect")
        if self._interregnum is not None:
            await self._interregnum.close()
        if self._reattacher is not None:
            self._reattacher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reattacher
        if self._link is not None:
            await self._link.close()
        await self._channels.close()


def _parse_agent_message(raw: bytes) -> agent_pb2.AgentMessage | None:
    try:
        return agent_pb2.AgentMessage.FromString(raw)
    except DecodeError:
        return None  # the leader refuses it with its own words


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
