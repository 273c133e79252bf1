"""AgentCore (``node_agent.core``) driven step by step with explicit clocks.

The core speaks plain records (``node_agent.core.records``); the stored meta
tests go through the edge's codec (``node_agent.convert``) as the shell does.

Every call passes ``now`` (monotonic seconds) and ``wall_ms``; the tests read
the commands each step returns. The property tests run a small simulated
network (ticks every ~50 ms with jitter, delayed and dropped acks, silent
Session closes, reconnects, epoch supersedes) against a reference model of the
self-fence rule of DESIGN.md §6:

    s = send time of the oldest unacked heartbeat, or (none outstanding) the
        last acked send + heartbeat_interval (the Hello counts as acked once
        its Welcome arrives);
    every RUNNING task gets StopTask(FENCED) by s + fence_after - fence_lead
    (within one tick), with a CloseSession, and nothing starts until a new
    Welcome.
"""

from __future__ import annotations

import heapq
import itertools
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from random import Random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lazarus.v1 import agent_pb2
from node_agent import convert
from node_agent.core import (
    AgentCore,
    CloseSession,
    Command,
    ForgetTask,
    Notice,
    PersistMeta,
    PersistMetas,
    ReportLineage,
    Send,
    SlotState,
    StartTask,
    StopReason,
    StopTask,
    TaskMeta,
    check_command_order,
    ready_batch,
)
from node_agent.core import records as rec
from node_agent.core.core import (
    DEFAULT_LOCAL_PROGRESS_REPORT_INTERVAL_S,
    DEFAULT_PROGRESS_REPORT_INTERVAL_S,
)
from node_agent.settings import AgentSettings, SettingsError

ROOT = Path(__file__).resolve().parents[2]
HB_MS = 500
FENCE_MS = 2000
LEAD_S = 0.5
INTERVAL_S = HB_MS / 1000
FENCE_S = FENCE_MS / 1000

# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def wall(now: float) -> int:
    return 1_700_000_000_000 + int(now * 1000)


def new_core(**kw: Any) -> AgentCore:
    kw.setdefault("fence_lead_s", LEAD_S)
    kw.setdefault("progress_report_interval_s", 1.0)
    return AgentCore("node-1", "inc-1", **kw)


def welcome_msg(term: int = 7, hb_ms: int = HB_MS, fence_ms: int = FENCE_MS) -> rec.Welcome:
    return rec.Welcome(
        term=term, leader_id="c1", heartbeat_interval_ms=hb_ms, fence_after_ms=fence_ms
    )


def assign_msg(
    task_id: str,
    epoch: int,
    *,
    attempt: int = 1,
    kind: str = "demo",
    reason: rec.AssignReason = rec.AssignReason.NEW,
) -> rec.Assign:
    return rec.Assign(task_id=task_id, epoch=epoch, attempt=attempt, kind=kind, reason=reason)


def revoke_msg(
    task_id: str, epoch: int, reason: rec.RevokeReason, current_epoch: int = 0
) -> rec.Revoke:
    return rec.Revoke(
        task_id=task_id, epoch=epoch, current_epoch=current_epoch or epoch, reason=reason
    )


def release_msg(task_id: str, epoch: int, move_id: str = "mv-1") -> rec.Release:
    return rec.Release(move_id=move_id, task_id=task_id, epoch=epoch)


def hb_ack_msg(seq: int) -> rec.HeartbeatAck:
    return rec.HeartbeatAck(seq=seq, term=7)


def update_ack_msg(
    update_seq: int, task_id: str, epoch: int, outcome: rec.UpdateOutcome
) -> rec.TaskUpdateAck:
    return rec.TaskUpdateAck(update_seq=update_seq, task_id=task_id, epoch=epoch, outcome=outcome)


def ckpt(task_id: str, epoch: int, seq: int) -> rec.CheckpointSummary:
    return rec.CheckpointSummary(
        checkpoint_ref=f"{task_id}@{seq}", task_id=task_id, epoch=epoch, seq=seq
    )


def heartbeats(cmds: list[Command]) -> list[rec.Heartbeat]:
    return [c.message for c in cmds if isinstance(c, Send) and isinstance(c.message, rec.Heartbeat)]


def updates(cmds: list[Command]) -> list[rec.TaskUpdate]:
    return [
        c.message for c in cmds if isinstance(c, Send) and isinstance(c.message, rec.TaskUpdate)
    ]


def change(update: rec.TaskUpdate) -> str:
    """The update's kind, as the wire's oneof names it ("completed", "released", ...)."""
    return type(update.change).__name__.lower()


def restore_raw(core: AgentCore, raw: dict[str, bytes]) -> list[Command]:
    """``AgentCore.restore`` of stored meta bytes, decoded at the edge as the shell does."""
    return core.restore(*convert.decode_metas(raw))


def raw_meta(epoch: int, attempt: int, kind: str, state: str, update: str = "") -> bytes:
    """A stored meta as the agent writes it (``convert.encode_meta``'s format)."""
    doc = {"epoch": epoch, "attempt": attempt, "kind": kind, "state": state, "update": update}
    return json.dumps(doc, sort_keys=True).encode()


def notices(cmds: list[Command], kind: str) -> list[Notice]:
    return [c for c in cmds if isinstance(c, Notice) and c.kind == kind]


def of_type(cmds: list[Command], cls: type) -> list[Any]:
    return [c for c in cmds if isinstance(c, cls)]


def starts(cmds: list[Command]) -> list[tuple[str, int]]:
    return [(c.assign.task_id, c.assign.epoch) for c in cmds if isinstance(c, StartTask)]


def held(core: AgentCore, now: float) -> dict[str, tuple[int, int]]:
    """task id -> (epoch, HeldTaskStatus) as the next Hello lists them."""
    hello = core.hello(now, wall(now))
    return {h.task_id: (h.epoch, h.status) for h in hello.held_tasks}


class Driver:
    """A core plus a clock; every call passes the current time."""

    def __init__(self, core: AgentCore | None = None) -> None:
        self.core = core or new_core()
        self.now = 0.0

    def at(self, now: float) -> Driver:
        assert now >= self.now
        self.now = now
        return self

    def hello(self) -> rec.Hello:
        return self.core.hello(self.now, wall(self.now))

    def msg(self, m: rec.CoordinatorMessage) -> list[Command]:
        out = self.core.on_message(m, self.now, wall(self.now))
        check_command_order(out)
        return out

    def tick(self) -> list[Command]:
        return self.core.tick(self.now, wall(self.now))

    def connect(self, **kw: Any) -> list[Command]:
        self.hello()
        return self.msg(welcome_msg(**kw))

    def run(self, task_id: str, epoch: int = 1, **kw: Any) -> list[Command]:
        out = self.msg(assign_msg(task_id, epoch, **kw))
        assert starts(out) == [(task_id, epoch)], out
        out += self.core.task_started(task_id, epoch, rec.Started(), wall(0))
        return out

    def stopped(self, task_id: str, epoch: int, **kw: Any) -> list[Command]:
        return self.core.task_stopped(task_id, epoch, wall_ms=wall(self.now), **kw)

    def ack_all(self, cmds: list[Command]) -> list[Command]:
        out: list[Command] = []
        for hb in heartbeats(cmds):
            out += self.msg(hb_ack_msg(hb.seq))
        return out


def fence_cmds_ok(cmds: list[Command], running: list[tuple[str, int]]) -> None:
    """The fence output: notice first, a FENCED stop per running task, CloseSession last."""
    assert isinstance(cmds[0], Notice)
    assert cmds[0].kind == "self_fence"
    stops = [(c.task_id, c.epoch) for c in of_type(cmds, StopTask)]
    assert sorted(stops) == sorted(running)
    assert all(c.reason is StopReason.FENCED for c in of_type(cmds, StopTask))
    assert isinstance(cmds[-1], CloseSession)
    assert not starts(cmds)


