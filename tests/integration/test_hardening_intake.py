"""Issue 16 item 1: inputs over the intake limits are refused; the leader keeps leading.

Before the limits, one label or result over etcd's 1.5 MiB request limit made
the leader's fenced write fail five times, and the leader stepped down (and
the agent re-sent the update to every next leader). An in-process replica on
the session etcd and Redis.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import grpc.aio
import pytest
from hardening_support import RawAgent, api, cluster_name, start_replica, wait_leading

from lazarus.v1 import agent_pb2, coordinator_pb2, records_pb2

BIG = "x" * 1_600_000  # over etcd's --max-request-bytes (1.5 MiB), under gRPC's 4 MiB


@pytest.fixture
async def replica(etcd: Any, redis_server: Any) -> Any:
    server = await start_replica(etcd, redis_server, cluster_name("intake"))
    try:
        await wait_leading(server)
        yield server
    finally:
        await server.stop()


def _term(replica: Any) -> int:
    assert replica.runtime.leadership is not None
    return int(replica.runtime.leadership.term)


async def test_oversized_label_and_result_are_refused_and_the_leader_stays(replica: Any) -> None:
    runtime = replica.runtime
    term, changes = _term(replica), runtime.leader_changes
    channel, stub = api(replica.address)
    bad = RawAgent(replica.address)
    good = RawAgent(replica.address)
    try:
        # A Hello with one huge label: that Session only is refused, naming the field.
        await bad.hello("n-big", labels={"zone": BIG})
        code, details = await bad.final_status()
        assert code is grpc.StatusCode.INVALID_ARGUMENT, (code, details)
        assert "hello.labels" in details
        # A SubmitTask with one huge label: INVALID_ARGUMENT naming the field.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.SubmitTask(
                coordinator_pb2.SubmitTaskRequest(
                    request_id="r-big",
                    spec=records_pb2.TaskSpec(kind="k", labels={"owner": BIG}),
                ),
                timeout=10,
            )
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "spec.labels" in (refused.value.details() or "")
        # A task whose handler returns a huge result: the task fails
        # PAYLOAD_TOO_LARGE, the update is answered (never re-sent).
        await good.hello("n-good", kinds=["k"])
        await good.recv_until("welcome")
        submitted = await stub.SubmitTask(
            coordinator_pb2.SubmitTaskRequest(
                request_id="r-ok", spec=records_pb2.TaskSpec(kind="k")
            ),
            timeout=10,
        )
        task_id = submitted.task.task_id
        assign = (await good.recv_until("assign")).assign
        assert assign.task_id == task_id
        await good.heartbeat()
        seq = await good.update(
            task_id,
            assign.epoch,
            completed=agent_pb2.TaskUpdate.Completed(
                result=records_pb2.TaskResult(payload=BIG.encode())
            ),
        )
        ack = (await good.recv_until("task_update_ack")).task_update_ack
        assert ack.update_seq == seq
        task = (await stub.GetTask(coordinator_pb2.GetTaskRequest(task_id=task_id))).task
        assert task.state == records_pb2.TASK_STATE_FAILED
        assert task.last_error.code == records_pb2.TASK_ERROR_CODE_PAYLOAD_TOO_LARGE
        assert "result.payload" in task.last_error.message
        # Longer than five persist attempts (1 s): nothing made the leader step down.
        await asyncio.sleep(1.5)
        assert runtime.leading
        assert (_term(replica), runtime.leader_changes) == (term, changes)
        await good.heartbeat()
        await good.recv_until("heartbeat_ack")
    finally:
        await bad.close()
        await good.close()
        await channel.close()
