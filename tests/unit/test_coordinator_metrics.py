"""Metrics observer: series names, base units, and what each fact changes."""

from __future__ import annotations

from random import Random

from prometheus_client import generate_latest
from typer.testing import CliRunner

from coordinator.core import CoordinatorCore, EmitEvent, LeadershipAcquired
from coordinator.core.notices import NodeDead, NodeLeft
from coordinator.metrics import Metrics
from lazarus.cli import app


def _value(metrics: Metrics, name: str, labels: dict[str, str] | None = None) -> float:
    got = metrics.registry.get_sample_value(name, labels or {})
    assert got is not None, name
    return got


def test_observer_facts_become_series() -> None:
    metrics = Metrics()
    metrics.leadership_changed(True, 42)
    assert _value(metrics, "lazarus_is_leader") == 1
    assert _value(metrics, "lazarus_term") == 42
    metrics.leader_observed("/e/1", 42)
    metrics.leader_observed("/e/1", 42)
    assert _value(metrics, "lazarus_leader_changes_total") == 1
    metrics.leader_observed("/e/2", 43)
    assert _value(metrics, "lazarus_leader_changes_total") == 2
    metrics.heartbeats_received(["n"], 10.0)
    metrics.heartbeats_received(["n", "m"], 10.5)
    assert _value(metrics, "lazarus_heartbeats_received_total") == 3
    assert _value(metrics, "lazarus_heartbeat_interarrival_seconds_count") == 1
    assert _value(metrics, "lazarus_heartbeat_interarrival_seconds_sum") == 0.5
    metrics.event_emitted(EmitEvent(1, 0.0, NodeDead("n", "i", 1.0, 3.1, 0)))
    assert _value(metrics, "lazarus_failure_detection_seconds_sum") == 3.1
    metrics.etcd_write(0.004, True)
    assert _value(metrics, "lazarus_etcd_transaction_seconds_count", {"outcome": "ok"}) == 1
    core = CoordinatorCore(rng=Random(1))
    core.step(LeadershipAcquired(term=1, now_s=1.0))
    metrics.state_changed(core)
    assert _value(metrics, "lazarus_nodes", {"state": "ALIVE"}) == 0
    assert _value(metrics, "lazarus_tasks", {"state": "PENDING"}) == 0
    metrics.sessions_sent_away("leader_gone")
    metrics.sessions_sent_away("leader_gone")
    metrics.sessions_sent_away("link_busy")
    sent_away = "lazarus_forward_sessions_sent_away_total"
    assert _value(metrics, sent_away, {"reason": "leader_gone"}) == 2
    assert _value(metrics, sent_away, {"reason": "link_busy"}) == 1
    metrics.leadership_changed(False, 42)
    assert _value(metrics, "lazarus_is_leader") == 0
    text = generate_latest(metrics.registry).decode()
    assert all(line.startswith(("#", "lazarus_")) for line in text.splitlines() if line), text


def test_gone_nodes_leave_no_last_heartbeat_behind() -> None:
    m = Metrics()
    m.leadership_changed(True, 1)
    for i in range(100):  # a DaemonSet rollout: pods say Goodbye, come back under new names
        m.heartbeats_received([f"old-{i}"], 10.0)
        m.event_emitted(EmitEvent(1, 10.1, NodeLeft(f"old-{i}", "i", "rollout", 0)))
    m.heartbeats_received(["dead"], 10.0)
    m.event_emitted(EmitEvent(1, 13.0, NodeDead("dead", "i", 10.0, 3.0, 0)))
    m.heartbeats_received(["late"], 10.0)  # stepped with its Goodbye, reported after NodeLeft
    m.nodes_retired(["late", "never-seen"])  # RetireRecords carried out
    assert m._last_heartbeat_s == {}
    m.heartbeats_received(["old-0", "late"], 50.0)  # the names again: no interarrival from before
    assert _value(m, "lazarus_heartbeat_interarrival_seconds_count") == 0


def test_coordinator_help_lists_env_vars_and_example() -> None:
    result = CliRunner().invoke(app, ["coordinator", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for needle in ("LAZARUS_DEAD_AFTER_S", "LAZARUS_LEASE_TTL_S", "LAZARUS_ETCD_ENDPOINT"):
        assert needle in result.output
    assert "Example: lazarus coordinator" in result.output


def test_recovery_notices_become_recovery_series() -> None:
    from coordinator.core.notices import ConflictDetected, RecoveryCompleted, TaskResumed

    m = Metrics()
    m.event_emitted(EmitEvent(1, 10.0, RecoveryCompleted("n1", "i1", 7, 1, 3.0, 0.4)))
    resumed = TaskResumed(
        "t1", "n2", 2, 5, from_redis=True, replayed_journal_events=9, interruption_s=3.5
    )
    m.event_emitted(EmitEvent(1, 10.0, resumed))
    lost = TaskResumed("t2", "n2", 2, 3, redone_checkpoints=2, interruption_s=3.5)
    m.event_emitted(EmitEvent(1, 10.0, lost))
    m.event_emitted(EmitEvent(1, 10.0, ConflictDetected("f", "t", "n", 1, 2, "m", 0, 1, 5, 5, 0)))
    assert _value(m, "lazarus_recovery_seconds_count") == 1
    assert _value(m, "lazarus_recovery_seconds_sum") == 0.4
    assert _value(m, "lazarus_recovered_tasks_total") == 7
    assert _value(m, "lazarus_failed_recoveries_total") == 1
    assert _value(m, "lazarus_replayed_journal_events_total") == 9
    assert _value(m, "lazarus_data_loss_events_total") == 1
    assert _value(m, "lazarus_task_interruption_seconds_count") == 2
    assert _value(m, "lazarus_conflicts_total") == 1
