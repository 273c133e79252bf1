"""CoordinatorRuntime with a fake election and store: command order, fencing, step-down.

The fakes stand in for etcd so the failure paths run deterministically: a
write refused by the fence, and etcd unavailable for longer than the retries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from coordinator import runtime as runtime_module
from coordinator.core import (
    Checkpointed,
    CheckpointSummary,
    CoreSettings,
    Role,
    SessionOpened,
    Started,
    TaskSpec,
    TaskState,
    TaskSubmitted,
    TaskUpdateReceived,
)
from coordinator.election import Fence, Leadership, LossReason
from coordinator.etcd_store import (
    Collection,
    EtcdUnavailable,
    FencedWriteRejected,
    PutRecord,
    RecordOp,
    Snapshot,
)
from coordinator.runtime import Channel, CoordinatorRuntime, RuntimeSettings
from lazarus.v1 import agent_pb2, records_pb2

TERM = 7


class FakeElection:
    def __init__(self) -> None:
        self.leadership: Leadership | None = None
        self.resigned = 0

    async def campaign(self, value: str) -> Leadership:
        if self.leadership is not None:
            await asyncio.Event().wait()  # a second campaign waits forever
        self.leadership = Leadership("/e/1", 1, TERM, value)
        return self.leadership

    async def resign(self) -> None:
        self.resigned += 1
        if self.leadership is not None:
            self.leadership._lose(LossReason.RESIGNED)


class FakeStore:
    def __init__(self) -> None:
        self.writes: list[tuple[Fence, list[RecordOp]]] = []
        self.fail_with: Exception | None = None
        self.log: list[str] = []

    async def load(self) -> Snapshot:
        return Snapshot(revision=1)

    async def write(self, fence: Fence, ops: Sequence[RecordOp]) -> tuple[int, ...]:
        if self.fail_with is not None:
            raise self.fail_with
        self.writes.append((fence, list(ops)))
        self.log.append("persist")
        return (len(self.writes),)


async def _leading_runtime(
    observer: Any = None,
) -> tuple[CoordinatorRuntime, FakeElection, FakeStore, Any]:
    election = FakeElection()
    store = FakeStore()
    runtime = CoordinatorRuntime(
        CoreSettings(),
        RuntimeSettings(cluster="c", member_id="m", advertise_address="127.0.0.1:1"),
        election=election,  # type: ignore[arg-type]
        store=store,  # type: ignore[arg-type]
        seed=1,
        observer=observer,
    )
    task = asyncio.create_task(runtime.run())
    async with asyncio.timeout(2):
        while not runtime.leading:
            await asyncio.sleep(0.001)
    return runtime, election, store, task


def _hello(channel: Channel) -> SessionOpened:
    return SessionOpened(session_id=channel.session_id, node_id="n1", incarnation="i1", now_s=0.0)


def _queued(channel: Channel) -> list[Any]:
    items = []
    queue = channel._queue
    while not queue.empty():
        items.append(queue.get_nowait())
    return items


async def _stop(task: Any) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_persist_happens_before_the_welcome_is_queued() -> None:
    runtime, _, store, task = await _leading_runtime()
    channel = runtime.open_channel()
    original = channel.put

    def put(message: agent_pb2.CoordinatorMessage) -> None:
        store.log.append(message.WhichOneof("body") or "")
        original(message)

    channel.put = put  # type: ignore[method-assign]
    assert await runtime.feed(_hello(channel))
    assert store.log == ["persist", "welcome"]
    fence, ops = store.writes[0]
    assert fence.term == TERM
    assert [(op.collection, op.name) for op in ops] == [(Collection.NODES, "n1")]
    await _stop(task)


async def test_fenced_write_rejected_drops_the_rest_and_steps_down() -> None:
    runtime, election, store, task = await _leading_runtime()
    channel = runtime.open_channel()
    store.fail_with = FencedWriteRejected(Fence(b"/e/1", TERM), 0, None)
    await runtime.feed(_hello(channel))
    assert election.leadership is not None
    assert election.leadership.reason is LossReason.FENCE_REJECTED
    assert runtime.core.role is Role.FOLLOWER
    async with asyncio.timeout(2):
        while runtime.leading or not channel.closed:
            await asyncio.sleep(0.001)
    items = _queued(channel)
    assert not any(isinstance(i, agent_pb2.CoordinatorMessage) for i in items), items
    assert not await runtime.feed(_hello(channel))
    await _stop(task)


async def test_etcd_outage_beyond_retries_is_persist_failed_and_resigns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runtime_module, "PERSIST_RETRY_INTERVAL_S", 0.001)
    runtime, election, store, task = await _leading_runtime()
    channel = runtime.open_channel()
    store.fail_with = EtcdUnavailable("write", TimeoutError(), outcome_unknown=True)
    await runtime.feed(_hello(channel))
    assert runtime.core.role is Role.FOLLOWER
    async with asyncio.timeout(2):
        while election.resigned == 0 or runtime.leading:
            await asyncio.sleep(0.001)
    assert not any(isinstance(i, agent_pb2.CoordinatorMessage) for i in _queued(channel))
    await _stop(task)


async def test_flush_before_resign_writes_the_progress_the_core_holds_back() -> None:
    runtime, _, store, task = await _leading_runtime()
    channel = runtime.open_channel()
    assert await runtime.feed(_hello(channel))
    spec = TaskSpec(kind="k")
    assert await runtime.feed(TaskSubmitted("r1", spec, 0.0, task_id="t1"))
    assert runtime.core.task("t1").state is TaskState.ASSIGNED  # type: ignore[union-attr]

    def update(seq: int, change: Any) -> TaskUpdateReceived:
        return TaskUpdateReceived(channel.session_id, "n1", seq, "t1", 1, change, 0.0)

    def checkpointed(seq: int) -> Checkpointed:
        return Checkpointed(CheckpointSummary(f"t1@{seq}", epoch=1, seq=seq, replicated=True))

    assert await runtime.feed(update(1, Started()))
    assert await runtime.feed(update(2, checkpointed(1)))  # the first: written at once
    writes = len(store.writes)
    assert await runtime.feed(update(3, checkpointed(2)))  # held back for the flush
    assert len(store.writes) == writes
    assert await runtime.flush_before_resign()
    [(_, ops)] = store.writes[writes:]
    [op] = ops
    assert isinstance(op, PutRecord)
    assert op.name == "t1"
    assert records_pb2.TaskRecord.FromString(op.value).last_replicated_checkpoint.seq == 2
    await _stop(task)


async def test_retired_nodes_are_reported_to_the_observer() -> None:
    from coordinator.core.commands import RetireRecords
    from coordinator.core.records import NodeRecord, NodeState
    from coordinator.metrics import Metrics

    class Recording(Metrics):
        def __init__(self) -> None:
            super().__init__()
            self.retired: list[str] = []

        def nodes_retired(self, node_ids: Sequence[str]) -> None:
            self.retired.extend(node_ids)
            super().nodes_retired(node_ids)

    observer = Recording()
    runtime, _, _, task = await _leading_runtime(observer)
    gone = (NodeRecord("a", "i", NodeState.LEFT), NodeRecord("b", "i", NodeState.DEAD))
    await runtime._run_locked([RetireRecords(TERM, nodes=gone)])  # no archive: kept in etcd
    assert observer.retired == ["a", "b"]
    await _stop(task)


class _HangingArchive:
    """A Redis archive that answers only when told (a SIGSTOPped or blackholed Redis)."""

    def __init__(self) -> None:
        self.answer = asyncio.Event()
        self.put_calls = 0

    async def put(self, tasks: Any, nodes: Any = ()) -> None:
        self.put_calls += 1
        await self.answer.wait()


async def test_a_hung_archive_does_not_hold_the_leaders_steps_and_a_node_back_is_not_deleted() -> (
    None
):
    """Before: the archive write ran under the step lock, so a hung Redis held every
    ack and directive 5 s (its socket timeout) per retirement and the fleet fenced."""
    from coordinator.core.commands import RetireRecords
    from coordinator.core.records import NodeRecord, NodeState
    from coordinator.etcd_store import DeleteRecord

    runtime, _, store, task = await _leading_runtime()
    archive = _HangingArchive()
    runtime.record_archive = archive  # type: ignore[assignment]
    gone = (NodeRecord("n1", "i0", NodeState.DEAD), NodeRecord("n2", "i0", NodeState.LEFT))
    async with asyncio.timeout(1):
        await runtime._run_locked([RetireRecords(TERM, nodes=gone)])
        # The leader goes on stepping while the archive hangs: n1 comes back.
        channel = runtime.open_channel()
        assert await runtime.feed(_hello(channel))
    assert archive.put_calls == 1
    assert runtime.core.node("n1") is not None
    writes = len(store.writes)
    archive.answer.set()
    async with asyncio.timeout(2):
        while len(store.writes) == writes:
            await asyncio.sleep(0.001)
    [(_, ops)] = store.writes[writes:]
    # n2 leaves etcd; n1 is live again under its id, and its new record stays.
    assert ops == [DeleteRecord(Collection.NODES, "n2")]
    assert runtime.retired == 1
    await _stop(task)


async def test_a_failure_running_a_steps_commands_ends_the_leadership() -> None:
    """Before: an exception from the shell's commands (not the core's step) left the
    events' futures pending, so the tick loop waited for ever on a leader that kept
    its lease and Sessions and judged nothing (a zombie leader)."""
    runtime, election, _, task = await _leading_runtime()
    channel = runtime.open_channel()

    def broken(command: Any) -> None:
        raise RuntimeError("a bug in the shell")

    runtime._send = broken  # type: ignore[method-assign]
    async with asyncio.timeout(2):
        assert not await runtime.feed(_hello(channel))  # the Welcome cannot be sent
        while election.resigned == 0 or runtime.leading:
            await asyncio.sleep(0.001)
    assert isinstance(runtime.failure, RuntimeError)
    with pytest.raises(RuntimeError, match="a bug in the shell"):
        await task  # the replica's loop ends: health NOT_SERVING, the probe restarts it
