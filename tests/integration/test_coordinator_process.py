"""Three real ``lazarus coordinator`` processes on a 3-member etcd: election and failover.

Each process talks to a different etcd member. A probe is a node agent Session
(Hello): the leader answers Welcome, a follower NotLeader. Measured figures
are printed as ``MEASURED <what> <seconds>`` (run with ``-s``). Every process
is stopped by pid at teardown (SIGKILL if still alive).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from coordinator.etcd_store import election_prefix
from coordinator.members import list_members
from lazarus.v1 import agent_pb2, records_pb2
from lazarus_dev.localservers import free_loopback_ports

LEASE_TTL_S = 3
STARTUP_S = 30.0
LAZARUS = Path(sys.executable).parent / "lazarus"


@dataclass
class Replica:
    member_id: str
    address: str
    metrics_url: str
    process: subprocess.Popen[bytes]


Spawn = Callable[..., Replica]


@pytest.fixture
def spawn(etcd_cluster: Any, tmp_path: Path) -> Iterator[Spawn]:
    """Factory: ``spawn(cluster, member_index, *extra_args)`` -> a running Replica."""
    if not hasattr(etcd_cluster, "members"):
        pytest.skip("needs local etcd processes")
    started: list[Replica] = []

    def start(cluster: str, index: int, *extra: str) -> Replica:
        address, metrics = (f"127.0.0.1:{port}" for port in free_loopback_ports(2))
        log = (tmp_path / f"{cluster}-c{index}.log").open("wb")
        process = subprocess.Popen(
            [
                str(LAZARUS),
                "coordinator",
                "--cluster",
                cluster,
                "--member-id",
                f"c{index}",
                "--listen",
                address,
                "--etcd-endpoint",
                str(etcd_cluster.endpoints[index % len(etcd_cluster.endpoints)]),
                "--lease-ttl-s",
                str(LEASE_TTL_S),
                "--metrics-listen",
                metrics,
                "--auth",  # plaintext: these tests are about the process, test_security about auth
                "none",
                *extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        replica = Replica(f"c{index}", address, f"http://{metrics}/metrics", process)
        started.append(replica)
        return replica

    yield start
    for replica in started:
        if replica.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(replica.process.pid, signal.SIGCONT)
            os.kill(replica.process.pid, signal.SIGKILL)
        replica.process.wait(timeout=10)


async def _probe(address: str) -> str | None:
    """'leader' (Welcome), 'follower' (NotLeader) or None (no answer)."""
    async with grpc.aio.insecure_channel(address) as channel:
        call: Any = channel.stream_stream(
            "/lazarus.v1.AgentService/Session",
            request_serializer=agent_pb2.AgentMessage.SerializeToString,
            response_deserializer=agent_pb2.CoordinatorMessage.FromString,
        )()
        # Read while writing: a follower answers NotLeader and ends the call
        # without waiting for Hello, so a write-then-read probe would race it.
        reader = asyncio.ensure_future(call.read())
        try:
            async with asyncio.timeout(1.0):
                with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                    await call.write(
                        agent_pb2.AgentMessage(
                            hello=agent_pb2.Hello(
                                node_id=f"probe-{uuid.uuid4().hex[:6]}",
                                incarnation="i",
                                capacity=records_pb2.NodeCapacity(slots=1),
                            )
                        )
                    )
                reply = await reader
        except (grpc.aio.AioRpcError, TimeoutError, asyncio.InvalidStateError):
            return None
        finally:
            reader.cancel()
            call.cancel()
        if reply is grpc.aio.EOF:
            return None
        body = reply.WhichOneof("body")
        return {"welcome": "leader", "not_leader": "follower"}.get(body or "")


async def _roles(replicas: list[Replica]) -> list[str | None]:
    return list(await asyncio.gather(*(_probe(r.address) for r in replicas)))


async def _wait_for_leader(replicas: list[Replica], timeout_s: float) -> tuple[Replica, float]:
    started = time.monotonic()
    async with asyncio.timeout(timeout_s):
        while True:
            roles = await _roles(replicas)
            leaders = [r for r, role in zip(replicas, roles, strict=True) if role == "leader"]
            if leaders:
                assert len(leaders) == 1, roles
                return leaders[0], time.monotonic() - started
            await asyncio.sleep(0.05)


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url, timeout=2) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
    raise AssertionError(f"{name} missing")


async def _elect_listen_shows(etcd_cluster: Any, cluster: str, address: str) -> None:
    process = await asyncio.create_subprocess_exec(
        "etcdctl",
        f"--endpoints={','.join(etcd_cluster.client_urls)}",
        "elect",
        "--listen",
        election_prefix(cluster),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(5.0):
            while True:
                line = (await process.stdout.readline()).decode().strip()
                assert line, "etcdctl elect --listen ended"
                if line == address:
                    return
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        await process.wait()


def _cluster() -> str:
    return f"proc-{uuid.uuid4().hex[:10]}"


async def _members_become(client: Any, cluster: str, expected: list[str], within_s: float) -> float:
    """Wait until the member records list ``expected`` (leader first); seconds waited."""
    started = time.monotonic()
    seen: list[str] = []
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(within_s):
            while True:
                members = await list_members(client, cluster, election_prefix(cluster))
                seen = [m.member_id for m in members]
                if seen[:1] == expected[:1] and sorted(seen) == sorted(expected):
                    assert members[0].role == records_pb2.MEMBER_ROLE_LEADER
                    return time.monotonic() - started
                await asyncio.sleep(0.1)
    raise AssertionError(f"members {seen}, want {expected} (leader first) within {within_s} s")


async def test_three_processes_one_leader_and_failover(
    spawn: Spawn, etcd_cluster: Any, make_etcd_client: Any
) -> None:
    cluster = _cluster()
    client = await make_etcd_client(etcd_cluster.endpoints[0])
    all_replicas = [spawn(cluster, i) for i in range(3)]
    async with asyncio.timeout(STARTUP_S):
        while None in await _roles(all_replicas):
            await asyncio.sleep(0.1)
    leader, _ = await _wait_for_leader(all_replicas, 10.0)
    roles = await _roles(all_replicas)
    assert sorted(r or "" for r in roles) == ["follower", "follower", "leader"]
    flags = [
        await asyncio.to_thread(_metric, r.metrics_url, "lazarus_is_leader") for r in all_replicas
    ]
    assert sum(flags) == 1
    await _elect_listen_shows(etcd_cluster, cluster, leader.address)
    followers = sorted(r.member_id for r in all_replicas if r is not leader)
    await _members_become(client, cluster, [leader.member_id, *followers], 5.0)

    # SIGKILL: the lease must expire before another replica leads.
    os.kill(leader.process.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    rest = [r for r in all_replicas if r is not leader]
    second, _ = await _wait_for_leader(rest, LEASE_TTL_S + 5.0)
    after_kill_s = time.monotonic() - killed_at
    print(f"MEASURED sigkill_failover_s {after_kill_s:.3f}")
    assert after_kill_s <= LEASE_TTL_S + 1.0
    await _elect_listen_shows(etcd_cluster, cluster, second.address)
    # The killed replica's member record went with its lease.
    survivors = [second.member_id] + [r.member_id for r in rest if r is not second]
    await _members_become(client, cluster, survivors, 5.0)

    # SIGTERM: the leader resigns at once.
    os.kill(second.process.pid, signal.SIGTERM)
    termed_at = time.monotonic()
    last = [r for r in rest if r is not second]
    third, _ = await _wait_for_leader(last, 5.0)
    after_term_s = time.monotonic() - termed_at
    print(f"MEASURED sigterm_failover_s {after_term_s:.3f}")
    assert after_term_s <= 1.0
    assert third is last[0]
    code = await asyncio.to_thread(second.process.wait, 5)
    assert code == 0
    # A clean stop withdraws its record at once (no lease TTL to wait for).
    withdrawn_s = await _members_become(client, cluster, [third.member_id], 2.0)
    print(f"MEASURED member_record_withdrawn_s {withdrawn_s:.3f}")
    seen = await asyncio.to_thread(_metric, third.metrics_url, "lazarus_leader_changes_total")
    assert seen >= 3
    assert await asyncio.to_thread(_metric, third.metrics_url, "lazarus_is_leader") == 1


async def test_stopped_leader_is_fenced_after_it_resumes(
    spawn: Spawn, etcd_cluster: Any, make_etcd_client: Any
) -> None:
    """SIGSTOP the leader past its lease, another leads, SIGCONT: no old-term write lands.

    "After the new term began" is the etcd revision read once the new leader
    serves, not its term: a term is the create revision of the candidacy,
    which may predate the old leader's last writes.
    """
    cluster = _cluster()
    fast = ("--heartbeat-interval-s", "0.3", "--dead-after-s", "1.5", "--fence-after-s", "0.9")
    old = spawn(cluster, 0, *fast)
    async with asyncio.timeout(STARTUP_S):
        while await _probe(old.address) != "leader":
            await asyncio.sleep(0.1)
    new = spawn(cluster, 1, *fast)
    async with asyncio.timeout(STARTUP_S):
        while await _probe(new.address) != "follower":
            await asyncio.sleep(0.1)
    old_term = await asyncio.to_thread(_metric, old.metrics_url, "lazarus_term")
    # A node whose silence the old leader will judge (and try to persist) once it resumes.
    async with grpc.aio.insecure_channel(old.address) as channel:
        call: Any = channel.stream_stream(
            "/lazarus.v1.AgentService/Session",
            request_serializer=agent_pb2.AgentMessage.SerializeToString,
            response_deserializer=agent_pb2.CoordinatorMessage.FromString,
        )()
        await call.write(
            agent_pb2.AgentMessage(
                hello=agent_pb2.Hello(
                    node_id="n-zombie", incarnation="i", capacity=records_pb2.NodeCapacity(slots=1)
                )
            )
        )
        async with asyncio.timeout(2):
            assert (await call.read()).WhichOneof("body") == "welcome"
        client = await make_etcd_client(etcd_cluster.endpoints[0])
        os.kill(old.process.pid, signal.SIGSTOP)
        try:
            leader, _ = await _wait_for_leader([new], LEASE_TTL_S + 5.0)
            assert leader is new
            began = (await client.get_prefix(f"/lazarus/{cluster}/".encode())).header.revision
        finally:
            os.kill(old.process.pid, signal.SIGCONT)
        call.cancel()
    new_term = await asyncio.to_thread(_metric, new.metrics_url, "lazarus_term")
    assert new_term > old_term
    async with asyncio.timeout(5.0):
        while await asyncio.to_thread(_metric, old.metrics_url, "lazarus_is_leader") != 0:
            await asyncio.sleep(0.05)
    assert await _probe(old.address) == "follower"
    await asyncio.sleep(0.5)  # anything the old leader still tried has happened by now
    late = []
    for kv in await client.get_prefix(f"/lazarus/{cluster}/nodes/".encode()):
        record = records_pb2.NodeRecord.FromString(kv.value)
        if kv.mod_revision > began and record.written_term == int(old_term):
            late.append(record.node_id)
    for kv in await client.get_prefix(f"/lazarus/{cluster}/tasks/".encode()):
        task = records_pb2.TaskRecord.FromString(kv.value)
        if kv.mod_revision > began and task.written_term == int(old_term):
            late.append(task.task_id)
    assert late == []