# ---------------------------------------------------------------------------
# Heartbeats
# ---------------------------------------------------------------------------


def test_heartbeats_every_interval_with_increasing_seq_listing_running_tasks() -> None:
    d = Driver()
    out = d.connect()
    assert notices(out, "session_open")[0].fields["heartbeat_interval_s"] == INTERVAL_S
    first = heartbeats(out)
    assert len(first) == 1
    assert first[0].seq == 1
    assert first[0].sent_at_monotonic_ms == 0
    assert first[0].sent_at_unix_ms == wall(0.0)
    assert list(first[0].tasks) == []
    d.ack_all(out)
    d.run("t1", 1)
    d.run("t2", 3)
    d.run("t3", 2)
    d.run("t4", 1)
    # t2 stopping (a release in flight) is still listed; t3 done and t4 paused are not.
    assert of_type(d.msg(release_msg("t2", 3)), StopTask)
    d.core.task_finished("t3", 2, result=rec.TaskResult(payload=b"x"), wall_ms=1)
    d.msg(assign_msg("t4", 2))  # supersede t4@1 ...
    d.stopped("t4", 1)  # ... which now runs at epoch 2
    d.core.task_progress("t1", 1, journal_seq=9, ratio=0.25)
    sent: list[tuple[float, rec.Heartbeat]] = []
    for i in range(1, 61):
        d.at(round(i * 0.05, 6))
        out = d.tick()
        assert not notices(out, "self_fence")
        sent += [(d.now, hb) for hb in heartbeats(out)]
        d.ack_all(out)
    assert [round(t, 6) for t, _ in sent] == [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    assert [hb.seq for _, hb in sent] == [2, 3, 4, 5, 6, 7]
    for t, hb in sent:
        assert {(p.task_id, p.epoch) for p in hb.tasks} == {("t1", 1), ("t2", 3), ("t4", 2)}
        assert hb.sent_at_monotonic_ms == int(t * 1000)
        assert hb.running_tasks == 3
        t1 = next(p for p in hb.tasks if p.task_id == "t1")
        assert t1.journal_seq == 9
        assert t1.progress_ratio == 0.25


def test_welcome_parameters_set_the_heartbeat_period_and_the_fence() -> None:
    d = Driver()
    d.ack_all(d.connect(hb_ms=250, fence_ms=1000))
    times = []
    for i in range(1, 33):  # ticks every 1/32 s: exact in binary floating point
        d.at(i / 32)
        out = d.tick()
        times += [d.now] * len(heartbeats(out))
        d.ack_all(out)
    assert times == [0.25, 0.5, 0.75, 1.0]
    # All acked: s = 1.0 + 0.25; the fence comes 1 s (not the default 2 s) later.
    assert d.core.fence_deadline() == pytest.approx(2.25)


def test_ack_clears_outstanding_heartbeats_and_reports_rtt() -> None:
    d = Driver()
    d.connect()  # heartbeat 1 at 0.0, never acked
    d.run("t1")
    assert d.core.fence_deadline() == pytest.approx(0.0 + FENCE_S)
    d.at(0.5)
    assert [hb.seq for hb in heartbeats(d.tick())] == [2]
    d.at(0.7)
    out = d.msg(hb_ack_msg(2))  # acks 1 and 2 (the stream is ordered)
    rtt = notices(out, "heartbeat_rtt")
    assert len(rtt) == 1
    assert rtt[0].fields["seconds"] == pytest.approx(0.2)
    assert d.core.fence_deadline() == pytest.approx(0.5 + INTERVAL_S + FENCE_S)
    assert d.msg(hb_ack_msg(1)) == []  # already covered
    assert d.msg(hb_ack_msg(2)) == []  # duplicate
    assert d.msg(hb_ack_msg(99)) == []  # never sent
    assert d.core.fence_deadline() == pytest.approx(3.0)


def test_fence_counts_from_the_oldest_unacked_heartbeat() -> None:
    d = Driver()
    d.ack_all(d.connect())
    d.run("t1")
    d.run("t2", 4)
    # Heartbeats at 0.5, 1.0, 1.5, ... are never acked: s = 0.5.
    fenced_at = None
    for i in range(1, 80):
        d.at(round(i * 0.05, 6))
        out = d.tick()
        if notices(out, "self_fence"):
            fenced_at = d.now
            fence_cmds_ok(out, [("t1", 1), ("t2", 4)])
            break
    assert fenced_at == pytest.approx(0.5 + FENCE_S - LEAD_S)
    assert d.core.fenced
    assert not d.core.session_open
    assert d.core.fence_deadline() is None
    # A fence happens once; the tick after it sends nothing at all.
    d.at(d.now + 1.0)
    assert d.tick() == []


def test_fence_after_the_session_closed_silently() -> None:
    d = Driver()
    d.ack_all(d.connect())
    d.run("t1")
    for i in range(1, 21):  # every beat acked through 1.0
        d.at(round(i * 0.05, 6))
        d.ack_all(d.tick())
    d.at(1.1)
    assert notices(d.core.on_session_closed(1.1, "EOF"), "session_closed")
    assert not d.core.session_open
    assert d.core.slot_state("t1") is SlotState.RUNNING  # tasks run on until the fence
    # No heartbeat goes out without a Session; s = 1.0 + 0.5 (the one that never happened).
    deadline = 1.0 + INTERVAL_S + FENCE_S
    assert d.core.fence_deadline() == pytest.approx(deadline)
    d.at(deadline - LEAD_S - 0.01)
    assert d.tick() == []
    d.at(deadline - LEAD_S)
    fence_cmds_ok(d.tick(), [("t1", 1)])


def test_no_fence_and_no_heartbeat_before_a_welcome() -> None:
    d = Driver()
    d.hello()
    d.at(30.0)
    assert d.tick() == []
    assert d.core.fence_deadline() is None
    assert not d.core.fenced


# ---------------------------------------------------------------------------
# After a fence
# ---------------------------------------------------------------------------


def fenced_driver() -> Driver:
    """t1@1 and t2@3 running, fenced at 1.5 (heartbeat 1 at 0.0 never acked)."""
    d = Driver()
    d.connect()
    d.run("t1", 1)
    d.run("t2", 3, attempt=2, kind="other")
    d.core.task_progress("t2", 3, checkpoint=ckpt("t2", 3, 5), journal_seq=11)
    d.at(1.5)
    fence_cmds_ok(d.tick(), [("t1", 1), ("t2", 3)])
    return d


def test_stale_directives_after_a_fence_are_ignored() -> None:
    d = fenced_driver()
    d.at(1.6)
    assert d.msg(assign_msg("t9", 1)) == []
    assert d.msg(release_msg("t1", 1)) == []
    assert d.msg(hb_ack_msg(1)) == []
    assert d.msg(update_ack_msg(1, "t1", 1, rec.UpdateOutcome.ACCEPTED)) == []
    assert d.core.slot_state("t9") is None
    assert d.core.fenced


def test_after_a_fence_stopped_tasks_pause_and_nothing_starts_before_a_welcome() -> None:
    d = fenced_driver()
    d.at(1.7)
    out = d.stopped("t1", 1)
    assert notices(out, "task_paused")
    metas = of_type(out, PersistMeta)
    assert [(m.task_id, m.meta.state, m.meta.epoch) for m in metas] == [("t1", "paused", 1)]
    assert not starts(out)
    assert not starts(d.stopped("t2", 3))
    assert d.core.slot_state("t1") is SlotState.PAUSED
    d.at(5.0)
    assert d.tick() == []
    hello = d.hello()
    listed = {h.task_id: h for h in hello.held_tasks}
    assert set(listed) == {"t1", "t2"}
    assert all(h.status == rec.HeldTaskStatus.PAUSED for h in listed.values())
    assert (listed["t2"].epoch, listed["t2"].attempt, listed["t2"].kind) == (3, 2, "other")
    assert listed["t2"].checkpoint.seq == 5
    assert listed["t2"].journal_seq == 11
    assert hello.node_id == "node-1"
    assert hello.incarnation == "inc-1"
    assert hello.protocol_version == 1


def test_welcome_and_reattach_resume_paused_tasks_at_the_same_epoch() -> None:
    d = fenced_driver()
    d.stopped("t1", 1)
    d.stopped("t2", 3)
    d.at(3.0)
    out = d.connect()
    assert notices(out, "session_open")[0].fields["after_fence"] is True
    assert not d.core.fenced
    assert d.core.session_open
    assert heartbeats(out)
    out = d.msg(assign_msg("t2", 3, attempt=2, reason=rec.AssignReason.REATTACH))
    assert starts(out) == [("t2", 3)]
    assert isinstance(out[0], PersistMeta)
    assert out[0].meta.state == "running"
    assert d.core.slot_state("t2") is SlotState.RUNNING
    assert d.core.running() == [("t2", 3)]


@pytest.mark.parametrize(
    ("reason", "forgotten"),
    [
        (rec.RevokeReason.REASSIGNED, False),
        (rec.RevokeReason.STALE_EPOCH, False),
        (rec.RevokeReason.CANCELLED, True),
        (rec.RevokeReason.FINISHED, True),
        (rec.RevokeReason.UNKNOWN_TASK, True),
    ],
)
def test_revoke_of_a_paused_task_detaches_or_forgets(
    reason: rec.RevokeReason, forgotten: bool
) -> None:
    d = fenced_driver()
    d.stopped("t1", 1)
    d.stopped("t2", 3)
    d.at(3.0)
    d.connect()
    out = d.msg(revoke_msg("t2", 3, reason, current_epoch=4))
    assert notices(out, "revoked")
    assert not of_type(out, StopTask)
    if forgotten:
        assert of_type(out, ForgetTask) == [ForgetTask("t2")]
        assert d.core.slot_state("t2") is None
    else:
        metas = of_type(out, PersistMeta)
        assert [(m.meta.state, m.meta.epoch, m.meta.kind) for m in metas] == [
            ("detached", 3, "other")
        ]
        assert not of_type(out, ForgetTask)
        assert d.core.slot_state("t2") is SlotState.DETACHED
    assert "t2" not in held(d.core, 3.1)
    assert "t1" in held(d.core, 3.1)


def test_revoke_of_an_older_epoch_than_held_is_ignored() -> None:
    d = Driver()
    d.connect()
    d.run("t1", 5)
    assert d.msg(revoke_msg("t1", 4, rec.RevokeReason.REASSIGNED)) == []
    assert d.core.slot_state("t1") is SlotState.RUNNING


def test_revoke_of_a_running_task_stops_then_detaches() -> None:
    d = Driver()
    d.connect()
    d.run("t1", 2)
    out = d.msg(revoke_msg("t1", 2, rec.RevokeReason.REASSIGNED, current_epoch=3))
    assert of_type(out, StopTask) == [StopTask("t1", 2, StopReason.REVOKED)]
    out = d.stopped("t1", 2)
    assert [m.meta.state for m in of_type(out, PersistMeta)] == ["detached"]
    out = d.msg(revoke_msg("t1", 2, rec.RevokeReason.CANCELLED))
    assert of_type(out, ForgetTask) == [ForgetTask("t1")]


def test_reconnect_while_a_fence_stop_is_in_flight_still_resumes_the_task() -> None:
    """Bug fix: the Hello listed a task still being paused as RUNNING, so the
    leader (which re-attaches only PAUSED tasks) never re-attached it, and it
    stayed paused forever once the stop completed."""
    d = fenced_driver()
    d.at(1.6)
    listed = held(d.core, 1.6)
    assert listed["t1"] == (1, rec.HeldTaskStatus.PAUSED)
    assert not starts(d.msg(welcome_msg()))
    out = d.msg(assign_msg("t1", 1, reason=rec.AssignReason.REATTACH))
    assert not starts(out)  # the old handler has not stopped yet
    out = d.stopped("t1", 1)
    assert starts(out) == [("t1", 1)]
    assert d.core.slot_state("t1") is SlotState.RUNNING


# ---------------------------------------------------------------------------
# Assign
# ---------------------------------------------------------------------------


def test_newer_epoch_supersedes_and_starts_after_the_stop() -> None:
    d = Driver()
    d.connect()
    d.run("t1", 1)
    out = d.msg(assign_msg("t1", 2, attempt=2))
    assert out == [StopTask("t1", 1, StopReason.SUPERSEDED)]
    assert d.core.running() == [("t1", 1)]  # still stopping at epoch 1
    assert not starts(d.msg(assign_msg("t1", 2, attempt=2)))  # repeated while stopping
    assert d.stopped("t1", 2) == []  # not the epoch being stopped
    out = d.stopped("t1", 1)
    assert starts(out) == [("t1", 2)]
    metas = of_type(out, PersistMeta)
    assert [(m.meta.epoch, m.meta.attempt, m.meta.state) for m in metas] == [(2, 2, "running")]
    assert d.core.running() == [("t1", 2)]


def test_older_epoch_assign_is_ignored() -> None:
    d = Driver()
    d.connect()
    d.run("t1", 3)
    out = d.msg(assign_msg("t1", 2))
    assert notices(out, "stale_assign")
    assert not starts(out)
    assert not of_type(out, StopTask)
    assert d.core.running() == [("t1", 3)]


def test_duplicate_assign_is_ignored() -> None:
    d = Driver()
    d.connect()
    d.run("t1", 3)
    assert d.msg(assign_msg("t1", 3)) == []
    d.core.task_finished("t1", 3, result=rec.TaskResult(), wall_ms=1)
    assert d.msg(assign_msg("t1", 3)) == []  # done at this epoch: not run twice
    assert d.core.slot_state("t1") is SlotState.DONE


def test_fence_during_a_supersede_starts_nothing() -> None:
    """Bug fix: the Assign waiting for the stop came on the Session the fence
    gave up on; task_stopped used to start it before any new Welcome."""
    d = Driver()
    d.connect()
    d.run("t1", 1)
    assert of_type(d.msg(assign_msg("t1", 2)), StopTask)
    d.at(1.5)
    out = d.tick()
    fence_cmds_ok(out, [])  # nothing RUNNING: t1 is already stopping
    d.at(1.6)
    out = d.stopped("t1", 1)
    assert not starts(out)
    assert d.core.slot_state("t1") is SlotState.PAUSED
    assert held(d.core, 1.7)["t1"] == (1, rec.HeldTaskStatus.PAUSED)


def test_revoke_of_the_old_epoch_keeps_a_newer_assignment() -> None:
    """Bug fix: a heartbeat lists the stopping old epoch, the leader revokes it
    (REASSIGNED); that Revoke used to drop the newer Assign waiting for the stop."""
    d = Driver()
    d.connect()
    d.run("t1", 1)
    d.msg(assign_msg("t1", 2))
    out = d.msg(revoke_msg("t1", 1, rec.RevokeReason.REASSIGNED, current_epoch=2))
    assert not of_type(out, StopTask)  # already stopping
    out = d.stopped("t1", 1)
    assert starts(out) == [("t1", 2)]
    assert d.core.running() == [("t1", 2)]


def test_assign_of_a_newer_epoch_after_a_revoke_starts_after_the_stop() -> None:
    d = Driver()
    d.connect()
    d.run("t1", 1)
    assert of_type(d.msg(revoke_msg("t1", 1, rec.RevokeReason.REASSIGNED, 2)), StopTask)
    assert d.msg(assign_msg("t1", 3)) == []
    out = d.stopped("t1", 1)
    assert starts(out) == [("t1", 3)]


def test_revoke_covering_the_pending_epoch_drops_it() -> None:
    d = Driver()
    d.connect()
    d.run("t1", 1)
    d.msg(assign_msg("t1", 2))
    d.msg(revoke_msg("t1", 2, rec.RevokeReason.CANCELLED))
    out = d.stopped("t1", 1)
    assert not starts(out)
    assert of_type(out, ForgetTask) == [ForgetTask("t1")]


# ---------------------------------------------------------------------------
# Release and terminal updates
# ---------------------------------------------------------------------------


def test_release_flushes_stops_reports_released_and_forgets_on_ack() -> None:
    d = Driver()
    d.connect()
    d.run("t1", 4, attempt=3)
    out = d.msg(release_msg("t1", 4, move_id="mv-9"))
    assert out == [StopTask("t1", 4, StopReason.RELEASED, flush=True)]
    final = ckpt("t1", 4, 12)
    out = d.stopped("t1", 4, checkpoint=final, journal_seq=77)
    persist = of_type(out, PersistMeta)
    assert [(p.meta.state, p.meta.epoch) for p in persist] == [("done", 4)]
    assert persist[0].meta.update  # the Released update survives a restart
    assert out.index(persist[0]) < out.index(of_type(out, Send)[0])  # durable first
    (upd,) = updates(out)
    assert change(upd) == "released"
    assert (upd.task_id, upd.epoch, upd.attempt) == ("t1", 4, 3)
    assert upd.change.move_id == "mv-9"
    assert upd.change.checkpoint == final
    assert upd.change.journal_seq == 77
    assert held(d.core, 0.1)["t1"] == (4, rec.HeldTaskStatus.RELEASED)
    out = d.msg(update_ack_msg(upd.update_seq, "t1", 4, rec.UpdateOutcome.ACCEPTED))
    assert out == [ForgetTask("t1")]
    assert d.core.slot_state("t1") is None


def test_release_of_another_epoch_or_a_task_not_running_is_ignored() -> None:
    d = Driver()
    d.connect()
    d.run("t1", 4)
    for m in (release_msg("t1", 3), release_msg("t1", 5), release_msg("zz", 1)):
        out = d.msg(m)
        assert notices(out, "release_ignored")
        assert not of_type(out, StopTask)
    d.msg(release_msg("t1", 4))
    assert notices(d.msg(release_msg("t1", 4)), "release_ignored")  # already stopping


@pytest.mark.parametrize("outcome", ["completed", "failed"])
def test_terminal_update_is_persisted_then_sent_then_resent_after_reconnect(
    outcome: str,
) -> None:
    d = Driver()
    d.connect()
    d.run("t1", 2, attempt=2)
    final = ckpt("t1", 2, 3)
    if outcome == "completed":
        out = d.core.task_finished(
            "t1",
            2,
            result=rec.TaskResult(payload=b"42"),
            final_checkpoint=final,
            run_ms=10,
            wall_ms=5,
        )
    else:
        out = d.core.task_finished(
            "t1", 2, error=rec.TaskError(message="boom"), final_checkpoint=final
        )
    assert isinstance(out[0], PersistMeta)
    assert out[0].meta.state == "done"
    restored = out[0].meta.update
    assert restored is not None
    assert change(restored) == outcome
    # What the store keeps reads back the same (the edge's codec).
    assert convert.decode_meta(convert.encode_meta(out[0].meta)) == out[0].meta
    (upd,) = updates(out)
    assert change(upd) == outcome
    assert (upd.epoch, upd.attempt) == (2, 2)
    if outcome == "completed":
        assert upd.change.result.payload == b"42"
        assert upd.change.final_checkpoint == final
    else:
        assert upd.change.error.message == "boom"
        assert upd.change.last_checkpoint == final
    assert d.core.running() == []
    # No ack: the Session dies; the update is listed and sent again.
    d.at(1.0)
    d.core.on_session_closed(1.0, "EOF")
    status = {"completed": rec.HeldTaskStatus.COMPLETED}.get(outcome, rec.HeldTaskStatus.FAILED)
    assert held(d.core, 1.0)["t1"] == (2, status)
    out = d.msg(welcome_msg())
    (again,) = updates(out)
    assert change(again) == outcome
    assert again.update_seq > upd.update_seq
    # An ack of the old Session's seq means nothing on the new one.
    assert d.msg(update_ack_msg(upd.update_seq, "t1", 2, rec.UpdateOutcome.ACCEPTED)) == []
    assert d.core.slot_state("t1") is SlotState.DONE
    out = d.msg(update_ack_msg(again.update_seq, "t1", 2, rec.UpdateOutcome.DUPLICATE))
    assert out == [ForgetTask("t1")]
    assert d.core.slot_state("t1") is None


@pytest.mark.parametrize(
    "outcome",
    [
        rec.UpdateOutcome.STALE_EPOCH,
        rec.UpdateOutcome.REJECTED,
        rec.UpdateOutcome.UNKNOWN_TASK,
    ],
)
def test_refused_terminal_update_detaches(outcome: rec.UpdateOutcome) -> None:
    d = Driver()
    d.connect()
    d.run("t1", 2)
    (upd,) = updates(d.core.task_finished("t1", 2, result=rec.TaskResult()))
    out = d.msg(update_ack_msg(upd.update_seq, "t1", 2, outcome))
    assert notices(out, "update_refused")
    assert [m.meta.state for m in of_type(out, PersistMeta)] == ["detached"]
    assert not of_type(out, ForgetTask)
    assert d.core.slot_state("t1") is SlotState.DETACHED
    assert "t1" not in held(d.core, 0.0)
    d.core.on_session_closed(0.0, "x")
    assert updates(d.msg(welcome_msg())) == []  # not sent again


def test_task_finished_needs_exactly_one_outcome() -> None:
    core = new_core()
    with pytest.raises(ValueError, match="exactly one"):
        core.task_finished("t1", 1)
    with pytest.raises(ValueError, match="exactly one"):
        core.task_finished("t1", 1, result=rec.TaskResult(), error=rec.TaskError())


def test_finish_of_a_stopping_or_unknown_task_is_dropped() -> None:
    d = Driver()
    d.connect()
    d.run("t1", 1)
    d.msg(release_msg("t1", 1))
    out = d.core.task_finished("t1", 1, result=rec.TaskResult())
    assert notices(out, "late_finish_dropped")
    assert not updates(out)
    assert notices(d.core.task_finished("zz", 1, result=rec.TaskResult()), "late_finish_dropped")
    assert d.core.slot_state("t1") is SlotState.STOPPING


def test_started_update_reports_the_resume_point() -> None:
    d = Driver()
    d.connect()
    d.msg(assign_msg("t1", 2))
    started = rec.Started(resumed_from=ckpt("t1", 1, 6), restore_ms=3)
    (upd,) = updates(d.core.task_started("t1", 2, started, wall_ms=99))
    assert change(upd) == "started"
    assert upd.change.resumed_from.seq == 6
    assert upd.occurred_at_unix_ms == 99
    d.at(0.5)
    (hb,) = heartbeats(d.tick())
    assert hb.tasks[0].checkpoint_seq == 6


# ---------------------------------------------------------------------------
# Checkpointed updates are coalesced
# ---------------------------------------------------------------------------


def test_checkpointed_updates_are_coalesced_per_task() -> None:
    d = Driver(new_core(progress_report_interval_s=1.0))
    d.ack_all(d.connect())
    d.run("t1", 1)
    d.run("t2", 1)
    reports: dict[str, list[tuple[float, int]]] = {"t1": [], "t2": []}
    for i in range(1, 101):  # 5 s, a checkpoint of t1 at every tick, t2 once
        d.at(round(i * 0.05, 6))
        seq = i
        d.core.task_progress("t1", 1, checkpoint=ckpt("t1", 1, seq), journal_seq=seq)
        if i == 30:
            d.core.task_progress("t2", 1, checkpoint=ckpt("t2", 1, 1))
        out = d.tick()
        d.ack_all(out)
        for u in updates(out):
            assert change(u) == "checkpointed"
            reports[u.task_id].append((d.now, u.change.checkpoint.seq))
            if u.task_id == "t1":
                assert u.change.checkpoint.seq == seq  # the newest one
                assert u.change.journal_seq == seq
    times = [t for t, _ in reports["t1"]]
    assert 4 <= len(times) <= 6
    assert all(b - a >= 1.0 - 1e-9 for a, b in itertools.pairwise(times))
    assert [s for _, s in reports["t2"]] == [1]  # once, not once per interval
    # A stale (older) checkpoint is not reported.
    d.core.task_progress("t2", 1, checkpoint=ckpt("t2", 1, 0))
    d.at(10.0)
    assert [u.task_id for u in updates(d.tick())] == []


def test_by_default_replicated_tasks_report_every_second_local_ones_every_five() -> None:
    """Each report is an etcd write by the leader. A replicated task's report is
    the evidence that detects Redis losing acknowledged checkpoints (1 s); a
    local task's is for display (5 s), whatever the checkpoint rate."""
    assert DEFAULT_PROGRESS_REPORT_INTERVAL_S == 1.0
    assert DEFAULT_LOCAL_PROGRESS_REPORT_INTERVAL_S == 5.0
    d = Driver(AgentCore("node-1", "inc-1", fence_lead_s=LEAD_S))
    d.ack_all(d.connect())
    d.run("rep", 1)
    d.run("loc", 1)
    sent: dict[str, list[float]] = {"rep": [], "loc": []}
    for i in range(1, 401):  # 20 s, a checkpoint of each at every 50 ms tick
        d.at(round(i * 0.05, 6))
        d.core.task_progress("rep", 1, checkpoint=ckpt("rep", 1, i), local=False)
        d.core.task_progress("loc", 1, checkpoint=ckpt("loc", 1, i), local=True)
        out = d.tick()
        d.ack_all(out)
        for u in updates(out):
            if change(u) == "checkpointed":
                sent[u.task_id].append(d.now)
    assert 18 <= len(sent["rep"]) <= 21
    assert 3 <= len(sent["loc"]) <= 5
    assert all(b - a >= 5.0 - 1e-9 for a, b in itertools.pairwise(sent["loc"]))
    assert all(b - a >= 1.0 - 1e-9 for a, b in itertools.pairwise(sent["rep"]))


def test_agent_settings_refuse_intervals_out_of_range() -> None:
    base = {"node_id": "n1", "coordinators": ("127.0.0.1:1",), "data_dir": Path("/tmp/x")}
    assert AgentSettings(**base).progress_report_interval_s == DEFAULT_PROGRESS_REPORT_INTERVAL_S
    for bad in (0.0, -1.0, 3601.0):
        with pytest.raises(SettingsError, match="--progress-report-interval-s"):
            AgentSettings(**base, progress_report_interval_s=bad)
        with pytest.raises(SettingsError, match="--local-progress-report-interval-s"):
            AgentSettings(**base, local_progress_report_interval_s=bad)
    assert AgentSettings(**base).replication_linger_s == 0.5
    for bad in (-0.1, 1.5):
        with pytest.raises(SettingsError, match="--replication-linger-s"):
            AgentSettings(**base, replication_linger_s=bad)


def test_replication_ack_marks_the_checkpoint_replicated_and_reports_it() -> None:
    d = Driver()
    d.ack_all(d.connect())
    d.run("t1", 1)
    d.core.task_progress("t1", 1, checkpoint=ckpt("t1", 1, 2))
    d.at(1.0)
    out = d.tick()
    d.ack_all(out)
    (u,) = updates(out)
    assert not u.change.checkpoint.replicated
    d.core.task_progress("t1", 1, replicated_checkpoint_seq=2, replicated_journal_seq=4)
    d.at(2.0)
    out = d.tick()
    (u,) = updates(out)
    assert u.change.checkpoint.replicated
    assert u.change.replicated_journal_seq == 4
    (hb,) = heartbeats(out)
    assert hb.tasks[0].replicated_checkpoint_seq == 2


def test_a_new_epoch_does_not_report_the_old_epochs_checkpoint() -> None:
    """Bug fix: _start kept report_due and the checkpoint of the epoch it
    replaced, so the next tick sent a Checkpointed update at the new epoch
    carrying the old epoch's checkpoint (the leader marks the task RUNNING on
    it before the new handler even restored)."""
    d = Driver()
    d.ack_all(d.connect())
    d.run("t1", 1)
    d.core.task_progress("t1", 1, checkpoint=ckpt("t1", 1, 8))  # due, not yet reported
    d.msg(assign_msg("t1", 2))
    assert starts(d.stopped("t1", 1)) == [("t1", 2)]
    d.at(1.0)
    assert updates(d.tick()) == []


# ---------------------------------------------------------------------------
# restore() and TaskMeta
# ---------------------------------------------------------------------------


def completed_update_hex(task_id: str, epoch: int) -> str:
    u = agent_pb2.TaskUpdate(task_id=task_id, epoch=epoch, attempt=1)
    u.completed.result.payload = b"ok"
    return u.SerializeToString().hex()


def test_restore_rebuilds_the_table_and_reports_unreadable_metas() -> None:
    metas = {
        "run": raw_meta(3, 1, "k", "running"),
        "stop": raw_meta(2, 1, "k", "stopping"),
        "pause": raw_meta(1, 2, "k2", "paused"),
        "done": raw_meta(5, 1, "k", "done", completed_update_hex("done", 5)),
        "done-lost": raw_meta(5, 1, "k", "done"),
        "gone": raw_meta(1, 1, "k", "detached"),
        "junk": b"\xff\x00not json",
        "badhex": raw_meta(1, 1, "k", "done", "zz"),
        "badproto": raw_meta(1, 1, "k", "done", "ffffffff"),
        "badstate": json.dumps(
            {"epoch": 1, "attempt": 1, "kind": "k", "state": "zombie", "update": ""}
        ).encode(),
    }
    core = new_core()
    out = restore_raw(core, metas)
    bad = {n.fields["task_id"] for n in notices(out, "meta_unreadable")}
    assert bad == {"junk", "badhex", "badproto", "badstate"}
    # A detached task's lineage is reported again, so that it ends forgotten.
    assert [c for c in out if not isinstance(c, Notice)] == [ReportLineage("gone", 1, 0, "", 0, 0)]
    assert core.running() == []
    assert core.slot_state("run") is SlotState.PAUSED
    assert core.slot_state("stop") is SlotState.PAUSED
    assert core.slot_state("pause") is SlotState.PAUSED
    assert core.slot_state("done") is SlotState.DONE
    assert core.slot_state("done-lost") is SlotState.PAUSED
    assert core.slot_state("gone") is SlotState.DETACHED  # not listed below
    assert core.slot_state("junk") is None
    listed = held(core, 0.0)
    assert listed == {
        "run": (3, rec.HeldTaskStatus.PAUSED),
        "stop": (2, rec.HeldTaskStatus.PAUSED),
        "pause": (1, rec.HeldTaskStatus.PAUSED),
        "done": (5, rec.HeldTaskStatus.COMPLETED),
        "done-lost": (5, rec.HeldTaskStatus.PAUSED),
        "badhex": (1, rec.HeldTaskStatus.PAUSED),
        "badproto": (1, rec.HeldTaskStatus.PAUSED),
    }
    d = Driver(core)
    out = d.msg(welcome_msg())
    assert [(u.task_id, change(u)) for u in updates(out)] == [("done", "completed")]
    assert not starts(out)
    out = d.msg(assign_msg("run", 3, reason=rec.AssignReason.REATTACH))
    assert starts(out) == [("run", 3)]


summaries = st.builds(
    rec.CheckpointSummary,
    checkpoint_ref=st.text(max_size=10),
    seq=st.integers(0, 2**63),
    terminal=st.booleans(),
    created_at_unix_ms=st.integers(0, 2**62),
)
terminal_changes = st.one_of(
    st.builds(
        rec.Completed,
        result=st.builds(
            rec.TaskResult, payload=st.binary(max_size=20), size_bytes=st.integers(0, 99)
        ),
        final_checkpoint=st.none() | summaries,
        run_ms=st.integers(0, 2**40),
    ),
    st.builds(
        rec.Failed,
        error=st.builds(rec.TaskError, code=st.integers(0, 10), message=st.text(max_size=20)),
        last_checkpoint=st.none() | summaries,
    ),
    st.builds(
        rec.Released,
        move_id=st.text(max_size=8),
        checkpoint=st.none() | summaries,
        journal_seq=st.integers(0, 2**40),
    ),
)
meta_strategy = st.builds(
    TaskMeta,
    epoch=st.integers(0, 2**63),
    attempt=st.integers(0, 2**31),
    kind=st.text(max_size=20),
    state=st.sampled_from([s.value for s in SlotState]),
    update=st.none()
    | st.builds(
        rec.TaskUpdate,
        task_id=st.text(max_size=8),
        epoch=st.integers(0, 2**63),
        change=terminal_changes,
        attempt=st.integers(0, 2**31),
        update_seq=st.integers(0, 2**40),
    ),
)


@settings(max_examples=200, deadline=None)
@given(meta_strategy)
def test_task_meta_round_trips(meta: TaskMeta) -> None:
    assert convert.decode_meta(convert.encode_meta(meta)) == meta


@pytest.mark.parametrize(
    ("doc", "field_name"),
    [
        ({"attempt": 1, "kind": "k", "state": "paused", "update": ""}, "epoch"),
        ({"epoch": "1", "attempt": 1, "kind": "k", "state": "paused", "update": ""}, "epoch"),
        ({"epoch": 1.5, "attempt": 1, "kind": "k", "state": "paused", "update": ""}, "epoch"),
        ({"epoch": -1, "attempt": 1, "kind": "k", "state": "paused", "update": ""}, "epoch"),
        ({"epoch": 1, "attempt": True, "kind": "k", "state": "paused", "update": ""}, "attempt"),
        ({"epoch": 1, "attempt": 1, "kind": 3, "state": "paused", "update": ""}, "kind"),
        ({"epoch": 1, "attempt": 1, "kind": "k", "state": "nope", "update": ""}, "state"),
        ({"epoch": 1, "attempt": 1, "kind": "k", "state": "paused"}, "update"),
        ({"epoch": 1, "attempt": 1, "kind": "k", "state": "paused", "update": 7}, "update"),
    ],
)
def test_task_meta_decode_names_the_bad_field(doc: dict[str, Any], field_name: str) -> None:
    with pytest.raises(ValueError, match=rf"meta\.{field_name}"):
        convert.decode_meta(json.dumps(doc).encode())


def test_task_meta_decode_refuses_non_objects() -> None:
    for raw in (b"", b"[1]", b"1e999999", b"Infinity", b"[" * 100_000, b"\xfe\xff"):
        with pytest.raises(ValueError, match="meta"):
            convert.decode_meta(raw)
    # Infinity as a number field: never OverflowError.
    raw = b'{"epoch": Infinity, "attempt": 1, "kind": "k", "state": "paused", "update": ""}'
    with pytest.raises(ValueError, match=r"meta\.epoch"):
        convert.decode_meta(raw)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from([s.value for s in SlotState]),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)
