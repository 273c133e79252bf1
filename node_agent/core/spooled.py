"""Which spooled checkpoints the agent still ships to Redis itself, sans-IO.

A worker process writes its run's checkpoints to Redis itself
(``node_agent.isolation``): each one of a ``replicated`` run, and a ``local``
run's newest at most every linger minus a margin. It publishes the highest
seq it wrote (``replicated_through``) and the newest seq it spooled, with its
commit time (``spooled_through``). The agent decides with these rules when to
ingest a run's spool (``ingest_now``) and, per run's newest ingested row,
whether it still ships it (``pending_action``); ``node_agent.runner`` carries
them out.
"""

from __future__ import annotations

import enum

__all__ = ["LAZY_INGEST_INTERVAL_S", "PendingAction", "in_redis", "ingest_now", "pending_action"]

LAZY_INGEST_INTERVAL_S = 2.0
"""How often the agent ingests a ``local`` run's spool whose newest row its worker
wrote to Redis itself, seconds. Nothing waits on those rows: they are durable in
the spool, the worker keeps Redis's copy fresh, the run's other messages, its
end and an agent restart ingest them first, and the leader hears of a ``local``
task's checkpoints every 5 s at most (``DEFAULT_LOCAL_PROGRESS_REPORT_INTERVAL_S``).
Ingesting each 0.4 s instead cost about 0.2 ms of agent CPU per checkpoint, and
0.1 more of the leader's for the progress reports it triggered
(``bench/taskpath_bench.py``, CPU-bound ``local`` steps in process isolation)."""


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


def ingest_now(
    *,
    local: bool,
    worker_writes_redis: bool,
    spooled: int,
    ingested: int,
    replicated: int,
    newest_age_s: float,
    due_s: float,
    since_s: float,
    report_every_s: float,
) -> bool:
    """Whether the agent's tick ingests a run's spool now (``TaskRunner.ingest_spools``).

    Args:
        local: the run's durability is ``local``.
        worker_writes_redis: its worker writes checkpoints to Redis itself;
            if not, the agent ships every newest row, so it ingests at once.
        spooled: the newest seq the run's worker spooled (0: none yet).
        ingested: the newest seq of the run the agent ingested (0: none).
        replicated: the worker's ``replicated_through``.
        newest_age_s: seconds since the newest spooled row was committed.
        due_s: how long a row Redis lacks may wait before the agent ships it
            (as ``pending_action``).
        since_s: seconds since the run's spool was last ingested.
        report_every_s: the agent's progress report interval: how often a
            ``replicated`` run, whose worker wrote every row to Redis before
            returning it, is ingested anyway (its reports of those rows as
            replicated are the leader's evidence of what Redis must hold); a
            ``local`` run is ingested anyway every ``LAZY_INGEST_INTERVAL_S``.
    """
    if spooled <= ingested:
        return False  # nothing new in the spool
    if not worker_writes_redis:
        return True
    if spooled > replicated and newest_age_s >= due_s:
        return True  # Redis lacks the newest row and it is due: the agent ships it
    return since_s >= (LAZY_INGEST_INTERVAL_S if local else report_every_s)
