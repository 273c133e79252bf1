"""Behaviour of the local checkpoint store: API, bad input, corruption, modes."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

import node_agent.checkpoint.model as model
import node_agent.checkpoint.store as store_mod
from node_agent.checkpoint import (
    DB_FILENAME,
    Checkpoint,
    CheckpointStore,
    CheckpointStoreError,
    CorruptedCheckpoint,
    CorruptedJournalEvent,
    Durability,
    FutureJournalSeq,
    InvalidArgument,
    JsonCodec,
    PrunePolicy,
    StaleEpoch,
    StoreClosed,
    StoreIOError,
    StoreLocked,
    TaskExists,
    UnknownCheckpoint,
    parse_ref,
)
from node_agent.checkpoint.model import validate_checkpoint


@pytest.fixture
def store(tmp_path: Path) -> Iterator[CheckpointStore]:
    s = CheckpointStore(tmp_path / "node", durability="sync")
    yield s
    s.close()


def _cp(task: str, epoch: int, state: object, covers: int = 0, **kw: object) -> Checkpoint:
    return Checkpoint(task, epoch, JsonCodec.encode(state), covers, **kw)  # type: ignore[arg-type]


def _corrupt(path: Path, sql: str, *args: object) -> None:
    """Flip stored bytes behind the store's back, as bit rot or a bug would."""
    conn = sqlite3.connect(path / DB_FILENAME)
    with conn:
        conn.execute(sql, args)
    conn.close()


def test_save_then_recover_returns_checkpoint_and_later_events(store: CheckpointStore) -> None:
    for i in range(1, 4):
        assert store.append("t", f"e{i}".encode(), epoch=1) == i
    out = store.save(_cp("t", 1, {"n": 2}, covers=2, label="every 2"))
    assert (out.ref, out.seq, out.covers_journal_seq, out.terminal) == ("t@1", 1, 2, False)
    store.append("t", b"e4", epoch=1)

    rec = store.recover("t")
    assert rec.checkpoint is not None
    assert JsonCodec.decode(rec.checkpoint.payload) == {"n": 2}
    assert rec.checkpoint.info.label == "every 2"
    assert [e.seq for e in rec.events] == [3, 4]
    assert [e.payload for e in rec.events] == [b"e3", b"e4"]
    checkpoint, events = store.recover("t")
    assert (checkpoint, events) == (rec.checkpoint, rec.events)


def test_recover_without_checkpoint_replays_whole_journal(store: CheckpointStore) -> None:
    store.append("t", b"a", epoch=0)
    rec = store.recover("t")
    assert rec.checkpoint is None
    assert [e.payload for e in rec.events] == [b"a"]
    assert store.recover("never-seen").events == []


def test_latest_orders_by_covered_seq_then_checkpoint_seq(store: CheckpointStore) -> None:
    for _ in range(5):
        store.append("t", b"x", epoch=1)
    store.save(_cp("t", 1, "a", covers=4))
    store.save(_cp("t", 1, "b", covers=2))  # newer seq, covers less
    store.save(_cp("t", 1, "c", covers=4))
    latest = store.load_latest("t")
    assert latest is not None
    assert (latest.ref, JsonCodec.decode(latest.payload)) == ("t@3", "c")
    at3 = store.load_at_or_before("t", 3)
    assert at3 is not None
    assert at3.ref == "t@2"
    assert store.load_at_or_before("t", 1) is None
    assert [i.ref for i in store.list("t")] == ["t@2", "t@1", "t@3"]


def test_stale_epoch_is_refused_and_store_stays_usable(store: CheckpointStore) -> None:
    store.save(_cp("t", 3, "new owner"))
    with pytest.raises(StaleEpoch) as err:
        store.save(_cp("t", 2, "zombie"))
    assert (err.value.epoch, err.value.current_epoch, err.value.grpc_code) == (
        2,
        3,
        "FAILED_PRECONDITION",
    )
    with pytest.raises(StaleEpoch):
        store.append("t", b"zombie event", epoch=2)
    assert store.save(_cp("t", 4, "next owner")).seq == 2
    latest = store.load_latest("t")
    assert latest is not None
    assert latest.epoch == 4
    assert [h.epoch for h in store.task_heads()] == [4]


