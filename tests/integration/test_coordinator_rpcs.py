"""CoordinatorService operator RPCs, WatchEvents and GetCheckpoint against real servers.

Two groups:

- in-process ``CoordinatorServer`` replicas on the shared etcd (and Redis for
  GetCheckpoint), with scripted node agents speaking the Session protocol
  (``FakeAgent``: Hello, heartbeats, task updates) — validation, proxying
  through a follower, the write RPCs, WatchEvents filters / resume / end on
  a change of leader / backpressure, GetCheckpoint;
- real processes through ``lazarus_dev.devcluster.LocalCluster`` (etcd, Redis,
  coordinators, node agents running ``node_agent/demo_app.py``) for DrainNode
  and MigrateTask end to end, checking that moved tasks resume at the
  released checkpoint with no work redone.

Every wait is bounded; servers and processes stop at teardown.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
import redis.asyncio

from coordinator.core import CoreSettings
from coordinator.eventlog import COUNTER_BITS, event_type
from coordinator.server import CoordinatorServer, ServerSettings
from lazarus.v1 import agent_pb2, coordinator_pb2, coordinator_pb2_grpc, records_pb2
from lazarus_dev.devcluster import LocalCluster
from lazarus_dev.localservers import free_loopback_ports
from node_agent.replication import RedisCheckpointReplica, ReplicationItem

pytestmark = pytest.mark.integration

FAST = CoreSettings(
    heartbeat_interval_s=0.1,
    dead_after_s=0.6,
    fence_after_s=0.4,
    tick_interval_s=0.05,
    suspect_after_intervals=2.0,
)
WAIT_S = 5.0
E = records_pb2

StartReplica = Callable[..., Awaitable[CoordinatorServer]]


# ---------------------------------------------------------------- fixtures


@pytest.fixture
async def replicas(etcd: Any, redis_server: Any) -> AsyncIterator[StartReplica]:
    cluster = f"rpc-{uuid.uuid4().hex[:10]}"
    started: list[CoordinatorServer] = []

    async def start(member: str, *, redis_url: str = "") -> CoordinatorServer:
        server = CoordinatorServer(
            ServerSettings(
                cluster=cluster,
                member_id=member,
                etcd_endpoint=str(etcd.endpoint),
                lease_ttl_s=2,
                redis_url=redis_url or redis_server.url,
                auth="none",  # in-process RPC tests; tests/integration/test_security.py: mTLS
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


async def _leading(server: CoordinatorServer) -> CoordinatorServer:
    async with asyncio.timeout(WAIT_S):
        while server.runtime is None or not server.runtime.leading:
            await asyncio.sleep(0.02)
    return server


async def _pair(replicas: StartReplica) -> tuple[CoordinatorServer, CoordinatorServer]:
    """A leader and a follower that knows it (its cache and the election show it)."""
    leader = await _leading(await replicas("c1"))
    follower = await replicas("c2")
    assert follower.runtime is not None
    async with asyncio.timeout(WAIT_S):
        while True:
            got = await follower.runtime.election.leader()
            if got is not None and got.value == leader.address:
                break
            await asyncio.sleep(0.02)
    return leader, follower


async def _error(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


def _submit(request_id: str, kind: str = "echo", **kw: Any) -> coordinator_pb2.SubmitTaskRequest:
    return coordinator_pb2.SubmitTaskRequest(
        request_id=request_id, task_id=request_id, spec=records_pb2.TaskSpec(kind=kind, **kw)
    )


class FakeAgent:
    """A scripted node agent: Hello, heartbeats every 100 ms, updates on request."""

    def __init__(self, address: str, node_id: str, slots: int = 4) -> None:
        self.node_id = node_id
        self.slots = slots
        self.running: dict[str, int] = {}
        self.inbox: asyncio.Queue[agent_pb2.CoordinatorMessage] = asyncio.Queue()
        self._channel = grpc.aio.insecure_channel(address)
        self._call: Any = None
        self._seq = 0
        self._update_seq = 0
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> FakeAgent:
        self._call = self._channel.stream_stream(
            "/lazarus.v1.AgentService/Session",
            request_serializer=agent_pb2.AgentMessage.SerializeToString,
            response_deserializer=agent_pb2.CoordinatorMessage.FromString,
        )()
        await self._call.write(
            agent_pb2.AgentMessage(
                hello=agent_pb2.Hello(
                    node_id=self.node_id,
                    incarnation=uuid.uuid4().hex,
                    capacity=records_pb2.NodeCapacity(slots=self.slots),
                )
            )
        )
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._beat())]
        await self.expect("welcome")
        return self

    async def _read(self) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            while True:
                message = await self._call.read()
                if message is grpc.aio.EOF:
                    return
                if message.WhichOneof("body") != "heartbeat_ack":
                    self.inbox.put_nowait(message)

    async def _beat(self) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            while True:
                self._seq += 1
                progress = [
                    agent_pb2.TaskProgress(task_id=t, epoch=e)
                    for t, e in sorted(self.running.items())
                ]
                await self._call.write(
                    agent_pb2.AgentMessage(
                        heartbeat=agent_pb2.Heartbeat(seq=self._seq, tasks=progress)
                    )
                )
                await asyncio.sleep(0.1)

    async def expect(self, body: str, **fields: Any) -> agent_pb2.CoordinatorMessage:
        """The next message with this body (and fields), skipping others."""
        async with asyncio.timeout(WAIT_S):
            while True:
                message = await self.inbox.get()
                if message.WhichOneof("body") != body:
                    continue
                inner = getattr(message, body)
                if all(getattr(inner, k) == v for k, v in fields.items()):
                    return message

    async def update(self, task_id: str, epoch: int, **change: Any) -> None:
        self._update_seq += 1
        await self._call.write(
            agent_pb2.AgentMessage(
                task_update=agent_pb2.TaskUpdate(
                    update_seq=self._update_seq, task_id=task_id, epoch=epoch, **change
                )
            )
        )

    async def run(self, task_id: str) -> int:
        """Wait for the Assign of ``task_id``, report Started; returns the epoch."""
        assign = (await self.expect("assign", task_id=task_id)).assign
        self.running[task_id] = assign.epoch
        await self.update(task_id, assign.epoch, started=agent_pb2.TaskUpdate.Started())
        return int(assign.epoch)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._channel.close()


@pytest.fixture
async def agents() -> AsyncIterator[Callable[[str, str], Awaitable[FakeAgent]]]:
    started: list[FakeAgent] = []

    async def make(address: str, node_id: str) -> FakeAgent:
        agent = FakeAgent(address, node_id)
        started.append(agent)
        return await agent.start()

    yield make
    for agent in started:
        await agent.stop()


async def _task(stub: Any, task_id: str) -> records_pb2.TaskRecord:
    reply = await stub.GetTask(coordinator_pb2.GetTaskRequest(task_id=task_id), timeout=WAIT_S)
    return reply.task  # type: ignore[no-any-return]


async def _until(check: Callable[[], Awaitable[bool]], timeout_s: float = WAIT_S) -> None:
    async with asyncio.timeout(timeout_s):
        while not await check():
            await asyncio.sleep(0.05)


# ---------------------------------------------------------------- validation


async def test_write_rpcs_validate_every_field_on_leader_and_follower(
    replicas: StartReplica, stubs: Callable[[str], Any]
) -> None:
    started = time.monotonic()
    leader, follower = await _pair(replicas)
    long_reason = "x" * 1025
    c = coordinator_pb2
    invalid, missing = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
    empty_task, empty_node = "task_id: must not be empty", "node_id: must not be empty"
    huge_ms = 10**12
    cases: list[tuple[str, Any, grpc.StatusCode, str]] = [
        ("CancelTask", c.CancelTaskRequest(), invalid, empty_task),
        ("CancelTask", c.CancelTaskRequest(task_id="t", reason=long_reason), invalid, "reason:"),
        ("CancelTask", c.CancelTaskRequest(task_id="nope"), missing, "task_id"),
        ("DrainNode", c.DrainNodeRequest(), invalid, empty_node),
        (
            "DrainNode",
            c.DrainNodeRequest(node_id="n", release_timeout_ms=huge_ms),
            invalid,
            "release_timeout_ms",
        ),
        ("DrainNode", c.DrainNodeRequest(node_id="n", reason=long_reason), invalid, "reason:"),
        ("DrainNode", c.DrainNodeRequest(node_id="nope"), missing, "node_id"),
        ("UncordonNode", c.UncordonNodeRequest(), invalid, empty_node),
        ("UncordonNode", c.UncordonNodeRequest(node_id="nope"), missing, "node_id"),
        ("MigrateTask", c.MigrateTaskRequest(), invalid, empty_task),
        (
            "MigrateTask",
            c.MigrateTaskRequest(task_id="t", target_node_id="n" * 200),
            invalid,
            "target_node_id",
        ),
        (
            "MigrateTask",
            c.MigrateTaskRequest(task_id="t", release_timeout_ms=huge_ms),
            invalid,
            "release_timeout_ms",
        ),
        (
            "MigrateTask",
            c.MigrateTaskRequest(task_id="nope", target_node_id="n"),
            missing,
            "task_id",
        ),
        ("GetCheckpoint", c.GetCheckpointRequest(), invalid, empty_task),
        ("GetCheckpoint", c.GetCheckpointRequest(task_id="t", seq=0), invalid, "seq"),
        (
            "GetCheckpoint",
            c.GetCheckpointRequest(task_id="t", checkpoint_ref="u@3"),
            invalid,
            "checkpoint_ref",
        ),
        (
            "GetCheckpoint",
            c.GetCheckpointRequest(task_id="t", checkpoint_ref="junk"),
            invalid,
            "checkpoint_ref",
        ),
    ]
    for server in (leader, follower):
        stub = stubs(server.address)
        for method, request, code, fragment in cases:
            err = await _error(getattr(stub, method)(request, timeout=WAIT_S))
            assert err.code() is code, (server.settings.member_id, method, err)
            assert fragment in (err.details() or ""), (method, err.details())
        err = await _error(stub.ForkTask(coordinator_pb2.ForkTaskRequest(), timeout=WAIT_S))
        assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "request_id" in (err.details() or "")
        assert "from_checkpoint_ref" in (err.details() or "")
    assert time.monotonic() - started < 30


# ---------------------------------------------------------------- write RPCs


async def test_cancel_drain_uncordon_and_migrate_through_a_follower(
    replicas: StartReplica,
    stubs: Callable[[str], Any],
    agents: Callable[[str, str], Awaitable[FakeAgent]],
) -> None:
    leader, follower = await _pair(replicas)
    stub = stubs(follower.address)  # every write goes through the follower's proxy
    a = await agents(leader.address, "n-a")
    # Cancel: PENDING -> CANCELLED... first let "a" own a task, then cancel it (Revoke).
    await stub.SubmitTask(_submit("t-cancel"), timeout=WAIT_S)
    epoch = await a.run("t-cancel")
    cancelled = await stub.CancelTask(
        coordinator_pb2.CancelTaskRequest(task_id="t-cancel", reason="no longer needed"),
        timeout=WAIT_S,
    )
    assert cancelled.task.state == E.TASK_STATE_CANCELLED
    assert cancelled.task.cancel_reason == "no longer needed"
    revoke = await a.expect("revoke", task_id="t-cancel")
    assert revoke.revoke.epoch == epoch
    assert revoke.revoke.reason == agent_pb2.REVOKE_REASON_CANCELLED
    a.running.pop("t-cancel")
    again = await stub.CancelTask(coordinator_pb2.CancelTaskRequest(task_id="t-cancel"))
    assert again.task.state == E.TASK_STATE_CANCELLED  # idempotent

    # Drain "a" (two tasks) while "b" is up: each gets a Release, then moves to b.
    await stub.SubmitTask(_submit("t-1"), timeout=WAIT_S)
    await stub.SubmitTask(_submit("t-2"), timeout=WAIT_S)
    e1 = await a.run("t-1")
    e2 = await a.run("t-2")
    b = await agents(leader.address, "n-b")
    drain = await stub.DrainNode(
        coordinator_pb2.DrainNodeRequest(node_id="n-a", reason="kernel upgrade"), timeout=WAIT_S
    )
    assert drain.tasks_to_move == 2
    assert drain.node.cordoned
    assert drain.node.state == E.NODE_STATE_DRAINING
    assert drain.drain_id
    repeat = await stub.DrainNode(coordinator_pb2.DrainNodeRequest(node_id="n-a"))
    assert repeat.drain_id == drain.drain_id  # idempotent while the drain runs
    for task_id, epoch in (("t-1", e1), ("t-2", e2)):
        release = (await a.expect("release", task_id=task_id)).release
        assert release.reason == E.MOVE_REASON_DRAIN
        ckpt = records_pb2.CheckpointSummary(
            checkpoint_ref=f"{task_id}@2", epoch=epoch, seq=2, replicated=True
        )
        await a.update(
            task_id,
            epoch,
            released=agent_pb2.TaskUpdate.Released(
                move_id=release.move_id, checkpoint=ckpt, journal_seq=5
            ),
        )
        a.running.pop(task_id)
        assign = (await b.expect("assign", task_id=task_id)).assign
        assert assign.epoch == epoch + 1
        assert assign.resume_from.checkpoint.seq == 2
        assert assign.resume_from.replay_through_journal_seq == 5
        b.running[task_id] = assign.epoch
        await b.update(task_id, assign.epoch, started=agent_pb2.TaskUpdate.Started())
    uncordoned = await stub.UncordonNode(coordinator_pb2.UncordonNodeRequest(node_id="n-a"))
    assert not uncordoned.node.cordoned
    assert uncordoned.node.state == E.NODE_STATE_ALIVE
    assert (await stub.UncordonNode(coordinator_pb2.UncordonNodeRequest(node_id="n-a"))).node

    # Migrate t-1 from b back to a, checking the refusals first. The follower
    # answers reads from its watch-fed cache, which trails the leader's writes
    # (read_revision says how far): wait until it shows the move.
    async def _moved_to_b() -> bool:
        with contextlib.suppress(grpc.aio.AioRpcError):
            return (await _task(stub, "t-1")).owner_node_id == "n-b"
        return False

    await _until(_moved_to_b)
    t1 = await _task(stub, "t-1")
    assert t1.owner_node_id == "n-b"
    refusals: list[tuple[dict[str, Any], grpc.StatusCode, str]] = [
        (dict(target_node_id="n-b"), grpc.StatusCode.FAILED_PRECONDITION, "current owner"),
        (dict(target_node_id="n-zz"), grpc.StatusCode.NOT_FOUND, "target_node_id"),
        (
            dict(target_node_id="n-a", expected_epoch=t1.epoch + 5),
            grpc.StatusCode.ABORTED,
            "expected_epoch",
        ),
    ]
    for fields, code, fragment in refusals:
        err = await _error(
            stub.MigrateTask(coordinator_pb2.MigrateTaskRequest(task_id="t-1", **fields))
        )
        assert err.code() is code, fields
        assert fragment in (err.details() or "")
    migrated = await stub.MigrateTask(
        coordinator_pb2.MigrateTaskRequest(
            task_id="t-1", target_node_id="n-a", expected_epoch=t1.epoch, reason="rebalance"
        ),
        timeout=WAIT_S,
    )
    assert migrated.move_id
    assert migrated.task.move.move_id == migrated.move_id
    assert migrated.task.move.reason == E.MOVE_REASON_MIGRATE
    assert migrated.task.move.target_node_id == "n-a"
    err = await _error(
        stub.MigrateTask(coordinator_pb2.MigrateTaskRequest(task_id="t-1", target_node_id="n-a"))
    )
    assert err.code() is grpc.StatusCode.FAILED_PRECONDITION  # a move is in progress
    release = (await b.expect("release", task_id="t-1")).release
    assert release.reason == E.MOVE_REASON_MIGRATE
    assert release.target_node_id == "n-a"
    ckpt = records_pb2.CheckpointSummary(
        checkpoint_ref="t-1@3", epoch=t1.epoch, seq=3, replicated=True
    )
    await b.update(
        "t-1",
        t1.epoch,
        released=agent_pb2.TaskUpdate.Released(move_id=release.move_id, checkpoint=ckpt),
    )
    b.running.pop("t-1")
    assign = (await a.expect("assign", task_id="t-1")).assign
    assert assign.resume_from.checkpoint.seq == 3
    assert assign.move_reason == E.MOVE_REASON_MIGRATE
    t1 = await _task(stub, "t-1")
    assert (t1.owner_node_id, t1.attempt) == ("n-a", 1)


# ---------------------------------------------------------------- WatchEvents


def _watch(stub: Any, timeout_s: float = WAIT_S, **fields: Any) -> Any:
    return stub.WatchEvents(coordinator_pb2.WatchEventsRequest(**fields), timeout=timeout_s)


async def _collect(
    call: Any, want: Callable[[list[records_pb2.Event]], bool], timeout_s: float = WAIT_S
) -> tuple[list[records_pb2.Event], list[coordinator_pb2.WatchEventsResponse]]:
    events: list[records_pb2.Event] = []
    responses: list[coordinator_pb2.WatchEventsResponse] = []
    async with asyncio.timeout(timeout_s):
        async for response in call:
            responses.append(response)
            events.extend(response.events)
            if want(events):
                return events, responses
    raise AssertionError(f"stream ended early: {[e.WhichOneof('body') for e in events]}")


def _kinds(events: list[records_pb2.Event], task_id: str = "") -> list[str]:
    out = []
    for event in events:
        which = event.WhichOneof("body")
        assert which is not None
        if not task_id or getattr(getattr(event, which), "task_id", "") == task_id:
            out.append(which)
    return out


LIFECYCLE = ["task_submitted", "task_assigned", "task_started", "task_completed"]


async def test_watch_on_a_follower_sees_a_task_lifecycle_filters_and_resumes(
    replicas: StartReplica,
    stubs: Callable[[str], Any],
    agents: Callable[[str, str], Awaitable[FakeAgent]],
) -> None:
    started = time.monotonic()
    leader, follower = await _pair(replicas)
    fstub = stubs(follower.address)
    lstub = stubs(leader.address)
    # Bad input first (on the follower: validated before proxying).
    for types, fragment in (([0], "types[0]"), ([31, 999], "types[1]")):
        err = await _error(_collect(_watch(fstub, types=types), lambda _: False))
        assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert fragment in (err.details() or "")

    everything = _watch(fstub, timeout_s=20, from_revision=1)
    only_task = _watch(fstub, timeout_s=20, task_id="w-1")
    only_types = _watch(
        fstub, timeout_s=20, types=[E.EVENT_TYPE_TASK_STARTED, E.EVENT_TYPE_TASK_COMPLETED]
    )
    only_node = _watch(fstub, timeout_s=20, node_id="n-w")
    progress = _watch(
        fstub, timeout_s=20, types=[E.EVENT_TYPE_TASK_FORKED], progress_interval_ms=50
    )
    await asyncio.sleep(0.3)  # the live-only watchers are registered
    agent = await agents(leader.address, "n-w")
    for task_id in ("w-1", "w-2"):
        await lstub.SubmitTask(_submit(task_id), timeout=WAIT_S)
        epoch = await agent.run(task_id)
        await agent.update(
            task_id,
            epoch,
            completed=agent_pb2.TaskUpdate.Completed(result=records_pb2.TaskResult(payload=b"ok")),
        )
        agent.running.pop(task_id)

    def done(events: list[records_pb2.Event]) -> bool:
        return _kinds(events, "w-2")[-1:] == ["task_completed"]

    events, responses = await _collect(everything, done)
    # from_revision=1 predates this leader's log: the stream starts at its oldest
    # event (its LeaderElected) and says so in the initial metadata.
    metadata = dict(await everything.initial_metadata())
    assert metadata.get("lazarus-watch-gap") == "1"
    first = events[0]
    assert first.WhichOneof("body") == "leader_elected"
    assert first.leader_elected.leader_address == leader.address
    assert first.revision == int(metadata["lazarus-watch-oldest-revision"])
    assert first.revision >> COUNTER_BITS == first.term == leader.runtime.leadership.term  # type: ignore[union-attr]
    revisions = [e.revision for e in events]
    assert revisions == sorted(set(revisions))  # strictly increasing
    assert all(r.revision >= r.events[-1].revision for r in responses if r.events)
    assert _kinds(events, "w-1") == LIFECYCLE
    assert _kinds(events, "w-2") == LIFECYCLE
    everything.cancel()

    task_events, _ = await _collect(only_task, lambda ev: _kinds(ev)[-1:] == ["task_completed"])
    assert _kinds(task_events) == LIFECYCLE  # only w-1's
    typed, _ = await _collect(only_types, lambda ev: len(ev) == 4)
    assert [event_type(e) for e in typed] == [32, 35, 32, 35]
    node_events, _ = await _collect(
        only_node, lambda ev: _kinds(ev, "w-2")[-1:] == ["task_completed"]
    )
    assert {e.WhichOneof("body") for e in node_events} >= {"node_joined", "task_assigned"}
    assert "task_submitted" not in _kinds(node_events)  # it names no node
    for call in (only_task, only_types, only_node):
        call.cancel()

    # Progress notifications: no event matches, yet the cursor advances.
    seen = []
    async with asyncio.timeout(WAIT_S):
        async for response in progress:
            assert not response.events
            seen.append(response.revision)
            if response.revision >= revisions[-1]:
                break
    progress.cancel()
    assert seen == sorted(seen)
    assert seen[-1] >= revisions[-1]

    # Resume from a revision: exactly the events from it onwards, on either replica.
    middle = next(e for e in events if e.WhichOneof("body") == "task_started")
    for stub in (fstub, lstub):
        resumed = _watch(stub, from_revision=middle.revision + 1)
        again, _ = await _collect(resumed, lambda ev: ev[-1:] and ev[-1].revision >= revisions[-1])  # type: ignore[arg-type,return-value]
        resumed.cancel()
        assert [e.revision for e in again] == [r for r in revisions if r > middle.revision]
        assert not dict(await resumed.initial_metadata()).get("lazarus-watch-gap")
    assert time.monotonic() - started < 40


async def test_watch_ends_unavailable_when_the_leader_changes(
    replicas: StartReplica, stubs: Callable[[str], Any]
) -> None:
    leader, follower = await _pair(replicas)
    direct = _watch(stubs(leader.address), timeout_s=20, from_revision=1)
    proxied = _watch(stubs(follower.address), timeout_s=20, from_revision=1)
    for call in (direct, proxied):
        events, _ = await _collect(call, lambda ev: len(ev) >= 1)
        assert events[0].WhichOneof("body") == "leader_elected"
    last_seen = events[-1].revision
    assert leader.runtime is not None
    assert leader.runtime.leadership is not None
    old_term = leader.runtime.leadership.term
    # The old leader's tail: events its watchers never got, archived in Redis.
    log = leader.runtime.event_log
    tail = [
        log.append(records_pb2.Event(task_submitted=records_pb2.TaskSubmitted(task_id=f"t{i}")))
        for i in range(3)
    ]
    tail_revisions = [e.revision for e in tail]
    following = [e.revision for e in log.events if e.revision > last_seen]
    await asyncio.sleep(0.5)  # the archive writer ships within a round trip
    await leader.stop()  # resigns: the follower takes over
    for call in (direct, proxied):
        err = await _error(_collect(call, lambda _: False, timeout_s=10))
        assert err.code() is grpc.StatusCode.UNAVAILABLE, err
    new_leader = await _leading(follower)
    # Reconnect with the last revision + 1 on the new leader: the old term's
    # events after it come from the archive, then the new leader's own log.
    again = _watch(stubs(new_leader.address), from_revision=last_seen + 1)
    events, _ = await _collect(
        again, lambda ev: any(e.WhichOneof("body") == "leader_elected" for e in ev)
    )
    again.cancel()
    assert not dict(await again.initial_metadata()).get("lazarus-watch-gap")
    replayed = [e.revision for e in events if e.term == old_term]
    assert replayed == following  # every old-term event after last_seen, in order
    assert replayed[-3:] == tail_revisions
    elected = events[len(replayed)]
    assert elected.WhichOneof("body") == "leader_elected"
    assert elected.revision > last_seen
    assert elected.leader_elected.previous_term == old_term
    assert elected.term > old_term == last_seen >> COUNTER_BITS


async def test_a_slow_watcher_is_ended_with_resource_exhausted(
    replicas: StartReplica, stubs: Callable[[str], Any]
) -> None:
    leader = await _leading(await replicas("c1"))
    assert leader.runtime is not None
    log = leader.runtime.event_log
    log.queue_limit = 20
    call = _watch(stubs(leader.address), timeout_s=20)
    await asyncio.sleep(0.3)
    assert log.watchers == 1
    before = time.monotonic()
    for _ in range(200):  # appended in one go: the watcher cannot keep up
        log.append(records_pb2.Event(task_submitted=records_pb2.TaskSubmitted(task_id="x")))
    assert time.monotonic() - before < 0.5  # the leader never waited for it
    assert log.watchers == 0
    err = await _error(_collect(call, lambda _: False, timeout_s=10))
    assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "resume from revision" in (err.details() or "")
    # Other watchers and the leader carry on.
    fresh = _watch(stubs(leader.address), from_revision=log.last_revision)
    events, _ = await _collect(fresh, lambda ev: len(ev) >= 1)
    fresh.cancel()
    assert events[0].revision == log.last_revision


# ---------------------------------------------------------------- GetCheckpoint


async def test_get_checkpoint_reads_the_newest_replicated_checkpoint(
    replicas: StartReplica, stubs: Callable[[str], Any], redis_server: Any
) -> None:
    leader, follower = await _pair(replicas)
    task_id = f"ck-{uuid.uuid4().hex[:8]}"
    client = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        replica = RedisCheckpointReplica(client)
        events = tuple(
            records_pb2.JournalEventRecord(
                task_id=task_id, epoch=1, seq=s, payload=f"e{s}".encode()
            )
            for s in range(1, 8)
        )
        ckpt = records_pb2.CheckpointRecord(
            task_id=task_id,
            epoch=1,
            seq=4,
            covers_journal_seq=3,
            checkpoint_ref=f"{task_id}@4",
            payload=b'{"step": 4}',
            content_type="application/json",
        )
        await replica.write(ReplicationItem(task_id, 1, "n-1", events=events, checkpoint=ckpt))
    finally:
        await client.aclose()
    for server in (leader, follower):  # any replica reads Redis itself
        stub = stubs(server.address)
        got = await stub.GetCheckpoint(
            coordinator_pb2.GetCheckpointRequest(task_id=task_id, include_journal=True),
            timeout=WAIT_S,
        )
        assert got.location == E.CHECKPOINT_LOCATION_REDIS
        assert (got.checkpoint.seq, got.checkpoint.payload) == (4, b'{"step": 4}')
        assert [e.seq for e in got.journal_events] == [4, 5, 6, 7]
        assert not got.journal_truncated
        slim = await stub.GetCheckpoint(
            coordinator_pb2.GetCheckpointRequest(
                task_id=task_id,
                seq=4,
                omit_payload=True,
                include_journal=True,
                max_journal_events=2,
            )
        )
        assert slim.checkpoint.payload == b""
        assert slim.checkpoint.checkpoint_ref == f"{task_id}@4"
        assert [e.seq for e in slim.journal_events] == [4, 5]
        assert slim.journal_truncated
        by_ref = await stub.GetCheckpoint(
            coordinator_pb2.GetCheckpointRequest(task_id=task_id, checkpoint_ref=f"{task_id}@4")
        )
        assert by_ref.checkpoint.seq == 4
        assert not by_ref.journal_events
        by_journal = await stub.GetCheckpoint(
            coordinator_pb2.GetCheckpointRequest(task_id=task_id, at_or_before_journal_seq=3)
        )
        assert by_journal.checkpoint.seq == 4
        for request in (
            coordinator_pb2.GetCheckpointRequest(task_id=task_id, seq=3),  # not the newest
            coordinator_pb2.GetCheckpointRequest(task_id=task_id, checkpoint_ref=f"{task_id}@2"),
            coordinator_pb2.GetCheckpointRequest(task_id=task_id, at_or_before_journal_seq=2),
            coordinator_pb2.GetCheckpointRequest(task_id="never-ran"),
        ):
            err = await _error(stub.GetCheckpoint(request, timeout=WAIT_S))
            assert err.code() is grpc.StatusCode.NOT_FOUND, request
    # A record failing its checksum, and one that does not parse: DATA_LOSS.
    client = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        replica = RedisCheckpointReplica(client)
        bad_sum, garbled = f"{task_id}-sum", f"{task_id}-garbled"
        tampered = records_pb2.CheckpointRecord(
            task_id=bad_sum,
            epoch=1,
            seq=1,
            checkpoint_ref=f"{bad_sum}@1",
            payload=b"{}",
            checksum_algorithm=records_pb2.CHECKSUM_ALGORITHM_CRC32,
            checksum=b"\x00\x00\x00\x00",
        )
        await replica.write(ReplicationItem(bad_sum, 1, "n-1", checkpoint=tampered))
        await replica.write(
            ReplicationItem(
                garbled,
                1,
                "n-1",
                checkpoint=records_pb2.CheckpointRecord(task_id=garbled, epoch=1, seq=1),
            )
        )
        await client.set(replica.keys(garbled)[1], b"\xff\xfe not a protobuf")
    finally:
        await client.aclose()
    for broken in (bad_sum, garbled):
        err = await _error(
            stubs(leader.address).GetCheckpoint(
                coordinator_pb2.GetCheckpointRequest(task_id=broken), timeout=WAIT_S
            )
        )
        assert err.code() is grpc.StatusCode.DATA_LOSS, broken
    # A replica whose Redis is unreachable answers UNAVAILABLE.
    (dead_port,) = free_loopback_ports(1)
    lonely = await replicas("c3", redis_url=f"redis://127.0.0.1:{dead_port}/0")
    err = await _error(
        stubs(lonely.address).GetCheckpoint(
            coordinator_pb2.GetCheckpointRequest(task_id=task_id), timeout=WAIT_S
        )
    )
    assert err.code() is grpc.StatusCode.UNAVAILABLE


# ---------------------------------------------------------------- real processes


SLEEP = {"seconds": 6, "checkpoints": 12}


@pytest.fixture
async def make_cluster(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[LocalCluster]]]:
    clusters: list[LocalCluster] = []

    async def make(**kwargs: Any) -> LocalCluster:
        cluster = LocalCluster(
            tmp_path / f"run{len(clusters)}",
            cluster=f"rpc-{uuid.uuid4().hex[:8]}",
            etcd_members=1,
            **kwargs,
        )
        clusters.append(cluster)
        cluster.start_stores()
        cluster.coordinator_args += ["--redis-url", cluster.redis_url]
        cluster.start()
        await cluster.ready(30)
        return cluster

    yield make
    for cluster in clusters:
        await asyncio.to_thread(cluster.stop)


async def _watch_cluster(cluster: LocalCluster, index: int, **fields: Any) -> Any:
    channel = cluster.channel(index)
    stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)  # type: ignore[no-untyped-call]
    return channel, stub.WatchEvents(coordinator_pb2.WatchEventsRequest(**fields), timeout=60)


async def _follower_index(cluster: LocalCluster, timeout_s: float = 15) -> int:
    """A follower replica that answers directly (``cluster.call`` hides one that does not)."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = await cluster.call("GetClusterStatus", coordinator_pb2.GetClusterStatusRequest())
        index = next(
            i for i, a in enumerate(cluster.coordinator_addresses) if a != status.leader_address
        )
        async with cluster.channel(index) as channel:
            stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)  # type: ignore[no-untyped-call]
            try:
                await stub.GetClusterStatus(coordinator_pb2.GetClusterStatusRequest(), timeout=2)
                return index
            except grpc.aio.AioRpcError:
                assert time.monotonic() < deadline, cluster.coordinators[index].log_tail(20)
                await asyncio.sleep(0.3)


