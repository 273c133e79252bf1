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
import time
from pathlib import Path
from typing import Any

import taskpath_workers

from lazarus.storage.errors import StoreIOError
from lazarus_dev.runner_fakes import RecordingReporter, assign
from node_agent.checkpoint import CheckpointStore
from node_agent.core import Ownership
from node_agent.metrics import AgentMetrics
from node_agent.replication import Outcome, ReplicationItem, ReplicationResult
from node_agent.runner import TaskRunner
from node_agent.sdk import Agent
from node_agent.spool import SpoolReader


class _Replicator:
    """Acknowledges every item at once."""

    linger_s = 0.5

    async def submit(
        self, item: ReplicationItem, *, linger: bool = False, age_s: float = 0.0
    ) -> asyncio.Future[ReplicationResult]:
        fut: asyncio.Future[ReplicationResult] = asyncio.get_running_loop().create_future()
        fut.set_result(ReplicationResult(Outcome.OK, item.epoch))
        return fut

    def flush(self) -> None:
        pass


class _Claims:
    async def claim_load(self, task_id: str, epoch: int, node_id: str) -> Any:
        return ReplicationResult(Outcome.OK, epoch), None


def _runner(app: Agent, store: CheckpointStore, reporter: Any) -> TaskRunner:
    runner = TaskRunner(
        app=app,
        store=store,
        replica=None,  # type: ignore[arg-type]
        replicator=_Replicator(),  # type: ignore[arg-type]
        reporter=reporter,
        node_id="n1",
        incarnation="inc-1",
        default_durability="local",
        max_payload_bytes=1 << 16,
        metrics=AgentMetrics(),
        stop_grace_s=0.5,
    )
    runner._claims = _Claims()  # type: ignore[assignment]
    runner.ownership = Ownership(time.monotonic() + 3600)
    return runner


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
