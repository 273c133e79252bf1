"""When ``AgentCore`` forgets a revoked (DETACHED) task, and when it must keep it.

The rule (``node_agent/core/core.py``, **Forgetting a detached task**): a
DETACHED task is forgotten (slot dropped, ``ForgetTask``) once the leader
confirmed the loss and its lineage is settled (no fork, or a fork in Redis the
leader acknowledged); a task that is over for this node is forgotten at once.
Before the rule, every detached task stayed in the table and the store forever.
"""

from __future__ import annotations

import pytest
from test_agent_core import (
    Driver,
    held,
    of_type,
    raw_meta,
    restore_raw,
    revoke_msg,
    starts,
    update_ack_msg,
    updates,
)

from lazarus.v1 import agent_pb2
from node_agent import convert
from node_agent.core import ForgetTask, ReportLineage, SlotState, StopReason, StopTask
from node_agent.core import records as rec

MOVED_ON = [  # the task lives on elsewhere: report the lineage, then forget
    agent_pb2.REVOKE_REASON_REASSIGNED,
    agent_pb2.REVOKE_REASON_STALE_EPOCH,
    agent_pb2.REVOKE_REASON_RELEASE_TIMEOUT,
]
OVER = [  # the task is over for this node: forget once stopped
    agent_pb2.REVOKE_REASON_CANCELLED,
    agent_pb2.REVOKE_REASON_FINISHED,
    agent_pb2.REVOKE_REASON_UNKNOWN_TASK,
    agent_pb2.REVOKE_REASON_DEADLINE_EXCEEDED,
]


def wire_revoke(task_id: str, epoch: int, reason: int, current_epoch: int) -> rec.Revoke:
    """A Revoke as the coordinator sends it, decoded by the shell's converter."""
    pb = agent_pb2.CoordinatorMessage(
        revoke=agent_pb2.Revoke(
            task_id=task_id, epoch=epoch, current_epoch=current_epoch, reason=reason
        )
    )
    msg = convert.coordinator_message_from_pb(pb)
    assert isinstance(msg, rec.Revoke)
    return msg


def revoked_and_stopped(reason: int, current_epoch: int = 3) -> tuple[Driver, list]:
    d = Driver()
    d.ack_all(d.connect())
    d.run("t1", 2)
    out = d.msg(wire_revoke("t1", 2, reason, current_epoch))
    assert of_type(out, StopTask) == [StopTask("t1", 2, StopReason.REVOKED)]
    return d, d.stopped("t1", 2)


def fork(fork_id: str = "t1~e2~node-1~inc-1", epoch: int = 2) -> rec.LineageReport:
    return rec.LineageReport(fork_id, "t1", epoch, wire=b"")


@pytest.mark.parametrize("reason", MOVED_ON)
def test_a_moved_task_is_kept_until_its_fork_is_acked_then_forgotten(reason: int) -> None:
    d, out = revoked_and_stopped(reason)
    assert len(of_type(out, ReportLineage)) == 1
    assert not of_type(out, ForgetTask)
    assert d.core.slot_state("t1") is SlotState.DETACHED
    assert d.core.lineage_ready(fork()) != []  # sent, awaiting the ack: still kept
    assert d.core.slot_state("t1") is SlotState.DETACHED
    out = d.msg(rec.LineageAck(fork().fork_id, "t1", 2))
    assert of_type(out, ForgetTask) == [ForgetTask("t1")]
    assert d.core.slot_state("t1") is None
    assert "t1" not in held(d.core, 1.0)


def test_a_detached_task_drops_its_assign() -> None:
    d, _ = revoked_and_stopped(agent_pb2.REVOKE_REASON_REASSIGNED)
    assert d.core._slots["t1"].assign is None  # its spec (payload up to 256 KiB) is not kept


@pytest.mark.parametrize("reason", MOVED_ON)
def test_a_moved_task_with_nothing_beyond_redis_is_forgotten_at_once(reason: int) -> None:
    d, _ = revoked_and_stopped(reason)
    assert d.core.lineage_empty("t1", 1) == []  # another epoch: nothing
    out = d.core.lineage_empty("t1", 2)
    assert of_type(out, ForgetTask) == [ForgetTask("t1")]
    assert d.core.slot_state("t1") is None


