"""A Python client of the orchestrator API (``CoordinatorService``).

Theory of operation: a ``Client`` holds one grpc.aio channel per
coordinator address (TLS with the cluster CA and a client certificate or
bearer token, see :class:`lazarus.tls.ClientTls`; plaintext only for
coordinators run with ``--auth none``) it was given (created lazily, on the event loop that first
uses it). Every replica serves the whole API — followers answer reads from
their cache and proxy writes to the leader — so a call may go to any of them.
A call is tried on the address that answered last; when it fails with
UNAVAILABLE or DEADLINE_EXCEEDED (the replica is down, has no leader, or was
too slow) it is retried on the next address after a jittered exponential
backoff (tenacity), until ``retry_max_s`` has passed. Every other status is
the server's verdict on the request and is raised at once as a typed
``LazarusError`` subclass (``InvalidArgument``, ``NotFound``, ...) carrying
the status code, the server's message and the address that answered.

Retrying is safe because the writes are idempotent: ``submit`` and ``fork``
send the same ``request_id`` on every attempt (one is generated per call when
none is given), CancelTask / DrainNode / UncordonNode are idempotent by
contract. MigrateTask is not: it is retried on UNAVAILABLE only, and a retry
after a write that was in fact applied answers FAILED_PRECONDITION ("a move is
already in progress").

``watch`` is a stream that survives replicas: it remembers the revision after
the last event (or progress notification) it received and, when its stream
ends with UNAVAILABLE / DEADLINE_EXCEEDED / RESOURCE_EXHAUSTED (a replica
died, the leader changed, the watcher fell behind), reopens it on the next
address from that revision, so no retained event is lost or repeated.

``SyncClient`` offers the same methods as plain functions for scripts: it
runs a ``Client`` on an event loop of its own in a background thread.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import threading
import uuid
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import grpc.aio
from google.protobuf.message import Message
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_delay,
)

from lazarus.grpcopts import channel_options
from lazarus.tls import ClientTls
from lazarus.v1 import coordinator_pb2, records_pb2

__all__ = [
    "DEFAULT_ADDRESS",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "Aborted",
    "AlreadyExists",
    "Cancelled",
    "Client",
    "DataLoss",
    "DeadlineExceeded",
    "EventStream",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "LazarusError",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "ResourceExhausted",
    "SyncClient",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "Unknown",
    "event_type_value",
    "node_state_value",
    "parse_addresses",
    "task_state_value",
]

SERVICE = "lazarus.v1.CoordinatorService"
DEFAULT_ADDRESS = "127.0.0.1:7070"
DEFAULT_MAX_PAYLOAD_BYTES = 1 << 20
"""Largest payload ``submit`` sends (the node agents' default ``--max-payload-bytes``)."""
LEADER_ADDRESS_METADATA = "lazarus-leader-address"
WATCH_GAP_METADATA = "lazarus-watch-gap"
WATCH_OLDEST_METADATA = "lazarus-watch-oldest-revision"

CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    # gRPC honours http_proxy from the environment; coordinators are dialled directly.
    ("grpc.enable_http_proxy", 0),
    # A channel that failed to connect retries soon (the default backoff grows to 120 s),
    # so an address that comes back is used again within a second.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # A replica gone silent without closing the connection (blackholed) fails
    # the call within lazarus.grpcopts' bound (10 s), so a watch moves on.
    *channel_options(),
)

WATCH_STABLE_S = 10.0
"""A WatchEvents stream that served this long, seconds, ended for a new reason:
the next attempt goes at once; one that ended sooner counts as a failed attempt
(the backoff grows)."""

_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
_WATCH_RETRYABLE = _RETRYABLE | {grpc.StatusCode.RESOURCE_EXHAUSTED}
_T = TypeVar("_T")


# ---------------------------------------------------------------------- errors


class LazarusError(Exception):
    """A CoordinatorService call failed; one subclass per gRPC status.

    Attributes:
        code: the gRPC status code.
        message: the server's message (for INVALID_ARGUMENT it starts with the
            offending field, e.g. ``"spec.kind: must be 1..128 bytes"``).
        address: the coordinator that answered; empty for errors raised before
            any call (bad arguments detected by the client).
        leader_address: the leader's address from the trailing metadata, when
            the server sent it.
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(
        self,
        message: str,
        *,
        code: grpc.StatusCode | None = None,
        address: str = "",
        leader_address: str = "",
    ) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.address = address
        self.leader_address = leader_address

    @property
    def field(self) -> str:
        """The request field an INVALID_ARGUMENT (or similar) message names, else ``""``."""
        head, sep, _ = self.message.partition(": ")
        return head if sep and " " not in head else ""

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


class Cancelled(LazarusError):
    """CANCELLED: the call was cancelled."""

    code = grpc.StatusCode.CANCELLED


class Unknown(LazarusError):
    """UNKNOWN: an error the server did not classify."""

    code = grpc.StatusCode.UNKNOWN


class InvalidArgument(LazarusError):
    """INVALID_ARGUMENT: a request field is wrong; ``field`` names it."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(LazarusError):
    """DEADLINE_EXCEEDED on every attempt: a write may or may not have been applied."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(LazarusError):
    """NOT_FOUND: no such task, node or checkpoint."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(LazarusError):
    """ALREADY_EXISTS: request_id reused with a different request, or the task id is taken."""

    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(LazarusError):
    """PERMISSION_DENIED."""

    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(LazarusError):
    """RESOURCE_EXHAUSTED: e.g. the migration target has no free slot."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(LazarusError):
    """FAILED_PRECONDITION: the request does not fit the current state (a terminal task, ...)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(LazarusError):
    """ABORTED: a compare-and-set lost (e.g. MigrateTask's expected_epoch is stale)."""

    code = grpc.StatusCode.ABORTED


