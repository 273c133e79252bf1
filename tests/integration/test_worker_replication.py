"""A worker process writes a ``replicated`` checkpoint to Redis itself (real Redis).

``isolation="process"`` and ``durability="replicated"``: the worker spools the
checkpoint (fsync), writes it to Redis through the agent's script and fence,
and returns after Redis's answer; the agent ingests the spool later and
reports the checkpoint as replicated. Any other answer sends the checkpoint
through the agent's Replicator. The promise is read from outside: the handler
itself reads Redis right after ``checkpoint`` returned.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
import replicated_workers

from lazarus.v1 import agent_pb2, records_pb2
from lazarus_dev.runner_fakes import RecordingReporter, assign
from node_agent.checkpoint import CheckpointStore
from node_agent.core import Ownership
from node_agent.isolation import WorkerRedis
from node_agent.metrics import AgentMetrics
from node_agent.replication import RedisCheckpointReplica, Replicator
from node_agent.runner import RESULT_LABEL, TaskRunner
from node_agent.sdk import Agent

pytestmark = pytest.mark.timeout(120)

INCARNATION = "inc-wr"


def _app() -> Agent:
    app = Agent("wr")
    app.task("read-redis", isolation="process")(replicated_workers.checkpoint_and_read_redis)
    app.task("wait", isolation="process")(replicated_workers.checkpoint_wait_checkpoint)
    app.task("burst", isolation="process")(replicated_workers.burst_then_long_step)
    app.task("slow", isolation="process")(replicated_workers.checkpoint_slowly)
    return app


LOCAL = records_pb2.CHECKPOINT_DURABILITY_LOCAL


def _assign(
    task_id: str,
    kind: str,
    payload: dict[str, Any],
    epoch: int = 1,
    durability: Any = records_pb2.CHECKPOINT_DURABILITY_REPLICATED,
) -> agent_pb2.Assign:
    return assign(task_id, kind, json.dumps(payload).encode(), epoch=epoch, durability=durability)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Node:
    def __init__(
        self, runner: TaskRunner, reporter: RecordingReporter, store: CheckpointStore
    ) -> None:
        self.runner = runner
        self.reporter = reporter
        self.store = store

    def fallbacks(self) -> float:
        value = self.runner.metrics.registry.get_sample_value(
            "lazarus_agent_worker_replication_fallbacks_total"
        )
        return value or 0.0

    def checkpoints_timed(self, durability: str = "replicated") -> float:
        """``lazarus_agent_checkpoint_seconds_count``: calls timed, in workers or here."""
        value = self.runner.metrics.registry.get_sample_value(
            "lazarus_agent_checkpoint_seconds_count", {"durability": durability}
        )
        return value or 0.0


@pytest.fixture
async def make_node(redis_server: Any, tmp_path: Path) -> AsyncIterator[Any]:
    made: list[tuple[TaskRunner, Replicator, CheckpointStore, redis.asyncio.Redis]] = []

    async def make(prefix: str, worker_url: str) -> _Node:
        client = redis.asyncio.Redis.from_url(redis_server.url, socket_timeout=5)
        replica = RedisCheckpointReplica(client, prefix=prefix, owner=INCARNATION)
        replicator = Replicator(replica, linger_s=0.5)
        await replicator.start()
        store = CheckpointStore(tmp_path / f"store-{len(made)}", durability="group")
        reporter = RecordingReporter(done_on_stop=True)
        runner = TaskRunner(
            app=_app(),
            store=store,
            replica=replica,
            replicator=replicator,
            reporter=reporter,
            node_id="n1",
            incarnation=INCARNATION,
            default_durability="replicated",
            max_payload_bytes=1 << 16,
            metrics=AgentMetrics(),
            stop_grace_s=0.5,
            slots=2,
            worker_redis=WorkerRedis(worker_url, prefix=prefix),
        )
        runner.ownership = Ownership(time.monotonic() + 3600)
        made.append((runner, replicator, store, client))
        return _Node(runner, reporter, store)

    yield make
    for runner, replicator, store, client in made:
        await runner.close()
        await replicator.close()
        store.close()
        await client.aclose()


async def _read_redis_run(node: _Node, task_id: str, payload: dict[str, Any]) -> None:
    """Run ``read-redis`` to its result: after each checkpoint returned, Redis held it."""
    node.runner.start(_assign(task_id, "read-redis", payload))
    await asyncio.wait_for(node.reporter.done.wait(), 60)
    result = node.reporter.results[0]["result"]
    assert result is not None, node.reporter.results
    seen = json.loads(result.payload)
    assert [s for s, _ in seen] == list(range(1, payload["steps"] + 1))
    for seq, in_redis in seen:
        assert in_redis >= seq, f"checkpoint {seq} returned while Redis held {in_redis}"


async def test_a_replicated_checkpoint_is_in_redis_when_the_worker_returns_it(
    redis_server: Any, make_node: Any
) -> None:
    """Redis holds every checkpoint when ``checkpoint`` returns (the handler reads
    it), and not one of them went through the agent's commit path."""
    prefix = f"wr{uuid.uuid4().hex[:8]}"
    node = await make_node(prefix, redis_server.url)
    committed: list[bool] = []  # the ``result`` flag of every commit the agent made
    original = node.runner._checkpoint_sync

    def counting(run: Any, state: Any, reason: str, **kw: Any) -> int:
        committed.append(kw.get("result", False))
        return original(run, state, reason, **kw)

    node.runner._checkpoint_sync = counting
    payload = {"steps": 5, "redis_url": redis_server.url, "prefix": prefix}
    await _read_redis_run(node, "t1", payload)
    assert committed == [True], "the agent committed only the result"
    assert node.fallbacks() == 0
    assert node.checkpoints_timed() == 6, "five timed in the worker, the result here"
    infos = node.store.list("t1")
    assert [i.seq for i in infos] == [1, 2, 3, 4, 5, 6]
    assert infos[-1].label == RESULT_LABEL
    # The agent reports what the worker replicated as replicated (the leader's
    # evidence of what Redis must hold).
    replicated = _reported_replicated(node)
    assert replicated
    assert max(replicated) >= 5