VALID_META = {"epoch": 1, "attempt": 1, "kind": "k", "state": "paused", "update": ""}


def _mutate(changes: dict[str, Any], drop: list[str]) -> bytes:
    doc = {**VALID_META, **changes}
    for key in drop:
        doc.pop(key, None)
    return json.dumps(doc).encode()


meta_like = st.builds(
    _mutate,
    st.dictionaries(st.sampled_from(sorted(VALID_META)), json_values, max_size=2),
    st.lists(st.sampled_from(sorted(VALID_META)), max_size=1),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.binary(max_size=80),
        meta_like,
        st.sampled_from([b"1e999", b"-Infinity", b"NaN"]).map(
            lambda n: json.dumps(VALID_META).encode().replace(b'"epoch": 1', b'"epoch": ' + n)
        ),
        json_values.map(lambda v: json.dumps(v).encode()),
    )
)
def test_task_meta_decode_fuzz_raises_only_value_error(raw: bytes) -> None:
    try:
        meta = convert.decode_meta(raw)
    except ValueError as exc:
        message = str(exc)
    else:
        message = ""
    if message:
        assert message.startswith("meta")
        return
    assert isinstance(meta.epoch, int)
    assert meta.update is None or isinstance(meta.update, rec.TaskUpdate)
    assert SlotState(meta.state)
    # Whatever decodes, restore() accepts without raising; a task it had detached
    # is reported again (its lineage settles before it is forgotten), nothing else.
    out = restore_raw(new_core(), {"t": raw})
    reports = [c for c in out if not isinstance(c, Notice)]
    if SlotState(meta.state) is SlotState.DETACHED:
        assert [type(c) for c in reports] == [ReportLineage]
    else:
        assert reports == []


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=60))
def test_restore_never_raises_on_a_bad_update_field(update: bytes) -> None:
    raw = raw_meta(1, 1, "k", "done", update.hex())
    core = new_core()
    out = restore_raw(core, {"t": raw})
    assert core.slot_state("t") in (SlotState.DONE, SlotState.PAUSED)
    if core.slot_state("t") is SlotState.PAUSED:
        assert notices(out, "meta_unreadable") or update == b""