def test_checkpoint_covering_future_journal_seq_is_refused(store: CheckpointStore) -> None:
    store.append("t", b"1", epoch=1)
    with pytest.raises(FutureJournalSeq) as err:
        store.save(_cp("t", 1, {}, covers=2))
    assert err.value.field == "covers_journal_seq"
    assert err.value.grpc_code == "OUT_OF_RANGE"
    assert "newest appended journal seq 1" in str(err.value)
    assert store.list("t") == []
    assert store.save(_cp("t", 1, {}, covers=1)).seq == 1


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda s: s.save(_cp("", 1, {})), "task_id"),
        (lambda s: s.save(_cp("a\x00b", 1, {})), "task_id"),
        (lambda s: s.save(_cp("x" * 300, 1, {})), "task_id"),
        (lambda s: s.save(_cp("t", -1, {})), "epoch"),
        (lambda s: s.save(_cp("t", 1, {}, covers=-5)), "covers_journal_seq"),
        (lambda s: s.save(Checkpoint("t", 1, "not bytes")), "payload"),  # type: ignore[arg-type]
        (lambda s: s.save(Checkpoint("t", True, b"")), "epoch"),
        (lambda s: s.save("not a checkpoint"), "checkpoint"),
        (lambda s: s.append("t", b"x", epoch=-1), "epoch"),
        (lambda s: s.append("", b"x", epoch=1), "task_id"),
        (lambda s: s.append("t", 42, epoch=1), "event"),
        (lambda s: s.load_at_or_before("t", -1), "journal_seq"),
        (lambda s: s.replay("t", after_seq=-2), "after_seq"),
        (lambda s: s.load("no-at-sign"), "ref"),
        (lambda s: s.load("t@0"), "ref"),
        (lambda s: s.load("t@-1"), "ref"),
        (lambda s: s.load("@3"), "ref"),
        (lambda s: s.prune("t", PrunePolicy(-1)), "prune_covered_before"),
        (lambda s: s.prune("t", "keep"), "policy"),
        (lambda s: s.fork("t@1", edits=["a"]), "edits"),
        (lambda s: s.fork("t@1", new_task_id=""), "new_task_id"),
        (lambda s: s.fork("t@1", {"f": object()}), "state"),
    ],
)
def test_bad_input_names_the_field(store: CheckpointStore, call: object, field: str) -> None:
    store.save(_cp("t", 1, {"k": 1}))
    with pytest.raises(InvalidArgument) as err:
        call(store)  # type: ignore[operator]
    assert err.value.field == field
    assert err.value.grpc_code == "INVALID_ARGUMENT"
    assert str(err.value).startswith(f"{field}:")
    # the store is still usable and nothing was written by the bad call
    assert [i.ref for i in store.list("t")] == ["t@1"]
    assert store.save(_cp("t", 1, {"k": 2})).seq == 2


def test_payload_over_limit_is_refused(tmp_path: Path) -> None:
    with CheckpointStore(tmp_path, max_payload_bytes=16) as s:
        with pytest.raises(InvalidArgument, match="over the 16-byte limit"):
            s.save(Checkpoint("t", 1, b"x" * 17))
        assert s.save(Checkpoint("t", 1, b"x" * 16)).seq == 1


def test_bad_store_settings_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="durability: must be one of sync, group, none"):
        CheckpointStore(tmp_path, durability="fast")
    with pytest.raises(InvalidArgument) as err:
        CheckpointStore(tmp_path, compression="lz4")
    assert err.value.field == "compression"
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreIOError, match="data_dir: cannot create"):
        CheckpointStore(blocker / "sub")
    CheckpointStore(tmp_path, durability=Durability.GROUP).close()  # the lock was never taken


def test_unknown_ref_is_not_found(store: CheckpointStore) -> None:
    with pytest.raises(UnknownCheckpoint) as err:
        store.load("t@7")
    assert err.value.grpc_code == "NOT_FOUND"
    with pytest.raises(UnknownCheckpoint):
        store.fork("t@7")


