"""Shared CRDT documents on a node agent: local replicas, durability, the Session side.

Quick use (in a handler, or an agent-level service)::

    hits = ctx.shared("hits", kind="pn-counter")
    await hits.increment(3)          # returns once durable in shared.sqlite3
    seen = ctx.shared("seen", kind="or-set")
    await seen.add("user-17")
    print(hits.value(), seen.value())

Theory of operation: the protocol logic is pure
(:class:`reconcile.endpoint.ReplicaEndpoint`); this module adds IO.

* **Durability.** Replicas live in ``<data_dir>/shared.sqlite3`` (WAL,
  ``synchronous=FULL``): a table of document snapshots plus an append-only
  log of deltas (local operations and merged remote deltas), compacted into
  the snapshot every :data:`COMPACT_EVERY_DELTAS` deltas per document. One
  writer task group-commits whatever is queued in one transaction on a
  dedicated thread. An operation returns (is *acknowledged*) after its
  commit.
* **Replica id** ``<node_id>~<token>``: the token is created with the file
  and kept in it, so a restarted agent keeps its replica id and an agent whose
  data dir was wiped comes back under a new one (``reconcile.documents``
  forbids reusing dots).
* **Persist before send.** A local delta is queued for the leader only once
  committed; a DeltaAck, a DocumentInterest, a DeltaRequest answer and a
  StateVectorReport are built only after every applied operation is
  committed.
* **Session.** On every Welcome the agent sends DocumentInterest with every
  replica's state vector; the leader ships what the node lacks and asks for
  what it lacks. Local deltas leave in DeltaBatches of at most
  :data:`MAX_BATCH_OPS` deltas or after :data:`BATCH_DELAY_S`; a batch stays
  pending until the leader's DeltaAck (resent from the acked state vector
  when the leader lacks part of it). Without a Session operations still
  succeed locally: shared documents are available under partition and merge
  after the heal. A DocumentInterest names at most
  :data:`DOCUMENTS_PER_MESSAGE` documents (the coordinator's intake limit);
  more are sent as several messages, which the leader's hub adds up.
* **Forgetting.** A task's document (``task/<task_id>``) is no longer
  needed once the agent forgets the task (:meth:`SharedDocuments.forget`).
  Rule: the replica is dropped only once it is *persisted* — the leader said,
  in the current Session, that its canonical store (Redis) holds a state
  vector covering the replica's (DocumentsPersisted,
  ``ReplicaEndpoint.persisted``) — with no local write of it in flight, and
  stayed so for :data:`FORGET_GRACE_S` in that Session. Then its rows leave
  ``shared.sqlite3`` and the leader is told to unsubscribe the node. Until
  then the document stays, its intent to forget kept on disk so a restart
  resumes it. A merge the leader confirmed from memory (a DeltaAck) is not
  enough: a leader whose Redis writes fail and which then dies would take the
  document's last operations with it.

  Why nothing is lost, even if the leader dies right after: (1) the leader
  sends DocumentsPersisted only after Redis acknowledged the write of a
  record with that state vector (``coordinator.documents``: the hub learns it
  from ``DocumentPersisted``, stepped on a successful write only, never on
  ``PersistFailed``); (2) the store never rolls back: every write, by any
  leader (a deposed one's late write, one whose load failed), is an
  optimistic transaction that first merges what Redis holds, so every later
  record covers every earlier one; (3) the replica's operations are exactly
  its state vector's dots, all covered, and a write in flight would add dots
  not covered yet, hence the check. So after the drop every one of them is in
  Redis, and the next leader loads Redis (or, if that load fails, merges
  Redis into its first write of the document) before it serves or overwrites
  the document. What remains is Redis's own durability (its fsync policy and
  replication), which the canonical store is trusted with by design. (By (2)
  a DocumentsPersisted stays true for good; keeping it to one Session, like
  the grace, is a margin, not part of the argument.) A leader that predates
  DocumentsPersisted never sends it: under it forgotten documents are kept.
* **Fencing.** A handle opened through a ``TaskContext`` refuses operations
  once its task must stop (``TaskCancelled``); a handle opened by an
  agent-level service (``Agent.service``) is not tied to a task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lazarus.storage.codecs import (
    CODEC,
    crdt_type,
    deltas_from_pb,
    deltas_to_pb,
    doc_states_from_pb,
    doc_states_to_pb,
    kind_of,
)
from lazarus.v1 import agent_pb2
from reconcile.documents import (
    KINDS,
    Add,
    Append,
    Decrement,
    Delete,
    Delta,
    Document,
    Increment,
    LWWMap,
    Operation,
    Put,
    Remove,
    decode_document,
    new_document,
)
from reconcile.endpoint import Batch, ReplicaEndpoint
from reconcile.hlc import ClockDriftError, HLCTimestamp, HybridLogicalClock
from reconcile.hub import DocDelta, DocState

__all__ = [
    "BATCH_DELAY_S",
    "CODEC",
    "DOCUMENT_BODIES",
    "MAX_BATCH_OPS",
    "OpReceipt",
    "SharedDocument",
    "SharedDocuments",
    "SharedStore",
    "SyncSharedDocument",
    "crdt_type",
    "doc_states_from_pb",
    "doc_states_to_pb",
    "kind_of",
    "read_replicas",
]

_log = logging.getLogger("lazarus.agent.shared")

MAX_BATCH_OPS = 64
"""Most deltas per DeltaBatch."""

BATCH_DELAY_S = 0.1
"""Longest a durable local delta waits for a batch."""

COMPACT_EVERY_DELTAS = 512
"""Log rows of one document after which its snapshot is rewritten."""

DOCUMENTS_PER_MESSAGE = 1024
"""Most documents one DocumentInterest names.

