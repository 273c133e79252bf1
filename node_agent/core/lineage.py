"""Which of a superseded owner's records form its fork, and how the fork is named.

When a task is revoked (or Redis refuses its epoch) after this process made
progress that never reached Redis, that progress is kept as a *fork*
(DESIGN.md §7: a fenced owner's work is never silently dropped): a
ForkRecord plus the records in Redis, and a LineageReport to the leader. The
shell reads the local store and Redis; the choices are made here:

- **Base.** The fork starts where the lineage that superseded ours started:
  the base the newer epoch's claim recorded in Redis (``lineage_bases``: the
  first epoch above ours). Without it (Redis down, an older server), what this
  process saw acknowledged (its replicated checkpoint and journal seqs).
- **Records.** The local checkpoints above the checkpoint base and the journal
  events above the journal base, made at our epoch or below (a later epoch's
  records on this node belong to a later lineage). A report carries at most the
  newest ``MAX_REPORT_CHECKPOINTS`` and ``MAX_REPORT_EVENTS`` of them (a gRPC
  message stays far below 4 MiB); the ForkRecord counts them all.
- **Resolution.** A task whose state is a shared CRDT document merges into the
  current owner's state (MERGED); any other fork is KEPT for an operator.
- **Name.** ``<task>~e<epoch>~<node>~<incarnation[:8]>``: unique per process
  and epoch, so a retransmitted report is recognised as the same fork.

A *lineage copy* (``<task>~lineage-e<epoch>``: the rows a restore's adopt
replaced, ``CheckpointStore.adopt``) is reported as a fork too: every record
in it is divergent, its stale epoch is the newest epoch among them, and the
fork is named after the copy (``copy_fork_id``). Which rows an adopt moves
there is decided here too (``adopted_cut``): those above the point where the
adopted lineage left this store's, not only those at or after the adopted
checkpoint.

Retransmission of the report until the leader's LineageAck is ``AgentCore``'s
(``lineage_ready``). Pure: no IO, no clock.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "MAX_REPORT_CHECKPOINTS",
    "MAX_REPORT_EVENTS",
    "Divergence",
    "Resolution",
    "adopted_cut",
    "copy_fork_id",
    "fork_base",
    "fork_id",
    "select_divergent",
]

MAX_REPORT_CHECKPOINTS = 64
"""Newest divergent checkpoints a LineageReport carries."""
MAX_REPORT_EVENTS = 4096
"""Newest divergent journal events a LineageReport carries."""


class Resolution(enum.Enum):
    """What becomes of a fork (``records.ForkResolution``)."""

    KEPT = "kept"  # stored beside the current lineage, for an operator
    MERGED = "merged"  # a CRDT state: merged into the current owner's


@dataclass(frozen=True, slots=True)
class Divergence:
    """A superseded owner's records beyond the base, as (seq, epoch) pairs in seq order.

    Attributes:
        checkpoints, events: every divergent checkpoint and journal event.
        reported_checkpoints, reported_events: the newest of them, the ones a
            LineageReport carries (at most MAX_REPORT_CHECKPOINTS / _EVENTS).
        resolution: KEPT or MERGED.
    """

    checkpoints: tuple[tuple[int, int], ...]
    events: tuple[tuple[int, int], ...]
    reported_checkpoints: tuple[tuple[int, int], ...]
    reported_events: tuple[tuple[int, int], ...]
    resolution: Resolution

    @property
    def empty(self) -> bool:
        """Nothing beyond what Redis holds: no fork to keep."""
        return not self.checkpoints and not self.events


def fork_id(task_id: str, epoch: int, node_id: str, incarnation: str) -> str:
    """The fork's name: ``<task>~e<epoch>~<node>~<incarnation[:8]>``."""
    return f"{task_id}~e{epoch}~{node_id}~{incarnation[:8]}"


