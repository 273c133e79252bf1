"""``lazarus.client`` against a real cluster: every CoordinatorService RPC, on the
leader and through a follower, with the happy path and bad input for each field.

One ``LocalCluster`` serves the whole module (etcd, Redis, 3 coordinators, 3
node agents running ``node_agent/demo_app.py``; ``agent-2`` is stopped with
SIGTERM at the start so a LEFT node exists). Also here: pagination, WatchEvents
resume (after closing a stream, and across a follower SIGKILLed under it), the
retry across addresses when the first one is dead, the SyncClient, a CLI run,
and a generic gRPC client (``grpc_requests`` via server reflection, no stubs of
ours) plus ``grpc.health.v1`` on every replica.

Known contract problems are ``xfail(strict=True)`` with the reason: they flip to
failures once fixed, so the marker gets removed.

Every wait is bounded; the cluster stops at teardown.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import select
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from typer.testing import CliRunner

import lazarus
from lazarus import cli
from lazarus.client import (
    Aborted,
    AlreadyExists,
    Client,
    FailedPrecondition,
    InvalidArgument,
    LazarusError,
    NotFound,
    SyncClient,
    Unavailable,
)
from lazarus.v1 import coordinator_pb2, records_pb2
from lazarus_dev.devcluster import LAZARUS_BIN, LocalCluster
from lazarus_dev.localservers import free_loopback_ports

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

R = records_pb2
WAIT_S = 15.0
LONG = "x" * 129  # over the 128-byte id limit
SLEEP_LONG = {"seconds": 30, "checkpoints": 60}
_T = TypeVar("_T")


@dataclass
class Roles:
    cluster: LocalCluster
    leader: str
    followers: list[str]
    dead: str  # a loopback address nobody listens on

    @property
    def all(self) -> list[str]:
        return [self.leader, *self.followers]


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def roles(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Roles]:
    cluster = LocalCluster(
        tmp_path_factory.mktemp("client"),
        coordinators=3,
        agents=3,
        cluster=f"client-{uuid.uuid4().hex[:8]}",
        etcd_members=1,
    )
    try:
        cluster.start_stores()
        cluster.coordinator_args += ["--redis-url", cluster.redis_url]
        cluster.start()
        asyncio.run(cluster.ready(40))
        cluster.agents[2].terminate(10)  # Goodbye: agent-2 is LEFT

        async def leader() -> str:
            async with Client(
                cluster.coordinator_addresses, retry_max_s=10, tls=cluster.client_tls
            ) as client:
                deadline = time.monotonic() + WAIT_S
                while True:
                    status = await client.status()
                    nodes = {n.record.node_id: n.record.state for n in await client.nodes()}
                    if status.leader_address and nodes.get("agent-2") == R.NODE_STATE_LEFT:
                        return status.leader_address
                    assert time.monotonic() < deadline, (status, nodes)
                    await asyncio.sleep(0.1)

        address = asyncio.run(leader())
        (port,) = free_loopback_ports(1)
        yield Roles(
            cluster,
            address,
            [a for a in cluster.coordinator_addresses if a != address],
            f"127.0.0.1:{port}",
        )
    finally:
        cluster.stop()


@pytest.fixture
async def connect(roles: Roles) -> AsyncIterator[Callable[..., Client]]:
    """``connect(addresses, **options)`` -> a Client closed at teardown."""
    clients: list[Client] = []

    def make(addresses: list[str] | str, **options: Any) -> Client:
        options.setdefault("retry_max_s", 5.0)
        options.setdefault("tls", roles.cluster.client_tls)  # mTLS, as the harness's admin
        client = Client(addresses, **options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


@pytest.fixture
def leader(roles: Roles, connect: Callable[..., Client]) -> Client:
    return connect([roles.leader])


@pytest.fixture
def follower(roles: Roles, connect: Callable[..., Client]) -> Client:
    return connect([roles.followers[0]])


async def eventually(probe: Callable[[], Awaitable[_T | None]], what: str) -> _T:
    """Poll ``probe`` until it returns something truthy (bounded by WAIT_S)."""
    deadline = time.monotonic() + WAIT_S
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = await probe()
        except NotFound as exc:  # a follower's cache lags the leader by a few ms
            last = exc
        if last:
            return last  # type: ignore[no-any-return]
        await asyncio.sleep(0.1)
    raise AssertionError(f"not {what} within {WAIT_S} s: last {last!r}")


async def refused(call: Awaitable[Any], error: type[LazarusError], field: str) -> LazarusError:
    """Await ``call``; it must raise ``error`` whose message names ``field``."""
    with pytest.raises(error) as caught:
        await call
    exc = caught.value
    assert exc.field == field or exc.message.startswith(field), (field, exc.message)
    return exc


async def running(client: Client, task_id: str) -> records_pb2.TaskRecord:
    async def probe() -> records_pb2.TaskRecord | None:
        task = (await client.get(task_id)).task
        ok = task.state == R.TASK_STATE_RUNNING and task.last_replicated_checkpoint.seq >= 1
        return task if ok else None

    return await eventually(probe, f"{task_id} RUNNING with a replicated checkpoint")


async def finished(client: Client, task_id: str) -> records_pb2.TaskRecord:
    async def probe() -> records_pb2.TaskRecord | None:
        task = (await client.get(task_id)).task
        return task if task.state == R.TASK_STATE_COMPLETED else None

    return await eventually(probe, f"{task_id} COMPLETED")


# ---------------------------------------------------------------- GetClusterStatus


async def test_status_from_every_replica_names_the_same_leader(
    roles: Roles, connect: Callable[..., Client]
) -> None:
    seen = set()
    for address in roles.all:
        status = await connect([address]).status()
        assert status.cluster_name == roles.cluster.cluster
        assert status.leader_address == roles.leader
        assert status.term > 0
        assert status.now_unix_ms > 0
        seen.add(status.serving_member_id)
        counts = {c.state: c.count for c in status.nodes_by_state}
        assert counts.get(R.NODE_STATE_LEFT) == 1, status
    assert len(seen) == 3


async def test_status_names_the_leader_on_followers(follower: Client, leader: Client) -> None:
    status = await follower.status()
    assert status.leader_id
    assert status.leader_id == (await leader.status()).serving_member_id


async def test_status_lists_every_member_leader_first(
    roles: Roles, connect: Callable[..., Client]
) -> None:
    """Every replica's MemberRecord (coordinator.members), the same from every replica."""
    views = []
    for address in roles.all:
        client = connect([address])
        status = await eventually(
            functools.partial(_with_members, client, 3), f"3 members via {address}"
        )
        members = list(status.members)
        assert [m.role for m in members] == [R.MEMBER_ROLE_LEADER] + [R.MEMBER_ROLE_FOLLOWER] * 2
        assert members[0].address == roles.leader
        assert members[0].member_id == status.leader_id
        assert members[0].candidacy_revision == status.term
        assert members[1].candidacy_revision < members[2].candidacy_revision  # campaign order
        assert sorted(m.address for m in members) == sorted(roles.all)
        assert status.serving_member_id in {m.member_id for m in members}
        for m in members:
            assert m.lease_id != 0
            assert m.version == lazarus.__version__
            assert 0 < m.started_at_unix_ms <= status.now_unix_ms
        views.append([(m.member_id, m.address, m.role) for m in members])
    assert views[0] == views[1] == views[2]


