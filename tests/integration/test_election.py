"""Leader election and fenced persistence against real etcd, through real aetcd clients.

Every test bounds its waits with ``asyncio.timeout`` and closes what it opened
(elections resign / revoke, clients close, child processes are killed by pid).
Prefixes and cluster names are unique per test: the session servers are shared.

Measured figures (resign → next leader, lease loss → next leader) are printed
as ``MEASURED <what> <seconds>``; run with ``-s`` to see them.

Connection loss is injected with :class:`TcpProxy`, a loopback forwarder in
front of etcd that can cut every connection and refuse new ones; process
death with SIGKILL of a child process that campaigns.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aetcd
import pytest

import coordinator.election as election_module
from coordinator.election import (
    Election,
    Fence,
    Leader,
    Leadership,
    LeadershipLost,
    LossReason,
    election_key,
)
from coordinator.etcd_store import (
    MAX_TXN_OPS,
    Collection,
    DeleteRecord,
    EtcdStore,
    FencedWriteRejected,
    PutRecord,
    ReadCache,
    election_prefix,
)
from lazarus.v1 import records_pb2
from lazarus_dev.localservers import Endpoint, EtcdCluster, EtcdServer

MakeEtcdClient = Callable[..., Awaitable[aetcd.Client]]

REPO_ROOT = Path(__file__).resolve().parents[2]
SETTLE_S = 0.3
"""How long a campaign that must keep waiting is watched for not returning."""

# Loopback only, and quick reconnects for clients behind a proxy that comes back.
GRPC_OPTIONS: dict[str, Any] = {
    "grpc.enable_http_proxy": 0,
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 300,
}


def _unique(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:10]}"


def _prefix(label: str) -> str:
    return f"/lazarus-test/{_unique(label)}/election"


def _measured(what: str, seconds: float) -> None:
    print(f"MEASURED {what} {seconds:.3f}")


async def _until(predicate: Callable[[], bool], interval_s: float = 0.02) -> None:
    """Sleep until ``predicate()`` is true; the caller bounds the time."""
    while not predicate():
        await asyncio.sleep(interval_s)


async def _until_candidates(client: aetcd.Client, prefix: str, count: int) -> None:
    """Poll etcd until ``count`` keys are under ``<prefix>/``; the caller bounds the time."""
    while len(await client.get_prefix((prefix + "/").encode())) != count:
        await asyncio.sleep(0.02)


async def _cancel(*tasks: asyncio.Task[Any]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def _elections(
    *clients: aetcd.Client, prefix: str, ttl_s: int = 3
) -> AsyncIterator[list[Election]]:
    elections = [Election(client, prefix, ttl_s=ttl_s) for client in clients]
    try:
        yield elections
    finally:
        for election in elections:
            await election.close()


@contextlib.asynccontextmanager
async def _client(endpoint: Endpoint, timeout_s: float = 5.0) -> AsyncIterator[aetcd.Client]:
    client = aetcd.Client(
        host=endpoint.host, port=endpoint.port, timeout=timeout_s, options=GRPC_OPTIONS
    )
    try:
        await client.connect()
        yield client
    finally:
        await client.close()


class TcpProxy:
    """A loopback TCP forwarder to one endpoint that can cut every connection."""

    def __init__(self, target: Endpoint) -> None:
        self._target = target
        self._server: asyncio.Server | None = None
        self._port = 0
        self._pumps: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint("127.0.0.1", self._port)

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self._port)
        self._port = self._server.sockets[0].getsockname()[1]
        return self

    async def cut(self) -> None:
        """Refuse new connections and reset every open one."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        await _cancel(*self._pumps)

    async def restore(self) -> None:
        """Accept connections again, on the same port."""
        await self.start()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(
                self._target.host, self._target.port
            )
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(src, dst))
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            dst.transport.abort()
            self._writers.discard(dst)


@pytest.fixture
async def make_proxy() -> AsyncIterator[Callable[[Endpoint], Awaitable[TcpProxy]]]:
    proxies: list[TcpProxy] = []

    async def make(target: Endpoint) -> TcpProxy:
        proxy = await TcpProxy(target).start()
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        await proxy.cut()


# ---------------------------------------------------------------- election


