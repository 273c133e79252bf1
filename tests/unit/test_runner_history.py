"""A running task's local checkpoint history stays bounded (``--keep-checkpoints``).

Rows of a held task used to leave the store only with the task (``forget``
after the leader acknowledged its result): a task checkpointing once a second
grew the store by ~104 MB a day. The runner now prunes each running task down
to about its newest ``keep_checkpoints`` checkpoints (``core/history.py``), in
the background, keeping the newest (with the journal after it) and anything
Redis may lack.

Real ``CheckpointStore`` and runner; Redis replaced by fakes.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
import taskpath_workers

from lazarus_dev.runner_fakes import AckingReplicator, RecordingReporter, assign, make_runner
from node_agent.checkpoint import CheckpointStore, JsonCodec
from node_agent.core.history import prune_slack
from node_agent.runner import TaskRunner
from node_agent.sdk import Agent

KEEP = 20
STEPS = 3 * KEEP
RECORD_EVERY = 4
TRAILING_EVENTS = 2


def _runner(
    app: Agent, store: CheckpointStore, keep: int, replicator: AckingReplicator | None = None
) -> TaskRunner:
    return make_runner(
        app, store, RecordingReporter(), replicator=replicator, keep_checkpoints=keep
    )


class _Steps:
    """A handler that checkpoints ``STEPS`` times (a journal event every
    ``RECORD_EVERY``, ``TRAILING_EVENTS`` after the last checkpoint), then holds
    until ``go``; resumed (``ctx.restored``), it keeps what it restored and returns."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.go = threading.Event()
        self.restored: Any = None

    def app(self) -> Agent:
        app = Agent("h")
        steps = self

        @app.task("async", durability="local")
        async def run_async(ctx: Any) -> str:
            if ctx.restored is not None:
                steps.restored = ctx.restored
                return "resumed"
            for i in range(1, STEPS + 1):
                if i % RECORD_EVERY == 0:
                    await ctx.record({"i": i})
                await ctx.checkpoint({"step": i, "pad": "x" * 512})
            for i in range(TRAILING_EVENTS):
                await ctx.record({"after": i})
            steps.reached.set()
            while not steps.go.is_set():
                await asyncio.sleep(0.01)
            return "done"

        @app.task("sync", durability="replicated")
        def run_sync(ctx: Any) -> str:
            if ctx.restored is not None:
                steps.restored = ctx.restored
                return "resumed"
            for i in range(1, STEPS + 1):
                if i % RECORD_EVERY == 0:
                    ctx.record({"i": i})
                ctx.checkpoint({"step": i, "pad": "x" * 512})
            for i in range(TRAILING_EVENTS):
                ctx.record({"after": i})
            steps.reached.set()
            steps.go.wait(30)
            return "done"

        return app


async def _held(runner: TaskRunner, steps: _Steps, task_id: str, kind: str) -> None:
    """Run ``task_id`` until its handler made every checkpoint and holds; let its prunes end."""
    runner.start(assign(task_id, kind))
    async with asyncio.timeout(30):
        while not steps.reached.is_set():
            await asyncio.sleep(0.01)
        while runner._runs[task_id].pruning:
            await asyncio.sleep(0.01)


