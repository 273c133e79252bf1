"""The pure restore rules (``node_agent/core/restore.py``): newest side wins, gaps stop adoption.

Each case names what the runner must do; the property test checks the plan
against a direct statement of the rule for every small pair of heads.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node_agent.core.restore import (
    LocalHead,
    RemoteHead,
    RestorePlan,
    Source,
    plan_restore,
    resume_without_redis,
)


def test_nothing_anywhere_starts_fresh_locally_without_shipping() -> None:
    assert plan_restore(LocalHead(), None) == RestorePlan(Source.LOCAL, catch_up=False)


def test_redis_read_but_empty_and_no_local_state_still_catches_up_nothing_lost() -> None:
    # Redis answered (the claim succeeded): the runner ships what it lacks (here nothing).
    assert plan_restore(LocalHead(), RemoteHead()) == RestorePlan(Source.LOCAL, catch_up=True)


def test_local_ahead_resumes_locally_and_ships_what_redis_lacks() -> None:
    local = LocalHead(checkpoint_seq=5, journal_seq=9, has_state=True)
    remote = RemoteHead(checkpoint_seq=4, covers_journal_seq=7, journal_seq=8, event_seqs=(8,))
    assert plan_restore(local, remote) == RestorePlan(Source.LOCAL, catch_up=True)


def test_equal_heads_resume_locally() -> None:
    local = LocalHead(checkpoint_seq=5, journal_seq=9, has_state=True)
    remote = RemoteHead(checkpoint_seq=5, covers_journal_seq=9, journal_seq=9)
    assert plan_restore(local, remote).source is Source.LOCAL


@pytest.mark.parametrize(
    "remote",
    [
        RemoteHead(checkpoint_seq=6, covers_journal_seq=9, journal_seq=9),  # newer checkpoint
        RemoteHead(checkpoint_seq=5, covers_journal_seq=9, journal_seq=10, event_seqs=(10,)),
    ],
)
def test_redis_ahead_is_adopted(remote: RemoteHead) -> None:
    local = LocalHead(checkpoint_seq=5, journal_seq=9, has_state=True)
    plan = plan_restore(local, remote)
    assert plan.source is Source.REDIS
    assert plan.adopt_events == len(remote.event_seqs)
    assert not plan.catch_up


def test_a_newer_owners_lineage_is_adopted_even_with_fewer_checkpoints() -> None:
    """This node wrote seq 5 at epoch 1 and reached Redis up to seq 2; an owner at
    epoch 2 resumed from seq 2 and wrote seq 3; the task comes back here. Before,
    seq 5 > 3 resumed this node's own stale branch and dropped epoch 2's work."""
    local = LocalHead(checkpoint_seq=5, journal_seq=5, has_state=True, epoch=1)
    remote = RemoteHead(checkpoint_seq=3, covers_journal_seq=3, journal_seq=3, epoch=2)
    assert plan_restore(local, remote) == RestorePlan(Source.REDIS, adopt_events=0)
    # The same heads with the same epoch on both sides: this node's rows are the newest.
    same = RemoteHead(checkpoint_seq=3, covers_journal_seq=3, journal_seq=3, epoch=1)
    assert plan_restore(local, same).source is Source.LOCAL


def test_adoption_stops_at_the_first_gap_in_the_remote_journal() -> None:
    remote = RemoteHead(
        checkpoint_seq=3, covers_journal_seq=10, journal_seq=15, event_seqs=(11, 12, 14, 15)
    )
    plan = plan_restore(LocalHead(), remote)
    assert plan == RestorePlan(Source.REDIS, adopt_events=2)


def test_an_event_right_after_a_missing_first_one_is_not_adopted() -> None:
    remote = RemoteHead(checkpoint_seq=3, covers_journal_seq=10, journal_seq=12, event_seqs=(12,))
    assert plan_restore(LocalHead(), remote).adopt_events == 0


@pytest.mark.parametrize(
    ("reattach", "has_local", "expected"),
    [(True, True, True), (True, False, False), (False, True, False), (False, False, False)],
)
def test_only_a_reattach_with_local_state_resumes_while_redis_is_down(
    reattach: bool, has_local: bool, expected: bool
) -> None:
    assert resume_without_redis(reattach=reattach, has_local=has_local) is expected


seqs = st.integers(0, 6)


@given(
    local_ck=seqs,
    local_j=seqs,
    local_epoch=st.integers(0, 3),
    remote=st.none()
    | st.builds(
        RemoteHead,
        checkpoint_seq=seqs,
        covers_journal_seq=seqs,
        journal_seq=seqs,
        event_seqs=st.lists(st.integers(0, 12), max_size=5).map(lambda x: tuple(sorted(set(x)))),
        epoch=st.integers(0, 3),
    ),
)
def test_the_plan_follows_the_rule(
    local_ck: int, local_j: int, local_epoch: int, remote: RemoteHead | None
) -> None:
    local = LocalHead(local_ck, local_j, has_state=bool(local_ck or local_j), epoch=local_epoch)
    plan = plan_restore(local, remote)
    ahead = remote is not None and (
        remote.epoch > local_epoch
        or remote.checkpoint_seq > local_ck
        or remote.journal_seq > local_j
    )
    assert (plan.source is Source.REDIS) is ahead
    if ahead:
        assert remote is not None
        adopted = remote.event_seqs[: plan.adopt_events]
        expected = tuple(
            range(remote.covers_journal_seq + 1, remote.covers_journal_seq + 1 + len(adopted))
        )
        assert adopted == expected  # contiguous from the checkpoint
        rest = remote.event_seqs[plan.adopt_events :]
        assert not rest or rest[0] != remote.covers_journal_seq + 1 + len(adopted)  # maximal
        assert not plan.catch_up
    else:
        assert plan.adopt_events == 0
        assert plan.catch_up is (remote is not None or local.has_state)