async def _with_members(
    client: Client, count: int
) -> coordinator_pb2.GetClusterStatusResponse | None:
    status = await client.status()
    return status if len(status.members) == count else None


# ---------------------------------------------------------------- SubmitTask / GetTask


async def test_submit_through_a_follower_is_idempotent_on_request_id(
    leader: Client, follower: Client
) -> None:
    rid = f"req-{uuid.uuid4().hex}"
    first = await follower.submit("sleep", {"seconds": 0.2}, request_id=rid, labels={"t": "s"})
    assert first.created
    task = first.task
    assert task.task_id.startswith("task-")
    assert task.spec.kind == "sleep"
    assert task.spec.content_type == "application/json"
    assert json.loads(task.spec.payload) == {"seconds": 0.2}
    assert task.request_id == rid
    again = await leader.submit("sleep", {"seconds": 0.2}, request_id=rid, labels={"t": "s"})
    assert not again.created
    assert again.task.task_id == task.task_id
    await refused(
        follower.submit("sleep", {"seconds": 9}, request_id=rid), AlreadyExists, "request_id"
    )
    mine = f"mine-{uuid.uuid4().hex[:8]}"
    assert (await follower.submit("sleep", {"seconds": 0.1}, task_id=mine)).task.task_id == mine
    await refused(
        follower.submit("sleep", {"seconds": 0.1}, task_id=mine), AlreadyExists, "task_id"
    )
    # Read back on the leader and (once its cache caught up) on the follower.
    got = await leader.get(task.task_id)
    assert got.task.task_id == task.task_id
    assert got.read_revision > 0
    assert len(got.forks) == 0
    via_follower = await eventually(lambda: follower.get(task.task_id), "on the follower")
    assert via_follower.task.request_id == rid
    done = await finished(follower, task.task_id)
    assert json.loads(done.result.payload)["steps"] == 1