async def test_a_worker_that_cannot_reach_redis_hands_its_checkpoints_to_the_agent(
    redis_server: Any, make_node: Any
) -> None:
    """The worker's own Redis is unreachable: each checkpoint still returns only once
    Redis holds it, shipped by the agent, and each such hand-off is counted."""
    prefix = f"wr{uuid.uuid4().hex[:8]}"
    node = await make_node(prefix, f"redis://127.0.0.1:{_closed_port()}/0")
    payload = {"steps": 3, "redis_url": redis_server.url, "prefix": prefix}
    await _read_redis_run(node, "t2", payload)
    assert node.fallbacks() == 3
    assert node.checkpoints_timed() == 4, "each call timed with its hand-off, and the result"


async def test_a_checkpoint_fenced_in_redis_does_not_return_and_the_run_is_lost(
    redis_server: Any, make_node: Any, tmp_path: Path
) -> None:
    """A newer epoch claimed the task in Redis between two checkpoints: the
    worker's write is refused (STALE), the handler's checkpoint raises, and the
    agent learns that the run is lost."""
    prefix = f"wr{uuid.uuid4().hex[:8]}"
    node = await make_node(prefix, redis_server.url)
    go, outcome = tmp_path / "go", tmp_path / "outcome"
    payload = {"go": str(go), "outcome": str(outcome)}
    node.runner.start(_assign("t3", "wait", payload))
    client = redis.asyncio.Redis.from_url(redis_server.url, socket_timeout=5)
    try:
        async with asyncio.timeout(30):
            while not await client.hget(f"{prefix}:{{t3}}:head", "ckpt_seq"):
                await asyncio.sleep(0.02)
        other = RedisCheckpointReplica(client, prefix=prefix, owner="inc-new-owner")
        claimed = await other.claim("t3", 2, "n2")
        assert claimed.current_epoch == 2
        go.write_text("")
        await asyncio.wait_for(node.reporter.done.wait(), 30)
        async with asyncio.timeout(10):  # the handler writes it after the agent's answer
            while not outcome.exists():
                await asyncio.sleep(0.02)
        assert json.loads(outcome.read_text()) == ["raised", "TaskCancelled"]
        assert node.reporter.lost_to == [2]
        assert int(await client.hget(f"{prefix}:{{t3}}:head", "ckpt_seq") or 0) == 1
    finally:
        await client.aclose()


async def _redis_seq(client: redis.asyncio.Redis, prefix: str, task_id: str) -> int:
    return int(await client.hget(f"{prefix}:{{{task_id}}}:head", "ckpt_seq") or 0)


async def test_a_local_tasks_newest_checkpoint_reaches_redis_within_the_linger_in_a_long_step(
    redis_server: Any, make_node: Any, tmp_path: Path
) -> None:
    """A local task's worker writes its newest checkpoint to Redis at most every
    0.4 s; the ones it skipped before a long step are shipped by the agent once
    they would have lingered out: Redis holds checkpoint 5 well before the step
    ends, not only with the result."""
    prefix = f"wr{uuid.uuid4().hex[:8]}"
    node = await make_node(prefix, redis_server.url)
    marker = tmp_path / "marker"
    payload = {"marker": str(marker), "long_s": 6.0}
    node.runner.start(_assign("t4", "burst", payload, durability=LOCAL))
    client = redis.asyncio.Redis.from_url(redis_server.url, socket_timeout=5)
    tick = asyncio.get_running_loop().create_task(_ticks(node.runner))
    try:
        async with asyncio.timeout(30):
            while not marker.exists():
                await asyncio.sleep(0.02)
        checkpointed_at = float(marker.read_text())
        async with asyncio.timeout(3):  # linger 0.5 s, ingestion every 0.4 s
            while await _redis_seq(client, prefix, "t4") < 5:
                await asyncio.sleep(0.02)
        assert time.time() - checkpointed_at < 3
        assert not node.reporter.done.is_set(), "the step (6 s) is still running"
    finally:
        tick.cancel()
        await client.aclose()


