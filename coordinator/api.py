"""CoordinatorService on grpc.aio: task intake and the read RPCs.

Theory of operation: every replica serves this service.

- *Writes* (``SubmitTask``): the leader translates the request into a core
  event (``TaskSubmitted``) and answers with the core's ``ReplyToRequest``,
  which the runtime hands back only after the step's fenced etcd writes
  committed. A follower proxies the call unchanged to the leader it reads from
  the election and relays the answer or the error; with no leader known it
  answers UNAVAILABLE (trailing metadata ``lazarus-leader-address``).
- *Reads* (``GetTask``, ``ListTasks``, ``ListNodes``, ``GetClusterStatus``):
  the leader answers from its core's snapshot (liveness included); a follower
  from its ``ReadCache`` (records only). ``read_revision`` is the revision of
  the replica's cache.
- Request fields the core never sees are checked here (INVALID_ARGUMENT names
  the field): ``task_id`` of GetTask, ``states`` filters, ``page_token``.
  SubmitTask's fields are judged by the core.

Pages are ordered by id; a page token is the last id returned plus a digest of
the filters, so a token used with other filters is refused.

Not done yet: CancelTask, DrainNode, UncordonNode, MigrateTask, WatchEvents,
GetCheckpoint, ForkTask answer UNIMPLEMENTED.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, TypeAlias, TypeVar

import grpc
import grpc.aio
from google.protobuf.message import DecodeError, Message

from coordinator import convert
from coordinator.core import (
    NodeRecord,
    NodeState,
    NodeView,
    Role,
    StatusCode,
    TaskRecord,
    TaskState,
    TaskSubmitted,
)
from coordinator.core.records import labels_match
from coordinator.etcd_store import Collection, ReadCache
from coordinator.runtime import CoordinatorRuntime, NotLeading, grpc_status
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

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
_T = TypeVar("_T")


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
    """

    def __init__(self, runtime: CoordinatorRuntime, cache: ReadCache) -> None:
        self._runtime = runtime
        self._cache = cache
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def close(self) -> None:
        """Close the proxy channels to leaders."""
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

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
        event = TaskSubmitted(
            request_id=request.request_id,
            spec=convert.task_spec_from_pb(request.spec),
            now_s=0.0,
            task_id=request.task_id,
        )
        try:
            reply = await runtime.request(event, request.request_id)
        except NotLeading:
            await self._unavailable(context)
        if reply.status is not StatusCode.OK:
            await context.abort(grpc_status(reply.status), reply.message)
        task = runtime.core.task(reply.task_id)
        if task is None:  # stepped down between the reply and this read
            await self._unavailable(context)
        return coordinator_pb2.SubmitTaskResponse(
            task=convert.task_record_to_pb(task), created=reply.created
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
        channel = self._channels.get(leader.value)
        if channel is None:
            channel = grpc.aio.insecure_channel(leader.value)
            self._channels[leader.value] = channel
        call = channel.unary_unary(
            f"/{SERVICE_NAME}/{method}",
            request_serializer=type(request).SerializeToString,
            response_deserializer=response_type.FromString,
        )
        remaining = context.time_remaining()
        try:
            return await call(request, timeout=remaining)
        except grpc.aio.AioRpcError as exc:
            context.set_trailing_metadata(((LEADER_ADDRESS_METADATA, leader.value),))
            await context.abort(exc.code(), exc.details() or "")

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
            return list(self._runtime.core.snapshot().tasks)
        out = []
        for name, data in sorted(self._cache.records(Collection.TASKS).items()):
            try:
                out.append(convert.task_record_from_pb(records_pb2.TaskRecord.FromString(data)))
            except (DecodeError, ValueError) as exc:
                _log.error("task record %r unreadable: %s", name, exc)
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
        if not request.task_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "task_id: must not be empty")
        if self._runtime.leading:
            task = self._runtime.core.task(request.task_id)
        else:
            data = self._cache.get(Collection.TASKS, request.task_id)
            task = (
                None
                if data is None
                else convert.task_record_from_pb(records_pb2.TaskRecord.FromString(data))
            )
        if task is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"task_id: {request.task_id!r} not found"
            )
            raise AssertionError("unreachable")  # abort raises
        return coordinator_pb2.GetTaskResponse(
            task=convert.task_record_to_pb(task), read_revision=self._cache.revision
        )

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
            tasks=[convert.task_record_to_pb(t) for t in chosen],
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
            info = coordinator_pb2.NodeInfo(record=convert.node_record_to_pb(record))
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
                    )
                )
            infos.append(info)
        return coordinator_pb2.ListNodesResponse(
            nodes=infos, next_page_token=token, read_revision=self._cache.revision
        )

    async def GetClusterStatus(
        self, request: coordinator_pb2.GetClusterStatusRequest, context: Context
    ) -> coordinator_pb2.GetClusterStatusResponse:
        """Leader, term and node / task counts by state."""
        runtime = self._runtime
        try:
            leader = await runtime.election.leader()
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
        return coordinator_pb2.GetClusterStatusResponse(
            cluster_name=runtime.settings.cluster,
            # Another replica's member id is unknown until MemberRecords exist.
            leader_id=runtime.settings.member_id if runtime.leading else "",
            leader_address=leader.value if leader is not None else "",
            term=leader.term if leader is not None else 0,
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
        )

    # ------------------------------------------------------------------ later issues

    async def _unimplemented(self, request: Any, context: Context) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not implemented yet")

    CancelTask = _unimplemented
    DrainNode = _unimplemented
    UncordonNode = _unimplemented
    MigrateTask = _unimplemented
    GetCheckpoint = _unimplemented
    ForkTask = _unimplemented

    async def WatchEvents(self, request: Any, context: Context) -> None:
        """Not implemented yet (UNIMPLEMENTED)."""
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not implemented yet")


def add_coordinator_service(
    server: grpc.aio.Server, runtime: CoordinatorRuntime, cache: ReadCache
) -> CoordinatorApi:
    """Register CoordinatorService on ``server``.

    Returns:
        The servicer (close it on shutdown).
    """
    api = CoordinatorApi(runtime, cache)
    coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server(api, server)  # type: ignore[no-untyped-call]
    return api
