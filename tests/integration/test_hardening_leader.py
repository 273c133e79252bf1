"""Issue 16 item 4: no zombie leader; poison records in etcd are quarantined at load.

Before: an exception in the leader's loop (the core raising on a tick, or on
records it loaded) ended the loop while the election lease stayed held — a
leader that decided nothing, for every leader in turn — and a record that did
not parse was dropped silently. In-process replicas on the session etcd and
Redis.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hardening_support import api, cluster_name, start_replica, wait_leading

from coordinator import convert
from coordinator.core import Tick
from coordinator.core.records import NodeRecord, TaskRecord, TaskSpec
from coordinator.etcd_store import Collection, record_key
from coordinator.metrics import Metrics
from lazarus.v1 import coordinator_pb2, records_pb2


async def _health(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)  # type: ignore[no-untyped-call]
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
        return int(reply.status)


async def test_an_exception_in_the_leader_loop_resigns_and_turns_not_serving(
    etcd: Any, redis_server: Any
) -> None:
    replica = await start_replica(etcd, redis_server, cluster_name("zombie"))
    try:
        await wait_leading(replica)
        runtime = replica.runtime
        assert runtime is not None
        assert await _health(replica.address) == health_pb2.HealthCheckResponse.SERVING
        real_step = runtime.core.step

        def broken(event: Any) -> Any:
            if isinstance(event, Tick):
                raise RuntimeError("injected fault in the core")
            return real_step(event)

        runtime.core.step = broken  # type: ignore[method-assign]
        async with asyncio.timeout(5):  # the lease (3 s) must not be what ends it
            while True:
                leader = await runtime.election.leader()
                if leader is None or leader.value != replica.address:
                    break
                await asyncio.sleep(0.05)
            while await _health(replica.address) != health_pb2.HealthCheckResponse.NOT_SERVING:
                await asyncio.sleep(0.05)
        assert not runtime.leading
        assert isinstance(runtime.failure, RuntimeError)
    finally:
        await replica.stop()


def _task(task_id: str, request_id: str) -> bytes:
    record = TaskRecord(task_id=task_id, request_id=request_id, spec=TaskSpec(kind="k"))
    return convert.task_record_to_pb(record).SerializeToString()


async def test_poison_records_are_quarantined_and_the_leader_leads(
    etcd: Any, redis_server: Any, etcd_client: Any
) -> None:
    cluster = cluster_name("poison")
    poison = {
        (Collection.NODES, "garbage"): b"\x0a\xff\x01",  # does not parse
        (Collection.NODES, "n-x"): convert.node_record_to_pb(
            NodeRecord(node_id="n-y", incarnation="i")
        ).SerializeToString(),  # stored under another node's name
        (Collection.TASKS, "t-empty"): _task("", "r-empty"),  # empty id
        (Collection.TASKS, "t-b"): _task("t-b", "dup"),  # t-a has the same request id
    }
    fine = {(Collection.TASKS, "t-a"): _task("t-a", "dup")}
    for (collection, name), value in {**poison, **fine}.items():
        await etcd_client.put(record_key(cluster, collection, name), value)
    metrics = Metrics()
    replica = await start_replica(etcd, redis_server, cluster, observer=metrics)
    channel, stub = api(replica.address)
    try:
        await wait_leading(replica)
        runtime = replica.runtime
        assert runtime is not None
        for (collection, name), value in poison.items():
            assert await etcd_client.get(record_key(cluster, collection, name)) is None
            moved = await etcd_client.get(
                record_key(cluster, Collection.QUARANTINE, f"{collection.value}/{name}")
            )
            assert moved is not None, name
            record = records_pb2.QuarantinedRecord.FromString(moved.value)
            assert record.value == value
            assert record.reason
        assert runtime.core.task("t-a") is not None
        kinds = [
            e.record_quarantined.name for e in runtime.events if e.HasField("record_quarantined")
        ]
        assert sorted(kinds) == sorted(name for _, name in poison)
        assert metrics.quarantined.labels("tasks")._value.get() == 2
        # It goes on leading: a task is accepted; the status lists the quarantine.
        await stub.SubmitTask(
            coordinator_pb2.SubmitTaskRequest(
                request_id="r-new", spec=records_pb2.TaskSpec(kind="k")
            ),
            timeout=10,
        )
        await asyncio.sleep(0.5)
        status = await stub.GetClusterStatus(coordinator_pb2.GetClusterStatusRequest(), timeout=5)
        listed = sorted(f"{q.collection}/{q.name}" for q in status.quarantined)
        assert listed == sorted(f"{c.value}/{n}" for c, n in poison)
        assert runtime.leading
        assert runtime.leader_changes == 1
    finally:
        await channel.close()
        await replica.stop()
