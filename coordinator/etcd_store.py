"""Fenced persistence of cluster records in etcd, and a watch-fed read cache.

Theory of operation
-------------------
Layout. Records live at ``/lazarus/<cluster>/<collection>/<name>``:
``nodes/<node_id>``, ``tasks/<task_id>``, ``forks/<task_id>/<fork_id>`` (see
``records.proto``); the election lives under ``/lazarus/<cluster>/election``,
each replica's ``MemberRecord`` at ``/lazarus/<cluster>/members/<member_id>``
(under its election lease; ``coordinator.members``, not read here).
Values are ``records.proto`` messages the caller serialised; this module never
parses them.

Writes (leader only). :meth:`EtcdStore.write` turns a batch of puts and
deletes into etcd transactions of at most :data:`MAX_TXN_OPS` operations and
about :data:`MAX_TXN_BYTES` bytes (etcd refuses more: ``--max-txn-ops`` 128,
``--max-request-bytes`` 1.5 MiB). Every one of them carries the leader's
:class:`~coordinator.election.Fence` as its only compare —
``create_revision(election key) == term`` — so once the key is gone (lease
expired or revoked, resigned) or belongs to another campaign, etcd applies
nothing of it and :class:`FencedWriteRejected`, a
:class:`~coordinator.election.LeadershipLost`, is raised: the caller steps down.
The transactions of one batch commit in order, each atomically; a batch split
in several is not atomic as a whole — the error says how many operations
committed before the refusal; planning over etcd state is idempotent, so the
next leader finishes the rest.

Reads (a new leader). :meth:`EtcdStore.load` reads every record under the
cluster prefix at one revision, in pages of :data:`LOAD_PAGE_KEYS` keys (one
big range could exceed gRPC's 4 MiB message limit). aetcd 1.0.0 ignores a range
request's ``limit`` and ``revision``, so pages go through its ``KV`` stub
directly; a revision compacted between two pages restarts the load.

Reads (followers). :class:`ReadCache` loads once, then follows a prefix watch
from the loaded revision + 1, applying puts and deletes; ``revision`` is the
etcd revision the cache reflects. aetcd queues all events of one watch
response before the consumer runs and the cache applies them without
yielding to the event loop, so a reader on the same loop never sees half a
transaction. Reaction to errors: a broken watch stream (etcd restarted,
connection lost) is re-created from ``revision + 1`` after
:data:`RETRY_INTERVAL_S`, which loses nothing; when etcd has compacted that
revision away the cache reloads everything (``reloads`` counts those) and
follows again. While etcd is unreachable the cache keeps serving what it has,
at its old ``revision``.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import aetcd
import aetcd.rpc
import aetcd.utils

from coordinator.aetcd_compat import cancel_watch, open_watch
from coordinator.election import Fence, LeadershipLost, LossReason

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "LOAD_PAGE_KEYS",
    "MAX_TXN_BYTES",
    "MAX_TXN_OPS",
    "RETRY_INTERVAL_S",
    "Collection",
    "DeleteRecord",
    "EtcdStore",
    "EtcdUnavailable",
    "FencedWriteRejected",
    "PutRecord",
    "ReadCache",
    "RecordOp",
    "Snapshot",
    "StoreError",
    "cluster_prefix",
    "election_prefix",
    "parse_record_key",
    "plan_batches",
    "record_key",
]

MAX_TXN_OPS = 128
"""Most operations in one etcd transaction (etcd's default ``--max-txn-ops``)."""

MAX_TXN_BYTES = 1_000_000
"""Most key + value bytes in one transaction: room below etcd's 1.5 MiB request limit."""

LOAD_PAGE_KEYS = 500
"""Keys per range request when loading."""

DEFAULT_TIMEOUT_S = 5.0
"""Bound on each etcd request this store makes."""

RETRY_INTERVAL_S = 0.5
"""Pause of the read cache before it retries a failed load or watch."""

_LOAD_ATTEMPTS = 3

_log = logging.getLogger(__name__)


class Collection(enum.Enum):
    """A kind of record, the path segment after ``/lazarus/<cluster>/``."""

    NODES = "nodes"
    """``NodeRecord`` by node id."""
    TASKS = "tasks"
    """``TaskRecord`` by task id."""
    FORKS = "forks"
    """``ForkRecord`` by ``<task_id>/<fork_id>``."""
    QUARANTINE = "quarantine"
    """``QuarantinedRecord`` by ``<collection>/<name>``: records moved aside at load."""


# ---------------------------------------------------------------- layout


def cluster_prefix(cluster: str) -> bytes:
    """Return the key prefix of a cluster's records, ``/lazarus/<cluster>/``.

    Args:
        cluster: the cluster name; non-empty, without ``/``.

    Returns:
        The prefix, UTF-8, with its trailing slash.

    Raises:
        ValueError: the name is empty or contains ``/``.
    """
    if not cluster or "/" in cluster:
        raise ValueError(f"cluster name must be non-empty and without '/': {cluster!r}")
    return f"/lazarus/{cluster}/".encode()


def election_prefix(cluster: str) -> str:
    """Return the election prefix of a cluster, ``/lazarus/<cluster>/election``.

    Args:
        cluster: the cluster name; non-empty, without ``/``.

    Returns:
        The prefix to give ``Election`` and ``etcdctl elect``.

    Raises:
        ValueError: the name is empty or contains ``/``.
    """
    return cluster_prefix(cluster).decode() + "election"


def record_key(cluster: str, collection: Collection, name: str) -> bytes:
    """Return the etcd key of one record, ``/lazarus/<cluster>/<collection>/<name>``.

    Args:
        cluster: the cluster name; non-empty, without ``/``.
        collection: the kind of record.
        name: its id within the collection (``<task_id>/<fork_id>`` for forks).

    Returns:
        The key, UTF-8.

    Raises:
        ValueError: empty ``name``, or a bad cluster name.
    """
    if not name:
        raise ValueError(f"a {collection.value} record needs a non-empty name")
    return cluster_prefix(cluster) + f"{collection.value}/{name}".encode()


def parse_record_key(prefix: bytes, key: bytes) -> tuple[Collection, str] | None:
    """Split a key under a cluster prefix into (collection, name).

    Args:
        prefix: the cluster prefix, as :func:`cluster_prefix` returns it.
        key: a key from etcd.

    Returns:
        The collection and name, or None for a key outside the prefix or of
        no known collection (election keys, for one).
    """
    if not key.startswith(prefix):
        return None
    segment, slash, name = key[len(prefix) :].decode(errors="replace").partition("/")
    if not slash or not name:
        return None
    try:
        return Collection(segment), name
    except ValueError:
        return None


# ---------------------------------------------------------------- operations


@dataclass(frozen=True, slots=True)
class PutRecord:
    """Store ``value`` as record ``collection/name``.

    Attributes:
        collection: the kind of record.
        name: its id within the collection.
        value: the serialised ``records.proto`` message.
    """

    collection: Collection
    name: str
    value: bytes


@dataclass(frozen=True, slots=True)
class DeleteRecord:
    """Delete record ``collection/name`` (nothing happens if it is absent).

    Attributes:
        collection: the kind of record.
        name: its id within the collection.
    """

    collection: Collection
    name: str


RecordOp = PutRecord | DeleteRecord
"""One operation of a fenced write."""


def plan_batches(
    op_sizes_bytes: Sequence[int],
    *,
    max_ops: int = MAX_TXN_OPS,
    max_bytes: int = MAX_TXN_BYTES,
) -> list[range]:
    """Split operations, in order, into transactions within etcd's limits.

    Greedy: a transaction takes operations until one more would exceed
    ``max_ops`` operations or ``max_bytes`` bytes. An operation larger than
    ``max_bytes`` travels alone (etcd may still refuse it).

    Args:
        op_sizes_bytes: size of each operation (key + value bytes).
        max_ops: most operations per transaction.
        max_bytes: most bytes per transaction.

    Returns:
        Consecutive index ranges covering every operation; empty for no
        operations.

    Raises:
        ValueError: ``max_ops`` or ``max_bytes`` < 1.
    """
    if max_ops < 1 or max_bytes < 1:
        raise ValueError(f"limits must be positive: max_ops={max_ops}, max_bytes={max_bytes}")
    batches: list[range] = []
    start = 0
    used_bytes = 0
    for i, size_bytes in enumerate(op_sizes_bytes):
        count = i - start
        if count and (count == max_ops or used_bytes + size_bytes > max_bytes):
            batches.append(range(start, i))
            start, used_bytes = i, 0
        used_bytes += size_bytes
    if start < len(op_sizes_bytes):
        batches.append(range(start, len(op_sizes_bytes)))
    return batches


# ---------------------------------------------------------------- errors


class StoreError(Exception):
    """Base class of the errors this module raises.

    Attributes:
        grpc_code: name of the ``grpc.StatusCode`` this error maps to.
    """

    grpc_code: str = "INTERNAL"


class EtcdUnavailable(StoreError):
    """etcd refused the connection or did not answer in time (maps to UNAVAILABLE).

    Attributes:
        operation: what was attempted, e.g. ``"write"``.
        outcome_unknown: True for a write whose transaction may or may not have
            been applied (a timeout after sending); read etcd to find out.
    """

    grpc_code = "UNAVAILABLE"

    def __init__(self, operation: str, cause: BaseException, *, outcome_unknown: bool) -> None:
        self.operation = operation
        self.outcome_unknown = outcome_unknown
        unknown = "; its outcome is unknown" if outcome_unknown else ""
        super().__init__(f"etcd unavailable during {operation}: {cause!r}{unknown}")


class FencedWriteRejected(LeadershipLost):
    """etcd refused a fenced transaction: the writer is no longer leader (UNAVAILABLE).

    Attributes:
        committed_ops: operations of the batch committed before the refusal
            (earlier transactions of a split batch).
        current_create_revision: create revision of the election key now, or
            None when the key is gone.
    """

    def __init__(
        self, fence: Fence, committed_ops: int, current_create_revision: int | None
    ) -> None:
        self.committed_ops = committed_ops
        self.current_create_revision = current_create_revision
        now = (
            "the key is gone"
            if current_create_revision is None
            else f"the key now has create revision {current_create_revision}"
        )
        super().__init__(
            fence.key.decode(errors="replace"),
            fence.term,
            LossReason.FENCE_REJECTED,
            f"write refused ({now}); {committed_ops} operations of the batch were committed",
        )


# ---------------------------------------------------------------- store


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Every record of a cluster at one etcd revision.

    Attributes:
        revision: the etcd revision read.
        records: per collection, record name → value.
    """

    revision: int
    records: Mapping[Collection, Mapping[str, bytes]] = field(default_factory=dict)

    @property
    def nodes(self) -> Mapping[str, bytes]:
        """``NodeRecord`` bytes by node id."""
        return self.records.get(Collection.NODES, {})

    @property
    def tasks(self) -> Mapping[str, bytes]:
        """``TaskRecord`` bytes by task id."""
        return self.records.get(Collection.TASKS, {})

    @property
    def quarantined(self) -> Mapping[str, bytes]:
        """``QuarantinedRecord`` bytes by ``<collection>/<name>``."""
        return self.records.get(Collection.QUARANTINE, {})


class _Compacted(Exception):
    """The revision a paged load reads at was compacted between pages."""


class EtcdStore:
    """Reads and fenced writes of one cluster's records.

    Args:
        client: an ``aetcd.Client``.
        cluster: the cluster name; non-empty, without ``/``.
        timeout_s: bound on each etcd request made here.
        page_keys: keys per range request of :meth:`load`.

    Raises:
        ValueError: a bad cluster name, ``timeout_s`` <= 0 or ``page_keys`` < 1.
    """

    def __init__(
        self,
        client: aetcd.Client,
        cluster: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        page_keys: int = LOAD_PAGE_KEYS,
    ) -> None:
        if timeout_s <= 0 or page_keys < 1:
            raise ValueError(f"need timeout_s > 0 and page_keys >= 1: {timeout_s}, {page_keys}")
        self._client = client
        self._cluster = cluster
        self._prefix = cluster_prefix(cluster)
        self._timeout_s = timeout_s
        self._page_keys = page_keys

    @property
    def cluster(self) -> str:
        """The cluster name."""
        return self._cluster

    @property
    def prefix(self) -> bytes:
        """The cluster's key prefix, ``/lazarus/<cluster>/``."""
        return self._prefix

    @property
    def client(self) -> aetcd.Client:
        """The aetcd client."""
        return self._client

    def key(self, collection: Collection, name: str) -> bytes:
        """Return the etcd key of a record of this cluster.

        Args:
            collection: the kind of record.
            name: its id within the collection.

        Returns:
            ``/lazarus/<cluster>/<collection>/<name>``.

        Raises:
            ValueError: empty ``name``.
        """
        return record_key(self._cluster, collection, name)

    async def write(self, fence: Fence, ops: Sequence[RecordOp]) -> tuple[int, ...]:
        """Apply puts and deletes in leader-fenced transactions of at most MAX_TXN_OPS each.

        Args:
            fence: the writer's election key and term (``Leadership.fence``).
            ops: the operations, applied in order; each record at most once.

        Returns:
            The etcd revision of each committed transaction, in order (one per
            batch of :func:`plan_batches`); empty for no operations.

        Raises:
            FencedWriteRejected: a transaction's compare failed: the writer is
                not leader any more; later transactions were not sent
                (UNAVAILABLE, a LeadershipLost).
            EtcdUnavailable: etcd refused or timed out; a timed-out transaction
                may have been applied (UNAVAILABLE).
            ValueError: a record appears twice, or an empty name.
            aetcd.ClientError: etcd refused the request otherwise (e.g. too large).
        """
        keyed = [(self.key(op.collection, op.name), op) for op in ops]
        seen: set[bytes] = set()
        for key, _ in keyed:
            if key in seen:
                raise ValueError(f"record {key.decode(errors='replace')} appears twice in a write")
            seen.add(key)
        sizes = [len(k) + (len(op.value) if isinstance(op, PutRecord) else 0) for k, op in keyed]
        tx = self._client.transactions
        revisions: list[int] = []
        committed = 0
        for batch in plan_batches(sizes):
            success = [
                tx.put(key, op.value) if isinstance(op, PutRecord) else tx.delete(key)
                for key, op in (keyed[i] for i in batch)
            ]
            try:
                async with asyncio.timeout(self._timeout_s):
                    succeeded, responses = await self._client.transaction(
                        compare=[tx.create(fence.key) == fence.term],
                        success=success,
                        failure=[tx.get(fence.key)],
                    )
            except (TimeoutError, aetcd.ConnectionTimeoutError, aetcd.ConnectionFailedError) as exc:
                # The request may have reached etcd before the stream broke.
                raise EtcdUnavailable("write", exc, outcome_unknown=True) from exc
            if not succeeded:
                current = int(responses[0][0][1].create_revision) if responses[0] else None
                raise FencedWriteRejected(fence, committed, current)
            revisions.append(_txn_revision(responses[0]))
            committed += len(batch)
        return tuple(revisions)

    async def load(self) -> Snapshot:
        """Read every record of the cluster at one revision (for a new leader).

        Returns:
            The records by collection, and the revision read.

        Raises:
            EtcdUnavailable: etcd refused or timed out (UNAVAILABLE).
            aetcd.ClientError: etcd refused otherwise, or the revision was
                compacted away during every attempt.
        """
        for attempt in range(1, _LOAD_ATTEMPTS + 1):
            try:
                return await self._load_once()
            except _Compacted:
                _log.info("load of %s: compacted between pages (attempt %d)", self._prefix, attempt)
        raise aetcd.ClientError(f"load of {self._prefix!r}: compacted during every attempt")

    async def _load_once(self) -> Snapshot:
        records: dict[Collection, dict[str, bytes]] = {c: {} for c in Collection}
        start = self._prefix
        end = aetcd.utils.prefix_range_end(self._prefix)
        revision = 0
        while True:
            request = aetcd.rpc.RangeRequest(
                key=start, range_end=end, limit=self._page_keys, revision=revision
            )
            response = await self._range(request)
            if revision == 0:
                revision = int(response.header.revision)
            for kv in response.kvs:
                parsed = parse_record_key(self._prefix, bytes(kv.key))
                if parsed is not None:
                    records[parsed[0]][parsed[1]] = bytes(kv.value)
            if not response.more or not response.kvs:
                return Snapshot(revision, records)
            start = bytes(response.kvs[-1].key) + b"\x00"

    async def _range(self, request: Any) -> Any:
        await self._client.connect()
        try:
            return await self._client.kvstub.Range(
                request, timeout=self._timeout_s, metadata=self._client.metadata
            )
        except aetcd.rpc.AioRpcError as exc:
            code = exc.code()
            if code == aetcd.rpc.StatusCode.OUT_OF_RANGE:
                raise _Compacted() from exc
            if code in (aetcd.rpc.StatusCode.UNAVAILABLE, aetcd.rpc.StatusCode.DEADLINE_EXCEEDED):
                raise EtcdUnavailable("load", exc, outcome_unknown=False) from exc
            raise aetcd.ClientError(exc.details()) from exc


def _txn_revision(response: Any) -> int:
    kind = response.WhichOneof("response")
    return int(getattr(response, kind).header.revision)


# ---------------------------------------------------------------- read cache


class ReadCache:
    """A follower's copy of a cluster's records, kept current by an etcd watch.

    Create it, run :meth:`run` as a task, read :meth:`records` / :meth:`get`
    and :attr:`revision`; cancel the task (before closing the client) to stop.

    Args:
        store: the store of the cluster to follow (its client and prefix).
        retry_interval_s: pause before retrying a failed load or watch.
    """

    def __init__(self, store: EtcdStore, *, retry_interval_s: float = RETRY_INTERVAL_S) -> None:
        self._store = store
        self._retry_interval_s = retry_interval_s
        self._records: dict[Collection, dict[str, bytes]] = {c: {} for c in Collection}
        self._revision = 0
        self._reloads = 0
        self._loaded = asyncio.Event()
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    @property
    def revision(self) -> int:
        """The etcd revision the cache reflects; 0 before the first load."""
        return self._revision

    @property
    def reloads(self) -> int:
        """Full reloads after the first load (each one after a compaction)."""
        return self._reloads

    @property
    def loaded(self) -> bool:
        """True once the first load is in."""
        return self._loaded.is_set()

    def records(self, collection: Collection) -> Mapping[str, bytes]:
        """Return the records of a collection, name → value.

        Args:
            collection: the kind of record.

        Returns:
            A read-only live view, current until the next reload; copy it to
            keep a snapshot.
        """
        return MappingProxyType(self._records[collection])

    def get(self, collection: Collection, name: str) -> bytes | None:
        """Return one record's value, or None when absent.

        Args:
            collection: the kind of record.
            name: its id within the collection.

        Returns:
            The serialised record, or None.
        """
        return self._records[collection].get(name)

    async def wait_loaded(self) -> None:
        """Wait for the first load."""
        await self._loaded.wait()

    async def wait_for_revision(self, revision: int) -> None:
        """Wait until the cache reflects ``revision`` (e.g. one returned by ``EtcdStore.write``).

        Only revisions of changes under the cluster prefix are ever reached
        through the watch; the caller bounds the wait.

        Args:
            revision: an etcd revision.
        """
        if self._revision >= revision:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((revision, future))
        await future

    async def run(self) -> None:
        """Load, then follow the watch forever; reload after a compaction.

        Returns only by cancellation. Errors are logged and retried (see the
        module docstring).
        """
        while True:
            await self._reload()
            await self._follow()
            self._reloads += 1

    async def _reload(self) -> None:
        while True:
            try:
                snapshot = await self._store.load()
            except (StoreError, aetcd.ClientError) as exc:
                _log.warning("read cache: load failed (%r); retrying", exc)
                await asyncio.sleep(self._retry_interval_s)
                continue
            self._records = {c: dict(snapshot.records.get(c, {})) for c in Collection}
            self._advance(snapshot.revision)
            self._loaded.set()
            _log.info("read cache: loaded %s at revision %d", self._store.prefix, snapshot.revision)
            return

    async def _follow(self) -> None:
        """Apply watch events; return when the history needed was compacted."""
        prefix = self._store.prefix
        while True:
            try:
                watch = await open_watch(
                    self._store.client,
                    prefix,
                    range_end=aetcd.utils.prefix_range_end(prefix),
                    start_revision=self._revision + 1,
                )
                try:
                    async for event in watch:
                        self._apply(event)
                finally:
                    await cancel_watch(watch)
            except aetcd.RevisionCompactedError as exc:
                _log.warning(
                    "read cache: revision %d compacted (%r); reloading", self._revision + 1, exc
                )
                return
            except aetcd.ClientError as exc:
                _log.warning("read cache: watch failed at revision %d (%r)", self._revision, exc)
            await asyncio.sleep(self._retry_interval_s)

    def _apply(self, event: Any) -> None:
        parsed = parse_record_key(self._store.prefix, bytes(event.kv.key))
        if parsed is not None:
            collection, name = parsed
            if event.kind == aetcd.EventKind.DELETE:
                self._records[collection].pop(name, None)
            else:
                self._records[collection][name] = bytes(event.kv.value)
        self._advance(int(event.kv.mod_revision))

    def _advance(self, revision: int) -> None:
        self._revision = max(self._revision, revision)
        ready = [w for w in self._waiters if w[0] <= self._revision]
        if not ready:
            return
        self._waiters = [w for w in self._waiters if w[0] > self._revision]
        for _, future in ready:
            if not future.done():
                future.set_result(None)