@pytest.mark.parametrize("where", ["leader", "follower"])
async def test_submit_refuses_bad_fields_naming_them(
    where: str, leader: Client, follower: Client
) -> None:
    client = leader if where == "leader" else follower
    past = int(time.time() * 1000) - 60_000
    cases: list[tuple[dict[str, Any], str]] = [
        ({"request_id": ""}, "request_id"),
        ({"request_id": LONG}, "request_id"),
        ({"kind": ""}, "spec.kind"),
        ({"kind": LONG}, "spec.kind"),
        ({"deadline_unix_ms": past}, "spec.deadline_unix_ms"),
    ]
    for overrides, field in cases:
        args: dict[str, Any] = {"kind": "sleep", "payload": {"seconds": 0.1}, **overrides}
        await refused(client.submit(**args), InvalidArgument, field)


async def test_submit_refuses_a_malformed_task_id(follower: Client) -> None:
    await refused(follower.submit("sleep", {}, task_id="bad\nid"), InvalidArgument, "task_id")
    await refused(follower.submit("sleep", {}, task_id="t" * 300), InvalidArgument, "task_id")


async def test_submit_refuses_unknown_enum_numbers(follower: Client) -> None:
    await refused(follower.submit("sleep", {}, durability=99), InvalidArgument, "spec.durability")
    await refused(follower.submit("sleep", {}, state_model=77), InvalidArgument, "spec.state_model")


async def test_the_client_refuses_an_oversized_payload_before_sending_it(
    connect: Callable[..., Client], roles: Roles
) -> None:
    # The server refuses over 256 KiB (see the next test); the client over its own limit.
    client = connect([roles.dead], retry_max_s=0)  # nothing is sent, so no address is needed
    exc = await refused(
        client.submit("sleep", b"x" * ((1 << 20) + 1)), InvalidArgument, "spec.payload"
    )
    assert exc.address == ""


@pytest.mark.parametrize("where", ["leader", "follower"])
async def test_get_task_refuses_an_empty_id_and_an_unknown_one(
    where: str, leader: Client, follower: Client
) -> None:
    client = leader if where == "leader" else follower
    await refused(client.get(""), InvalidArgument, "task_id")
    exc = await refused(client.get("no-such-task"), NotFound, "task_id")
    assert "no-such-task" in exc.message


# ---------------------------------------------------------------- ListTasks / ListNodes


async def test_list_tasks_pages_through_every_match_with_filters(
    leader: Client, follower: Client
) -> None:
    run = uuid.uuid4().hex[:8]
    ids = set()
    for i in range(7):
        reply = await leader.submit(
            "sleep", {"seconds": 0.1}, task_id=f"page-{run}-{i}", labels={"run": run}
        )
        ids.add(reply.task.task_id)
    request = coordinator_pb2.ListTasksRequest(labels={"run": run}, page_size=3)

    async def pages() -> list[int] | None:
        sizes = [len(p.tasks) async for p in follower.task_pages(request)]
        return sizes if sum(sizes) == 7 else None

    assert await eventually(pages, "7 tasks on the follower") == [3, 3, 1]
    listed = [t.task_id for t in await leader.tasks(labels={"run": run}, page_size=2)]
    assert listed == sorted(ids)
    assert len(await follower.tasks(labels={"run": run}, page_size=2, limit=5)) == 5
    assert await leader.tasks(labels={"run": run}, kind="textstats") == []

    async def all_done() -> list[records_pb2.TaskRecord] | None:
        done = await leader.tasks(labels={"run": run}, states=["completed"])
        return done if len(done) == 7 else None

    await eventually(all_done, "7 tasks COMPLETED")
    for owned in await leader.tasks(node_id="agent-0"):
        assert owned.owner_node_id == "agent-0"
    assert (
        await follower.tasks(labels={"run": run}, states=["failed", R.TASK_STATE_CANCELLED]) == []
    )


