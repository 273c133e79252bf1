"""Issue [reconcile] acceptance: shared CRDT documents across a real network partition.

Setup: etcd, Redis, one coordinator (listening on the host side of a veth,
198.18.0.17) and five node agents running ``tests.integration.shared_apps``:
three on the host, two together in a network namespace (198.18.0.18) that
reaches the coordinator and Redis only through the veth.

Who writes during the partition, and why that is honest: every agent runs
the app's ``producer`` *service* (``Agent.service``), an agent-level writer
not tied to task ownership, plus ``shared-writer`` *tasks*. When the veth
goes down the two namespaced agents self-fence after ~2 s: their tasks stop
(ops after the fence raise ``TaskCancelled`` and are not acknowledged, so
they are not in the ground truth) and the leader moves those tasks to the
host side, where they keep writing. The namespaced agents' producers keep
writing to their local replicas for the whole 10 s cut: shared documents are
available under partition (DESIGN.md §3), and those writes are exactly the
divergence the heal must reconcile. Every operation whose call returned —
durable in the agent's ``shared.sqlite3`` — is appended to the agent's
``acked.jsonl``: the ground truth.

Writers stop at the heal (a stop file); the test measures heal -> every
replica (the five agents' and the canonical one in Redis) reports the same
state vectors, then stops the agents, reads their ``shared.sqlite3`` files
and the canonical replicas, and checks every value equals the value computed
from the ground truth: nothing lost, nothing doubled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from coordinator.documents import decode_record
from lazarus.storage.keys import document_key
from lazarus_dev.devcluster import LocalCluster
from node_agent.shared import read_replicas
from reconcile.documents import Document, decode_document

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
HOST_IP, NS_IP = "198.18.0.17", "198.18.0.18"
DOC_IDS = ("shared/config", "shared/counter", "shared/events", "shared/members")
CUT_S = 10.0
CONVERGE_LIMIT_S = 20.0


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def shared_netns() -> Iterator[tuple[str, str]]:
    """A namespace ``lzsd-<pid>`` joined to the host by a veth pair in 198.18.0.16/30."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (CI runs as root)")
    try:
        subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, timeout=10)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"network namespaces are not available here: {exc}")
    name = f"lzsd-{os.getpid()}"
    host_if, ns_if = f"lzsh{os.getpid() % 100000}", f"lzsn{os.getpid() % 100000}"
    with contextlib.suppress(subprocess.CalledProcessError):
        _ip("netns", "del", name)
    with contextlib.suppress(subprocess.CalledProcessError):
        _ip("link", "del", host_if)
    _ip("netns", "add", name)
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _ip("link", "set", ns_if, "netns", name)
        _ip("addr", "add", f"{HOST_IP}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("-n", name, "addr", "add", f"{NS_IP}/30", "dev", ns_if)
        _ip("-n", name, "link", "set", ns_if, "up")
        _ip("-n", name, "link", "set", "lo", "up")
        yield name, host_if
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", host_if)
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("netns", "del", name)


# ---- ground truth -------------------------------------------------------------------------


def _acked(run_dir: Path, nodes: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for node in nodes:
        path = run_dir / node / "acked.jsonl"
        if path.exists():
            out.extend(json.loads(line) for line in path.read_text().splitlines() if line)
    return out


def _expected(acked: list[dict[str, Any]]) -> dict[str, Any]:
    """Each document's value computed from the acknowledged operations alone."""
    counter = 0
    added: set[str] = set()
    removed: set[str] = set()
    winners: dict[str, tuple[tuple[int, int, str, int], str]] = {}
    events: list[str] = []
    for op in acked:
        if op["doc"] == "counter":
            counter += op["arg"] if op["op"] == "increment" else -op["arg"]
        elif op["doc"] == "members":
            (added if op["op"] == "add" else removed).add(op["arg"])
        elif op["doc"] == "config":
            key, value = op["arg"]
            stamp = (op["at"][0], op["at"][1], op["replica"], op["seq"])
            if key not in winners or winners[key][0] < stamp:
                winners[key] = (stamp, value)
        else:
            events.append(op["arg"])
    return {
        "shared/counter": counter,
        "shared/members": sorted(added - removed),
        "shared/config": {k: v for k, (_, v) in sorted(winners.items())},
        "shared/events": events,
    }


def _value(doc: Document) -> Any:
    value = doc.value()
    return sorted(value) if doc.kind == "or-set" else value


# ---- reading replicas ------------------------------------------------------------------------


def _canonical(client: redis.Redis) -> dict[str, Document]:
    out = {}
    for doc_id in DOC_IDS:
        data = client.get(document_key(doc_id))
        if data is not None:
            record = decode_record(bytes(data))  # type: ignore[arg-type]
            out[doc_id] = decode_document(bytes(record.state))
    return out


def _status(run_dir: Path, node: str) -> dict[str, dict[str, int]]:
    with contextlib.suppress(OSError, ValueError):
        return json.loads((run_dir / node / "shared-status.json").read_text())  # type: ignore[no-any-return]
    return {}


def _converged(run_dir: Path, nodes: list[str], client: redis.Redis) -> bool:
    canonical = _canonical(client)
    if sorted(canonical) != sorted(DOC_IDS):
        return False
    want = {d: canonical[d].state_vector().as_dict() for d in DOC_IDS}
    return all(_status(run_dir, node) == want for node in nodes)


def _partitionable_cluster(tmp_path: Path, prefix: str) -> LocalCluster:
    """One coordinator and the stores on HOST_IP (reachable from the namespace), no agents."""
    return LocalCluster(
        tmp_path / "run",
        coordinators=1,
        agents=0,
        cluster=f"{prefix}-{uuid.uuid4().hex[:8]}",
        etcd_members=1,
        agent_args=["--app", "tests.integration.shared_apps:agent"],
        env={"PYTHONPATH": str(REPO)},
        listen_host=HOST_IP,
        redis_bind=[HOST_IP],
    )


# ---- the test --------------------------------------------------------------------------------


async def test_shared_documents_converge_after_a_real_partition_to_the_ground_truth(
    tmp_path: Path, shared_netns: tuple[str, str]
) -> None:
    started = time.monotonic()
    ns, host_if = shared_netns
    cluster = _partitionable_cluster(tmp_path, "sd")
    run_dir = cluster.run_dir
    try:
        cluster.start_stores()
        cluster.coordinator_args += ["--redis-url", cluster.redis_url]
        cluster.add_coordinator()
        for _ in range(3):
            cluster.add_agent()
        for _ in range(2):
            cluster.add_agent(wrapper=["ip", "netns", "exec", ns], redis_host=HOST_IP)
        nodes = [f"agent-{i}" for i in range(5)]
        await cluster.ready(30)
        payload = json.dumps({"run_dir": str(run_dir)}).encode()
        for i in range(5):
            await cluster.submit(f"writer-{i}", "shared-writer", payload)
        client = redis.Redis.from_url(cluster.redis_url)
        await asyncio.sleep(3.0)  # everyone writes, connected

        cut_at = time.monotonic()
        _ip("link", "set", host_if, "down")
        try:
            await asyncio.sleep(CUT_S)  # both sides keep writing
        finally:
            _ip("link", "set", host_if, "up")
        healed_at = time.monotonic()
        (run_dir / "stop-writers").touch()

        converged_s = -1.0
        while time.monotonic() - healed_at < CONVERGE_LIMIT_S:
            if await asyncio.to_thread(_converged, run_dir, nodes, client):
                converged_s = time.monotonic() - healed_at
                break
            await asyncio.sleep(0.05)
        assert converged_s >= 0, (
            f"not converged {CONVERGE_LIMIT_S} s after the heal:\n"
            + "\n".join(f"{n}: {_status(run_dir, n)}" for n in nodes)
            + f"\ncanonical: { {d: c.state_vector() for d, c in _canonical(client).items()} }\n"
            + "\n".join(c.log_tail(20) for c in [*cluster.agents, *cluster.coordinators])
        )
        canonical = _canonical(client)
        client.close()
        for child in cluster.agents:  # stop the agents, then read their files
            child.terminate(10.0)
        replicas = {node: read_replicas(run_dir / node) for node in nodes}
    finally:
        await asyncio.to_thread(cluster.stop)

    acked = _acked(run_dir, nodes)
    expected = _expected(acked)
    ns_ops = [op for op in acked if op["replica"].split("~")[0] in ("agent-3", "agent-4")]
    assert ns_ops, "the namespaced agents acknowledged operations"
    for doc_id in DOC_IDS:
        value = _value(canonical[doc_id])
        if doc_id == "shared/events":  # nothing lost, nothing doubled; each writer's order kept
            assert sorted(value) == sorted(expected[doc_id]), doc_id
            assert len(set(value)) == len(value), "an event appears twice"
            for writer in {item.rsplit(":", 1)[0] for item in value}:
                mine = [x for x in value if x.rsplit(":", 1)[0] == writer]
                assert mine == [x for x in expected[doc_id] if x.rsplit(":", 1)[0] == writer]
        else:
            assert value == expected[doc_id], doc_id
        for node, docs in replicas.items():
            assert docs[doc_id].state_vector() == canonical[doc_id].state_vector(), (node, doc_id)
            assert _value(docs[doc_id]) == value, (node, doc_id)
    reconciles = []
    for line in (run_dir / "coordinator-0.log").read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            fields = entry.get("fields", {})
            if fields.get("event") == "reconcile_completed":
                reconciles.append(fields)
    healed = [r for r in reconciles if r["trigger"] == "NODE_RECONNECTED"]
    assert healed, "the heal started reconcile sessions"
    assert all(r["converged"] for r in healed), healed
    total_s = time.monotonic() - started
    print(
        f"\nshared documents, real partition: {len(acked)} acknowledged ops "
        f"({len(ns_ops)} by the 2 cut-off agents), cut {CUT_S:.0f} s at "
        f"{cut_at - started:.1f} s; converged {converged_s:.2f} s after the heal "
        f"(all 5 agents + canonical equal state vectors); reconcile sessions: "
        + ", ".join(
            f"{','.join(r['nodes'])} {r['seconds']:.2f}s deltas={r['deltas']} "
            f"conflicts={r['conflicts']}"
            for r in healed
        )
        + f"; test {total_s:.1f} s"
    )
    assert total_s < 90, f"the test took {total_s:.1f} s"


async def test_a_new_leader_loads_the_canonical_documents_and_reconciles_every_node(
    tmp_path: Path,
) -> None:
    """Leader change: SIGKILL the leader while three agents write; the next
    leader loads the canonical replicas from Redis, starts a LEADER_CHANGED
    reconcile session per node, and every replica converges to the ground truth."""
    started = time.monotonic()
    cluster = LocalCluster(
        tmp_path / "run",
        coordinators=2,
        agents=0,
        cluster=f"sdl-{uuid.uuid4().hex[:8]}",
        etcd_members=1,
        agent_args=["--app", "tests.integration.shared_apps:agent"],
        env={"PYTHONPATH": str(REPO)},
    )
    run_dir = cluster.run_dir
    nodes = [f"agent-{i}" for i in range(3)]
    try:
        cluster.start_stores()
        cluster.coordinator_args += ["--redis-url", cluster.redis_url]
        for _ in range(2):
            cluster.add_coordinator()
        for _ in nodes:
            cluster.add_agent()
        await cluster.ready(30)
        client = redis.Redis.from_url(cluster.redis_url)
        await asyncio.sleep(3.0)
        index, _ = await cluster.leader()
        old = cluster.coordinators[index]
        killed_at = time.monotonic()
        old.kill()
        await asyncio.sleep(1.0)
        new_index, _ = await cluster.leader()
        assert new_index != index
        await asyncio.sleep(2.0)  # writers keep going through the failover
        (run_dir / "stop-writers").touch()
        stopped_at = time.monotonic()
        converged_s = -1.0
        while time.monotonic() - stopped_at < CONVERGE_LIMIT_S:
            if await asyncio.to_thread(_converged, run_dir, nodes, client):
                converged_s = time.monotonic() - stopped_at
                break
            await asyncio.sleep(0.05)
        assert converged_s >= 0, "\n".join(
            c.log_tail(30) for c in [*cluster.agents, cluster.coordinators[new_index]]
        )
        canonical = _canonical(client)
        client.close()
        for child in cluster.agents:
            child.terminate(10.0)
        replicas = {node: read_replicas(run_dir / node) for node in nodes}
    finally:
        await asyncio.to_thread(cluster.stop)

    expected = _expected(_acked(run_dir, nodes))
    for doc_id in DOC_IDS:
        value = _value(canonical[doc_id])
        if doc_id == "shared/events":
            assert sorted(value) == sorted(expected[doc_id])
        else:
            assert value == expected[doc_id], doc_id
        for node, docs in replicas.items():
            assert _value(docs[doc_id]) == value, (node, doc_id)
    log = (run_dir / f"coordinator-{new_index}.log").read_text(errors="replace")
    loaded = [line for line in log.splitlines() if "canonical replica(s) loaded" in line]
    assert loaded, "the new leader loaded the canonical replicas"
    assert " 0 canonical" not in loaded[-1], loaded[-1]
    sessions = []
    for line in log.splitlines():
        with contextlib.suppress(ValueError):
            fields = json.loads(line).get("fields", {})
            if fields.get("event") == "reconcile_completed":
                sessions.append(fields)
    after_change = [s for s in sessions if s["trigger"] == "LEADER_CHANGED"]
    assert sorted(n for s in after_change for n in s["nodes"]) == nodes, sessions
    assert all(s["converged"] for s in after_change), after_change
    print(
        f"\nshared documents, leader change: leader killed at {killed_at - started:.1f} s; "
        f"{json.loads(loaded[-1])['msg']}; LEADER_CHANGED sessions "
        + ", ".join(f"{','.join(s['nodes'])} {s['seconds']:.2f}s" for s in after_change)
        + f"; converged {converged_s:.2f} s after the writers stopped; "
        f"test {time.monotonic() - started:.1f} s"
    )


async def test_a_zombies_crdt_task_state_merges_into_the_current_owners_state(
    tmp_path: Path, shared_netns: tuple[str, str]
) -> None:
    """Item 3: a task declares its state a CRDT document (``ctx.crdt_state``).

    The task starts on the namespaced agent; the veth goes down; the agent
    keeps bumping the counter until it self-fences (its acknowledged
    increments at epoch 1 after the cut are the zombie's divergent lineage),
    the leader moves the task to the host agent (epoch 2), which resumes from
    the canonical state and keeps bumping. After the heal the zombie is
    revoked and its replica merges: the final state equals every acknowledged
    increment of both owners — nothing kept aside as an unmerged fork.
    """
    ns, host_if = shared_netns
    cluster = _partitionable_cluster(tmp_path, "sdz")
    run_dir = cluster.run_dir
    nodes = ["agent-0", "agent-1"]
    try:
        cluster.start_stores()
        cluster.coordinator_args += ["--redis-url", cluster.redis_url]
        cluster.add_coordinator()
        cluster.add_agent(wrapper=["ip", "netns", "exec", ns], redis_host=HOST_IP)
        await cluster.ready(30)
        payload = json.dumps({"run_dir": str(run_dir)}).encode()
        record = await cluster.submit("crdt-0", "crdt-counter", payload)
        doc_id = f"task/{record.task_id}"
        await asyncio.sleep(2.0)
        cluster.add_agent()  # the host side, to take the task over
        await asyncio.sleep(2.0)
        cut_ms = time.time_ns() // 10**6
        _ip("link", "set", host_if, "down")
        try:
            await asyncio.sleep(8.0)
        finally:
            _ip("link", "set", host_if, "up")
        await asyncio.sleep(3.0)  # the zombie reconnects, is revoked, its replica merges
        (run_dir / "stop-writers").touch()
        client = redis.Redis.from_url(cluster.redis_url)
        want = -1
        value: Any = None
        deadline = time.monotonic() + CONVERGE_LIMIT_S
        while time.monotonic() < deadline:
            await asyncio.sleep(0.3)
            want = sum(1 for op in _acked(run_dir, nodes) if op["doc"] == doc_id)
            data = client.get(document_key(doc_id))
            if data is not None:
                value = decode_document(bytes(decode_record(bytes(data)).state)).value()  # type: ignore[arg-type]
                if value == want:
                    break
        client.close()
        zombie_log_path = run_dir / "agent-0.log"
        deadline = time.monotonic() + 15.0  # the zombie's revoke can come after convergence
        while time.monotonic() < deadline:
            if "crdt_state_merged" in zombie_log_path.read_text(errors="replace"):
                break
            await asyncio.sleep(0.3)
        for child in cluster.agents:
            child.terminate(10.0)
        owner = read_replicas(run_dir / "agent-1").get(doc_id)
        owner_log = (run_dir / "agent-1.log").read_text(errors="replace")
        zombie_log = (run_dir / "agent-0.log").read_text(errors="replace")
    finally:
        await asyncio.to_thread(cluster.stop)

    acked = [op for op in _acked(run_dir, nodes) if op["doc"] == doc_id]
    zombie_after_cut = [op for op in acked if op["epoch"] == 1 and op["wall_ms"] > cut_ms + 100]
    later = [op for op in acked if op["epoch"] >= 2]
    assert zombie_after_cut, "the zombie acknowledged increments after the cut"
    assert later, "the new owner kept working"
    assert value == len(acked), (value, len(acked))
    if owner is None:  # the task finished: its document went once Redis held all of it
        assert f"shared document {doc_id} dropped" in owner_log
    else:
        assert owner.value() == len(acked), "the current owner holds the merged state"
    assert "crdt_state_merged" in zombie_log
    print(
        f"\nzombie CRDT task state: {len(acked)} acknowledged increments, "
        f"{len(zombie_after_cut)} by the zombie after the cut, {len(later)} by the new "
        f"owner; merged state = {value}"
    )
