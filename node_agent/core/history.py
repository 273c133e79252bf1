"""How much checkpoint history the local store keeps for a task it runs, sans-IO.

Theory of operation
-------------------
Every checkpoint a task commits stays in the node's local store
(``node_agent.checkpoint``) until the leader has the task's result and the
agent forgets the task. A task that checkpoints once a second for weeks would
fill the node's disk (about 1.2 KB a row for a 1 KiB state, ~104 MB a day).
With ``--keep-checkpoints N`` the agent thins a running task's history to
about its newest ``N`` checkpoints (0 keeps them all); ``node_agent.runner``
carries out these rules:

- **When** (``prune_due``): after each commit, from the commit's seq and the
  task's *base* (seq minus checkpoints held, as last measured): seqs are dense,
  so ``seq - base`` bounds what the task holds. Due once that reaches
  ``N + prune_slack(N)``: a prune then deletes about ``N // 10`` rows at once,
  one ``list`` and one ``prune`` per that many checkpoints, never one per
  commit. After a prune (or a look that pruned nothing) the runner sets the
  base with ``history_base``.
- **What** (``plan_prune``): from the task's checkpoints as ``list`` gives them
  (seq, covers_journal_seq, terminal) and the newest seq known to be in Redis,
  the cutoff, in the order recovery ranks checkpoints (covers_journal_seq, then
  seq; ``CheckpointStore.recover``). Everything before the cutoff is deleted
  (``PrunePolicy(prune_covered_before, prune_seq_before)``); the cutoff is the
  oldest checkpoint of the *protected* set:

  1. the newest ``N``, the newest of all among them: recovery resumes from it;
  2. every terminal checkpoint: a result is reported again from it;
  3. every checkpoint at or after the newest one known to be in Redis, and
     all of them while none is: a checkpoint Redis may not hold is still the
     local lineage a newer owner's adopt (``CheckpointStore.adopt``) or a
     lineage report (``core/lineage.py``: the local records above Redis's)
     keeps as a fork; a spooled row the agent ingested is known to be in
     Redis only after its spool row is gone (``TaskRunner._ship_ingested``),
     so a re-ingestion after a crash never finds its row pruned.

  The journal is compacted with it (``compact_journal``): events up to the
  smallest covers_journal_seq retained, the cutoff's, go. Each retained
  checkpoint keeps the events after it, so ``recover`` (the newest checkpoint
  plus the journal after its covers) and a replay after any retained
  checkpoint are whole; and the cutoff covers no more than the newest
  checkpoint in Redis does, so the events a lineage report may carry (those
  above what Redis holds) stay.

Pure: no IO, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "DEFAULT_KEEP_CHECKPOINTS",
    "HistoryEntry",
    "PrunePlan",
    "history_base",
    "plan_prune",
    "prune_due",
    "prune_slack",
]

DEFAULT_KEEP_CHECKPOINTS = 10_000
"""Checkpoints the local store keeps per running task (``--keep-checkpoints``):
about 12 MB of 1 KiB states, and more than an ordinary task ever makes, so its
whole history (``list``, ``load_at_or_before``, ``fork``) stays."""


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One stored checkpoint of the task, as ``CheckpointStore.list`` gives it.

    Attributes:
        seq: its per-task seq (>= 1).
        covers_journal_seq: the newest journal seq it covers (>= 0).
        terminal: it holds the task's final state.
    """

    seq: int
    covers_journal_seq: int
    terminal: bool = False


@dataclass(frozen=True, slots=True)
class PrunePlan:
    """What to prune: ``PrunePolicy(covered_before, True, compact_journal, seq_before)``.

    Attributes:
        covered_before: ``PrunePolicy.prune_covered_before``, the cutoff's covers.
        seq_before: ``PrunePolicy.prune_seq_before``, the cutoff's seq.
        compact_journal: delete the journal up to the cutoff's covers too.
        pruned: how many of the entries planned from go.
        retained: how many of them stay.
    """

    covered_before: int
    seq_before: int
    compact_journal: bool
    pruned: int
    retained: int


def prune_slack(keep_checkpoints: int) -> int:
    """How many checkpoints over ``keep_checkpoints`` a task may hold before a prune (>= 1)."""
    return max(1, keep_checkpoints // 10)


def prune_due(*, newest_seq: int, base_seq: int, keep_checkpoints: int) -> bool:
    """Whether the task's history may have grown past its bound, so the runner looks.

    Args:
        newest_seq: the seq of the checkpoint just committed.
        base_seq: the task's base (``history_base``; 0 before its first look).
        keep_checkpoints: ``--keep-checkpoints`` (0 = keep all: never due).
    """
    if keep_checkpoints <= 0:
        return False
    return newest_seq - base_seq >= keep_checkpoints + prune_slack(keep_checkpoints)


def history_base(*, newest_seq: int, held: int, keep_checkpoints: int) -> int:
    """The task's base after a look at its history.

    Args:
        newest_seq: the newest seq the look saw.
        held: the checkpoints it left the task (after a prune, or all when
            nothing could go).
        keep_checkpoints: ``--keep-checkpoints``.

    Returns:
        ``newest_seq`` minus the lesser of ``held`` and the bound: the next look
        comes once the task may hold ``prune_slack`` more than the bound, or,
        when nothing could go (all protected), ``prune_slack`` commits later.
    """
    return newest_seq - min(held, keep_checkpoints)


def plan_prune(
    entries: Iterable[HistoryEntry], *, keep_checkpoints: int, replicated_seq: int
) -> PrunePlan | None:
    """The prune that leaves the task about its newest ``keep_checkpoints`` checkpoints.

    Args:
        entries: the task's stored checkpoints, in any order.
        keep_checkpoints: ``--keep-checkpoints`` (0 = keep all).
        replicated_seq: the newest checkpoint seq known to be in Redis (0 = none).

    Returns:
        The plan, or None when nothing may go (see the module's protected set).
    """
    if keep_checkpoints <= 0:
        return None
    ranked = sorted(entries, key=lambda e: (e.covers_journal_seq, e.seq))
    if len(ranked) <= keep_checkpoints or replicated_seq <= 0:
        return None
    cut = len(ranked) - keep_checkpoints  # the oldest of the newest N
    for i in range(cut):
        entry = ranked[i]
        if entry.terminal or entry.seq >= replicated_seq:
            cut = i
            break
    if cut == 0:
        return None
    oldest_kept = ranked[cut]
    return PrunePlan(
        covered_before=oldest_kept.covers_journal_seq,
        seq_before=oldest_kept.seq,
        compact_journal=True,
        pruned=cut,
        retained=len(ranked) - cut,
    )