@pytest.mark.parametrize("reason", OVER)
def test_a_task_over_for_this_node_is_forgotten_once_stopped(reason: int) -> None:
    """DEADLINE_EXCEEDED (the leader failed the task) used to map to UNSPECIFIED: kept forever."""
    d, out = revoked_and_stopped(reason, current_epoch=2)
    assert of_type(out, ForgetTask) == [ForgetTask("t1")]
    assert not of_type(out, ReportLineage)
    assert d.core.slot_state("t1") is None


def test_a_fork_not_written_to_redis_keeps_the_local_records() -> None:
    d, _ = revoked_and_stopped(agent_pb2.REVOKE_REASON_REASSIGNED)
    d.core.lineage_ready(fork(), stored=False)
    out = d.msg(rec.LineageAck(fork().fork_id, "t1", 2))
    assert not of_type(out, ForgetTask)  # the local store holds its only full copy
    assert d.core.slot_state("t1") is SlotState.DETACHED


def test_a_lost_epoch_is_kept_and_listed_until_the_leader_revokes_it() -> None:
    d = Driver()
    d.ack_all(d.connect())
    d.run("t1", 2)
    d.core.task_lost("t1", 2, 3)  # Redis refused epoch 2
    out = d.stopped("t1", 2)
    assert len(of_type(out, ReportLineage)) == 1
    d.core.lineage_ready(fork())
    out = d.msg(rec.LineageAck(fork().fork_id, "t1", 2))
    assert not of_type(out, ForgetTask)  # the leader has not confirmed the loss
    assert held(d.core, 1.0)["t1"] == (2, rec.HeldTaskStatus.PAUSED)
    out = d.msg(revoke_msg("t1", 2, rec.RevokeReason.REASSIGNED, current_epoch=3))
    assert of_type(out, ForgetTask) == [ForgetTask("t1")]
    assert d.core.slot_state("t1") is None


def test_a_refused_update_is_forgotten_once_its_fork_is_acked() -> None:
    d = Driver()
    d.ack_all(d.connect())
    d.run("t1", 2)
    (upd,) = updates(d.core.task_finished("t1", 2, result=rec.TaskResult()))
    out = d.msg(update_ack_msg(upd.update_seq, "t1", 2, rec.UpdateOutcome.STALE_EPOCH))
    assert len(of_type(out, ReportLineage)) == 1
    assert d.core.slot_state("t1") is SlotState.DETACHED
    out = d.core.lineage_empty("t1", 2)
    assert of_type(out, ForgetTask) == [ForgetTask("t1")]
    assert d.core.slot_state("t1") is None


def test_an_old_epochs_ack_never_forgets_a_newer_epoch_here() -> None:
    d, _ = revoked_and_stopped(agent_pb2.REVOKE_REASON_REASSIGNED)
    d.core.lineage_ready(fork())
    assert starts(d.msg(rec.Assign("t1", 4, 1, "demo"))) == [("t1", 4)]  # moved back here
    assert not of_type(d.msg(rec.LineageAck(fork().fork_id, "t1", 2)), ForgetTask)
    assert d.core.slot_state("t1") is SlotState.RUNNING
    assert d.core.lineage_empty("t1", 2) == []


def test_a_revoke_with_a_newer_assign_waiting_reports_and_runs_it() -> None:
    d = Driver()
    d.ack_all(d.connect())
    d.run("t1", 2)
    d.msg(rec.Assign("t1", 4, 1, "demo"))  # supersedes epoch 2 here
    d.msg(revoke_msg("t1", 2, rec.RevokeReason.REASSIGNED, current_epoch=4))
    out = d.stopped("t1", 2)
    assert len(of_type(out, ReportLineage)) == 1
    assert starts(out) == [("t1", 4)]
    d.core.lineage_ready(fork())
    assert not of_type(d.msg(rec.LineageAck(fork().fork_id, "t1", 2)), ForgetTask)
    assert d.core.slot_state("t1") is SlotState.RUNNING


def test_a_restored_detached_task_reports_again_and_ends_forgotten() -> None:
    d = Driver()
    out = restore_raw(d.core, {"t1": raw_meta(2, 1, "demo", "detached")})
    assert of_type(out, ReportLineage) == [ReportLineage("t1", 2, 0, "", 0, 0)]
    assert "t1" not in held(d.core, 0.0)
    d.ack_all(d.connect())
    d.core.lineage_ready(fork())
    out = d.msg(rec.LineageAck(fork().fork_id, "t1", 2))
    assert of_type(out, ForgetTask) == [ForgetTask("t1")]
    assert d.core.slot_state("t1") is None