def test_corrupt_checkpoint_is_skipped_counted_and_never_returned(tmp_path: Path) -> None:
    d = tmp_path / "n"
    with CheckpointStore(d) as s:
        s.save(_cp("t", 1, {"v": 1}))
        s.save(_cp("t", 1, {"v": 2}))
    _corrupt(d, "UPDATE checkpoints SET payload = ? WHERE seq = 2", b'{"v":3}')
    with CheckpointStore(d) as s:
        latest = s.load_latest("t")
        assert latest is not None
        assert (latest.ref, JsonCodec.decode(latest.payload)) == ("t@1", {"v": 1})
        assert s.corrupted_records == 1
        with pytest.raises(CorruptedCheckpoint) as err:
            s.load("t@2")
        assert err.value.grpc_code == "DATA_LOSS"
        assert err.value.ref == "t@2"
        report = s.verify()
        assert report.corrupt_refs == ("t@2",)
        assert not report.ok
        rec = s.recover("t")
        assert rec.checkpoint is not None
        assert rec.checkpoint.ref == "t@1"
        # a corrupt source cannot be forked
        with pytest.raises(CorruptedCheckpoint):
            s.fork("t@2")


def test_corrupt_metadata_is_detected_too(tmp_path: Path) -> None:
    d = tmp_path / "n"
    with CheckpointStore(d) as s:
        s.append("t", b"a", epoch=1)
        s.save(_cp("t", 1, {"v": 1}, covers=1))
    _corrupt(d, "UPDATE checkpoints SET epoch = 9")
    with CheckpointStore(d) as s:
        assert s.load_latest("t") is None
        assert s.corrupted_records == 1


def test_corrupt_journal_event_raises_on_replay(tmp_path: Path) -> None:
    d = tmp_path / "n"
    with CheckpointStore(d) as s:
        for p in (b"a", b"b", b"c"):
            s.append("t", p, epoch=1)
    _corrupt(d, "UPDATE journal SET payload = ? WHERE seq = 2", b"B")
    with CheckpointStore(d) as s:
        assert [e.payload for e in s.replay("t", after_seq=2)] == [b"c"]
        with pytest.raises(CorruptedJournalEvent) as err:
            s.replay("t")
        assert (err.value.seq, err.value.grpc_code) == (2, "DATA_LOSS")
        assert s.verify().corrupt_events == (("t", 2),)


def test_undecodable_compressed_payload_is_corrupt(tmp_path: Path) -> None:
    d = tmp_path / "n"
    with CheckpointStore(d, compression="zstd") as s:
        s.save(Checkpoint("t", 1, b"a" * 4096))
    conn = sqlite3.connect(d / DB_FILENAME)
    with conn:
        (stored,) = conn.execute("SELECT payload FROM checkpoints").fetchone()
        assert len(stored) < 4096  # it really was compressed
    conn.close()
    with CheckpointStore(d) as s:
        got = s.load("t@1")
        assert got.payload == b"a" * 4096
        assert got.info.stored_bytes == len(stored)


def test_prune_keeps_latest_terminal_and_compacts_journal(store: CheckpointStore) -> None:
    for _ in range(10):
        store.append("t", b"e", epoch=1)
    store.save(_cp("t", 1, "s2", covers=2))
    store.save(_cp("t", 1, "done", covers=3, terminal=True))
    store.save(_cp("t", 1, "s6", covers=6))
    store.save(_cp("t", 1, "s8", covers=8))
    report = store.prune("t", PrunePolicy(prune_covered_before=7, compact_journal=True))
    assert (report.pruned_count, report.retained_count) == (2, 2)
    assert report.preserved_terminal_ref == "t@2"
    assert [i.ref for i in store.list("t")] == ["t@2", "t@4"]
    # events up to the smallest retained cover (3) are gone; later ones remain
    assert report.compacted_events == 3
    assert [e.seq for e in store.replay("t")] == list(range(4, 11))
    rec = store.recover("t")
    assert rec.checkpoint is not None
    assert rec.checkpoint.ref == "t@4"
    assert [e.seq for e in rec.events] == [9, 10]

    report = store.prune("t", PrunePolicy(prune_covered_before=100, preserve_latest_terminal=False))
    assert (report.pruned_count, report.retained_count, report.preserved_terminal_ref) == (
        2,
        0,
        None,
    )