class OutOfRange(LazarusError):
    """OUT_OF_RANGE."""

    code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(LazarusError):
    """UNIMPLEMENTED: the coordinator does not serve this RPC (yet)."""

    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(LazarusError):
    """INTERNAL: a fault inside the coordinator."""

    code = grpc.StatusCode.INTERNAL


class Unavailable(LazarusError):
    """UNAVAILABLE on every attempt: no coordinator answered, or none knew a leader.

    Attributes:
        answered: True when at least one coordinator answered (it had no
            leader, or lost etcd); False when none could be reached at all.
    """

    code = grpc.StatusCode.UNAVAILABLE

    def __init__(self, message: str, *, answered: bool = True, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.answered = answered


class DataLoss(LazarusError):
    """DATA_LOSS: a stored record fails its checksum; the message names it."""

    code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(LazarusError):
    """UNAUTHENTICATED."""

    code = grpc.StatusCode.UNAUTHENTICATED


_ERRORS: dict[grpc.StatusCode, type[LazarusError]] = {
    cls.code: cls
    for cls in (
        Cancelled,
        Unknown,
        InvalidArgument,
        DeadlineExceeded,
        NotFound,
        AlreadyExists,
        PermissionDenied,
        ResourceExhausted,
        FailedPrecondition,
        Aborted,
        OutOfRange,
        Unimplemented,
        Internal,
        Unavailable,
        DataLoss,
        Unauthenticated,
    )
}


def _connect_failure(details: str) -> bool:
    text = details.lower()
    return "failed to connect" in text or "connection refused" in text or "dns resolution" in text


def _error_from_rpc(exc: grpc.aio.AioRpcError, address: str) -> LazarusError:
    code = exc.code()
    details = exc.details() or ""
    leader = ""
    for key, value in exc.trailing_metadata() or ():
        if key == LEADER_ADDRESS_METADATA and isinstance(value, str):
            leader = value
    cls = _ERRORS.get(code, Unknown)
    if cls is Unavailable:
        return Unavailable(
            details,
            answered=not _connect_failure(details),
            address=address,
            leader_address=leader,
        )
    return cls(details, code=code, address=address, leader_address=leader)


def _exhausted(last: LazarusError, addresses: Sequence[str], budget_s: float) -> LazarusError:
    """The error raised once retries are used up: says which addresses were tried."""
    where = ", ".join(addresses)
    if isinstance(last, Unavailable):
        if not last.answered:
            message = f"no coordinator answered at {where} (for {budget_s:g} s): {last.message}"
        else:
            message = f"no coordinator at {where} could serve the call: {last.message}"
        return Unavailable(
            message,
            answered=last.answered,
            address=last.address,
            leader_address=last.leader_address,
        )
    return type(last)(
        f"no coordinator at {where} answered in time: {last.message}",
        code=last.code,
        address=last.address,
        leader_address=last.leader_address,
    )


# -------------------------------------------------------------- enum helpers


def _enum_value(value: int | str, enum: Any, prefix: str, field_name: str, type_name: str) -> int:
    if isinstance(value, int):  # passed through unchecked: the server judges numbers
        return value
    text = value.strip().upper().replace("-", "_")
    for name in (text, prefix + text):
        try:
            return int(enum.Value(name))
        except ValueError:
            continue
    choices = ", ".join(
        v.name.removeprefix(prefix).lower()
        for v in enum.DESCRIPTOR.values
        if not v.name.endswith("UNSPECIFIED")
    )
    raise InvalidArgument(
        f"{field_name}: {value!r} is not a {type_name} (one of: {choices})",
        code=grpc.StatusCode.INVALID_ARGUMENT,
    )


def task_state_value(value: int | str, field_name: str = "states") -> int:
    """A TaskState number from ``"running"``, ``"TASK_STATE_RUNNING"`` or an int.

    Raises:
        InvalidArgument: an unknown name (ints pass unchecked).
    """
    return _enum_value(value, records_pb2.TaskState, "TASK_STATE_", field_name, "task state")


def node_state_value(value: int | str, field_name: str = "states") -> int:
    """A NodeState number from ``"alive"``, ``"NODE_STATE_ALIVE"`` or an int.

    Raises:
        InvalidArgument: an unknown name (ints pass unchecked).
    """
    return _enum_value(value, records_pb2.NodeState, "NODE_STATE_", field_name, "node state")


def event_type_value(value: int | str, field_name: str = "types") -> int:
    """An EventType number from ``"task_completed"``, ``"EVENT_TYPE_TASK_COMPLETED"`` or an int.

    Raises:
        InvalidArgument: an unknown name (ints pass unchecked).
    """
    return _enum_value(value, records_pb2.EventType, "EVENT_TYPE_", field_name, "event type")


def _durability_value(value: int | str) -> int:
    return _enum_value(
        value,
        records_pb2.CheckpointDurability,
        "CHECKPOINT_DURABILITY_",
        "spec.durability",
        "durability",
    )


def parse_addresses(addresses: Sequence[str] | str) -> list[str]:
    """``"a:1,b:2"`` or ``["a:1", "b:2"]`` -> ``["a:1", "b:2"]`` (blanks dropped).

    Raises:
        ValueError: no address, or one without a port.
    """
    items = addresses.split(",") if isinstance(addresses, str) else list(addresses)
    out = [a.strip() for a in items if a.strip()]
    if not out:
        raise ValueError("coordinators: give at least one host:port address")
    for address in out:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"coordinators: {address!r} is not host:port")
    return out


