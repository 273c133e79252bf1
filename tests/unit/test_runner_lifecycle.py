"""What a ``TaskRunner`` keeps of a run after it ended, and what a dead worker leaves.

* A run that ended by itself (result or failure reported) stays in the
  runner until the agent forgets the task (``ForgetTask``, after the leader
  acknowledged the terminal update): a stop that raced the finish still
  reports its checkpoint; after that nothing reads it, and it must go (each
  kept run cost ~5.7 KB plus its result, and the tick walks every run).
* A dead worker's spool file is deleted only once no row is left in it: a
  row an ingestion failed to move is ingested at the next start.

Real ``CheckpointStore`` and agent core; Redis replaced by fakes that
acknowledge at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import taskpath_workers

from lazarus.storage.errors import StoreIOError
from lazarus.v1 import agent_pb2
from lazarus_dev.runner_fakes import RecordingReporter, assign, make_runner
from node_agent import convert
from node_agent.agent import NodeAgent
from node_agent.checkpoint import CheckpointStore
from node_agent.core import records as rec
from node_agent.runner import TaskRunner
from node_agent.sdk import Agent
from node_agent.settings import AgentSettings
from node_agent.spool import SpoolReader


def _runner(app: Agent, store: CheckpointStore, reporter: Any) -> TaskRunner:
    return make_runner(app, store, reporter)


# ------------------------------------------------------------- the ended run


def _blob_app(go: threading.Event | None = None) -> Agent:
    app = Agent("t")

    @app.task("k", durability="local")
    def handler(ctx: Any) -> dict[str, str]:
        ctx.checkpoint({"step": 1})
        if go is not None:
            go.wait(10)
        return {"blob": "x" * 50_000}

    return app


async def test_finished_tasks_leave_the_runner_once_the_leader_acknowledged_them(
    tmp_path: Path,
) -> None:
    """The real agent shell and core: each task is assigned, finishes, and its
    terminal update is acknowledged (ForgetTask). Every run used to stay in
    ``_runs`` for good, with its result (~5.7 KB + 50 KB a task here)."""
    app = _blob_app()
    settings = AgentSettings(node_id="n1", coordinators=("c1:1",), data_dir=tmp_path / "s")
    agent = NodeAgent(settings, app=app)
    with CheckpointStore(tmp_path / "s", durability="group") as store:
        runner = _runner(app, store, agent)
        agent._store, agent._runner = store, runner
        outbound: asyncio.Queue[agent_pb2.AgentMessage] = asyncio.Queue()
        agent._outbound = outbound

        async def step(commands: list[Any]) -> None:
            async with agent._lock:
                await agent._execute(commands)

        now = time.monotonic()
        hello = agent.core.hello(now, 0)
        welcome = rec.Welcome(term=1, fence_after_ms=3_600_000, hello_seq=hello.hello_seq)
        await step(agent.core.on_message(welcome, now, 0))
        tasks = 20
        for i in range(tasks):
            message = agent_pb2.CoordinatorMessage(assign=assign(f"t{i}", "k"))
            await step(agent.core.on_message(convert.coordinator_message_from_pb(message), now, 0))
            await runner._runs[f"t{i}"].task  # type: ignore[misc]
        acks = []
        while not outbound.empty():
            update = outbound.get_nowait().task_update
            if update.HasField("completed"):
                acks.append(
                    rec.TaskUpdateAck(
                        update.update_seq, update.task_id, update.epoch, rec.UpdateOutcome.ACCEPTED
                    )
                )
        assert len(acks) == tasks
        assert len(runner._runs) == tasks, "a run left before the leader had its result"
        for ack in acks:
            await step(agent.core.on_message(ack, now, 0))
        assert not store.metas()
        assert runner._runs == {}, f"{len(runner._runs)} finished runs kept after their ack"
        await runner.close()


class _StopReporter(RecordingReporter):
    def __init__(self) -> None:
        super().__init__()
        self.stopped_: list[dict[str, Any]] = []

    async def stopped(self, task_id: str, epoch: int, **fields: Any) -> None:
        self.stopped_.append(fields)


async def test_a_stop_of_a_run_that_just_finished_still_reports_its_checkpoint(
    tmp_path: Path,
) -> None:
    """A StopTask the core issued before it took the finish reaches the runner
    after the run ended: the run is still there, and the stop reports its last
    checkpoint (a Release's Released carries it) and removes it."""
    with CheckpointStore(tmp_path / "s", durability="group") as store:
        reporter = _StopReporter()
        runner = _runner(_blob_app(), store, reporter)
        runner.start(assign("t1", "k"))
        await asyncio.wait_for(reporter.done.wait(), 10)
        await runner._runs["t1"].task  # type: ignore[misc]
        assert runner._runs["t1"].thread is None, "the ended run still holds its result"
        await runner.stop("t1", 1, flush=True)
        (stopped,) = reporter.stopped_
        assert stopped["checkpoint"] is not None
        assert stopped["checkpoint"].terminal
        assert "t1" not in runner._runs
        await runner.close()


async def test_forget_leaves_a_run_that_still_runs_to_its_stop(tmp_path: Path) -> None:
    go = threading.Event()
    with CheckpointStore(tmp_path / "s", durability="group") as store:
        reporter = _StopReporter()
        runner = _runner(_blob_app(go), store, reporter)
        runner.start(assign("t1", "k"))
        runner.forget("t1")
        assert "t1" in runner._runs
        go.set()
        await asyncio.wait_for(reporter.done.wait(), 10)
        await runner._runs["t1"].task  # type: ignore[misc]
        runner.forget("t1")
        assert runner._runs == {}
        runner.forget("t1")  # no run: nothing to do
        await runner.stop("t1", 1, flush=False)  # a stop of a forgotten task still reports
        assert reporter.stopped_ == [{"checkpoint": None, "journal_seq": 0}]
        await runner.close()


# ------------------------------------------------------------ the dead worker


async def test_a_dead_workers_spool_that_failed_to_ingest_is_kept_for_the_next_start(
    tmp_path: Path,
) -> None:
    """The relay of a killed worker ingests its spool, then deletes it: not when the
    ingestion failed (the store refused the commit), which lost an acknowledged
    checkpoint; the file stays and the next start ingests it."""
    app = Agent("p")
    app.task("spin", isolation="process")(taskpath_workers.report_pid_then_spin)
    with CheckpointStore(tmp_path / "s", durability="group") as store:
        reporter = RecordingReporter()
        runner = _runner(app, store, reporter)
        runner.start(assign("victim", "spin"))
        spool_dir = tmp_path / "s" / "spool"
        async with asyncio.timeout(30):
            while True:  # its one checkpoint is spooled (the agent has not ingested it)
                rows = [r for p in spool_dir.glob("*.db") for r in SpoolReader(p).read()]
                if rows:
                    break
                await asyncio.sleep(0.02)

        def refuse(rows: Any, path: Any) -> Any:
            raise StoreIOError("disk full")

        runner._ingest_rows = refuse  # type: ignore[method-assign]
        os.kill(json.loads(rows[0].payload)["pid"], signal.SIGKILL)
        await asyncio.wait_for(reporter.done.wait(), 10)
        assert reporter.results[0]["error"] is not None
        assert store.load_latest("victim") is None
        left = [r for p in spool_dir.glob("*.db") for r in SpoolReader(p).read()]
        assert [r.payload for r in left] == [rows[0].payload], "the spooled checkpoint was lost"
        await runner.close()
        del runner._ingest_rows  # the store works again: the next start ingests it
        assert runner.ingest_leftover_spools() == 1
        latest = store.load_latest("victim")
        assert latest is not None
        assert latest.payload == rows[0].payload