# ---------------------------------------------------------------------------
# NotLeader, constructor, purity
# ---------------------------------------------------------------------------


def test_not_leader_closes_the_session_with_the_redirect() -> None:
    d = Driver()
    d.hello()
    nl = rec.NotLeader(leader_id="c2", leader_address="10.0.0.2:7000", term=4)
    out = d.msg(nl)
    assert len(out) == 1
    assert isinstance(out[0], CloseSession)
    assert out[0].redirect == "10.0.0.2:7000"
    assert "c2" in out[0].reason
    assert not d.core.session_open
    # On an open Session too; tasks keep running until the fence says otherwise.
    d2 = Driver()
    d2.connect()
    d2.run("t1")
    out = d2.msg(nl)
    assert [type(c) for c in out] == [CloseSession]
    assert not d2.core.session_open
    assert d2.core.slot_state("t1") is SlotState.RUNNING
    assert d2.core.fence_deadline() is not None


def test_constructor_refuses_empty_identity() -> None:
    with pytest.raises(ValueError, match="node_id"):
        AgentCore("", "inc")
    with pytest.raises(ValueError, match="incarnation"):
        AgentCore("n", "")


# Purity: node_agent/core/ is checked by the shared test (tests/unit/test_core_purity.py).


# ---------------------------------------------------------------------------
# Property: the self-fence rule under random schedules
# ---------------------------------------------------------------------------