def test_prune_seq_before_thins_checkpoints_that_cover_the_same_seq(
    store: CheckpointStore,
) -> None:
    # a task that never appends covers 0 every time: only the seq tells them apart
    for i in range(6):
        store.save(_cp("t", 1, f"s{i}"))
    assert store.prune("t", PrunePolicy(prune_covered_before=0)).pruned_count == 0
    report = store.prune("t", PrunePolicy(prune_covered_before=0, prune_seq_before=4))
    assert (report.pruned_count, report.retained_count) == (3, 3)
    assert [i.ref for i in store.list("t")] == ["t@4", "t@5", "t@6"]
    latest = store.load_latest("t")
    assert latest is not None
    assert latest.ref == "t@6"
    # the pair is the cutoff: a lower covers goes whatever its seq, a higher one stays
    store.append("t", b"e", epoch=1)
    store.save(_cp("t", 1, "s7", covers=1))
    report = store.prune("t", PrunePolicy(prune_covered_before=1, prune_seq_before=7))
    assert report.pruned_count == 3
    assert [i.ref for i in store.list("t")] == ["t@7"]
    with pytest.raises(InvalidArgument, match="prune_seq_before"):
        store.prune("t", PrunePolicy(prune_covered_before=0, prune_seq_before=-1))


def test_fork_applies_edits_and_records_lineage(store: CheckpointStore) -> None:
    store.append("t", b"e", epoch=5)
    store.save(_cp("t", 5, {"a": 1, "b": [1, 2]}, covers=1))
    new = store.fork("t@1", {"a": 99, "c": "x"}, new_task_id="t-fork")
    assert new == "t-fork"
    forked = store.load_latest(new)
    assert forked is not None
    assert JsonCodec.decode(forked.payload) == {"a": 99, "b": [1, 2], "c": "x"}
    assert (forked.info.parent_ref, forked.epoch, forked.covers_journal_seq) == ("t@1", 5, 0)
    assert forked.info.label == "fork-of:t@1"
    # the source is untouched; the forked task continues on its own journal
    src = store.load_latest("t")
    assert src is not None
    assert JsonCodec.decode(src.payload) == {"a": 1, "b": [1, 2]}
    assert store.append(new, b"own", epoch=5) == 1
    auto = store.fork("t@1")
    assert auto.startswith("t.fork-")
    with pytest.raises(TaskExists):
        store.fork("t@1", new_task_id="t-fork")


def test_fork_edits_need_a_json_object(store: CheckpointStore) -> None:
    store.save(Checkpoint("t", 1, b"\x00raw"))
    with pytest.raises(InvalidArgument):
        store.fork("t@1", {"a": 1})
    assert store.fork("t@1", new_task_id="copy") == "copy"
    copy = store.load_latest("copy")
    assert copy is not None
    assert copy.payload == b"\x00raw"


def test_data_dir_is_locked_to_one_store(tmp_path: Path) -> None:
    first = CheckpointStore(tmp_path)
    with pytest.raises(StoreLocked, match="one node agent per data directory"):
        CheckpointStore(tmp_path)
    first.close()
    CheckpointStore(tmp_path).close()


def test_the_store_names_its_previous_lock_holder(tmp_path: Path) -> None:
    """The restart-in-place proof (DESIGN.md §4): a stable store id and the previous holder."""
    with CheckpointStore(tmp_path) as first:
        one = first.take_holder("inc-1")
    assert one.previous_incarnation == ""
    assert len(one.store_id) == 32
    with CheckpointStore(tmp_path) as second:
        two = second.take_holder("inc-2")
    assert (two.store_id, two.previous_incarnation) == (one.store_id, "inc-1")
    with CheckpointStore(tmp_path / "elsewhere") as other:
        assert other.take_holder("inc-3").store_id != one.store_id


