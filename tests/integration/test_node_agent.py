"""Issue [node-agent] acceptance: real etcd, Redis, coordinator and node agent processes.

Every test builds its own ``LocalCluster`` under ``tmp_path`` and stops it
(by pid) at the end; the self-fence test also creates and deletes its own
network namespace. Figures are printed (``-s``) for the closing note.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from lazarus.v1 import records_pb2
from lazarus_dev.devcluster import ChildProcess, LocalCluster
from node_agent import demo_app
from node_agent.checkpoint import CheckpointStore

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DONE = (records_pb2.TASK_STATE_COMPLETED, records_pb2.TASK_STATE_FAILED)

MakeCluster = Callable[..., LocalCluster]


@pytest.fixture
async def make_cluster(tmp_path: Path) -> AsyncIterator[MakeCluster]:
    """Factory: ``make_cluster(**LocalCluster kwargs)`` -> a started cluster, ready."""
    clusters: list[LocalCluster] = []

    def make(**kwargs: Any) -> LocalCluster:
        run_dir = tmp_path / f"run{len(clusters)}"
        cluster = LocalCluster(
            run_dir, cluster=f"na-{uuid.uuid4().hex[:8]}", etcd_members=1, **kwargs
        )
        clusters.append(cluster)
        cluster.start()
        return cluster

    yield make
    for cluster in clusters:
        await asyncio.to_thread(cluster.stop)


def _json_lines(child: ChildProcess) -> list[dict[str, Any]]:
    out = []
    for line in child.log_path.read_text(errors="replace").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            out.append(json.loads(line))
    return out


async def _submit_textstats(
    cluster: LocalCluster, payloads: list[dict[str, Any]], **spec: Any
) -> dict[str, dict[str, Any]]:
    by_id: dict[str, dict[str, Any]] = {}
    for i, payload in enumerate(payloads):
        record = await cluster.submit(f"req-{i}", "textstats", json.dumps(payload).encode(), **spec)
        by_id[record.task_id] = payload
    return by_id


async def _wait_done(
    cluster: LocalCluster, task_ids: set[str], timeout_s: float
) -> dict[str, records_pb2.TaskRecord]:
    deadline = time.monotonic() + timeout_s
    while True:
        tasks = {t.task_id: t for t in await cluster.list_tasks() if t.task_id in task_ids}
        if len(tasks) == len(task_ids) and all(t.state in DONE for t in tasks.values()):
            return tasks
        if time.monotonic() > deadline:
            states: dict[str, int] = {}
            for t in tasks.values():
                name = records_pb2.TaskState.Name(t.state)
                states[name] = states.get(name, 0) + 1
            tails = "\n".join(c.log_tail(15) for c in [*cluster.agents, *cluster.coordinators])
            raise AssertionError(f"tasks not done after {timeout_s} s: {states}\n{tails}")
        await asyncio.sleep(0.5)


def _check_results(
    tasks: dict[str, records_pb2.TaskRecord], payloads: dict[str, dict[str, Any]]
) -> None:
    for task_id, task in tasks.items():
        assert task.state == records_pb2.TASK_STATE_COMPLETED, (
            task_id,
            task.last_error.message,
        )
        assert json.loads(task.result.payload) == demo_app.direct_result(payloads[task_id])


def _completions(cluster: LocalCluster) -> dict[str, int]:
    """TaskCompleted events per task, from every coordinator's log."""
    counts: dict[str, int] = {}
    for child in cluster.coordinators:
        for line in _json_lines(child):
            msg = str(line.get("msg", ""))
            if "TaskCompleted(task_id='" in msg:
                task_id = msg.split("TaskCompleted(task_id='", 1)[1].split("'", 1)[0]
                counts[task_id] = counts.get(task_id, 0) + 1
    return counts


