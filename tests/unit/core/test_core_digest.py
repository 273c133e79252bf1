"""``HeartbeatDigest``: a follower's batch of heartbeats, stepped as one event (issue 20).

The digest is only a cheaper way to step the same facts: every heartbeat in it
must be judged exactly as if it had been stepped alone at the batch's arrival
time. These tests build two identical cores, step the heartbeats one by one
in the first and as one digest in the second, and compare what each sent,
emitted and persisted, and the state each ended in.
"""

from __future__ import annotations

from core_harness import Harness, directives

from coordinator.core import (
    CloseSession,
    Command,
    EmitEvent,
    HeartbeatAck,
    HeartbeatDigest,
    HeartbeatReceived,
    NodeState,
    PersistNodes,
    PersistTasks,
    SendDirective,
    TaskProgress,
)
from coordinator.core.commands import merge_steps
from coordinator.core.limits import LIMITS


def _cluster() -> Harness:
    """Three nodes, two tasks placed, n3 SUSPECT (silent for 1.1 s), all on one clock."""
    h = Harness()
    h.lead()
    for node in ("n1", "n2", "n3"):
        h.hello(node)
    h.submit("r1", "t1")
    h.submit("r2", "t2")
    for step in range(1, 10):
        h.at(step * 0.5).tick()
        for node in ("n1", "n2", "n3") if step <= 7 else ("n1", "n2"):
            h.heartbeat(node)
    h.at(4.6).tick()  # n3 silent since 3.5 s: SUSPECT after 2 intervals
    return h


def _heartbeats(h: Harness) -> list[HeartbeatReceived]:
    seq = h.seq
    owned = tuple(
        TaskProgress(t, h.task(t).epoch) for t in ("t1", "t2") if h.task(t).owner_node_id == "n1"
    )
    stale = TaskProgress("t1", h.task("t1").epoch + 5)  # an epoch nobody holds: fenced
    over_limit = tuple(TaskProgress(f"x{i}", 1) for i in range(LIMITS.tasks_per_heartbeat + 1))
    return [
        HeartbeatReceived(h.sessions["n1"], "n1", seq["n1"] + 1, h.now, tasks=owned),
        HeartbeatReceived(h.sessions["n3"], "n3", seq["n3"] + 1, h.now),  # SUSPECT -> ALIVE
        HeartbeatReceived(h.sessions["n2"], "n2", seq["n2"], h.now),  # seq not above: closed
        HeartbeatReceived(h.sessions["n1"], "n1", seq["n1"] + 2, h.now, tasks=(stale,)),
        # Over the intake limit: refused naming the field.
        HeartbeatReceived(h.sessions["n3"], "n3", seq["n3"] + 2, h.now, tasks=over_limit),
        HeartbeatReceived("no-such-session", "n1", seq["n1"] + 3, h.now),  # replaced: ignored
    ]


def _by_kind(commands: list[Command]) -> tuple[dict[str, object], list[Command], list[Command]]:
    """What was written (each record's newest value), emitted and sent, in order."""
    persists: dict[str, object] = {}
    for c in commands:
        if isinstance(c, PersistNodes):
            persists.update({f"node/{r.node_id}": r for r in c.records})
        elif isinstance(c, PersistTasks):
            persists.update({f"task/{r.task_id}": r for r in c.records})
    emits = [c for c in commands if isinstance(c, EmitEvent)]
    sends = [c for c in commands if isinstance(c, SendDirective | CloseSession)]
    return persists, emits, sends


def test_a_digest_decides_what_its_heartbeats_would_one_by_one() -> None:
    alone, digested = _cluster(), _cluster()
    assert alone.core.snapshot() == digested.core.snapshot()
    assert alone.core.snapshot().nodes[2].record.state is NodeState.SUSPECT

    one_by_one = merge_steps([alone.step(hb) for hb in _heartbeats(alone)])
    batch = digested.step(HeartbeatDigest(tuple(_heartbeats(digested)), digested.now))

    assert _by_kind(batch) == _by_kind(one_by_one)
    assert digested.core.snapshot() == alone.core.snapshot()
    # What the cases above are meant to exercise did happen.
    acked = [(d.seq, d.node_state) for d in directives(batch, HeartbeatAck)]
    assert (digested.seq["n3"] + 1, NodeState.ALIVE) in acked
    assert (digested.seq["n1"] + 2, NodeState.ALIVE) in acked
    closed = [c.reason for c in batch if isinstance(c, CloseSession)]
    assert any("heartbeat.seq" in r for r in closed)
    assert any("heartbeat.tasks" in r for r in closed)


def test_an_empty_digest_changes_nothing() -> None:
    h = _cluster()
    before = h.core.snapshot()
    assert h.step(HeartbeatDigest((), h.now)) == []
    assert h.core.snapshot() == before


def test_the_cheap_state_counts_agree_with_a_snapshot() -> None:
    # The metrics read counts_by_state every half second instead of a snapshot.
    h = _cluster()
    h.step(HeartbeatDigest(tuple(_heartbeats(h)), h.now))
    snapshot = h.core.snapshot()
    nodes, tasks = h.core.counts_by_state()
    assert nodes == snapshot.nodes_by_state()
    assert tasks == snapshot.tasks_by_state()
    assert sum(nodes.values()) == 3
    assert sum(tasks.values()) == 2


def _state_changes(h: Harness, node_id: str) -> list[tuple[float, NodeState]]:
    changes = []
    for _, commands in h.log:
        for c in commands:
            if isinstance(c, PersistNodes):
                for r in c.records:
                    if r.node_id == node_id and (not changes or changes[-1][1] is not r.state):
                        changes.append((r.state_changed_at_s or 0.0, r.state))
    return changes


def test_ticks_that_skip_the_scan_still_judge_a_silent_node_on_time() -> None:
    # Most ticks skip the per-node scan (nobody can be due yet); a node that
    # falls silent is still SUSPECT on the first tick after 1 s of silence and
    # DEAD on the first at 3 s, as with a scan on every tick.
    h = Harness()
    h.lead()
    h.hello("n1")
    h.hello("n2")
    h.run_until(6.0, heartbeating=["n1", "n2"])
    h.hello("n3")  # a node that joins between scans is judged too
    h.run_until(12.0, heartbeating=["n1"])
    assert _state_changes(h, "n2")[1:] == [(7.1, NodeState.SUSPECT), (9.0, NodeState.DEAD)]
    assert _state_changes(h, "n3")[1:] == [(7.1, NodeState.SUSPECT), (9.0, NodeState.DEAD)]
    assert _state_changes(h, "n1") == [(0.0, NodeState.ALIVE)]
