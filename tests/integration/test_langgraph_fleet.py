"""Issue [langgraph] acceptance: LangGraph threads survive a SIGKILLed node.

The example tool-calling agent (``node_agent.langgraph.example``) runs as 20
tasks on 3 real node agents; the agent holding the most tasks is SIGKILLed
mid-run. Every thread must complete with the result of a fault-free
in-process run, and the side-effect log the example writes per node
execution must show that no super-step ran under two owners (the only repeat
allowed is the dead owner's last, in-flight node, which LangGraph re-runs by
design when its writes never became durable) and that no completed super-step
was lost or redone.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from lazarus.v1 import records_pb2
from lazarus_dev.devcluster import LocalCluster
from node_agent.langgraph import example

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

DONE = (records_pb2.TASK_STATE_COMPLETED, records_pb2.TASK_STATE_FAILED)
APP = "node_agent.langgraph.example:agent"


class EffectViolation(AssertionError):
    """The side-effect log breaks an invariant of the thread's owners."""


def check_effects(lines: list[dict[str, Any]], expected_trail: list[str]) -> dict[str, int]:
    """Check one thread's node executions (in log order) against its fault-free trail.

    Returns:
        ``{"owners": distinct epochs, "redone": in-flight nodes re-run by a new owner}``.

    Raises:
        EffectViolation: an older epoch after a newer one, two processes at one
            epoch, a super-step run by two owners (other than the dead owner's
            last in-flight node), or a trail different from the fault-free one
            (a lost or repeated super-step).
    """
    pids: dict[int, set[int]] = {}
    last_of_epoch: dict[int, tuple[Any, str]] = {}
    newest = 0
    for e in lines:
        if e["epoch"] < newest:
            raise EffectViolation(f"epoch {e['epoch']} ran after epoch {newest}: {e}")
        newest = e["epoch"]
        pids.setdefault(e["epoch"], set()).add(e["pid"])
        last_of_epoch[e["epoch"]] = (e["step"], e["node"])
    for epoch, procs in pids.items():
        if len(procs) != 1:
            raise EffectViolation(f"epoch {epoch} ran in {len(procs)} processes: {procs}")
    seen: dict[tuple[Any, str], int] = {}
    order: list[str] = []
    redone = 0
    for e in lines:
        key = (e["step"], e["node"])
        if key in seen:
            first = seen[key]
            if first == e["epoch"] or last_of_epoch[first] != key:
                raise EffectViolation(f"super-step {key} ran under epochs {first} and {e['epoch']}")
            redone += 1
            continue
        seen[key] = e["epoch"]
        order.append(e["node"])
    if order != expected_trail:
        raise EffectViolation(f"trail {order} != fault-free {expected_trail}")
    return {"owners": len(pids), "redone": redone}


def test_check_effects_catches_a_restart_from_scratch() -> None:
    trail = ["agent", "tools", "agent"]
    ok = [
        {"epoch": 1, "pid": 1, "step": 1, "node": "agent"},
        {"epoch": 1, "pid": 1, "step": 2, "node": "tools"},
        {"epoch": 2, "pid": 2, "step": 2, "node": "tools"},
        {"epoch": 2, "pid": 2, "step": 3, "node": "agent"},
    ]
    assert check_effects(ok, trail) == {"owners": 2, "redone": 1}
    scratch = [*ok[:2], {"epoch": 2, "pid": 2, "step": 1, "node": "agent"}, *ok[2:]]
    with pytest.raises(EffectViolation):
        check_effects(scratch, trail)
    zombie = [*ok, {"epoch": 1, "pid": 1, "step": 3, "node": "agent"}]
    with pytest.raises(EffectViolation):
        check_effects(zombie, trail)
    lost = [ok[0], {"epoch": 2, "pid": 2, "step": 3, "node": "agent"}]
    with pytest.raises(EffectViolation):
        check_effects(lost, trail)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    c = LocalCluster(
        tmp_path / "run",
        coordinators=1,
        agents=3,
        cluster=f"lg-{uuid.uuid4().hex[:8]}",
        agent_args=["--app", APP],
    )
    c.start()
    try:
        yield c
    finally:
        await asyncio.to_thread(c.stop)


