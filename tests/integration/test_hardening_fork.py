"""Issue 16 item 7: ForkTask validates before it writes.

Before: the seed checkpoint was written to Redis under the new task id first,
and only then was the fork submitted to the core; a refused fork (the id
taken, a bad spec) left the seed behind, so an existing task, or one
submitted later under that id, resumed from the fork's state. An in-process
replica on the session etcd and Redis.
"""

from __future__ import annotations

from typing import Any

import grpc
import grpc.aio
import pytest
import redis.asyncio
from hardening_support import api, cluster_name, start_replica, wait_leading

from lazarus.v1 import coordinator_pb2, records_pb2
from node_agent.replication import RedisCheckpointReplica, ReplicationItem


async def test_a_refused_fork_leaves_nothing_and_never_seeds_another_task(
    etcd: Any, redis_server: Any
) -> None:
    cluster = cluster_name("fork")
    replica = await start_replica(etcd, redis_server, cluster)
    channel, stub = api(replica.address)
    client = redis.asyncio.Redis(host=redis_server.endpoint.host, port=redis_server.endpoint.port)
    store = RedisCheckpointReplica(client)
    source = f"{cluster}-src"
    try:
        await wait_leading(replica)
        await store.write(
            ReplicationItem(
                source,
                1,
                "n1",
                checkpoint=records_pb2.CheckpointRecord(
                    task_id=source, epoch=1, seq=1, checkpoint_ref=f"{source}@1", payload=b'{"a":1}'
                ),
            )
        )
        spec = records_pb2.TaskSpec(kind="k")
        existing = f"{cluster}-existing"
        await stub.SubmitTask(
            coordinator_pb2.SubmitTaskRequest(request_id="r-existing", task_id=existing, spec=spec)
        )

        async def fork(request_id: str, new_task_id: str, **fields: Any) -> Any:
            return await stub.ForkTask(
                coordinator_pb2.ForkTaskRequest(
                    request_id=request_id,
                    from_checkpoint_ref=f"{source}@1",
                    new_task_id=new_task_id,
                    **fields,
                ),
                timeout=10,
            )

        # Into an existing task: refused, and that task's state is untouched.
        with pytest.raises(grpc.aio.AioRpcError) as taken:
            await fork("f-1", existing, spec=spec)
        assert taken.value.code() is grpc.StatusCode.ALREADY_EXISTS
        assert await store.load(existing) is None
        # A fork the core refuses (no kind): nothing is seeded under its id, so
        # a task submitted later under that id starts clean.
        future = f"{cluster}-future"
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await fork("f-2", future, spec=records_pb2.TaskSpec(kind=""))
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert await store.load(future) is None
        # An accepted fork is seeded, and its task records the seed.
        forked = await fork("f-3", f"{cluster}-fork", spec=spec)
        assert forked.created
        state = await store.load(f"{cluster}-fork")
        assert state is not None
        assert state.checkpoint is not None
        assert state.checkpoint.parent_ref == f"{source}@1"
        got = await stub.GetTask(coordinator_pb2.GetTaskRequest(task_id=f"{cluster}-fork"))
        assert got.task.last_replicated_checkpoint.seq == 1
    finally:
        await client.aclose()
        await channel.close()
        await replica.stop()