async def _running_with_checkpoint(
    cluster: LocalCluster, task_ids: set[str], timeout_s: float = 20
) -> dict[str, records_pb2.TaskRecord]:
    deadline = time.monotonic() + timeout_s
    while True:
        tasks = {t.task_id: t for t in await cluster.list_tasks() if t.task_id in task_ids}
        if len(tasks) == len(task_ids) and all(
            t.state == E.TASK_STATE_RUNNING and t.last_replicated_checkpoint.seq >= 1
            for t in tasks.values()
        ):
            return tasks
        assert time.monotonic() < deadline, f"tasks not RUNNING with a checkpoint: {tasks}"
        await asyncio.sleep(0.2)


def _check_resumes(
    events: list[records_pb2.Event], task_ids: set[str], reason: int
) -> dict[str, tuple[str, str, int]]:
    """Each task's TaskReassigned and the following TaskResumed agree: no work redone."""
    moves: dict[str, tuple[str, str, int]] = {}
    for task_id in sorted(task_ids):
        mine = [
            e
            for e in events
            if getattr(getattr(e, e.WhichOneof("body") or ""), "task_id", "") == task_id
        ]
        reassigned = [e.task_reassigned for e in mine if e.WhichOneof("body") == "task_reassigned"]
        resumed = [e.task_resumed for e in mine if e.WhichOneof("body") == "task_resumed"]
        assert len(reassigned) == 1, (task_id, _kinds(mine))
        assert len(resumed) == 1, (task_id, _kinds(mine))
        move, start = reassigned[0], resumed[0]
        assert move.reason == reason
        assert move.resume_seq >= 1
        assert start.node_id == move.to_node_id
        assert start.epoch == move.epoch
        assert start.resumed_from_seq == move.resume_seq, (task_id, move, start)
        assert start.redone_checkpoints == 0
        moves[task_id] = (move.from_node_id, move.to_node_id, move.resume_seq)
    return moves


