"""Prometheus metrics of a coordinator replica, on an HTTP port of its own.

Theory of operation: :class:`Metrics` is the runtime's ``Observer``: the
runtime reports facts (leadership changes, heartbeats, emitted events, etcd
write durations, steps) and this module turns them into ``lazarus_*`` series
in base units (seconds, counts; counters end in ``_total``). Gauges that
summarise the core (nodes and tasks by state) are refreshed from the core at
most every :data:`REFRESH_INTERVAL_S` on the event loop, never from the
scraping thread. Every replica exports; only the leader's node and task gauges
are non-zero.

Series:

- ``lazarus_is_leader`` (1 / 0), ``lazarus_term`` (0 on followers),
  ``lazarus_leader_changes_total`` (distinct leader keys this replica saw in
  the election, the first one included);
- ``lazarus_nodes{state}``, ``lazarus_tasks{state}``;
- ``lazarus_heartbeats_received_total``,
  ``lazarus_heartbeat_interarrival_seconds`` (histogram, per arrival after the
  first of a node);
- ``lazarus_failure_detection_seconds`` (histogram: last heartbeat -> DEAD,
  from the core's NodeDead events);
- ``lazarus_etcd_transaction_seconds{outcome}`` (histogram of fenced writes);
- recovery (state_recovery_patterns.md): ``lazarus_recovery_seconds``
  (histogram: DEAD verdict -> the node's last task RUNNING elsewhere),
  ``lazarus_recovered_tasks_total``, ``lazarus_failed_recoveries_total``
  (tasks of a dead node that ended FAILED instead), ``lazarus_data_loss_events_total``
  (a task resumed from a checkpoint older than one its record shows
  replicated, which must stay 0, or a task failed with
  ``TASK_ERROR_CODE_DATA_LOSS`` because Redis lost its acknowledged
  checkpoint and no store held it; ``node_agent/core/redisloss.py``),
  ``lazarus_replayed_journal_events_total``,
  ``lazarus_work_redone_seconds`` (histogram, upper bound per resumed task),
  ``lazarus_task_interruption_seconds`` (histogram: owner lost -> resumed),
  ``lazarus_conflicts_total`` (forks kept from fenced owners);
- identity (DESIGN.md §4): ``lazarus_identity_conflicts_total{reason}`` (Hellos
  refused because another live incarnation holds the node id, or an
  incarnation id was reused without its secret);
- load (``coordinator.core.loadcheck``): ``lazarus_records_quarantined_total{collection}``
  (records moved aside at load);
- shared documents (``coordinator.documents``): ``lazarus_reconcile_seconds``
  (histogram: reconcile session start -> verified),
  ``lazarus_reconcile_sessions_total{converged}``,
  ``lazarus_reconcile_deltas_total`` (deltas merged into or shipped from the
  canonical replicas), ``lazarus_reconcile_conflicts_total`` (concurrent
  writes of one key resolved by the document's policy),
  ``lazarus_shared_documents`` (canonical replicas held), and
  ``lazarus_state_vector_divergence_ops`` (operations the canonical replicas
  hold that connected nodes are not known to hold, summed);
- fan-in (``coordinator.forwarding``): ``lazarus_forwarded_sessions{side}``
  (agents' Sessions this replica holds and forwards, ``side="follower"``, or
  serves for followers, ``side="leader"``),
  ``lazarus_forward_batches_total{direction}`` and
  ``lazarus_forward_entries_total{direction}`` (``sent`` / ``received`` on the
  Forward streams), ``lazarus_forward_ack_seconds`` (histogram, follower: a
  heartbeat's arrival from its agent to the leader's ack leaving for it),
  ``lazarus_forward_heartbeats_total{path}`` (leader: forwarded heartbeats
  stepped as liveness digests, ``path="digest"``, or behind an older message
  of their Session through the Session servicer, ``path="message"``),
  ``lazarus_forward_interregnum_acks_total`` (follower: heartbeats acked by
  rule (b), the leader's election key seen deleted),
  ``lazarus_forward_sessions_sent_away_total{reason}`` (follower: new
  Sessions answered NotLeader, so their agents dial again: ``no_leader``,
  ``leader_gone``, ``link_busy``; see ``coordinator.forwarding``);
- the event archive (``coordinator.eventarchive``): ``lazarus_event_archive_backlog``
  (events waiting for Redis) and ``lazarus_event_archive_dropped_events``
  (never archived: the backlog overflowed during an outage).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from coordinator.core import CoordinatorCore, EmitEvent, NodeState, Role, TaskState
from coordinator.core.notices import (
    ConflictDetected,
    IdentityConflict,
    NodeDead,
    NodeLeft,
    RecordQuarantined,
    RecoveryCompleted,
    TaskFailed,
    TaskResumed,
)
from coordinator.core.records import TaskErrorCode
from reconcile.hub import HubStats

__all__ = ["REFRESH_INTERVAL_S", "Metrics"]

REFRESH_INTERVAL_S = 0.5
"""Shortest interval between two refreshes of the by-state gauges."""

_INTERARRIVAL_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)
_DETECTION_BUCKETS_S = (0.5, 1.0, 2.0, 3.0, 3.5, 4.0, 5.0, 7.5, 10.0, 30.0)
_RECOVERY_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)
_ETCD_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class Metrics:
    """The replica's metrics in a registry of their own.

    Args:
        registry: where to register (default: a new ``CollectorRegistry``).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.is_leader = Gauge("lazarus_is_leader", "1 while this replica leads.", registry=r)
        self.term = Gauge("lazarus_term", "Term of the current leadership (0: none).", registry=r)
        self.leader_changes = Counter(
            "lazarus_leader_changes", "Leader changes this replica saw in the election.", registry=r
        )
        self.nodes = Gauge("lazarus_nodes", "Nodes by state (leader only).", ["state"], registry=r)
        self.tasks = Gauge("lazarus_tasks", "Tasks by state (leader only).", ["state"], registry=r)
        self.heartbeats = Counter(
            "lazarus_heartbeats_received", "Heartbeats received on Sessions.", registry=r
        )
        self.interarrival = Histogram(
            "lazarus_heartbeat_interarrival_seconds",
            "Time between two heartbeats of one node.",
            buckets=_INTERARRIVAL_BUCKETS_S,
            registry=r,
        )
        self.detection = Histogram(
            "lazarus_failure_detection_seconds",
            "Last heartbeat of a node to its DEAD verdict.",
            buckets=_DETECTION_BUCKETS_S,
            registry=r,
        )
        self.etcd_txn = Histogram(
            "lazarus_etcd_transaction_seconds",
            "Duration of leader-fenced etcd writes.",
            ["outcome"],
            buckets=_ETCD_BUCKETS_S,
            registry=r,
        )
        self.recovery = Histogram(
            "lazarus_recovery_seconds",
            "DEAD verdict of a node to the last of its tasks RUNNING elsewhere.",
            buckets=_RECOVERY_BUCKETS_S,
            registry=r,
        )
        self.recovered = Counter(
            "lazarus_recovered_tasks", "Tasks of dead nodes running again elsewhere.", registry=r
        )
        self.failed_recoveries = Counter(
            "lazarus_failed_recoveries",
            "Tasks of dead nodes that ended FAILED instead of resuming.",
            registry=r,
        )
        self.data_loss = Counter(
            "lazarus_data_loss_events",
            "Resumes from a checkpoint older than one known replicated (must stay 0), "
            "and tasks failed with DATA_LOSS (Redis lost an acknowledged checkpoint).",
            registry=r,
        )
        self.replayed = Counter(
            "lazarus_replayed_journal_events",
            "Journal events replayed after a checkpoint on resume.",
            registry=r,
        )
        self.redone = Histogram(
            "lazarus_work_redone_seconds",
            "Upper bound of work a resumed task redoes (resume point to last heartbeat).",
            buckets=_RECOVERY_BUCKETS_S,
            registry=r,
        )
        self.interruption = Histogram(
            "lazarus_task_interruption_seconds",
            "A task's owner lost (or released) to the task running again.",
            buckets=_RECOVERY_BUCKETS_S,
            registry=r,
        )
        self.conflicts = Counter(
            "lazarus_conflicts", "Forks kept from fenced owners' divergent progress.", registry=r
        )
        self.quarantined = Counter(
            "lazarus_records_quarantined",
            "Records moved aside at load (unparsable or breaking the core's rules).",
            ["collection"],
            registry=r,
        )
        self.reconcile_seconds = Histogram(
            "lazarus_reconcile_seconds",
            "Reconcile session start to every replica verified.",
            buckets=_RECOVERY_BUCKETS_S,
            registry=r,
        )
        self.reconcile_sessions = Counter(
            "lazarus_reconcile_sessions", "Reconcile sessions ended.", ["converged"], registry=r
        )
        self.reconcile_deltas = Counter(
            "lazarus_reconcile_deltas",
            "Deltas merged into or shipped from the canonical shared documents.",
            registry=r,
        )
        self.reconcile_conflicts = Counter(
            "lazarus_reconcile_conflicts",
            "Concurrent writes of one key resolved by the document's policy.",
            registry=r,
        )
        self.shared_documents = Gauge(
            "lazarus_shared_documents", "Canonical shared documents held (leader).", registry=r
        )
        self.divergence = Gauge(
            "lazarus_state_vector_divergence_ops",
            "Operations of the canonical documents that connected nodes lack, summed.",
            registry=r,
        )
        self.archive_backlog = Gauge(
            "lazarus_event_archive_backlog",
            "Events waiting to be written to the Redis event archive.",
            registry=r,
        )
        self.archive_lost = Gauge(
            "lazarus_event_archive_dropped_events",
            "Events never archived: the backlog overflowed during a Redis outage.",
            registry=r,
        )
        self.forwarded = Gauge(
            "lazarus_forwarded_sessions",
            "Agents' Sessions forwarded (fan-in): held as follower, served as leader.",
            ["side"],
            registry=r,
        )
        self.forward_batches = Counter(
            "lazarus_forward_batches",
            "ForwardBatches on Forward streams, by direction (sent / received).",
            ["direction"],
            registry=r,
        )
        self.forward_entries = Counter(
            "lazarus_forward_entries",
            "Entries of ForwardBatches (an agent message, heartbeat or ack, or a Session end), "
            "by direction.",
            ["direction"],
            registry=r,
        )
        self.forward_ack_seconds = Histogram(
            "lazarus_forward_ack_seconds",
            "Follower: a heartbeat's arrival from its agent to the leader's ack leaving for it.",
            buckets=_ETCD_BUCKETS_S,
            registry=r,
        )
        self.forward_heartbeats_total = Counter(
            "lazarus_forward_heartbeats",
            "Leader: forwarded heartbeats stepped, by path (digest: one core event per "
            "batch; message: behind an older message of their Session).",
            ["path"],
            registry=r,
        )
        self.interregnum_acks_total = Counter(
            "lazarus_forward_interregnum_acks",
            "Follower: heartbeats acked by rule (b) of docs/fan-in.md (the leader's election "
            "key was seen deleted; no leader could ack them).",
            registry=r,
        )
        self.forward_backpressure_total = Counter(
            "lazarus_forward_backpressure",
            "Forward streams that hit a bound, by side (leader: a stream paused its reads "
            "while the runtime's backlog was over its bound; follower: a link was ended "
            "because the leader left its entries unread).",
            ["side"],
            registry=r,
        )
        self.sent_away_total = Counter(
            "lazarus_forward_sessions_sent_away",
            "Follower: new Sessions answered NotLeader (the agent dials again), by reason "
            "(no_leader: no link to a leader could be made; leader_gone: the linked leader "
            "went and its redial is not waited for; link_busy: a link attempt in progress "
            "took longer than the wait).",
            ["reason"],
            registry=r,
        )
        self.identity_conflicts = Counter(
            "lazarus_identity_conflicts",
            "Hellos refused: the node id is held by another live incarnation "
            "(or an incarnation id was reused without its secret).",
            ["reason"],
            registry=r,
        )
        self._hub_deltas = 0
        self._hub_conflicts = 0
        for state in NodeState:
            self.nodes.labels(state.name).set(0)
        for task_state in TaskState:
            self.tasks.labels(task_state.name).set(0)
        # node id -> its last heartbeat's arrival (s); a node is forgotten when it
        # turns DEAD or LEFT, when it is retired, and at each leadership change,
        # so pods re-created under new names do not pile up here.
        self._last_heartbeat_s: dict[str, float] = {}
        self._refreshed_at = float("-inf")
        self._leader_key = ""

    def forwarded_sessions(self, side: str, delta: int) -> None:
        """Forwarded Sessions held (follower) or served (leader) changed by ``delta``."""
        self.forwarded.labels(side).inc(delta)

    def forward_batch(self, direction: str, entries: int) -> None:
        """A ForwardBatch of ``entries`` was ``sent`` or ``received``."""
        self.forward_batches.labels(direction).inc()
        self.forward_entries.labels(direction).inc(entries)

    def forward_ack(self, seconds: float) -> None:
        """A forwarded heartbeat's ack left for its agent ``seconds`` after it arrived."""
        self.forward_ack_seconds.observe(seconds)

    def forward_heartbeats(self, path: str, count: int) -> None:
        """The leader stepped ``count`` forwarded heartbeats by ``path`` (digest / message)."""
        self.forward_heartbeats_total.labels(path).inc(count)

    def interregnum_acks(self, count: int) -> None:
        """A follower acked ``count`` heartbeats by rule (b) (no leader could)."""
        self.interregnum_acks_total.inc(count)

    def sessions_sent_away(self, reason: str) -> None:
        """A follower answered a new Session NotLeader for ``reason`` (its agent dials again)."""
        self.sent_away_total.labels(reason).inc()

    def forward_backpressure(self, side: str) -> None:
        """A Forward stream hit a bound (leader: paused reading; follower: ended its link)."""
        self.forward_backpressure_total.labels(side).inc()

    def watch_archive(self, backlog: Callable[[], float], dropped: Callable[[], float]) -> None:
        """Read the event archive's backlog and dropped count at each scrape."""
        self.archive_backlog.set_function(backlog)
        self.archive_lost.set_function(dropped)

    def serve(self, host: str, port: int) -> None:
        """Expose ``/metrics`` on ``host:port`` from a daemon thread."""
        start_http_server(port, addr=host, registry=self.registry)

    # ------------------------------------------------------------------ Observer

    def leadership_changed(self, leading: bool, term: int) -> None:
        """This replica started or stopped leading."""
        self.is_leader.set(1 if leading else 0)
        self.term.set(term if leading else 0)
        self._last_heartbeat_s.clear()

    def leader_observed(self, key: str, term: int) -> None:
        """The election shows leader ``key``: count it when it differs from the last one."""
        if key != self._leader_key:
            self._leader_key = key
            self.leader_changes.inc()

    def heartbeats_received(self, node_ids: Sequence[str], now_s: float) -> None:
        """A heartbeat of each of ``node_ids`` arrived at ``now_s`` (one counter
        update per batch: a fan-in digest carries many)."""
        self.heartbeats.inc(len(node_ids))
        last = self._last_heartbeat_s
        observe = self.interarrival.observe
        for node_id in node_ids:
            previous = last.get(node_id)
            if previous is not None:
                observe(max(0.0, now_s - previous))
            last[node_id] = now_s

    def nodes_retired(self, node_ids: Sequence[str]) -> None:
        """The core retired ``node_ids`` (``RetireRecords``): forget their last heartbeat.

        NodeDead and NodeLeft forget a node already; this catches an entry made
        after them (a heartbeat stepped in the Goodbye's batch is reported once
        the batch is done), so a node that is gone for good leaves nothing here.
        """
        last = self._last_heartbeat_s
        for node_id in node_ids:
            last.pop(node_id, None)

    def event_emitted(self, event: EmitEvent) -> None:
        """The core emitted a cluster event."""
        body = event.body
        if isinstance(body, NodeDead):
            self.detection.observe(body.detection_s)
            self._last_heartbeat_s.pop(body.node_id, None)
        elif isinstance(body, NodeLeft):
            self._last_heartbeat_s.pop(body.node_id, None)
        elif isinstance(body, RecoveryCompleted):
            self.recovery.observe(body.recovery_s)
            self.recovered.inc(body.tasks_recovered)
            self.failed_recoveries.inc(body.tasks_failed)
        elif isinstance(body, TaskResumed):
            self.replayed.inc(body.replayed_journal_events)
            if body.redone_checkpoints:
                self.data_loss.inc()
            if body.interruption_s:
                self.interruption.observe(body.interruption_s)
                self.redone.observe(body.work_redone_s)
        elif isinstance(body, TaskFailed):
            if body.error.code is TaskErrorCode.DATA_LOSS:
                self.data_loss.inc()
        elif isinstance(body, ConflictDetected):
            self.conflicts.inc()
        elif isinstance(body, IdentityConflict):
            self.identity_conflicts.labels(body.reason).inc()
        elif isinstance(body, RecordQuarantined):
            self.quarantined.labels(body.collection).inc()

    def documents_observed(self, stats: HubStats) -> None:
        """The document hub's numbers now (counters advance by what is new)."""
        self.shared_documents.set(stats.documents)
        self.divergence.set(stats.divergence_ops)
        if stats.deltas_total < self._hub_deltas or stats.conflicts_total < self._hub_conflicts:
            self._hub_deltas = self._hub_conflicts = 0  # a new leadership's hub
        self.reconcile_deltas.inc(stats.deltas_total - self._hub_deltas)
        self.reconcile_conflicts.inc(stats.conflicts_total - self._hub_conflicts)
        self._hub_deltas, self._hub_conflicts = stats.deltas_total, stats.conflicts_total

    def reconcile_completed(self, seconds: float, converged: bool) -> None:
        """A reconcile session ended after ``seconds``."""
        self.reconcile_seconds.observe(seconds)
        self.reconcile_sessions.labels("true" if converged else "false").inc()

    def etcd_write(self, seconds: float, ok: bool) -> None:
        """A fenced etcd write took ``seconds``."""
        self.etcd_txn.labels("ok" if ok else "error").observe(seconds)

    def state_changed(self, core: CoordinatorCore) -> None:
        """Refresh the by-state gauges, at most every REFRESH_INTERVAL_S."""
        now = time.monotonic()
        leading = core.role is Role.LEADER
        if leading and now - self._refreshed_at < REFRESH_INTERVAL_S:
            return
        self._refreshed_at = now
        nodes, tasks = core.counts_by_state()
        for state in NodeState:
            self.nodes.labels(state.name).set(nodes.get(state, 0))
        for task_state in TaskState:
            self.tasks.labels(task_state.name).set(tasks.get(task_state, 0))
