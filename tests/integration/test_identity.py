"""Issue [identity] acceptance: one owner per task, even with two processes under one node id.

Real etcd, Redis, a coordinator and ``lazarus node-agent`` processes; faults are
real signals. Every check reads the tasks' own side effects — a Redis list the
test owns, where each step start and each completion is logged with the pid
and epoch before its work (``tests/integration/identity_apps.py``) — never
only the coordinator's bookkeeping.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from lazarus.v1 import records_pb2
from lazarus_dev.devcluster import LocalCluster

pytestmark = pytest.mark.integration

APP = "tests.integration.identity_apps:agent"
REPO = Path(__file__).resolve().parents[2]
DONE = (records_pb2.TASK_STATE_COMPLETED, records_pb2.TASK_STATE_FAILED)
MakeCluster = Callable[..., LocalCluster]


@pytest.fixture
async def make_cluster(tmp_path: Path) -> AsyncIterator[MakeCluster]:
    clusters: list[LocalCluster] = []

    def make(**kwargs: Any) -> LocalCluster:
        cluster = LocalCluster(
            tmp_path / f"run{len(clusters)}",
            cluster=f"id-{uuid.uuid4().hex[:8]}",
            etcd_members=1,
            env={"PYTHONPATH": str(REPO)},
            **kwargs,
        )
        clusters.append(cluster)
        cluster.start()
        return cluster

    yield make
    for cluster in clusters:
        await asyncio.to_thread(cluster.stop)


async def _submit(cluster: LocalCluster, n: int, steps: int, step_ms: float, key: str) -> set[str]:
    ids = set()
    for i in range(n):
        payload = {
            "steps": steps,
            "step_ms": step_ms,
            "log_key": key,
            "redis_url": cluster.redis_url,
        }
        record = await cluster.submit(f"{key}-{i}", "steplog", json.dumps(payload).encode())
        ids.add(record.task_id)
    return ids


async def _wait_done(
    cluster: LocalCluster, ids: set[str], timeout_s: float
) -> dict[str, records_pb2.TaskRecord]:
    deadline = time.monotonic() + timeout_s
    while True:
        tasks = {t.task_id: t for t in await cluster.list_tasks() if t.task_id in ids}
        if len(tasks) == len(ids) and all(t.state in DONE for t in tasks.values()):
            return tasks
        if time.monotonic() > deadline:
            states = {k: records_pb2.TaskState.Name(t.state) for k, t in tasks.items()}
            raise AssertionError(f"not done in {timeout_s} s: {states}")
        await asyncio.sleep(0.25)


async def _wait_running(cluster: LocalCluster, ids: set[str], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        tasks = [t for t in await cluster.list_tasks() if t.task_id in ids]
        if len(tasks) == len(ids) and all(t.state == records_pb2.TASK_STATE_RUNNING for t in tasks):
            return
        await asyncio.sleep(0.1)
    raise AssertionError("tasks never all RUNNING")


def _side_effects(cluster: LocalCluster, key: str) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(cluster.redis_url)
    try:
        return [json.loads(raw) for raw in client.lrange(key, 0, -1)]
    finally:
        client.close()


def check_one_owner(log: list[dict[str, Any]], ids: set[str]) -> dict[str, Any]:
    """The invariants of DESIGN.md §4, read from the tasks' own side effects.

    Returns figures; raises AssertionError naming the first violation.
    """
    by_task: dict[str, list[dict[str, Any]]] = {t: [] for t in ids}
    for entry in sorted(log, key=lambda e: e["t"]):
        by_task[entry["task"]].append(entry)
    epochs_seen: dict[str, list[int]] = {}
    for task_id, entries in by_task.items():
        pids: dict[int, set[int]] = {}
        newest = 0
        for e in entries:
            pids.setdefault(e["epoch"], set()).add(e["pid"])
            assert e["epoch"] >= newest, f"{task_id}: epoch {e['epoch']} after {newest}: {e}"
            newest = e["epoch"]
        two = {epoch: p for epoch, p in pids.items() if len(p) > 1}
        assert not two, f"{task_id}: two processes at one epoch: {two}"
        completions = [e for e in entries if e["what"] == "completed"]
        assert len(completions) == 1, f"{task_id}: completion executed {len(completions)} times"
        epochs_seen[task_id] = sorted(pids)
    return {"epochs": epochs_seen, "entries": len(log)}


def _metric(url: str, name: str) -> float:
    body = urllib.request.urlopen(url, timeout=5).read().decode()
    total = 0.0
    for line in body.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_a_second_live_process_under_one_node_id_is_refused_and_runs_nothing(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(coordinators=1, agents=1, agent_args=["--app", APP, "--slots", "4"])
    await cluster.ready(30)
    key = f"effects-{uuid.uuid4().hex[:6]}"
    ids = await _submit(cluster, 4, steps=60, step_ms=50, key=key)
    await _wait_running(cluster, ids)
    # The operator's mistake: the same --node-id, another data dir.
    second = cluster.add_agent("--node-id", "agent-0", "--data-dir", str(cluster.run_dir / "dup"))
    tasks = await _wait_done(cluster, ids, timeout_s=60)
    assert all(t.state == records_pb2.TASK_STATE_COMPLETED for t in tasks.values())
    figures = check_one_owner(_side_effects(cluster, key), ids)
    pids = {e["pid"] for e in _side_effects(cluster, key)}
    assert pids == {cluster.agents[0].pid}, "the refused process ran a step"
    assert all(epochs == [1] for epochs in figures["epochs"].values())
    log = second.log_path.read_text(errors="replace")
    assert "held by another live process" in log
    assert "is --node-id unique?" in log
    conflicts = _metric(cluster.coordinator_metrics[0], "lazarus_identity_conflicts_total")
    assert conflicts >= 1
    events = cluster.coordinators[0].log_path.read_text(errors="replace")
    assert "IdentityConflict(node_id='agent-0'" in events
    assert second.alive
    assert cluster.agents[0].alive
    print(
        f"\nduplicate node id: {figures['entries']} side effects, one pid per epoch; "
        f"{conflicts:.0f} refusals counted"
    )


async def test_a_cut_off_owner_is_replaced_once_and_never_acts_after_the_new_epoch(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(coordinators=1, agents=1, agent_args=["--app", APP, "--slots", "4"])
    await cluster.ready(30)
    key = f"effects-{uuid.uuid4().hex[:6]}"
    ids = await _submit(cluster, 4, steps=160, step_ms=100, key=key)
    await _wait_running(cluster, ids)
    await asyncio.sleep(1.0)
    first = cluster.agents[0]
    first.pause()  # SIGSTOP: cut off, not dead
    t_stop = time.time()
    second = cluster.add_agent("--node-id", "agent-0", "--data-dir", str(cluster.run_dir / "dup"))
    await asyncio.sleep(10.0)
    first.resume()  # SIGCONT: it must find itself fenced and refused
    tasks = await _wait_done(cluster, ids, timeout_s=60)
    assert all(t.state == records_pb2.TASK_STATE_COMPLETED for t in tasks.values())
    log = _side_effects(cluster, key)
    figures = check_one_owner(log, ids)
    assert all(epochs == [1, 2] for epochs in figures["epochs"].values()), figures
    for task_id in ids:
        entries = sorted((e for e in log if e["task"] == task_id), key=lambda e: e["t"])
        first_new = min(e["t"] for e in entries if e["epoch"] == 2)
        late = [e for e in entries if e["epoch"] == 1 and e["t"] >= first_new]
        assert not late, f"{task_id}: old epoch acted after the new one started: {late}"
        assert {e["pid"] for e in entries if e["epoch"] == 2} == {second.pid}
        assert max(e["t"] for e in entries if e["epoch"] == 1) < t_stop + 0.5
    assert "held by another live process" in first.log_path.read_text(errors="replace")
    print(f"\ncut-off owner: moved once (epochs 1 -> 2), {figures['entries']} side effects")
