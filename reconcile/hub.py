"""DocumentHub: the leader's canonical replicas of shared CRDT documents — pure.

Theory of operation
-------------------
The leader keeps one *canonical* replica per document (``shared/<name>``)
and, per node agent, what it knows of that node's replica: the last state
vector the node reported (interest, state-vector report, ack) and the state
vector it should reach once everything shipped to it is merged (``shipped``).
The hub is a state machine in the style of ``coordinator/core``: the shell
calls :meth:`DocumentHub.step` with an event (a past-tense fact) and carries
the returned commands out in order; time enters as ``now_s`` on each event.
No IO, no clocks, no randomness.

Live traffic (the shared-document protocol of ``agent.proto``):

* ``InterestReceived`` (the node's DocumentInterest after each Welcome, and
  for each document it opens): the hub answers with one DeltaBatch holding
  ``delta_since(node_sv)`` of every subscribed document (empty where the node
  lacks nothing: the node then knows it is in sync), and asks with a
  ``DeltaRequest`` for every document where the node holds operations the
  canonical replica lacks.
* ``DeltasReceived`` (a node's DeltaBatch): each delta is joined into the
  canonical replica; the batch is answered with ``SendAck`` carrying the
  canonical state vectors. A delta that cannot be merged yet (its ``base`` is
  not covered) changes nothing; the ack then shows a state vector below what
  the node sent, and the node resends ``delta_since(acked)``. Merged deltas
  fan out to every other attached node interested in the document: the same
  delta when that node's ``shipped`` vector covers its base, else
  ``delta_since(shipped)``.
* ``AckReceived`` (a node's DeltaAck of a batch the hub sent): when the
  node's reported state vector does not cover what the batch should have
  brought (a refused delta, or one lost), the hub ships
  ``delta_since(reported)`` again.

Because every merge is a join and every refusal is answered by a resend from
the receiver's own state vector, duplicated, reordered and dropped messages
only delay convergence; they never lose or double an operation.

Reconcile sessions (DESIGN.md §9): started for a node that reconnects after
SUSPECT/DEAD (``ReconcileWanted``, from the coordinator core's NodeRecovered /
NodeJoined notices) and for every node on its first interest after a leader
change. Phases per node: GATHER (``ReconcileRequest`` -> ``StateVectorReport``;
the hub ships what the node lacks and requests what it lacks), then VERIFY
once the hub's own knowledge says the node covers the session's *target* —
the join of the canonical state vector and the node's gathered one. VERIFY
passes when the node reports state vectors covering the target and the
canonical replica covers it too; with no writes during the session that is
"every replica reports the same state vector", and under live writes it
still proves every operation either side held at GATHER time is now on both.
Requests are re-sent every ``retry_s`` until answered; a session that does
not verify in ``session_timeout_s`` ends with ``converged=False``. Each session
emits ``ReconcileStartedNotice`` / ``ReconcileCompletedNotice`` and sends the
node ``ReconcileDone``.

Conflicts: a merge into the canonical replica that meets concurrent writes of
one key is counted and listed (:class:`Conflict`) with the policy that
resolved it (``lww-map``: last writer by HLC; ``mv-map``: siblings kept).
Concurrent means the incoming write's writer had not seen the canonical
replica's current value of the key, judged by the writer's knowledge as the
hub knows it: the state vector the node reported when the hub asked for the
delta (a healed partition), else the one it last reported or acknowledged (a
live write racing its writer's own ack of the overwritten value may be
counted too). Conflicts found while a node has no session are handed to its
next session (the heal's traffic often arrives just before NodeRecovered).

Forgetting nodes: the hub keeps per node its interest and state vectors (of
the order of documents x clock entries). ``NodeGone`` (the coordinator core
judged the node DEAD or LEFT, or retired its record) forgets the node once
its Session has ended (at once when it is detached, else at its
``NodeDetached``). That is safe because a DEAD or LEFT node's Session is
over, and every later Session of that node starts with a DocumentInterest
carrying the node's state vector of every document it holds (after each
Welcome): a full state-vector exchange that rebuilds ``known`` and
``shipped`` and ships whatever the node missed, as after a leader change.
What a forgotten node loses is bookkeeping only: conflicts met outside a
session are no longer handed to its next session (they stay counted in
``conflicts_total``), and a returning node that no NodeRecovered /
NodeJoined notice gives a reconcile session gets the LEADER_CHANGED one of a
first interest. Without this, pods re-created under new names (a DaemonSet
rollout) would pile up here for the leader's whole term.

Persistence: every change marks the document dirty; ``Tick`` emits
``PersistDocument`` (the canonical replica's encoding) at most once per
``persist_debounce_s`` per document. The shell answers a failed write with
``PersistFailed`` and the document is written again later, a successful one
with ``DocumentPersisted`` (the state vector the store now holds: the shell
merges what the store held into what it writes, so the store never rolls
back). The hub keeps, per document, the join of the state vectors the store
is known to hold (``DocumentLoaded`` counts: it was read from there), and on
``Tick`` tells every attached node subscribed to a document whose stored
state vector grew, or which it subscribed to anew, that state vector
(``SendPersisted``: per node and tick one command, or more of at most
``documents_per_message`` documents each) — only when it covers what the node
is known to hold, since a node may drop a replica (a forgotten task's
document) only once the store holds all of it. Bounded: a document is written
at most once per ``persist_debounce_s``, and a node hears of each stored
state vector at most once per Session.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .documents import KINDS, Delta, Document, LWWMap, MVMap, new_document
from .vclock import VectorClock

__all__ = [
    "CANONICAL_REPLICA_ID",
    "AckReceived",
    "Conflict",
    "DeltasReceived",
    "DocDelta",
    "DocState",
    "DocumentHub",
    "DocumentLoaded",
    "DocumentPersisted",
    "HubCommand",
    "HubEvent",
    "HubSettings",
    "HubStats",
    "InterestReceived",
    "NodeDetached",
    "NodeGone",
    "PersistDocument",
    "PersistFailed",
    "ReconcileCompletedNotice",
    "ReconcilePhase",
    "ReconcileStartedNotice",
    "ReconcileTrigger",
    "ReconcileWanted",
    "RefuseDocument",
    "SendAck",
    "SendDeltaRequest",
    "SendDeltas",
    "SendPersisted",
    "SendReconcileDone",
    "SendReconcileRequest",
    "StateVectorsReported",
    "Tick",
]

CANONICAL_REPLICA_ID = "canonical"
"""Replica id of the hub's replicas (they never issue operations of their own)."""

