"""A ``TaskRunner``'s counterparts for tests: a reporter that records, an ``Assign``
builder, a replicator that acknowledges at once, and ``make_runner`` to wire a
runner to a real store with them.

``TaskRunner`` reports through an object with ``started``, ``progress``,
``finished``, ``stopped``, ``lost`` and ``lineage_kept`` (the agent's Session wiring in
production); tests that drive a runner without a coordinator give it this.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from lazarus.v1 import agent_pb2, records_pb2
from node_agent.checkpoint import CheckpointStore
from node_agent.core.core import Ownership
from node_agent.metrics import AgentMetrics
from node_agent.replication import Outcome, ReplicationItem, ReplicationResult
from node_agent.runner import TaskRunner
from node_agent.sdk import Agent

__all__ = ["AckingReplicator", "OkClaims", "RecordingReporter", "assign", "make_runner"]


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


class AckingReplicator:
    """The runner's replicator, acknowledging every item at once (Redis is covered by
    the integration tests), or never with ``acks=False`` (Redis unreachable: the
    futures are kept in ``held``).

    Attributes:
        items, lingered, ages: each submitted item, its linger flag and age_s, in order.
        flushes: how many times ``flush`` was called.
    """

    linger_s = 0.5

    def __init__(self, *, acks: bool = True) -> None:
        self.acks = acks
        self.items: list[ReplicationItem] = []
        self.lingered: list[bool] = []
        self.ages: list[float] = []
        self.held: list[asyncio.Future[ReplicationResult]] = []
        self.flushes = 0

    async def submit(
        self, item: ReplicationItem, *, linger: bool = False, age_s: float = 0.0
    ) -> asyncio.Future[ReplicationResult]:
        self.items.append(item)
        self.lingered.append(linger)
        self.ages.append(age_s)
        fut: asyncio.Future[ReplicationResult] = asyncio.get_running_loop().create_future()
        if self.acks:
            fut.set_result(ReplicationResult(Outcome.OK, item.epoch))
        else:
            self.held.append(fut)
        return fut

    def flush(self) -> None:
        self.flushes += 1


class OkClaims:
    """The runner's load claim: granted, with nothing newer in Redis."""

    async def claim_load(self, task_id: str, epoch: int, node_id: str) -> Any:
        return ReplicationResult(Outcome.OK, epoch), None


def make_runner(
    app: Agent,
    store: CheckpointStore,
    reporter: Any,
    *,
    replicator: Any = None,
    claims: Any = None,
    incarnation: str = "inc-1",
    **settings: Any,
) -> TaskRunner:
    """A ``TaskRunner`` of node ``n1`` on ``store``, owning its tasks for an hour.

    Args:
        replicator: default an ``AckingReplicator``.
        claims: the load claim, default ``OkClaims``.
        settings: more ``TaskRunner`` arguments (e.g. ``keep_checkpoints``).
    """
    runner = TaskRunner(
        app=app,
        store=store,
        replica=None,  # type: ignore[arg-type]
        replicator=replicator if replicator is not None else AckingReplicator(),  # type: ignore[arg-type]
        reporter=reporter,
        node_id="n1",
        incarnation=incarnation,
        default_durability="local",
        max_payload_bytes=1 << 16,
        metrics=AgentMetrics(),
        stop_grace_s=0.5,
        **settings,
    )
    runner._claims = claims if claims is not None else OkClaims()  # type: ignore[assignment]
    runner.ownership = Ownership(time.monotonic() + 3600)
    return runner
