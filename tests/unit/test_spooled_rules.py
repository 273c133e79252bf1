"""The agent's rules for what its workers write to Redis (node_agent/core/spooled.py)."""

from __future__ import annotations

import pytest

from node_agent.core.spooled import PendingAction, in_redis, pending_action


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
