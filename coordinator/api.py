"""CoordinatorService on grpc.aio: task intake and the read RPCs.

Theory of operation: every replica serves this service.

- *Writes* (``SubmitTask``, ``CancelTask``, ``DrainNode``, ``UncordonNode``,
  ``MigrateTask``): the leader translates the request into a core event
  (``TaskSubmitted``, ``CancelRequested``, ``DrainRequested``,
  ``UncordonRequested``, ``MigrateRequested``) and answers with the core's
  ``ReplyToRequest``, which the runtime hands back only after the step's
  fenced etcd writes committed. The step runs shielded from the caller's
  deadline: when the deadline passes first the caller gets DEADLINE_EXCEEDED
  and the write may still be applied (retry; the proto says so). A follower
  proxies the call unchanged to the leader it reads from the election and
  relays the answer or the error; with no leader known it answers
  UNAVAILABLE (trailing metadata ``lazarus-leader-address``).
- *Reads* (``GetTask``, ``ListTasks``, ``ListNodes``, ``GetClusterStatus``):
  the leader answers from its core's snapshot (liveness included); a follower
  from its ``ReadCache`` (records only). ``read_revision`` is the revision of
  the replica's cache.
- Request fields the core never sees are checked here (INVALID_ARGUMENT names
  the field): ids that must not be empty, ``reason`` (at most 1,024 bytes),
  ``release_timeout_ms`` (at most ``MAX_RELEASE_TIMEOUT_MS``), ``states``
  filters, ``page_token``, WatchEvents ``types``. SubmitTask's fields are
  judged by the core.
- MigrateTask answers ABORTED when ``expected_epoch`` is not the task's epoch
  (a lost compare-and-set race, gRPC's ABORTED); ``move_id`` is the id of the
  request the leader generates.
- *WatchEvents*: the leader serves it from its event log
  (``coordinator.eventlog``: revisions are ``term << 32 | counter``, the
  newest 50,000 events of its term retained); followers proxy the stream to
  the leader and relay its end. Events with revision >= ``from_revision`` are
  replayed, then live ones follow; ``from_revision`` 0 means live only.
  Events older than the leader's memory (an earlier term's, or evicted) are
  replayed first from the Redis event archive (``coordinator.eventarchive``),
  so a watch resumed after a failover misses nothing the old leader had
  archived. When ``from_revision`` is older than the oldest event retained
  (in the archive, or in memory when the archive is empty or unreadable) the
  stream does NOT fail with OUT_OF_RANGE: it starts at the oldest retained
  event and says so in its initial metadata, ``lazarus-watch-gap: 1`` and
  ``lazarus-watch-oldest-revision: <revision>`` (events in between may be
  missing; re-read state with ListTasks / ListNodes). A change of leader
  ends every stream with UNAVAILABLE: reconnect with the last revision + 1.
  A watcher that falls ``DEFAULT_QUEUE_LIMIT`` events behind is ended with
  RESOURCE_EXHAUSTED, so it never stalls the leader. ``progress_interval_ms``
  (at least ``MIN_PROGRESS_INTERVAL_MS``) sends empty responses carrying the
  revision everything up to which was sent or filtered out.
- *GetCheckpoint*: any replica reads Redis itself (no proxy). Redis keeps
  only each task's newest replicated checkpoint and the journal after it, so
  a ``seq`` / ``checkpoint_ref`` selector answers NOT_FOUND unless it names
  that newest checkpoint, and ``at_or_before_journal_seq`` unless the newest
  one qualifies. UNAVAILABLE when Redis cannot be reached; DATA_LOSS when a
  record does not parse or fails its checksum.

Pages are ordered by id; a page token is the last id returned plus a digest of
the filters, so a token used with other filters is refused.

"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import logging
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, NoReturn, TypeAlias, TypeVar

import aetcd
import google_crc32c
import grpc
import grpc.aio
import redis.asyncio
import redis.exceptions
from google.protobuf.message import DecodeError, Message

from coordinator import convert
from coordinator.core import (
    CancelRequested,
    DrainRequested,
    Event,
    MigrateRequested,
    NodeRecord,
    NodeState,
    NodeView,
    ReplyToRequest,
    Role,
    StatusCode,
    TaskRecord,
    TaskState,
    TaskSubmitted,
    UncordonRequested,
)
from coordinator.core.limits import LIMITS, watch_filter_problem
from coordinator.core.records import CheckpointSummary, labels_match
from coordinator.etcd_store import Collection, ReadCache
from coordinator.eventarchive import EventArchive
from coordinator.eventlog import EventFilter, Watcher
from coordinator.leaderchannels import LeaderChannels
from coordinator.members import list_members
from coordinator.recordarchive import RecordArchive
from coordinator.redisconn import redis_client
from coordinator.runtime import CoordinatorRuntime, NotLeading, grpc_status
from lazarus.storage.errors import CorruptedRecord
from lazarus.storage.keys import fork_key
from lazarus.storage.replica import (
    Outcome,
    RedisCheckpointReplica,
    RemoteState,
    ReplicationItem,
)
from lazarus.tls import ClientTls
from lazarus.v1 import coordinator_pb2, coordinator_pb2_grpc, records_pb2

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "LEADER_ADDRESS_METADATA",
    "MAX_PAGE_SIZE",
    "CoordinatorApi",
    "add_coordinator_service",
]

_log = logging.getLogger("lazarus.coordinator.api")

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
LEADER_ADDRESS_METADATA = "lazarus-leader-address"
SERVICE_NAME = "lazarus.v1.CoordinatorService"
WATCH_GAP_METADATA = "lazarus-watch-gap"
"""Initial metadata of a WatchEvents stream that could not start at from_revision ("1")."""
WATCH_OLDEST_METADATA = "lazarus-watch-oldest-revision"
"""Initial metadata with the oldest revision the leader still held when the stream started."""
MAX_REASON_BYTES = LIMITS.reason_bytes
MAX_ID_BYTES = LIMITS.id_bytes
MAX_RELEASE_TIMEOUT_MS = 24 * 3600 * 1000
"""Longest release timeout a DrainNode / MigrateTask may ask for (one day)."""
MIN_PROGRESS_INTERVAL_MS = 10
"""Shorter WatchEvents progress intervals are raised to this."""
MAX_EVENTS_PER_RESPONSE = 500
DEFAULT_JOURNAL_EVENTS = 1000
REDIS_TIMEOUT_S = 5.0
"""Connect and read timeout of the GetCheckpoint Redis client."""
ARCHIVE_TIMEOUT_S = 2.0
"""Bound on one read of the event archive while a WatchEvents stream starts."""

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
_T = TypeVar("_T")


class _TaskMemo:
    """Decoded and encoded task records, reused while a record is unchanged.

    A ListTasks decodes every cached record on a follower and encodes the
    chosen ones; polled every 100 ms over 1,000 tasks that took a tenth of a
    core, during a recovery too. Records are immutable: a decoded record is
    reused while its etcd value is the same bytes, an encoded one while the
    record is the same object (the leader's core replaces a record on change).
    """

    def __init__(self) -> None:
        self._decoded: dict[str, tuple[bytes, TaskRecord]] = {}
        self._encoded: dict[str, tuple[TaskRecord, records_pb2.TaskRecord]] = {}

    def decode(self, name: str, data: bytes) -> TaskRecord:
        """The record of etcd value ``data``; DecodeError / ValueError when unreadable."""
        hit = self._decoded.get(name)
        if hit is not None and (hit[0] is data or hit[0] == data):
            return hit[1]
        record = convert.task_record_from_pb(records_pb2.TaskRecord.FromString(data))
        self._decoded[name] = (data, record)
        return record

    def encode(self, record: TaskRecord) -> records_pb2.TaskRecord:
        """``record`` as a message (do not mutate it: it is shared)."""
        hit = self._encoded.get(record.task_id)
        if hit is not None and hit[0] is record:
            return hit[1]
        message = convert.task_record_to_pb(record)
        self._encoded[record.task_id] = (record, message)
        return message

    def prune(self, live: AbstractSet[str] | Mapping[str, bytes]) -> None:
        """Forget records whose task id is not in ``live``."""
        for memo in (self._decoded, self._encoded):
            if len(memo) > len(live) + 64:
                for name in [n for n in memo if n not in live]:
                    del memo[name]


class ForkSeedRefused(Exception):
    """Redis already holds state under a fork's new task id (the fork fails)."""


class _Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _invalid(message: str) -> _Refused:
    return _Refused(grpc.StatusCode.INVALID_ARGUMENT, message)


@dataclass(frozen=True, slots=True)
class _Page:
    after: str
    size: int


def _filter_digest(request: Message) -> str:
    copy = type(request)()
    copy.CopyFrom(request)
    copy.ClearField("page_size")
    copy.ClearField("page_token")
    return hashlib.sha256(copy.SerializeToString(deterministic=True)).hexdigest()[:16]


def _page(request: Any) -> _Page:
    size = request.page_size or DEFAULT_PAGE_SIZE
    size = min(size, MAX_PAGE_SIZE)
    token: str = request.page_token
    if not token:
        return _Page("", size)
    try:
        decoded = json.loads(base64.urlsafe_b64decode(token.encode()).decode())
        after = decoded["after"]
        digest = decoded["filters"]
    except (binascii.Error, ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise _invalid("page_token: malformed") from exc
    if not isinstance(after, str) or digest != _filter_digest(request):
        raise _invalid("page_token: issued for different filters")
    return _Page(after, size)


def _token(request: Message, after: str) -> str:
    body = json.dumps({"after": after, "filters": _filter_digest(request)})
    return base64.urlsafe_b64encode(body.encode()).decode()


def _paginate(
    items: Sequence[_T], key: Callable[[_T], str], page: _Page, request: Message
) -> tuple[list[_T], str]:
    rest = [item for item in items if key(item) > page.after]
    chosen = rest[: page.size]
    more = len(rest) > page.size
    return chosen, _token(request, key(chosen[-1])) if more and chosen else ""


def _check_id(value: str, field: str) -> None:
    if not value:
        raise _invalid(f"{field}: must not be empty")
    if len(value.encode()) > MAX_ID_BYTES:
        raise _invalid(f"{field}: must be at most {MAX_ID_BYTES} bytes")


def _check_reason(value: str) -> None:
    if len(value.encode()) > MAX_REASON_BYTES:
        raise _invalid(f"reason: must be at most {MAX_REASON_BYTES} bytes")


def _release_timeout_s(value_ms: int) -> float | None:
    if value_ms > MAX_RELEASE_TIMEOUT_MS:
        raise _invalid(f"release_timeout_ms: must be at most {MAX_RELEASE_TIMEOUT_MS}")
    return value_ms / 1000.0 if value_ms else None


def _check_watch_filter(request: coordinator_pb2.WatchEventsRequest) -> frozenset[int]:
    problem = watch_filter_problem(len(request.types), request.task_id, request.node_id)
    if problem:
        raise _invalid(problem)
    return _check_event_types(request.types)


def _check_event_types(values: Sequence[int]) -> frozenset[int]:
    known = {v.number for v in records_pb2.EventType.DESCRIPTOR.values}
    for index, value in enumerate(values):
        if value == records_pb2.EVENT_TYPE_UNSPECIFIED:
            raise _invalid(f"types[{index}]: EVENT_TYPE_UNSPECIFIED is not a type")
        if value not in known:
            raise _invalid(f"types[{index}]: {value} is not a known EventType")
    return frozenset(values)


def verify_record_checksum(record: Any) -> bool:
    """Check a CheckpointRecord / JournalEventRecord against its ``checksum``.

    The digest covers the record serialised deterministically with ``checksum``
    cleared (records.proto). A record without a checksum passes (nothing to
    verify); one with a checksum but no known algorithm fails.

    Returns:
        True when the record is intact or carries no checksum.
    """
    if not record.checksum:
        return True
    copy = type(record)()
    copy.CopyFrom(record)
    copy.ClearField("checksum")
    data = copy.SerializeToString(deterministic=True)
    algorithm = record.checksum_algorithm
    if algorithm == records_pb2.CHECKSUM_ALGORITHM_CRC32:
        digest = zlib.crc32(data).to_bytes(4, "big")
    elif algorithm == records_pb2.CHECKSUM_ALGORITHM_CRC32C:
        digest = int(google_crc32c.value(data)).to_bytes(4, "big")
    elif algorithm == records_pb2.CHECKSUM_ALGORITHM_SHA256:
        digest = hashlib.sha256(data).digest()
    else:
        return False
    return bytes(record.checksum) == digest


def _check_states(values: Iterable[int], kind: Any, field: str) -> set[int]:
    states = set(values)
    known = {member.value for member in kind}
    for index, value in enumerate(values):
        if value not in known:
            raise _invalid(f"{field}[{index}]: {value} is not a valid state")
    return states


class CoordinatorApi:
    """Serves the implemented CoordinatorService RPCs for one replica.

    Args:
        runtime: the replica's runtime (leader state, election).
        cache: the replica's etcd read cache (reads on followers, read_revision).
        redis_url: where GetCheckpoint reads replicated checkpoints.
        etcd_client: where GetClusterStatus reads member records (None: it
            lists no members).
        archive: the Redis event archive WatchEvents replays earlier terms
            from (None: memory only).
        member_tls: how to dial the leader when proxying (None: plaintext).
    """

    def __init__(
        self,
        runtime: CoordinatorRuntime,
        cache: ReadCache,
        *,
        redis_url: str = "redis://127.0.0.1:6379/0",
        redis_password: str = "",
        redis_ca_file: str = "",
        etcd_client: aetcd.Client | None = None,
        archive: EventArchive | None = None,
        member_tls: ClientTls | None = None,
        records: RecordArchive | None = None,
    ) -> None:
        self._member_tls = member_tls or ClientTls()
        self._runtime = runtime
        self._records = records
        self._cache = cache
        self._etcd = etcd_client
        self._archive = archive
        self._task_memo = _TaskMemo()
        # Proxy channels by leader address (TLS with the member certificate); a
        # leader change closes those of older leaders, after a grace.
        self._channels = LeaderChannels(self._member_tls.aio_channel)
        self._redis_url = redis_url
        self._leader_ids: dict[int, str] = {}  # term -> leader member id (followers)
        self._redis_password = redis_password
        self._redis_ca_file = redis_ca_file
        self._redis: redis.asyncio.Redis | None = None
        self._pending: set[asyncio.Task[ReplyToRequest]] = set()
        runtime.fork_seeder = self._seed_fork

    async def close(self) -> None:
        """Close the proxy channels to leaders and the Redis client."""
        await self._channels.close()
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None

    # ------------------------------------------------------------------ writes

    async def SubmitTask(
        self, request: coordinator_pb2.SubmitTaskRequest, context: Context
    ) -> coordinator_pb2.SubmitTaskResponse:
        """Submit a task (idempotent on request_id); see coordinator.proto for the statuses."""
        runtime = self._runtime
        if not runtime.leading:
            response: coordinator_pb2.SubmitTaskResponse = await self._proxy(
                "SubmitTask", request, coordinator_pb2.SubmitTaskResponse, context
            )
            return response
        try:
            spec = convert.task_spec_from_pb(request.spec)
        except ValueError as exc:  # an enum number this coordinator does not know
            field = next(
                (
                    f"spec.{name}"
                    for name in ("durability", "state_model")
                    if str(getattr(request.spec, name)) in str(exc)
                ),
                "spec",
            )
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {exc}")
            raise AssertionError("unreachable") from exc
        event = TaskSubmitted(
            request_id=request.request_id, spec=spec, now_s=0.0, task_id=request.task_id
        )
        reply = await self._request(event, request.request_id, context)
        task = self._task_after(reply)
        if task is None:  # stepped down between the reply and this read
            await self._unavailable(context)
        return coordinator_pb2.SubmitTaskResponse(
            task=convert.task_record_to_pb(task), created=reply.created
        )

    async def _request(self, event: Event, request_id: str, context: Context) -> ReplyToRequest:
        """Feed a write to the leader's core; abort unless the reply is OK.

        The step runs in its own task, shielded from the caller: a deadline or
        a cancelled call must not cut a step off between its etcd write and
        its directives. DEADLINE_EXCEEDED when the caller's deadline passes
        first (the write may still be applied).
        """
        task = asyncio.create_task(self._runtime.request(event, request_id))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        remaining = context.time_remaining()
        try:
            async with asyncio.timeout(remaining):
                reply = await asyncio.shield(task)
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                "the deadline passed before the leader answered; the write may be applied",
            )
            raise AssertionError("unreachable") from None
        except NotLeading:
            await self._unavailable(context)
        if reply.status is not StatusCode.OK:
            await context.abort(grpc_status(reply.status), reply.message)
        return reply

    def _task_after(self, reply: ReplyToRequest) -> TaskRecord | None:
        return self._runtime.core.task(reply.task_id) if self._runtime.leading else None

    async def _validated(self, context: Context, check: Callable[[], _T]) -> _T:
        try:
            return check()
        except _Refused as exc:
            await context.abort(exc.code, exc.message)
            raise AssertionError("unreachable") from exc

    async def CancelTask(
        self, request: coordinator_pb2.CancelTaskRequest, context: Context
    ) -> coordinator_pb2.CancelTaskResponse:
        """Cancel a task: INVALID_ARGUMENT (task_id, reason), NOT_FOUND, FAILED_PRECONDITION."""

        def check() -> None:
            _check_id(request.task_id, "task_id")
            _check_reason(request.reason)

        await self._validated(context, check)
        if not self._runtime.leading:
            response: coordinator_pb2.CancelTaskResponse = await self._proxy(
                "CancelTask", request, coordinator_pb2.CancelTaskResponse, context
            )
            return response
        request_id = f"cancel-{uuid.uuid4().hex}"
        event = CancelRequested(request_id, request.task_id, 0.0, request.reason)
        reply = await self._request(event, request_id, context)
        task = self._task_after(reply)
        if task is None:
            await self._unavailable(context)
        return coordinator_pb2.CancelTaskResponse(task=convert.task_record_to_pb(task))

    async def DrainNode(
        self, request: coordinator_pb2.DrainNodeRequest, context: Context
    ) -> coordinator_pb2.DrainNodeResponse:
        """Cordon a node and release its tasks: INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION."""

        def check() -> float | None:
            _check_id(request.node_id, "node_id")
            _check_reason(request.reason)
            return _release_timeout_s(request.release_timeout_ms)

        timeout_s = await self._validated(context, check)
        if not self._runtime.leading:
            response: coordinator_pb2.DrainNodeResponse = await self._proxy(
                "DrainNode", request, coordinator_pb2.DrainNodeResponse, context
            )
            return response
        request_id = f"drain-{uuid.uuid4().hex}"
        event = DrainRequested(request_id, request.node_id, 0.0, request.reason, timeout_s)
        reply = await self._request(event, request_id, context)
        view = self._runtime.core.node(request.node_id) if self._runtime.leading else None
        if view is None:
            await self._unavailable(context)
        return coordinator_pb2.DrainNodeResponse(
            node=convert.public_node_record_to_pb(view.record),
            drain_id=view.record.drain_id,
            tasks_to_move=reply.tasks_to_move,
        )

    async def UncordonNode(
        self, request: coordinator_pb2.UncordonNodeRequest, context: Context
    ) -> coordinator_pb2.UncordonNodeResponse:
        """Lift a node's cordon (idempotent): INVALID_ARGUMENT (node_id), NOT_FOUND."""
        await self._validated(context, lambda: _check_id(request.node_id, "node_id"))
        if not self._runtime.leading:
            response: coordinator_pb2.UncordonNodeResponse = await self._proxy(
                "UncordonNode", request, coordinator_pb2.UncordonNodeResponse, context
            )
            return response
        request_id = f"uncordon-{uuid.uuid4().hex}"
        event = UncordonRequested(request_id, request.node_id, 0.0)
        await self._request(event, request_id, context)
        view = self._runtime.core.node(request.node_id) if self._runtime.leading else None
        if view is None:
            await self._unavailable(context)
        return coordinator_pb2.UncordonNodeResponse(
            node=convert.public_node_record_to_pb(view.record)
        )

    async def MigrateTask(
        self, request: coordinator_pb2.MigrateTaskRequest, context: Context
    ) -> coordinator_pb2.MigrateTaskResponse:
        """Move one owned task to another node gracefully; see coordinator.proto and the module doc.

        Errors: INVALID_ARGUMENT (task_id, target_node_id, reason,
        release_timeout_ms), NOT_FOUND (task, target node), FAILED_PRECONDITION
        (not ASSIGNED / RUNNING, a move in progress, target not ALIVE, cordoned,
        disconnected, the owner, or not matching the task), ABORTED
        (expected_epoch mismatch), RESOURCE_EXHAUSTED (no free slot on the
        target), UNAVAILABLE.
        """

        def check() -> float | None:
            _check_id(request.task_id, "task_id")
            if request.target_node_id:
                _check_id(request.target_node_id, "target_node_id")
            _check_reason(request.reason)
            return _release_timeout_s(request.release_timeout_ms)

        timeout_s = await self._validated(context, check)
        if not self._runtime.leading:
            response: coordinator_pb2.MigrateTaskResponse = await self._proxy(
                "MigrateTask", request, coordinator_pb2.MigrateTaskResponse, context
            )
            return response
        request_id = f"migrate-{uuid.uuid4().hex}"
        event = MigrateRequested(
            request_id,
            request.task_id,
            0.0,
            target_node_id=request.target_node_id,
            expected_epoch=request.expected_epoch if request.HasField("expected_epoch") else None,
            reason=request.reason,
            release_timeout_s=timeout_s,
        )
        reply = await self._request(event, request_id, context)
        task = self._task_after(reply)
        if task is None:
            await self._unavailable(context)
        return coordinator_pb2.MigrateTaskResponse(
            task=convert.task_record_to_pb(task), move_id=request_id
        )

    async def _proxy(
        self, method: str, request: Message, response_type: Any, context: Context
    ) -> Any:
        leader = None
        try:
            leader = await self._runtime.election.leader()
        except Exception as exc:  # etcd unreachable
            _log.warning("reading the leader failed: %s", exc)
        own = self._runtime.settings.advertise_address
        if leader is None or not leader.value or leader.value == own:
            await self._unavailable(context, leader.value if leader else "")
        channel = self._channel(leader.value)
        call = channel.unary_unary(
            f"/{SERVICE_NAME}/{method}",
            request_serializer=type(request).SerializeToString,
            response_deserializer=response_type.FromString,
        )
        remaining = context.time_remaining()
        try:
            return await call(request, timeout=remaining)
        except asyncio.CancelledError:
            if self._cut_by_leader_change(channel):
                await self._unavailable(context)  # ask the leader (writes are idempotent)
            raise
        except grpc.aio.AioRpcError as exc:
            context.set_trailing_metadata(((LEADER_ADDRESS_METADATA, leader.value),))
            await context.abort(exc.code(), exc.details() or "")

    async def _leader_member_id(self, address: str, term: int) -> str:
        """The leader's member id, asked of the leader itself (cached per term; "" if silent)."""
        cached = self._leader_ids.get(term)
        if cached:
            return cached
        call = self._channel(address).unary_unary(
            f"/{SERVICE_NAME}/GetClusterStatus",
            request_serializer=coordinator_pb2.GetClusterStatusRequest.SerializeToString,
            response_deserializer=coordinator_pb2.GetClusterStatusResponse.FromString,
        )
        try:
            reply = await call(coordinator_pb2.GetClusterStatusRequest(), timeout=1.0)
        except grpc.aio.AioRpcError:
            return ""
        if reply.serving_member_id and reply.leader_id == reply.serving_member_id:
            self._leader_ids = {term: reply.leader_id}
            return str(reply.leader_id)
        return ""

    async def _leader_address(self, context: Context) -> str:
        leader = None
        try:
            leader = await self._runtime.election.leader()
        except Exception as exc:  # etcd unreachable
            _log.warning("reading the leader failed: %s", exc)
        own = self._runtime.settings.advertise_address
        if leader is None or not leader.value or leader.value == own:
            await self._unavailable(context, leader.value if leader else "")
        return str(leader.value)

    def _channel(self, address: str) -> grpc.aio.Channel:
        return self._channels.get(address)

    def _cut_by_leader_change(self, channel: grpc.aio.Channel) -> bool:
        """Whether a proxied call on ``channel`` that raised CancelledError was cut
        because leader changes closed its channel (its grace ran out), rather
        than this handler being cancelled (its caller went)."""
        task = asyncio.current_task()
        return self._channels.retired(channel) and task is not None and not task.cancelling()

    async def _unavailable(self, context: Context, address: str = "") -> NoReturn:
        if not address:
            try:
                leader = await self._runtime.election.leader()
            except Exception:
                leader = None
            address = leader.value if leader is not None else ""
        if address:
            context.set_trailing_metadata(((LEADER_ADDRESS_METADATA, address),))
        where = f"; the leader is at {address}" if address else "; no leader is known"
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"this replica cannot serve writes{where}")
        raise AssertionError("unreachable")  # abort raises

    # ------------------------------------------------------------------ reads

    def _tasks(self) -> list[TaskRecord]:
        if self._runtime.leading:
            tasks = list(self._runtime.core.snapshot().tasks)
            self._task_memo.prune({t.task_id for t in tasks})
            return tasks
        out = []
        records = self._cache.records(Collection.TASKS)
        for name, data in sorted(records.items()):
            try:
                out.append(self._task_memo.decode(name, data))
            except (DecodeError, ValueError) as exc:
                _log.error("task record %r unreadable: %s", name, exc)
        self._task_memo.prune(records)
        return out

    def _nodes(self) -> list[tuple[NodeRecord, NodeView | None]]:
        if self._runtime.leading:
            return [(view.record, view) for view in self._runtime.core.snapshot().nodes]
        out: list[tuple[NodeRecord, NodeView | None]] = []
        for name, data in sorted(self._cache.records(Collection.NODES).items()):
            try:
                record = convert.node_record_from_pb(records_pb2.NodeRecord.FromString(data))
            except (DecodeError, ValueError) as exc:
                _log.error("node record %r unreadable: %s", name, exc)
                continue
            out.append((record, None))
        return out

    async def GetTask(
        self, request: coordinator_pb2.GetTaskRequest, context: Context
    ) -> coordinator_pb2.GetTaskResponse:
        """Read one task: INVALID_ARGUMENT (task_id empty), NOT_FOUND."""
        if not request.task_id or len(request.task_id.encode()) > 128:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "task_id: must be 1..128 bytes")
        if self._runtime.leading:
            task = self._runtime.core.task(request.task_id)
        else:
            data = self._cache.get(Collection.TASKS, request.task_id)
            task = (
                None
                if data is None
                else convert.task_record_from_pb(records_pb2.TaskRecord.FromString(data))
            )
        if task is None and self._runtime.leading:  # retired, but not yet deleted
            data = self._cache.get(Collection.TASKS, request.task_id)
            task = None if data is None else self._task_memo.decode(request.task_id, data)
        if task is None:
            task = await self._archived_task(request.task_id)
        if task is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"task_id: {request.task_id!r} not found"
            )
            raise AssertionError("unreachable")  # abort raises
        return coordinator_pb2.GetTaskResponse(
            task=convert.task_record_to_pb(task),
            forks=await self._forks(request.task_id),
            read_revision=self._cache.revision,
        )

    async def _archived_task(self, task_id: str) -> TaskRecord | None:
        """A task retention moved out of etcd, from the Redis archive (None: none / unreadable)."""
        if self._records is None:
            return None
        try:
            async with asyncio.timeout(REDIS_TIMEOUT_S):
                data = await self._records.task(task_id)
        except (redis.exceptions.RedisError, OSError, TimeoutError) as exc:
            _log.warning("task %s: the record archive is unreadable: %s", task_id, exc)
            return None
        if data is None:
            return None
        try:
            return convert.task_record_from_pb(records_pb2.TaskRecord.FromString(data))
        except (DecodeError, ValueError) as exc:
            _log.error("archived task record %r unreadable: %s", task_id, exc)
            return None

    async def _forks(self, task_id: str) -> list[records_pb2.ForkRecord]:
        """The task's fork records, which fenced owners write to Redis (DESIGN.md §7).

        Best effort: when Redis does not answer the task is returned without them
        (and a warning is logged) rather than not at all.
        """
        try:
            self._replica()
            assert self._redis is not None
            async with asyncio.timeout(REDIS_TIMEOUT_S):
                raw = await self._redis.hgetall(fork_key(task_id))
        except Exception as exc:
            _log.warning("task %s: fork records unreadable: %s", task_id, exc)
            return []
        forks = []
        for value in raw.values():
            try:
                data = value if isinstance(value, bytes) else str(value).encode()
                forks.append(records_pb2.ForkRecord.FromString(data))
            except Exception:
                _log.warning("task %s: a fork record does not parse", task_id)
        return sorted(forks, key=lambda f: f.detected_at_unix_ms)

    async def ListTasks(
        self, request: coordinator_pb2.ListTasksRequest, context: Context
    ) -> coordinator_pb2.ListTasksResponse:
        """List tasks by filters, ordered by task_id, paginated."""
        try:
            states = _check_states(request.states, TaskState, "states")
            page = _page(request)
        except _Refused as exc:
            await context.abort(exc.code, exc.message)
            raise AssertionError("unreachable") from exc
        selector = convert.labels_of(request.labels)
        matching = [
            task
            for task in self._tasks()
            if (not states or task.state.value in states)
            and (not request.node_id or task.owner_node_id == request.node_id)
            and (not request.kind or task.spec.kind == request.kind)
            and labels_match(task.spec.labels, selector)
        ]
        chosen, token = _paginate(matching, lambda t: t.task_id, page, request)
        return coordinator_pb2.ListTasksResponse(
            tasks=[self._task_memo.encode(t) for t in chosen],
            next_page_token=token,
            read_revision=self._cache.revision,
        )

    async def ListNodes(
        self, request: coordinator_pb2.ListNodesRequest, context: Context
    ) -> coordinator_pb2.ListNodesResponse:
        """List nodes by filters, ordered by node_id, paginated; liveness on the leader."""
        try:
            states = _check_states(request.states, NodeState, "states")
            page = _page(request)
        except _Refused as exc:
            await context.abort(exc.code, exc.message)
            raise AssertionError("unreachable") from exc
        selector = convert.labels_of(request.labels)
        matching = [
            (record, view)
            for record, view in self._nodes()
            if (not states or record.state.value in states)
            and labels_match(record.labels, selector)
        ]
        chosen, token = _paginate(matching, lambda pair: pair[0].node_id, page, request)
        infos = []
        for record, view in chosen:
            info = coordinator_pb2.NodeInfo(record=convert.public_node_record_to_pb(record))
            if view is not None:
                info.liveness.CopyFrom(
                    coordinator_pb2.NodeLiveness(
                        connected=view.connected,
                        last_heartbeat_at_unix_ms=convert.s_to_ms(view.last_heartbeat_at_s),
                        heartbeat_interarrival_ms=(
                            0.0
                            if view.mean_interarrival_s is None
                            else view.mean_interarrival_s * 1000.0
                        ),
                        phi=view.phi,
                        load=convert.node_load_to_pb(view.load),
                        assigned_tasks=view.assigned_tasks,
                        session_replica=(
                            self._runtime.session_replica(view.session_id) if view.connected else ""
                        ),
                    )
                )
            infos.append(info)
        return coordinator_pb2.ListNodesResponse(
            nodes=infos, next_page_token=token, read_revision=self._cache.revision
        )

    async def GetClusterStatus(
        self, request: coordinator_pb2.GetClusterStatusRequest, context: Context
    ) -> coordinator_pb2.GetClusterStatusResponse:
        """Leader, term, members (leader first), node / task counts by state.

        Members come from the replicas' member records (``coordinator.members``),
        read from etcd on every call. UNAVAILABLE when etcd cannot be read.
        """
        runtime = self._runtime
        members: list[records_pb2.MemberRecord] = []
        try:
            leader = await runtime.election.leader()
            if self._etcd is not None:
                members = await list_members(
                    self._etcd, runtime.settings.cluster, runtime.election.prefix
                )
        except Exception as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot read etcd: {exc}")
            raise AssertionError("unreachable") from exc
        node_counts: dict[int, int] = {}
        for record, _ in self._nodes():
            node_counts[record.state.value] = node_counts.get(record.state.value, 0) + 1
        task_counts: dict[int, int] = {}
        for task in self._tasks():
            task_counts[task.state.value] = task_counts.get(task.state.value, 0) + 1
        guard = runtime.core.guard_active if runtime.core.role is Role.LEADER else False
        leader_id = runtime.settings.member_id if runtime.leading else ""
        if not runtime.leading and leader is not None and leader.value:
            known = [m.member_id for m in members if m.candidacy_revision == leader.term]
            leader_id = known[0] if known else ""
            if not leader_id:  # its record is not written yet: ask the leader
                leader_id = await self._leader_member_id(leader.value, leader.term)
        return coordinator_pb2.GetClusterStatusResponse(
            cluster_name=runtime.settings.cluster,
            leader_id=leader_id,
            leader_address=leader.value if leader is not None else "",
            term=leader.term if leader is not None else 0,
            members=members,
            serving_member_id=runtime.settings.member_id,
            nodes_by_state=[
                coordinator_pb2.NodeStateCount(state=s, count=c)  # type: ignore[arg-type]
                for s, c in sorted(node_counts.items())
            ],
            tasks_by_state=[
                coordinator_pb2.TaskStateCount(state=s, count=c)  # type: ignore[arg-type]
                for s, c in sorted(task_counts.items())
            ],
            mass_failure_guard_active=guard,
            read_revision=self._cache.revision,
            now_unix_ms=convert.s_to_ms(runtime.now_s()),
            sessions_by_replica=runtime.sessions_by_replica() if runtime.leading else {},
            quarantined=self._quarantined(),
        )

    def _quarantined(self) -> list[records_pb2.QuarantinedRecord]:
        """Records moved aside at load (``coordinator.core.loadcheck``), without their bytes."""
        out = []
        for name, data in sorted(self._cache.records(Collection.QUARANTINE).items()):
            try:
                record = records_pb2.QuarantinedRecord.FromString(data)
            except DecodeError:
                collection, _, rest = name.partition("/")
                record = records_pb2.QuarantinedRecord(
                    collection=collection, name=rest, reason="(quarantine entry unreadable)"
                )
            record.ClearField("value")
            out.append(record)
        return out

    # ------------------------------------------------------------------ later issues

    async def ForkTask(
        self, request: coordinator_pb2.ForkTaskRequest, context: Context
    ) -> coordinator_pb2.ForkTaskResponse:
        """A new task from a replicated checkpoint with state edits (fork semantics).

        Follows the checkpointer seeds' ``fork(from, edits)``: the source
        checkpoint (the newest one Redis holds of its task) is read, each edit
        sets one top-level key of its JSON-object state, and the result is
        submitted with the new task; the core validates the fork first and
        only once it accepted it (the task persisted, its id taken) is the
        seed written to Redis as the new task's first checkpoint (seq 1,
        epoch 1, ``parent_ref`` = the source; ``SeedFork``), before the task
        can be placed, so its first owner resumes from it. A refused fork
        leaves nothing in Redis, and a seed is never written under an id that
        has state (UNAVAILABLE and the task FAILED when the seed cannot be
        written). Idempotent on ``request_id``. Statuses as in
        coordinator.proto. Followers proxy the whole call to the leader.
        """
        if not self._runtime.leading:
            proxied: coordinator_pb2.ForkTaskResponse = await self._proxy(
                "ForkTask", request, coordinator_pb2.ForkTaskResponse, context
            )
            return proxied
        problems: list[str] = []
        ref = request.from_checkpoint_ref
        source, at, seq_text = ref.rpartition("@")
        if not request.request_id or len(request.request_id.encode()) > 128:
            problems.append("request_id: must be 1..128 bytes")
        if not ref or not at or not source or not seq_text.isdigit() or int(seq_text) < 1:
            problems.append("from_checkpoint_ref: malformed, want <task_id>@<seq>")
        new_id = request.new_task_id
        if new_id and (
            len(new_id.encode()) > 128 or any(ord(c) < 0x21 or c == "/" for c in new_id)
        ):
            problems.append("new_task_id: must be 1..128 bytes without spaces or '/'")
        edits: dict[str, Any] = {}
        for i, edit in enumerate(request.edits):
            if not edit.key:
                problems.append(f"edits[{i}].key: must not be empty")
                continue
            try:
                edits[edit.key] = json.loads(edit.value_json)
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                problems.append(f"edits[{i}].value_json: not JSON: {exc}")
        if problems:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(problems))
        state = await self._load_replicated(source, context)
        checkpoint = state.checkpoint if state is not None else None
        if checkpoint is None or checkpoint.seq != int(seq_text):
            newest = f" (the newest replicated one is seq {checkpoint.seq})" if checkpoint else ""
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"from_checkpoint_ref: no replicated checkpoint {ref!r}{newest}",
            )
            raise AssertionError("unreachable")
        payload = bytes(checkpoint.payload)
        if edits:
            try:
                body = json.loads(payload)
            except (UnicodeDecodeError, json.JSONDecodeError):
                body = None
            if not isinstance(body, dict):
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"edits: the state of {ref!r} is not a JSON object",
                )
                raise AssertionError("unreachable")
            body.update(edits)
            payload = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
        if request.HasField("spec"):
            spec = request.spec
        else:
            source_task = await self._source_spec(source)
            if source_task is None:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"spec: the source task {source!r} is unknown; give the new task's spec",
                )
                raise AssertionError("unreachable")
            spec = source_task
        digest = hashlib.sha256(request.request_id.encode()).hexdigest()[:12]
        task_id = new_id or f"{source}.fork-{digest}"
        seed = records_pb2.CheckpointRecord(
            task_id=task_id,
            epoch=1,
            seq=1,
            covers_journal_seq=0,
            checkpoint_ref=f"{task_id}@1",
            label=f"fork-of:{ref}",
            payload=payload,
            encoding=records_pb2.PAYLOAD_ENCODING_RAW,
            content_type=checkpoint.content_type or "application/json",
            decoded_bytes=len(payload),
            created_at_unix_ms=int(time.time() * 1000),
            node_id=f"coordinator:{self._runtime.settings.member_id}",
            parent_ref=ref,
        )
        event = TaskSubmitted(
            request_id=request.request_id,
            spec=convert.task_spec_from_pb(spec),
            now_s=0.0,
            task_id=task_id,
            forked_from_ref=ref,
            fork_edits=len(edits),
            fork_seed=seed.SerializeToString(),
        )
        # The core decides first; the seed is written only once it accepted the
        # fork (its SeedFork command, after the task's persist), so a refused
        # fork leaves nothing in Redis.
        result = await self._request(event, request.request_id, context)
        task = self._task_after(result)
        if task is None:
            await self._unavailable(context)
        assert task is not None
        error = task.last_error
        if result.created and error is not None and error.code.name == "RESTORE_FAILED":
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"task {task_id!r}: {error.message}")
        task_pb = convert.task_record_to_pb(task)
        created = result.created
        summary = records_pb2.CheckpointSummary(
            checkpoint_ref=seed.checkpoint_ref,
            task_id=task_id,
            epoch=1,
            seq=1,
            label=seed.label,
            created_at_unix_ms=seed.created_at_unix_ms,
            stored_bytes=len(payload),
            replicated=True,
        )
        return coordinator_pb2.ForkTaskResponse(
            task_id=task_pb.task_id, task=task_pb, checkpoint=summary, created=created
        )

    async def _seed_fork(self, task_id: str, data: bytes) -> CheckpointSummary:
        """Write an accepted fork's seed as its task's first checkpoint (``SeedFork``).

        Raises:
            ForkSeedRefused: Redis already holds state under ``task_id`` (a fork
                never seeds into a task that has state).
            redis.exceptions.RedisError, OSError, TimeoutError: Redis unreachable.
        """
        seed = records_pb2.CheckpointRecord.FromString(data)
        replica = self._replica()
        async with asyncio.timeout(REDIS_TIMEOUT_S):
            existing = await replica.load(task_id)
            if existing is not None and (existing.checkpoint is not None or existing.epoch):
                raise ForkSeedRefused(f"Redis already holds state of {task_id!r}")
            wrote = await replica.write(ReplicationItem(task_id, 1, seed.node_id, checkpoint=seed))
        if wrote.outcome is Outcome.STALE:
            raise ForkSeedRefused(f"Redis already holds newer state of {task_id!r}")
        return CheckpointSummary(
            checkpoint_ref=seed.checkpoint_ref,
            epoch=1,
            seq=1,
            replicated=True,
            task_id=task_id,
            label=seed.label,
            created_at_unix_ms=seed.created_at_unix_ms,
            stored_bytes=len(seed.payload),
            node_id=seed.node_id,
            parent_ref=seed.parent_ref,
        )

    async def _source_spec(self, task_id: str) -> records_pb2.TaskSpec | None:
        if self._runtime.leading:
            task = self._runtime.core.task(task_id)
            return convert.task_spec_to_pb(task.spec) if task is not None else None
        data = self._cache.get(Collection.TASKS, task_id)
        return records_pb2.TaskRecord.FromString(data).spec if data is not None else None

    # ------------------------------------------------------------------ events

    async def WatchEvents(
        self, request: coordinator_pb2.WatchEventsRequest, context: Context
    ) -> AsyncIterator[coordinator_pb2.WatchEventsResponse]:
        """Stream events from from_revision, then live; see the module docstring.

        Errors: INVALID_ARGUMENT (types), UNAVAILABLE (no leader, or the
        leader changed: resume from the last revision + 1), RESOURCE_EXHAUSTED
        (this watcher fell too far behind).
        """
        types = await self._validated(context, lambda: _check_watch_filter(request))
        if not self._runtime.leading:
            async for response in self._proxy_watch(request, context):
                yield response
            return
        log = self._runtime.event_log
        event_filter = EventFilter(types=types, task_id=request.task_id, node_id=request.node_id)
        live_after = log.last_revision
        watcher = log.subscribe(request.from_revision, event_filter)
        try:
            gap, oldest = watcher.gap, watcher.first_revision
            # What memory no longer holds (an earlier term, or pushed out) comes
            # from the archive: revisions below the oldest the watcher replays.
            before = watcher.first_revision or live_after + 1
            archived = 0
            if gap and self._archive is not None:
                try:
                    async with asyncio.timeout(ARCHIVE_TIMEOUT_S):
                        archived = await self._archive.oldest_revision()
                except (redis.exceptions.RedisError, OSError, TimeoutError) as exc:
                    _log.warning("event archive unreadable (%s); replaying memory only", exc)
            if archived:
                gap = request.from_revision < archived
                oldest = archived
            if gap:
                await context.send_initial_metadata(
                    ((WATCH_GAP_METADATA, "1"), (WATCH_OLDEST_METADATA, str(oldest)))
                )
            if archived:
                async for response in self._replay_archive(
                    max(request.from_revision, archived), before, event_filter
                ):
                    yield response
            async for response in _drain(watcher, request.progress_interval_ms):
                yield response
            code, message = watcher.closed or (grpc.StatusCode.UNAVAILABLE, "stream ended")
            if code is grpc.StatusCode.UNAVAILABLE:
                await self._unavailable_stream(context, message)
            await context.abort(code, message)
        finally:
            log.unsubscribe(watcher)

    async def _replay_archive(
        self, from_revision: int, before: int, event_filter: EventFilter
    ) -> AsyncIterator[coordinator_pb2.WatchEventsResponse]:
        """Archived events in [from_revision, before) that match, paged; stops on a Redis error."""
        assert self._archive is not None
        cursor = from_revision
        while cursor:
            try:
                async with asyncio.timeout(ARCHIVE_TIMEOUT_S):
                    events, cursor = await self._archive.read(cursor, before)
            except (redis.exceptions.RedisError, OSError, TimeoutError) as exc:
                _log.warning("event archive read failed (%s); the replay stops here", exc)
                return
            matching = [e for e in events if event_filter.matches(e)]
            for start in range(0, len(matching), MAX_EVENTS_PER_RESPONSE):
                chunk = matching[start : start + MAX_EVENTS_PER_RESPONSE]
                yield coordinator_pb2.WatchEventsResponse(events=chunk, revision=chunk[-1].revision)

    async def _unavailable_stream(self, context: Context, message: str) -> NoReturn:
        try:
            leader = await self._runtime.election.leader()
        except Exception:
            leader = None
        if leader is not None and leader.value:
            context.set_trailing_metadata(((LEADER_ADDRESS_METADATA, leader.value),))
        await context.abort(grpc.StatusCode.UNAVAILABLE, message)
        raise AssertionError("unreachable")

    async def _proxy_watch(
        self, request: coordinator_pb2.WatchEventsRequest, context: Context
    ) -> AsyncIterator[coordinator_pb2.WatchEventsResponse]:
        address = await self._leader_address(context)
        channel = self._channel(address)
        call = channel.unary_stream(
            f"/{SERVICE_NAME}/WatchEvents",
            request_serializer=coordinator_pb2.WatchEventsRequest.SerializeToString,
            response_deserializer=coordinator_pb2.WatchEventsResponse.FromString,
        )(request, timeout=context.time_remaining())
        try:
            metadata = await call.initial_metadata()
            relay = tuple(
                (key, value)
                for key, value in (metadata or ())
                if key in (WATCH_GAP_METADATA, WATCH_OLDEST_METADATA)
            )
            if relay:
                await context.send_initial_metadata(relay)
            async for response in call:
                yield response
        except asyncio.CancelledError:
            if self._cut_by_leader_change(channel):
                # The watch resumes at the leader from its revision.
                await self._unavailable_stream(context, "the leader changed")
            raise
        except grpc.aio.AioRpcError as exc:
            context.set_trailing_metadata(((LEADER_ADDRESS_METADATA, address),))
            await context.abort(exc.code(), exc.details() or "")
        finally:
            call.cancel()
        # The leader never ends a stream with OK; a clean end means it went away.
        await context.abort(grpc.StatusCode.UNAVAILABLE, "the leader ended the stream")

    # ------------------------------------------------------------------ checkpoints

    async def _load_replicated(self, task_id: str, context: Context) -> RemoteState | None:
        """A task's replicated state, within the call's deadline.

        Aborts: DEADLINE_EXCEEDED (too slow), DATA_LOSS (a record does not
        parse), UNAVAILABLE (Redis unreachable).
        """
        try:
            async with asyncio.timeout(context.time_remaining()):
                return await self._replica().load(task_id)
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "reading Redis took too long")
            raise AssertionError("unreachable") from None
        except CorruptedRecord as exc:
            await context.abort(grpc.StatusCode.DATA_LOSS, str(exc))
            raise AssertionError("unreachable") from exc
        except ValueError as exc:  # the replica refuses the id (control characters, length)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise AssertionError("unreachable") from exc
        except (redis.exceptions.RedisError, OSError) as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"Redis is unreachable: {exc}")
            raise AssertionError("unreachable") from exc

    def _replica(self) -> RedisCheckpointReplica:
        if self._redis is None:
            self._redis = redis_client(
                self._redis_url,
                password=self._redis_password,
                ca_file=self._redis_ca_file,
                timeout_s=REDIS_TIMEOUT_S,
            )
        return RedisCheckpointReplica(self._redis)

    async def GetCheckpoint(
        self, request: coordinator_pb2.GetCheckpointRequest, context: Context
    ) -> coordinator_pb2.GetCheckpointResponse:
        """Read a task's newest replicated checkpoint (and journal) from Redis.

        Redis keeps only the newest checkpoint of a task: a selector answers
        NOT_FOUND unless it designates that one. Errors: INVALID_ARGUMENT
        (task_id, seq, checkpoint_ref malformed or naming another task),
        NOT_FOUND, DATA_LOSS (unparsable or checksum mismatch; names the ref),
        UNAVAILABLE (Redis unreachable), DEADLINE_EXCEEDED.
        """

        def check() -> None:
            _check_id(request.task_id, "task_id")
            which = request.WhichOneof("selector")
            if which == "seq" and request.seq < 1:
                raise _invalid("seq: must be >= 1")
            if which == "checkpoint_ref":
                ref = request.checkpoint_ref
                owner, at, seq = ref.rpartition("@")
                if not ref or not at or not owner or not seq.isdigit():
                    raise _invalid("checkpoint_ref: malformed, want <task_id>@<seq>")
                if owner != request.task_id:
                    raise _invalid(f"checkpoint_ref: {ref!r} names another task")

        await self._validated(context, check)
        task_id = request.task_id
        state = await self._load_replicated(task_id, context)
        if state is None or state.checkpoint is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"task_id: no replicated checkpoint of {task_id!r}"
            )
            raise AssertionError("unreachable")
        checkpoint = state.checkpoint
        which = request.WhichOneof("selector")
        newest = f"the newest replicated checkpoint is seq {checkpoint.seq}; Redis keeps only it"
        if (
            (which == "seq" and request.seq != checkpoint.seq)
            or (which == "checkpoint_ref" and request.checkpoint_ref != checkpoint.checkpoint_ref)
            or (
                which == "at_or_before_journal_seq"
                and checkpoint.covers_journal_seq > request.at_or_before_journal_seq
            )
        ):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"{which}: no such checkpoint; {newest}")
        if not verify_record_checksum(checkpoint):
            await context.abort(
                grpc.StatusCode.DATA_LOSS,
                f"checkpoint {checkpoint.checkpoint_ref!r} fails its checksum",
            )
        response = coordinator_pb2.GetCheckpointResponse(
            location=records_pb2.CHECKPOINT_LOCATION_REDIS
        )
        response.checkpoint.CopyFrom(checkpoint)
        if request.omit_payload:
            response.checkpoint.ClearField("payload")
        if request.include_journal:
            limit = request.max_journal_events or DEFAULT_JOURNAL_EVENTS
            events = [e for e in state.events if e.seq > checkpoint.covers_journal_seq]
            for event in events[:limit]:
                if not verify_record_checksum(event):
                    await context.abort(
                        grpc.StatusCode.DATA_LOSS,
                        f"journal event {event.seq} of {task_id!r} fails its checksum",
                    )
            response.journal_events.extend(events[:limit])
            response.journal_truncated = len(events) > limit
        return response