def test_a_sigkilled_holder_frees_the_lock_and_is_named_by_the_next(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from node_agent.checkpoint import CheckpointStore; "
            "s = CheckpointStore(sys.argv[1]); s.take_holder('killed'); "
            "print('held', flush=True); time.sleep(60)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == b"held"
        with pytest.raises(StoreLocked):
            CheckpointStore(tmp_path)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    with CheckpointStore(tmp_path) as store:
        assert store.take_holder("next").previous_incarnation == "killed"


def test_closed_store_raises_store_closed(tmp_path: Path) -> None:
    s = CheckpointStore(tmp_path)
    s.save(_cp("t", 1, {}))
    s.close()
    s.close()  # idempotent
    with pytest.raises(StoreClosed):
        s.save(_cp("t", 1, {}))
    with pytest.raises(StoreClosed):
        s.load_latest("t")


def test_reopen_continues_sequences(tmp_path: Path) -> None:
    with CheckpointStore(tmp_path) as s:
        s.append("t", b"a", epoch=2)
        s.save(_cp("t", 2, 1, covers=1))
    with CheckpointStore(tmp_path) as s:
        assert s.append("t", b"b", epoch=2) == 2
        assert s.save(_cp("t", 2, 2, covers=2)).seq == 2
        with pytest.raises(StaleEpoch):
            s.save(_cp("t", 1, 3))
        heads = s.task_heads()
        assert [(h.task_id, h.epoch, h.last_checkpoint_seq, h.last_journal_seq) for h in heads] == [
            ("t", 2, 2, 2)
        ]


@pytest.mark.parametrize("mode", list(Durability))
async def test_async_api_in_every_mode(tmp_path: Path, mode: Durability) -> None:
    writer_threads: set[str] = set()

    def clock_ms() -> int:
        writer_threads.add(threading.current_thread().name)
        return 1_700_000_000_000

    store = CheckpointStore(tmp_path, durability=mode, clock_ms=clock_ms)
    a = store.aio

    async def task(i: int) -> None:
        tid = f"task-{i}"
        for k in range(1, 11):
            seq = await a.append(tid, f"{k}".encode(), epoch=1)
            out = await a.save(_cp(tid, 1, {"k": k}, covers=seq))
            assert out.seq == k

    await asyncio.gather(*(task(i) for i in range(8)))
    for i in range(8):
        rec = await a.recover(f"task-{i}")
        assert rec.checkpoint is not None
        assert JsonCodec.decode(rec.checkpoint.payload) == {"k": 10}
        assert rec.events == []
        assert len(await a.list(f"task-{i}")) == 10
    with pytest.raises(StaleEpoch):
        await a.save(_cp("task-0", 0, {}))
    with pytest.raises(InvalidArgument):
        await a.load_latest("")
    # the concurrent writes were handed to the writer thread; a lone one may
    # have committed inline on the loop (see the inline tests below)
    assert writer_threads - {threading.current_thread().name}
    assert store.commits >= 1
    if mode is Durability.SYNC:
        assert store.commits == 160
    await a.close()


class _ThreadClock:
    """A clock that records which threads wrote (the store calls it per record)."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def __call__(self) -> int:
        self.threads.append(threading.current_thread().name)
        return 1_700_000_000_000


@pytest.mark.parametrize("mode", list(Durability))
async def test_a_lone_small_async_write_on_an_idle_loop_commits_inline(
    tmp_path: Path, mode: Durability, monkeypatch: pytest.MonkeyPatch
) -> None:

    monkeypatch.setattr(store_mod, "_INLINE_SLOW_S", 60.0)  # a busy CI disk: no back-off
    clock = _ThreadClock()
    store = CheckpointStore(tmp_path, durability=mode, clock_ms=clock)
    a = store.aio
    loop_thread = threading.current_thread().name
    assert await a.append("t", b"e1", epoch=1) == 1
    out = await a.save(Checkpoint("t", 1, b"x" * 1024, 1))
    assert (out.seq, out.covers_journal_seq) == (1, 1)
    assert clock.threads == [loop_thread, loop_thread]
    with pytest.raises(StaleEpoch):  # a refused inline write raises as any other
        await a.save(Checkpoint("t", 0, b"x"))
    with pytest.raises(FutureJournalSeq):
        await a.save(Checkpoint("t", 1, b"x", 2))
    assert store.commits == 2
    rec = await a.recover("t")
    assert rec.checkpoint is not None
    assert rec.checkpoint.payload == b"x" * 1024
    assert store.verify().ok
    await a.close()


async def test_a_large_async_write_goes_to_the_writer_thread(tmp_path: Path) -> None:
    clock = _ThreadClock()
    store = CheckpointStore(tmp_path, durability="group", clock_ms=clock)
    await store.aio.save(Checkpoint("t", 1, b"x" * (64 * 1024)))
    assert len(clock.threads) == 1
    assert clock.threads[0].startswith("ckpt-writer")
    await store.aio.close()


async def test_concurrent_async_writes_reach_the_writer_as_one_batch(tmp_path: Path) -> None:
    clock = _ThreadClock()
    store = CheckpointStore(tmp_path, durability="group", group_window_ms=0, clock_ms=clock)
    outs = await asyncio.gather(*(store.aio.save(Checkpoint(f"t{i}", 1, b"x")) for i in range(32)))
    assert [o.seq for o in outs] == [1] * 32
    # one list handed over in one loop iteration: one transaction, on the writer
    assert store.commits == 1
    assert all(name.startswith("ckpt-writer") for name in clock.threads)
    assert len(clock.threads) == 32
    await store.aio.close()


async def test_a_slow_inline_commit_turns_inline_commits_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    monkeypatch.setattr(store_mod, "_INLINE_SLOW_S", 0.0)  # every commit is "slow"
    monkeypatch.setattr(store_mod, "_INLINE_BACKOFF_FACTOR", 1e6)  # and keeps inline off
    clock = _ThreadClock()
    store = CheckpointStore(tmp_path, durability="sync", clock_ms=clock)
    for _ in range(3):
        await store.aio.save(Checkpoint("t", 1, b"x"))
    loop_thread = threading.current_thread().name
    assert clock.threads[0] == loop_thread
    assert all(name.startswith("ckpt-writer") for name in clock.threads[1:])
    await store.aio.close()


async def test_wal_checkpoints_run_off_the_event_loop(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, durability="none")
    real = store._wconn
    checkpoint_threads: list[str] = []

    class Spy:
        def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
            if sql.startswith("PRAGMA wal_checkpoint"):
                checkpoint_threads.append(threading.current_thread().name)
            return real.execute(sql, *args)

        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

    store._wconn = Spy()  # type: ignore[assignment]
    for i in range(600):  # about 4 WAL pages each
        await store.aio.save(Checkpoint("t", 1, b"x" * 1024))
        if i % 50 == 0:  # sync callers too
            store.save(Checkpoint("u", 1, b"y"))
    store._wconn = real
    assert checkpoint_threads
    assert threading.current_thread().name not in checkpoint_threads
    assert store.commits == 612
    assert store.verify().ok
    await store.aio.close()


async def test_writes_collected_on_a_loop_fail_cleanly_when_the_store_closes(
    tmp_path: Path,
) -> None:
    store = CheckpointStore(tmp_path, durability="group")
    futs = [store._asubmit(store._save_op(Checkpoint(f"t{i}", 1, b"x"))) for i in range(3)]
    store.close()  # before the loop hands them over
    for fut in futs:
        with pytest.raises(StoreClosed):
            await fut
    with pytest.raises(StoreClosed):
        await store.aio.save(Checkpoint("t", 1, b"x"))


async def test_group_commit_shares_fsyncs_among_concurrent_writers(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, durability="group", group_window_ms=5)
    a = store.aio

    async def writer(i: int) -> None:
        for _ in range(20):
            await a.save(Checkpoint(f"t{i}", 1, b"x" * 1024))

    await asyncio.gather(*(writer(i) for i in range(32)))
    # 640 saves; one transaction per save would be 640 commits
    assert store.commits < 640 // 4
    assert sum(len(store.list(f"t{i}")) for i in range(32)) == 640
    await a.close()


async def test_one_refused_write_does_not_fail_its_batch(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, durability="group", group_window_ms=20)
    a = store.aio
    await a.save(_cp("fenced", 5, {}))
    results = await asyncio.gather(
        *(a.save(_cp(f"ok{i}", 1, {})) for i in range(10)),
        a.save(_cp("fenced", 4, {})),
        return_exceptions=True,
    )
    assert [type(r).__name__ for r in results] == ["SaveOutcome"] * 10 + ["StaleEpoch"]
    assert all(len(store.list(f"ok{i}")) == 1 for i in range(10))
    assert len(store.list("fenced")) == 1
    await a.close()


def test_errors_are_one_family() -> None:
    for cls in (InvalidArgument, StaleEpoch, UnknownCheckpoint, CorruptedCheckpoint, StoreClosed):
        assert issubclass(cls, CheckpointStoreError)
    assert parse_ref("a@b@12") == ("a@b", 12)


def test_checkpoint_is_a_frozen_value_with_its_defaults() -> None:
    cp = Checkpoint("t", 2, b"p")
    assert (cp.task_id, cp.epoch, cp.payload) == ("t", 2, b"p")
    assert (cp.covers_journal_seq, cp.terminal, cp.label) == (0, False, "")
    full = Checkpoint(
        task_id="t", epoch=2, payload=b"p", covers_journal_seq=3, terminal=True, label="l"
    )
    assert (full.covers_journal_seq, full.terminal, full.label) == (3, True, "l")
    assert cp == Checkpoint("t", 2, b"p")
    assert hash(cp) == hash(Checkpoint("t", 2, b"p"))
    assert cp != full
    assert dataclasses.replace(cp, epoch=5) == Checkpoint("t", 5, b"p")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cp.epoch = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        Checkpoint("t", 1)  # type: ignore[call-arg]


class _Str(str):
    pass


@pytest.mark.parametrize(
    ("checkpoint", "field"),
    [
        (Checkpoint("t", 1, b"x", terminal=1), "terminal"),  # type: ignore[arg-type]
        (Checkpoint("t", 1, b"x", label="l" * 1025), "label"),
        (Checkpoint("t", 1, b"x", label=None), "label"),  # type: ignore[arg-type]
        (Checkpoint("t", 2**63, b"x"), "epoch"),
        (Checkpoint("t", 1.0, b"x"), "epoch"),  # type: ignore[arg-type]
        (Checkpoint("t", 1, b"x", covers_journal_seq=2**63), "covers_journal_seq"),
        (Checkpoint(_Str("a\x01"), 1, b"x"), "task_id"),
        (Checkpoint("t", 1, b"x" * 17), "payload"),
    ],
)
def test_bad_checkpoints_of_known_tasks_are_refused(checkpoint: Checkpoint, field: str) -> None:
    # "t" was validated before: its id is remembered, its other fields are not
    assert validate_checkpoint(Checkpoint("t", 1, b"x"), 16).task_id == "t"
    with pytest.raises(InvalidArgument) as err:
        validate_checkpoint(checkpoint, 16)
    assert err.value.field == field


def test_checkpoints_of_other_field_types_are_checked_and_normalised() -> None:
    cp = validate_checkpoint(Checkpoint(_Str("t"), 1, bytearray(b"x")), 16)  # type: ignore[arg-type]
    assert cp.payload == b"x"
    assert type(cp.payload) is bytes
    # a task id is remembered as valid for a while, not forever: the set is bounded
    for i in range(2 * model._VALID_TASK_IDS_MAX):
        validate_checkpoint(Checkpoint(f"task-{i}", 1, b""), 16)
    assert 0 < len(model._VALID_TASK_IDS) <= model._VALID_TASK_IDS_MAX
    with pytest.raises(InvalidArgument):
        validate_checkpoint(Checkpoint("bad\x7f", 1, b""), 16)
    assert "bad\x7f" not in model._VALID_TASK_IDS


def test_a_batch_resolves_each_caller_of_each_loop_and_thread() -> None:
    loops = [asyncio.new_event_loop() for _ in range(2)]
    try:
        thread_fut: Future[Any] = Future()
        futs = [loops[i % 2].create_future() for i in range(4)]
        ops = [store_mod._Op(_noop, None, f.get_loop(), f) for f in futs]
        batch = [ops[0], store_mod._Op(_noop, thread_fut, None, None), *ops[1:]]
        err = StaleEpoch("t", 1, 2)
        outcomes: list[tuple[Any, BaseException | None]] = [
            ("a", None),
            ("thread", None),
            (None, err),
            ("c", None),
            ("d", None),
        ]
        store_mod._deliver(batch, outcomes)
        assert thread_fut.result() == "thread"
        for loop in loops:  # each loop resolves its own futures when it runs
            loop.run_until_complete(asyncio.sleep(0))
        assert [futs[0].result(), futs[2].result(), futs[3].result()] == ["a", "c", "d"]
        assert futs[1].exception() is err
        # a list of one loop's ops goes over as it is; a cancelled caller is skipped
        futs = [loops[0].create_future(), loops[0].create_future()]
        futs[0].cancel()
        store_mod._deliver(
            [store_mod._Op(_noop, None, loops[0], f) for f in futs], [("x", None), ("y", None)]
        )
        loops[0].run_until_complete(asyncio.sleep(0))
        assert futs[0].cancelled()
        assert futs[1].result() == "y"
    finally:
        for loop in loops:
            loop.close()


def _noop(conn: object, heads: object) -> None:
    return None