async def _wait_done(
    cluster: LocalCluster, ids: set[str], timeout_s: float
) -> dict[str, records_pb2.TaskRecord]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            tasks = {t.task_id: t for t in await cluster.list_tasks() if t.task_id in ids}
        except Exception:  # a leader change in progress
            tasks = {}
        if len(tasks) == len(ids) and all(t.state in DONE for t in tasks.values()):
            return tasks
        if time.monotonic() > deadline:
            tails = "\n".join(c.log_tail(15) for c in [*cluster.agents, *cluster.coordinators])
            raise AssertionError(f"not done after {timeout_s} s\n{tails}")
        await asyncio.sleep(0.3)


def _effects(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def test_twenty_graph_threads_survive_a_sigkilled_agent(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    effects_log = tmp_path / "effects.jsonl"
    payloads = example.make_payloads(20, think_s=0.25, effects_log=str(effects_log))
    expected = [await example.adirect_result(p) for p in payloads]
    await cluster.ready(30)
    by_id: dict[str, int] = {}
    for i, payload in enumerate(payloads):
        record = await cluster.submit(f"lg{i}", example.KIND, json.dumps(payload).encode())
        by_id[record.task_id] = i
    # Kill once the threads are a few super-steps in.
    deadline = time.monotonic() + 30
    while len(_effects(effects_log)) < 40 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    tasks = await cluster.list_tasks()
    held: dict[str, list[str]] = {}
    for t in tasks:
        if t.task_id in by_id and t.state == records_pb2.TASK_STATE_RUNNING:
            held.setdefault(t.owner_node_id, []).append(t.task_id)
    victim_name = max(held, key=lambda n: len(held[n]))
    victim = next(a for a in cluster.agents if a.name == victim_name)
    victim_pid = victim.pid
    killed_at = time.time()
    victim.kill()
    killed = set(held[victim_name])

    done = await _wait_done(cluster, set(by_id), timeout_s=120)
    lines = _effects(effects_log)
    redone = 0
    for task_id, i in by_id.items():
        task = done[task_id]
        assert task.state == records_pb2.TASK_STATE_COMPLETED, (task_id, task.last_error)
        assert json.loads(task.result.payload) == expected[i], task_id
        mine = [e for e in lines if e["task"] == task_id]
        stats = check_effects(mine, expected[i]["trail"])
        redone += stats["redone"]
        if stats["redone"]:
            last = [e for e in mine if e["epoch"] == 1][-1]
            print(f"redo {task_id}: {last['node']} {killed_at - last['t']:.3f} s before the kill")
        if task_id in killed:
            assert all(e["pid"] != victim_pid for e in mine if e["epoch"] == task.epoch)
    moved = [t for t in killed if done[t].epoch > 1]
    assert len(moved) == len(killed), "every thread the dead agent held moved"
    print(
        f"\nSIGKILL {victim_name} holding {len(killed)} of 20 LangGraph threads: "
        f"all 20 equal the fault-free run; {len(lines)} node executions, "
        f"{redone} in-flight node(s) re-run by the new owner, none run by two live owners"
    )


async def test_an_interrupted_thread_is_seen_and_answered_through_the_api(
    cluster: LocalCluster,
) -> None:
    from lazarus.client import Client
    from node_agent.langgraph import resume

    payload = {**example.make_payloads(1)[0], "review": True}
    await cluster.ready(30)
    record = await cluster.submit("lg-review", example.KIND, json.dumps(payload).encode())
    done = await _wait_done(cluster, {record.task_id}, timeout_s=60)
    task = done[record.task_id]
    asked = json.loads(task.result.payload)
    assert asked["status"] == "interrupted", asked
    assert asked["interrupts"][0]["value"]["question"] == "approve this answer?"
    async with Client(cluster.api_addresses(), tls=cluster.client_tls) as client:
        new_id = await resume(client, record.task_id, "approved by the orchestrator")
    done = await _wait_done(cluster, {new_id}, timeout_s=60)
    answer = json.loads(done[new_id].result.payload)
    expected = await example.adirect_result({**payload, "review": False})
    assert answer["approved"] == "approved by the orchestrator"
    assert answer["answer"] == expected["answer"]
    assert answer["trail"] == expected["trail"]