STOP_MAX_S = 1.0  # a StopTask takes up to this long to report task_stopped


@dataclass
class Sim:
    """A toy network and leader around one AgentCore, with a model of the fence rule."""

    rng: Random
    ack_drop: float
    ack_delay_max: float
    close_rate: float
    supersede_rate: float
    core: AgentCore = field(default_factory=new_core)
    now: float = 0.0
    events: list[tuple[float, int, str, tuple[Any, ...]]] = field(default_factory=list)
    counter: int = 0
    session: int = 0  # current stream id; 0 = none
    open: bool = False  # welcomed on the current stream
    hello_at: float = 0.0
    hello_paused: list[tuple[str, int]] = field(default_factory=list)
    # The model.
    armed: bool = False
    fenced: bool = False
    outstanding: dict[int, float] = field(default_factory=dict)
    last_acked: float = 0.0
    tasks: dict[str, tuple[int, str]] = field(default_factory=dict)  # id -> (epoch, state)
    max_epoch: dict[str, int] = field(default_factory=dict)
    fences: int = 0
    welcomes: int = 0
    welcomed_at: float = 0.0
    max_gap: float = 0.0

    def at(self, when: float, kind: str, *args: Any) -> None:
        self.counter += 1
        heapq.heappush(self.events, (when, self.counter, kind, args))

    def deadline(self) -> float:
        s = min(self.outstanding.values()) if self.outstanding else self.last_acked + INTERVAL_S
        return s + FENCE_S

    def apply(self, cmds: list[Command]) -> None:
        check_command_order(cmds)
        if notices(cmds, "self_fence"):
            assert self.armed, "fenced while nothing could run"
            running = sorted((t, e) for t, (e, st_) in self.tasks.items() if st_ == "running")
            fence_cmds_ok(cmds, running)
            self.armed = False
            self.fenced = True
            self.fences += 1
        for c in cmds:
            if isinstance(c, StartTask):
                assert not self.fenced, f"StartTask {c.assign.task_id} after a fence"
                self.tasks[c.assign.task_id] = (c.assign.epoch, "running")
            elif isinstance(c, StopTask):
                epoch, state = self.tasks[c.task_id]
                assert (epoch, state) == (c.epoch, "running")
                self.tasks[c.task_id] = (epoch, "stopping")
                stop_s = self.rng.uniform(0.005, STOP_MAX_S)
                self.at(self.now + stop_s, "stopped", c.task_id, epoch)
            elif isinstance(c, Send) and isinstance(c.message, rec.Heartbeat):
                hb = c.message
                assert self.open
                assert not self.fenced
                listed = {(p.task_id, p.epoch) for p in hb.tasks}
                live = {(t, e) for t, (e, s) in self.tasks.items() if s != "idle"}
                assert listed == live
                if self.now >= self.welcomed_at + STOP_MAX_S + 0.1:
                    # Liveness: the leader (re-attaching only what a Hello lists as
                    # PAUSED) believes every task runs here; once the stops of the
                    # last fence are done, each one must be running again.
                    assert {p.task_id for p in hb.tasks} == set(self.max_epoch)
                self.outstanding[hb.seq] = self.now
                if self.rng.random() >= self.ack_drop:
                    delay = self.rng.uniform(0.002, self.ack_delay_max)
                    self.at(self.now + delay, "ack", self.session, hb.seq)
            elif isinstance(c, CloseSession):
                self.close("agent closed")

    def close(self, reason: str) -> None:
        if not self.session:
            return
        self.session = 0
        self.open = False
        self.apply(self.core.on_session_closed(self.now, reason))
        self.at(self.now + self.rng.uniform(0.02, 2.0), "connect")

    def step(self, kind: str, args: tuple[Any, ...]) -> None:
        core, now, w = self.core, self.now, wall(self.now)
        if kind == "tick":
            self.apply(core.tick(now, w))
            if self.armed:  # within one tick of s + fence_after - fence_lead
                assert now < self.deadline() - LEAD_S + 1e-9, (now, self.deadline())
            gap = self.rng.uniform(0.03, 0.07)
            self.max_gap = max(self.max_gap, gap)
            self.at(now + gap, "tick")
        elif kind == "ack":
            session, seq = args
            if session != self.session:
                return  # the stream it was on is gone
            self.apply(core.on_message(hb_ack_msg(seq), now, w))
            if self.open and not self.fenced and seq in self.outstanding:
                sent = self.outstanding[seq]
                for s in [s for s in self.outstanding if s <= seq]:
                    del self.outstanding[s]
                self.last_acked = max(self.last_acked, sent)
        elif kind == "stopped":
            task_id, epoch = args
            if self.tasks.get(task_id) == (epoch, "stopping"):
                self.tasks[task_id] = (epoch, "idle")
            self.apply(core.task_stopped(task_id, epoch, wall_ms=w))
        elif kind == "connect":
            self.session += 1
            self.hello_at = now
            hello = core.hello(now, w)
            self.hello_paused = [
                (h.task_id, h.epoch)
                for h in hello.held_tasks
                if h.status == rec.HeldTaskStatus.PAUSED
            ]
            if self.rng.random() < 0.9:
                self.at(now + self.rng.uniform(0.005, 0.4), "welcome", self.session)
            else:  # a leader that never answers: the stream dies later
                self.at(now + self.rng.uniform(0.2, 3.0), "close", self.session)
        elif kind == "welcome":
            (session,) = args
            if session != self.session:
                return
            self.open = True
            self.armed = True
            self.fenced = False
            self.welcomes += 1
            self.welcomed_at = now
            self.outstanding.clear()
            self.last_acked = self.hello_at
            self.apply(core.on_message(welcome_msg(), now, w))
            if self.welcomes == 1:
                for task_id in ("a", "b", "c"):
                    self.max_epoch[task_id] = 1
                    self.apply(core.on_message(assign_msg(task_id, 1), now, w))
            else:  # what the leader does: re-attach what the Hello lists as paused
                for task_id, epoch in self.hello_paused:
                    if self.open:
                        reattach = assign_msg(task_id, epoch, reason=rec.AssignReason.REATTACH)
                        self.apply(core.on_message(reattach, now, w))
            if self.rng.random() < self.close_rate:
                self.at(now + self.rng.uniform(0.1, 6.0), "close", self.session)
            if self.rng.random() < self.supersede_rate:
                self.at(now + self.rng.uniform(0.1, 4.0), "supersede", self.session)
        elif kind == "close":
            (session,) = args
            if session == self.session:
                self.close("stream ended")
        elif kind == "supersede":
            (session,) = args
            running = sorted(t for t, (_, s) in self.tasks.items() if s == "running")
            if session != self.session or not self.open or not running:
                return
            task_id = self.rng.choice(running)
            self.max_epoch[task_id] += 1
            self.apply(core.on_message(assign_msg(task_id, self.max_epoch[task_id]), now, w))
            if self.rng.random() < self.supersede_rate:
                self.at(now + self.rng.uniform(0.1, 2.0), "supersede", self.session)

    def run(self, until: float) -> None:
        self.at(0.0, "connect")
        self.at(0.01, "tick")
        while self.events and self.events[0][0] <= until:
            when, _, kind, args = heapq.heappop(self.events)
            self.now = when
            self.step(kind, args)
            assert self.core.fenced == self.fenced


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32),
    ack_drop=st.sampled_from([0.0, 0.05, 0.3, 0.8]),
    ack_delay_max=st.floats(0.01, 3.0),
    close_rate=st.floats(0.0, 1.0),
    supersede_rate=st.floats(0.0, 1.0),
)
def test_property_every_running_task_is_fenced_in_time(
    seed: int, ack_drop: float, ack_delay_max: float, close_rate: float, supersede_rate: float
) -> None:
    sim = Sim(Random(seed), ack_drop, ack_delay_max, close_rate, supersede_rate)
    sim.run(until=15.0)
    assert sim.welcomes >= 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), ack_delay_max=st.floats(0.01, 1.0))