def _pruned(runner: TaskRunner) -> float:
    return float(runner.metrics.checkpoints_pruned._value.get())


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_running_task_keeps_about_its_newest_n_checkpoints_and_restores(
    tmp_path: Path, kind: str
) -> None:
    steps = _Steps()
    with CheckpointStore(tmp_path / "s", durability="group") as store:
        runner = _runner(steps.app(), store, KEEP)
        await _held(runner, steps, "t", kind)
        infos = store.list("t")
        assert KEEP <= len(infos) <= KEEP + prune_slack(KEEP), (
            f"{len(infos)} checkpoints of {STEPS} kept with --keep-checkpoints {KEEP}"
        )
        assert [i.seq for i in infos] == list(range(STEPS - len(infos) + 1, STEPS + 1))
        assert _pruned(runner) == STEPS - len(infos)
        # the journal is compacted only up to what every kept checkpoint covers
        journal = [e.seq for e in store.replay("t")]
        head = STEPS // RECORD_EVERY + TRAILING_EVENTS
        oldest_covers = min(i.covers_journal_seq for i in infos)
        assert journal == list(range(oldest_covers + 1, head + 1))
        assert oldest_covers > 0, "the journal was not compacted"
        # recovery: the newest checkpoint and the journal after it
        rec = store.recover("t")
        assert rec.checkpoint is not None
        assert rec.checkpoint.seq == STEPS
        assert JsonCodec.decode(rec.checkpoint.payload)["step"] == STEPS
        assert [JsonCodec.decode(e.payload) for e in rec.events] == [
            {"after": i} for i in range(TRAILING_EVENTS)
        ]

        # the task moves on (epoch 2 here): it resumes from the newest checkpoint
        await runner.stop("t", 1, flush=False)
        steps.go.set()
        runner.start(assign("t", kind, epoch=2))
        async with asyncio.timeout(30):
            while steps.restored is None:
                await asyncio.sleep(0.01)
        restored = steps.restored
        assert restored.state["step"] == STEPS
        assert restored.checkpoint_seq == STEPS
        assert restored.events == [{"after": i} for i in range(TRAILING_EVENTS)]
        assert restored.journal_seq == head
        await runner.close()


async def test_a_task_in_a_worker_process_is_pruned_as_its_spool_is_ingested(
    tmp_path: Path,
) -> None:
    """isolation="process": the worker spools its checkpoints; the agent prunes as it
    ingests them (before each ``record``), once Redis acknowledged what it shipped."""
    app = Agent("p")
    app.task("many", isolation="process", durability="local")(taskpath_workers.many_steps)
    with CheckpointStore(tmp_path / "s", durability="group") as store:
        runner = _runner(app, store, KEEP)
        reporter = runner.reporter
        assert isinstance(reporter, RecordingReporter)
        payload = JsonCodec.encode({"steps": STEPS, "record_every": RECORD_EVERY})

        async def tick() -> None:  # the agent's tick: lingering records go to Redis
            while True:
                runner.drain_handoff()
                await asyncio.sleep(0.005)

        ticker = asyncio.ensure_future(tick())
        runner.start(assign("p", "many", payload))
        await asyncio.wait_for(reporter.done.wait(), 60)
        ticker.cancel()
        async with asyncio.timeout(10):
            while runner._runs["p"].pruning:
                await asyncio.sleep(0.01)
        assert reporter.results[0]["error"] is None
        infos = store.list("p")
        # the last ingestion's rows and the result come after the last prune
        assert KEEP <= len(infos) <= KEEP + prune_slack(KEEP) + RECORD_EVERY + 1, (
            f"{len(infos)} checkpoints of {STEPS + 1} kept with --keep-checkpoints {KEEP}"
        )
        assert _pruned(runner) == STEPS + 1 - len(infos)
        rec = store.recover("p")
        assert rec.checkpoint is not None
        assert rec.checkpoint.seq == STEPS + 1
        assert rec.checkpoint.info.terminal
        await runner.close()


async def test_zero_keeps_every_checkpoint(tmp_path: Path) -> None:
    steps = _Steps()
    with CheckpointStore(tmp_path / "s", durability="group") as store:
        runner = _runner(steps.app(), store, 0)
        await _held(runner, steps, "t", "async")
        assert len(store.list("t")) == STEPS
        assert len(store.replay("t")) == STEPS // RECORD_EVERY + TRAILING_EVENTS
        assert _pruned(runner) == 0
        steps.go.set()
        await runner.close()


async def test_nothing_redis_may_lack_is_pruned(tmp_path: Path) -> None:
    """Redis acknowledged none of the task's checkpoints: a newer owner's adopt, or
    this node's lineage report, may still need every one of them."""
    steps = _Steps()
    with CheckpointStore(tmp_path / "s", durability="group") as store:
        runner = _runner(steps.app(), store, KEEP, AckingReplicator(acks=False))
        await _held(runner, steps, "t", "async")
        assert len(store.list("t")) == STEPS
        assert _pruned(runner) == 0
        steps.go.set()
        await runner.close()