async def _wait_done(
    cluster: LocalCluster, task_ids: set[str], timeout_s: float = 40
) -> dict[str, records_pb2.TaskRecord]:
    deadline = time.monotonic() + timeout_s
    while True:
        tasks = {t.task_id: t for t in await cluster.list_tasks() if t.task_id in task_ids}
        if all(t.state == E.TASK_STATE_COMPLETED for t in tasks.values()) and len(tasks) == len(
            task_ids
        ):
            return tasks
        assert time.monotonic() < deadline, f"not completed: {tasks}"
        await asyncio.sleep(0.3)


async def test_drain_moves_every_task_and_resumes_it_with_no_work_redone(
    make_cluster: Callable[..., Awaitable[LocalCluster]],
) -> None:
    started = time.monotonic()
    cluster = await make_cluster(coordinators=2, agents=3)
    follower = await _follower_index(cluster)
    channel, watch = await _watch_cluster(cluster, follower)
    task_ids: set[str] = set()
    try:
        for i in range(6):
            record = await cluster.submit(f"drain-{i}", "sleep", json.dumps(SLEEP).encode())
            task_ids.add(record.task_id)
        tasks = await _running_with_checkpoint(cluster, task_ids)
        counts: dict[str, int] = {}
        for t in tasks.values():
            counts[t.owner_node_id] = counts.get(t.owner_node_id, 0) + 1
        victim = max(sorted(counts), key=lambda n: counts[n])
        on_victim = {t.task_id for t in tasks.values() if t.owner_node_id == victim}
        drain = await cluster.call(
            "DrainNode", coordinator_pb2.DrainNodeRequest(node_id=victim, reason="test")
        )
        assert drain.tasks_to_move == len(on_victim)

        def moved(events: list[records_pb2.Event]) -> bool:
            resumed = {
                e.task_resumed.task_id for e in events if e.WhichOneof("body") == "task_resumed"
            }
            return on_victim <= resumed

        events, _ = await _collect(watch, moved, timeout_s=30)
        moves = _check_resumes(events, on_victim, E.MOVE_REASON_DRAIN)
        assert all(src == victim and dst != victim for src, dst, _ in moves.values())
        done = await _wait_done(cluster, task_ids)
        for task_id in on_victim:
            result = json.loads(done[task_id].result.payload)
            # The sleep task checkpoints {"step": k} as checkpoint seq k: it went on
            # exactly where the released checkpoint left it.
            assert result["resumed_at_step"] == moves[task_id][2], (task_id, result)
        nodes = {n.node_id: n for n in await cluster.list_nodes()}
        assert nodes[victim].state == E.NODE_STATE_DRAINING
        assert not any(t.owner_node_id == victim for t in await cluster.list_tasks())
        # The new owners' logs show the resume at the released seq.
        logs = "\n".join(a.log_path.read_text(errors="replace") for a in cluster.agents)
        for task_id in on_victim:
            assert f"task {task_id} resumed at epoch" in logs
    finally:
        watch.cancel()
        await channel.close()
    assert time.monotonic() - started < 120