_ANSWERED = float("-inf")
"""``_Session.requested_s`` once the GATHER request was answered."""

MAX_CONFLICT_DETAILS = 100
"""Conflicts listed per session (ReconcileCompleted.conflict_details)."""


class ReconcilePhase(enum.Enum):
    """Phase of a reconcile request (agent.proto ReconcilePhase)."""

    GATHER = 1
    VERIFY = 2


class ReconcileTrigger(enum.Enum):
    """Why a session runs (records.proto ReconcileTrigger)."""

    NODE_RECONNECTED = 1
    LEADER_CHANGED = 2
    ZOMBIE_LINEAGE = 3
    ANTI_ENTROPY = 4
    MANUAL = 5


@dataclass(frozen=True, slots=True)
class HubSettings:
    """Tunables of the hub.

    Attributes:
        persist_debounce_s: shortest interval between two writes of one document.
        retry_s: a GATHER / VERIFY request unanswered this long is sent again.
        session_timeout_s: a session not verified by then ends unconverged.
        documents_per_message: most documents one ``SendPersisted`` names.
    """

    persist_debounce_s: float = 0.2
    retry_s: float = 1.0
    session_timeout_s: float = 30.0
    documents_per_message: int = 1024


# ---- values carried by events and commands ----------------------------------------


@dataclass(frozen=True, slots=True)
class DocState:
    """A replica's state vector of one document (DocumentStateVector)."""

    doc_id: str
    kind: str
    state_vector: VectorClock


@dataclass(frozen=True, slots=True)
class DocDelta:
    """A delta of one document (DocumentDelta)."""

    doc_id: str
    delta: Delta


@dataclass(frozen=True, slots=True)
class Conflict:
    """Concurrent writes of one key met in a merge (ReconcileConflict).

    Attributes:
        doc_id: the document.
        key: the map key.
        policy: "lww" (last writer by HLC won) or "siblings" (all kept).
        sibling_count: concurrent values found.
        winner: replica id of the winning write ("" when siblings are kept).
    """

    doc_id: str
    key: str
    policy: str
    sibling_count: int
    winner: str


@dataclass(frozen=True, slots=True)
class HubStats:
    """Numbers for metrics.

    Attributes:
        documents: canonical documents held.
        divergence_ops: operations the canonical replicas hold that attached,
            interested nodes are not known to hold, summed.
        deltas_total: deltas merged into or shipped from the canonical replicas.
        conflicts_total: conflicts met in merges.
        sessions_open: reconcile sessions running.
        nodes: nodes the hub keeps state of, attached or not (``NodeGone``
            forgets them).
    """

    documents: int
    divergence_ops: int
    deltas_total: int
    conflicts_total: int
    sessions_open: int
    nodes: int = 0


# ---- events ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DocumentLoaded:
    """A canonical replica was read from the store (leadership acquired)."""

    doc_id: str
    document: Document
    now_s: float = 0.0


@dataclass(frozen=True, slots=True)
class InterestReceived:
    """A node's DocumentInterest (sent after every Welcome and on each new document)."""

    node_id: str
    subscribe: tuple[DocState, ...]
    unsubscribe: tuple[str, ...] = ()
    now_s: float = 0.0


@dataclass(frozen=True, slots=True)
class DeltasReceived:
    """A node's DeltaBatch."""

    node_id: str
    batch_id: int
    deltas: tuple[DocDelta, ...]
    session_id: str = ""
    now_s: float = 0.0


