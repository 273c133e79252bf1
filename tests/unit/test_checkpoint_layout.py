"""The checkpoint store's on-disk layout: schema 3, its migrations from schemas 1
and 2, and the keyed / tail split of the checkpoint rows (see the store's docstring)."""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
from pathlib import Path

import pytest

from lazarus.storage.errors import CorruptedCheckpoint, CorruptedRecord, StaleEpoch, StoreIOError
from node_agent.checkpoint import (
    AdoptedCheckpoint,
    AdoptedEvent,
    Checkpoint,
    CheckpointStore,
    PrunePolicy,
)
from node_agent.checkpoint import store as store_mod
from node_agent.checkpoint.codec import ENCODING_RAW, ENCODING_ZSTD, record_checksum
from node_agent.checkpoint.store import DB_FILENAME, SCHEMA_VERSION

# The DDL of schema 1 (node_agent/checkpoint/store.py before schema 2), verbatim.
SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', '1');
CREATE TABLE IF NOT EXISTS tasks (
    task_id             TEXT PRIMARY KEY,
    epoch               INTEGER NOT NULL,
    last_journal_seq    INTEGER NOT NULL,
    last_checkpoint_seq INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS checkpoints (
    task_id            TEXT NOT NULL,
    seq                INTEGER NOT NULL,
    epoch              INTEGER NOT NULL,
    covers_journal_seq INTEGER NOT NULL,
    terminal           INTEGER NOT NULL,
    label              TEXT NOT NULL,
    created_at_ms      INTEGER NOT NULL,
    parent_ref         TEXT NOT NULL,
    encoding           INTEGER NOT NULL,
    payload            BLOB NOT NULL,
    checksum           INTEGER NOT NULL,
    UNIQUE (task_id, seq)
);
CREATE INDEX IF NOT EXISTS checkpoints_by_cover
    ON checkpoints (task_id, covers_journal_seq, seq);
CREATE TABLE IF NOT EXISTS task_meta (
    task_id TEXT PRIMARY KEY,
    meta    BLOB NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS journal (
    task_id       TEXT NOT NULL,
    seq           INTEGER NOT NULL,
    epoch         INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    payload       BLOB NOT NULL,
    checksum      INTEGER NOT NULL,
    PRIMARY KEY (task_id, seq)
);
"""

# (task, seq, epoch, covers, terminal, label, parent_ref, payload); covers are
# deliberately not monotone in seq for task "a" (seq 2 covers more than seq 3).
V1_CHECKPOINTS = [
    ("a", 1, 1, 0, False, "", "", b'{"n":1}'),
    ("b", 1, 2, 1, False, "first", "", b'{"b":1}'),
    ("a", 2, 1, 3, False, "", "", b'{"n":2}'),
    ("a", 3, 2, 2, True, "done", "", b'{"n":3}'),
    ("b", 2, 2, 2, False, "", "", b"x" * 5000),
    ("b.fork-1", 1, 2, 0, False, "fork-of:b@1", "b@1", b'{"b":1}'),
]
V1_EVENTS = [("a", s, 1 if s < 3 else 2, f"a{s}".encode()) for s in (1, 2, 3, 4)] + [
    ("b", s, 2, f"b{s}".encode()) for s in (1, 2)
]


def _write_v1(path: Path) -> None:
    """A schema 1 database as the schema 1 store wrote it, checksums included."""
    path.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path / DB_FILENAME, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(SCHEMA_V1)
    conn.execute("BEGIN")
    for i, (task, seq, epoch, covers, terminal, label, parent, payload) in enumerate(
        V1_CHECKPOINTS
    ):
        created = 1_700_000_000_000 + i
        encoding, stored = ENCODING_RAW, payload
        if len(payload) > 1000:  # one compressed record, as Compression.ZSTD stores it
            import zstandard

            encoding, stored = ENCODING_ZSTD, zstandard.ZstdCompressor().compress(payload)
        checksum = record_checksum(
            ("ckpt", task, seq, epoch, covers, terminal, label, created, parent, encoding), stored
        )
        conn.execute(
            "INSERT INTO checkpoints VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                task,
                seq,
                epoch,
                covers,
                int(terminal),
                label,
                created,
                parent,
                encoding,
                stored,
                checksum,
            ),
        )
    for task, seq, epoch, payload in V1_EVENTS:
        created = 1_700_000_001_000 + seq
        checksum = record_checksum(("jrnl", task, seq, epoch, created), payload)
        conn.execute(
            "INSERT INTO journal VALUES (?, ?, ?, ?, ?, ?)",
            (task, seq, epoch, created, payload, checksum),
        )
    conn.executemany(
        "INSERT INTO tasks VALUES (?, ?, ?, ?)",
        [("a", 2, 4, 3), ("b", 2, 2, 2), ("b.fork-1", 2, 0, 1)],
    )
    conn.execute("INSERT INTO task_meta VALUES ('a', x'0102')")
    conn.execute("INSERT INTO meta VALUES ('store_id', 'abc'), ('holder_incarnation', 'inc-1')")
    conn.execute("COMMIT")
    conn.close()


def _schema_version(path: Path) -> int:
    conn = sqlite3.connect(path / DB_FILENAME)
    try:
        return int(
            conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
        )
    finally:
        conn.close()


def _write_v2(path: Path, keyed_through: int) -> None:
    """A schema 2 database as the schema 2 store left it: ``_write_v1``'s records,
    the rows up to id ``keyed_through`` keyed in ``checkpoint_keys``, the rest in
    the tail with their heads deferred (the ``tasks`` rows behind them)."""
    _write_v1(path)
    conn = sqlite3.connect(path / DB_FILENAME, isolation_level=None)
    conn.execute("BEGIN")
    for stmt in store_mod._statements(store_mod._MIGRATE_V1):
        conn.execute(stmt)
    conn.execute("DELETE FROM checkpoint_keys WHERE id > ?", (keyed_through,))
    conn.execute("UPDATE meta SET value = ? WHERE key = 'keys_through'", (str(keyed_through),))
    conn.execute(  # what the tail carries is deferred
        "UPDATE tasks SET last_checkpoint_seq = (SELECT COALESCE(MAX(seq), 0) FROM checkpoints "
        "AS c WHERE c.task_id = tasks.task_id AND c.id <= ?)",
        (keyed_through,),
    )
    conn.execute("COMMIT")
    assert _schema_version(path) == 2
    conn.close()


def test_a_schema_1_database_is_migrated_in_place_and_reads_back_whole(tmp_path: Path) -> None:
    d = tmp_path / "node"
    _write_v1(d)
    _check_migrated(d)


@pytest.mark.parametrize("keyed_through", [0, 3, 6])
def test_a_schema_2_database_is_migrated_in_place_and_reads_back_whole(
    tmp_path: Path, keyed_through: int
) -> None:
    d = tmp_path / "node"
    _write_v2(d, keyed_through)
    _check_migrated(d)


def test_a_schema_2_task_of_many_keys_becomes_several_runs(tmp_path: Path) -> None:
    """Migrated keys are cut into runs of at most ``_RUN_KEYS_MAX`` keys per task;
    reads see every row through them, newest first by (covers, seq)."""
    d = tmp_path / "node"
    _write_v2(d, keyed_through=6)
    n = 2 * store_mod._RUN_KEYS_MAX + 5
    conn = sqlite3.connect(d / DB_FILENAME, isolation_level=None)
    conn.execute("BEGIN")
    rows = []
    for seq in range(1, n + 1):
        covers = seq // 2 if seq != 7 else n  # t@7 covers the most, keyed in the first run
        checksum = record_checksum(("ckpt", "big", seq, 1, covers, False, "", 5, "", 0), b"p")
        rows.append(("big", seq, 1, covers, 0, "", 5, "", 0, b"p", checksum))
    conn.executemany(
        f"INSERT INTO checkpoints ({store_mod._CKPT_COLUMNS}) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    conn.execute("INSERT INTO tasks VALUES ('big', 1, ?, ?)", (n, n))
    conn.execute(
        "INSERT INTO checkpoint_keys SELECT task_id, covers_journal_seq, seq, id FROM checkpoints "
        "WHERE task_id = 'big'"
    )
    conn.execute(
        "UPDATE meta SET value = (SELECT MAX(id) FROM checkpoints) WHERE key = 'keys_through'"
    )
    conn.execute("COMMIT")
    conn.close()
    with CheckpointStore(d) as s:
        conn = sqlite3.connect(d / DB_FILENAME)
        sizes = [
            r[0]
            for r in conn.execute(
                "SELECT json_array_length(keys) FROM checkpoint_runs WHERE task_id = 'big' "
                "ORDER BY run_id"
            )
        ]
        conn.close()
        assert sizes == [store_mod._RUN_KEYS_MAX, store_mod._RUN_KEYS_MAX, 5]
        latest = s.load_latest("big")
        assert latest is not None
        assert latest.ref == "big@7"
        at = s.load_at_or_before("big", n - 1)
        assert at is not None
        assert at.ref == f"big@{n}"
        at = s.load_at_or_before("big", 3)
        assert at is not None
        assert at.ref == "big@6"
        assert s.load(f"big@{n - 2}").info.covers_journal_seq == (n - 2) // 2
        assert len(s.list("big")) == n
        report = s.prune("big", PrunePolicy(prune_covered_before=n // 2))
        assert report.retained_count == n - (n // 2) * 2 + 2  # seqs from n - 1 on, and t@7
        assert [i.seq for i in s.list("big")][:2] == [n - 1, n]
        assert s.verify().ok
        assert s.save(Checkpoint("big", 1, b"next", n)).seq == n + 1


def _check_migrated(d: Path) -> None:
    """Reads and writes of ``_write_v1``'s records after the migration at open."""
    with CheckpointStore(d) as s:
        assert _schema_version(d) == SCHEMA_VERSION == 3
        report = s.verify()
        assert report.ok
        assert (report.checkpoints, report.events) == (6, 6)
        # newest by (covers, seq): a@2 covers 3, more than a@3
        latest = s.load_latest("a")
        assert latest is not None
        assert (latest.ref, latest.payload) == ("a@2", b'{"n":2}')
        at = s.load_at_or_before("a", 2)
        assert at is not None
        assert at.ref == "a@3"
        assert at.info.terminal
        assert at.info.label == "done"
        assert at.info.epoch == 2
        assert s.load("b@2").payload == b"x" * 5000  # the zstd record
        assert s.load("b.fork-1@1").info.parent_ref == "b@1"
        assert [i.ref for i in s.list("a")] == ["a@1", "a@3", "a@2"]
        rec = s.recover("a")
        assert rec.checkpoint is not None
        assert rec.checkpoint.ref == "a@2"
        assert [e.payload for e in rec.events] == [b"a4"]
        assert [e.seq for e in s.replay("b")] == [1, 2]
        heads = {h.task_id: h for h in s.task_heads()}
        assert (heads["a"].epoch, heads["a"].last_checkpoint_seq, heads["a"].last_journal_seq) == (
            2,
            3,
            4,
        )
        assert s.metas() == {"a": b"\x01\x02"}
        holder = s.take_holder("inc-2")
        assert (holder.store_id, holder.previous_incarnation) == ("abc", "inc-1")
        # writing goes on where schema 1 left off
        out = s.save(Checkpoint("a", 2, b'{"n":4}', 4))
        assert out.ref == "a@4"
        assert s.append("b", b"b3", epoch=2) == 3
        pruned = s.prune("a", PrunePolicy(prune_covered_before=3, preserve_latest_terminal=True))
        assert (pruned.pruned_count, pruned.retained_count, pruned.preserved_terminal_ref) == (
            1,
            3,
            "a@3",
        )
    with CheckpointStore(d) as s:  # and reopening does not migrate again
        assert _schema_version(d) == 3
        assert [i.ref for i in s.list("a")] == ["a@3", "a@2", "a@4"]
        assert s.verify().ok


def test_a_newer_schema_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    d = tmp_path / "node"
    CheckpointStore(d).close()
    conn = sqlite3.connect(d / DB_FILENAME)
    with conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.close()
    with pytest.raises(StoreIOError, match="schema version 99 was written by a newer Lazarus"):
        CheckpointStore(d)
    # the refusal released the data dir: it can be opened once fixed
    conn = sqlite3.connect(d / DB_FILENAME)
    with conn:
        conn.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    conn.close()
    CheckpointStore(d).close()


def test_a_sqlite_file_of_something_else_is_not_taken_over(tmp_path: Path) -> None:
    d = tmp_path / "node"
    d.mkdir()
    conn = sqlite3.connect(d / DB_FILENAME)
    with conn:
        conn.execute("CREATE TABLE other (x)")
    conn.close()
    with pytest.raises(CorruptedRecord, match="not a Lazarus checkpoint database"):
        CheckpointStore(d)


def _keyed_and_tail(d: Path) -> tuple[int, int]:
    conn = sqlite3.connect(d / DB_FILENAME)
    try:
        mark = int(conn.execute("SELECT value FROM meta WHERE key = 'keys_through'").fetchone()[0])
        keyed = conn.execute(
            "SELECT COALESCE(SUM(json_array_length(keys)), 0) FROM checkpoint_runs"
        ).fetchone()[0]
        (below,) = conn.execute(
            "SELECT COUNT(*) FROM checkpoints WHERE id <= ?", (mark,)
        ).fetchone()
        assert keyed == below  # every row at or below the mark has its key
        tail = conn.execute("SELECT COUNT(*) FROM checkpoints WHERE id > ?", (mark,)).fetchone()[0]
        return int(keyed), int(tail)
    finally:
        conn.close()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_reads_agree_with_a_model_across_keyed_rows_and_the_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """Random saves, appends, prunes, forgets and forks with the tail keyed every
    few rows; every read matches a plain model, before and after reopening."""
    monkeypatch.setattr(store_mod, "_FOLD_TAIL_ROWS", 7)
    rng = random.Random(seed)
    d = tmp_path / "node"
    model: dict[str, dict[int, tuple[int, bool, bytes]]] = {}  # task -> seq -> (covers, term, p)
    journal: dict[str, int] = {}
    last_seq: dict[str, int] = {}
    tasks = ["t0", "t1", "t2", "t3"]

    def check(s: CheckpointStore) -> None:
        for task in tasks:
            rows = model.get(task, {})
            order = sorted(rows, key=lambda q: (rows[q][0], q))
            assert [i.seq for i in s.list(task)] == order
            latest = s.load_latest(task)
            assert (latest.info.seq if latest else None) == (order[-1] if order else None)
            for js in range(0, journal.get(task, 0) + 1, 2):
                below = [q for q in order if rows[q][0] <= js]
                got = s.load_at_or_before(task, js)
                assert (got.info.seq if got else None) == (below[-1] if below else None)
            for q, (covers, terminal, payload) in rows.items():
                got = s.load(f"{task}@{q}")
                assert (got.info.covers_journal_seq, got.info.terminal, got.payload) == (
                    covers,
                    terminal,
                    payload,
                )
        heads = {h.task_id: h for h in s.task_heads()}
        for task, seq in last_seq.items():
            assert heads[task].last_checkpoint_seq == seq
            assert heads[task].epoch == 1
        assert s.verify().ok

    s = CheckpointStore(d, durability="group")
    try:
        for step in range(300):
            task = rng.choice(tasks)
            r = rng.random()
            if r < 0.25:
                journal[task] = s.append(task, b"e", epoch=1)
            elif r < 0.85:
                covers = rng.randint(0, journal.get(task, 0))
                payload = rng.randbytes(rng.choice([10, 3000]))
                terminal = rng.random() < 0.1
                out = s.save(Checkpoint(task, 1, payload, covers, terminal))
                last_seq[task] = last_seq.get(task, 0) + 1
                assert out.seq == last_seq[task]
                model.setdefault(task, {})[out.seq] = (covers, terminal, payload)
            elif r < 0.93:
                cutoff = rng.randint(0, journal.get(task, 0) + 1)
                rows = model.get(task, {})
                keep = None
                terminals = [(c, q) for q, (c, t, _) in rows.items() if t]
                if terminals:
                    keep = max(terminals)[1]
                s.prune(
                    task, PrunePolicy(prune_covered_before=cutoff, preserve_latest_terminal=True)
                )
                model[task] = {q: v for q, v in rows.items() if v[0] >= cutoff or q == keep}
            elif r < 0.96 and model.get(task):
                q = rng.choice(sorted(model[task]))
                new_id = s.fork(f"{task}@{q}", new_task_id=f"f{step}")
                assert new_id == f"f{step}"
                assert s.load(f"{new_id}@1").payload == model[task][q][2]
                s.forget(new_id)
            else:
                s.forget(task)
                model.pop(task, None)
                journal.pop(task, None)
                last_seq.pop(task, None)
            if step % 37 == 0:
                check(s)
        check(s)
        keyed, tail = _keyed_and_tail(d)
        assert keyed > 0
        assert tail < 7 + 1
    finally:
        s.close()
    with CheckpointStore(d) as s2:
        check(s2)


def test_adopt_replaces_keyed_and_tail_rows_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_mod, "_FOLD_TAIL_ROWS", 4)
    d = tmp_path / "node"
    with CheckpointStore(d) as s:
        for i in range(1, 4):
            s.append("t", f"e{i}".encode(), epoch=1)
        for i in range(1, 7):  # t@1..t@4 keyed, t@5..t@6 in the tail (or keyed later)
            s.save(Checkpoint("t", 1, f"local{i}".encode(), min(i, 3)))
        out = s.adopt(
            "t",
            epoch=2,
            checkpoint=AdoptedCheckpoint(3, 2, 3, b"remote3"),
            events=[AdoptedEvent(4, 2, b"r4")],
        )
        assert (out.last_checkpoint_seq, out.divergent_checkpoints) == (3, 4)
        assert [i.ref for i in s.list("t")] == ["t@1", "t@2", "t@3"]
        assert s.load("t@3").payload == b"remote3"
        lineage = out.lineage_task_id
        assert [i.seq for i in s.list(lineage)] == [3, 4, 5, 6]
        assert s.load(f"{lineage}@5").payload == b"local5"
        assert s.save(Checkpoint("t", 2, b"next", 4)).seq == 4
        assert s.verify().ok


def test_a_row_under_a_key_that_is_not_its_own_is_reported_corrupt(tmp_path: Path) -> None:
    d = tmp_path / "node"
    with CheckpointStore(d) as s:
        s.save(Checkpoint("t", 1, b"one"))
        s.save(Checkpoint("t", 1, b"two"))
        s.save(Checkpoint("u", 1, b"other"))
    conn = sqlite3.connect(d / DB_FILENAME)
    with conn:  # key every row, then point t@2's key at u's row
        conn.execute(store_mod._FOLD_RUNS, (0, 3))
        conn.execute("UPDATE meta SET value = '3' WHERE key = 'keys_through'")
        (u_id,) = conn.execute("SELECT id FROM checkpoints WHERE task_id = 'u'").fetchone()
        (keys,) = conn.execute("SELECT keys FROM checkpoint_runs WHERE task_id = 't'").fetchone()
        assert json.loads(keys) == [[0, 1, 1], [0, 2, 2]]
        conn.execute(
            "UPDATE checkpoint_runs SET keys = ? WHERE task_id = 't'",
            (json.dumps([[0, 1, 1], [0, 2, u_id]]),),
        )
    conn.close()
    with CheckpointStore(d) as s:
        latest = s.load_latest("t")
        assert latest is not None
        assert latest.ref == "t@1"
        assert s.corrupted_records == 1
        with pytest.raises(CorruptedCheckpoint):
            s.load("t@2")


async def test_forget_and_save_in_one_batch_leave_the_new_head(tmp_path: Path) -> None:
    d = tmp_path / "node"
    s = CheckpointStore(d, durability="group")
    await s.aio.save(Checkpoint("t", 1, b"a"))
    await s.aio.save(Checkpoint("t", 1, b"b"))
    commits = s.commits
    await asyncio.gather(s.aio.forget("t"), s.aio.save(Checkpoint("t", 1, b"c")))
    assert s.commits == commits + 1  # one batch
    assert [(h.task_id, h.last_checkpoint_seq) for h in s.task_heads()] == [("t", 1)]
    await s.aio.close()
    with CheckpointStore(d) as s2:
        assert [i.ref for i in s2.list("t")] == ["t@1"]
        assert s2.load("t@1").payload == b"c"
        assert s2.save(Checkpoint("t", 1, b"d")).seq == 2


def _table_head(d: Path, task_id: str) -> tuple[int, int, int]:
    conn = sqlite3.connect(d / DB_FILENAME)
    try:
        row = conn.execute(
            "SELECT epoch, last_journal_seq, last_checkpoint_seq FROM tasks WHERE task_id = ?",
            (task_id,),
        ).fetchone()
        return (int(row[0]), int(row[1]), int(row[2]))
    finally:
        conn.close()


def test_heads_deferred_by_saves_survive_a_reopen_and_still_fence(tmp_path: Path) -> None:
    d = tmp_path / "node"
    with CheckpointStore(d) as s:
        s.append("t", b"e", epoch=1)
        s.save(Checkpoint("t", 1, b"a", 1))  # the task's row exists from the append
        s.save(Checkpoint("t", 3, b"b", 1))  # a newer epoch, by a save alone
        s.save(Checkpoint("t", 3, b"c", 1))
        assert _table_head(d, "t") == (1, 1, 0)  # deferred: the rows carry it
        [head] = s.task_heads()
        assert (head.epoch, head.last_checkpoint_seq, head.last_journal_seq) == (3, 3, 1)
    with CheckpointStore(d) as s:  # the open writes the deferred heads
        assert _table_head(d, "t") == (3, 1, 3)
        with pytest.raises(StaleEpoch):
            s.save(Checkpoint("t", 2, b"old", 1))
        assert s.save(Checkpoint("t", 3, b"d", 1)).seq == 4


def test_prune_of_the_newest_rows_keeps_the_seq_numbering(tmp_path: Path) -> None:
    d = tmp_path / "node"
    with CheckpointStore(d) as s:
        for i in range(3):
            s.save(Checkpoint("t", 1, f"{i}".encode()))
        report = s.prune("t", PrunePolicy(prune_covered_before=1, preserve_latest_terminal=False))
        assert (report.pruned_count, report.retained_count) == (3, 0)
        assert [(h.task_id, h.last_checkpoint_seq) for h in s.task_heads()] == [("t", 3)]
        assert s.load_latest("t") is None
    with CheckpointStore(d) as s:
        assert s.save(Checkpoint("t", 1, b"next")).seq == 4


def test_a_fold_writes_the_deferred_heads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_mod, "_FOLD_TAIL_ROWS", 5)
    d = tmp_path / "node"
    with CheckpointStore(d) as s:
        s.save(Checkpoint("t", 1, b"0"))
        for i in range(1, 4):
            s.save(Checkpoint("t", 2, f"{i}".encode()))
        assert _table_head(d, "t") == (1, 0, 1)
        s.save(Checkpoint("t", 2, b"4"))  # the 5th row: the fold after this batch
        assert _table_head(d, "t") == (2, 0, 5)
        assert _keyed_and_tail(d) == (5, 0)


def test_a_malformed_run_is_reported_and_a_prune_over_it_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_mod, "_FOLD_TAIL_ROWS", 2)
    d = tmp_path / "node"
    with CheckpointStore(d) as s:
        s.save(Checkpoint("t", 1, b"one"))
        s.save(Checkpoint("t", 1, b"two"))  # folded: one run keys both
    conn = sqlite3.connect(d / DB_FILENAME)
    with conn:
        conn.execute("UPDATE checkpoint_runs SET keys = '[[0, 1' WHERE task_id = 't'")
    conn.close()
    with CheckpointStore(d) as s:
        with pytest.raises(CorruptedRecord):
            s.load_latest("t")
        with pytest.raises((CorruptedRecord, StoreIOError)):
            s.list("t")
        with pytest.raises(StoreIOError):
            s.prune("t", PrunePolicy(prune_covered_before=1))
        assert s.verify().checkpoints == 2  # the refused prune deleted nothing
