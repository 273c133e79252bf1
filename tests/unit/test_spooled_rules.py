"""The agent's rules for what its workers write to Redis (node_agent/core/spooled.py)."""

from __future__ import annotations

import pytest

from node_agent.core.spooled import (
    LAZY_INGEST_INTERVAL_S,
    PendingAction,
    in_redis,
    ingest_now,
    pending_action,
)


@pytest.mark.parametrize(
    ("through", "row_seq", "stored_seq", "expected"),
    [
        (5, 5, 5, True),  # the worker wrote this row
        (7, 5, 5, True),  # ... or a newer one of its run
        (4, 5, 5, False),  # not yet
        (0, 1, 1, False),  # nothing written by the worker
        (9, 5, 6, False),  # renumbered at ingestion: Redis holds another seq
    ],
)
def test_a_row_is_in_redis_only_at_the_seq_its_worker_wrote(
    through: int, row_seq: int, stored_seq: int, expected: bool
) -> None:
    assert in_redis(through, row_seq, stored_seq) is expected


def test_a_deferred_row_waits_for_its_worker_until_it_would_have_lingered_out() -> None:
    kw = {"due_s": 0.4}
    assert pending_action(covered=False, final=False, age_s=0.1, **kw) is PendingAction.KEEP
    assert pending_action(covered=False, final=False, age_s=0.4, **kw) is PendingAction.SHIP
    assert pending_action(covered=True, final=False, age_s=0.1, **kw) is PendingAction.DROP
    assert pending_action(covered=True, final=False, age_s=9.0, **kw) is PendingAction.DROP


def test_a_deferred_row_ships_at_once_when_no_worker_write_will_come() -> None:
    assert pending_action(covered=False, final=True, age_s=0.0, due_s=0.4) is PendingAction.SHIP
    assert pending_action(covered=True, final=True, age_s=0.0, due_s=0.4) is PendingAction.DROP


def _ingest(**kw: object) -> bool:
    base: dict[str, object] = {
        "local": True,
        "worker_writes_redis": True,
        "report_every_s": 1.0,
        "spooled": 5,
        "ingested": 3,
        "replicated": 5,
        "newest_age_s": 0.1,
        "due_s": 0.4,
        "since_s": 0.5,
    }
    base.update(kw)
    return ingest_now(**base)  # type: ignore[arg-type]


def test_nothing_new_in_a_spool_is_never_ingested() -> None:
    assert not _ingest(spooled=3, ingested=3, worker_writes_redis=False, since_s=99.0)
    assert not _ingest(spooled=0, ingested=0, replicated=0, newest_age_s=99.0, since_s=99.0)


def test_a_run_whose_worker_writes_no_redis_is_ingested_as_soon_as_it_spooled() -> None:
    assert _ingest(worker_writes_redis=False, since_s=0.0)


def test_a_lazy_run_covered_by_its_worker_waits_for_the_interval() -> None:
    assert not _ingest(since_s=0.5)
    assert not _ingest(since_s=LAZY_INGEST_INTERVAL_S - 0.01)
    assert _ingest(since_s=LAZY_INGEST_INTERVAL_S)


def test_a_lazy_runs_newest_row_redis_lacks_is_ingested_once_due() -> None:
    assert not _ingest(replicated=4, newest_age_s=0.1)  # the worker may still write it
    assert _ingest(replicated=4, newest_age_s=0.4)  # due: the agent ships it
    assert _ingest(replicated=0, newest_age_s=3.0, since_s=0.0)


def test_a_replicated_run_is_ingested_at_its_report_interval() -> None:
    assert not _ingest(local=False, spooled=5, replicated=5, since_s=0.5)
    assert _ingest(local=False, spooled=5, replicated=5, since_s=1.0)
