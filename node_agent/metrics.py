"""Prometheus metrics of a node agent (``lazarus_agent_*``), on an HTTP port of its own.

Series (base units; counters end in ``_total``):

- ``lazarus_agent_checkpoint_seconds{durability}`` (histogram): a ``ctx.checkpoint``
  call, from the call to its return (local fsync, plus Redis ack for "replicated"),
  in the agent or, for a handler with ``isolation="process"``, in its worker
  process (each worker counts into memory it shares with the agent, read at
  every scrape: ``add_checkpoint_source``);
- ``lazarus_agent_checkpoint_bytes`` (histogram): encoded checkpoint state sizes;
- ``lazarus_agent_replication_lag_seconds``: age of the oldest record not yet
  acknowledged by Redis (0 when caught up);
- ``lazarus_agent_replication_backlog_records``: records waiting for Redis;
- ``lazarus_agent_replication_errors_total``: failed Redis round trips;
- ``lazarus_agent_tasks_running``: handlers running now;
- ``lazarus_agent_tasks_finished_total{outcome}``: completed / failed / stopped;
- ``lazarus_agent_fence_events_total``: self-fences (every task paused, no ack in time);
- ``lazarus_agent_stale_welcomes_total``: Welcomes ignored because they answered
  an earlier Hello than the newest (a late reply; the fence did not move);
- ``lazarus_agent_session_reconnects_total``: Sessions opened after the first;
- ``lazarus_agent_session_refusals_total``: Hellos the leader refused with
  FAILED_PRECONDITION (another live process holds this node id);
- ``lazarus_agent_directive_failures_total``: batches of leader directives the
  agent failed to apply; each ends the Session, and one the core had stepped
  past (a meta write failed) stops the agent, which exits 1;
- ``lazarus_agent_loop_failures_total{loop}``: the agent's long-lived loops
  (``agent-session``, ``agent-tick``, ``agent-redis-generation``) that failed
  or ended outside a stop; each stops the agent, which exits 1;
- ``lazarus_agent_dials_held_off_total``: coordinator addresses skipped when
  dialling because they were unreachable within the hold-off
  (``node_agent.core.dial``);
- ``lazarus_agent_heartbeat_rtt_seconds`` (histogram): heartbeat send to ack;
- ``lazarus_agent_redis_resets_total{signal}``: Redis data loss seen by this agent
  (``generation``: the dataset marker changed; ``gap``: a write found a hole in a
  task's replicated journal), each followed by a re-ship from the local store;
- ``lazarus_agent_reshipped_tasks_total``: tasks whose newest local checkpoint
  and journal were shipped to Redis again after such a loss;
- ``lazarus_agent_data_loss_total``: assignments refused because the
  acknowledged checkpoint was in neither Redis nor the local store (the task
  fails with ``TASK_ERROR_CODE_DATA_LOSS``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["CHECKPOINT_BUCKETS_S", "AgentMetrics", "CheckpointSource"]

CHECKPOINT_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
"""Upper bounds (seconds) of ``lazarus_agent_checkpoint_seconds``; workers count into the same."""

CheckpointSource = Callable[[], Mapping[str, tuple[Sequence[float], float]]]
"""Checkpoint durations counted outside the agent (its worker processes), read at a scrape:
durability -> (count per bucket of ``CHECKPOINT_BUCKETS_S`` then +Inf, not cumulative;
sum of seconds). Counts only grow."""


class _CheckpointSeconds(Collector):
    """``lazarus_agent_checkpoint_seconds``: the agent's own observations plus its sources'."""

    def __init__(self, own: Histogram, doc: str) -> None:
        self._own = own
        self._doc = doc
        self.sources: list[CheckpointSource] = []

    def collect(self) -> Iterator[Metric]:
        # durability -> cumulative count per ``le`` (+Inf last), and sum of seconds
        cumulative: dict[str, list[float]] = {}
        sums: dict[str, float] = {}
        for metric in self._own.collect():
            for sample in metric.samples:
                durability = sample.labels.get("durability", "")
                if sample.name.endswith("_bucket"):
                    row = cumulative.setdefault(durability, [0.0] * len(_LE))
                    row[_LE.index(sample.labels["le"])] = sample.value
                elif sample.name.endswith("_sum"):
                    sums[durability] = sample.value
        for source in self.sources:
            for durability, (counts, total_s) in source().items():
                row = cumulative.setdefault(durability, [0.0] * len(_LE))
                for i, n in enumerate(itertools.accumulate(counts)):
                    row[i] += n
                sums[durability] = sums.get(durability, 0.0) + total_s
        family = HistogramMetricFamily(
            "lazarus_agent_checkpoint_seconds", self._doc, labels=["durability"]
        )
        for durability in sorted(cumulative):
            buckets = list(zip(_LE, cumulative[durability], strict=True))
            family.add_metric([durability], buckets, sums.get(durability, 0.0))
        yield family


_CKPT_DOC = "ctx.checkpoint call duration, by durability (agent and worker processes)."


_LE = tuple(
    cast(Callable[[float], str], floatToGoString)(b) for b in (*CHECKPOINT_BUCKETS_S, math.inf)
)
"""The ``le`` label of each bucket, as prometheus_client writes it."""


_BYTES_BUCKETS = (256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
_RTT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0)


class AgentMetrics:
    """One agent's metrics in a registry of their own (several agents may share a process).

    Args:
        registry: where to register (default: a new ``CollectorRegistry``).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        # The agent's own observations; exported through the collector below,
        # which adds the worker processes' counts (``add_checkpoint_source``).
        self.checkpoint_seconds = Histogram(
            "lazarus_agent_checkpoint_seconds",
            _CKPT_DOC,
            ["durability"],
            buckets=CHECKPOINT_BUCKETS_S,
            registry=None,
        )
        self._checkpoint_collector = _CheckpointSeconds(self.checkpoint_seconds, _CKPT_DOC)
        r.register(self._checkpoint_collector)
        self.checkpoint_hop_seconds = Histogram(
            "lazarus_agent_checkpoint_hop_seconds",
            "One hop of a sync handler's checkpoint/record (short path): commit (handler "
            "thread to store and back), handoff (thread to event loop), redis (loop to Redis "
            "ack), wake (ack to the handler thread running again).",
            ["hop"],
            buckets=(0.0001, 0.00025, *CHECKPOINT_BUCKETS_S),
            registry=r,
        )
        self.spooled_checkpoints = Counter(
            "lazarus_agent_spooled_checkpoints_total",
            "Checkpoints worker processes committed into their spool (isolation=process), "
            "by what ingesting them into the store did: ingested, "
            "duplicate (ingested before a crash), refused (stale epoch), corrupt (bad checksum).",
            ["outcome"],
            registry=r,
        )
        self.worker_replication_fallbacks = Counter(
            "lazarus_agent_worker_replication_fallbacks_total",
            "Checkpoints of replicated tasks a worker process could not write to Redis itself "
            "(Redis unreachable or slow, a STALE fence, a hole in Redis's journal), so the "
            "agent shipped them; a worker then leaves its writes to the agent for 5 s.",
            registry=r,
        )
        self.checkpoints_pruned = Counter(
            "lazarus_agent_checkpoints_pruned",
            "Checkpoints of running tasks deleted from the local store to keep each task's "
            "history to --keep-checkpoints (the newest, terminal ones and any Redis may lack "
            "always stay).",
            registry=r,
        )
        self.checkpoint_bytes = Histogram(
            "lazarus_agent_checkpoint_bytes",
            "Encoded checkpoint state size.",
            buckets=_BYTES_BUCKETS,
            registry=r,
        )
        self.replication_lag = Gauge(
            "lazarus_agent_replication_lag_seconds",
            "Age of the oldest record not yet acknowledged by Redis.",
            registry=r,
        )
        self.replication_backlog = Gauge(
            "lazarus_agent_replication_backlog_records",
            "Records waiting for Redis.",
            registry=r,
        )
        self.replication_errors = Counter(
            "lazarus_agent_replication_errors", "Failed Redis round trips.", registry=r
        )
        self.tasks_running = Gauge(
            "lazarus_agent_tasks_running", "Task handlers running now.", registry=r
        )
        self.tasks_finished = Counter(
            "lazarus_agent_tasks_finished",
            "Task handlers that ended, by outcome.",
            ["outcome"],
            registry=r,
        )
        self.fence_events = Counter(
            "lazarus_agent_fence_events", "Self-fences: every task paused.", registry=r
        )
        self.stale_welcomes = Counter(
            "lazarus_agent_stale_welcomes",
            "Welcomes ignored: they answered an earlier Hello than the newest (a late reply).",
            registry=r,
        )
        self.session_refusals = Counter(
            "lazarus_agent_session_refusals",
            "Hellos refused with FAILED_PRECONDITION (another live process holds the node id).",
            registry=r,
        )
        self.directive_failures = Counter(
            "lazarus_agent_directive_failures",
            "Batches of leader directives the agent failed to apply; each ends the Session "
            "(and, if the core had stepped past them, stops the agent).",
            registry=r,
        )
        self.loop_failures = Counter(
            "lazarus_agent_loop_failures",
            "Long-lived agent loops (session, tick, Redis generation) that ended outside a "
            "stop; each stops the agent (exit 1).",
            ["loop"],
            registry=r,
        )
        self.dials_held_off = Counter(
            "lazarus_agent_dials_held_off",
            "Coordinator addresses skipped when dialling: unreachable within the hold-off.",
            registry=r,
        )
        self.redis_resets = Counter(
            "lazarus_agent_redis_resets",
            "Redis data loss seen (generation marker changed, or a gap in a task's journal).",
            ["signal"],
            registry=r,
        )
        self.reshipped_tasks = Counter(
            "lazarus_agent_reshipped_tasks",
            "Tasks re-shipped to Redis from the local store after Redis lost data.",
            registry=r,
        )
        self.data_loss = Counter(
            "lazarus_agent_data_loss",
            "Assignments whose acknowledged checkpoint was in neither Redis nor the local store.",
            registry=r,
        )
        self.session_reconnects = Counter(
            "lazarus_agent_session_reconnects", "Sessions opened after the first.", registry=r
        )
        self.heartbeat_rtt = Histogram(
            "lazarus_agent_heartbeat_rtt_seconds",
            "Heartbeat send to ack.",
            buckets=_RTT_BUCKETS_S,
            registry=r,
        )

    def add_checkpoint_source(self, source: CheckpointSource) -> None:
        """Count ``source``'s checkpoint durations into ``lazarus_agent_checkpoint_seconds``
        (read at every scrape; ``WorkerPool.checkpoint_stats`` is one)."""
        self._checkpoint_collector.sources.append(source)

    def serve(self, host: str, port: int) -> None:
        """Serve ``/metrics`` on host:port from a daemon thread.

        Raises:
            OSError: the address cannot be bound.
        """
        start_http_server(port, addr=host, registry=self.registry)