def _payload_bytes(payload: Any) -> tuple[bytes, str]:
    """Payload as bytes plus the content type to declare ("" = leave as given)."""
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload), ""
    if isinstance(payload, str):
        return payload.encode(), ""
    return json.dumps(payload, separators=(",", ":")).encode(), "application/json"


# ---------------------------------------------------------------------- client


@dataclass
class EventStream:
    """The events of ``Client.watch``: an async iterator that resumes across replicas.

    Attributes:
        next_revision: revision the stream resumes from if it reconnects (the
            last event's revision + 1, or a progress notification's + 1).
        reconnects: times the stream was reopened after it ended.
        gaps: for every (re)connection that could not start at the revision
            asked (the events were no longer retained, e.g. after a change of
            leader), the oldest retained revision it started at instead; events
            in between may be missing, re-read state with ``tasks`` / ``nodes``.
    """

    next_revision: int
    reconnects: int = 0
    gaps: list[int] = field(default_factory=list)
    _events: AsyncIterator[records_pb2.Event] | None = None

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> records_pb2.Event:
        if self._events is None:
            raise StopAsyncIteration
        return await self._events.__anext__()

    async def aclose(self) -> None:
        """Close the underlying stream (also done when iteration stops)."""
        if self._events is not None:
            await self._events.aclose()  # type: ignore[attr-defined]


