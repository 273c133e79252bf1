"""The rule that bounds a running task's local checkpoint history (node_agent/core/history.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from node_agent.core.history import (
    DEFAULT_KEEP_CHECKPOINTS,
    HistoryEntry,
    PrunePlan,
    history_base,
    plan_prune,
    prune_due,
    prune_slack,
)


def _entries(n: int, covers: int = 0) -> list[HistoryEntry]:
    return [HistoryEntry(seq, covers) for seq in range(1, n + 1)]


def test_the_default_keeps_ten_thousand_and_prunes_a_tenth_at_once() -> None:
    assert DEFAULT_KEEP_CHECKPOINTS == 10_000
    assert prune_slack(10_000) == 1_000
    assert prune_slack(5) == 1
    assert prune_slack(1) == 1


def test_due_once_the_task_may_hold_the_bound_plus_its_slack() -> None:
    assert not prune_due(newest_seq=10, base_seq=0, keep_checkpoints=10)
    assert prune_due(newest_seq=11, base_seq=0, keep_checkpoints=10)
    assert not prune_due(newest_seq=11_000 - 1, base_seq=0, keep_checkpoints=10_000)
    assert prune_due(newest_seq=11_000, base_seq=0, keep_checkpoints=10_000)
    # measured: the task holds newest_seq - base checkpoints at most
    assert not prune_due(newest_seq=25_000, base_seq=15_000, keep_checkpoints=10_000)
    assert prune_due(newest_seq=26_000, base_seq=15_000, keep_checkpoints=10_000)


def test_zero_keeps_everything() -> None:
    assert not prune_due(newest_seq=10**9, base_seq=0, keep_checkpoints=0)
    assert plan_prune(_entries(50), keep_checkpoints=0, replicated_seq=50) is None


def test_the_base_puts_the_next_look_a_slack_later() -> None:
    # pruned down to the bound: due again after another slack of commits
    base = history_base(newest_seq=110, held=100, keep_checkpoints=100)
    assert base == 10
    assert not prune_due(newest_seq=119, base_seq=base, keep_checkpoints=100)
    assert prune_due(newest_seq=120, base_seq=base, keep_checkpoints=100)
    # nothing could go (all protected): the same, not one look per commit
    base = history_base(newest_seq=500, held=500, keep_checkpoints=100)
    assert not prune_due(newest_seq=509, base_seq=base, keep_checkpoints=100)
    assert prune_due(newest_seq=510, base_seq=base, keep_checkpoints=100)


def test_keeps_the_newest_n_of_checkpoints_that_all_cover_the_same_seq() -> None:
    plan = plan_prune(_entries(30), keep_checkpoints=10, replicated_seq=30)
    assert plan == PrunePlan(
        covered_before=0, seq_before=21, compact_journal=True, pruned=20, retained=10
    )


def test_the_cutoff_follows_recoverys_order_covers_then_seq() -> None:
    entries = [HistoryEntry(q, q // 3) for q in range(1, 13)]
    plan = plan_prune(reversed(entries), keep_checkpoints=4, replicated_seq=12)
    assert plan is not None
    assert (plan.covered_before, plan.seq_before, plan.pruned) == (3, 9, 8)


def test_nothing_goes_while_no_checkpoint_is_known_in_redis() -> None:
    assert plan_prune(_entries(100), keep_checkpoints=10, replicated_seq=0) is None


def test_what_redis_may_lack_stays() -> None:
    # Redis acknowledged seq 40 of 100: 40..100 stay, though the bound is 10
    plan = plan_prune(_entries(100), keep_checkpoints=10, replicated_seq=40)
    assert plan is not None
    assert (plan.seq_before, plan.pruned, plan.retained) == (40, 39, 61)
    # Redis acknowledged the first one only: nothing may go
    assert plan_prune(_entries(100), keep_checkpoints=10, replicated_seq=1) is None


def test_a_terminal_checkpoint_stays() -> None:
    entries = _entries(50)
    entries[4] = HistoryEntry(5, 0, terminal=True)
    plan = plan_prune(entries, keep_checkpoints=10, replicated_seq=50)
    assert plan is not None
    assert (plan.seq_before, plan.pruned) == (5, 4)


def test_within_the_bound_nothing_goes() -> None:
    assert plan_prune(_entries(10), keep_checkpoints=10, replicated_seq=10) is None
    assert plan_prune([], keep_checkpoints=1, replicated_seq=5) is None


_ENTRY_LISTS = st.lists(st.tuples(st.integers(0, 20), st.booleans()), min_size=0, max_size=60).map(
    # dense seqs; covers never decrease with seq (one lineage); rarely terminal
    lambda xs: [
        HistoryEntry(i + 1, c, t and i % 7 == 3)
        for i, (c, t) in enumerate(zip(sorted(x[0] for x in xs), [x[1] for x in xs], strict=True))
    ]
)


@settings(max_examples=400, deadline=None)
@given(
    entries=_ENTRY_LISTS,
    keep=st.integers(0, 30),
    replicated=st.integers(0, 70),
)
def test_a_plan_never_deletes_what_must_stay(
    entries: list[HistoryEntry], keep: int, replicated: int
) -> None:
    plan = plan_prune(entries, keep_checkpoints=keep, replicated_seq=replicated)
    if plan is None:
        return
    # what the store's prune deletes with this policy (store.py _prune_op)
    cutoff = (plan.covered_before, plan.seq_before)
    gone = [e for e in entries if (e.covers_journal_seq, e.seq) < cutoff]
    kept = [e for e in entries if (e.covers_journal_seq, e.seq) >= cutoff]
    assert len(gone) == plan.pruned > 0
    assert len(kept) == plan.retained
    ranked = sorted(entries, key=lambda e: (e.covers_journal_seq, e.seq))
    # the newest (what recovery resumes from) and the newest N stay
    assert set(ranked[-keep:]) <= set(kept)
    # never a terminal one, never one Redis may lack
    assert not any(e.terminal for e in gone)
    assert all(e.seq < replicated for e in gone)
    # compaction stops at the cutoff's covers: the journal after every kept
    # checkpoint, and after the newest one Redis holds, stays
    floor = min(e.covers_journal_seq for e in kept)
    assert floor == plan.covered_before
    assert plan.compact_journal
    in_redis = [e for e in entries if e.seq == replicated]
    assert all(floor <= e.covers_journal_seq for e in in_redis)
    # and it thins to the bound when Redis holds the newest
    if replicated >= max(e.seq for e in entries) and not any(e.terminal for e in entries):
        assert plan.retained == keep