async def _drain(
    watcher: Watcher, progress_interval_ms: int
) -> AsyncIterator[coordinator_pb2.WatchEventsResponse]:
    """Responses for one watcher until it is closed: events in batches, progress when idle."""
    interval_s = (
        max(progress_interval_ms, MIN_PROGRESS_INTERVAL_MS) / 1000.0
        if progress_interval_ms
        else None
    )
    loop = asyncio.get_running_loop()
    last_sent = loop.time()
    while True:
        if watcher.closed is not None:
            break
        wait_s = None if interval_s is None else max(0.0, last_sent + interval_s - loop.time())
        if not await watcher.wait(wait_s):
            last_sent = loop.time()
            yield coordinator_pb2.WatchEventsResponse(revision=watcher.cursor)
            continue
        events, revision = watcher.take(MAX_EVENTS_PER_RESPONSE)
        if events:
            last_sent = loop.time()
            yield coordinator_pb2.WatchEventsResponse(events=events, revision=revision)
    # Ended by a change of leader: what was queued is still valid, send it first.
    # (A watcher ended for falling behind is not flushed: it is the slow one.)
    if watcher.closed[0] is grpc.StatusCode.UNAVAILABLE:
        while watcher.pending:
            events, revision = watcher.take(MAX_EVENTS_PER_RESPONSE)
            yield coordinator_pb2.WatchEventsResponse(events=events, revision=revision)


