"""CoordinatorService against real etcd: intake, assignment down Sessions, reads, followers.

Two in-process replicas (``CoordinatorServer``) on a unique cluster name of the
shared etcd; raw stubs act as orchestrator and node agent. Every wait is
bounded; servers stop at teardown.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
import pytest

from coordinator.core import CoreSettings
from coordinator.server import CoordinatorServer, ServerSettings
from lazarus.v1 import agent_pb2, coordinator_pb2, coordinator_pb2_grpc, records_pb2

FAST = CoreSettings(
    heartbeat_interval_s=0.1,
    dead_after_s=0.6,
    fence_after_s=0.4,
    tick_interval_s=0.05,
    suspect_after_intervals=2.0,
)
WAIT_S = 5.0


@pytest.fixture
async def replicas(etcd: Any) -> AsyncIterator[Callable[[str], Awaitable[CoordinatorServer]]]:
    cluster = f"api-{uuid.uuid4().hex[:10]}"
    started: list[CoordinatorServer] = []

    async def start(member: str) -> CoordinatorServer:
        server = CoordinatorServer(
            ServerSettings(
                cluster=cluster,
                member_id=member,
                etcd_endpoint=str(etcd.endpoint),
                lease_ttl_s=2,
                auth="none",  # in-process API tests; tests/integration/test_security.py: mTLS
            ),
            FAST,
            seed=3,
        )
        started.append(server)
        await server.start()
        return server

    yield start
    for server in reversed(started):
        await server.stop()


async def _leading(server: CoordinatorServer) -> CoordinatorServer:
    async with asyncio.timeout(WAIT_S):
        while server.runtime is None or not server.runtime.leading:
            await asyncio.sleep(0.02)
    return server


@pytest.fixture
async def stubs() -> AsyncIterator[Callable[[str], Any]]:
    channels: list[grpc.aio.Channel] = []

    def make(address: str) -> Any:
        channel = grpc.aio.insecure_channel(address)
        channels.append(channel)
        return coordinator_pb2_grpc.CoordinatorServiceStub(channel)  # type: ignore[no-untyped-call]

    yield make
    for channel in channels:
        await channel.close()


def _submit(request_id: str, kind: str = "echo", **kw: Any) -> coordinator_pb2.SubmitTaskRequest:
    return coordinator_pb2.SubmitTaskRequest(
        request_id=request_id, spec=records_pb2.TaskSpec(kind=kind, **kw)
    )


async def _error(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


async def test_submit_is_idempotent_and_validated(
    replicas: Callable[[str], Awaitable[CoordinatorServer]], stubs: Callable[[str], Any]
) -> None:
    leader = await _leading(await replicas("c1"))
    stub = stubs(leader.address)
    first = await stub.SubmitTask(_submit("r1"), timeout=WAIT_S)
    assert first.created
    assert first.task.state == records_pb2.TASK_STATE_PENDING
    again = await stub.SubmitTask(_submit("r1"), timeout=WAIT_S)
    assert not again.created
    assert again.task.task_id == first.task.task_id
    err = await _error(stub.SubmitTask(_submit("r1", kind="other"), timeout=WAIT_S))
    assert err.code() is grpc.StatusCode.ALREADY_EXISTS
    err = await _error(stub.SubmitTask(_submit("r2", kind=""), timeout=WAIT_S))
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "spec.kind" in (err.details() or "")
    err = await _error(stub.SubmitTask(_submit(""), timeout=WAIT_S))
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "request_id" in (err.details() or "")
    got = await stub.GetTask(coordinator_pb2.GetTaskRequest(task_id=first.task.task_id))
    assert got.task == first.task
    err = await _error(stub.GetTask(coordinator_pb2.GetTaskRequest(task_id="nope")))
    assert err.code() is grpc.StatusCode.NOT_FOUND
    err = await _error(stub.GetTask(coordinator_pb2.GetTaskRequest()))
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "task_id" in (err.details() or "")


async def test_pending_task_is_assigned_down_the_session_and_acked(
    replicas: Callable[[str], Awaitable[CoordinatorServer]], stubs: Callable[[str], Any]
) -> None:
    leader = await _leading(await replicas("c1"))
    channel = grpc.aio.insecure_channel(leader.address)
    try:
        call: Any = agent_pb2_session(channel)
        await call.write(
            agent_pb2.AgentMessage(
                hello=agent_pb2.Hello(
                    node_id="n1", incarnation="i1", capacity=records_pb2.NodeCapacity(slots=2)
                )
            )
        )
        welcome = await _read(call)
        assert welcome.WhichOneof("body") == "welcome"
        stub = stubs(leader.address)
        submitted = await stub.SubmitTask(_submit("r-assign"), timeout=WAIT_S)
        assign = await _read(call, skip=("heartbeat_ack",))
        assert assign.WhichOneof("body") == "assign"
        assert assign.assign.task_id == submitted.task.task_id
        assert assign.assign.epoch == 1
        await call.write(
            agent_pb2.AgentMessage(
                task_update=agent_pb2.TaskUpdate(
                    update_seq=1,
                    task_id=assign.assign.task_id,
                    epoch=1,
                    started=agent_pb2.TaskUpdate.Started(),
                )
            )
        )
        ack = await _read(call, skip=("heartbeat_ack",))
        assert ack.WhichOneof("body") == "task_update_ack"
        assert ack.task_update_ack.outcome == agent_pb2.UPDATE_OUTCOME_ACCEPTED
        got = await stub.GetTask(coordinator_pb2.GetTaskRequest(task_id=assign.assign.task_id))
        assert got.task.state == records_pb2.TASK_STATE_RUNNING
        assert got.task.owner_node_id == "n1"
        nodes = await stub.ListNodes(coordinator_pb2.ListNodesRequest())
        assert [n.record.node_id for n in nodes.nodes] == ["n1"]
        assert nodes.nodes[0].liveness.connected
        assert nodes.nodes[0].liveness.assigned_tasks == 1
        status = await stub.GetClusterStatus(coordinator_pb2.GetClusterStatusRequest())
        assert status.leader_address == leader.address
        assert status.serving_member_id == "c1"
        assert status.term == leader.runtime.leadership.term  # type: ignore[union-attr]
        assert {(c.state, c.count) for c in status.tasks_by_state} == {
            (records_pb2.TASK_STATE_RUNNING, 1)
        }
    finally:
        await channel.close()


def agent_pb2_session(channel: grpc.aio.Channel) -> Any:
    return channel.stream_stream(
        "/lazarus.v1.AgentService/Session",
        request_serializer=agent_pb2.AgentMessage.SerializeToString,
        response_deserializer=agent_pb2.CoordinatorMessage.FromString,
    )()


async def _read(call: Any, skip: tuple[str, ...] = ()) -> agent_pb2.CoordinatorMessage:
    async with asyncio.timeout(WAIT_S):
        while True:
            message = await call.read()
            assert message is not grpc.aio.EOF
            if message.WhichOneof("body") not in skip:
                return message  # type: ignore[no-any-return]


async def test_list_tasks_pages_and_filters(
    replicas: Callable[[str], Awaitable[CoordinatorServer]], stubs: Callable[[str], Any]
) -> None:
    leader = await _leading(await replicas("c1"))
    stub = stubs(leader.address)
    ids = []
    for i in range(5):
        kind = "a" if i % 2 == 0 else "b"
        reply = await stub.SubmitTask(_submit(f"r{i}", kind=kind), timeout=WAIT_S)
        ids.append(reply.task.task_id)
    seen: list[str] = []
    token = ""
    for _ in range(4):
        page = await stub.ListTasks(coordinator_pb2.ListTasksRequest(page_size=2, page_token=token))
        seen += [t.task_id for t in page.tasks]
        token = page.next_page_token
        if not token:
            break
    assert seen == sorted(ids)
    only_a = await stub.ListTasks(coordinator_pb2.ListTasksRequest(kind="a"))
    assert len(only_a.tasks) == 3
    first = await stub.ListTasks(coordinator_pb2.ListTasksRequest(page_size=1))
    err = await _error(
        stub.ListTasks(coordinator_pb2.ListTasksRequest(kind="a", page_token=first.next_page_token))
    )
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "page_token" in (err.details() or "")
    err = await _error(stub.ListTasks(coordinator_pb2.ListTasksRequest(page_token="%%%")))
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    err = await _error(stub.ListTasks(coordinator_pb2.ListTasksRequest(states=[0])))
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "states[0]" in (err.details() or "")


async def test_follower_reads_from_cache_and_proxies_writes(
    replicas: Callable[[str], Awaitable[CoordinatorServer]], stubs: Callable[[str], Any]
) -> None:
    leader = await _leading(await replicas("c1"))
    follower = await replicas("c2")
    await asyncio.sleep(0.2)
    assert follower.runtime is not None
    assert not follower.runtime.leading
    stub = stubs(follower.address)
    created = await stub.SubmitTask(_submit("r-proxied"), timeout=WAIT_S)
    assert created.created
    assert leader.runtime is not None
    assert leader.runtime.core.task(created.task.task_id) is not None
    async with asyncio.timeout(WAIT_S):
        while True:
            with contextlib.suppress(grpc.aio.AioRpcError):
                got = await stub.GetTask(
                    coordinator_pb2.GetTaskRequest(task_id=created.task.task_id)
                )
                break
            await asyncio.sleep(0.02)
    assert got.task.task_id == created.task.task_id
    assert got.read_revision > 0
    status = await stub.GetClusterStatus(coordinator_pb2.GetClusterStatusRequest())
    assert status.leader_address == leader.address
    assert status.serving_member_id == "c2"


async def test_health_serving_on_leader_and_follower_and_reflection_lists_services(
    replicas: Callable[[str], Awaitable[CoordinatorServer]],
) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    leader = await _leading(await replicas("h1"))
    follower = await replicas("h2")
    for server in (leader, follower):
        async with grpc.aio.insecure_channel(server.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)  # type: ignore[no-untyped-call]
            for service in ("", "lazarus.v1.CoordinatorService", "lazarus.v1.AgentService"):
                reply = await health.Check(
                    health_pb2.HealthCheckRequest(service=service), timeout=WAIT_S
                )
                assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)  # type: ignore[no-untyped-call]
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            names = set()
            async for response in stub.ServerReflectionInfo(iter([request]), timeout=WAIT_S):
                names |= {s.name for s in response.list_services_response.service}
            assert {"lazarus.v1.CoordinatorService", "grpc.health.v1.Health"} <= names
    await follower.stop()
    async with grpc.aio.insecure_channel(leader.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)  # type: ignore[no-untyped-call]
        reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=WAIT_S)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
