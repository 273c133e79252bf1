"""DocumentService: the leader's shell around ``reconcile.hub.DocumentHub``.

Theory of operation: the hub decides; this module translates. It is wired in
three places, none of which decides anything:

- ``coordinator.session`` hands it the shared-document messages of every
  Session (DocumentInterest, DeltaBatch, DeltaAck, StateVectorReport) with
  the stream's :class:`~coordinator.runtime.Channel`, and tells it when a
  stream ends;
- it is part of the runtime's ``Observer`` (:class:`TeeObserver`): a
  leadership change builds a fresh hub and loads every canonical replica
  from Redis (``DocumentRecord`` at ``lazarus:doc:{<doc_id>}``) before any
  message is handled; the core's ``NodeRecovered`` and ``NodeJoined`` (with a
  previous incarnation) notices start a reconcile session for that node; its
  ``NodeDead`` and ``NodeLeft`` notices, and the retirement of a node's
  record, make the hub forget the node (``NodeGone``; safe because the
  node's next Session starts with a full state-vector exchange);
- a ticker (every :data:`TICK_S` while leading) feeds ``Tick``: debounced
  persistence of the canonical replicas, session retries and timeouts,
  metrics.

Commands run in order on the event loop: ``Send*`` are converted to
CoordinatorMessages and put on the node's channel; ``PersistDocument`` is
written to Redis by a background writer (latest state per document wins; a
failure feeds ``PersistFailed`` so the document is written again, a success
``DocumentPersisted`` with the state vector written, which the hub tells the
subscribed nodes in DocumentsPersisted); ``ReconcileStarted`` /
``ReconcileCompleted`` go to the event log (WatchEvents) and the metrics.

The store never rolls back. Each write is an optimistic transaction (WATCH
the key, GET it, MULTI / SET / EXEC, again if the key changed meanwhile): when
the stored replica holds operations the one to write lacks — a deposed
leader's late write, or a leader whose load from Redis failed — they are
merged in first, and fed to the hub (``DocumentLoaded``). So a stored state
vector, once written, is covered by every later one, whichever leader writes;
that is what lets a node drop its replica of a document once told the store
holds it (``node_agent.shared``, *Forgetting*). A record that does not parse,
or holds another kind, is overwritten as before (logged).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import grpc
import redis.asyncio as aioredis
from redis.exceptions import WatchError

from coordinator.core import CoordinatorCore, EmitEvent
from coordinator.core.limits import document_problem
from coordinator.core.notices import NodeDead, NodeJoined, NodeLeft, NodeRecovered
from coordinator.redisconn import redis_client
from coordinator.runtime import Channel, CoordinatorRuntime, Observer
from lazarus.storage.codecs import (
    CODEC,
    crdt_type,
    deltas_from_pb,
    deltas_to_pb,
    doc_states_from_pb,
    doc_states_to_pb,
)
from lazarus.storage.keys import document_key
from lazarus.v1 import agent_pb2, records_pb2
from reconcile.documents import Document, decode_document
from reconcile.hub import (
    CANONICAL_REPLICA_ID,
    AckReceived,
    DeltasReceived,
    DocumentHub,
    DocumentLoaded,
    DocumentPersisted,
    HubCommand,
    HubEvent,
    HubSettings,
    HubStats,
    InterestReceived,
    NodeDetached,
    NodeGone,
    PersistDocument,
    PersistFailed,
    ReconcileCompletedNotice,
    ReconcilePhase,
    ReconcileStartedNotice,
    ReconcileTrigger,
    ReconcileWanted,
    RefuseDocument,
    SendAck,
    SendDeltaRequest,
    SendDeltas,
    SendPersisted,
    SendReconcileDone,
    SendReconcileRequest,
    StateVectorsReported,
    Tick,
)
from reconcile.vclock import VectorClock

__all__ = [
    "DOCUMENT_MESSAGES",
    "DocumentObserver",
    "DocumentService",
    "TeeObserver",
    "encode_record",
]

_log = logging.getLogger("lazarus.coordinator.documents")

TICK_S = 0.1
"""Cadence of the hub's Tick while leading, seconds."""