@pytest.mark.parametrize("where", ["leader", "follower"])
async def test_list_tasks_and_nodes_refuse_bad_filters_and_page_tokens(
    where: str, leader: Client, follower: Client
) -> None:
    client = leader if where == "leader" else follower
    await refused(client.tasks(states=[0]), InvalidArgument, "states[0]")
    await refused(client.tasks(states=["running", 99]), InvalidArgument, "states[1]")
    await refused(client.nodes(states=[0]), InvalidArgument, "states[0]")
    await refused(client.nodes(states=[42]), InvalidArgument, "states[0]")
    calls: list[tuple[str, Any, Any]] = [
        ("ListTasks", coordinator_pb2.ListTasksRequest, coordinator_pb2.ListTasksResponse),
        ("ListNodes", coordinator_pb2.ListNodesRequest, coordinator_pb2.ListNodesResponse),
    ]
    for method, request_type, response_type in calls:
        bad = request_type(page_token="not-a-token")
        await refused(client._unary(method, bad, response_type), InvalidArgument, "page_token")
        first = await client._unary(method, request_type(page_size=1), response_type)
        assert first.next_page_token, method
        other = request_type(page_size=1, page_token=first.next_page_token)
        other.labels["x"] = "y"  # a token issued for different filters
        await refused(client._unary(method, other, response_type), InvalidArgument, "page_token")


async def test_list_nodes_liveness_on_the_leader_only_and_pagination(
    leader: Client, follower: Client
) -> None:
    from_leader = await leader.nodes(page_size=1)
    assert [n.record.node_id for n in from_leader] == ["agent-0", "agent-1", "agent-2"]
    live = {n.record.node_id: n for n in from_leader}
    assert live["agent-0"].HasField("liveness")
    assert live["agent-0"].record.capacity.slots >= 1
    assert live["agent-2"].record.state == R.NODE_STATE_LEFT
    from_follower = await follower.nodes()
    assert len(from_follower) == 3
    assert not any(n.HasField("liveness") for n in from_follower)
    left = await follower.nodes(states=["left"])
    assert [n.record.node_id for n in left] == ["agent-2"]
    assert await leader.nodes(labels={"no": "such-label"}) == []


# ---------------------------------------------------------------- CancelTask


@pytest.mark.parametrize("where", ["leader", "follower"])
async def test_cancel_task_then_its_errors(where: str, leader: Client, follower: Client) -> None:
    client = leader if where == "leader" else follower
    task = (await leader.submit("sleep", SLEEP_LONG)).task
    cancelled = await client.cancel(task.task_id, "operator said so")
    assert cancelled.state == R.TASK_STATE_CANCELLED
    assert cancelled.cancel_reason == "operator said so"
    assert (await client.cancel(task.task_id)).state == R.TASK_STATE_CANCELLED  # idempotent
    await refused(client.cancel(""), InvalidArgument, "task_id")
    await refused(client.cancel(LONG), InvalidArgument, "task_id")
    await refused(client.cancel(task.task_id, "r" * 1025), InvalidArgument, "reason")
    await refused(client.cancel("no-such-task"), NotFound, "task_id")
    quick = (await leader.submit("sleep", {"seconds": 0.1})).task
    await finished(leader, quick.task_id)
    exc = await refused(client.cancel(quick.task_id), FailedPrecondition, "task")
    assert "COMPLETED" in exc.message


# ---------------------------------------------------------------- MigrateTask


async def test_migrate_moves_a_running_task_through_a_follower(
    leader: Client, follower: Client
) -> None:
    task = (await leader.submit("sleep", {"seconds": 6, "checkpoints": 30})).task
    before = await running(leader, task.task_id)
    target = "agent-1" if before.owner_node_id == "agent-0" else "agent-0"
    # Bad input first, while the task is RUNNING.
    await refused(follower.migrate(""), InvalidArgument, "task_id")
    await refused(follower.migrate(task.task_id, LONG), InvalidArgument, "target_node_id")
    await refused(
        follower.migrate(task.task_id, target, reason="r" * 1025), InvalidArgument, "reason"
    )
    await refused(
        follower.migrate(task.task_id, target, release_timeout_s=2 * 86400),
        InvalidArgument,
        "release_timeout_ms",
    )
    await refused(follower.migrate("no-such-task", target), NotFound, "task_id")
    await refused(follower.migrate(task.task_id, "no-such-node"), NotFound, "target_node_id")
    await refused(
        follower.migrate(task.task_id, before.owner_node_id), FailedPrecondition, "target_node_id"
    )
    await refused(follower.migrate(task.task_id, "agent-2"), FailedPrecondition, "target_node_id")
    # coordinator.proto says FAILED_PRECONDITION for a stale expected_epoch; the
    # coordinator answers ABORTED (see the report).
    await refused(
        follower.migrate(task.task_id, target, expected_epoch=before.epoch + 5),
        Aborted,
        "expected_epoch",
    )
    moved = await follower.migrate(
        task.task_id, target, expected_epoch=before.epoch, reason="client test"
    )
    assert moved.move_id
    assert moved.task.HasField("move")
    assert moved.task.move.target_node_id == target

    async def on_target() -> records_pb2.TaskRecord | None:
        now = (await leader.get(task.task_id)).task
        return now if now.owner_node_id == target and now.epoch == before.epoch + 1 else None

    after = await eventually(on_target, f"{task.task_id} on {target}")
    assert before.owner_node_id in after.previous_owner_node_ids
    quick = (await leader.submit("sleep", {"seconds": 0.1})).task
    await finished(leader, quick.task_id)
    await refused(follower.migrate(quick.task_id, target), FailedPrecondition, "task")
    await leader.cancel(task.task_id, "done with it")