def test_property_no_fence_while_every_heartbeat_is_acked_within_a_second(
    seed: int, ack_delay_max: float
) -> None:
    sim = Sim(
        Random(seed), ack_drop=0.0, ack_delay_max=ack_delay_max, close_rate=0.0, supersede_rate=0.3
    )
    sim.run(until=20.0)
    assert sim.fences == 0
    assert sim.welcomes == 1
    assert sim.core.session_open
    assert len(sim.core.running()) == 3
    assert sim.core.fence_deadline() is not None


# ---------------------------------------------------------------------------
# Ready batches: metas first, in one group commit; the order is checked
# ---------------------------------------------------------------------------


def test_messages_that_arrive_together_persist_every_meta_first_in_one_command() -> None:
    d = Driver()
    d.ack_all(d.connect())
    out = d.core.on_messages(
        [assign_msg("t1", 1), hb_ack_msg(99), assign_msg("t2", 4), assign_msg("t3", 2)],
        d.now,
        wall(d.now),
    )
    assert isinstance(out[0], PersistMetas)
    assert [(task_id, m.epoch, m.state) for task_id, m in out[0].metas] == [
        ("t1", 1, "running"),
        ("t2", 4, "running"),
        ("t3", 2, "running"),
    ]
    assert not of_type(out, PersistMeta)
    assert starts(out) == [("t1", 1), ("t2", 4), ("t3", 2)]
    check_command_order(out)