LOAD_TIMEOUT_S = 10.0
"""Longest a message waits for the canonical replicas to be loaded."""

WRITE_ATTEMPTS = 5
"""Optimistic transactions tried for one write when the key keeps changing under it."""

DOCUMENT_MESSAGES = frozenset(
    {"document_interest", "delta_batch", "delta_ack", "state_vector_report"}
)
"""AgentMessage bodies handled here."""

_POLICY = {
    "lww": records_pb2.RESOLUTION_POLICY_LWW_HLC,
    "siblings": records_pb2.RESOLUTION_POLICY_KEEP_SIBLINGS,
}


def encode_record(cmd: PersistDocument, now_ms: int) -> bytes:
    """The DocumentRecord of a canonical replica, with its SHA-256 checksum."""
    record = records_pb2.DocumentRecord(
        doc_id=cmd.doc_id,
        crdt_type=crdt_type(cmd.kind),  # type: ignore[arg-type]
        state=cmd.state,
        codec=CODEC,
        op_count=cmd.op_count,
        updated_at_unix_ms=now_ms,
        checksum_algorithm=records_pb2.CHECKSUM_ALGORITHM_SHA256,
    )
    record.state_vector.counters.update(cmd.state_vector.as_dict())
    record.checksum = hashlib.sha256(record.SerializeToString(deterministic=True)).digest()
    return record.SerializeToString()


def decode_record(data: bytes) -> records_pb2.DocumentRecord:
    """Parse a DocumentRecord and check its checksum.

    Raises:
        ValueError: unparsable bytes, unknown codec or a checksum mismatch.
    """
    record = records_pb2.DocumentRecord.FromString(data)
    digest = record.checksum
    record.checksum = b""
    if hashlib.sha256(record.SerializeToString(deterministic=True)).digest() != digest:
        raise ValueError(f"document record {record.doc_id!r}: checksum mismatch")
    record.checksum = digest
    if record.codec != CODEC:
        raise ValueError(f"document record {record.doc_id!r}: unknown codec {record.codec!r}")
    return record


@runtime_checkable
class DocumentObserver(Protocol):
    """Receives shared-document facts for metrics (``coordinator.metrics.Metrics``)."""

    def documents_observed(self, stats: HubStats) -> None:
        """The hub's numbers now."""

    def reconcile_completed(self, seconds: float, converged: bool) -> None:
        """A reconcile session ended."""


class TeeObserver:
    """An ``Observer`` that reports to ``inner`` and to the document service."""

    def __init__(self, inner: Observer | None, documents: DocumentService) -> None:
        self._inner = inner
        self._documents = documents

    def leadership_changed(self, leading: bool, term: int) -> None:
        """Forwarded to both."""
        if self._inner is not None:
            self._inner.leadership_changed(leading, term)
        self._documents.leadership_changed(leading, term)

    def leader_observed(self, key: str, term: int) -> None:
        """Forwarded."""
        if self._inner is not None:
            self._inner.leader_observed(key, term)

    def heartbeats_received(self, node_ids: Sequence[str], now_s: float) -> None:
        """Forwarded."""
        if self._inner is not None:
            self._inner.heartbeats_received(node_ids, now_s)

    def event_emitted(self, event: EmitEvent) -> None:
        """Forwarded to both."""
        if self._inner is not None:
            self._inner.event_emitted(event)
        self._documents.event_emitted(event)

    def nodes_retired(self, node_ids: Sequence[str]) -> None:
        """Forwarded to both."""
        if self._inner is not None:
            self._inner.nodes_retired(node_ids)
        self._documents.nodes_retired(node_ids)

    def etcd_write(self, seconds: float, ok: bool) -> None:
        """Forwarded."""
        if self._inner is not None:
            self._inner.etcd_write(seconds, ok)

    def state_changed(self, core: CoordinatorCore) -> None:
        """Forwarded."""
        if self._inner is not None:
            self._inner.state_changed(core)


