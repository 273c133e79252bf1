"""Issue 16 item 5: terminal tasks and LEFT nodes leave etcd after the retention period.

Before: every task and node ever seen stayed in etcd forever, so etcd (and the
leader's memory) grew with the fleet's history. An in-process replica with a
1 s retention on the session etcd and Redis; a raw agent completes a task
and says Goodbye.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hardening_support import RawAgent, api, cluster_name, start_replica, wait_leading

from coordinator.core import CoreSettings
from coordinator.etcd_store import Collection, record_key
from lazarus.v1 import agent_pb2, coordinator_pb2, records_pb2

RETENTION_S = 1.0


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
        await agent.hello("n-ret", kinds=["k"])
        await agent.recv_until("welcome")
        submitted = await stub.SubmitTask(
            coordinator_pb2.SubmitTaskRequest(request_id="r1", spec=records_pb2.TaskSpec(kind="k")),
            timeout=10,
        )
        task_id = submitted.task.task_id
        assign = (await agent.recv_until("assign")).assign
        await agent.update(
            task_id,
            assign.epoch,
            completed=agent_pb2.TaskUpdate.Completed(result=records_pb2.TaskResult(payload=b"ok")),
        )
        await agent.recv_until("task_update_ack")
        await agent.send(agent_pb2.AgentMessage(goodbye=agent_pb2.Goodbye(reason="bye")))
        task_key = record_key(cluster, Collection.TASKS, task_id)
        node_key = record_key(cluster, Collection.NODES, "n-ret")
        assert await etcd_client.get(task_key) is not None
        async with asyncio.timeout(RETENTION_S + 5):
            while (await etcd_client.get(task_key)) is not None or (
                await etcd_client.get(node_key)
            ) is not None:
                await asyncio.sleep(0.1)
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