def test_ready_batch_keeps_the_newest_meta_of_a_task_and_leaves_forgets_in_order() -> None:
    m1, m2, m3 = (
        TaskMeta(1, 1, "k", "running"),
        TaskMeta(1, 1, "k", "done"),
        TaskMeta(2, 1, "k", "running"),
    )
    batch = ready_batch(
        [PersistMeta("a", m1), Notice("n"), PersistMeta("b", m3), PersistMeta("a", m2)]
    )
    assert batch == [PersistMetas((("a", m2), ("b", m3))), Notice("n")]
    with_forget: list[Command] = [PersistMeta("a", m1), ForgetTask("a"), PersistMeta("a", m3)]
    assert ready_batch(with_forget) == with_forget  # a forget between two metas: order matters
    assert ready_batch([PersistMeta("a", m1)]) == [PersistMeta("a", m1)]


def test_the_order_check_refuses_a_start_before_its_meta() -> None:
    start = StartTask(assign_msg("t1", 2))
    with pytest.raises(AssertionError, match="before its meta"):
        check_command_order([start])
    with pytest.raises(AssertionError, match="before its meta"):  # a meta of another epoch
        check_command_order([PersistMeta("t1", TaskMeta(1, 1, "k", "running")), start])
    with pytest.raises(AssertionError, match="lead its batch"):
        check_command_order([Notice("n"), PersistMetas(())])
    check_command_order([PersistMeta("t1", TaskMeta(2, 1, "k", "running")), start])