class DocumentService:
    """Shared documents on the leader; see the module docstring.

    Args:
        redis_url: the Redis holding canonical replicas.
        redis_password, redis_ca_file: its AUTH password and the CA of a
            ``rediss://`` URL ("" = none / system roots).
        metrics: receives numbers (None: none).
        settings: the hub's tunables.
        prefix: Redis key prefix.
    """

    def __init__(
        self,
        redis_url: str,
        *,
        redis_password: str = "",
        redis_ca_file: str = "",
        metrics: DocumentObserver | None = None,
        settings: HubSettings | None = None,
        prefix: str = "lazarus",
    ) -> None:
        self.redis_url = redis_url
        self._redis_password = redis_password
        self._redis_ca_file = redis_ca_file
        self.metrics = metrics
        self.settings = settings or HubSettings()
        self.prefix = prefix
        self.runtime: CoordinatorRuntime | None = None
        self.hub: DocumentHub | None = None
        self._redis: aioredis.Redis | None = None
        self._ready = asyncio.Event()
        self._channels: dict[str, Channel] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._dirty: dict[str, PersistDocument] = {}
        self._wake = asyncio.Event()
        self._generation = 0

    def attach(self, runtime: CoordinatorRuntime) -> None:
        """Bind to the runtime whose event log receives ReconcileStarted / Completed."""
        self.runtime = runtime

    def _client(self) -> aioredis.Redis:
        if self._redis is None:
            self._redis = redis_client(
                self.redis_url,
                password=self._redis_password,
                ca_file=self._redis_ca_file,
                timeout_s=2.0,
            )
        return self._redis

    async def close(self) -> None:
        """Stop the background tasks and close Redis."""
        self._stop_tasks()
        if self._redis is not None:
            with contextlib.suppress(Exception):
                await self._redis.aclose()
            self._redis = None

    def _stop_tasks(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._tasks = []

    # ---- observer side (called synchronously inside the runtime's lock) --------------

    def leadership_changed(self, leading: bool, term: int) -> None:
        """A leadership began (fresh hub, load from Redis) or ended (drop everything)."""
        self._stop_tasks()
        self._channels.clear()
        self._dirty.clear()
        self._ready = asyncio.Event()
        self._generation += 1
        if not leading:
            self.hub = None
            return
        self.hub = DocumentHub(self.settings, term=term)
        generation = self._generation
        self._tasks = [
            asyncio.create_task(self._load(generation), name="documents-load"),
            asyncio.create_task(self._tick_loop(generation), name="documents-tick"),
            asyncio.create_task(self._writer(generation), name="documents-writer"),
        ]

    def event_emitted(self, event: EmitEvent) -> None:
        """NodeRecovered / NodeJoined (new incarnation) start a reconcile session;
        NodeDead / NodeLeft make the hub forget the node (``NodeGone``)."""
        body = event.body
        if isinstance(body, NodeDead | NodeLeft):
            if self.hub is not None:
                self._step(NodeGone(body.node_id, _now()))
            return
        node_id = ""
        if isinstance(body, NodeRecovered) or (
            isinstance(body, NodeJoined) and body.previous_incarnation
        ):
            node_id = body.node_id
        if node_id and self.hub is not None:
            self._step(ReconcileWanted((node_id,), ReconcileTrigger.NODE_RECONNECTED, _now()))

    def nodes_retired(self, node_ids: Sequence[str]) -> None:
        """The core retired these nodes' records: the hub forgets them (``NodeGone``)."""
        if self.hub is None:
            return
        now = _now()
        for node_id in node_ids:
            self._step(NodeGone(node_id, now))

    # ---- session side ------------------------------------------------------------------

    async def receive(self, channel: Channel, message: agent_pb2.AgentMessage) -> None:
        """A shared-document message from a node's Session."""
        if self.hub is None or channel.closed:
            return  # a replaced (or ending) stream: its late messages are stale
        if not self._ready.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LOAD_TIMEOUT_S):
                    await self._ready.wait()
        if not self._has_hub() or channel.closed:  # leadership ended, or a newer stream
            return
        problem = _document_message_problem(message)
        if problem:  # over an intake limit: that Session only ends
            _log.warning("session %s: %s", channel.session_id, problem)
            channel.close(grpc.StatusCode.INVALID_ARGUMENT, problem)
            return
        node_id = channel.node_id
        self._channels[node_id] = channel
        which = message.WhichOneof("body")
        now = _now()
        event: HubEvent
        if which == "document_interest":
            di = message.document_interest
            event = InterestReceived(
                node_id,
                doc_states_from_pb(di.subscribe),
                tuple(di.unsubscribe_doc_ids),
                now,
            )
        elif which == "delta_batch":
            db = message.delta_batch
            event = DeltasReceived(
                node_id, db.batch_id, deltas_from_pb(db.deltas), db.session_id, now
            )
        elif which == "delta_ack":
            da = message.delta_ack
            event = AckReceived(node_id, da.batch_id, doc_states_from_pb(da.merged), now)
        elif which == "state_vector_report":
            sr = message.state_vector_report
            if sr.phase not in (agent_pb2.RECONCILE_PHASE_GATHER, agent_pb2.RECONCILE_PHASE_VERIFY):
                return
            event = StateVectorsReported(
                node_id,
                sr.session_id,
                ReconcilePhase(int(sr.phase)),
                doc_states_from_pb(sr.documents),
                now,
            )
        else:
            return
        self._step(event)

    def _has_hub(self) -> bool:
        return self.hub is not None

    def detached(self, channel: Channel) -> None:
        """A Session stream ended."""
        if self._channels.get(channel.node_id) is channel:
            del self._channels[channel.node_id]
            if self.hub is not None:
                self._step(NodeDetached(channel.node_id, _now()))

    # ---- stepping ------------------------------------------------------------------------

    def _step(self, event: HubEvent) -> None:
        hub = self.hub
        if hub is None:
            return
        for cmd in hub.step(event):
            self._run(cmd)

    def _run(self, cmd: HubCommand) -> None:
        if isinstance(cmd, PersistDocument):
            self._dirty[cmd.doc_id] = cmd
            self._wake.set()
            return
        if isinstance(cmd, ReconcileStartedNotice):
            self._event(
                records_pb2.Event(
                    reconcile_started=records_pb2.ReconcileStarted(
                        session_id=cmd.session_id,
                        trigger=cmd.trigger.value,  # type: ignore[arg-type]
                        node_ids=list(cmd.node_ids),
                        doc_ids=list(cmd.doc_ids),
                    )
                )
            )
            _log.info(
                "reconcile %s started for %s (%s)",
                cmd.session_id,
                ",".join(cmd.node_ids),
                cmd.trigger.name,
            )
            return
        if isinstance(cmd, ReconcileCompletedNotice):
            self._completed(cmd)
            return
        if isinstance(cmd, RefuseDocument):
            _log.warning("node %s: document %s refused: %s", cmd.node_id, cmd.doc_id, cmd.reason)
            return
        channel = self._channels.get(cmd.node_id)
        if channel is None:
            return
        msg = agent_pb2.CoordinatorMessage()
        if isinstance(cmd, SendDeltas):
            msg.delta_batch.session_id = cmd.session_id
            msg.delta_batch.batch_id = cmd.batch_id
            msg.delta_batch.last = cmd.last
            deltas_to_pb(cmd.deltas, "coordinator", msg.delta_batch.deltas)
        elif isinstance(cmd, SendAck):
            msg.delta_ack.batch_id = cmd.batch_id
            doc_states_to_pb(cmd.merged, msg.delta_ack.merged)
        elif isinstance(cmd, SendPersisted):
            msg.documents_persisted.SetInParent()
            doc_states_to_pb(cmd.persisted, msg.documents_persisted.documents)
        elif isinstance(cmd, SendDeltaRequest):
            msg.delta_request.session_id = cmd.session_id
            doc_states_to_pb(cmd.have, msg.delta_request.have)
        elif isinstance(cmd, SendReconcileRequest):
            rr = msg.reconcile_request
            rr.session_id = cmd.session_id
            rr.trigger = cmd.trigger.value  # type: ignore[assignment]
            rr.phase = cmd.phase.value  # type: ignore[assignment]
        elif isinstance(cmd, SendReconcileDone):
            rd = msg.reconcile_done
            rd.session_id = cmd.session_id
            rd.converged = cmd.converged
            rd.documents = cmd.documents
            rd.conflicts = cmd.conflicts
            rd.duration_ms = int(cmd.duration_s * 1000)
        channel.put(msg)

    def _completed(self, cmd: ReconcileCompletedNotice) -> None:
        body = records_pb2.ReconcileCompleted(
            session_id=cmd.session_id,
            trigger=cmd.trigger.value,  # type: ignore[arg-type]
            node_ids=list(cmd.node_ids),
            documents=cmd.documents,
            deltas=cmd.deltas,
            conflicts=cmd.conflict_count,
            duration_ms=int(cmd.duration_s * 1000),
            converged=cmd.converged,
        )
        for c in cmd.conflicts:
            body.conflict_details.add(
                doc_id=c.doc_id,
                key=c.key,
                policy=_POLICY.get(c.policy, records_pb2.RESOLUTION_POLICY_CRDT_MERGE),
                sibling_count=c.sibling_count,
                winner_node_id=c.winner,
            )
        self._event(records_pb2.Event(reconcile_completed=body))
        if self.metrics is not None:
            self.metrics.reconcile_completed(cmd.duration_s, cmd.converged)
        fields = {
            "event": "reconcile_completed",
            "session_id": cmd.session_id,
            "trigger": cmd.trigger.name,
            "nodes": list(cmd.node_ids),
            "documents": cmd.documents,
            "deltas": cmd.deltas,
            "conflicts": cmd.conflict_count,
            "seconds": round(cmd.duration_s, 3),
            "converged": cmd.converged,
        }
        _log.info(
            "reconcile %s completed: converged=%s documents=%d deltas=%d conflicts=%d in %.3f s",
            cmd.session_id,
            cmd.converged,
            cmd.documents,
            cmd.deltas,
            cmd.conflict_count,
            cmd.duration_s,
            extra={"lazarus": fields},
        )

    def _event(self, event: records_pb2.Event) -> None:
        runtime = self.runtime
        if runtime is None or not runtime.leading:
            return
        event.occurred_at_unix_ms = int(time.time() * 1000)
        with contextlib.suppress(Exception):
            runtime.event_log.append(event)

    # ---- background ------------------------------------------------------------------------

    async def _load(self, generation: int) -> None:
        """Read every canonical replica from Redis into the fresh hub, then open the gate."""
        loaded = 0
        try:
            client = self._client()
            pattern = document_key("*", self.prefix)
            async for key in client.scan_iter(match=pattern, count=500):
                data = await client.get(key)
                if data is None or generation != self._generation:
                    continue
                try:
                    record = decode_record(data if isinstance(data, bytes) else data.encode())
                    doc = decode_document(bytes(record.state))
                except ValueError as exc:
                    _log.error("canonical document %r unreadable, skipped: %s", key, exc)
                    continue
                self._step(DocumentLoaded(record.doc_id, doc, _now()))
                loaded += 1
        except Exception as exc:  # Redis down: nodes' interest rebuilds the canonical replicas
            _log.warning("loading shared documents from Redis failed: %s", exc)
        if generation == self._generation:
            self._ready.set()
            _log.info("shared documents: %d canonical replica(s) loaded", loaded)

    async def _tick_loop(self, generation: int) -> None:
        while generation == self._generation:
            await asyncio.sleep(TICK_S)
            self._step(Tick(_now()))
            if self.metrics is not None and self.hub is not None:
                self.metrics.documents_observed(self.hub.stats())

    async def _writer(self, generation: int) -> None:
        while generation == self._generation:
            await self._wake.wait()
            self._wake.clear()
            batch, self._dirty = self._dirty, {}
            for doc_id, cmd in sorted(batch.items()):
                try:
                    written, stored = await self._write(cmd)
                except Exception as exc:
                    _log.warning("writing canonical document %s failed: %s", doc_id, exc)
                    if generation == self._generation:
                        self._step(PersistFailed(doc_id, _now()))
                    await asyncio.sleep(0.5)
                    continue
                if generation != self._generation:
                    continue  # another leadership's hub: it loads from Redis itself
                if stored is not None:  # operations only the store held: the hub takes them
                    self._step(DocumentLoaded(doc_id, stored, _now()))
                self._step(DocumentPersisted(doc_id, written, _now()))

    async def _write(self, cmd: PersistDocument) -> tuple[VectorClock, Document | None]:
        """Write ``cmd``'s replica merged with the stored one (module docstring).

        Returns:
            ``(state vector written, the stored replica)``; the stored replica
            only when it held operations ``cmd`` lacks (they were merged in).

        Raises:
            Exception: Redis failed, or the key changed under every one of
                :data:`WRITE_ATTEMPTS` transactions.
        """
        key = document_key(cmd.doc_id, self.prefix)
        client = self._client()
        for _ in range(WRITE_ATTEMPTS):
            async with client.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(key)
                    stored = _stored_document(cmd, await pipe.get(key))
                    record, merged = cmd, None
                    if stored is not None and not cmd.state_vector.descends(stored.state_vector()):
                        doc = decode_document(cmd.state, CANONICAL_REPLICA_ID)
                        doc.merge(stored)
                        sv = doc.state_vector()
                        record = PersistDocument(cmd.doc_id, cmd.kind, doc.encode(), sv, sv.total())
                        merged = stored
                    pipe.multi()  # type: ignore[no-untyped-call]
                    pipe.set(key, encode_record(record, _now_ms()))
                    await pipe.execute()
                except WatchError:
                    continue  # written meanwhile: read it again
                return record.state_vector, merged
        raise RuntimeError(f"{key} changed under {WRITE_ATTEMPTS} writes in a row")