# ---------------------------------------------------------------- GetCheckpoint


async def test_get_checkpoint_reads_the_newest_replicated_one(
    leader: Client, follower: Client
) -> None:
    task = (await leader.submit("sleep", SLEEP_LONG)).task
    record = await running(leader, task.task_id)
    try:
        got = await follower.checkpoint(task.task_id, include_journal=True)
        ckpt = got.checkpoint
        assert ckpt.task_id == task.task_id
        assert ckpt.seq >= record.last_replicated_checkpoint.seq
        assert ckpt.checkpoint_ref == f"{task.task_id}@{ckpt.seq}"
        assert json.loads(ckpt.payload) == {"step": ckpt.seq}
        assert got.location == R.CHECKPOINT_LOCATION_REDIS
        bare = await leader.checkpoint(task.task_id, omit_payload=True)
        assert bare.checkpoint.payload == b""
        newest = bare.checkpoint
        # A selector naming the newest one answers it (Redis keeps only the newest).
        for selector in ({"seq": newest.seq}, {"checkpoint_ref": newest.checkpoint_ref}):
            try:
                same = await follower.checkpoint(task.task_id, omit_payload=True, **selector)
            except NotFound:  # it checkpointed again in between: ask once more
                continue
            assert same.checkpoint.seq == newest.seq
        covered = newest.covers_journal_seq
        at = await follower.checkpoint(task.task_id, at_or_before_journal_seq=covered + 100)
        assert at.checkpoint.seq >= newest.seq
        # Bad input.
        await refused(follower.checkpoint(""), InvalidArgument, "task_id")
        await refused(follower.checkpoint(task.task_id, seq=0), InvalidArgument, "seq")
        await refused(
            follower.checkpoint(task.task_id, checkpoint_ref="garbage"),
            InvalidArgument,
            "checkpoint_ref",
        )
        await refused(
            follower.checkpoint(task.task_id, checkpoint_ref="other-task@1"),
            InvalidArgument,
            "checkpoint_ref",
        )
        await refused(
            follower.checkpoint(task.task_id, seq=1, checkpoint_ref="x@1"), InvalidArgument, "seq"
        )
        await refused(follower.checkpoint("no-such-task"), NotFound, "task_id")
        await refused(follower.checkpoint(task.task_id, seq=10_000), NotFound, "seq")
    finally:
        await leader.cancel(task.task_id)


# ---------------------------------------------------------------- ForkTask


async def test_fork_task_starts_a_new_task_from_a_checkpoint_with_edits(
    leader: Client, follower: Client
) -> None:
    # A finished source: its newest replicated checkpoint no longer moves.
    task = (await leader.submit("sleep", {"seconds": 0.4, "checkpoints": 2})).task
    task = await finished(follower, task.task_id)
    got = await follower.checkpoint(task.task_id)
    # Since [task-path] a finished task's newest checkpoint is its result,
    # committed before it was reported (so a handler that returned never runs
    # again at that epoch): a fork of it starts from the result plus the edits.
    assert got.checkpoint.label == "lazarus:result"
    ref = got.checkpoint.checkpoint_ref
    state = json.loads(got.checkpoint.payload)
    rid = f"fork-{uuid.uuid4().hex[:8]}"
    spec = R.TaskSpec(
        kind="sleep",
        payload=json.dumps({"seconds": 0.3, "checkpoints": 1}).encode(),
        content_type="application/json",
    )
    forked = await leader.fork(ref, edits={"note": "forked"}, request_id=rid, spec=spec)
    assert forked.created
    assert forked.task.forked_from_ref == ref
    assert forked.checkpoint.seq == 1
    again = await follower.fork(ref, edits={"note": "forked"}, request_id=rid, spec=spec)
    assert not again.created
    assert again.task_id == forked.task_id
    seeded = await leader.checkpoint(forked.task_id)
    assert seeded.checkpoint.parent_ref == ref
    assert json.loads(seeded.checkpoint.payload) == {**state, "note": "forked"}
    done = await finished(follower, forked.task_id)
    # It resumed from the seeded checkpoint: the sleep handler reports where.
    assert json.loads(done.result.payload)["resumed_at_step"] == state.get("step", 0)
    await refused(leader.fork("no-at-sign"), InvalidArgument, "from_checkpoint_ref")
    await refused(leader.fork(f"{task.task_id}@99999"), NotFound, "from_checkpoint_ref")
    await refused(
        leader.fork(ref, edits=[("", 1)], request_id=rid + "x"), InvalidArgument, "edits[0].key"
    )
    await refused(
        leader.fork(ref, edits=[("k", b"{not json")], request_id=rid + "y"),
        InvalidArgument,
        "edits[0].value_json",
    )
    await refused(
        leader.fork(ref, request_id=rid, new_task_id="other-id", spec=spec),
        AlreadyExists,
        "request_id",
    )