async def test_a_local_tasks_checkpoints_go_to_redis_from_its_worker_not_the_agent(
    redis_server: Any, make_node: Any
) -> None:
    """Checkpoints 0.6 s apart: the worker writes each to Redis itself, and the
    agent ships none of them (only the result)."""
    prefix = f"wr{uuid.uuid4().hex[:8]}"
    node = await make_node(prefix, redis_server.url)
    shipped: list[int] = []
    submit = node.runner.replicator.submit

    async def recording(item: Any, **kw: Any) -> Any:
        if item.checkpoint is not None:
            shipped.append(item.checkpoint.seq)
        return await submit(item, **kw)

    node.runner.replicator.submit = recording
    payload = {"steps": 4, "every_s": 0.6}
    await _run_ticking(node, _assign("t5", "slow", payload, durability=LOCAL))
    assert shipped == [5], f"the agent shipped {shipped}, expected only the result (5)"


async def test_a_local_run_whose_worker_writes_redis_is_ingested_lazily(
    redis_server: Any, make_node: Any
) -> None:
    """Eight checkpoints 0.5 s apart, each written to Redis by the worker: the
    agent's tick ingests the spool at the first one and then every 2 s
    (``LAZY_INGEST_INTERVAL_S``), not at each new row, and the store still
    holds every checkpoint, in order, once the handler returned."""
    node = await make_node(f"wr{uuid.uuid4().hex[:8]}", redis_server.url)
    payload = {"steps": 8, "every_s": 0.5}
    batches = await _run_ticking(node, _assign("t6", "slow", payload, durability=LOCAL))
    assert sorted(s for b in batches for s in b) == list(range(1, 9))
    # the first checkpoint at once, then every 2 s of a 4 s run, the rest as the
    # handler returns (eager ingestion makes one call per checkpoint: 8)
    assert len(batches) <= 4, f"ingested {batches}"
    assert [i.seq for i in node.store.list("t6")] == list(range(1, 10))


async def test_a_replicated_run_is_ingested_at_the_report_interval_and_reported_replicated(
    redis_server: Any, make_node: Any
) -> None:
    """Twelve checkpoints 0.25 s apart, each written to Redis by the worker before
    it returns: the agent ingests the spool about once per progress report
    interval (1 s), not at each new row, and still reports the rows as
    replicated while the run goes on (the leader's evidence of what Redis holds)."""
    node = await make_node(f"wr{uuid.uuid4().hex[:8]}", redis_server.url)
    batches = await _run_ticking(node, _assign("t7", "slow", {"steps": 12, "every_s": 0.25}))
    assert sorted(s for b in batches for s in b) == list(range(1, 13))
    # a 3 s run: the first at once, about one a second, the rest at the return
    # (eager ingestion makes one call per checkpoint: 12)
    assert len(batches) <= 6, f"ingested {batches}"
    reported = _reported_replicated(node)
    assert any(seq < 12 for seq in reported), f"nothing reported as replicated mid-run: {reported}"
    assert max(reported) == 13, "the last checkpoint, then the result"
    assert node.fallbacks() == 0


async def _run_ticking(node: _Node, assign: Any) -> list[list[int]]:
    """Run ``assign`` to its result with the agent's tick going; return the
    checkpoint seqs of each ``store.ingest`` call, in order."""
    batches: list[list[int]] = []
    ingest = node.store.ingest

    def recording(items: Any) -> Any:
        batches.append([seq for _, seq, _ in items])
        return ingest(items)

    node.store.ingest = recording  # type: ignore[method-assign]
    tick = asyncio.get_running_loop().create_task(_ticks(node.runner))
    try:
        node.runner.start(assign)
        await asyncio.wait_for(node.reporter.done.wait(), 60)
    finally:
        tick.cancel()
    assert node.reporter.results[0]["result"] is not None, node.reporter.results
    return batches


def _reported_replicated(node: _Node) -> list[int]:
    """The seqs the agent reported to the core as replicated, in order."""
    return [
        f["replicated_checkpoint_seq"]
        for f in node.reporter.progressed
        if "replicated_checkpoint_seq" in f
    ]


async def _ticks(runner: TaskRunner) -> None:
    """The agent's tick, as far as spools go (node_agent/agent.py: every 50 ms)."""
    while True:
        runner.ingest_spools()
        runner.drain_handoff(hold=True)
        await asyncio.sleep(0.05)