def test_a_reattach_says_hello_on_the_same_stream_and_keeps_tasks_running_until_welcome() -> None:
    d = Driver()
    d.ack_all(d.connect())
    d.run("t1")
    d.at(0.5)
    d.ack_all(d.tick())
    out = d.msg(rec.Reattach(term=9))
    assert notices(out, "reattach")
    hellos = [c.message for c in out if isinstance(c, Send) and isinstance(c.message, rec.Hello)]
    assert len(hellos) == 1
    # A fresh Hello: it lists the task held now, at its epoch.
    assert [(h.task_id, h.epoch) for h in hellos[0].held_tasks] == [("t1", 1)]
    assert not any(isinstance(c, CloseSession) for c in out)  # the stream stays
    assert not d.core.session_open
    assert d.core.slot_state("t1") is SlotState.RUNNING  # runs on until the fence
    # The old leader's directives are ignored until the new Welcome.
    assert d.msg(revoke_msg("t1", 1, rec.RevokeReason.CANCELLED)) == []
    assert d.core.slot_state("t1") is SlotState.RUNNING
    d.at(0.7)
    assert notices(d.msg(welcome_msg(term=9)), "session_open")
    assert d.core.session_open
    assert d.core.term == 9
    assert d.core.slot_state("t1") is SlotState.RUNNING


def test_a_reattach_before_any_welcome_says_hello_again() -> None:
    # The first Hello went to a leader that died before its Welcome: the replica
    # carrying the Session waits for a new Hello (the fleet simulator's seed 0).
    d = Driver()
    d.hello()
    out = d.msg(rec.Reattach(term=3))
    assert [type(c.message) for c in out if isinstance(c, Send)] == [rec.Hello]
    assert not d.core.session_open
    assert notices(d.msg(welcome_msg(term=3)), "session_open")
    assert d.core.session_open


def test_a_welcome_answering_an_earlier_hello_is_ignored() -> None:
    # Hello 1 goes to a leader; a Reattach makes the agent say Hello 2 at t=3.
    # Hello 1's Welcome, delivered late (a relay bug, or a reply in flight), must
    # not open the Session: it would start the fence from Hello 2's send time,
    # which its leader never saw and does not judge the node by.
    d = Driver()
    first = d.hello()
    assert first.hello_seq == 1
    d.at(3.0)
    out = d.msg(rec.Reattach(term=8))
    second = next(c.message for c in out if isinstance(c, Send))
    assert isinstance(second, rec.Hello)
    assert second.hello_seq == 2
    late = replace(welcome_msg(term=7), hello_seq=first.hello_seq)
    out = d.msg(late)
    stale = notices(out, "stale_welcome")
    assert stale
    assert stale[0].fields["hello_seq"] == 1
    assert stale[0].fields["newest_hello_seq"] == 2
    assert not d.core.session_open
    assert d.core.fence_deadline() is None  # no Welcome taken: nothing may run
    assert heartbeats(out) == []
    # The Welcome that answers Hello 2 opens the Session.
    assert notices(d.msg(replace(welcome_msg(term=8), hello_seq=2)), "session_open")
    assert d.core.session_open
    assert d.core.term == 8


def test_a_welcome_without_hello_seq_is_taken_as_before() -> None:
    # A leader that does not echo hello_seq (0): accepted, whatever Hello it answers.
    d = Driver()
    d.hello()
    d.hello()
    assert notices(d.msg(welcome_msg()), "session_open")
    assert d.core.session_open


def test_hello_seq_crosses_the_wire_both_ways() -> None:
    from lazarus.v1 import agent_pb2
    from node_agent import convert as agent_convert

    d = Driver()
    d.hello()
    assert agent_convert.hello_to_pb(d.hello()).hello.hello_seq == 2
    pb = agent_pb2.CoordinatorMessage(welcome=agent_pb2.Welcome(term=3, hello_seq=2))
    welcome = agent_convert.coordinator_message_from_pb(pb)
    assert isinstance(welcome, rec.Welcome)
    assert welcome.hello_seq == 2
