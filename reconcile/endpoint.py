"""ReplicaEndpoint: a node agent's side of the shared-document protocol — pure.

Theory of operation
-------------------
A node agent holds one replica per shared document, all under one replica id
(``<node_id>~<token>``, the token persisted with the replicas so a restarted
agent keeps its id and a wiped one gets a new id, as
:mod:`reconcile.documents` requires). This class keeps those replicas and the
protocol bookkeeping; the agent shell (``node_agent/shared.py``) adds
durability (SQLite) and the Session. The ordering rule, as in raft's
``Ready``: *persist before send* — a local operation's delta and a merged
remote delta are made durable by the shell before anything derived from them
(a DeltaBatch, a DeltaAck) leaves the node.

* Local operations: :meth:`apply` runs the op on the replica and returns its
  delta; once durable the shell calls :meth:`enqueue`; :meth:`take_batch`
  hands out up to ``max_ops`` queued deltas as one batch with a fresh
  ``batch_id``. A batch stays *pending* until the leader's DeltaAck; when the
  ack's state vector does not cover what the batch carried (the leader could
  not merge it yet) :meth:`on_ack` returns ``delta_since(acked)`` to send.
* After every Welcome :meth:`interest` lists every replica's state vector
  (DocumentInterest); pending batches are forgotten — the leader answers the
  interest with a DeltaRequest for whatever it lacks, which supersedes them.
* Remote deltas (:meth:`merge`): joined in; a delta that cannot be merged yet
  is skipped and the ack shows the replica's state vector, from which the
  leader resends.
* :meth:`answer_request` answers a DeltaRequest; :meth:`report` a
  ReconcileRequest.
* Shipped (:meth:`shipped`): every state vector the leader reports of its
  canonical replica in this Session (a DeltaAck's ``merged``, the
  ``state_vector`` of each delta it sends, a DeltaRequest's ``have``) is
  joined into ``confirmed``; a replica is shipped when that join covers its
  own state vector — every operation it holds is in the canonical replica.
  The joins are cleared after a Welcome (:meth:`interest`) and when the
  Session ends (:meth:`clear_confirmed`): a new leader must confirm again.
* Persisted (:meth:`persisted`): the state vectors the leader says its store
  (Redis) holds (DocumentsPersisted, :meth:`on_persisted`) are joined the
  same way, per Session; a replica is persisted when that join covers its
  own state vector — every operation it holds is durable in the canonical
  store, which never rolls back, so the next leader loads it. Only a
  persisted replica may be dropped (:meth:`drop`); shipped alone is not
  enough, since the leader confirms merges from memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .documents import Delta, Document, Operation, new_document
from .hub import DocDelta, DocState
from .vclock import VectorClock

__all__ = ["Batch", "ReplicaEndpoint"]


@dataclass(frozen=True, slots=True)
class Batch:
    """A DeltaBatch to send."""

    batch_id: int
    deltas: tuple[DocDelta, ...]
    session_id: str = ""
    last: bool = True


@dataclass(slots=True)
class _Pending:
    expected: dict[str, VectorClock] = field(default_factory=dict)


class ReplicaEndpoint:
    """A node's replicas of shared documents and their protocol state.

    Args:
        replica_id: this node's replica id (stable across restarts of one data dir).
        max_ops: most deltas per outgoing batch.
    """

    def __init__(self, replica_id: str, *, max_ops: int = 64) -> None:
        self.replica_id = replica_id
        self.max_ops = max_ops
        self.docs: dict[str, Document] = {}
        self._queue: list[DocDelta] = []
        self._pending: dict[int, _Pending] = {}
        self._next_batch = 1
        self._confirmed: dict[str, VectorClock] = {}
        self._persisted: dict[str, VectorClock] = {}

    # ---- replicas ----------------------------------------------------------------

    def open(self, doc_id: str, kind: str) -> Document:
        """The replica of ``doc_id`` (created empty when new).

        Raises:
            ValueError: ``kind`` is unknown, or the document exists with another kind.
        """
        doc = self.docs.get(doc_id)
        if doc is None:
            doc = self.docs[doc_id] = new_document(kind, self.replica_id)
        elif doc.kind != kind:
            raise ValueError(f"shared document {doc_id!r} is a {doc.kind}, not a {kind}")
        return doc

    def adopt(self, doc_id: str, doc: Document) -> None:
        """Install a replica loaded from durable storage."""
        self.docs[doc_id] = doc

    def drop(self, doc_id: str) -> None:
        """Forget the replica of ``doc_id`` (and its queued deltas); see :meth:`persisted`."""
        self.docs.pop(doc_id, None)
        self._confirmed.pop(doc_id, None)
        self._persisted.pop(doc_id, None)
        self._queue = [dd for dd in self._queue if dd.doc_id != doc_id]

    def shipped(self, doc_id: str) -> bool:
        """True when the leader confirmed, in this Session, every operation of ``doc_id``.

        A replica that does not exist, or holds no operation, is shipped.
        """
        doc = self.docs.get(doc_id)
        if doc is None:
            return True
        return self._confirmed.get(doc_id, VectorClock()).descends(doc.state_vector())

    def persisted(self, doc_id: str) -> bool:
        """True when the leader said, in this Session, its store holds all of ``doc_id``.

        A replica that does not exist, or holds no operation, is persisted.
        """
        doc = self.docs.get(doc_id)
        if doc is None or not doc.state_vector():
            return True
        return self._persisted.get(doc_id, VectorClock()).descends(doc.state_vector())

    def on_persisted(self, stored: Iterable[DocState]) -> None:
        """The leader's DocumentsPersisted: its store holds these state vectors (held docs only)."""
        for ds in stored:
            if ds.doc_id not in self.docs:
                continue
            have = self._persisted.get(ds.doc_id)
            sv = ds.state_vector
            self._persisted[ds.doc_id] = sv if have is None else have.merge(sv)

    def clear_confirmed(self) -> None:
        """The Session ended: what the leader confirmed (merged, persisted) must be again."""
        self._confirmed.clear()
        self._persisted.clear()

    def _confirm(self, doc_id: str, canonical: VectorClock) -> None:
        have = self._confirmed.get(doc_id)
        self._confirmed[doc_id] = canonical if have is None else have.merge(canonical)

    def apply(self, doc_id: str, op: Operation) -> Delta:
        """Run a local operation on an open replica; return its delta (persist, then enqueue).

        Raises:
            KeyError: the document is not open.
            TypeError / ValueError: as ``Document.apply``.
        """
        return self.docs[doc_id].apply(op)

    # ---- outgoing ----------------------------------------------------------------

    def enqueue(self, doc_id: str, delta: Delta) -> None:
        """Queue a durable local delta for the leader."""
        self._queue.append(DocDelta(doc_id, delta))

    @property
    def queued(self) -> int:
        """Deltas waiting for a batch."""
        return len(self._queue)

    @property
    def pending(self) -> int:
        """Batches sent and not acknowledged."""
        return len(self._pending)

    def take_batch(self, session_id: str = "") -> Batch | None:
        """Up to ``max_ops`` queued deltas as a batch (now pending), or None."""
        if not self._queue:
            return None
        deltas, self._queue = self._queue[: self.max_ops], self._queue[self.max_ops :]
        return self._batch(deltas, session_id)

    def _batch(self, deltas: list[DocDelta], session_id: str = "", last: bool = True) -> Batch:
        batch_id = self._next_batch
        self._next_batch += 1
        pending = _Pending()
        for dd in deltas:
            have = pending.expected.get(dd.doc_id, VectorClock())
            pending.expected[dd.doc_id] = have.merge(dd.delta.state_vector)
        self._pending[batch_id] = pending
        while len(self._pending) > 4096:
            self._pending.pop(min(self._pending))
        return Batch(batch_id, tuple(deltas), session_id, last)

    def interest(self) -> tuple[DocState, ...]:
        """State vectors of every replica (DocumentInterest after a Welcome)."""
        self._pending.clear()
        self._queue.clear()  # the leader's DeltaRequest will ask for all of it
        self._confirmed.clear()  # maybe another leader: it confirms afresh
        self._persisted.clear()
        return self.states(self.docs)

    def states(self, doc_ids: Iterable[str]) -> tuple[DocState, ...]:
        """State vectors of the named replicas that exist, sorted by id."""
        out = []
        for doc_id in sorted(set(doc_ids)):
            doc = self.docs.get(doc_id)
            if doc is not None:
                out.append(DocState(doc_id, doc.kind, doc.state_vector()))
        return tuple(out)

    def on_ack(self, batch_id: int, merged: Iterable[DocState]) -> Batch | None:
        """The leader's DeltaAck; returns a batch to resend when it lacks part of ours."""
        merged = list(merged)
        for ds in merged:  # the canonical replica's state vectors
            self._confirm(ds.doc_id, ds.state_vector)
        pending = self._pending.pop(batch_id, None)
        if pending is None:
            return None
        resend: list[DocDelta] = []
        for ds in merged:
            want = pending.expected.get(ds.doc_id)
            doc = self.docs.get(ds.doc_id)
            if want is None or doc is None or ds.state_vector.descends(want):
                continue
            resend.append(DocDelta(ds.doc_id, doc.delta_since(ds.state_vector)))
        return self._batch(resend) if resend else None

    def answer_request(self, session_id: str, have: Iterable[DocState]) -> Batch:
        """Answer a DeltaRequest: every operation not covered by ``have``."""
        deltas = []
        for ds in sorted(have, key=lambda d: d.doc_id):
            self._confirm(ds.doc_id, ds.state_vector)
            doc = self.docs.get(ds.doc_id)
            if doc is None or doc.kind != ds.kind:
                continue
            delta = doc.delta_since(ds.state_vector)
            if not delta.is_empty():
                deltas.append(DocDelta(ds.doc_id, delta))
        return self._batch(deltas, session_id, last=True)

    # ---- incoming ------------------------------------------------------------------

    def merge(self, deltas: Iterable[DocDelta]) -> tuple[list[DocDelta], tuple[DocState, ...]]:
        """Join remote deltas; return ``(merged deltas to persist, ack state vectors)``.

        A delta for an unknown document opens it with the delta's kind; one of
        another kind, or one that cannot be merged yet, is skipped (the ack's
        state vector then tells the leader where to resend from).
        """
        merged: list[DocDelta] = []
        touched: set[str] = set()
        for dd in deltas:
            self._confirm(dd.doc_id, dd.delta.state_vector)  # what the sender holds
            doc = self.docs.get(dd.doc_id)
            if doc is None:
                doc = self.docs[dd.doc_id] = new_document(dd.delta.kind, self.replica_id)
            touched.add(dd.doc_id)
            if doc.kind != dd.delta.kind:
                continue
            before = doc.state_vector()
            if doc.merge_delta(dd.delta) and doc.state_vector() != before:
                merged.append(dd)
        return merged, self.states(touched)

    def report(self, doc_ids: Iterable[str]) -> tuple[DocState, ...]:
        """State vectors for a ReconcileRequest (empty ``doc_ids``: every replica)."""
        wanted = list(doc_ids)
        return self.states(wanted if wanted else self.docs)