async def test_three_campaigners_one_leads_and_resign_hands_over_in_create_order(
    etcd_cluster: EtcdCluster, make_etcd_client: MakeEtcdClient
) -> None:
    clients = [await make_etcd_client(ep) for ep in etcd_cluster.endpoints]
    prefix = _prefix("three")
    async with _elections(*clients, prefix=prefix) as elections:
        tasks = [
            asyncio.create_task(e.campaign(f"10.0.0.{i}:7000")) for i, e in enumerate(elections)
        ]
        try:
            async with asyncio.timeout(10):
                await _until_candidates(clients[0], prefix, 3)
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            await asyncio.sleep(SETTLE_S)
            assert sum(t.done() for t in tasks) == 1, "exactly one campaigner leads"

            # The order of succession is the order of create revisions.
            terms = []
            for e in elections:
                assert e.lease_id is not None
                kv = await clients[0].get(election_key(prefix, e.lease_id).encode())
                terms.append(kv.create_revision)
            order = sorted(range(3), key=lambda i: terms[i])
            first = tasks[order[0]]
            assert done == {first}
            leadership = first.result()
            assert leadership.term == terms[order[0]]
            assert await elections[order[2]].leader() == Leader(
                leadership.key, f"10.0.0.{order[0]}:7000", leadership.term, leadership.lease_id
            )

            for step, (old, new) in enumerate(itertools.pairwise(order)):
                started = time.monotonic()
                await elections[old].resign()
                async with asyncio.timeout(5):
                    new_leadership = await tasks[new]
                elapsed_s = time.monotonic() - started
                _measured(f"resign->next-leader[{step}]", elapsed_s)
                assert elapsed_s < 1.0, "SIGTERM → new leader within 1 s"
                assert new_leadership.term == terms[new]
                assert await clients[0].get(leadership.key.encode()) is None
                assert leadership.reason is LossReason.RESIGNED
                leadership = new_leadership
                if step == 0:
                    await asyncio.sleep(SETTLE_S)
                    assert not tasks[order[2]].done(), "the third still waits"
                leader = await elections[old].leader()
                assert leader is not None
                assert leader.value == f"10.0.0.{new}:7000"
        finally:
            await _cancel(*tasks)


async def test_a_waiter_whose_predecessor_vanishes_looks_again_and_keeps_waiting(
    etcd: EtcdServer, make_etcd_client: MakeEtcdClient
) -> None:
    a, b, c, admin = [await make_etcd_client(etcd.endpoint) for _ in range(4)]
    prefix = _prefix("recheck")
    async with _elections(a, b, c, prefix=prefix) as (ea, eb, ec):
        async with asyncio.timeout(5):
            await ea.campaign("a")
        tb = asyncio.create_task(eb.campaign("b"))
        async with asyncio.timeout(5):
            await _until_candidates(admin, prefix, 2)
        tc = asyncio.create_task(ec.campaign("c"))
        try:
            async with asyncio.timeout(5):
                await _until_candidates(admin, prefix, 3)
            await asyncio.sleep(SETTLE_S)

            # c waits for b (its predecessor), not for a. b's candidacy goes:
            # c must look again, find a, and keep waiting.
            tb.cancel()
            await asyncio.gather(tb, return_exceptions=True)
            async with asyncio.timeout(5):
                await _until_candidates(admin, prefix, 2)
            await asyncio.sleep(SETTLE_S)
            assert not tc.done(), "c leads while a still does"
            leader = await ec.leader()
            assert leader is not None
            assert leader.value == "a"

            await ea.resign()
            async with asyncio.timeout(5):
                leadership = await tc
            assert leadership.value == "c"
        finally:
            await _cancel(tb, tc)


CHILD_CAMPAIGNER = """
import asyncio, sys
import aetcd
from coordinator.election import Election
from coordinator.etcd_store import Collection, EtcdStore, FencedWriteRejected, PutRecord
from lazarus.v1.records_pb2 import NodeRecord

async def main(host, port, prefix, ttl_s, cluster=None):
    client = aetcd.Client(host=host, port=int(port), timeout=5,
                          options={"grpc.enable_http_proxy": 0})
    await client.connect()
    leadership = await Election(client, prefix, ttl_s=int(ttl_s)).campaign("child")
    print("leading", leadership.term, leadership.key, flush=True)
    if cluster is None:
        await asyncio.sleep(3600)
        return
    # A leader that never looks at leadership.lost(): only etcd can stop its writes.
    store = EtcdStore(client, cluster)
    i = 0
    while True:
        record = NodeRecord(node_id=f"c-{i}", written_term=leadership.term)
        try:
            (revision,) = await store.write(
                leadership.fence,
                [PutRecord(Collection.NODES, f"c-{i}", record.SerializeToString())])
        except FencedWriteRejected as exc:
            print("refused", i, exc.current_create_revision, flush=True)
            return
        print("wrote", i, revision, flush=True)
        i += 1
        await asyncio.sleep(0.05)

asyncio.run(main(*sys.argv[1:]))
"""