@dataclass(frozen=True, slots=True)
class AckReceived:
    """A node's DeltaAck of a batch the hub sent."""

    node_id: str
    batch_id: int
    merged: tuple[DocState, ...]
    now_s: float = 0.0


@dataclass(frozen=True, slots=True)
class StateVectorsReported:
    """A node's StateVectorReport, answering a ReconcileRequest."""

    node_id: str
    session_id: str
    phase: ReconcilePhase
    documents: tuple[DocState, ...]
    now_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ReconcileWanted:
    """Start a reconcile session for each of ``node_ids`` (a healed partition, a new leader)."""

    node_ids: tuple[str, ...]
    trigger: ReconcileTrigger
    now_s: float = 0.0


@dataclass(frozen=True, slots=True)
class NodeDetached:
    """The node's Session ended."""

    node_id: str
    now_s: float = 0.0


@dataclass(frozen=True, slots=True)
class NodeGone:
    """The node turned DEAD or LEFT, or was retired: forget it once its Session ended."""

    node_id: str
    now_s: float = 0.0


@dataclass(frozen=True, slots=True)
class PersistFailed:
    """Writing a canonical replica failed; it stays dirty."""

    doc_id: str
    now_s: float = 0.0


@dataclass(frozen=True, slots=True)
class DocumentPersisted:
    """A write of a canonical replica succeeded: the store holds ``state_vector``.

    ``state_vector`` is that of the record written (which the shell merged
    with what the store held, so the store holds at least it from now on).
    """

    doc_id: str
    state_vector: VectorClock
    now_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed."""

    now_s: float


HubEvent = (
    DocumentLoaded
    | InterestReceived
    | DeltasReceived
    | AckReceived
    | StateVectorsReported
    | ReconcileWanted
    | NodeDetached
    | NodeGone
    | PersistFailed
    | DocumentPersisted
    | Tick
)


# ---- commands -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendDeltas:
    """Send a DeltaBatch to the node."""

    node_id: str
    batch_id: int
    deltas: tuple[DocDelta, ...]
    session_id: str = ""
    last: bool = True


@dataclass(frozen=True, slots=True)
class SendAck:
    """Send a DeltaAck (the canonical state vectors after merging the node's batch)."""

    node_id: str
    batch_id: int
    merged: tuple[DocState, ...]


@dataclass(frozen=True, slots=True)
class SendPersisted:
    """Tell the node the store holds these canonical state vectors (DocumentsPersisted)."""

    node_id: str
    persisted: tuple[DocState, ...]


@dataclass(frozen=True, slots=True)
class SendDeltaRequest:
    """Ask the node for every operation not covered by ``have``."""

    node_id: str
    have: tuple[DocState, ...]
    session_id: str = ""


@dataclass(frozen=True, slots=True)
class SendReconcileRequest:
    """Ask the node for its state vectors (ReconcileRequest)."""

    node_id: str
    session_id: str
    trigger: ReconcileTrigger
    phase: ReconcilePhase


@dataclass(frozen=True, slots=True)
class SendReconcileDone:
    """Tell the node its reconcile session ended (ReconcileDone)."""

    node_id: str
    session_id: str
    converged: bool
    documents: int
    conflicts: int
    duration_s: float


@dataclass(frozen=True, slots=True)
class PersistDocument:
    """Write the canonical replica (DocumentRecord) to the store."""

    doc_id: str
    kind: str
    state: bytes
    state_vector: VectorClock
    op_count: int


@dataclass(frozen=True, slots=True)
class ReconcileStartedNotice:
    """Emit ReconcileStarted."""

    session_id: str
    trigger: ReconcileTrigger
    node_ids: tuple[str, ...]
    doc_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ReconcileCompletedNotice:
    """Emit ReconcileCompleted."""

    session_id: str
    trigger: ReconcileTrigger
    node_ids: tuple[str, ...]
    documents: int
    deltas: int
    conflicts: tuple[Conflict, ...]
    conflict_count: int
    duration_s: float
    converged: bool


@dataclass(frozen=True, slots=True)
class RefuseDocument:
    """A node's document was refused (kind mismatch or bad delta); log it."""

    node_id: str
    doc_id: str
    reason: str


HubCommand = (
    SendDeltas
    | SendAck
    | SendPersisted
    | SendDeltaRequest
    | SendReconcileRequest
    | SendReconcileDone
    | PersistDocument
    | ReconcileStartedNotice
    | ReconcileCompletedNotice
    | RefuseDocument
)


# ---- state ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Node:
    node_id: str
    attached: bool = False
    interest: set[str] = field(default_factory=set)
    known: dict[str, VectorClock] = field(default_factory=dict)  # last reported
    shipped: dict[str, VectorClock] = field(default_factory=dict)  # known + in flight
    expected: dict[int, dict[str, VectorClock]] = field(default_factory=dict)  # batch -> sv
    next_batch: int = 1
    seen_first_interest: bool = False
    # doc -> (the "have" we asked with, the node's state vector then): the
    # writer's knowledge for the deltas answering that DeltaRequest.
    asked: dict[str, tuple[VectorClock, VectorClock]] = field(default_factory=dict)
    conflicts: list[Conflict] = field(default_factory=list)  # seen outside a session
    conflict_count: int = 0
    gone: bool = False  # NodeGone while attached: forgotten at NodeDetached
    told: dict[str, VectorClock] = field(default_factory=dict)  # stored sv sent, this Session
    tell: set[str] = field(default_factory=set)  # subscribed anew: tell the stored sv


@dataclass(slots=True)
class _Session:
    session_id: str
    node_id: str
    trigger: ReconcileTrigger
    started_s: float
    phase: ReconcilePhase | None = None  # None: waiting for the node to attach
    requested_s: float = float("-inf")
    target: dict[str, VectorClock] = field(default_factory=dict)
    doc_ids: set[str] = field(default_factory=set)
    deltas: int = 0
    conflicts: list[Conflict] = field(default_factory=list)
    conflict_count: int = 0


@dataclass(slots=True)
class _Doc:
    document: Document
    dirty: bool = False
    persisted_s: float = float("-inf")
    stored: VectorClock = field(default_factory=VectorClock)  # the store holds at least this


def _doc_state(doc_id: str, doc: Document) -> DocState:
    return DocState(doc_id, doc.kind, doc.state_vector())


class DocumentHub:
    """The leader's shared-document state machine (see the module docstring).

    Args:
        settings: tunables.
        term: the leader's term (makes session ids unique across leaderships).
    """

    def __init__(self, settings: HubSettings | None = None, *, term: int = 0) -> None:
        self.settings = settings or HubSettings()
        self._term = term
        self._docs: dict[str, _Doc] = {}
        self._nodes: dict[str, _Node] = {}
        self._attached: set[str] = set()  # ids of the attached nodes (fan-out walks these)
        self._sessions: dict[str, _Session] = {}
        self._session_counter = 0
        self._deltas_total = 0
        self._conflicts_total = 0
        self._had_documents_at_start = False
        self._stored_grew: set[str] = set()  # documents whose stored sv grew since the Tick

    # ---- reading -------------------------------------------------------------------

    def document(self, doc_id: str) -> Document | None:
        """The canonical replica of ``doc_id`` (do not mutate), or None."""
        entry = self._docs.get(doc_id)
        return entry.document if entry is not None else None

    @property
    def doc_ids(self) -> tuple[str, ...]:
        """Ids of the canonical documents, sorted."""
        return tuple(sorted(self._docs))

    def node_state_vector(self, node_id: str, doc_id: str) -> VectorClock:
        """What the hub knows the node holds of ``doc_id`` (empty when unknown)."""
        node = self._nodes.get(node_id)
        if node is None:
            return VectorClock()
        return node.known.get(doc_id, VectorClock())

    def stats(self) -> HubStats:
        """Numbers for metrics (see :class:`HubStats`)."""
        divergence = 0
        for node_id in self._attached:
            node = self._nodes[node_id]
            for doc_id in node.interest:
                entry = self._docs.get(doc_id)
                if entry is None:
                    continue
                known = node.known.get(doc_id, VectorClock())
                for rid, seq in entry.document.state_vector().items():
                    divergence += max(0, seq - known.get(rid))
        return HubStats(
            documents=len(self._docs),
            divergence_ops=divergence,
            deltas_total=self._deltas_total,
            conflicts_total=self._conflicts_total,
            sessions_open=len(self._sessions),
            nodes=len(self._nodes),
        )

    # ---- stepping ------------------------------------------------------------------

    def step(self, event: HubEvent) -> list[HubCommand]:
        """Apply one event; return the commands to carry out, in order.

        Raises:
            TypeError: ``event`` is not a hub event.
        """
        out: list[HubCommand] = []
        if isinstance(event, Tick):
            self._tick(event.now_s, out)
        elif isinstance(event, InterestReceived):
            self._on_interest(event, out)
        elif isinstance(event, DeltasReceived):
            self._on_deltas(event, out)
        elif isinstance(event, AckReceived):
            self._on_ack(event, out)
        elif isinstance(event, StateVectorsReported):
            self._on_report(event, out)
        elif isinstance(event, ReconcileWanted):
            for node_id in sorted(set(event.node_ids)):
                self._start_session(node_id, event.trigger, event.now_s, out)
        elif isinstance(event, NodeDetached):
            self._on_detached(event, out)
        elif isinstance(event, NodeGone):
            self._on_gone(event)
        elif isinstance(event, DocumentLoaded):
            present = self._docs.get(event.doc_id)
            if present is None:
                self._docs[event.doc_id] = _Doc(event.document, persisted_s=event.now_s)
                self._stored(event.doc_id, event.document.state_vector())
            elif present.document.kind == event.document.kind:
                present.document.merge(event.document)  # nodes were faster than the load
                present.dirty = True
                self._stored(event.doc_id, event.document.state_vector())
            self._had_documents_at_start = True
        elif isinstance(event, PersistFailed):
            entry = self._docs.get(event.doc_id)
            if entry is not None:
                entry.dirty = True
        elif isinstance(event, DocumentPersisted):
            self._stored(event.doc_id, event.state_vector)
        else:
            raise TypeError(f"event must be a hub event, got {type(event).__name__}")
        return out

    # ---- helpers -------------------------------------------------------------------

    def _stored(self, doc_id: str, state_vector: VectorClock) -> None:
        """The store holds at least ``state_vector`` of ``doc_id`` (read or written)."""
        entry = self._docs.get(doc_id)
        if entry is None:
            return
        stored = entry.stored.merge(state_vector)
        if stored != entry.stored:
            entry.stored = stored
            self._stored_grew.add(doc_id)

    def _node(self, node_id: str) -> _Node:
        node = self._nodes.get(node_id)
        if node is None:
            node = self._nodes[node_id] = _Node(node_id)
        return node

    def _canonical(self, doc_id: str, kind: str) -> _Doc | None:
        entry = self._docs.get(doc_id)
        if entry is None:
            if kind not in KINDS:
                return None
            entry = self._docs[doc_id] = _Doc(new_document(kind, CANONICAL_REPLICA_ID))
        elif entry.document.kind != kind:
            return None
        return entry

    def _ship(
        self,
        node: _Node,
        deltas: list[DocDelta],
        out: list[HubCommand],
        session_id: str = "",
    ) -> None:
        """Send ``deltas`` to ``node`` in one batch and remember what it should reach."""
        if not deltas or not node.attached:
            return
        batch_id = node.next_batch
        node.next_batch += 1
        expected: dict[str, VectorClock] = {}
        for dd in deltas:
            shipped = node.shipped.get(dd.doc_id, VectorClock()).merge(dd.delta.state_vector)
            node.shipped[dd.doc_id] = shipped
            expected[dd.doc_id] = shipped
        node.expected[batch_id] = expected
        while len(node.expected) > 1024:
            node.expected.pop(min(node.expected))
        self._deltas_total += len(deltas)
        for session in self._sessions_of(node.node_id):
            session.deltas += len(deltas)
        out.append(SendDeltas(node.node_id, batch_id, tuple(deltas), session_id))

    def _catch_up(
        self, node: _Node, doc_ids: Iterable[str], *, answer_all: bool = False
    ) -> list[DocDelta]:
        """Deltas bringing ``node`` from its ``shipped`` vectors to the canonical replicas.

        With ``answer_all`` a document the node lacks nothing of gets an empty
        delta, so the node learns it is in sync (the answer to its interest).
        """
        deltas: list[DocDelta] = []
        for doc_id in sorted(doc_ids):
            entry = self._docs.get(doc_id)
            if entry is None:
                continue
            base = node.shipped.get(doc_id, VectorClock())
            if base.descends(entry.document.state_vector()) and not answer_all:
                continue
            deltas.append(DocDelta(doc_id, entry.document.delta_since(base)))
        return deltas

    def _lacking(self, node: _Node, docs: Iterable[DocState]) -> tuple[DocState, ...]:
        """Canonical state vectors of the documents where ``node`` holds what we lack."""
        have: list[DocState] = []
        for ds in docs:
            entry = self._docs.get(ds.doc_id)
            if entry is None or entry.document.kind != ds.kind:
                continue
            if not entry.document.state_vector().descends(ds.state_vector):
                have.append(_doc_state(ds.doc_id, entry.document))
        return tuple(have)

    def _remember_ask(self, node: _Node, have: tuple[DocState, ...]) -> None:
        for ds in have:
            node.asked[ds.doc_id] = (ds.state_vector, node.known.get(ds.doc_id, VectorClock()))

    def _writer_knowledge(self, node: _Node, dd: DocDelta) -> VectorClock:
        """What the node had seen when it wrote the operations of ``dd`` (best known).

        A delta answering our DeltaRequest (its base is the "have" we sent)
        was written with at most the state vector the node reported then;
        a live delta, with what the node last reported or acknowledged.
        """
        asked = node.asked.get(dd.doc_id)
        if asked is not None and dd.delta.base == asked[0]:
            return asked[1]
        return node.known.get(dd.doc_id, VectorClock())

    def _record_conflicts(self, node: _Node, conflicts: list[Conflict]) -> None:
        self._conflicts_total += len(conflicts)
        sessions = self._sessions_of(node.node_id)
        targets: list[Any] = sessions if sessions else [node]
        for target in targets:
            target.conflict_count += len(conflicts)
            room = MAX_CONFLICT_DETAILS - len(target.conflicts)
            target.conflicts.extend(conflicts[: max(0, room)])

    def _sessions_of(self, node_id: str) -> list[_Session]:
        return [s for s in self._sessions.values() if s.node_id == node_id]

    # ---- live traffic --------------------------------------------------------------

    def _on_interest(self, ev: InterestReceived, out: list[HubCommand]) -> None:
        node = self._node(ev.node_id)
        first = not node.seen_first_interest
        node.seen_first_interest = True
        node.gone = False  # a new Session of the node
        if not node.attached:
            node.attached = True
            self._attached.add(node.node_id)
            node.expected.clear()
        accepted: list[DocState] = []
        for ds in ev.subscribe:
            if self._canonical(ds.doc_id, ds.kind) is None:
                out.append(RefuseDocument(ev.node_id, ds.doc_id, f"kind {ds.kind!r} mismatch"))
                continue
            node.interest.add(ds.doc_id)
            node.known[ds.doc_id] = ds.state_vector
            node.shipped[ds.doc_id] = ds.state_vector
            node.told.pop(ds.doc_id, None)  # a new Session forgets what it was told
            node.tell.add(ds.doc_id)
            accepted.append(ds)
        for doc_id in ev.unsubscribe:
            node.interest.discard(doc_id)
            node.told.pop(doc_id, None)
            node.tell.discard(doc_id)
        self._ship(node, self._catch_up(node, [d.doc_id for d in accepted], answer_all=True), out)
        have = self._lacking(node, accepted)
        if have:
            self._remember_ask(node, have)
            out.append(SendDeltaRequest(ev.node_id, have))
        if first and self._had_documents_at_start and accepted:
            self._start_session(ev.node_id, ReconcileTrigger.LEADER_CHANGED, ev.now_s, out)
        for session in self._sessions_of(ev.node_id):
            waiting = session.phase is ReconcilePhase.GATHER and session.requested_s != _ANSWERED
            if session.phase is None or waiting:  # (again: it may have gone to an old stream)
                self._request(session, ReconcilePhase.GATHER, ev.now_s, out)
        self._check_sessions(ev.now_s, out)

    def _on_deltas(self, ev: DeltasReceived, out: list[HubCommand]) -> None:
        node = self._node(ev.node_id)
        touched: dict[str, _Doc] = {}
        merged: list[DocDelta] = []
        for dd in ev.deltas:
            entry = self._canonical(dd.doc_id, dd.delta.kind)
            if entry is None:
                out.append(RefuseDocument(ev.node_id, dd.doc_id, "kind mismatch"))
                continue
            node.interest.add(dd.doc_id)  # a writer of a document also reads it
            doc = entry.document
            before = doc.state_vector()
            conflicts = _conflicts(dd.doc_id, doc, dd.delta, self._writer_knowledge(node, dd))
            if not doc.merge_delta(dd.delta):
                touched[dd.doc_id] = entry
                continue
            touched[dd.doc_id] = entry
            known = node.known.get(dd.doc_id, VectorClock()).merge(dd.delta.state_vector)
            node.known[dd.doc_id] = known
            node.shipped[dd.doc_id] = node.shipped.get(dd.doc_id, VectorClock()).merge(known)
            if doc.state_vector() == before:
                continue  # a duplicate: nothing new to fan out
            entry.dirty = True
            self._deltas_total += 1
            merged.append(dd)
            if conflicts:
                self._record_conflicts(node, conflicts)
            for session in self._sessions_of(ev.node_id):
                session.deltas += 1
        out.append(
            SendAck(
                ev.node_id,
                ev.batch_id,
                tuple(_doc_state(doc_id, touched[doc_id].document) for doc_id in sorted(touched)),
            )
        )
        self._fan_out(ev.node_id, merged, out)
        self._check_sessions(ev.now_s, out)

    def _fan_out(self, origin: str, merged: list[DocDelta], out: list[HubCommand]) -> None:
        if not merged:
            return
        for node_id in sorted(self._attached):
            node = self._nodes[node_id]
            if node_id == origin:
                continue
            batch: list[DocDelta] = []
            doc_ids = {dd.doc_id for dd in merged if dd.doc_id in node.interest}
            for doc_id in sorted(doc_ids):
                shipped = node.shipped.get(doc_id, VectorClock())
                forwards = [dd for dd in merged if dd.doc_id == doc_id]
                if all(_chain_covers(shipped, forwards)):
                    batch.extend(forwards)
                else:
                    batch.extend(self._catch_up(node, [doc_id]))
            self._ship(node, batch, out)

    def _on_ack(self, ev: AckReceived, out: list[HubCommand]) -> None:
        node = self._nodes.get(ev.node_id)
        if node is None or not node.attached:
            return
        expected = node.expected.pop(ev.batch_id, {})
        resend: list[str] = []
        for ds in ev.merged:
            known = node.known.get(ds.doc_id, VectorClock()).merge(ds.state_vector)
            node.known[ds.doc_id] = known
            want = expected.get(ds.doc_id)
            if want is not None and not ds.state_vector.descends(want):
                # The node refused (or lost) part of the batch: resend from what it holds.
                node.shipped[ds.doc_id] = ds.state_vector
                resend.append(ds.doc_id)
        if resend:
            self._ship(node, self._catch_up(node, resend), out)
        self._check_sessions(ev.now_s, out)

    def _on_detached(self, ev: NodeDetached, out: list[HubCommand]) -> None:
        node = self._nodes.get(ev.node_id)
        if node is None:
            return
        node.attached = False
        self._attached.discard(ev.node_id)
        node.expected.clear()
        node.shipped = dict(node.known)
        node.told.clear()
        node.tell.clear()
        for session in self._sessions_of(ev.node_id):
            session.phase = None  # GATHER again once the node is back
        if node.gone:
            del self._nodes[ev.node_id]

    def _on_gone(self, ev: NodeGone) -> None:
        """Forget the node, or mark it to be forgotten when its Session ends.

        Safe only because its next Session (if any) opens with a
        DocumentInterest carrying its full state vectors (module docstring).
        Its reconcile sessions stay: they resume if it comes back, else time out.
        """
        node = self._nodes.get(ev.node_id)
        if node is None:
            return
        if node.attached:
            node.gone = True
        else:
            del self._nodes[ev.node_id]

    # ---- reconcile sessions ----------------------------------------------------------

    def _start_session(
        self, node_id: str, trigger: ReconcileTrigger, now_s: float, out: list[HubCommand]
    ) -> None:
        if self._sessions_of(node_id):
            return  # one session per node at a time; the running one covers it
        self._session_counter += 1
        session_id = f"rc-{self._term}-{self._session_counter}"
        session = _Session(session_id, node_id, trigger, now_s)
        self._sessions[session_id] = session
        node = self._node(node_id)
        # Conflicts met since the node came back, before this session began, are its own.
        session.conflicts, node.conflicts = node.conflicts, []
        session.conflict_count, node.conflict_count = node.conflict_count, 0
        out.append(
            ReconcileStartedNotice(session_id, trigger, (node_id,), tuple(sorted(node.interest)))
        )
        if node.attached:
            self._request(session, ReconcilePhase.GATHER, now_s, out)

    def _request(
        self, session: _Session, phase: ReconcilePhase, now_s: float, out: list[HubCommand]
    ) -> None:
        session.phase = phase
        session.requested_s = now_s
        out.append(
            SendReconcileRequest(session.node_id, session.session_id, session.trigger, phase)
        )

    def _on_report(self, ev: StateVectorsReported, out: list[HubCommand]) -> None:
        session = self._sessions.get(ev.session_id)
        node = self._node(ev.node_id)
        accepted: list[DocState] = []
        for ds in ev.documents:
            entry = self._canonical(ds.doc_id, ds.kind)
            if entry is None:
                out.append(RefuseDocument(ev.node_id, ds.doc_id, f"kind {ds.kind!r} mismatch"))
                continue
            accepted.append(ds)
            node.interest.add(ds.doc_id)
            known = node.known.get(ds.doc_id, VectorClock()).merge(ds.state_vector)
            node.known[ds.doc_id] = known
            node.shipped[ds.doc_id] = node.shipped.get(ds.doc_id, VectorClock()).merge(known)
        if session is None or session.node_id != ev.node_id or session.phase is not ev.phase:
            return  # a late or duplicated report
        if ev.phase is ReconcilePhase.GATHER:
            for ds in accepted:
                entry = self._docs[ds.doc_id]
                session.doc_ids.add(ds.doc_id)
                session.target[ds.doc_id] = entry.document.state_vector().merge(ds.state_vector)
            if node.attached:
                self._ship(
                    node, self._catch_up(node, session.doc_ids), out, session_id=session.session_id
                )
                have = self._lacking(node, accepted)
                if have:
                    self._remember_ask(node, have)
                    out.append(SendDeltaRequest(ev.node_id, have, session.session_id))
            session.phase = ReconcilePhase.GATHER
            session.requested_s = _ANSWERED  # answered; VERIFY when ready
            self._check_sessions(ev.now_s, out)
            return
        reported = {ds.doc_id: ds.state_vector for ds in accepted}
        if self._verified(session, reported):
            self._finish(session, ev.now_s, True, out)
        else:  # not yet: ship what is missing (from what it reports), verify again later
            for doc_id, sv in reported.items():
                node.shipped[doc_id] = sv  # whatever we believed in flight was lost
            if node.attached:
                self._ship(
                    node, self._catch_up(node, session.doc_ids), out, session_id=session.session_id
                )
            session.phase = ReconcilePhase.GATHER
            session.requested_s = ev.now_s

    def _verified(self, session: _Session, node_svs: dict[str, VectorClock]) -> bool:
        for doc_id, target in session.target.items():
            entry = self._docs.get(doc_id)
            if entry is None or not entry.document.state_vector().descends(target):
                return False
            if not node_svs.get(doc_id, VectorClock()).descends(target):
                return False
        return True

    def _check_sessions(self, now_s: float, out: list[HubCommand]) -> None:
        """Send VERIFY to every gathered session whose node seems to cover its target."""
        for session_id in sorted(self._sessions):
            session = self._sessions[session_id]
            node = self._nodes.get(session.node_id)
            if node is None or not node.attached:
                continue
            gathered = session.phase is ReconcilePhase.GATHER
            waiting = gathered and session.requested_s == _ANSWERED
            if waiting and self._verified(session, node.known):
                self._request(session, ReconcilePhase.VERIFY, now_s, out)

    def _finish(
        self, session: _Session, now_s: float, converged: bool, out: list[HubCommand]
    ) -> None:
        self._sessions.pop(session.session_id, None)
        duration = max(0.0, now_s - session.started_s)
        node = self._nodes.get(session.node_id)
        if node is not None and node.attached:
            out.append(
                SendReconcileDone(
                    session.node_id,
                    session.session_id,
                    converged,
                    len(session.doc_ids),
                    session.conflict_count,
                    duration,
                )
            )
        out.append(
            ReconcileCompletedNotice(
                session.session_id,
                session.trigger,
                (session.node_id,),
                len(session.doc_ids),
                session.deltas,
                tuple(session.conflicts),
                session.conflict_count,
                duration,
                converged,
            )
        )

    # ---- time ------------------------------------------------------------------------

    def _tick(self, now_s: float, out: list[HubCommand]) -> None:
        s = self.settings
        for session_id in sorted(self._sessions):
            session = self._sessions[session_id]
            if now_s - session.started_s >= s.session_timeout_s:
                self._finish(session, now_s, False, out)
                continue
            node = self._nodes.get(session.node_id)
            if node is None or not node.attached:
                continue
            if session.phase is None:
                self._request(session, ReconcilePhase.GATHER, now_s, out)
            elif session.requested_s == _ANSWERED:
                if now_s - session.started_s >= s.retry_s:  # gathered; nudge with a VERIFY
                    self._request(session, ReconcilePhase.VERIFY, now_s, out)
            elif now_s - session.requested_s >= s.retry_s:
                self._request(session, session.phase, now_s, out)
        self._check_sessions(now_s, out)
        for doc_id in sorted(self._docs):
            entry = self._docs[doc_id]
            if entry.dirty and now_s - entry.persisted_s >= s.persist_debounce_s:
                entry.dirty = False
                entry.persisted_s = now_s
                doc = entry.document
                sv = doc.state_vector()
                out.append(PersistDocument(doc_id, doc.kind, doc.encode(), sv, sv.total()))
        self._tell_stored(out)

    def _tell_stored(self, out: list[HubCommand]) -> None:
        """Tell each attached node the stored state vectors it has not heard and may use.

        A node hears a document's stored state vector when it is subscribed
        to the document, the vector grew (or the node subscribed anew) since
        it last heard it, and it covers what the node is known to hold: the
        node's replica only grows, so a vector below that cannot let it drop
        the replica, and the write carrying the rest will be told in turn.
        """
        grew, self._stored_grew = self._stored_grew, set()
        limit = max(1, self.settings.documents_per_message)
        for node_id in sorted(self._attached):
            node = self._nodes[node_id]
            candidates = {d for d in grew if d in node.interest} | node.tell
            node.tell = set()
            states: list[DocState] = []
            for doc_id in sorted(candidates):
                entry = self._docs.get(doc_id)
                if entry is None or not entry.stored or doc_id not in node.interest:
                    continue
                if node.told.get(doc_id) == entry.stored:
                    continue
                if not entry.stored.descends(node.known.get(doc_id, VectorClock())):
                    continue
                node.told[doc_id] = entry.stored
                states.append(DocState(doc_id, entry.document.kind, entry.stored))
            for i in range(0, len(states), limit):
                out.append(SendPersisted(node_id, tuple(states[i : i + limit])))


def _chain_covers(shipped: VectorClock, forwards: list[DocDelta]) -> list[bool]:
    """Whether each forwarded delta applies after the previous ones, starting at ``shipped``."""
    out: list[bool] = []
    current = shipped
    for dd in forwards:
        out.append(current.descends(dd.delta.base))
        current = current.merge(dd.delta.state_vector)
    return out


def _conflicts(doc_id: str, doc: Document, delta: Delta, seen: VectorClock) -> list[Conflict]:
    """Concurrent writes of one key between ``doc`` and ``delta`` (before merging it).

    ``seen`` is what the delta's writer had seen: a current value whose dot it
    does not cover was written concurrently.
    """
    found: list[Conflict] = []
    sv = doc.state_vector()
    payload: Any = delta.payload
    if isinstance(doc, LWWMap):
        for key, wall_ms, logical, rid, seq, _live, _value in payload:
            if seq <= sv.get(rid):
                continue  # the canonical replica has seen this write
            present = doc._registers.get(key)
            if present is None:
                continue
            cw, cl, crid, cseq = present.last_update
            if cseq <= seen.get(crid) or (crid, cseq) == (rid, seq):
                continue  # the writer had seen the current winner: an overwrite
            incoming = (wall_ms, logical, rid, seq)
            winner = rid if incoming > (cw, cl, crid, cseq) else crid
            found.append(Conflict(doc_id, key, "lww", 2, winner))
    elif isinstance(doc, MVMap):
        keys = sorted({entry[0] for entry in payload if entry[2] > sv.get(entry[1])})
        for key in keys:
            before = dict(doc._keys.get(key, {}))
            live_dots = [d for d in before if d[1] > seen.get(d[0])]
            new = [e for e in payload if e[0] == key and e[2] > sv.get(e[1])]
            if live_dots and new:
                found.append(Conflict(doc_id, key, "siblings", len(live_dots) + len(new), ""))
    return found
