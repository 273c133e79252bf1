"""Which spooled checkpoints the agent still ships to Redis itself, sans-IO.

A worker process writes its run's checkpoints to Redis itself
(``node_agent.isolation``): each one of a ``replicated`` run, and a ``local``
run's newest at most every linger minus a margin. It publishes the highest
seq it wrote (``replicated_through``). The agent, ingesting the spool, decides
per run's newest ingested row with these rules; ``node_agent.runner`` carries
them out.
"""

from __future__ import annotations

import enum

__all__ = ["PendingAction", "in_redis", "pending_action"]


def in_redis(replicated_through: int, row_seq: int, stored_seq: int) -> bool:
    """Whether a spooled row is in Redis already: its worker wrote it or a newer row of
    its run (``row_seq <= replicated_through``), and the store kept the seq the
    worker gave it (``stored_seq == row_seq``; a renumbered row is not the one
    Redis holds).
    """
    return stored_seq == row_seq <= replicated_through


class PendingAction(enum.Enum):
    """What becomes of a ``local`` run's newest row left for its worker to write."""

    KEEP = "keep"  # not yet due: the worker may still write it (or a newer one)
    DROP = "drop"  # in Redis already: nothing to ship
    SHIP = "ship"  # the agent ships it now, as a lingering record


def pending_action(*, covered: bool, final: bool, age_s: float, due_s: float) -> PendingAction:
    """The rule for a deferred row (``TaskRunner._ship_pending``, each tick).

    Args:
        covered: ``in_redis`` of the row with the worker's current ``replicated_through``.
        final: no write of the worker's will come any more (the run returned,
            raised or its worker died; or a relay is about to answer for it).
        age_s: seconds since the row was committed.
        due_s: how long a record may linger before the agent ships it
            (the replicator's linger minus the hold margin): Redis's copy then
            lags by no more than it did when the agent shipped every row.
    """
    if covered:
        return PendingAction.DROP
    if final or age_s >= due_s:
        return PendingAction.SHIP
    return PendingAction.KEEP
