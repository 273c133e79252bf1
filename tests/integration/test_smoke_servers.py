"""Smoke tests: the server fixtures start real etcd / Redis and clients can use them.

Each wait is bounded with ``asyncio.timeout``; keys are unique per test because
the session servers are shared.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import aetcd
import pytest
import redis.asyncio

from lazarus_dev.localservers import (
    EtcdCluster,
    EtcdServer,
    RedisServer,
    ServerBinaryNotFoundError,
    redis_answers_ping,
)

MakeEtcdClient = Callable[..., Awaitable[aetcd.Client]]


def _key(label: str) -> bytes:
    return f"/lazarus-test/{label}/{uuid.uuid4().hex}".encode()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def _poll_until(check: Callable[[], Awaitable[bool]], interval_s: float = 0.05) -> None:
    """Await ``check()`` until it is true; the caller bounds the time."""
    while True:
        if await check():
            return
        await asyncio.sleep(interval_s)


async def _put_until_accepted(client: aetcd.Client, key: bytes, value: bytes) -> None:
    """Retry a put while the cluster elects a leader; the caller bounds the time."""
    while True:
        try:
            await client.put(key, value)
            return
        except aetcd.ClientError:
            await asyncio.sleep(0.1)


# ---------------------------------------------------------------- single etcd


async def test_etcd_put_get(etcd_client: aetcd.Client) -> None:
    key = _key("put-get")
    await etcd_client.put(key, b"value-1")

    got = await etcd_client.get(key)

    assert got is not None
    assert got.value == b"value-1"
    assert got.version == 1


async def test_etcd_key_under_lease_disappears_after_expiry(etcd_client: aetcd.Client) -> None:
    key = _key("lease")
    lease = await etcd_client.lease(1)
    assert lease.ttl == 1, "etcd raised the TTL: its election timeout is above 666 ms"
    await etcd_client.put(key, b"alive", lease=lease)
    attached_at = time.monotonic()
    assert await etcd_client.get(key) is not None

    async def gone() -> bool:
        return await etcd_client.get(key) is None

    async with asyncio.timeout(lease.ttl + 5):
        await _poll_until(gone)

    assert time.monotonic() - attached_at >= 0.75 * lease.ttl


async def test_etcd_watch_sees_put_and_delete(etcd_client: aetcd.Client) -> None:
    key = _key("watch")
    watch = await etcd_client.watch(key)  # returns once etcd has created the watcher
    events = aiter(watch)
    try:
        await etcd_client.put(key, b"seen")
        await etcd_client.delete(key)
        async with asyncio.timeout(10):
            put = await anext(events)
            deleted = await anext(events)
    finally:
        await watch.cancel()

    assert put.kind == aetcd.EventKind.PUT
    assert (put.kv.key, put.kv.value) == (key, b"seen")
    assert deleted.kind == aetcd.EventKind.DELETE
    assert deleted.kv.key == key


# ---------------------------------------------------------------- etcd cluster


async def test_etcd_cluster_write_through_one_member_read_through_others(
    etcd_cluster: EtcdCluster, make_etcd_client: MakeEtcdClient
) -> None:
    assert len(etcd_cluster.endpoints) == 3
    clients = [await make_etcd_client(ep) for ep in etcd_cluster.endpoints]
    key = _key("cluster")

    await clients[0].put(key, b"replicated")

    for client in clients[1:]:
        got = await client.get(key)  # linearizable read, served by another member
        assert got is not None
        assert got.value == b"replicated"


@pytest.mark.parametrize("fault", ["stop", "kill"])
async def test_etcd_cluster_keeps_quorum_without_its_leader_and_it_catches_up(
    fault: str,
    make_etcd_cluster: Callable[..., EtcdCluster],
    make_etcd_client: MakeEtcdClient,
) -> None:
    cluster = make_etcd_cluster(3)
    # Short deadlines: a put stuck on a member without a leader fails fast and is retried.
    clients = [await make_etcd_client(ep, timeout_s=1.0) for ep in cluster.endpoints]
    status = await clients[0].status()
    leader = cluster.member_index(status.leader.name)
    survivors = [i for i in range(3) if i != leader]
    key = _key(f"quorum-{fault}")
    await clients[leader].put(key, b"before")

    if fault == "stop":
        cluster.stop_member(leader)  # SIGTERM: etcd hands leadership over first
    else:
        cluster.kill_member(leader)  # SIGKILL: the survivors must elect a leader
    assert cluster.pids[leader] is None

    async with asyncio.timeout(20):
        await _put_until_accepted(clients[survivors[0]], key, b"during")
    got = await clients[survivors[1]].get(key)
    assert got is not None
    assert got.value == b"during"

    cluster.start_member(leader)  # same data dir and ports, cluster state "existing"
    rejoined = await make_etcd_client(cluster.members[leader].endpoint)

    async def caught_up() -> bool:
        # Serializable: answered from the rejoined member's own store, no quorum read.
        got = await rejoined.get(key, serializable=True)
        return got is not None and got.value == b"during"

    async with asyncio.timeout(20):
        await _poll_until(caught_up)


# ---------------------------------------------------------------- redis


async def test_redis_set_get_and_ttl(redis_client: redis.asyncio.Redis) -> None:
    key = f"lazarus-test:{{{uuid.uuid4().hex}}}"
    assert await redis_client.set(key + ":plain", b"value-1")
    assert await redis_client.get(key + ":plain") == b"value-1"

    assert await redis_client.set(key + ":ttl", b"short-lived", px=300)
    assert 0 < await redis_client.pttl(key + ":ttl") <= 300

    async def expired() -> bool:
        return await redis_client.exists(key + ":ttl") == 0

    async with asyncio.timeout(5):
        await _poll_until(expired)
    assert await redis_client.get(key + ":plain") == b"value-1"


async def test_redis_pause_resume_kill_restart(
    make_redis_server: Callable[..., RedisServer],
) -> None:
    server = make_redis_server()
    client = redis.asyncio.Redis(host=server.host, port=server.port, socket_timeout=5.0)
    try:
        assert await client.ping()

        server.pause()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await client.ping()
        server.resume()
        async with asyncio.timeout(5):
            assert await client.ping()
    finally:
        await client.aclose()

    pid, data_dir = server.pid, server.data_dir
    server.kill()
    assert not _pid_alive(pid)
    assert data_dir is not None
    assert data_dir.is_dir(), "kill() keeps the data directory"
    server.start()
    assert server.pid != pid
    assert redis_answers_ping(server.host, server.port, timeout_s=1.0)


# ---------------------------------------------------------------- process hygiene


@pytest.mark.parametrize("kind", ["etcd", "etcd_cluster", "redis"])
def test_stop_reaps_the_process_and_removes_the_temp_dir(
    kind: str,
    make_etcd: Callable[..., EtcdServer],
    make_etcd_cluster: Callable[..., EtcdCluster],
    make_redis_server: Callable[..., RedisServer],
) -> None:
    server: EtcdServer | EtcdCluster | RedisServer
    if kind == "etcd":
        server = make_etcd()
    elif kind == "etcd_cluster":
        server = make_etcd_cluster(3)
    else:
        server = make_redis_server()
    pids = [p for p in server.pids if p] if isinstance(server, EtcdCluster) else [server.pid]
    data_dir = server.data_dir
    assert data_dir is not None
    assert data_dir.is_dir()
    assert len(pids) == (3 if kind == "etcd_cluster" else 1)
    assert all(_pid_alive(pid) for pid in pids)

    server.stop()

    assert not any(_pid_alive(pid) for pid in pids), "stop() must reap every process"
    assert not Path(data_dir).exists(), "stop() must remove the temp dir it created"
    server.stop()  # idempotent


@pytest.mark.parametrize(
    ("server", "package"),
    [
        (EtcdServer(binary="lazarus-no-such-etcd"), "etcd-server"),
        (RedisServer(binary="lazarus-no-such-redis-server"), "redis-server"),
    ],
)
def test_missing_binary_names_the_debian_package(
    server: EtcdServer | RedisServer, package: str
) -> None:
    with pytest.raises(ServerBinaryNotFoundError, match=f"apt-get install -y {package}"):
        server.start()
    assert server.data_dir is None