def copy_fork_id(copy_task_id: str, node_id: str, incarnation: str, report_seq: int) -> str:
    """A lineage copy's fork name: ``<copy>~<node>~<incarnation[:8]>~<report_seq>``.

    ``report_seq`` is ``ReportLineageCopy.report_seq``: a copy name the store
    reuses after an earlier copy was reported and forgotten still gets a new
    fork (the same fork id would overwrite the earlier ForkRecord in Redis).
    """
    return f"{copy_task_id}~{node_id}~{incarnation[:8]}~{report_seq}"


def fork_base(
    stale_epoch: int,
    bases: Mapping[int, tuple[int, int]] | None,
    acknowledged: tuple[int, int],
) -> tuple[int, int]:
    """Where the fork starts, as (journal seq, checkpoint seq).

    Args:
        stale_epoch: the epoch this process ran the task at.
        bases: epoch -> (journal base, checkpoint base) as newer owners' claims
            recorded them in Redis; None when Redis could not be read.
        acknowledged: (replicated journal seq, replicated checkpoint seq) this
            process saw acknowledged: the fallback.
    """
    newer = sorted(e for e in (bases or {}) if e > stale_epoch)
    if newer and bases is not None:
        return bases[newer[0]]
    return acknowledged


def adopted_cut(
    held_epoch: int, bases: Mapping[int, tuple[int, int]] | None
) -> tuple[int, int] | None:
    """Where an adopted newer lineage left the store's own: (journal seq, checkpoint seq).

    The store's rows of a task form one chain (its epochs never go down as its
    seqs go up) and ``held_epoch``, the task's epoch in the store, is the
    newest epoch at which this node held that chain. The first epoch above it
    that claimed the task in Redis resumed from what Redis held at its claim
    (its base): only the store's rows at or below that base are the adopted
    lineage's ancestors. A local row above it is divergent even below the
    adopted checkpoint's seq (the old owner's seq 2 at epoch 1 when the next
    owner resumed from seq 1 and wrote its own seq 2): the adopt keeps it as a
    lineage copy instead of leaving it in the task's history.

    It errs towards keeping a fork: an epoch this node claimed, resumed from
    its own unreplicated rows and wrote nothing at leaves no trace in the
    store, so those rows count as divergent even when it shipped them to
    Redis before a later owner resumed from them (reported as a fork though
    shared: noise, never a loss).

    Args:
        held_epoch: the task's epoch in the local store (its head), before the adopt.
        bases: epoch -> (journal base, checkpoint base) as the claims recorded
            them in Redis (``lineage_bases``); None or empty when unknown.

    Returns:
        The base of the first claimed epoch above ``held_epoch``, or None when
        no claim above it is known (a re-attach at the held epoch, an older
        server): then only the rows the adopted records replace can diverge.
    """
    newer = [e for e in bases or {} if e > held_epoch]
    if not newer or bases is None:
        return None
    return bases[min(newer)]


def select_divergent(
    stale_epoch: int,
    base: tuple[int, int],
    checkpoints: Sequence[tuple[int, int]],
    events: Sequence[tuple[int, int]],
    *,
    crdt: bool = False,
) -> Divergence:
    """The records that make up the fork.

    Args:
        stale_epoch: the epoch this process ran the task at.
        base: (journal seq, checkpoint seq) from ``fork_base``.
        checkpoints: the local checkpoints as (seq, epoch), seq order.
        events: the local journal events as (seq, epoch), seq order.
        crdt: the task's state is a shared CRDT document.
    """
    journal_base, checkpoint_base = base
    ckpts = tuple((s, e) for s, e in checkpoints if s > checkpoint_base and e <= stale_epoch)
    evs = tuple((s, e) for s, e in events if s > journal_base and e <= stale_epoch)
    return Divergence(
        checkpoints=ckpts,
        events=evs,
        reported_checkpoints=ckpts[-MAX_REPORT_CHECKPOINTS:],
        reported_events=evs[-MAX_REPORT_EVENTS:],
        resolution=Resolution.MERGED if crdt else Resolution.KEPT,
    )
