"""A ``TaskRunner``'s counterparts for tests: a reporter that records, an ``Assign`` builder.

``TaskRunner`` reports through an object with ``started``, ``progress``,
``finished``, ``stopped``, ``lost`` and ``lineage_kept`` (the agent's Session wiring in
production); tests that drive a runner without a coordinator give it this.
"""

from __future__ import annotations

import asyncio
from typing import Any

from lazarus.v1 import agent_pb2, records_pb2

__all__ = ["RecordingReporter", "assign"]


class RecordingReporter:
    """Records each report; ``done`` is set when a task finishes.

    Args:
        done_on_stop: also set ``done`` when a run is stopped or lost (tests
            that wait for a run to end, whichever way).

    Attributes:
        results: the fields of each ``finished`` report, in order.
        started_: each ``started`` message.
        progressed: the fields of each ``progress`` report.
        lost_to: the current epoch of each ``lost`` report.
        lineages: (task id, lineage copy id) of each ``lineage_kept`` report.
        done: set at every ``finished`` (and, with ``done_on_stop``, stop or loss).
    """

    def __init__(self, *, done_on_stop: bool = False) -> None:
        self.results: list[dict[str, Any]] = []
        self.started_: list[Any] = []
        self.progressed: list[dict[str, Any]] = []
        self.lost_to: list[int] = []
        self.lineages: list[tuple[str, str]] = []
        self.done = asyncio.Event()
        self._done_on_stop = done_on_stop

    async def started(self, task_id: str, epoch: int, started: Any) -> None:
        self.started_.append(started)

    def progress(self, task_id: str, epoch: int, **fields: Any) -> None:
        self.progressed.append(fields)

    async def finished(self, task_id: str, epoch: int, **fields: Any) -> None:
        self.results.append(fields)
        self.done.set()

    async def stopped(self, task_id: str, epoch: int, **fields: Any) -> None:
        if self._done_on_stop:
            self.done.set()

    async def lost(self, task_id: str, epoch: int, current_epoch: int) -> None:
        self.lost_to.append(current_epoch)
        if self._done_on_stop:
            self.done.set()

    async def lineage_kept(self, task_id: str, lineage_task_id: str) -> None:
        self.lineages.append((task_id, lineage_task_id))


def assign(
    task_id: str,
    kind: str,
    payload: bytes = b"{}",
    *,
    epoch: int = 1,
    durability: records_pb2.CheckpointDurability = records_pb2.CHECKPOINT_DURABILITY_UNSPECIFIED,
) -> agent_pb2.Assign:
    """An ``Assign`` of attempt 1 with a JSON ``payload`` (what the leader sends)."""
    return agent_pb2.Assign(
        task_id=task_id,
        epoch=epoch,
        attempt=1,
        spec=records_pb2.TaskSpec(
            kind=kind, payload=payload, content_type="application/json", durability=durability
        ),
    )