# ---------------------------------------------------------------- DrainNode / UncordonNode


async def test_drain_then_uncordon_through_a_follower_and_their_errors(
    leader: Client, follower: Client
) -> None:
    drained = await follower.drain("agent-1", "client test", release_timeout_s=5)
    assert drained.node.node_id == "agent-1"
    assert drained.node.cordoned
    assert drained.node.drain_reason == "client test"
    assert drained.drain_id
    again = await follower.drain("agent-1", "client test")
    assert again.drain_id == drained.drain_id  # idempotent while it runs
    try:
        nodes = {n.record.node_id: n.record for n in await leader.nodes()}
        assert nodes["agent-1"].state == R.NODE_STATE_DRAINING
        await refused(follower.drain(""), InvalidArgument, "node_id")
        await refused(follower.drain(LONG), InvalidArgument, "node_id")
        await refused(follower.drain("agent-0", "r" * 1025), InvalidArgument, "reason")
        await refused(
            follower.drain("agent-0", release_timeout_s=2 * 86400),
            InvalidArgument,
            "release_timeout_ms",
        )
        await refused(follower.drain("no-such-node"), NotFound, "node_id")
        await refused(follower.drain("agent-2"), FailedPrecondition, "node")  # LEFT
        await refused(follower.uncordon(""), InvalidArgument, "node_id")
        await refused(follower.uncordon("no-such-node"), NotFound, "node_id")
    finally:
        node = await follower.uncordon("agent-1")
    assert not node.cordoned
    assert not (await follower.uncordon("agent-1")).cordoned  # idempotent

    async def alive() -> bool:
        nodes = {n.record.node_id: n.record for n in await leader.nodes()}
        return nodes["agent-1"].state == R.NODE_STATE_ALIVE and not nodes["agent-1"].cordoned

    await eventually(alive, "agent-1 ALIVE and uncordoned")


# ---------------------------------------------------------------- WatchEvents


async def test_watch_filters_and_resumes_from_the_last_revision(
    leader: Client, follower: Client
) -> None:
    kinds = ["task_submitted", "task_completed"]
    first = (await leader.submit("sleep", {"seconds": 0.1})).task
    # from_revision 1: everything the leader retains (the stream subscribes when
    # iteration starts; with 0 an event emitted before that is not delivered).
    stream = follower.watch(1, types=kinds)
    seen: list[records_pb2.Event] = []
    async with asyncio.timeout(WAIT_S):
        async for event in stream:
            seen.append(event)
            if event.WhichOneof("body") == "task_completed" and (
                event.task_completed.task_id == first.task_id
            ):
                break
    await stream.aclose()
    bodies = [(e.WhichOneof("body"), getattr(e, e.WhichOneof("body") or "").task_id) for e in seen]
    assert ("task_submitted", first.task_id) in bodies
    assert {b for b, _ in bodies} <= {"task_submitted", "task_completed"}
    revisions = [e.revision for e in seen]
    assert revisions == sorted(set(revisions))
    resume_at = stream.next_revision
    assert resume_at == revisions[-1] + 1 or resume_at > revisions[-1]
    # Events after the close are delivered by a new stream from the resume point, on
    # another replica, with nothing repeated.
    second = (await leader.submit("sleep", {"seconds": 0.1})).task
    again = leader.watch(resume_at, task_id=second.task_id)
    async with asyncio.timeout(WAIT_S):
        async for event in again:
            assert event.revision >= resume_at
            if event.WhichOneof("body") == "task_completed":
                break
    await again.aclose()
    # A revision no longer retained starts at the oldest retained one and says so.
    old = follower.watch(1, types=["leader_elected"])
    async with asyncio.timeout(WAIT_S):
        event = await old.__anext__()
    await old.aclose()
    assert event.WhichOneof("body") == "leader_elected"
    assert old.gaps == [event.revision]
    about = follower.watch(1, node_id="agent-2")
    async with asyncio.timeout(WAIT_S):
        joined = await about.__anext__()
    await about.aclose()
    assert joined.WhichOneof("body") == "node_joined"
    assert joined.node_joined.node_id == "agent-2"


