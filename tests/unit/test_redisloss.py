"""The pure rules of node_agent/core/redisloss.py: when a resume would silently lose progress."""

from __future__ import annotations

import pytest

from node_agent.core.redisloss import DataLoss, generation_reset, judge_resume


@pytest.mark.parametrize(
    ("acked_ckpt", "acked_journal", "restored_ckpt", "restored_journal", "lost"),
    [
        (0, 0, 0, 0, False),  # a new task: nothing acknowledged, nothing to find
        (3, 40, 3, 40, False),  # exactly what was acknowledged
        (3, 40, 5, 62, False),  # newer than acknowledged (the local store ran ahead)
        (3, 0, 3, 0, False),  # no journal bound given: only the checkpoint is compared
        (3, 40, 4, 40, False),  # a newer checkpoint covering the journal
        (3, 40, 0, 0, True),  # Redis restarted empty, no local copy: from scratch
        (3, 40, 2, 40, True),  # an older checkpoint (a lagging replica)
        (0, 12, 0, 7, True),  # journal-only task: acknowledged events are gone
        (3, 40, 3, 39, True),  # the last acknowledged event is gone
    ],
)
def test_judge_resume(
    acked_ckpt: int, acked_journal: int, restored_ckpt: int, restored_journal: int, lost: bool
) -> None:
    verdict = judge_resume(
        acknowledged_checkpoint_seq=acked_ckpt,
        acknowledged_journal_seq=acked_journal,
        restored_checkpoint_seq=restored_ckpt,
        restored_journal_seq=restored_journal,
    )
    assert (verdict is not None) is lost
    if verdict is not None:
        assert verdict.acknowledged_checkpoint_seq == acked_ckpt
        assert verdict.restored_checkpoint_seq == restored_ckpt


def test_the_message_says_what_is_missing_and_what_to_do() -> None:
    text = DataLoss(3, 0, 40, 0).describe()
    assert "checkpoint seq 3 was acknowledged" in text
    assert "journal seq 40" in text
    assert "ForkTask" in text
    only_ckpt = DataLoss(3, 1, 0, 9).describe()
    assert "journal" not in only_ckpt.split("(")[0]


@pytest.mark.parametrize(
    ("previous", "current", "reset"),
    [
        (None, "a", False),  # the first read is no evidence
        ("a", None, False),  # Redis unreachable now: no evidence either
        ("a", "a", False),
        ("a", "b", True),  # the marker this agent saw is gone: a new dataset
    ],
)
def test_generation_reset(previous: str | None, current: str | None, reset: bool) -> None:
    assert generation_reset(previous, current) is reset