async def test_migrate_resumes_the_task_on_the_target_at_the_same_checkpoint_seq(
    make_cluster: Callable[..., Awaitable[LocalCluster]],
) -> None:
    started = time.monotonic()
    cluster = await make_cluster(coordinators=2, agents=3)
    follower = await _follower_index(cluster)
    record = await cluster.submit("mig-0", "sleep", json.dumps(SLEEP).encode())
    task_id = record.task_id
    channel, watch = await _watch_cluster(cluster, follower, task_id=task_id)
    try:
        task = (await _running_with_checkpoint(cluster, {task_id}))[task_id]
        target = sorted(a.name for a in cluster.agents if a.name != task.owner_node_id)[-1]
        reply = await cluster.call(
            "MigrateTask",
            coordinator_pb2.MigrateTaskRequest(
                task_id=task_id, target_node_id=target, expected_epoch=task.epoch
            ),
        )
        assert reply.task.move.target_node_id == target

        def resumed(events: list[records_pb2.Event]) -> bool:
            return "task_resumed" in _kinds(events)

        events, _ = await _collect(watch, resumed, timeout_s=30)
        moves = _check_resumes(events, {task_id}, E.MOVE_REASON_MIGRATE)
        source, destination, seq = moves[task_id]
        assert (source, destination) == (task.owner_node_id, target)
        # Redis holds the released checkpoint: the one the target restored.
        ckpt = await cluster.call(
            "GetCheckpoint",
            coordinator_pb2.GetCheckpointRequest(task_id=task_id, omit_payload=True),
        )
        assert ckpt.checkpoint.seq >= seq
        done = await _wait_done(cluster, {task_id})
        assert done[task_id].owner_node_id == ""
        assert json.loads(done[task_id].result.payload)["resumed_at_step"] == seq
        final = await cluster.call("GetTask", coordinator_pb2.GetTaskRequest(task_id=task_id))
        assert final.task.previous_owner_node_ids[-1] == target
    finally:
        watch.cancel()
        await channel.close()
    assert time.monotonic() - started < 90
