"""adopt / forget / meta: taking another replica's lineage without losing ours."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from node_agent.checkpoint import (
    AdoptedCheckpoint,
    AdoptedEvent,
    Checkpoint,
    CheckpointStore,
    InvalidArgument,
    StaleEpoch,
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[CheckpointStore]:
    with CheckpointStore(tmp_path, durability="none") as s:
        yield s


def test_adopt_into_empty_store_keeps_the_remote_numbering(store: CheckpointStore) -> None:
    out = store.adopt(
        "t",
        epoch=3,
        checkpoint=AdoptedCheckpoint(seq=7, epoch=2, covers_journal_seq=40, payload=b'{"n":40}'),
        events=[AdoptedEvent(41, 2, b"a"), AdoptedEvent(42, 2, b"b")],
    )
    assert (out.last_checkpoint_seq, out.last_journal_seq, out.lineage_task_id) == (7, 42, "")
    checkpoint, events = store.recover("t")
    assert checkpoint is not None
    assert checkpoint.seq == 7
    assert checkpoint.payload == b'{"n":40}'
    assert [e.seq for e in events] == [41, 42]
    assert store.append("t", b"c", epoch=3) == 43
    assert store.save(Checkpoint("t", 3, b'{"n":43}', covers_journal_seq=43)).seq == 8
    assert store.verify().ok


def test_adopt_keeps_divergent_local_rows_as_a_lineage(store: CheckpointStore) -> None:
    # A zombie's local progress at epoch 1 beyond what it replicated (seq 1, covers 2).
    store.append("t", b"e1", epoch=1)
    store.append("t", b"e2", epoch=1)
    store.save(Checkpoint("t", 1, b"s2", covers_journal_seq=2))
    store.append("t", b"e3-zombie", epoch=1)
    store.save(Checkpoint("t", 1, b"s3-zombie", covers_journal_seq=3))
    out = store.adopt(
        "t",
        epoch=2,
        checkpoint=AdoptedCheckpoint(seq=1, epoch=1, covers_journal_seq=2, payload=b"s2"),
        events=[AdoptedEvent(3, 2, b"e3-new-owner")],
    )
    assert out.lineage_task_id == "t~lineage-e1"
    assert (out.divergent_checkpoints, out.divergent_events) == (1, 1)
    checkpoint, events = store.recover("t")
    assert checkpoint is not None
    assert checkpoint.payload == b"s2"
    assert [e.payload for e in events] == [b"e3-new-owner"]
    kept, _kept_events = store.recover("t~lineage-e1")
    assert kept is not None
    assert kept.payload == b"s3-zombie"
    assert kept.info.parent_ref == "t@2"
    assert [e.payload for e in store.replay("t~lineage-e1")] == [b"e3-zombie"]
    assert store.verify().ok


def test_adopt_refuses_an_older_epoch_and_bad_events(store: CheckpointStore) -> None:
    store.append("t", b"x", epoch=5)
    with pytest.raises(StaleEpoch):
        store.adopt("t", epoch=4, checkpoint=None)
    with pytest.raises(InvalidArgument, match=r"events\[1\]\.seq"):
        store.adopt(
            "t", epoch=5, checkpoint=None, events=[AdoptedEvent(1, 5, b""), AdoptedEvent(3, 5, b"")]
        )
    with pytest.raises(InvalidArgument, match=r"checkpoint\.epoch"):
        store.adopt("t", epoch=5, checkpoint=AdoptedCheckpoint(1, 6, 0, b""))


def test_forget_and_meta(store: CheckpointStore) -> None:
    store.append("t", b"x", epoch=1)
    store.put_meta("t", b'{"status":"running"}')
    store.put_meta("u", b"{}")
    assert store.metas() == {"t": b'{"status":"running"}', "u": b"{}"}
    store.forget("t")
    store.forget("t")
    assert store.metas() == {"u": b"{}"}
    assert [h.task_id for h in store.task_heads()] == []
    assert store.recover("t").checkpoint is None
    assert store.append("t", b"again", epoch=1) == 1  # a forgotten task starts afresh


async def test_async_faces(tmp_path: Path) -> None:
    with CheckpointStore(tmp_path / "a", durability="group") as s:
        await s.aio.put_meta("t", b"m")
        assert await s.aio.metas() == {"t": b"m"}
        out = await s.aio.adopt("t", epoch=1, checkpoint=AdoptedCheckpoint(2, 1, 0, b"p"))
        assert out.last_checkpoint_seq == 2
        await s.aio.forget("t")
        assert await s.aio.metas() == {}


# A returning old owner's rows below the adopted checkpoint's seq (DESIGN.md §7).
# ``bases`` is what the claims recorded in Redis: epoch -> (journal seq,
# checkpoint seq) where that epoch's lineage started. Before the fix adopt
# compared only the rows at or after the adopted seqs, so an old owner's row
# below them stayed in the task's history, mixed into the adopted lineage.


_Rows = list[tuple[int, int]]


def _rows(store: CheckpointStore, task_id: str) -> tuple[_Rows, _Rows]:
    """(checkpoints, journal events) of a task as (seq, epoch), seq order."""
    ckpts = sorted((i.seq, i.epoch) for i in store.list(task_id))
    return ckpts, [(e.seq, e.epoch) for e in store.replay(task_id)]


def test_adopt_moves_an_old_owners_row_below_the_adopted_seq_to_the_copy(
    store: CheckpointStore,
) -> None:
    # Epoch 1 here: seq 1 reached Redis, seq 2 never did.
    store.append("t", b"e1", epoch=1)
    store.save(Checkpoint("t", 1, b"s1", covers_journal_seq=1))
    store.append("t", b"e2-zombie", epoch=1)
    store.save(Checkpoint("t", 1, b"s2-zombie", covers_journal_seq=2))
    # Epoch 2 (another node) resumed from seq 1 and wrote its own seqs 2 and 3;
    # this node claims epoch 3 and adopts seq 3.
    out = store.adopt(
        "t",
        epoch=3,
        checkpoint=AdoptedCheckpoint(seq=3, epoch=2, covers_journal_seq=3, payload=b"s3"),
        bases={2: (1, 1), 3: (3, 3)},
    )
    assert _rows(store, "t") == ([(1, 1), (3, 2)], [(1, 1)]), "the zombie's seq 2 is mixed in"
    assert out.lineage_task_id == "t~lineage-e1"
    assert (out.divergent_checkpoints, out.divergent_events) == (1, 1)
    assert (out.last_checkpoint_seq, out.last_journal_seq) == (3, 3)
    assert _rows(store, "t~lineage-e1") == ([(2, 1)], [(2, 1)])
    kept = store.load_latest("t~lineage-e1")
    assert kept is not None
    assert (kept.payload, kept.info.parent_ref) == (b"s2-zombie", "t@2")
    assert [e.payload for e in store.replay("t~lineage-e1")] == [b"e2-zombie"]
    # The task goes on from the adopted lineage's numbering.
    assert store.append("t", b"e4", epoch=3) == 4
    assert store.save(Checkpoint("t", 3, b"s4", covers_journal_seq=4)).seq == 4
    assert store.recover("t").checkpoint.payload == b"s4"  # type: ignore[union-attr]
    assert store.verify().ok


def test_adopt_with_nothing_divergent_keeps_the_common_ancestry_and_makes_no_copy(
    store: CheckpointStore,
) -> None:
    # Seqs 1 and 2 both reached Redis; epoch 2 resumed from seq 2.
    store.append("t", b"e1", epoch=1)
    store.save(Checkpoint("t", 1, b"s1", covers_journal_seq=1))
    store.append("t", b"e2", epoch=1)
    store.save(Checkpoint("t", 1, b"s2", covers_journal_seq=2))
    out = store.adopt(
        "t",
        epoch=3,
        checkpoint=AdoptedCheckpoint(seq=3, epoch=2, covers_journal_seq=3, payload=b"s3"),
        bases={2: (2, 2), 3: (3, 3)},
    )
    assert (out.lineage_task_id, out.divergent_checkpoints, out.divergent_events) == ("", 0, 0)
    assert _rows(store, "t") == ([(1, 1), (2, 1), (3, 2)], [(1, 1), (2, 1)])
    assert [h.task_id for h in store.task_heads()] == ["t"]


def test_adopt_moves_divergent_journal_events_after_the_resume_point(
    store: CheckpointStore,
) -> None:
    # Epoch 1 here: checkpoint 1 (covers 1) and events 1, 2 reached Redis;
    # events 3 and 4 never did.
    for payload in (b"e1", b"e2", b"e3-zombie", b"e4-zombie"):
        store.append("t", payload, epoch=1)
        if payload == b"e1":
            store.save(Checkpoint("t", 1, b"s1", covers_journal_seq=1))
    # Epoch 2 resumed from journal seq 2, wrote events 3 and 4, checkpoint 2
    # covering them, then event 5: Redis holds checkpoint 2 and event 5.
    out = store.adopt(
        "t",
        epoch=3,
        checkpoint=AdoptedCheckpoint(seq=2, epoch=2, covers_journal_seq=4, payload=b"s2"),
        events=[AdoptedEvent(5, 2, b"e5")],
        bases={2: (2, 1), 3: (5, 2)},
    )
    assert _rows(store, "t") == ([(1, 1), (2, 2)], [(1, 1), (2, 1), (5, 2)])
    assert (out.lineage_task_id, out.divergent_checkpoints, out.divergent_events) == (
        "t~lineage-e1",
        0,
        2,
    )
    assert [e.payload for e in store.replay("t~lineage-e1")] == [b"e3-zombie", b"e4-zombie"]
    recovery = store.recover("t")
    assert recovery.checkpoint is not None
    assert recovery.checkpoint.payload == b"s2"
    assert [e.payload for e in recovery.events] == [b"e5"]


def test_adopt_keeps_rows_this_node_continued_at_a_later_epoch(store: CheckpointStore) -> None:
    # Epoch 1: seq 1 reached Redis, seq 2 not. This node held the task again at
    # epoch 2 (resumed from its own seq 2, so epoch 2's base is seq 1) and wrote
    # seq 3; epoch 3 (another node) resumed from seq 3 and wrote seq 4.
    store.save(Checkpoint("t", 1, b"s1"))
    store.save(Checkpoint("t", 1, b"s2"))
    store.save(Checkpoint("t", 2, b"s3"))
    out = store.adopt(
        "t",
        epoch=4,
        checkpoint=AdoptedCheckpoint(seq=4, epoch=3, covers_journal_seq=0, payload=b"s4"),
        bases={2: (0, 1), 3: (0, 3), 4: (0, 4)},
    )
    assert out.lineage_task_id == ""
    assert _rows(store, "t")[0] == [(1, 1), (2, 1), (3, 2), (4, 3)]


def test_adopt_moves_a_row_at_the_same_seq_but_another_epoch(store: CheckpointStore) -> None:
    # Epoch 2 resumed from nothing (Redis held no record of the task): every
    # local row of epoch 1 is divergent, whatever its seq.
    store.save(Checkpoint("t", 1, b"s1-zombie"))
    store.save(Checkpoint("t", 1, b"s2-zombie"))
    out = store.adopt(
        "t",
        epoch=3,
        checkpoint=AdoptedCheckpoint(seq=3, epoch=2, covers_journal_seq=0, payload=b"s3"),
        bases={2: (0, 0), 3: (0, 3)},
    )
    assert _rows(store, "t")[0] == [(3, 2)]
    assert _rows(store, "t~lineage-e1")[0] == [(1, 1), (2, 1)]
    assert out.divergent_checkpoints == 2


def test_adopt_without_bases_compares_only_the_replaced_rows(store: CheckpointStore) -> None:
    # No claim above the held epoch is known (an older server, a re-attach).
    store.save(Checkpoint("t", 1, b"s1"))
    store.save(Checkpoint("t", 1, b"s2"))
    for bases in (None, {}, {1: (0, 0)}):
        out = store.adopt(
            "t",
            epoch=1,
            checkpoint=AdoptedCheckpoint(seq=3, epoch=1, covers_journal_seq=0, payload=b"s3"),
            bases=bases,
        )
        assert out.lineage_task_id == ""
    assert _rows(store, "t")[0] == [(1, 1), (2, 1), (3, 1)]
    with pytest.raises(InvalidArgument, match="bases"):
        store.adopt("t", epoch=2, checkpoint=None, bases={2: (-1, 0)})
