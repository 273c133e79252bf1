"""Issue 16 item 5: terminal tasks, LEFT and DEAD nodes leave etcd after the retention period.

Before: every task and node ever seen stayed in etcd forever, so etcd (and the
leader's memory) grew with the fleet's history. An in-process replica with a
1 s retention on the session etcd and Redis; a raw agent completes a task
and says Goodbye. A DEAD node (a crashed pod that never comes back) stayed
until session 24; now it goes the same way once it owns nothing.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis.asyncio
from hardening_support import RawAgent, api, cluster_name, start_replica, wait_leading

from coordinator.core import CoreSettings
from coordinator.etcd_store import Collection, record_key
from coordinator.recordarchive import RecordArchive
from lazarus.storage.keys import archived_task_key, fork_key, fork_records_key, task_keys
from lazarus.v1 import agent_pb2, coordinator_pb2, records_pb2

RETENTION_S = 1.0


async def _complete_one_task(agent: RawAgent, stub: Any, node_id: str) -> str:
    """The raw agent says Hello, is assigned a submitted task and completes it; its id."""
    await agent.hello(node_id, kinds=["k"])
    await agent.recv_until("welcome")
    submitted = await stub.SubmitTask(
        coordinator_pb2.SubmitTaskRequest(request_id="r1", spec=records_pb2.TaskSpec(kind="k")),
        timeout=10,
    )
    task_id: str = submitted.task.task_id
    assign = (await agent.recv_until("assign")).assign
    await agent.update(
        task_id,
        assign.epoch,
        completed=agent_pb2.TaskUpdate.Completed(result=records_pb2.TaskResult(payload=b"ok")),
    )
    await agent.recv_until("task_update_ack")
    return task_id


async def _wait_gone(etcd_client: Any, *keys: str) -> None:
    async with asyncio.timeout(RETENTION_S + 5):
        while any([(await etcd_client.get(key)) is not None for key in keys]):
            await asyncio.sleep(0.1)


async def test_finished_tasks_and_left_nodes_move_to_the_archive(
    etcd: Any, redis_server: Any, etcd_client: Any
) -> None:
    cluster = cluster_name("retain")
    replica = await start_replica(
        etcd, redis_server, cluster, settings=CoreSettings(retention_s=RETENTION_S)
    )
    await wait_leading(replica)
    channel, stub = api(replica.address)
    agent = RawAgent(replica.address)  # its call starts now: after the replica leads
    try:
        task_id = await _complete_one_task(agent, stub, "n-ret")
        await agent.send(agent_pb2.AgentMessage(goodbye=agent_pb2.Goodbye(reason="bye")))
        task_key = record_key(cluster, Collection.TASKS, task_id)
        node_key = record_key(cluster, Collection.NODES, "n-ret")
        assert await etcd_client.get(task_key) is not None
        await _wait_gone(etcd_client, task_key, node_key)
        assert replica.runtime is not None
        assert replica.runtime.core.task(task_id) is None
        # GetTask (and `lazarus task`) still answers, from the Redis archive.
        got = await stub.GetTask(coordinator_pb2.GetTaskRequest(task_id=task_id), timeout=5)
        assert got.task.state == records_pb2.TASK_STATE_COMPLETED
        assert got.task.result.payload == b"ok"
        assert replica.runtime.leading
    finally:
        await agent.close()
        await channel.close()
        await replica.stop()


async def test_the_archive_and_a_retired_tasks_checkpoint_keys_expire_after_the_archive_ttl(
    etcd: Any, redis_server: Any, etcd_client: Any
) -> None:
    """Before: the archive had no TTL setting and a finished task's replicated keys
    (checkpoints, journal, forks) stayed in Redis forever, so Redis grew with every
    task the fleet ever ran."""
    cluster = cluster_name("retain-ttl")
    ttl_s = 600
    replica = await start_replica(
        etcd,
        redis_server,
        cluster,
        settings=CoreSettings(retention_s=RETENTION_S),
        archive_ttl_s=ttl_s,
    )
    await wait_leading(replica)
    client = redis.asyncio.Redis(host=redis_server.endpoint.host, port=redis_server.endpoint.port)
    channel, stub = api(replica.address)
    agent = RawAgent(replica.address)
    try:
        task_id = await _complete_one_task(agent, stub, "n-ttl")
        # What an agent leaves in Redis for a task: its replicated keys and a fork.
        replicated = [*task_keys(task_id), fork_key(task_id), fork_records_key(task_id, "f1")]
        for key in task_keys(task_id):
            await client.set(key, b"x")
        await client.hset(fork_key(task_id), "f1", b"fork record")
        await client.set(fork_records_key(task_id, "f1"), b"lineage report")
        await _wait_gone(etcd_client, record_key(cluster, Collection.TASKS, task_id))
        archived = archived_task_key(cluster, task_id)
        for key in (archived, *replicated):
            ttl = await client.ttl(key)
            assert 0 < ttl <= ttl_s, (key, ttl)
        got = await stub.GetTask(coordinator_pb2.GetTaskRequest(task_id=task_id), timeout=5)
        assert got.task.result.payload == b"ok"
    finally:
        await agent.close()
        await channel.close()
        await client.aclose()
        await replica.stop()


async def test_a_crashed_node_that_never_comes_back_moves_to_the_archive(
    etcd: Any, redis_server: Any, etcd_client: Any
) -> None:
    cluster = cluster_name("retain-dead")
    settings = CoreSettings(retention_s=RETENTION_S)
    replica = await start_replica(etcd, redis_server, cluster, settings=settings)
    await wait_leading(replica)
    client = redis.asyncio.Redis(host=redis_server.endpoint.host, port=redis_server.endpoint.port)
    agent = RawAgent(replica.address)
    try:
        await agent.hello("n-gone", kinds=["k"])
        await agent.recv_until("welcome")
        node_key = record_key(cluster, Collection.NODES, "n-gone")
        assert await etcd_client.get(node_key) is not None
        await agent.close()  # the process is gone: no Goodbye, the stream just ends
        crashed = time.monotonic()
        budget = settings.dead_after_s + RETENTION_S + 8
        async with asyncio.timeout(budget):
            while (await etcd_client.get(node_key)) is not None:
                await asyncio.sleep(0.1)
        # Not before its DEAD verdict plus the retention period.
        assert time.monotonic() - crashed >= settings.dead_after_s + RETENTION_S - 0.5
        assert replica.runtime is not None
        assert replica.runtime.core.node("n-gone") is None
        archived = await RecordArchive(client, cluster).node("n-gone")
        assert archived is not None
        assert records_pb2.NodeRecord.FromString(archived).state == records_pb2.NODE_STATE_DEAD
        # The node id is free again: a new process under it is a new node.
        again = RawAgent(replica.address)
        try:
            await again.hello("n-gone", incarnation="i2", kinds=["k"])
            await again.recv_until("welcome")
        finally:
            await again.close()
        assert replica.runtime.leading
    finally:
        await agent.close()
        await client.aclose()
        await replica.stop()