@contextlib.asynccontextmanager
async def _child_campaigner(
    endpoint: Endpoint, prefix: str, ttl_s: int, *extra: str
) -> AsyncIterator[asyncio.subprocess.Process]:
    """A campaigner in its own process (killed by pid at the end); see CHILD_CAMPAIGNER."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD_CAMPAIGNER,
        endpoint.host,
        str(endpoint.port),
        prefix,
        str(ttl_s),
        *extra,
        stdout=asyncio.subprocess.PIPE,
        cwd=REPO_ROOT,
    )
    try:
        yield child
    finally:
        if child.returncode is None:
            child.kill()
        await child.wait()


async def test_sigkilled_leader_is_replaced_within_ttl_plus_one_second(
    etcd_cluster: EtcdCluster, make_etcd_client: MakeEtcdClient
) -> None:
    ttl_s = 3
    prefix = _prefix("sigkill")
    client = await make_etcd_client(etcd_cluster.endpoints[1])
    async with (
        _child_campaigner(etcd_cluster.endpoints[0], prefix, ttl_s) as child,
        _elections(client, prefix=prefix, ttl_s=ttl_s) as (ours,),
    ):
        assert child.stdout is not None
        async with asyncio.timeout(20):
            line = (await child.stdout.readline()).decode()
        assert line.startswith("leading"), line
        child_term = int(line.split()[1])

        campaign = asyncio.create_task(ours.campaign("survivor"))
        try:
            async with asyncio.timeout(5):
                await _until_candidates(client, prefix, 2)
            await asyncio.sleep(SETTLE_S)
            assert not campaign.done()

            child.kill()  # SIGKILL by pid: no resign, no revoke; the lease must expire
            killed_at = time.monotonic()
            async with asyncio.timeout(ttl_s + 5):
                leadership = await campaign
            elapsed_s = time.monotonic() - killed_at
        finally:
            await _cancel(campaign)
        _measured("sigkill->next-leader", elapsed_s)
        assert elapsed_s <= ttl_s + 1.0
        assert leadership.term > child_term
        assert (await ours.leader()) == Leader(
            leadership.key, "survivor", leadership.term, leadership.lease_id
        )


async def test_revoked_lease_is_reported_lost_and_the_next_leads_at_once(
    etcd: EtcdServer, make_etcd_client: MakeEtcdClient
) -> None:
    a, b, admin = [await make_etcd_client(etcd.endpoint) for _ in range(3)]
    prefix = _prefix("revoke")
    async with _elections(a, b, prefix=prefix) as (ea, eb):
        async with asyncio.timeout(5):
            first = await ea.campaign("a")
        tb = asyncio.create_task(eb.campaign("b"))
        try:
            async with asyncio.timeout(5):
                await _until_candidates(admin, prefix, 2)

            await admin.revoke_lease(first.lease_id)  # as if the lease expired
            revoked_at = time.monotonic()
            async with asyncio.timeout(5):
                reason = await first.lost()
            lost_s = time.monotonic() - revoked_at
            async with asyncio.timeout(5):
                second = await tb
            next_s = time.monotonic() - revoked_at
        finally:
            await _cancel(tb)
        _measured("lease-revoked->old-leader-knows", lost_s)
        _measured("lease-revoked->next-leader", next_s)
        assert reason in (LossReason.KEY_DELETED, LossReason.LEASE_EXPIRED)
        assert lost_s < 1.0
        assert next_s < 1.0
        assert second.term > first.term
        with pytest.raises(LeadershipLost):
            await ea.proclaim("still me?")


async def test_a_deleted_leader_key_is_reported_lost_and_the_same_lease_campaigns_again(
    etcd: EtcdServer, make_etcd_client: MakeEtcdClient
) -> None:
    a, b, admin = [await make_etcd_client(etcd.endpoint) for _ in range(3)]
    prefix = _prefix("deleted")
    async with _elections(a, b, prefix=prefix) as (ea, eb):
        async with asyncio.timeout(5):
            first = await ea.campaign("a")
        tb = asyncio.create_task(eb.campaign("b"))
        try:
            async with asyncio.timeout(5):
                await _until_candidates(admin, prefix, 2)
            await admin.delete(first.key.encode())  # an operator's `etcdctl del`
            async with asyncio.timeout(5):
                assert await first.lost() is LossReason.KEY_DELETED
                second = await tb
        finally:
            await _cancel(tb)
        assert ea.lease_id == first.lease_id, "the lease outlives its key"

        again = asyncio.create_task(ea.campaign("a"))
        try:
            async with asyncio.timeout(5):
                await _until_candidates(admin, prefix, 2)
            await asyncio.sleep(SETTLE_S)
            assert not again.done(), "a queues behind b now"
            await eb.resign()
            async with asyncio.timeout(5):
                third = await again
        finally:
            await _cancel(again)
        assert third.key == first.key, "same lease, same key name"
        assert third.term > second.term > first.term


async def test_leader_cut_off_from_etcd_gives_up_before_another_leads(
    etcd: EtcdServer,
    make_etcd_client: MakeEtcdClient,
    make_proxy: Callable[[Endpoint], Awaitable[TcpProxy]],
) -> None:
    ttl_s = 2
    proxy = await make_proxy(etcd.endpoint)
    prefix = _prefix("cutoff")
    b = await make_etcd_client(etcd.endpoint)
    async with _client(proxy.endpoint, timeout_s=1.0) as a:
        async with _elections(a, b, prefix=prefix, ttl_s=ttl_s) as (ea, eb):
            async with asyncio.timeout(5):
                first = await ea.campaign("a")
            tb = asyncio.create_task(eb.campaign("b"))
            try:
                async with asyncio.timeout(5):
                    await _until_candidates(b, prefix, 2)

                lost_at: list[float] = []

                async def note_loss() -> LossReason:
                    reason = await first.lost()
                    lost_at.append(time.monotonic())
                    return reason

                noting = asyncio.create_task(note_loss())
                await proxy.cut()  # a's connection to etcd is gone; its keepalives fail
                cut_at = time.monotonic()
                async with asyncio.timeout(ttl_s + 5):
                    second = await tb
                new_leader_at = time.monotonic()
                async with asyncio.timeout(1):
                    reason = await noting
            finally:
                await _cancel(tb)
        _measured("cut-off->old-leader-gives-up", lost_at[0] - cut_at)
        _measured("cut-off->next-leader", new_leader_at - cut_at)
        assert reason is LossReason.LEASE_DEADLINE_PASSED
        assert lost_at[0] <= new_leader_at, "the old leader stops before the new one starts"
        assert new_leader_at - cut_at <= ttl_s + 1.0
        assert second.term > first.term


async def test_the_lease_deadline_is_shortened_for_clock_drift(
    etcd: EtcdServer,
    make_etcd_client: MakeEtcdClient,
    make_proxy: Callable[[Endpoint], Awaitable[TcpProxy]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A leader's authority ends at sent + ttl (1 - rho) / (1 + rho) (docs/fan-in.md).

    With an exaggerated rho of 0.5 a 3 s lease gives 1 s of authority after the
    last answered keepalive: cut off from etcd, the leader gives up within about
    1 s plus one keepalive interval (0.5 s), not after the ~2.5 s the undrifted
    deadline would give.
    """
    monkeypatch.setattr(election_module, "LEASE_CLOCK_DRIFT", 0.5)
    ttl_s = 3
    proxy = await make_proxy(etcd.endpoint)
    async with (
        _client(proxy.endpoint, timeout_s=1.0) as a,
        _elections(a, prefix=_prefix("drift"), ttl_s=ttl_s) as (ea,),
    ):
        async with asyncio.timeout(5):
            leader = await ea.campaign("a")
        await asyncio.sleep(1.2)  # a few keepalives answered under the drifted deadline
        await proxy.cut()
        cut_at = time.monotonic()
        async with asyncio.timeout(ttl_s + 2):
            reason = await leader.lost()
        gave_up_s = time.monotonic() - cut_at
    _measured("cut-off->gives-up (rho 0.5)", gave_up_s)
    assert reason is LossReason.LEASE_DEADLINE_PASSED
    assert gave_up_s < 1.0 + ttl_s / 6 + 0.3, f"gave up {gave_up_s:.2f} s after the cut"