class Client:
    """Async client of CoordinatorService on a list of coordinator replicas.

    Use it on one event loop (channels belong to the loop that first used
    them), preferably as ``async with Client(...) as client:``.

    Args:
        addresses: coordinator ``host:port`` addresses, a list or a
            comma-separated string; any replica serves every call.
        timeout_s: deadline of each attempt, seconds.
        retry_max_s: how long to keep retrying UNAVAILABLE / DEADLINE_EXCEEDED
            across the addresses, seconds (0 = one attempt per address).
        backoff_initial_s: first backoff between attempts, seconds.
        backoff_max_s: longest backoff between attempts, seconds (jittered).
        max_payload_bytes: ``submit`` refuses a larger payload before sending
            it (the node agents' default limit; a payload over etcd's request
            limit would make the leader step down); 0 = no check.
        tls: the CA, client certificate and key (or bearer token) to dial
            with; None: from ``LAZARUS_TLS_CA_FILE``, ``LAZARUS_TLS_CERT_FILE``,
            ``LAZARUS_TLS_KEY_FILE``, ``LAZARUS_TLS_SERVER_NAME`` and
            ``LAZARUS_TOKEN`` (all unset: plaintext).

    Raises:
        ValueError: no address, or a malformed one.
    """

    def __init__(
        self,
        addresses: Sequence[str] | str,
        *,
        timeout_s: float = 5.0,
        retry_max_s: float = 15.0,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 1.0,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        tls: ClientTls | None = None,
    ) -> None:
        self.addresses = parse_addresses(addresses)
        self.tls = tls if tls is not None else ClientTls.from_env()
        self.max_payload_bytes = max_payload_bytes
        if timeout_s <= 0:
            raise ValueError(f"timeout_s: must be > 0, got {timeout_s}")
        if retry_max_s < 0:
            raise ValueError(f"retry_max_s: must be >= 0, got {retry_max_s}")
        self.timeout_s = timeout_s
        self.retry_max_s = retry_max_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._preferred = 0

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every channel (pending calls fail with CANCELLED)."""
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()

    # ---------------------------------------------------------- call machinery

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self.tls.aio_channel(address, CHANNEL_OPTIONS)
            self._channels[address] = channel
        return channel

    def _backoff_s(self, failures: int) -> float:
        """Jittered exponential backoff after ``failures`` failed attempts in a row, seconds."""
        if failures < len(self.addresses):
            return 0.0  # first try every address once
        ceiling = self.backoff_initial_s * 2 ** min(failures - len(self.addresses), 30)
        return random.uniform(0.0, min(self.backoff_max_s, ceiling))

    def _rotation(self) -> Iterator[int]:
        """Address indexes to try: the one that answered last first, then round."""
        n = len(self.addresses)
        return (i % n for i in itertools.count(self._preferred))

    def _retrying(self, retryable: frozenset[grpc.StatusCode]) -> AsyncRetrying:
        # At least one attempt per address, then until retry_max_s has passed.
        attempts_floor = len(self.addresses)

        def stop(state: RetryCallState) -> bool:
            return state.attempt_number >= attempts_floor and stop_after_delay(self.retry_max_s)(
                state
            )

        return AsyncRetrying(
            retry=retry_if_exception(
                lambda exc: isinstance(exc, LazarusError) and exc.code in retryable
            ),
            wait=lambda state: self._backoff_s(state.attempt_number),
            stop=stop,
            reraise=True,
        )

    async def _with_retries(
        self,
        attempt: Callable[[str], Awaitable[_T]],
        retryable: frozenset[grpc.StatusCode] = _RETRYABLE,
    ) -> _T:
        order = self._rotation()
        last: LazarusError | None = None
        try:
            async for try_ in self._retrying(retryable):
                with try_:
                    index = next(order)
                    address = self.addresses[index]
                    try:
                        result = await attempt(address)
                    except grpc.aio.AioRpcError as exc:
                        last = _error_from_rpc(exc, address)
                        raise last from None
                    self._preferred = index
                    return result
        except LazarusError as exc:
            if exc.code in retryable and exc is last:
                raise _exhausted(exc, self.addresses, self.retry_max_s) from None
            raise
        raise AssertionError("unreachable")  # tenacity either returns or raises

    async def _unary(
        self,
        method: str,
        request: Message,
        response_type: type[_T],
        *,
        retryable: frozenset[grpc.StatusCode] = _RETRYABLE,
    ) -> _T:
        async def attempt(address: str) -> _T:
            call = self._channel(address).unary_unary(
                f"/{SERVICE}/{method}",
                request_serializer=type(request).SerializeToString,
                response_deserializer=response_type.FromString,  # type: ignore[attr-defined]
            )
            response: _T = await call(request, timeout=self.timeout_s)
            return response

        return await self._with_retries(attempt, retryable)

    # ------------------------------------------------------------------ tasks

    async def submit(
        self,
        kind: str,
        payload: Any = b"",
        *,
        request_id: str | None = None,
        task_id: str = "",
        **spec: Any,
    ) -> coordinator_pb2.SubmitTaskResponse:
        """Submit a task (SubmitTask); idempotent on ``request_id``.

        Args:
            kind: handler name (``TaskSpec.kind``), 1..128 bytes.
            payload: bytes or str as is; any other value is JSON-encoded and
                ``content_type`` defaults to ``application/json``.
            request_id: idempotency key, 1..128 bytes; default: a new UUID, the
                same on every retry of this call.
            task_id: the id to use; empty = the leader generates one.
            spec: other ``TaskSpec`` fields: ``labels`` / ``node_selector``
                (dict), ``slots``, ``priority``, ``max_attempts``,
                ``deadline_unix_ms`` (Unix ms), ``durability`` (``"local"``,
                ``"replicated"`` or the enum number), ``state_model``,
                ``checkpoint_interval_ms``, ``content_type``.

        Returns:
            ``SubmitTaskResponse``: ``.task`` (TaskRecord as persisted) and
            ``.created`` (False when ``request_id`` was seen before).

        Raises:
            InvalidArgument: ``request_id``, ``spec.kind``,
                ``spec.deadline_unix_ms`` in the past, ... (``.field`` names
                it); ``spec.payload`` over ``max_payload_bytes`` (raised here,
                nothing is sent).
            AlreadyExists: ``request_id`` reused with a different spec, or
                ``task_id`` taken.
            Unavailable: no coordinator answered / no leader within ``retry_max_s``.
            TypeError: an unknown ``spec`` keyword.
        """
        data, content_type = _payload_bytes(payload)
        if self.max_payload_bytes and len(data) > self.max_payload_bytes:
            raise InvalidArgument(
                f"spec.payload: {len(data):,} bytes, over the client's limit of "
                f"{self.max_payload_bytes:,} (max_payload_bytes)"
            )
        fields = dict(spec)
        if "durability" in fields:
            fields["durability"] = _durability_value(fields["durability"])
        if content_type and "content_type" not in fields:
            fields["content_type"] = content_type
        try:
            task_spec = records_pb2.TaskSpec(kind=kind, payload=data, **fields)
        except ValueError as exc:  # protobuf: unknown field
            raise TypeError(f"submit: {exc}") from exc
        request = coordinator_pb2.SubmitTaskRequest(
            request_id=uuid.uuid4().hex if request_id is None else request_id,
            spec=task_spec,
            task_id=task_id,
        )
        return await self._unary("SubmitTask", request, coordinator_pb2.SubmitTaskResponse)

    async def get(self, task_id: str) -> coordinator_pb2.GetTaskResponse:
        """Read one task (GetTask).

        Returns:
            ``GetTaskResponse``: ``.task``, ``.forks`` (zombie lineages, oldest
            first), ``.read_revision`` (etcd revision of the answering cache).

        Raises:
            InvalidArgument: empty ``task_id``.
            NotFound: no such task (a follower's cache may lag the leader by
                a few ms right after a submit).
        """
        return await self._unary(
            "GetTask",
            coordinator_pb2.GetTaskRequest(task_id=task_id),
            coordinator_pb2.GetTaskResponse,
        )

    async def list_tasks(
        self,
        *,
        states: Iterable[int | str] = (),
        node_id: str = "",
        kind: str = "",
        labels: Mapping[str, str] | None = None,
        page_size: int = 0,
        limit: int | None = None,
    ) -> AsyncIterator[records_pb2.TaskRecord]:
        """Every task matching all filters, ordered by task_id, fetched page by page (ListTasks).

        Args:
            states: task states (``"running"``, ``TASK_STATE_RUNNING`` names or
                numbers); empty = any.
            node_id: owned by this node; kind: of this kind; labels: with every pair.
            page_size: tasks per call, 0 = the server's default (100), max 1000.
            limit: stop after this many tasks; None = all.

        Yields:
            TaskRecord, in task_id order. Each page is retried on its own.

        Raises:
            InvalidArgument: ``states`` holds UNSPECIFIED or an unknown value,
                ``page_token`` refused.
        """
        base = coordinator_pb2.ListTasksRequest(
            states=[task_state_value(s, f"states[{i}]") for i, s in enumerate(states)],  # type: ignore[misc]
            node_id=node_id,
            kind=kind,
            labels=dict(labels or {}),
            page_size=page_size,
        )
        returned = 0
        async for page in self.task_pages(base):
            for task in page.tasks:
                if limit is not None and returned >= limit:
                    return
                returned += 1
                yield task

    async def task_pages(
        self, request: coordinator_pb2.ListTasksRequest
    ) -> AsyncIterator[coordinator_pb2.ListTasksResponse]:
        """Every ListTasks page for ``request`` (its page_token is the first page's).

        Yields:
            ListTasksResponse per call, until ``next_page_token`` is empty.
        """
        page = coordinator_pb2.ListTasksRequest()
        page.CopyFrom(request)
        while True:
            response = await self._unary("ListTasks", page, coordinator_pb2.ListTasksResponse)
            yield response
            if not response.next_page_token:
                return
            page.page_token = response.next_page_token

    async def tasks(self, **filters: Any) -> list[records_pb2.TaskRecord]:
        """``list_tasks(**filters)`` collected into a list (same arguments and errors)."""
        return [task async for task in self.list_tasks(**filters)]

    async def cancel(self, task_id: str, reason: str = "") -> records_pb2.TaskRecord:
        """Cancel a task (CancelTask); idempotent on a CANCELLED task.

        Args:
            task_id: the task.
            reason: for the record and the TaskCancelled event, at most 1024 bytes.

        Returns:
            The task after cancellation (state CANCELLED).

        Raises:
            InvalidArgument: ``task_id`` empty, ``reason`` too long.
            NotFound: no such task.
            FailedPrecondition: the task is COMPLETED or FAILED.
        """
        response = await self._unary(
            "CancelTask",
            coordinator_pb2.CancelTaskRequest(task_id=task_id, reason=reason),
            coordinator_pb2.CancelTaskResponse,
        )
        return response.task

    # ------------------------------------------------------------------ nodes

    async def list_nodes(
        self,
        *,
        states: Iterable[int | str] = (),
        labels: Mapping[str, str] | None = None,
        page_size: int = 0,
    ) -> AsyncIterator[coordinator_pb2.NodeInfo]:
        """Every node agent matching the filters, ordered by node_id, page by page (ListNodes).

        Yields:
            NodeInfo: ``.record`` (NodeRecord) and ``.liveness`` (set only when
            the leader answered: connected, last heartbeat Unix ms, phi, load,
            assigned tasks).

        Raises:
            InvalidArgument: ``states`` holds UNSPECIFIED or an unknown value,
                ``page_token`` refused.
        """
        request = coordinator_pb2.ListNodesRequest(
            states=[node_state_value(s, f"states[{i}]") for i, s in enumerate(states)],  # type: ignore[misc]
            labels=dict(labels or {}),
            page_size=page_size,
        )
        while True:
            response = await self._unary("ListNodes", request, coordinator_pb2.ListNodesResponse)
            for info in response.nodes:
                yield info
            if not response.next_page_token:
                return
            request.page_token = response.next_page_token

    async def nodes(self, **filters: Any) -> list[coordinator_pb2.NodeInfo]:
        """``list_nodes(**filters)`` collected into a list (same arguments and errors)."""
        return [info async for info in self.list_nodes(**filters)]

    async def drain(
        self, node_id: str, reason: str = "", release_timeout_s: float = 0.0
    ) -> coordinator_pb2.DrainNodeResponse:
        """Cordon a node and move its tasks gracefully (DrainNode); idempotent while it runs.

        Args:
            node_id: the node.
            reason: for the record and events, at most 1024 bytes.
            release_timeout_s: time each task gets to release, seconds; 0 = the
                cluster default. Sent as whole milliseconds.

        Returns:
            ``DrainNodeResponse``: ``.node`` (cordoned), ``.drain_id`` (same on
            a repeat), ``.tasks_to_move``.

        Raises:
            InvalidArgument: ``node_id`` empty, ``reason`` too long,
                ``release_timeout_ms`` out of range.
            NotFound: no such node.
            FailedPrecondition: the node is DEAD or LEFT.
        """
        return await self._unary(
            "DrainNode",
            coordinator_pb2.DrainNodeRequest(
                node_id=node_id,
                reason=reason,
                release_timeout_ms=round(release_timeout_s * 1000),
            ),
            coordinator_pb2.DrainNodeResponse,
        )

    async def uncordon(self, node_id: str) -> records_pb2.NodeRecord:
        """Lift a node's cordon, ending its drain (UncordonNode); idempotent.

        Returns:
            The node after the cordon is lifted.

        Raises:
            InvalidArgument: ``node_id`` empty.
            NotFound: no such node.
        """
        response = await self._unary(
            "UncordonNode",
            coordinator_pb2.UncordonNodeRequest(node_id=node_id),
            coordinator_pb2.UncordonNodeResponse,
        )
        return response.node

    async def migrate(
        self,
        task_id: str,
        target_node_id: str = "",
        *,
        expected_epoch: int | None = None,
        reason: str = "",
        release_timeout_s: float = 0.0,
    ) -> coordinator_pb2.MigrateTaskResponse:
        """Move a running task to another node gracefully (MigrateTask).

        Retried on UNAVAILABLE only (the call is not idempotent).

        Args:
            task_id: the task (ASSIGNED or RUNNING).
            target_node_id: destination; empty = placement chooses.
            expected_epoch: move only if the task is at this epoch.
            reason: at most 1024 bytes.
            release_timeout_s: time the owner gets to release, seconds; 0 = default.

        Returns:
            ``MigrateTaskResponse``: ``.task`` (with ``.move`` set) and ``.move_id``.

        Raises:
            InvalidArgument: ``task_id``, ``target_node_id``, ``reason``,
                ``release_timeout_ms``.
            NotFound: no such task or target node.
            Aborted: ``expected_epoch`` is stale (the proto says
                FAILED_PRECONDITION; the coordinator answers ABORTED).
            FailedPrecondition: not ASSIGNED / RUNNING, a move in progress,
                the target is not ALIVE, cordoned, the owner, or does not match.
            ResourceExhausted: the target has no free slot.
        """
        request = coordinator_pb2.MigrateTaskRequest(
            task_id=task_id,
            target_node_id=target_node_id,
            reason=reason,
            release_timeout_ms=round(release_timeout_s * 1000),
        )
        if expected_epoch is not None:
            request.expected_epoch = expected_epoch
        return await self._unary(
            "MigrateTask",
            request,
            coordinator_pb2.MigrateTaskResponse,
            retryable=frozenset({grpc.StatusCode.UNAVAILABLE}),
        )

    # ---------------------------------------------------------------- cluster

    async def status(self) -> coordinator_pb2.GetClusterStatusResponse:
        """Leader, term, members and node / task counts by state (GetClusterStatus).

        Returns:
            ``GetClusterStatusResponse`` (``now_unix_ms`` is the answering
            replica's clock, ``serving_member_id`` its id).

        Raises:
            Unavailable: no replica could read etcd / none answered.
        """
        return await self._unary(
            "GetClusterStatus",
            coordinator_pb2.GetClusterStatusRequest(),
            coordinator_pb2.GetClusterStatusResponse,
        )

    def watch(
        self,
        from_revision: int = 0,
        *,
        types: Iterable[int | str] = (),
        task_id: str = "",
        node_id: str = "",
        progress_interval_ms: int = 1000,
    ) -> EventStream:
        """Stream cluster events (WatchEvents), resuming on another replica when one fails.

        The stream subscribes when iteration starts (the first ``__anext__``),
        not when ``watch`` returns: with ``from_revision`` 0 an event emitted
        before that is not delivered. To see what a call of yours causes,
        start iterating first, or pass a revision you saw before (1 = every
        event the leader still retains).

        Args:
            from_revision: first revision wanted; 0 = only events after the
                subscription.
            types: event types (``"task_completed"``, ``EVENT_TYPE_*`` names or
                numbers); empty = all.
            task_id: only events about this task; node_id: about this node.
            progress_interval_ms: ask for an empty progress response at least
                this often, ms, so the resume point advances past filtered-out
                events (0 = never).

        Returns:
            An ``EventStream``: ``async for event in stream`` yields
            ``records_pb2.Event`` in revision order and never ends by itself;
            stop iterating (``break``) or ``await stream.aclose()`` to close it.

        Raises (while iterating):
            InvalidArgument: ``types`` holds UNSPECIFIED or an unknown value.
            Unavailable: no replica could be (re)connected for ``retry_max_s``.
        """
        request = coordinator_pb2.WatchEventsRequest(
            from_revision=from_revision,
            types=[event_type_value(t, f"types[{i}]") for i, t in enumerate(types)],  # type: ignore[misc]
            task_id=task_id,
            node_id=node_id,
            progress_interval_ms=progress_interval_ms,
        )
        stream = EventStream(next_revision=from_revision)
        stream._events = self._watch(request, stream)
        return stream

    async def _watch(
        self, request: coordinator_pb2.WatchEventsRequest, stream: EventStream
    ) -> AsyncIterator[records_pb2.Event]:
        loop = asyncio.get_running_loop()
        index = self._preferred
        connected_once = False
        # Attempts in a row that failed or ended before WATCH_STABLE_S: the
        # backoff before the next one. A replica that answers and then drops
        # the stream at once (over and over) is retried with a growing delay,
        # not in a tight loop; one that served a while is left at once.
        failures = 0
        unanswered = 0  # attempts in a row no replica answered: the retry budget
        failing_since: float | None = None
        while True:
            address = self.addresses[index]
            attempt = coordinator_pb2.WatchEventsRequest()
            attempt.CopyFrom(request)
            attempt.from_revision = stream.next_revision
            call = self._channel(address).unary_stream(
                f"/{SERVICE}/WatchEvents",
                request_serializer=coordinator_pb2.WatchEventsRequest.SerializeToString,
                response_deserializer=coordinator_pb2.WatchEventsResponse.FromString,
            )(attempt)
            answered = False
            answered_at = 0.0
            try:
                async for response in call:
                    if not answered:
                        answered, answered_at = True, loop.time()
                        unanswered, failing_since = 0, None  # the retry budget restarts
                        self._preferred = index
                        if connected_once:
                            stream.reconnects += 1
                        connected_once = True
                        meta = {k: v for k, v in (await call.initial_metadata() or ())}
                        if meta.get(WATCH_GAP_METADATA) == "1":
                            stream.gaps.append(int(meta.get(WATCH_OLDEST_METADATA) or 0))
                    for event in response.events:
                        if event.revision < stream.next_revision:
                            continue  # delivered before a reconnect
                        stream.next_revision = event.revision + 1
                        yield event
                    if response.revision:
                        stream.next_revision = max(stream.next_revision, response.revision + 1)
                # The server never ends a stream with OK on purpose: the replica went away.
                error: LazarusError = Unavailable(f"{address} ended the stream", address=address)
            except grpc.aio.AioRpcError as exc:
                error = _error_from_rpc(exc, address)
                if error.code not in _WATCH_RETRYABLE:
                    raise error from None
            finally:
                call.cancel()
            now = loop.time()
            if answered and now - answered_at >= WATCH_STABLE_S:
                failures = 0
            else:
                failures += 1
            if not answered:
                unanswered += 1
                failing_since = now if failing_since is None else failing_since
                if unanswered >= len(self.addresses) and now - failing_since >= self.retry_max_s:
                    raise _exhausted(error, self.addresses, self.retry_max_s) from None
            index = (index + 1) % len(self.addresses)
            await asyncio.sleep(self._backoff_s(failures))

    # ------------------------------------------------------------ checkpoints

    async def checkpoint(
        self,
        task_id: str,
        *,
        seq: int | None = None,
        checkpoint_ref: str | None = None,
        at_or_before_journal_seq: int | None = None,
        omit_payload: bool = False,
        include_journal: bool = False,
        max_journal_events: int = 0,
    ) -> coordinator_pb2.GetCheckpointResponse:
        """Read a task's replicated checkpoint from Redis (GetCheckpoint).

        Args:
            task_id: the task.
            seq / checkpoint_ref / at_or_before_journal_seq: at most one
                selector; none = the newest replicated checkpoint (Redis keeps
                only that one, so a selector naming another answers NOT_FOUND).
            omit_payload: metadata only.
            include_journal: also the journal events after the checkpoint.
            max_journal_events: cap on them, 0 = 1000.

        Returns:
            ``GetCheckpointResponse``: ``.checkpoint`` (CheckpointRecord,
            checksum verified), ``.location`` (REDIS), ``.journal_events``,
            ``.journal_truncated``.

        Raises:
            InvalidArgument: ``task_id``, ``seq`` < 1, ``checkpoint_ref``
                malformed or of another task, more than one selector given.
            NotFound: no such task or checkpoint.
            DataLoss: the stored record fails its checksum.
            Unavailable: Redis unreachable.
        """
        given = [
            name
            for name, value in (
                ("seq", seq),
                ("checkpoint_ref", checkpoint_ref),
                ("at_or_before_journal_seq", at_or_before_journal_seq),
            )
            if value is not None
        ]
        if len(given) > 1:
            raise InvalidArgument(f"{given[0]}: give at most one selector, got {given}")
        request = coordinator_pb2.GetCheckpointRequest(
            task_id=task_id,
            omit_payload=omit_payload,
            include_journal=include_journal,
            max_journal_events=max_journal_events,
        )
        if seq is not None:
            request.seq = seq
        elif checkpoint_ref is not None:
            request.checkpoint_ref = checkpoint_ref
        elif at_or_before_journal_seq is not None:
            request.at_or_before_journal_seq = at_or_before_journal_seq
        return await self._unary("GetCheckpoint", request, coordinator_pb2.GetCheckpointResponse)

    async def fork(
        self,
        from_checkpoint_ref: str,
        *,
        edits: Mapping[str, Any] | Iterable[tuple[str, Any]] = (),
        request_id: str | None = None,
        new_task_id: str = "",
        spec: records_pb2.TaskSpec | None = None,
    ) -> coordinator_pb2.ForkTaskResponse:
        """Create a task from a checkpoint with state edits applied (ForkTask).

        Args:
            from_checkpoint_ref: the checkpoint, e.g. ``"task-1@3"``.
            edits: top-level keys to set in the JSON-object state, in order; a
                value is JSON-encoded unless it is bytes (sent as JSON text as is).
            request_id: idempotency key; default a new UUID reused on retries.
            new_task_id: id of the new task; empty = generated.
            spec: spec of the new task; None = a copy of the source's.

        Returns:
            ``ForkTaskResponse``: ``.task_id``, ``.task`` (PENDING),
            ``.checkpoint`` (its first checkpoint), ``.created``.

        Raises:
            InvalidArgument, NotFound, FailedPrecondition, AlreadyExists,
            DataLoss (see coordinator.proto); Unimplemented while the
            coordinator does not serve ForkTask.
        """
        pairs = edits.items() if isinstance(edits, Mapping) else edits
        request = coordinator_pb2.ForkTaskRequest(
            request_id=uuid.uuid4().hex if request_id is None else request_id,
            from_checkpoint_ref=from_checkpoint_ref,
            edits=[
                records_pb2.StateEdit(
                    key=key,
                    value_json=value if isinstance(value, bytes) else json.dumps(value).encode(),
                )
                for key, value in pairs
            ],
            new_task_id=new_task_id,
        )
        if spec is not None:
            request.spec.CopyFrom(spec)
        return await self._unary("ForkTask", request, coordinator_pb2.ForkTaskResponse)


# ----------------------------------------------------------------- sync client


class SyncClient:
    """``Client`` for synchronous code: the same methods, blocking.

    It runs a ``Client`` on an event loop in a daemon thread of its own. Close
    it (or use ``with SyncClient(...) as client:``) to stop the thread.
    Iterators (``list_tasks``, ``list_nodes``, ``watch``) are plain generators;
    closing one (``break`` in a for loop, then garbage collection, or
    ``.close()``) closes the stream.

    Args: as ``Client``.
    """

    def __init__(self, addresses: Sequence[str] | str, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="lazarus-client", daemon=True
        )
        self._thread.start()
        try:
            self._client = Client(addresses, **options)
        except BaseException:
            self._stop_loop()
            raise
        self.addresses = self._client.addresses

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, coro: Awaitable[_T]) -> _T:
        future: Future[_T] = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        return future.result()

    def _iterate(self, agen: AsyncIterator[_T]) -> Generator[_T, None, None]:
        try:
            while True:
                try:
                    yield self._run(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            closer = getattr(agen, "aclose", None)
            if closer is not None and self._loop.is_running():
                self._run(closer())

    def _stop_loop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        if not self._loop.is_running():
            self._loop.close()

    def close(self) -> None:
        """Close the channels and stop the background loop."""
        if self._loop.is_closed():
            return
        if self._loop.is_running():
            self._run(self._client.close())
        self._stop_loop()

    def submit(
        self, kind: str, payload: Any = b"", **options: Any
    ) -> coordinator_pb2.SubmitTaskResponse:
        """See ``Client.submit``."""
        return self._run(self._client.submit(kind, payload, **options))

    def get(self, task_id: str) -> coordinator_pb2.GetTaskResponse:
        """See ``Client.get``."""
        return self._run(self._client.get(task_id))

    def list_tasks(self, **filters: Any) -> Generator[records_pb2.TaskRecord, None, None]:
        """See ``Client.list_tasks`` (a generator)."""
        return self._iterate(self._client.list_tasks(**filters))

    def tasks(self, **filters: Any) -> list[records_pb2.TaskRecord]:
        """See ``Client.tasks``."""
        return self._run(self._client.tasks(**filters))

    def cancel(self, task_id: str, reason: str = "") -> records_pb2.TaskRecord:
        """See ``Client.cancel``."""
        return self._run(self._client.cancel(task_id, reason))

    def list_nodes(self, **filters: Any) -> Generator[coordinator_pb2.NodeInfo, None, None]:
        """See ``Client.list_nodes`` (a generator)."""
        return self._iterate(self._client.list_nodes(**filters))

    def nodes(self, **filters: Any) -> list[coordinator_pb2.NodeInfo]:
        """See ``Client.nodes``."""
        return self._run(self._client.nodes(**filters))

    def drain(
        self, node_id: str, reason: str = "", release_timeout_s: float = 0.0
    ) -> coordinator_pb2.DrainNodeResponse:
        """See ``Client.drain``."""
        return self._run(self._client.drain(node_id, reason, release_timeout_s))

    def uncordon(self, node_id: str) -> records_pb2.NodeRecord:
        """See ``Client.uncordon``."""
        return self._run(self._client.uncordon(node_id))

    def migrate(
        self, task_id: str, target_node_id: str = "", **options: Any
    ) -> coordinator_pb2.MigrateTaskResponse:
        """See ``Client.migrate``."""
        return self._run(self._client.migrate(task_id, target_node_id, **options))

    def status(self) -> coordinator_pb2.GetClusterStatusResponse:
        """See ``Client.status``."""
        return self._run(self._client.status())

    def watch(
        self, from_revision: int = 0, **filters: Any
    ) -> Generator[records_pb2.Event, None, None]:
        """See ``Client.watch`` (a generator that never ends by itself)."""

        async def make() -> EventStream:
            return self._client.watch(from_revision, **filters)

        return self._iterate(self._run(make()))

    def checkpoint(self, task_id: str, **options: Any) -> coordinator_pb2.GetCheckpointResponse:
        """See ``Client.checkpoint``."""
        return self._run(self._client.checkpoint(task_id, **options))

    def fork(self, from_checkpoint_ref: str, **options: Any) -> coordinator_pb2.ForkTaskResponse:
        """See ``Client.fork``."""
        return self._run(self._client.fork(from_checkpoint_ref, **options))