@pytest.mark.parametrize("where", ["leader", "follower"])
async def test_watch_refuses_unknown_event_types(
    where: str, leader: Client, follower: Client
) -> None:
    client = leader if where == "leader" else follower
    cases: list[tuple[list[Any], str]] = [([0], "types[0]"), (["task_started", 999], "types[1]")]
    for types, field in cases:
        stream = client.watch(types=types)
        async with asyncio.timeout(WAIT_S):
            await refused(stream.__anext__(), InvalidArgument, field)
        await stream.aclose()
    with pytest.raises(InvalidArgument):  # a bad name never reaches the server
        client.watch(types=["task_exploded"])


async def test_watch_survives_the_replica_it_streams_from_being_killed(
    roles: Roles, connect: Callable[..., Client], leader: Client
) -> None:
    victim_address = roles.followers[-1]
    victim = roles.cluster.coordinators[roles.cluster.coordinator_addresses.index(victim_address)]
    client = connect([victim_address, roles.leader], retry_max_s=10)
    run = uuid.uuid4().hex[:8]
    stream = client.watch(1, types=["task_submitted"], progress_interval_ms=100)
    got: list[str] = []
    try:
        before = (await leader.submit("sleep", {"seconds": 0.1}, task_id=f"w-{run}-0")).task
        async with asyncio.timeout(WAIT_S):
            async for event in stream:
                got.append(event.task_submitted.task_id)
                if event.task_submitted.task_id == before.task_id:
                    break
            victim.kill()  # SIGKILL under the open stream
            for i in (1, 2):
                await leader.submit("sleep", {"seconds": 0.1}, task_id=f"w-{run}-{i}")
            async for event in stream:
                got.append(event.task_submitted.task_id)
                if event.task_submitted.task_id == f"w-{run}-2":
                    break
    finally:
        await stream.aclose()
        victim.start()
    mine = [t for t in got if t.startswith(f"w-{run}-")]
    assert mine == [f"w-{run}-0", f"w-{run}-1", f"w-{run}-2"]  # none lost, none repeated
    assert stream.reconnects >= 1
    assert len(stream.gaps) == 1  # from revision 1 at the start; the resume had no gap

    async def back() -> bool:
        try:
            status = await connect([victim_address], retry_max_s=0).status()
        except Unavailable:
            return False
        return status.leader_address == roles.leader

    await eventually(back, f"{victim_address} serving again")


# ---------------------------------------------------------------- retries


async def test_a_dead_first_address_is_skipped(
    roles: Roles, connect: Callable[..., Client]
) -> None:
    client = connect([roles.dead, roles.followers[0]], retry_max_s=5)
    started = time.monotonic()
    status = await client.status()
    assert status.leader_address == roles.leader
    await refused(client.get("no-such-task"), NotFound, "task_id")  # not retried into UNAVAILABLE
    task = (await client.submit("sleep", {"seconds": 0.1})).task
    assert (await client.get(task.task_id)).task.task_id == task.task_id
    assert time.monotonic() - started < 5


async def test_refusals_are_not_retried_and_dead_clusters_are_unavailable(
    roles: Roles, connect: Callable[..., Client]
) -> None:
    client = connect([roles.leader, roles.dead], retry_max_s=20)
    started = time.monotonic()
    await refused(client.get(""), InvalidArgument, "task_id")
    assert time.monotonic() - started < 2  # a retry would take retry_max_s
    dead = connect([roles.dead], retry_max_s=1.0)
    started = time.monotonic()
    with pytest.raises(Unavailable) as caught:
        await dead.status()
    assert 1.0 <= time.monotonic() - started < 5
    assert not caught.value.answered
    assert "no coordinator answered" in caught.value.message
    assert roles.dead in caught.value.message


# ---------------------------------------------------------------- SyncClient and CLI