async def test_observe_sees_each_change_of_leader(
    etcd: EtcdServer, make_etcd_client: MakeEtcdClient
) -> None:
    a, b, c, watcher = [await make_etcd_client(etcd.endpoint) for _ in range(4)]
    prefix = _prefix("observe")
    seen: list[Leader] = []
    observer = Election(watcher, prefix)

    async def collect() -> None:
        async for leader in observer.observe():
            seen.append(leader)

    async def seen_values(*values: str) -> None:
        async with asyncio.timeout(5):
            await _until(lambda: len(seen) >= len(values))
        await asyncio.sleep(0.1)  # nothing more may arrive
        assert [leader.value for leader in seen] == list(values)

    observing = asyncio.create_task(collect())
    async with _elections(a, b, c, prefix=prefix) as (ea, eb, ec):
        tb: asyncio.Task[Leadership] | None = None
        try:
            await asyncio.sleep(SETTLE_S)
            assert seen == [], "nothing is yielded while nobody campaigns"
            async with asyncio.timeout(5):
                first = await ea.campaign("a1")
            await seen_values("a1")
            await ea.proclaim("a2")
            await seen_values("a1", "a2")
            tb = asyncio.create_task(eb.campaign("b"))
            async with asyncio.timeout(5):
                await _until_candidates(watcher, prefix, 2)
            await seen_values("a1", "a2")  # a waiter is no change of leader
            await ea.resign()
            async with asyncio.timeout(5):
                second = await tb
            await seen_values("a1", "a2", "b")
            await eb.resign()
            async with asyncio.timeout(5):
                third = await ec.campaign("c")
            await seen_values("a1", "a2", "b", "c")
        finally:
            await _cancel(observing, *([tb] if tb is not None else []))
            await observer.close()
    assert [leader.term for leader in seen] == [first.term, first.term, second.term, third.term]
    assert seen[2].key == second.key


