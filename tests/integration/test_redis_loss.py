"""[hardening] item 8: Redis data loss is detected, re-shipped or reported, never silently resumed.

- The fenced write script reports a **gap** when an item's first journal event
  comes after a hole in the stored journal that the item does not cover (what
  a write sees after Redis lost data), against a real redis-server.
- The generation marker is stable while Redis keeps its data and changes when
  the dataset is gone.
- ``lazarus drill redis-loss`` end to end on a real cluster (SIGKILLed agents,
  Redis SIGKILLed and restarted with its AOF deleted): the first victim's tasks
  end FAILED with ``TASK_ERROR_CODE_DATA_LOSS`` (their acknowledged checkpoints
  exist nowhere), the live agents re-ship from their local stores, and the
  second victim's tasks resume from the re-shipped state; judged from the
  tasks' own side effects (no progress lost, one owner per epoch) and results.
  With ``LAZARUS_UNSAFE_IGNORE_REDIS_LOSS=1`` the drill fails (first victim's
  tasks resume from scratch; second victim's find nothing).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis.asyncio

from lazarus.storage.keys import task_keys
from lazarus.storage.replica import RedisCheckpointReplica, ReplicationItem
from lazarus.v1 import records_pb2

pytestmark = pytest.mark.integration

PREFIX = "lzloss"
LAZARUS = Path(sys.executable).parent / "lazarus"


def _ev(task: str, seq: int, epoch: int = 1) -> records_pb2.JournalEventRecord:
    return records_pb2.JournalEventRecord(task_id=task, seq=seq, epoch=epoch, payload=b"e")


def _ck(task: str, seq: int, covers: int, epoch: int = 1) -> records_pb2.CheckpointRecord:
    return records_pb2.CheckpointRecord(
        task_id=task, seq=seq, epoch=epoch, covers_journal_seq=covers, payload=b"s"
    )


@pytest.mark.timeout(30)
async def test_a_write_after_a_hole_in_the_journal_reports_a_gap(
    redis_client: redis.asyncio.Redis,
) -> None:
    replica = RedisCheckpointReplica(redis_client, prefix=PREFIX, owner="inc-1")
    task = f"task-{uuid.uuid4().hex[:10]}"

    def item(
        events: tuple[int, ...], checkpoint: records_pb2.CheckpointRecord | None = None
    ) -> ReplicationItem:
        return ReplicationItem(task, 1, "node-a", tuple(_ev(task, s) for s in events), checkpoint)

    first = await replica.write(item((1, 2, 3)))
    assert (first.outcome.value, first.gap) == ("OK", False)
    assert (await replica.write(item((4,)))).gap is False  # contiguous
    await redis_client.delete(*task_keys(task, PREFIX))  # Redis lost the task
    lost = await replica.write(item((5,)))
    assert lost.outcome.value == "OK"  # stored, and the writer is told the journal has a hole
    assert lost.gap is True
    # Reported once, by the first write past the hole: the writer re-ships then.
    assert (await replica.write(item((6,)))).gap is False
    # The re-ship: the whole local journal again makes the stored journal contiguous.
    assert (await replica.write(item((1, 2, 3, 4, 5, 6)))).gap is False
    assert (await replica.write(item((7,)))).gap is False
    await redis_client.delete(*task_keys(task, PREFIX))
    # An item whose checkpoint covers the hole is no gap: Redis is whole again after it.
    assert (await replica.write(item((8,), _ck(task, 2, covers=7)))).gap is False
    assert (await replica.write(item((9,)))).gap is False


@pytest.mark.timeout(30)
async def test_the_generation_marker_changes_only_when_redis_loses_its_data(
    redis_client: redis.asyncio.Redis,
) -> None:
    a = RedisCheckpointReplica(redis_client, prefix=f"{PREFIX}{uuid.uuid4().hex[:6]}")
    first = await a.generation()
    assert len(first) == 32
    assert await a.generation() == first  # stable while the data stays
    await redis_client.delete(f"{a.prefix}:generation")  # what a restart without data leaves
    second = await a.generation()
    assert second != first
    assert await asyncio.gather(a.generation(), a.generation()) == [second, second]


def _drill(tmp_path: Path, env: dict[str, str] | None = None) -> dict[str, object]:
    import os

    run_dir = tmp_path / "drill"
    proc = subprocess.run(
        [str(LAZARUS), "drill", "redis-loss", "--tasks", "16", "--run-dir", str(run_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=280,
        env={**os.environ, **(env or {})},
    )
    print("\n" + proc.stderr[-3000:])
    report = json.loads(proc.stdout)
    (drill,) = report["drills"]
    assert isinstance(drill, dict)
    return drill


@pytest.mark.timeout(300)
def test_the_redis_loss_drill_reports_what_was_lost_and_recovers_the_rest(
    tmp_path: Path,
) -> None:
    d = _drill(tmp_path)
    # Judged from the tasks' own side effects and results, not only the leader's records.
    assert d["effects_checked"] is True
    assert d["effect_records"] > 0
    assert (d["safety_violations"], d["dup_exec"]) == (0, 0), d["violations"]
    # The first victim's tasks had acknowledged checkpoints that exist nowhere now:
    # every one reported DATA_LOSS; no other task lost, none resumed from an older point.
    assert d["data_loss_reported"] >= 1, d["notes"]
    assert d["tasks_lost"] == 0, d["notes"]
    assert d["wrong_results"] == 0
    # The live agents re-shipped, and the second victim's tasks resumed from that.
    assert d["reshipped"] >= 1
    assert d["tasks_moved"] > d["data_loss_reported"]
    assert d["held"] is True