def test_sync_client_for_scripts(roles: Roles) -> None:
    with SyncClient(
        [roles.dead, *roles.followers], retry_max_s=5, tls=roles.cluster.client_tls
    ) as client:
        assert client.status().leader_address == roles.leader
        task = client.submit("sleep", {"seconds": 0.1}).task
        deadline = time.monotonic() + WAIT_S
        while True:  # a follower's cache may lag the leader by a few ms
            try:
                assert client.get(task.task_id).task.task_id == task.task_id
                break
            except NotFound:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert any(t.task_id == task.task_id for t in client.list_tasks(kind="sleep"))
        assert len(client.nodes()) == 3
        with pytest.raises(NotFound):
            client.get("no-such-task")
        events = client.watch(1, types=["leader_elected"])
        assert next(events).WhichOneof("body") == "leader_elected"
        events.close()


def test_cli_against_the_cluster(roles: Roles, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAZARUS_COORDINATORS", f"{roles.dead},{roles.followers[0]}")
    for key, value in roles.cluster.client_env().items():  # LAZARUS_TLS_*: the admin cert
        monkeypatch.setenv(key, value)
    runner = CliRunner()
    result = runner.invoke(cli.app, ["status", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["leader_address"] == roles.leader
    result = runner.invoke(cli.app, ["submit", "sleep", "--payload", '{"seconds": 0.1}', "--json"])
    assert result.exit_code == 0, result.output
    task_id = json.loads(result.output)["task"]["task_id"]
    result = runner.invoke(cli.app, ["task", task_id, "--json"])
    assert result.exit_code in (0, 1), result.output  # the follower's cache may lag
    result = runner.invoke(cli.app, ["task", "no-such-task"])
    assert result.exit_code == 1
    assert "NOT_FOUND" in result.output
    result = runner.invoke(cli.app, ["nodes", "--coordinators", roles.dead])
    assert result.exit_code == 3
    assert f"no coordinator answered at {roles.dead}" in result.output


def test_cli_watch_ends_cleanly_on_sigint(roles: Roles) -> None:
    # SIGINT at its default disposition (coreutils env): a job started in the
    # background by a non-interactive shell inherits it ignored, and Ctrl-C is
    # what this test is about.
    child = subprocess.Popen(
        [
            "env",
            "--default-signal=INT",
            LAZARUS_BIN,
            "watch",
            "--from-revision",
            "1",
            "--coordinators",
            roles.leader,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **roles.cluster.client_env()},
    )
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], 20)
        assert ready, "lazarus watch printed nothing in 20 s"
        first = child.stdout.readline()  # the stream is open: the replay started
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(5)
    out = first + out
    assert child.returncode == 0, err
    assert "LEADER_ELECTED" in out
    assert "Traceback" not in err


# ---------------------------------------------------------------- generic gRPC clients


def test_reflection_lists_the_services_and_calls_get_cluster_status(roles: Roles) -> None:
    from google.protobuf import descriptor_pool
    from grpc_requests import ReflectionClient

    tls = roles.cluster.client_tls
    for address in roles.all:
        client = ReflectionClient(
            address,
            descriptor_pool=descriptor_pool.DescriptorPool(),  # nothing of ours preloaded
            channel_options=[("grpc.enable_http_proxy", 0)],
            ssl=True,
            credentials={
                "root_certificates": tls.ca_file,
                "certificate_chain": tls.cert_file,
                "private_key": tls.key_file,
            },
        )
        try:
            services = set(client.service_names)
            assert {"lazarus.v1.CoordinatorService", "grpc.health.v1.Health"} <= services
            methods = set(client.service("lazarus.v1.CoordinatorService").method_names)
            assert {"GetClusterStatus", "SubmitTask", "WatchEvents", "ForkTask"} <= methods
            reply = client.request("lazarus.v1.CoordinatorService", "GetClusterStatus", {})
            assert reply["cluster_name"] == roles.cluster.cluster
            assert reply["leader_address"] == roles.leader
        finally:
            client.channel.close()


def test_health_says_serving_on_leader_and_followers(roles: Roles) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    for address in roles.all:
        tls = roles.cluster.client_tls  # health is open to any peer the TLS handshake admits
        with tls.channel(address, [("grpc.enable_http_proxy", 0)]) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for service in ("", "lazarus.v1.CoordinatorService"):
                reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING, (address, service)


async def test_the_server_refuses_a_payload_over_its_limit_and_keeps_leading(
    follower: Client, leader: Client
) -> None:
    before = (await leader.status()).term
    big = b"x" * (300 * 1024)  # over the coordinator's 256 KiB, under the client's 1 MiB
    await refused(follower.submit("sleep", big), InvalidArgument, "spec.payload")
    await refused(leader.submit("sleep", big), InvalidArgument, "spec.payload")
    assert (await leader.status()).term == before, "no leader stepped down"