def _stored_document(cmd: PersistDocument, data: bytes | str | None) -> Document | None:
    """The replica a stored DocumentRecord holds, when it can be merged with ``cmd``'s."""
    if data is None:
        return None
    try:
        record = decode_record(data if isinstance(data, bytes) else data.encode())
        doc = decode_document(bytes(record.state))
    except ValueError as exc:
        _log.error("canonical document %s in Redis unreadable, overwritten: %s", cmd.doc_id, exc)
        return None
    if doc.kind != cmd.kind:
        _log.error(
            "canonical document %s in Redis is a %s, not a %s: overwritten",
            cmd.doc_id,
            doc.kind,
            cmd.kind,
        )
        return None
    return doc


def _now() -> float:
    return time.monotonic()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _document_message_problem(message: agent_pb2.AgentMessage) -> str:
    """The intake-limit problem of a shared-document message (``coordinator.core.limits``)."""
    which = message.WhichOneof("body")
    states: list[records_pb2.DocumentStateVector] = []
    field = str(which)
    if which == "document_interest":
        di = message.document_interest
        problem = document_problem(
            "document_interest.unsubscribe_doc_ids", list(di.unsubscribe_doc_ids)
        )
        if problem:
            return problem
        states, field = list(di.subscribe), "document_interest.subscribe"
    elif which == "delta_batch":
        deltas = message.delta_batch.deltas
        return document_problem(
            "delta_batch.deltas",
            [d.doc_id for d in deltas],
            vector_sizes=[max(len(d.since.counters), len(d.until.counters)) for d in deltas],
            delta_sizes_bytes=[len(d.ops) for d in deltas],
        )
    elif which == "delta_ack":
        states, field = list(message.delta_ack.merged), "delta_ack.merged"
    elif which == "state_vector_report":
        states, field = list(message.state_vector_report.documents), "state_vector_report.documents"
    ids = [s.doc_id for s in states]
    return document_problem(field, ids, vector_sizes=[len(s.state_vector.counters) for s in states])
