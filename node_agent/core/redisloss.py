"""Redis data loss, decided in pure code: when a resume would silently lose progress.

Redis holds the replicated copy of every task (``lazarus.storage.replica``).
If it restarts empty (no AOF, no RDB) or fails over to a replica that lagged,
it answers as if acknowledged checkpoints had never been written. Two
consequences, and the rule this module decides for each (the shells in
``node_agent/runner.py`` and ``node_agent/agent.py`` only carry them out):

1. **A new owner** would restore from what is left and run the task from an
   older point, or from scratch, without anyone noticing. The leader's Assign
   carries the newest checkpoint it saw acknowledged (``ResumePoint``) and the
   journal seq to replay through. :func:`judge_resume` compares them with what
   the restore found (the agent's own store and Redis, whichever is newer):
   when the restored state is older, the task is **not** run; it fails with
   ``TASK_ERROR_CODE_DATA_LOSS`` (not retryable: no other node would find more),
   the leader emits it as a ``TaskFailed`` event and counts it in
   ``lazarus_data_loss_events_total``, and the agent in
   ``lazarus_agent_data_loss_total``.
2. **A live owner** still holds the lost records in its local SQLite store.
   It re-ships its newest checkpoint and the journal after it (which makes
   Redis whole again for that task) when either signal shows the loss:

   - the fenced write script finds a **gap**: the item's first journal event is
     past Redis's journal head + 1 and no checkpoint in the item covers the
     hole (Redis lost what came before, e.g. a failover to a lagging replica);
   - the cluster's **generation marker** (a random id set with ``SET NX`` in
     Redis, read every few seconds) changed or vanished: Redis restarted empty,
     so every task this agent owns is re-shipped, including idle ones that
     would write nothing for a while.

Sources: the fencing and re-ship follow the replication rule of DESIGN.md §3
(Redis holds a consistent prefix: a checkpoint plus contiguous journal after
its covers); detecting a reset with a random generation id is the approach of
Redis's own replication id (``master_replid``) that a replica compares to tell
a new dataset from a continued one.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DataLoss", "generation_reset", "judge_resume"]


@dataclass(frozen=True, slots=True)
class DataLoss:
    """What a resume would have lost.

    Attributes:
        acknowledged_checkpoint_seq: newest checkpoint seq the leader saw
            acknowledged by Redis (0: none).
        restored_checkpoint_seq: newest checkpoint seq the restore found (0: none).
        acknowledged_journal_seq: journal seq the leader asked to replay through (0: none).
        restored_journal_seq: last contiguous journal seq the restore found.
    """

    acknowledged_checkpoint_seq: int
    restored_checkpoint_seq: int
    acknowledged_journal_seq: int
    restored_journal_seq: int

    def describe(self) -> str:
        """One line for the task's error message and the agent's log."""
        parts = []
        if self.restored_checkpoint_seq < self.acknowledged_checkpoint_seq:
            parts.append(
                f"checkpoint seq {self.acknowledged_checkpoint_seq} was acknowledged by Redis, "
                f"the newest found is seq {self.restored_checkpoint_seq}"
            )
        if self.restored_journal_seq < self.acknowledged_journal_seq:
            parts.append(
                f"journal seq {self.acknowledged_journal_seq} was acknowledged, "
                f"the journal found ends at seq {self.restored_journal_seq}"
            )
        return (
            "; ".join(parts) + " (in neither Redis nor this node's store: Redis lost data, "
            "e.g. restarted without persistence or failed over to a lagging replica; "
            "the task is not resumed from an older point; ForkTask it from what is left)"
        )


def judge_resume(
    *,
    acknowledged_checkpoint_seq: int,
    acknowledged_journal_seq: int,
    restored_checkpoint_seq: int,
    restored_journal_seq: int,
) -> DataLoss | None:
    """Whether resuming from what the restore found would lose acknowledged progress.

    Args:
        acknowledged_checkpoint_seq: ``Assign.resume_from.checkpoint.seq`` (0: unset).
        acknowledged_journal_seq: ``Assign.resume_from.replay_through_journal_seq``
            (0: no bound given, nothing to compare).
        restored_checkpoint_seq: seq of the checkpoint the restore selected (0: none).
        restored_journal_seq: last journal seq of the restored contiguous journal
            (or the restored checkpoint's covers when no event follows it).

    Returns:
        None when the restored state is at least as new as what was acknowledged
        (checkpoint seqs only grow within a task's lineage; a journal covered by
        a newer checkpoint counts as restored), else a :class:`DataLoss`.
    """
    ckpt_lost = restored_checkpoint_seq < acknowledged_checkpoint_seq
    journal_lost = acknowledged_journal_seq > 0 and restored_journal_seq < acknowledged_journal_seq
    if not ckpt_lost and not journal_lost:
        return None
    return DataLoss(
        acknowledged_checkpoint_seq=acknowledged_checkpoint_seq,
        restored_checkpoint_seq=restored_checkpoint_seq,
        acknowledged_journal_seq=acknowledged_journal_seq if journal_lost else 0,
        restored_journal_seq=restored_journal_seq,
    )


def generation_reset(previous: str | None, current: str | None) -> bool:
    """Whether Redis's generation marker shows a new dataset since the last read.

    Args:
        previous: the marker this agent read last (None: never read one).
        current: the marker read now (None: Redis could not be read).

    Returns:
        True when both are known and differ: the marker this agent saw is gone
        (another agent or this one set a fresh one after the reset). A first
        read, or a failed one, is no evidence either way.
    """
    return previous is not None and current is not None and previous != current