At most ``coordinator.core.limits.LIMITS.documents_per_message``: the
coordinator ends a Session whose message names more (INVALID_ARGUMENT).
"""

FORGET_GRACE_S = 2.0
"""How long a forgotten document stays persisted, in one Session, before it is dropped, s.

Not part of the safety argument (module docstring, *Forgetting*: dropping is
safe once Redis holds the replica); a small margin so a task forgotten and
assigned here again within a heartbeat or two keeps its replica."""

_DROPPED_REMEMBERED = 4096
"""Recently dropped document ids kept to drop again one that a late delta reopens."""

DOCUMENT_BODIES = frozenset(
    {
        "reconcile_request",
        "delta_request",
        "delta_batch",
        "delta_ack",
        "reconcile_done",
        "documents_persisted",
    }
)
"""CoordinatorMessage bodies this module handles."""

# ---------------------------------------------------------------------------- storage


class SharedStore:
    """``shared.sqlite3``: snapshots + delta log (blocking; one thread uses it)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(
            """
            CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS docs (
                doc_id TEXT PRIMARY KEY, kind TEXT NOT NULL, state BLOB NOT NULL);
            CREATE TABLE IF NOT EXISTS log (
                id INTEGER PRIMARY KEY AUTOINCREMENT, doc_id TEXT NOT NULL,
                kind TEXT NOT NULL, delta BLOB NOT NULL);
            CREATE TABLE IF NOT EXISTS forgotten (doc_id TEXT PRIMARY KEY);
            """
        )

    def token(self) -> str:
        """This file's replica token (created on first use, then kept)."""
        row = self._db.execute("SELECT value FROM meta WHERE key='replica_token'").fetchone()
        if row is not None:
            return str(row[0])
        token = uuid.uuid4().hex[:8]
        self._db.execute("INSERT INTO meta(key, value) VALUES ('replica_token', ?)", (token,))
        return token

    def load(self, replica_id: str) -> tuple[dict[str, Document], dict[str, int]]:
        """Every replica (snapshot + log replayed) and its log length."""
        docs: dict[str, Document] = {}
        counts: dict[str, int] = {}
        for doc_id, kind, state in self._db.execute("SELECT doc_id, kind, state FROM docs"):
            try:
                docs[doc_id] = decode_document(bytes(state), replica_id)
            except ValueError as exc:
                _log.error("shared document %s: snapshot unreadable: %s", doc_id, exc)
                docs[doc_id] = new_document(kind, replica_id)
        for doc_id, kind, raw in self._db.execute(
            "SELECT doc_id, kind, delta FROM log ORDER BY id"
        ):
            doc = docs.get(doc_id)
            if doc is None:
                doc = docs[doc_id] = new_document(kind, replica_id)
            counts[doc_id] = counts.get(doc_id, 0) + 1
            try:
                if not doc.merge_delta(Delta.decode(bytes(raw))):
                    _log.error("shared document %s: a logged delta does not apply", doc_id)
            except ValueError as exc:
                _log.error("shared document %s: logged delta unreadable: %s", doc_id, exc)
        return docs, counts

    def forgotten(self) -> set[str]:
        """Documents marked to be dropped once persisted (``SharedDocuments.forget``)."""
        return {str(row[0]) for row in self._db.execute("SELECT doc_id FROM forgotten")}

    def commit(
        self,
        deltas: list[tuple[str, str, bytes]],
        snapshots: dict[str, tuple[str, bytes]],
        marks: dict[str, bool] | None = None,
        drops: Iterable[str] = (),
    ) -> None:
        """One transaction: marks, drops, then ``(doc_id, kind, delta)`` rows and ``snapshots``.

        Args:
            deltas: log rows to append.
            snapshots: ``doc_id -> (kind, state)`` to write (their log rows go).
            marks: ``doc_id -> True`` marks the document forgotten, ``False`` unmarks it.
            drops: documents whose snapshot, log rows and mark are deleted; first,
                so rows of a document reopened after its drop are kept.
        """
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            for doc_id, marked in sorted((marks or {}).items()):
                if marked:
                    db.execute("INSERT OR IGNORE INTO forgotten(doc_id) VALUES (?)", (doc_id,))
                else:
                    db.execute("DELETE FROM forgotten WHERE doc_id = ?", (doc_id,))
            for doc_id in sorted(set(drops)):
                db.execute("DELETE FROM docs WHERE doc_id = ?", (doc_id,))
                db.execute("DELETE FROM log WHERE doc_id = ?", (doc_id,))
                db.execute("DELETE FROM forgotten WHERE doc_id = ?", (doc_id,))
            db.executemany(
                "INSERT INTO log(doc_id, kind, delta) VALUES (?, ?, ?)",
                [row for row in deltas if row[0] not in snapshots],
            )
            for doc_id, (kind, state) in snapshots.items():
                db.execute(
                    "INSERT OR REPLACE INTO docs(doc_id, kind, state) VALUES (?, ?, ?)",
                    (doc_id, kind, state),
                )
                db.execute("DELETE FROM log WHERE doc_id = ?", (doc_id,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        """Close the file."""
        self._db.close()


def read_replicas(data_dir: Path) -> dict[str, Document]:
    """Every replica in ``<data_dir>/shared.sqlite3`` (a debug read, for tests; agent stopped)."""
    store = SharedStore(Path(data_dir) / "shared.sqlite3")
    try:
        token = store.token()
        docs, _ = store.load(f"reader~{token}")
        return docs
    finally:
        store.close()


# ---------------------------------------------------------------------------- handles


@dataclass(frozen=True, slots=True)
class OpReceipt:
    """What an acknowledged operation was: its dot, and (lww-map) its HLC timestamp.

    Attributes:
        doc_id: ``shared/<name>``.
        replica_id: this agent's replica id.
        seq: the operation's seq under ``replica_id``.
        at: the HLC timestamp of an lww-map write; None otherwise.
    """

    doc_id: str
    replica_id: str
    seq: int
    at: HLCTimestamp | None = None


class SharedDocument:
    """A handle on one shared document (``ctx.shared(name, kind=...)``).

    Every operation is a coroutine that returns an :class:`OpReceipt` once
    the operation is durable locally. Operations the document's kind does not
    have raise ``TypeError``.
    """

    def __init__(
        self, owner: SharedDocuments, doc_id: str, kind: str, check: Callable[[], None] | None
    ) -> None:
        self._owner = owner
        self.doc_id = doc_id
        self.kind = kind
        self.name = doc_id.removeprefix("shared/")
        self._check = check

    async def _op(self, op: Operation) -> OpReceipt:
        if self._check is not None:
            self._check()
        return await self._owner.apply(self.doc_id, self.kind, op)

    async def increment(self, amount: int = 1) -> OpReceipt:
        """Add ``amount`` (>= 1) to a g-counter or pn-counter."""
        return await self._op(Increment(amount))

    async def decrement(self, amount: int = 1) -> OpReceipt:
        """Subtract ``amount`` (>= 1) from a pn-counter."""
        return await self._op(Decrement(amount))

    async def add(self, member: str | int) -> OpReceipt:
        """Add ``member`` to an or-set."""
        return await self._op(Add(member))

    async def remove(self, member: str | int) -> OpReceipt:
        """Remove ``member`` from an or-set (the adds this replica has seen)."""
        return await self._op(Remove(member))

    async def put(self, key: str, value: Any) -> OpReceipt:
        """Set ``key`` to a JSON ``value`` in an lww-map or mv-map."""
        return await self._op(Put(key, value, self._owner.stamp(self.kind)))

    async def delete(self, key: str) -> OpReceipt:
        """Delete ``key`` from an lww-map or mv-map."""
        return await self._op(Delete(key, self._owner.stamp(self.kind)))

    async def append(self, item: Any) -> OpReceipt:
        """Append a JSON ``item`` to an rga-log."""
        return await self._op(Append(item))

    def value(self) -> Any:
        """The document's current value here (int, list, dict; see ``reconcile.documents``)."""
        return self._owner.document(self.doc_id, self.kind).value()

    def state_vector(self) -> dict[str, int]:
        """This replica's state vector (replica id -> operations held)."""
        return self._owner.document(self.doc_id, self.kind).state_vector().as_dict()


class SyncSharedDocument:
    """The blocking twin of :class:`SharedDocument` (``SyncTaskContext.shared``)."""

    def __init__(self, doc: SharedDocument, call: Callable[[Any], Any]) -> None:
        self._doc = doc
        self._call = call
        self.doc_id = doc.doc_id
        self.kind = doc.kind
        self.name = doc.name

    def increment(self, amount: int = 1) -> OpReceipt:
        """As ``SharedDocument.increment``, blocking."""
        return self._call(self._doc.increment(amount))  # type: ignore[no-any-return]

    def decrement(self, amount: int = 1) -> OpReceipt:
        """As ``SharedDocument.decrement``, blocking."""
        return self._call(self._doc.decrement(amount))  # type: ignore[no-any-return]

    def add(self, member: str | int) -> OpReceipt:
        """As ``SharedDocument.add``, blocking."""
        return self._call(self._doc.add(member))  # type: ignore[no-any-return]

    def remove(self, member: str | int) -> OpReceipt:
        """As ``SharedDocument.remove``, blocking."""
        return self._call(self._doc.remove(member))  # type: ignore[no-any-return]

    def put(self, key: str, value: Any) -> OpReceipt:
        """As ``SharedDocument.put``, blocking."""
        return self._call(self._doc.put(key, value))  # type: ignore[no-any-return]

    def delete(self, key: str) -> OpReceipt:
        """As ``SharedDocument.delete``, blocking."""
        return self._call(self._doc.delete(key))  # type: ignore[no-any-return]

    def append(self, item: Any) -> OpReceipt:
        """As ``SharedDocument.append``, blocking."""
        return self._call(self._doc.append(item))  # type: ignore[no-any-return]

    def value(self) -> Any:
        """As ``SharedDocument.value`` (read on the handler's thread; a snapshot)."""
        return self._call(_value(self._doc))

    def state_vector(self) -> dict[str, int]:
        """As ``SharedDocument.state_vector``."""
        return self._call(_sv(self._doc))  # type: ignore[no-any-return]


async def _value(doc: SharedDocument) -> Any:
    return doc.value()


async def _sv(doc: SharedDocument) -> dict[str, int]:
    return doc.state_vector()


# ---------------------------------------------------------------------------- manager


@dataclass(slots=True)
class _Write:
    doc_id: str
    kind: str
    delta: Delta
    done: asyncio.Future[None] | None
    local: bool = False


class SharedDocuments:
    """Every shared document of one node agent; see the module docstring.

    Args:
        data_dir: the agent's data directory (``shared.sqlite3`` goes there).
        node_id: this node.
    """

    def __init__(self, data_dir: Path, node_id: str) -> None:
        self.path = Path(data_dir) / "shared.sqlite3"
        self.node_id = node_id
        self.replica_id = node_id
        self.endpoint = ReplicaEndpoint(node_id, max_ops=MAX_BATCH_OPS)
        self._store: SharedStore | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lazarus-shared")
        self._hlc = HybridLogicalClock(node_id)
        self._writes: list[_Write] = []
        self._writing = False
        self._idle = asyncio.Event()
        self._wake = asyncio.Event()
        self._log_rows: dict[str, int] = {}
        self._send: Callable[[agent_pb2.AgentMessage], None] | None = None
        self._inbox: asyncio.Queue[agent_pb2.CoordinatorMessage] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._flush_handle: asyncio.TimerHandle | None = None
        self._synced: dict[str, asyncio.Event] = {}
        self._forgetting: dict[str, float | None] = {}  # doc -> persisted since (monotonic s)
        self._marks: dict[str, bool] = {}  # forget marks to write (True) / delete (False)
        self._drops: set[str] = set()  # dropped documents whose rows are to be deleted
        self._committing: set[str] = set()  # documents of the commit in progress
        self._dropped: dict[str, None] = {}  # recently dropped (bounded, in order)
        self._review_handle: asyncio.TimerHandle | None = None
        self.forget_grace_s = FORGET_GRACE_S
        self.reconciles: list[dict[str, Any]] = []
        """ReconcileDone messages received (for logs and tests)."""

    # ---- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        """Open ``shared.sqlite3`` and load every replica."""
        loop = asyncio.get_running_loop()
        store = await loop.run_in_executor(self._pool, SharedStore, self.path)
        self._store = store
        token = await loop.run_in_executor(self._pool, store.token)
        self.replica_id = f"{self.node_id}~{token}"
        self.endpoint = ReplicaEndpoint(self.replica_id, max_ops=MAX_BATCH_OPS)
        docs, counts = await loop.run_in_executor(self._pool, store.load, self.replica_id)
        last = HLCTimestamp(0, 0)
        for doc_id, doc in sorted(docs.items()):
            self.endpoint.adopt(doc_id, doc)
            if isinstance(doc, LWWMap):
                for register in doc._registers.values():
                    wall_ms, logical = register.last_update[0], register.last_update[1]
                    if (wall_ms, logical) > (last.wall_ms, last.logical):
                        last = HLCTimestamp(wall_ms, logical)
        self._hlc = HybridLogicalClock(self.replica_id, last=last)
        self._log_rows = counts
        forgotten = await loop.run_in_executor(self._pool, store.forgotten)
        self._forgetting = {d: None for d in sorted(forgotten) if d in self.endpoint.docs}
        self._idle.set()
        self._tasks = [
            asyncio.create_task(self._writer(), name="shared-writer"),
            asyncio.create_task(self._inbox_loop(), name="shared-inbox"),
        ]
        _log.info(
            "shared documents: %d loaded from %s as replica %s",
            len(docs),
            self.path,
            self.replica_id,
        )

    async def close(self) -> None:
        """Commit what is queued, stop, close the file."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5.0):
                await self.durable()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        if self._review_handle is not None:
            self._review_handle.cancel()
        if self._store is not None:
            store, self._store = self._store, None
            loop = asyncio.get_running_loop()
            with contextlib.suppress(Exception):
                await loop.run_in_executor(self._pool, self._snapshot_all, store)
            await loop.run_in_executor(self._pool, store.close)
        self._pool.shutdown(wait=False)

    def _snapshot_all(self, store: SharedStore) -> None:
        snaps = {d: (doc.kind, doc.encode()) for d, doc in self.endpoint.docs.items()}
        if snaps:
            store.commit([], snaps)

    # ---- handles and operations ------------------------------------------------------

    def handle(
        self, name: str, kind: str, check: Callable[[], None] | None = None
    ) -> SharedDocument:
        """A handle on ``shared/<name>`` of ``kind`` (opened empty when new).

        Raises:
            ValueError: empty name, unknown kind, or the document exists with another kind.
        """
        if not isinstance(name, str) or not name:
            raise ValueError("shared document name must be a non-empty str")
        return self.handle_doc(f"shared/{name}", kind, check)

    async def task_state(
        self, task_id: str, kind: str, check: Callable[[], None] | None, timeout_s: float
    ) -> SharedDocument:
        """The CRDT state of a task (document ``task/<task_id>``), synced with the leader.

        Waits up to ``timeout_s`` for the leader's answer to the subscription
        (what earlier owners wrote); without a Session it returns the local
        replica as it is (available under partition, merged after the heal).
        """
        doc = self.handle_doc(f"task/{task_id}", kind, check)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._synced_event(doc.doc_id).wait()
        return doc

    def holds(self, doc_id: str) -> bool:
        """True when this node has a replica of ``doc_id``."""
        return doc_id in self.endpoint.docs

    def _synced_event(self, doc_id: str) -> asyncio.Event:
        event = self._synced.get(doc_id)
        if event is None:
            event = self._synced[doc_id] = asyncio.Event()
        return event

    def handle_doc(
        self, doc_id: str, kind: str, check: Callable[[], None] | None = None
    ) -> SharedDocument:
        """A handle on ``doc_id`` of ``kind`` (opened empty when new); see ``handle``."""
        if kind not in KINDS:
            raise ValueError(f"kind {kind!r} is unknown; known: {sorted(KINDS)}")
        new = doc_id not in self.endpoint.docs
        self.endpoint.open(doc_id, kind)
        self._dropped.pop(doc_id, None)
        if doc_id in self._forgetting:  # needed again (the task came back)
            del self._forgetting[doc_id]
            self._marks[doc_id] = False
            self._kick()
        if new and self._send is not None:  # subscribe at once for live deltas
            msg = agent_pb2.AgentMessage()
            msg.document_interest.SetInParent()  # the oneof is set even with nothing in it
            doc_states_to_pb(self.endpoint.states([doc_id]), msg.document_interest.subscribe)
            self._send(msg)
        return SharedDocument(self, doc_id, kind, check)

    def forget_task(self, task_id: str) -> None:
        """The agent forgot ``task_id``: drop ``task/<task_id>`` once persisted (see ``forget``)."""
        self.forget(f"task/{task_id}")

    def forget(self, doc_id: str) -> None:
        """Drop the replica of ``doc_id`` once all of it is durable in the canonical store.

        The intent is durable at once (a restart resumes it); the replica, its
        rows in ``shared.sqlite3`` and the node's subscription at the leader go
        once the leader said its store holds the replica's state vector and it
        stayed so for ``forget_grace_s`` in one Session (module docstring,
        *Forgetting*).
        Opening the document again (``handle_doc``) cancels it. Unknown
        documents are ignored.
        """
        if doc_id not in self.endpoint.docs or doc_id in self._forgetting:
            return
        self._forgetting[doc_id] = None
        self._marks[doc_id] = True
        self._kick()
        self._review()

    def forgetting(self) -> tuple[str, ...]:
        """Documents to be dropped once persisted, sorted."""
        return tuple(sorted(self._forgetting))

    def _review(self) -> None:
        """Drop every forgotten replica persisted for ``forget_grace_s`` in this Session."""
        if self._review_handle is not None:
            self._review_handle.cancel()
            self._review_handle = None
        if not self._forgetting or self._send is None or self._store is None:
            return  # without a Session nothing is confirmed; the next Welcome resumes it
        now = time.monotonic()
        busy = self._committing | {w.doc_id for w in self._writes}
        dropped: list[str] = []
        due: float | None = None
        for doc_id in sorted(self._forgetting):
            if doc_id not in self.endpoint.docs:
                del self._forgetting[doc_id]
                continue
            if doc_id in busy or not self.endpoint.persisted(doc_id):
                self._forgetting[doc_id] = None
                continue
            since = self._forgetting[doc_id]
            if since is None:
                since = self._forgetting[doc_id] = now
            if now - since >= self.forget_grace_s:
                dropped.append(doc_id)
            else:
                at = since + self.forget_grace_s
                due = at if due is None else min(due, at)
        for doc_id in dropped:
            self._drop(doc_id)
        for i in range(0, len(dropped), DOCUMENTS_PER_MESSAGE):
            msg = agent_pb2.AgentMessage()
            msg.document_interest.unsubscribe_doc_ids.extend(dropped[i : i + DOCUMENTS_PER_MESSAGE])
            self._send(msg)
        if due is not None:
            loop = asyncio.get_running_loop()
            self._review_handle = loop.call_later(max(0.0, due - now), self._review)

    def _drop(self, doc_id: str) -> None:
        """Forget a persisted replica in memory now; its rows go with the next commit."""
        self.endpoint.drop(doc_id)
        del self._forgetting[doc_id]
        self._marks.pop(doc_id, None)
        self._synced.pop(doc_id, None)
        self._log_rows.pop(doc_id, None)
        self._drops.add(doc_id)
        self._dropped[doc_id] = None
        while len(self._dropped) > _DROPPED_REMEMBERED:
            self._dropped.pop(next(iter(self._dropped)))
        self._kick()
        _log.info("shared document %s dropped: durable in Redis, its task forgotten", doc_id)

    def document(self, doc_id: str, kind: str) -> Document:
        """The replica of ``doc_id``."""
        return self.endpoint.open(doc_id, kind)

    def stamp(self, kind: str) -> HLCTimestamp | None:
        """An HLC timestamp for an lww-map write (None for other kinds)."""
        if kind != "lww-map":
            return None
        return self._hlc.send(time.time_ns() // 1_000_000)

    async def apply(self, doc_id: str, kind: str, op: Operation) -> OpReceipt:
        """Run ``op`` locally; return once it is durable (then it is queued for the leader).

        Raises:
            TypeError / ValueError: as ``Document.apply``.
            RuntimeError: the store is closed.
        """
        if self._store is None:
            raise RuntimeError("shared documents are closed")
        self.endpoint.open(doc_id, kind)
        delta = self.endpoint.apply(doc_id, op)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue_write(_Write(doc_id, kind, delta, done, local=True))
        await done  # the writer queues the delta for the leader once committed
        at = op.at if isinstance(op, Put | Delete) else None
        return OpReceipt(doc_id, self.replica_id, delta.state_vector.get(self.replica_id), at)

    # ---- durability ------------------------------------------------------------------

    def _queue_write(self, write: _Write) -> None:
        self._writes.append(write)
        self._kick()

    def _kick(self) -> None:
        self._idle.clear()
        self._wake.set()

    def _queued(self) -> bool:
        return bool(self._writes or self._marks or self._drops)

    async def durable(self) -> None:
        """Return once every operation, forget mark and drop so far is committed."""
        while self._queued() or self._writing:
            await self._idle.wait()

    async def _writer(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._queued() or self._store is None:
                continue
            writes, self._writes = self._writes, []
            marks, self._marks = self._marks, {}
            drops, self._drops = self._drops, set()
            self._writing = True
            self._committing = {w.doc_id for w in writes}
            rows = [(w.doc_id, w.kind, w.delta.encode()) for w in writes]
            snapshots: dict[str, tuple[str, bytes]] = {}
            for w in writes:
                self._log_rows[w.doc_id] = self._log_rows.get(w.doc_id, 0) + 1
            for doc_id in {w.doc_id for w in writes}:
                doc = self.endpoint.docs.get(doc_id)
                if doc is not None and self._log_rows.get(doc_id, 0) >= COMPACT_EVERY_DELTAS:
                    snapshots[doc_id] = (doc.kind, doc.encode())  # covers every applied op
                    self._log_rows[doc_id] = 0
            error: BaseException | None = None
            try:
                await loop.run_in_executor(
                    self._pool, self._store.commit, rows, snapshots, marks, drops
                )
            except Exception as exc:
                error = exc
                _log.error("shared documents: commit failed: %s", exc)
                for doc_id, marked in marks.items():  # written again with the next commit
                    self._marks.setdefault(doc_id, marked)
                self._drops |= drops
            self._writing = False
            self._committing = set()
            if self._forgetting and any(w.doc_id in self._forgetting for w in writes):
                self._review()  # a forgotten document's write is durable: it may go now
            if error is None and any(w.local for w in writes):
                for w in writes:  # committed: ship, even when the caller was cancelled
                    if w.local:
                        self.endpoint.enqueue(w.doc_id, w.delta)
                self._schedule_flush()
            for w in writes:
                if w.done is not None and not w.done.done():
                    if error is None:
                        w.done.set_result(None)
                    else:
                        w.done.set_exception(error)
            if not self._queued():
                self._idle.set()
            elif error is not None:
                await asyncio.sleep(0.5)  # a failing disk: retry, not spin
                self._wake.set()

    # ---- the Session ---------------------------------------------------------------------

    def _schedule_flush(self) -> None:
        if self.endpoint.queued >= MAX_BATCH_OPS:
            self._flush()
        elif self._flush_handle is None:
            loop = asyncio.get_running_loop()
            self._flush_handle = loop.call_later(BATCH_DELAY_S, self._flush)

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self._send is None:
            return  # kept; the next Welcome's interest supersedes them
        while True:
            batch = self.endpoint.take_batch()
            if batch is None:
                return
            self._send_batch(batch)

    def _send_batch(self, batch: Batch) -> None:
        if self._send is None:
            return
        msg = agent_pb2.AgentMessage()
        msg.delta_batch.SetInParent()
        body = msg.delta_batch
        body.session_id = batch.session_id
        body.batch_id = batch.batch_id
        body.last = batch.last
        deltas_to_pb(batch.deltas, self.node_id, body.deltas)
        self._send(msg)

    def session_opened(self, send: Callable[[agent_pb2.AgentMessage], None]) -> None:
        """A Welcome arrived: send DocumentInterest (after everything applied is durable)."""
        self._send = send
        self._unconfirm()
        self._inbox.put_nowait(agent_pb2.CoordinatorMessage())  # marker: send interest

    def session_closed(self) -> None:
        """The Session ended: stop sending until the next Welcome."""
        self._send = None
        self._unconfirm()

    def _unconfirm(self) -> None:
        """What a leader confirmed in an earlier Session must be confirmed again."""
        self.endpoint.clear_confirmed()
        for doc_id in self._forgetting:
            self._forgetting[doc_id] = None
        if self._review_handle is not None:
            self._review_handle.cancel()
            self._review_handle = None

    def receive(self, msg: agent_pb2.CoordinatorMessage) -> None:
        """A document message from the leader (handled in order, off the read loop)."""
        self._inbox.put_nowait(msg)

    async def _inbox_loop(self) -> None:
        while True:
            msg = await self._inbox.get()
            try:
                await self._handle(msg)
            except asyncio.CancelledError:
                raise
            except Exception:
                _log.exception("shared documents: handling %s failed", msg.WhichOneof("body"))

    async def _handle(self, msg: agent_pb2.CoordinatorMessage) -> None:
        body = msg.WhichOneof("body")
        ep = self.endpoint
        if body is None:  # the interest marker
            await self.durable()
            if self._send is None:
                return
            for out in _interest_messages(ep.interest()):
                self._send(out)
        elif body == "delta_batch":
            batch = msg.delta_batch
            deltas = deltas_from_pb(batch.deltas)
            self._observe_hlc(deltas)
            merged, _ = ep.merge(deltas)
            if merged:
                last: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                for i, dd in enumerate(merged):
                    done = last if i == len(merged) - 1 else None
                    self._queue_write(_Write(dd.doc_id, dd.delta.kind, dd.delta, done))
                await last
            await self.durable()
            for dd in deltas:  # the leader answered for this document: in sync
                self._synced_event(dd.doc_id).set()
            if self._send is not None:
                out = agent_pb2.AgentMessage()
                out.delta_ack.SetInParent()
                out.delta_ack.batch_id = batch.batch_id
                doc_states_to_pb(ep.states({dd.doc_id for dd in deltas}), out.delta_ack.merged)
                self._send(out)
            for dd in deltas:  # a late delta reopened a dropped document: drop it again
                if dd.doc_id in self._dropped and dd.doc_id in ep.docs:
                    self.forget(dd.doc_id)
            self._review()
        elif body == "delta_ack":
            ack = msg.delta_ack
            resend = ep.on_ack(ack.batch_id, doc_states_from_pb(ack.merged))
            if resend is not None:
                self._send_batch(resend)
        elif body == "documents_persisted":
            ep.on_persisted(doc_states_from_pb(msg.documents_persisted.documents))
            self._review()
        elif body == "delta_request":
            req = msg.delta_request
            await self.durable()
            self._send_batch(ep.answer_request(req.session_id, doc_states_from_pb(req.have)))
            self._review()
        elif body == "reconcile_request":
            rr = msg.reconcile_request
            await self.durable()
            if self._send is not None:
                out = agent_pb2.AgentMessage()
                out.state_vector_report.SetInParent()
                out.state_vector_report.session_id = rr.session_id
                out.state_vector_report.phase = rr.phase
                doc_states_to_pb(ep.report(rr.doc_ids), out.state_vector_report.documents)
                self._send(out)
        elif body == "reconcile_done":
            done_msg = msg.reconcile_done
            entry = {
                "session_id": done_msg.session_id,
                "converged": done_msg.converged,
                "documents": done_msg.documents,
                "conflicts": done_msg.conflicts,
                "duration_ms": done_msg.duration_ms,
            }
            self.reconciles.append(entry)
            _log.info(
                "reconcile %s done: converged=%s documents=%d conflicts=%d in %d ms",
                done_msg.session_id,
                done_msg.converged,
                done_msg.documents,
                done_msg.conflicts,
                done_msg.duration_ms,
                extra={"lazarus": {"event": "reconcile_done", **entry}},
            )

    def _observe_hlc(self, deltas: Iterable[DocDelta]) -> None:
        """Move the HLC past remote lww-map stamps (causality across nodes)."""
        now_ms = time.time_ns() // 1_000_000
        for dd in deltas:
            if dd.delta.kind != "lww-map":
                continue
            for entry in dd.delta.payload:
                with contextlib.suppress(ClockDriftError, TypeError, ValueError):
                    self._hlc.receive(HLCTimestamp(entry[1], entry[2]), now_ms)


def _interest_messages(states: tuple[DocState, ...]) -> list[agent_pb2.AgentMessage]:
    """DocumentInterest messages subscribing ``states``, each naming <= DOCUMENTS_PER_MESSAGE.

    The leader's hub adds every interest message to what it knows of the
    node (``reconcile.hub``: subscriptions only grow, until an unsubscribe),
    so several messages subscribe as one would. With no documents one empty
    message is sent: the interest that starts the Session's document traffic.
    """
    out = []
    for i in range(0, max(1, len(states)), DOCUMENTS_PER_MESSAGE):
        msg = agent_pb2.AgentMessage()
        msg.document_interest.SetInParent()  # no documents yet is still an interest
        doc_states_to_pb(states[i : i + DOCUMENTS_PER_MESSAGE], msg.document_interest.subscribe)
        out.append(msg)
    return out