async def test_three_agents_complete_300_demo_tasks_with_correct_results(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(coordinators=1, agents=3)
    await cluster.ready(30)
    payloads = demo_app.make_payloads(300, lines_per_task=40, every=10)
    t0 = time.monotonic()
    by_id = await _submit_textstats(cluster, payloads)
    tasks = await _wait_done(cluster, set(by_id), timeout_s=150)
    elapsed = time.monotonic() - t0
    _check_results(tasks, by_id)
    owners = {t.owner_node_id or t.previous_owner_node_ids[-1] for t in tasks.values()}
    completions = _completions(cluster)
    assert all(completions.get(task_id) == 1 for task_id in by_id), "a task completed twice"
    print(f"\n300 textstats tasks on 3 agents: all correct in {elapsed:.1f} s; nodes {owners}")
    assert all(c.alive for c in cluster.agents)


async def test_sigkilled_agent_restarts_and_resumes_from_its_local_checkpoints(
    make_cluster: MakeCluster,
) -> None:
    every = 20
    cluster = make_cluster(coordinators=1, agents=1, agent_args=["--slots", "8"])
    await cluster.ready(30)
    payloads = demo_app.make_payloads(8, lines_per_task=240, every=every, work_ms=12.0)
    by_id = await _submit_textstats(cluster, payloads)
    agent = cluster.agents[0]
    await asyncio.sleep(2.0)  # well into the run: ~100 of 240 items done per task
    agent.kill()
    # The durable position of every task at the crash, read from its store.
    with CheckpointStore(cluster.run_dir / "agent-0") as store:
        heads = {h.task_id: h for h in store.task_heads() if h.task_id in by_id}
    assert len(heads) == len(by_id)
    agent.start()  # same node id, same data dir, new incarnation: tasks move at epoch + 1
    tasks = await _wait_done(cluster, set(by_id), timeout_s=60)
    _check_results(tasks, by_id)
    resumes = {
        line["fields"]["task_id"]: line["fields"]
        for line in _json_lines(agent)
        if line.get("fields", {}).get("event") == "task_started"
        and line["fields"]["task_id"] in by_id
        and (line["fields"]["checkpoint_seq"] or line["fields"]["replayed_journal_events"])
    }
    assert set(resumes) == set(by_id), "every task resumed from saved state"
    redone = []
    for task_id, head in heads.items():
        r = resumes[task_id]
        assert r["source"] == "local"
        resumed_at = r["covers_journal_seq"] + r["replayed_journal_events"]
        # Nothing durable was lost or replayed twice: the handler continues at
        # the item after the last one it journaled. What it redoes is at most
        # the one item that was in flight at the SIGKILL.
        assert resumed_at == head.last_journal_seq, (task_id, resumed_at, head)
        redone.append(1)
        assert r["replayed_journal_events"] <= every  # the checkpoint bounds the replay
    for task in tasks.values():
        # Another incarnation never gets the same epoch (DESIGN.md §4): the new
        # process proved the old one stopped (it holds the store's lock, which
        # names it), so the tasks moved to it at once, at epoch + 1.
        assert task.epoch == 2, "moved to the new incarnation at epoch + 1"
        assert task.attempt == 2
    assert all(n == 1 for n in _completions(cluster).values()), "a task completed twice"
    replayed = sorted(r["replayed_journal_events"] for r in resumes.values())
    print(
        f"\nSIGKILL + restart: {len(by_id)} tasks resumed from the local store at the "
        f"crash position; journal events replayed per task {replayed} (checkpoint every "
        f"{every}); work redone per task <= 1 item in flight"
    )


async def test_stopping_redis_for_5s_loses_no_checkpoint(make_cluster: MakeCluster) -> None:
    every, lines = 20, 200
    cluster = make_cluster(coordinators=1, agents=2)
    await cluster.ready(30)
    payloads = demo_app.make_payloads(12, lines_per_task=lines, every=every, work_ms=25.0)
    by_id = await _submit_textstats(
        cluster, payloads, durability=records_pb2.CHECKPOINT_DURABILITY_LOCAL
    )
    await asyncio.sleep(1.5)
    assert cluster.redis is not None
    client = redis.Redis(host="127.0.0.1", port=cluster.redis.port)

    def journal_heads() -> dict[str, int]:
        return {t: int(client.hget(f"lazarus:{{{t}}}:head", "journal_seq") or 0) for t in by_id}

    before = journal_heads()
    cluster.redis.pause()  # SIGSTOP: connections hang, as with a wedged server
    t_pause = time.monotonic()
    try:
        await asyncio.sleep(2.5)
        lags = [_agent_metric(cluster, i, "lazarus_agent_replication_lag_seconds") for i in (0, 1)]
        await asyncio.sleep(max(0.0, 5.0 - (time.monotonic() - t_pause)))
    finally:
        cluster.redis.resume()
    tasks = await _wait_done(cluster, set(by_id), timeout_s=90)
    _check_results(tasks, by_id)
    assert max(lags) > 1.0, f"replication lag during the outage: {lags}"
    for i in (0, 1):
        for _ in range(50):
            backlog = _agent_metric(cluster, i, "lazarus_agent_replication_backlog_records")
            lag = _agent_metric(cluster, i, "lazarus_agent_replication_lag_seconds")
            if lag == 0.0 and backlog == 0.0:
                break
            print("agent", i, "lag", lag, "backlog", backlog)
            await asyncio.sleep(0.2)
        assert (lag, backlog) == (0.0, 0.0), "replication caught up"
    after = journal_heads()
    for task_id in by_id:
        head = client.hgetall(f"lazarus:{{{task_id}}}:head")
        # Every item journaled once and replicated; every checkpoint replicated.
        assert int(head[b"journal_seq"]) == lines, (task_id, head)
        # ... plus the terminal checkpoint that holds the result ([task-path]).
        assert int(head[b"ckpt_seq"]) == (lines - 1) // every + 1, (task_id, head)
    assert all(before[t] < after[t] for t in by_id)
    print(f"\nRedis stopped 5 s: lag at 2.5 s {lags}; all {len(by_id)} tasks complete, 0 lost")


def _agent_metric(cluster: LocalCluster, index: int, name: str) -> float:
    import urllib.request

    with urllib.request.urlopen(cluster.agent_metrics[index], timeout=5) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


async def test_bad_input_fails_that_task_readably_and_the_agent_stays_up(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(
        coordinators=1,
        agents=1,
        agent_args=["--app", "tests.integration.agent_apps:agent", "--max-payload-bytes", "65536"],
        env={"PYTHONPATH": str(REPO)},
    )
    await cluster.ready(30)
    raising = await cluster.submit("r1", "explode", b"{}", max_attempts=2)
    unserialisable = await cluster.submit("r2", "unserialisable", b"{}")
    big = await cluster.submit("r3", "echo", json.dumps({"x": "y" * 100_000}).encode())
    unknown = await cluster.submit("r4", "no-such-kind", b"{}")
    ids = {t.task_id for t in (raising, unserialisable, big, unknown)}
    tasks = await _wait_done(cluster, ids, timeout_s=30)
    r = tasks[raising.task_id]
    assert r.state == records_pb2.TASK_STATE_FAILED
    assert r.attempt == 2, "a handler error is retried while attempts remain"
    assert "RuntimeError: boom in attempt 2" in r.last_error.message
    assert r.last_error.code == records_pb2.TASK_ERROR_CODE_HANDLER_ERROR
    u = tasks[unserialisable.task_id]
    assert u.last_error.code == records_pb2.TASK_ERROR_CODE_RESULT_NOT_SERIALIZABLE
    assert "result is not JSON-serialisable" in u.last_error.message
    b = tasks[big.task_id]
    assert b.last_error.code == records_pb2.TASK_ERROR_CODE_PAYLOAD_TOO_LARGE
    assert "spec.payload" in b.last_error.message
    k = tasks[unknown.task_id]
    assert k.last_error.code == records_pb2.TASK_ERROR_CODE_UNKNOWN_KIND
    assert "no-such-kind" in k.last_error.message
    assert "explode" in k.last_error.message  # it names what this node serves
    assert cluster.agents[0].alive
    fine = await cluster.submit("r5", "echo", json.dumps({"hello": "world"}).encode())
    done = await _wait_done(cluster, {fine.task_id}, timeout_s=20)
    assert json.loads(done[fine.task_id].result.payload) == {"echo": {"hello": "world"}}


# ---------------------------------------------------------------------------
# Self-fencing under a real network partition (a network namespace).
# ---------------------------------------------------------------------------

HOST_IP, NS_IP = "198.18.0.1", "198.18.0.2"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def netns() -> Any:
    """A namespace ``lzna-<pid>`` joined to the host by a veth pair in 198.18.0.0/30."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (CI runs as root)")
    name = f"lzna-{os.getpid()}"
    host_if, ns_if = f"lzh{os.getpid() % 100000}", f"lzn{os.getpid() % 100000}"
    with contextlib.suppress(subprocess.CalledProcessError):
        _ip("netns", "del", name)
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


async def test_cut_off_agent_pauses_its_tasks_before_the_leader_declares_it_dead(
    make_cluster: MakeCluster, netns: tuple[str, str]
) -> None:
    name, host_if = netns
    cluster = make_cluster(coordinators=1, agents=0, listen_host=HOST_IP, redis_bind=[HOST_IP])
    cluster.add_agent(wrapper=["ip", "netns", "exec", name], redis_host=HOST_IP)
    cluster.add_agent()  # a second agent on the host side takes the tasks over
    await cluster.ready(30)
    payloads = demo_app.make_payloads(8, lines_per_task=300, every=20, work_ms=25.0)
    by_id = await _submit_textstats(cluster, payloads)
    await asyncio.sleep(2.0)
    cut_at = time.time()
    _ip("link", "set", host_if, "down")  # the partition: nothing crosses the veth
    try:
        await asyncio.sleep(5.0)
    finally:
        _ip("link", "set", host_if, "up")
    tasks = await _wait_done(cluster, set(by_id), timeout_s=90)
    _check_results(tasks, by_id)
    cut_agent = cluster.agents[0]
    paused = [
        line["fields"]["wall_ms"] / 1000.0
        for line in _json_lines(cut_agent)
        if line.get("fields", {}).get("event") == "task_paused"
    ]
    dead = [
        float(line["ts"])
        for line in _json_lines(cluster.coordinators[0])
        if "NodeDead(node_id='agent-0'" in str(line.get("msg", ""))
    ]
    assert paused, "the cut-off agent paused its tasks"
    assert dead, "the leader declared the cut-off node DEAD"
    assert max(paused) < dead[0], (paused, dead)
    assert all(n == 1 for n in _completions(cluster).values()), "a task completed twice"
    print(
        f"\nnetns partition: {len(paused)} tasks paused by {max(paused) - cut_at:.2f} s after "
        f"the cut; leader's DEAD verdict at {dead[0] - cut_at:.2f} s; margin "
        f"{dead[0] - max(paused):.2f} s"
    )