async def _read_until(stream: asyncio.StreamReader, needle: str, lines: list[str]) -> None:
    """Read lines into ``lines`` until one equals ``needle``; the caller bounds the time."""
    while True:
        raw = await stream.readline()
        if not raw:
            raise AssertionError(f"stream ended before {needle!r}; read {lines}")
        lines.append(raw.decode().rstrip("\n"))
        if lines[-1] == needle:
            return


@contextlib.asynccontextmanager
async def _etcdctl(etcd: EtcdServer, *args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    env = {**os.environ, "ETCDCTL_API": "3"}
    env = {k: v for k, v in env.items() if not k.lower().endswith("_proxy")}
    process = await asyncio.create_subprocess_exec(
        "etcdctl",
        f"--endpoints={etcd.client_url}",
        *args,
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        yield process
    finally:
        if process.returncode is None:
            process.kill()  # by pid
        await process.wait()


async def test_etcdctl_elect_listen_shows_our_leader(
    etcd: EtcdServer, make_etcd_client: MakeEtcdClient
) -> None:
    a, b = [await make_etcd_client(etcd.endpoint) for _ in range(2)]
    prefix = _prefix("listen")
    async with _elections(a, b, prefix=prefix) as (ea, eb):
        async with asyncio.timeout(5):
            first = await ea.campaign("10.9.8.7:7000")
        tb = asyncio.create_task(eb.campaign("10.9.8.6:7000"))
        try:
            async with _etcdctl(etcd, "elect", "--listen", prefix) as listener:
                assert listener.stdout is not None
                lines: list[str] = []
                async with asyncio.timeout(10):
                    await _read_until(listener.stdout, "10.9.8.7:7000", lines)
                assert lines[-2] == first.key, "etcdctl prints the key, then the value"
                assert re.fullmatch(re.escape(prefix) + r"/[0-9a-f]+", lines[-2])

                await ea.resign()
                async with asyncio.timeout(10):
                    second = await tb
                    await _read_until(listener.stdout, "10.9.8.6:7000", lines)
                assert lines[-2] == second.key
        finally:
            await _cancel(tb)


async def test_a_go_campaigner_and_ours_queue_behind_each_other(
    etcd: EtcdServer, make_etcd_client: MakeEtcdClient
) -> None:
    client = await make_etcd_client(etcd.endpoint)
    prefix = _prefix("go")
    async with _elections(client, prefix=prefix) as (ours,):
        # etcdctl elect campaigns with Go's concurrency.Election; it prints once it leads.
        async with _etcdctl(etcd, "elect", prefix, "go-proposal") as go:
            assert go.stdout is not None
            lines: list[str] = []
            async with asyncio.timeout(10):
                await _read_until(go.stdout, "go-proposal", lines)
            go_leader = await ours.leader()
            assert go_leader is not None
            assert go_leader.key == lines[-2]
            assert go_leader.key == election_key(prefix, go_leader.lease_id)

            campaign = asyncio.create_task(ours.campaign("py"))
            try:
                async with asyncio.timeout(5):
                    await _until_candidates(client, prefix, 2)
                await asyncio.sleep(SETTLE_S)
                assert not campaign.done(), "ours queues behind the Go leader"
                go.terminate()  # etcdctl resigns on SIGTERM
                async with asyncio.timeout(5):
                    leadership = await campaign
                assert leadership.term > go_leader.term
            finally:
                await _cancel(campaign)

        async with _etcdctl(etcd, "elect", prefix, "go-again") as go:
            assert go.stdout is not None
            async with asyncio.timeout(5):
                await _until_candidates(client, prefix, 2)
            lines = []
            reading = asyncio.create_task(_read_until(go.stdout, "go-again", lines))
            try:
                await asyncio.sleep(SETTLE_S)
                assert not reading.done(), "the Go campaigner queues behind ours"
                await ours.resign()
                async with asyncio.timeout(5):
                    await reading
            finally:
                await _cancel(reading)
            go.terminate()


# ---------------------------------------------------------------- fencing


def _node(node_id: str, term: int) -> bytes:
    return records_pb2.NodeRecord(node_id=node_id, written_term=term).SerializeToString()


def _task(task_id: str, epoch: int) -> bytes:
    return records_pb2.TaskRecord(task_id=task_id, epoch=epoch).SerializeToString()


async def test_a_deposed_leaders_writes_are_refused_and_none_lands_after_the_new_term(
    etcd: EtcdServer, make_etcd_client: MakeEtcdClient
) -> None:
    a, b, admin = [await make_etcd_client(etcd.endpoint) for _ in range(3)]
    cluster = _unique("fence")
    prefix = election_prefix(cluster)
    store_a, store_b = EtcdStore(a, cluster), EtcdStore(b, cluster)
    async with _elections(a, b, prefix=prefix) as (ea, eb):
        async with asyncio.timeout(5):
            lead_a = await ea.campaign("a")
        revisions = await store_a.write(
            lead_a.fence, [PutRecord(Collection.NODES, "n-0", _node("n-0", lead_a.term))]
        )
        assert len(revisions) == 1

        tb = asyncio.create_task(eb.campaign("b"))
        writes = 0
        refused: list[FencedWriteRejected] = []

        async def keep_writing() -> None:
            # A deposed leader that does not know it yet: it writes until etcd refuses.
            nonlocal writes
            while True:
                node_id = f"n-{writes + 1}"
                try:
                    await store_a.write(
                        lead_a.fence,
                        [PutRecord(Collection.NODES, node_id, _node(node_id, lead_a.term))],
                    )
                except FencedWriteRejected as exc:
                    refused.append(exc)
                    return
                writes += 1

        writer = asyncio.create_task(keep_writing())
        a_key_watch = await admin.watch(lead_a.key.encode())
        try:
            async with asyncio.timeout(5):
                await _until(lambda: writes >= 5)
                await _until_candidates(admin, prefix, 2)
                writes_before_b_waited = writes
                await asyncio.sleep(0.1)  # a keeps leading (and writing) while b waits
            # a's lease ends, as if it expired: etcd deletes a's key at revision `deleted_at`.
            await admin.revoke_lease(lead_a.lease_id)
            async with asyncio.timeout(5):
                async for event in a_key_watch:
                    if event.kind == aetcd.EventKind.DELETE:
                        deleted_at = event.kv.mod_revision
                        break
                lead_b = await tb
                await writer
                assert await lead_a.lost() is LossReason.KEY_DELETED
        finally:
            await a_key_watch.cancel()
            await _cancel(tb, writer)

        assert refused, "the writer stopped only on a refusal"
        assert refused[0].current_create_revision is None  # a's key is gone
        assert refused[0].committed_ops == 0
        with pytest.raises(FencedWriteRejected) as late:
            await store_a.write(
                lead_a.fence, [PutRecord(Collection.NODES, "late", _node("late", lead_a.term))]
            )
        assert late.value.reason is LossReason.FENCE_REJECTED
        # A fence naming the right key with a wrong term is refused as well.
        with pytest.raises(FencedWriteRejected) as wrong:
            await store_a.write(
                Fence(lead_b.fence.key, lead_b.term - 1), [DeleteRecord(Collection.NODES, "n-0")]
            )
        assert wrong.value.current_create_revision == lead_b.term

        (b_revision,) = await store_b.write(
            lead_b.fence, [PutRecord(Collection.NODES, "from-b", _node("from-b", lead_b.term))]
        )
        assert b_revision > lead_b.term

        kvs = await admin.get_prefix(f"/lazarus/{cluster}/nodes/".encode())
        by_writer: dict[int, list[int]] = {lead_a.term: [], lead_b.term: []}
        for kv in kvs:
            record = records_pb2.NodeRecord.FromString(kv.value)
            by_writer[record.written_term].append(kv.mod_revision)
        assert len(by_writer[lead_a.term]) == writes + 1
        # b's term (its key's create revision) is older than its leadership: a
        # rightly wrote while b waited. What must hold: nothing of a's lands
        # once a's key is gone, and b leads only after that.
        assert writes > writes_before_b_waited, "a wrote while b waited"
        assert max(by_writer[lead_a.term]) < deleted_at <= lead_b.since_revision
        assert lead_b.term < deleted_at
        assert by_writer[lead_b.term] == [b_revision]
        assert (await admin.get(f"/lazarus/{cluster}/nodes/late".encode())) is None
        assert (await admin.get(f"/lazarus/{cluster}/nodes/n-0".encode())) is not None


async def test_a_leader_paused_past_its_lease_is_refused_when_it_resumes(
    etcd: EtcdServer, make_etcd_client: MakeEtcdClient
) -> None:
    ttl_s = 2
    cluster = _unique("sigstop")
    prefix = election_prefix(cluster)
    client, admin = [await make_etcd_client(etcd.endpoint) for _ in range(2)]
    async with (
        _child_campaigner(etcd.endpoint, prefix, ttl_s, cluster) as child,
        _elections(client, prefix=prefix, ttl_s=ttl_s) as (ours,),
    ):
        assert child.stdout is not None
        async with asyncio.timeout(20):
            line = (await child.stdout.readline()).decode().split()
        assert line[0] == "leading", line
        child_term, child_key = int(line[1]), line[2]
        child_key_watch = await admin.watch(child_key.encode())
        campaign = asyncio.create_task(ours.campaign("successor"))
        try:
            async with asyncio.timeout(5):
                await _until_candidates(admin, prefix, 2)
            await asyncio.sleep(SETTLE_S)  # the child keeps writing as leader meanwhile
            child.send_signal(signal.SIGSTOP)
            async with asyncio.timeout(ttl_s + 5):
                async for event in child_key_watch:  # etcd expires the paused child's lease
                    if event.kind == aetcd.EventKind.DELETE:
                        deleted_at = event.kv.mod_revision
                        break
                leadership = await campaign
            child.send_signal(signal.SIGCONT)
            lines: list[str] = []
            async with asyncio.timeout(10):
                while not lines or not lines[-1].startswith("refused"):
                    raw = await child.stdout.readline()
                    assert raw, f"the child ended without a refusal: {lines}"
                    lines.append(raw.decode().strip())
                await child.wait()
        finally:
            await child_key_watch.cancel()
            await _cancel(campaign)

    wrote = [line.split() for line in lines if line.startswith("wrote")]
    assert leadership.since_revision >= deleted_at > leadership.term > child_term
    kvs = await admin.get_prefix(f"/lazarus/{cluster}/nodes/".encode())
    child_revisions = [
        kv.mod_revision
        for kv in kvs
        if records_pb2.NodeRecord.FromString(kv.value).written_term == child_term
    ]
    assert child_revisions, "the child wrote as leader before it was paused"
    assert max(child_revisions) < deleted_at, "nothing of the child's lands after its key went"
    assert all(int(w[2]) < deleted_at for w in wrote)
    assert lines[-1].split()[2] == "None", "refused because its key is gone"


class _RevokeAfterFirstTransaction:
    """An aetcd client whose lease is revoked right after its first transaction commits."""

    def __init__(self, client: aetcd.Client, admin: aetcd.Client, lease_id: int) -> None:
        self._client = client
        self._admin = admin
        self._lease_id = lease_id
        self.transactions_sent = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def transaction(self, *args: Any, **kwargs: Any) -> Any:
        self.transactions_sent += 1
        result = await self._client.transaction(*args, **kwargs)
        if self.transactions_sent == 1:
            await self._admin.revoke_lease(self._lease_id)
        return result


async def test_batches_over_128_ops_are_split_and_every_transaction_is_fenced(
    etcd: EtcdServer, make_etcd_client: MakeEtcdClient
) -> None:
    a, admin = [await make_etcd_client(etcd.endpoint) for _ in range(2)]
    cluster = _unique("batch")
    store = EtcdStore(a, cluster)
    async with _elections(a, prefix=election_prefix(cluster)) as (ea,):
        async with asyncio.timeout(5):
            leadership = await ea.campaign("a")
        ops = [PutRecord(Collection.TASKS, f"t-{i:03}", _task(f"t-{i:03}", 1)) for i in range(300)]
        revisions = await store.write(leadership.fence, ops)
        assert len(revisions) == 3
        assert list(revisions) == sorted(set(revisions))
        kvs = await admin.get_prefix(f"/lazarus/{cluster}/tasks/".encode())
        per_revision = {r: 0 for r in revisions}
        for kv in kvs:
            per_revision[kv.mod_revision] += 1
        assert list(per_revision.values()) == [MAX_TXN_OPS, MAX_TXN_OPS, 300 - 2 * MAX_TXN_OPS]

        # The lease goes between the first and second transaction of a batch:
        # the second is refused by its own compare, and the third is never sent.
        revoking = _RevokeAfterFirstTransaction(a, admin, leadership.lease_id)
        fenced_store = EtcdStore(revoking, cluster)
        ops2 = [PutRecord(Collection.TASKS, f"u-{i:03}", _task(f"u-{i:03}", 1)) for i in range(300)]
        with pytest.raises(FencedWriteRejected) as refused:
            await fenced_store.write(leadership.fence, ops2)
        assert refused.value.committed_ops == MAX_TXN_OPS
        assert revoking.transactions_sent == 2
        kvs = await admin.get_prefix(f"/lazarus/{cluster}/tasks/u-".encode())
        assert sorted(kv.key for kv in kvs) == [
            f"/lazarus/{cluster}/tasks/u-{i:03}".encode() for i in range(MAX_TXN_OPS)
        ]


# ---------------------------------------------------------------- read cache


async def test_follower_read_cache_converges_with_the_leaders_writes(
    etcd_cluster: EtcdCluster, make_etcd_client: MakeEtcdClient
) -> None:
    leader_client = await make_etcd_client(etcd_cluster.endpoints[0])
    follower_client = await make_etcd_client(etcd_cluster.endpoints[2])
    cluster = _unique("cache")
    leader_store = EtcdStore(leader_client, cluster)
    follower_store = EtcdStore(follower_client, cluster, page_keys=50)  # several pages
    async with _elections(leader_client, prefix=election_prefix(cluster)) as (election,):
        async with asyncio.timeout(5):
            leadership = await election.campaign("leader")
        await leader_store.write(
            leadership.fence,
            [
                PutRecord(Collection.NODES, f"n-{i}", _node(f"n-{i}", leadership.term))
                for i in range(120)
            ],
        )
        cache = ReadCache(follower_store)
        following = asyncio.create_task(cache.run())
        try:
            async with asyncio.timeout(5):
                await cache.wait_loaded()
            assert len(cache.records(Collection.NODES)) == 120

            ops: list[PutRecord | DeleteRecord] = [
                PutRecord(Collection.TASKS, f"t-{i}", _task(f"t-{i}", 1)) for i in range(200)
            ]
            ops += [DeleteRecord(Collection.NODES, f"n-{i}") for i in range(10)]
            ops += [PutRecord(Collection.NODES, "n-10", _node("n-10-v2", leadership.term))]
            revisions = await leader_store.write(leadership.fence, ops)
            async with asyncio.timeout(5):
                await cache.wait_for_revision(revisions[-1])
            assert cache.revision >= revisions[-1]

            truth = await follower_store.load()
            assert dict(cache.records(Collection.NODES)) == dict(truth.nodes)
            assert dict(cache.records(Collection.TASKS)) == dict(truth.tasks)
            assert len(truth.nodes) == 110
            assert len(truth.tasks) == 200
            assert cache.get(Collection.NODES, "n-3") is None
            assert cache.get(Collection.NODES, "n-10") == _node("n-10-v2", leadership.term)
            assert cache.reloads == 0
        finally:
            await _cancel(following)


async def test_read_cache_reloads_when_the_history_it_needs_was_compacted(
    make_etcd: Callable[..., EtcdServer],
    make_etcd_client: MakeEtcdClient,
    make_proxy: Callable[[Endpoint], Awaitable[TcpProxy]],
) -> None:
    server = make_etcd()
    proxy = await make_proxy(server.endpoint)
    leader_client = await make_etcd_client(server.endpoint)
    cluster = _unique("compact")
    leader_store = EtcdStore(leader_client, cluster)
    async with (
        _client(proxy.endpoint, timeout_s=1.0) as follower_client,
        _elections(leader_client, prefix=election_prefix(cluster)) as (election,),
    ):
        async with asyncio.timeout(5):
            leadership = await election.campaign("leader")
        await leader_store.write(leadership.fence, [PutRecord(Collection.NODES, "n-1", b"v1")])
        cache = ReadCache(EtcdStore(follower_client, cluster, timeout_s=1.0), retry_interval_s=0.1)
        following = asyncio.create_task(cache.run())
        try:
            async with asyncio.timeout(5):
                await cache.wait_loaded()
            await proxy.cut()  # the follower's watch breaks; it cannot re-create it yet
            await leader_store.write(
                leadership.fence,
                [DeleteRecord(Collection.NODES, "n-1"), PutRecord(Collection.NODES, "n-2", b"v2")],
            )
            (last,) = await leader_store.write(
                leadership.fence, [PutRecord(Collection.TASKS, "t-1", b"t")]
            )
            await leader_client.compact(last, physical=True)
            await proxy.restore()

            async with asyncio.timeout(10):
                await cache.wait_for_revision(last)
            assert cache.reloads == 1, "the watch from the old revision was compacted: reload"
            assert dict(cache.records(Collection.NODES)) == {"n-2": b"v2"}
            assert dict(cache.records(Collection.TASKS)) == {"t-1": b"t"}

            # And it follows again after the reload.
            (after,) = await leader_store.write(
                leadership.fence, [DeleteRecord(Collection.TASKS, "t-1")]
            )
            async with asyncio.timeout(5):
                await cache.wait_for_revision(after)
            assert dict(cache.records(Collection.TASKS)) == {}
        finally:
            await _cancel(following)