def add_coordinator_service(
    server: grpc.aio.Server,
    runtime: CoordinatorRuntime,
    cache: ReadCache,
    *,
    redis_url: str = "redis://127.0.0.1:6379/0",
    redis_password: str = "",
    redis_ca_file: str = "",
    etcd_client: aetcd.Client | None = None,
    archive: EventArchive | None = None,
    member_tls: ClientTls | None = None,
    records: RecordArchive | None = None,
) -> CoordinatorApi:
    """Register CoordinatorService on ``server``.

    Args:
        server: the gRPC server.
        runtime: the replica's runtime.
        cache: its etcd read cache.
        redis_url: where GetCheckpoint reads replicated checkpoints.
        redis_password, redis_ca_file: Redis AUTH and the CA of a ``rediss://`` URL.
        etcd_client: where GetClusterStatus reads member records.
        archive: the Redis event archive (WatchEvents replays earlier terms).
        member_tls: how to dial the leader when proxying (None: plaintext).

    Returns:
        The servicer (close it on shutdown).
    """
    api = CoordinatorApi(
        runtime,
        cache,
        redis_url=redis_url,
        redis_password=redis_password,
        redis_ca_file=redis_ca_file,
        etcd_client=etcd_client,
        archive=archive,
        member_tls=member_tls,
        records=records,
    )
    coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server(api, server)  # type: ignore[no-untyped-call]
    return api
