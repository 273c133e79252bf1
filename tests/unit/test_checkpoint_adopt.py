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
