"""Where a started task resumes from: the local store or Redis, and what to ship or adopt.

The runner (``node_agent.runner``) reads both sides, the local store's
newest checkpoint and journal (``LocalHead``) and what Redis holds after the
claim (``RemoteHead``, or None when Redis could not be read), asks
``plan_restore``, and carries the plan out: adopt Redis's records into the
local store, or ship to Redis what it lacks. The rules (DESIGN.md §5 and §7):

- **A newer owner's lineage wins.** When Redis holds a record of a higher
  epoch than any local record, another owner claimed the task after this
  node's rows and wrote on from what Redis held then; Redis's fence refused
  every lower-epoch write after that claim, so local rows Redis lacks are a
  divergent branch, whatever their seqs. Adopt Redis (the adopt moves the
  divergent local rows to a lineage copy, reported as a fork). Comparing seqs
  alone resumed a node that got a task back after a partition from its own
  stale branch when it had written more checkpoints than the owner in
  between, silently dropping that owner's work.
- **Newest wins.** Otherwise Redis is ahead when its checkpoint seq or its
  journal seq is above the local one (another owner progressed after us, or
  this node's store was lost): adopt Redis's checkpoint and the journal
  events after it, up to the first gap; events past a gap cannot be replayed
  in order and stay in Redis for reconciliation. Otherwise resume locally
  and ship what Redis lacks, so the next owner finds it.
- **Redis down on a re-attach.** The leader re-attached a task this process
  held at the same epoch: its local records are this owner's own and the
  newest any owner wrote (no one else ran the epoch), so the task resumes
  from them while Redis is unreachable. Any other start waits for Redis: a
  new owner's local store may be arbitrarily stale.

Pure: no IO, no clock (the shared purity test checks it).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "LocalHead",
    "RemoteHead",
    "RestorePlan",
    "Source",
    "plan_restore",
    "resume_without_redis",
]


class Source(enum.Enum):
    """Where the restored state was read."""

    LOCAL = "local"
    REDIS = "redis"


@dataclass(frozen=True, slots=True)
class LocalHead:
    """The local store's newest state of a task.

    Attributes:
        checkpoint_seq: newest valid local checkpoint, 0 when none.
        journal_seq: newest local journal event (or what the checkpoint covers), 0 when none.
        has_state: a checkpoint or a journal event exists locally.
        epoch: the highest epoch of the local records (newest checkpoint, journal
            events), 0 when none.
    """

    checkpoint_seq: int = 0
    journal_seq: int = 0
    has_state: bool = False
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class RemoteHead:
    """What Redis holds of a task (``RemoteState``, without the payloads).

    Attributes:
        checkpoint_seq: newest replicated checkpoint, 0 when none.
        covers_journal_seq: the journal seq that checkpoint covers.
        journal_seq: highest journal seq replicated.
        event_seqs: seqs of the journal events after ``covers_journal_seq``, in order.
        epoch: the highest epoch of those records (checkpoint, events), 0 when none.
    """

    checkpoint_seq: int = 0
    covers_journal_seq: int = 0
    journal_seq: int = 0
    event_seqs: tuple[int, ...] = ()
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class RestorePlan:
    """What the runner does before the handler starts.

    Attributes:
        source: where the state the handler resumes from comes from.
        adopt_events: with ``source`` REDIS, how many of ``RemoteHead.event_seqs``
            (a prefix: the contiguous run after the checkpoint) to adopt.
        catch_up: ship the local records Redis lacks (``source`` LOCAL only).
    """

    source: Source
    adopt_events: int = 0
    catch_up: bool = False


def resume_without_redis(*, reattach: bool, has_local: bool) -> bool:
    """True when a start may resume from local records while Redis cannot be read.

    Only a re-attach (``AssignReason.REATTACH``: same process lineage, same
    epoch) with local state; every other start waits for Redis.
    """
    return reattach and has_local


def plan_restore(local: LocalHead, remote: RemoteHead | None) -> RestorePlan:
    """The restore plan for a task whose two heads are ``local`` and ``remote``.

    ``remote`` is None when Redis could not be read (a re-attach resuming
    locally, see ``resume_without_redis``).
    """
    if remote is not None and (
        remote.epoch > local.epoch
        or remote.checkpoint_seq > local.checkpoint_seq
        or remote.journal_seq > local.journal_seq
    ):
        contiguous = 0
        previous = remote.covers_journal_seq
        for seq in remote.event_seqs:
            if seq != previous + 1:
                break
            contiguous += 1
            previous = seq
        return RestorePlan(Source.REDIS, adopt_events=contiguous)
    return RestorePlan(Source.LOCAL, catch_up=remote is not None or local.has_state)
