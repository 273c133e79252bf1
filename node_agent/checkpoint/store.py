"""The node agent's durable local checkpoint store (SQLite, WAL).

Theory of operation
-------------------
One SQLite database per node-agent data directory, in WAL mode, guarded by an
``flock`` so two agents never share it. Every write — ``save``, ``append``,
``prune``, ``fork`` — is a small function queued to a single *writer thread*
that owns the only write connection; reads run on per-thread read connections,
which WAL lets proceed beside the writer. A *sync* caller that finds the writer
idle commits its own write inline under the same write lock, saving two thread
wake-ups; a busy writer makes it queue like everyone else.

The writer takes operations off its queue in batches and runs each batch as one
transaction; each operation makes its checks before its first write, so one
refused write (a stale epoch, say) writes nothing and the rest of the batch
commits (saves buffer their rows and insert them together, ``_Heads.flush``).
The durability mode decides the batch:

* ``SYNC``: one operation per transaction, ``synchronous=FULL`` — the caller's
  write is fsynced before its call returns.
* ``GROUP``: the writer gathers concurrent operations for at most
  ``group_window_ms`` (it stops waiting once it holds as many as recent batches
  held, so a lone writer never waits), commits them together with one fsync,
  and only then resolves every caller's future. Classic group commit.
* ``NONE``: batches of whatever is queued, ``synchronous=OFF``.

Invariants (checked inside the writer, so they hold under any concurrency):

* a task's records carry its epoch; a write whose epoch is older than the
  newest stored for that task raises ``StaleEpoch`` (DESIGN.md §4 fencing);
* a checkpoint never covers a journal seq past the newest appended one;
* checkpoint and journal seqs are dense per task: 1, 2, 3, ...;
* every record carries a CRC-32C; a record that fails it is never returned as
  valid — ``load_latest`` / ``load_at_or_before`` skip to the newest valid
  checkpoint and count the corrupt one, ``load`` and ``replay`` raise.

The async API (``store.aio``): reads run in a small thread pool; writes are
collected per event-loop iteration and handed to the writer as one list (one
queue put, one writer wake-up, one loop wake-up per batch), then awaited. One
exception, the *inline commit* (``CheckpointStore._commit_inline``): a lone
save or append of at most 16 KiB, submitted while the writer is idle and no
other callback is ready on the loop, commits on the loop itself, as a sync
caller does. The loop is then blocked for that one commit, fsync included
(about 0.2 ms for 1 KiB here), instead of paying two thread wake-ups (0.06 to
0.09 ms here); after a commit slower than 2 ms the inline path stays off for
50 times as long as it took. Everything else never blocks the loop.

On-disk layout (schema 3)
-------------------------
A commit's cost is mostly the WAL pages it writes, and a group commit of 32
saves for 32 tasks wrote ~75 under schema 1, whose two checkpoint indexes led
with ``task_id``: each task's new entry landed on that task's own leaf of each
index, 64 leaves for ~9 pages of payload. Since schema 2 the checkpoint rows are
kept in append order and keyed later, in bulk:

* ``checkpoints``: one row per checkpoint under an ``id`` that only grows (the
  writer numbers them, so an id is never reused after a delete), so a batch's
  rows fill the table's last pages, one after another;
* ``checkpoint_runs``: the keys of every row with an id up to
  ``meta.keys_through``, the *keyed* rows, in *runs*: a run holds some of one
  task's keys, ``[covers_journal_seq, seq, id]`` each, as one JSON array, with
  their least and greatest covers and seqs beside it; an index,
  ``checkpoint_runs_by_task (task_id, max_covers, max_seq, min_covers,
  min_seq)``, lists a task's runs by those bounds. The rows above the mark are
  the *tail*, at most ~``_FOLD_TAIL_ROWS`` of them;
* ``tasks``: each task's head (epoch, last journal and checkpoint seqs), one
  small row per task. A save of a task that has its row does not rewrite it:
  the saved checkpoint row carries the same epoch and seq, so the head is
  *deferred* (``_Heads``) until the next fold writes it; ops that delete or
  replace rows (prune, adopt, forget) and appends write it with their batch.
  Readers of heads (``task_heads``) take the max of the row and the task's
  tail rows, and the open writes the deferred heads from the tail, so a crash
  loses none (the epoch fence included).

So a save writes its row alone: a group commit of 32 saves of 1 KiB writes ~7
WAL frames of 8 KiB (new databases use 8 KiB pages; a migrated one keeps its 4
KiB), ~56 KiB against schema 1's ~300 KiB. Once the tail holds
``_FOLD_TAIL_ROWS`` rows the writer *folds* it (``_fold_keys``): one
``INSERT ... SELECT ... GROUP BY task_id`` (``_FOLD_RUNS``) writes one run per
task present in the tail, at the end of the runs table, the deferred heads are
written and the mark moves. Schema 2 wrote one key per row, into each task's
own leaf of a ``(task_id, covers_journal_seq, seq)`` key; a run per task and
fold costs about a third as much (the statement alone: ~0.7 against ~2.1 ms per
1024 rows of 32 tasks here). The fold commits without an fsync of its own: it
holds only keys derived from rows already durable, the next commit's fsync
covers it, and a crash before that drops it whole, leaving those rows in the
tail. A read takes the task's keyed rows through its runs and its tail rows by
a scan of the ids above the mark (in one snapshot, so a fold never hides or
doubles a row), and checks that a row is the one its key names. A load of the
newest checkpoints (``_newest_first``) takes the runs from that index, newest
bound first, and opens one only once its ``(max_covers, max_seq)`` may come
first; a load by seq opens only the runs whose seqs bound it. Ops that delete
rows rewrite the runs keying them (``_delete_checkpoints``); ``forget`` deletes
the task's runs. Dense seqs and the refusal of stale epochs come from the task
heads, checked inside the writer as before (the writer's cache of the heads is
always current); ``(task_id, seq)`` stays unique because only the writer
assigns seqs (adopt refuses to write over a row it cannot verify, as schema 1's
UNIQUE constraint did).

Older databases are migrated at open, in one transaction. Schema 1's rows are
copied in their rowid order into the new ``checkpoints`` table and all keyed
(as schema 2); schema 2's per-row keys (``checkpoint_keys``) become runs of at
most ``_RUN_KEYS_MAX`` keys per task, in id order, and the tail stays as it
was. A database of a newer schema than this code knows is refused
(``StoreIOError``).

WAL checkpoints: SQLite's autocheckpoint would run inside whichever commit
crosses 1000 WAL pages, an inline one included, so the store runs them itself
(``PRAGMA wal_checkpoint(PASSIVE)``, about every 1000 pages, on the writer
thread or a sync caller's) and keeps SQLite's as a backstop at 4000.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import fcntl
import heapq
import itertools
import json
import logging
import os
import queue
import re
import sqlite3
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import google_crc32c
from prometheus_client import Counter

from lazarus.storage.errors import (
    CheckpointStoreError,
    CorruptedCheckpoint,
    CorruptedJournalEvent,
    CorruptedRecord,
    FutureJournalSeq,
    InvalidArgument,
    StaleEpoch,
    StoreClosed,
    StoreIOError,
    StoreLocked,
    TaskExists,
    UnknownCheckpoint,
)
from node_agent.checkpoint.codec import (
    ENCODING_RAW,
    JsonCodec,
    decode_payload,
    encode_payload,
)
from node_agent.checkpoint.model import (
    _REF_SEPARATOR,
    DEFAULT_MAX_PAYLOAD_BYTES,
    AdoptedCheckpoint,
    AdoptedEvent,
    AdoptOutcome,
    Checkpoint,
    CheckpointInfo,
    Compression,
    Durability,
    JournalEvent,
    PrunePolicy,
    PruneReport,
    Recovery,
    SaveOutcome,
    StoredCheckpoint,
    TaskHead,
    make_ref,
    parse_ref,
    validate_checkpoint,
    validate_payload,
    validate_seq,
    validate_task_id,
)
from node_agent.core.lineage import adopted_cut

log = logging.getLogger("lazarus.checkpoint")

_crc_value = google_crc32c.value
_crc_extend = google_crc32c.extend

T = TypeVar("T")

DB_FILENAME = "checkpoints.sqlite3"
LOCK_FILENAME = "checkpoints.lock"
SCHEMA_VERSION = 3

CORRUPT_RECORDS = Counter(
    "lazarus_checkpoint_corrupt_records_total",
    "Stored records that failed their checksum or could not be decoded.",
    ["kind"],
)

# Schema 3 (see "On-disk layout" in the module docstring). ``_SCHEMA`` creates a
# fresh database; ``_MIGRATE_V1`` turns a schema 1 database into schema 2, and
# ``_MIGRATE_V2`` a schema 2 one into schema 3.
_TABLES = """
CREATE TABLE tasks (
    task_id             TEXT PRIMARY KEY,
    epoch               INTEGER NOT NULL,
    last_journal_seq    INTEGER NOT NULL,
    last_checkpoint_seq INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE task_meta (
    task_id TEXT PRIMARY KEY,
    meta    BLOB NOT NULL
) WITHOUT ROWID;
CREATE TABLE journal (
    task_id       TEXT NOT NULL,
    seq           INTEGER NOT NULL,
    epoch         INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    payload       BLOB NOT NULL,
    checksum      INTEGER NOT NULL,
    PRIMARY KEY (task_id, seq)
);
"""
_CHECKPOINTS_TABLE = """
CREATE TABLE checkpoints (
    id                 INTEGER PRIMARY KEY,
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
    checksum           INTEGER NOT NULL
);
"""
# A run keys some of one task's rows: ``keys`` is a JSON array of
# ``[covers_journal_seq, seq, id]``, one per row, and the other columns bound it.
# Run ids are SQLite's rowids: each new run takes the next, at the table's end.
_RUNS_TABLE = """
CREATE TABLE checkpoint_runs (
    run_id     INTEGER PRIMARY KEY,
    task_id    TEXT NOT NULL,
    min_covers INTEGER NOT NULL,
    max_covers INTEGER NOT NULL,
    min_seq    INTEGER NOT NULL,
    max_seq    INTEGER NOT NULL,
    keys       TEXT NOT NULL
);
CREATE INDEX checkpoint_runs_by_task
    ON checkpoint_runs (task_id, max_covers, max_seq, min_covers, min_seq);
"""
_SCHEMA = f"""
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
INSERT INTO meta (key, value) VALUES ('schema_version', '{SCHEMA_VERSION}'), ('keys_through', '0');
{_TABLES}
{_CHECKPOINTS_TABLE}
{_RUNS_TABLE}
"""
# Schema 1 kept every checkpoint in a rowid table with two indexes leading with
# task_id (UNIQUE (task_id, seq) and checkpoints_by_cover); the other tables are
# unchanged. The rows are copied in their rowid order, so ids keep it, and all
# keyed in schema 2's ``checkpoint_keys``, one row per checkpoint row.
_MIGRATE_V1 = f"""
ALTER TABLE checkpoints RENAME TO checkpoints_v1;
{_CHECKPOINTS_TABLE}
CREATE TABLE checkpoint_keys (
    task_id            TEXT NOT NULL,
    covers_journal_seq INTEGER NOT NULL,
    seq                INTEGER NOT NULL,
    id                 INTEGER NOT NULL,
    PRIMARY KEY (task_id, covers_journal_seq, seq)
) WITHOUT ROWID;
INSERT INTO checkpoints (task_id, seq, epoch, covers_journal_seq, terminal, label,
                         created_at_ms, parent_ref, encoding, payload, checksum)
    SELECT task_id, seq, epoch, covers_journal_seq, terminal, label,
           created_at_ms, parent_ref, encoding, payload, checksum
    FROM checkpoints_v1 ORDER BY rowid;
DROP TABLE checkpoints_v1;
INSERT INTO checkpoint_keys (task_id, covers_journal_seq, seq, id)
    SELECT task_id, covers_journal_seq, seq, id FROM checkpoints;
INSERT OR REPLACE INTO meta (key, value)
    VALUES ('keys_through', (SELECT COALESCE(MAX(id), 0) FROM checkpoints)),
           ('schema_version', '2')
"""
# Schema 2 keyed each row on its own in ``checkpoint_keys``; its keys become
# runs of at most _RUN_KEYS_MAX keys per task, in id order. The tail and the
# mark are unchanged.
_RUN_KEYS_MAX = 1024
_MIGRATE_V2 = f"""
{_RUNS_TABLE}
INSERT INTO checkpoint_runs (task_id, min_covers, max_covers, min_seq, max_seq, keys)
    SELECT task_id, MIN(covers_journal_seq), MAX(covers_journal_seq), MIN(seq),
           MAX(seq), json_group_array(json_array(covers_journal_seq, seq, id))
    FROM (SELECT task_id, covers_journal_seq, seq, id,
                 (ROW_NUMBER() OVER (PARTITION BY task_id ORDER BY id) - 1) / {_RUN_KEYS_MAX}
                     AS chunk
          FROM checkpoint_keys ORDER BY task_id, id)
    GROUP BY task_id, chunk;
DROP TABLE checkpoint_keys;
UPDATE meta SET value = '3' WHERE key = 'schema_version'
"""

_CKPT_COLUMNS = (
    "task_id, seq, epoch, covers_journal_seq, terminal, label, created_at_ms, "
    "parent_ref, encoding, payload, checksum"
)
# The checkpoint rows not yet keyed in ``checkpoint_runs`` (the tail): ids above
# the ``keys_through`` mark, read in the statement's own snapshot.
_TAIL = "id > (SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'keys_through')"


# Heads deferred by saves (see ``_Heads``), written into ``tasks`` from the tail
# at open: a task's epoch and last checkpoint seq are at least those of its rows.
_MATERIALIZE_HEADS = f"""
UPDATE tasks SET
    epoch = MAX(epoch, (SELECT MAX(c.epoch) FROM checkpoints AS c
                        WHERE c.{_TAIL} AND c.task_id = tasks.task_id)),
    last_checkpoint_seq = MAX(last_checkpoint_seq, (SELECT MAX(c.seq) FROM checkpoints AS c
                                                    WHERE c.{_TAIL} AND c.task_id = tasks.task_id))
WHERE task_id IN (SELECT task_id FROM checkpoints WHERE {_TAIL})
"""
# ... and merged with the tail by readers of the heads.
_TASK_HEADS = f"""
SELECT t.task_id, MAX(t.epoch, COALESCE(x.epoch, 0)),
       MAX(t.last_checkpoint_seq, COALESCE(x.seq, 0)), t.last_journal_seq
FROM tasks AS t LEFT JOIN (
    SELECT task_id, MAX(epoch) AS epoch, MAX(seq) AS seq FROM checkpoints
    WHERE {_TAIL} GROUP BY task_id
) AS x ON x.task_id = t.task_id
ORDER BY t.task_id
"""


# One task's head, as ``_TASK_HEADS``.
_TASK_HEAD = f"""
SELECT t.task_id, MAX(t.epoch, COALESCE(x.epoch, 0)),
       MAX(t.last_checkpoint_seq, COALESCE(x.seq, 0)), t.last_journal_seq
FROM tasks AS t LEFT JOIN (
    SELECT task_id, MAX(epoch) AS epoch, MAX(seq) AS seq FROM checkpoints
    WHERE {_TAIL} AND task_id = ?1 GROUP BY task_id
) AS x ON x.task_id = t.task_id
WHERE t.task_id = ?1
"""
# The keys of a task's runs, as rows ``(covers_journal_seq, seq, id)`` (see "On-disk layout").
_RUN_KEYS = (
    "SELECT json_extract(k.value, '$[0]') AS covers_journal_seq, "
    "json_extract(k.value, '$[1]') AS seq, json_extract(k.value, '$[2]') AS id "
    "FROM checkpoint_runs AS r, json_each(r.keys) AS k WHERE r.task_id = ?1"
)


LINEAGE_COPY_MARK = "~lineage-e"
"""What names a lineage copy: ``<task_id>~lineage-e<epoch>[-<n>]`` (``CheckpointStore.adopt``)."""

_LINEAGE_COPY = re.compile(r"(?P<task>.+)~lineage-e[0-9]+(?:-[0-9]+)?", re.DOTALL)


def lineage_copy_of(task_id: str) -> str:
    """The task a lineage copy was split from, or "" when ``task_id`` is no copy's name.

    A task the application named like a copy is told apart by its meta (a copy
    never has one; the agent persists a task's meta before it starts it).
    """
    m = _LINEAGE_COPY.fullmatch(task_id)
    return m.group("task") if m else ""


def _run_keys(keys: str) -> builtins.list[builtins.list[int]]:
    """A run's keys, ``[covers, seq, id]`` each.

    Raises:
        sqlite3.DatabaseError: not a run's JSON, as SQLite reports malformed JSON
            (a read reports ``CorruptedRecord``, a write batch rolls back).
    """
    try:
        parsed = json.loads(keys)
        if not all(len(k) == 3 for k in parsed):
            raise ValueError("a key is not [covers, seq, id]")
    except (TypeError, ValueError) as exc:
        raise sqlite3.DatabaseError(f"malformed checkpoint run: {exc}") from None
    return parsed  # type: ignore[no-any-return]


def _task_rows(conn: sqlite3.Connection, task_id: str, columns: str) -> builtins.list[Any]:
    """``columns`` of every checkpoint row of a task, keyed or in the tail, unordered."""
    return conn.execute(
        f"SELECT {columns} FROM checkpoints WHERE id IN (SELECT id FROM ({_RUN_KEYS})) "
        f"UNION ALL SELECT {columns} FROM checkpoints WHERE {_TAIL} AND task_id = ?1",
        (task_id,),
    ).fetchall()


def _row_at(conn: sqlite3.Connection, task_id: str, seq: int) -> tuple[Any, ...] | None:
    """The checkpoint row ``(task_id, seq)`` (``_CKPT_COLUMNS``), or None."""
    row: tuple[Any, ...] | None = conn.execute(
        f"SELECT {_CKPT_COLUMNS} FROM checkpoints WHERE id = (SELECT id FROM ({_RUN_KEYS} "
        "AND r.min_seq <= ?2 AND r.max_seq >= ?2) WHERE seq = ?2)",
        (task_id, seq),
    ).fetchone()
    if row is None:
        row = conn.execute(
            f"SELECT {_CKPT_COLUMNS} FROM checkpoints WHERE {_TAIL} AND task_id = ? AND seq = ?",
            (task_id, seq),
        ).fetchone()
    return row


def _newest_first(
    conn: sqlite3.Connection, task_id: str, max_covers: int | None = None
) -> Generator[tuple[tuple[int, int], tuple[Any, ...]], None, None]:
    """A task's checkpoint rows, newest first by (covers_journal_seq, seq), read lazily.

    Yields ``((covers, seq) as keyed, row)``; the caller checks the row against its key.
    A run holds no key above ``(max_covers, max_seq)`` (with ``max_covers`` capped
    at the bound asked for), so its keys are read only once the newest key not
    yet yielded is no newer than that: a load of a task's newest row reads one
    run when its covers and seqs grow together. Runs are taken in that order
    from ``checkpoint_runs_by_task``, lazily, but for those whose ``max_covers``
    reaches the cap: they are read and sorted first.
    """
    cond, args = "", (task_id,)  # type: tuple[str, tuple[Any, ...]]
    if max_covers is not None:
        cond, args = " AND covers_journal_seq <= ?", (task_id, max_covers)
    heap: builtins.list[tuple[int, int, int]] = [
        (-c, -q, i)
        for c, q, i in conn.execute(
            f"SELECT covers_journal_seq, seq, id FROM checkpoints WHERE {_TAIL} AND task_id = ?"
            f"{cond}",
            args,
        )
    ]
    heapq.heapify(heap)
    # runs by bound, newest first; a run's bound is (max_covers, max_seq), its
    # covers capped at max_covers (those reaching the cap are sorted here, the
    # rest come in index order)
    capped: builtins.list[tuple[int, int, int]] = []
    if max_covers is None:
        below = conn.execute(
            "SELECT max_covers, max_seq, run_id FROM checkpoint_runs WHERE task_id = ? "
            "ORDER BY max_covers DESC, max_seq DESC",
            (task_id,),
        )
    else:
        capped = [
            (max_covers, int(q), int(r))
            for q, r in conn.execute(
                "SELECT max_seq, run_id FROM checkpoint_runs "
                "WHERE task_id = ?1 AND max_covers >= ?2 AND min_covers <= ?2",
                args,
            )
        ]
        capped.sort(reverse=True)
        below = conn.execute(
            "SELECT max_covers, max_seq, run_id FROM checkpoint_runs "
            "WHERE task_id = ? AND max_covers < ? ORDER BY max_covers DESC, max_seq DESC",
            args,
        )
    runs = itertools.chain(capped, below)
    try:
        run = next(runs, None)
        while True:
            # open every run whose bound reaches the newest key left: one of
            # its keys may come first
            while run is not None and (not heap or (run[0], run[1]) >= (-heap[0][0], -heap[0][1])):
                (keys,) = conn.execute(
                    "SELECT keys FROM checkpoint_runs WHERE run_id = ?", (run[2],)
                ).fetchone()
                for c, q, i in _run_keys(keys):
                    if max_covers is None or c <= max_covers:
                        heapq.heappush(heap, (-c, -q, i))
                run = next(runs, None)
            if not heap:
                return
            neg_covers, neg_seq, row_id = heapq.heappop(heap)
            row = conn.execute(
                f"SELECT {_CKPT_COLUMNS} FROM checkpoints WHERE id = ?", (row_id,)
            ).fetchone()
            if row is not None:
                yield (-neg_covers, -neg_seq), row
    finally:
        below.close()


def _check_key(row: tuple[Any, ...], task_id: str, seq: int, covers: int | None = None) -> None:
    """Raise ``CorruptedCheckpoint`` unless the row is the one its key names."""
    if row[0] != task_id or row[1] != seq or (covers is not None and row[3] != covers):
        raise CorruptedCheckpoint(
            make_ref(task_id, seq),
            f"row {make_ref(str(row[0]), row[1])} covering {row[3]} is stored under this key",
        )


def _delete_checkpoints(
    conn: sqlite3.Connection, task_id: str, doomed: Sequence[tuple[int, ...]]
) -> None:
    """Delete some of a task's checkpoint rows, ``doomed`` led by their ids, and
    their keys: each run that keys one of them is rewritten without it, or
    deleted once it keys none."""
    if not doomed:
        return
    ids = {int(d[0]) for d in doomed}
    runs = [  # parsed before the first write: a malformed run fails the batch
        (run_id, _run_keys(keys))
        for run_id, keys in conn.execute(
            "SELECT run_id, keys FROM checkpoint_runs WHERE task_id = ?", (task_id,)
        ).fetchall()
    ]
    conn.executemany("DELETE FROM checkpoints WHERE id = ?", [(i,) for i in sorted(ids)])
    for run_id, entries in runs:
        kept = [k for k in entries if k[2] not in ids]
        if len(kept) == len(entries):
            continue
        if not kept:
            conn.execute("DELETE FROM checkpoint_runs WHERE run_id = ?", (run_id,))
            continue
        covers = [k[0] for k in kept]
        seqs = [k[1] for k in kept]
        conn.execute(
            "UPDATE checkpoint_runs SET min_covers = ?, max_covers = ?, min_seq = ?, "
            "max_seq = ?, keys = ? WHERE run_id = ?",
            (
                min(covers),
                max(covers),
                min(seqs),
                max(seqs),
                json.dumps(kept, separators=(",", ":")),
                run_id,
            ),
        )


InfoList = list[CheckpointInfo]
EventList = list[JournalEvent]


E = TypeVar("E", Durability, Compression)


def _enum_arg(kind: type[E], value: object, field_name: str) -> E:
    """Return ``value`` as a member of ``kind``, accepting the member or its value."""
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(m.value for m in kind)
        raise InvalidArgument(field_name, f"must be one of {choices}, got {value!r}") from None


def _statements(script: str) -> builtins.list[str]:
    """The statements of a DDL script (none of ours has a ';' inside a literal)."""
    return [stmt.strip() for stmt in script.split(";") if stmt.strip()]


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _checkpoint_checksum(
    task_id: str,
    seq: int,
    epoch: int,
    covers: int,
    terminal: bool,
    label: str,
    created_at_ms: int,
    parent_ref: str,
    encoding: int,
    stored: bytes,
) -> int:
    """``record_checksum`` of a checkpoint row, spelled out for speed (same value).

    ``record_checksum`` joins ``str(v)`` of each header field with ``\\x1f`` (a bool
    as ``0`` / ``1``); an f-string formats str, int, float, bytes and None exactly
    like ``str``, and ``terminal`` is the only field that may be a bool.
    """
    head = (
        f"ckpt\x1f{task_id}\x1f{seq}\x1f{epoch}\x1f{covers}\x1f{int(terminal)}\x1f{label}"
        f"\x1f{created_at_ms}\x1f{parent_ref}\x1f{encoding}"
    )
    return _crc_extend(_crc_value(head.encode("utf-8", "surrogatepass")), stored)  # type: ignore[no-any-return]


def _journal_checksum(task_id: str, seq: int, epoch: int, created_at_ms: int, stored: bytes) -> int:
    """``record_checksum`` of a journal row, spelled out for speed (same value)."""
    head = f"jrnl\x1f{task_id}\x1f{seq}\x1f{epoch}\x1f{created_at_ms}"
    return int(_crc_extend(_crc_value(head.encode("utf-8", "surrogatepass")), stored))


def _slot_setters(cls: type, *names: str) -> tuple[Callable[[object, object], None], ...]:
    return tuple(cls.__dict__[name].__set__ for name in names)


_SO_REF, _SO_SEQ, _SO_COVERS, _SO_TERMINAL = _slot_setters(
    SaveOutcome, "ref", "seq", "covers_journal_seq", "terminal"
)


def _save_outcome(ref: str, seq: int, covers: int, terminal: bool) -> SaveOutcome:
    """``SaveOutcome(ref, seq, covers, terminal)`` in half the time: the frozen
    dataclass's ``__init__`` sets each slot through ``object.__setattr__``; this
    sets them through their descriptors (the writer makes one per save)."""
    out = object.__new__(SaveOutcome)
    _SO_REF(out, ref)
    _SO_SEQ(out, seq)
    _SO_COVERS(out, covers)
    _SO_TERMINAL(out, terminal)
    return out


_Head = tuple[int, int, int]  # (epoch, last_journal_seq, last_checkpoint_seq)


_INSERT_CHECKPOINT = (
    f"INSERT INTO checkpoints (id, {_CKPT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# ``_Heads.flush`` inserts a batch's rows a power of two at a time, up to 32 per
# statement: one statement step instead of one per row (~0.35 us a row of 1 KiB
# cheaper here), and five more statements in the connection's cache.
_INSERT_MANY_MAX = 32
_ROW_FIELDS = 12  # values of a row in ``_INSERT_CHECKPOINT``
_INSERT_CHECKPOINTS = {
    n: f"INSERT INTO checkpoints (id, {_CKPT_COLUMNS}) VALUES "
    + ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * n)
    for n in (1, 2, 4, 8, 16, 32)
}


class _Heads:
    """The writer's cache of task heads; a batch's changes wait in an overlay.

    Only the writer thread touches it. ``commit`` folds the overlay in after the
    transaction commits, ``rollback`` drops it after a failed one. A head that
    only saves changed (its epoch and last checkpoint seq) is not written to
    the ``tasks`` table by the batch: it is *deferred*, since the batch's
    checkpoint rows carry both, until the next fold writes it (or an op that
    needs the table current, as prune does, writes it with its batch). So the
    cache equals the ``tasks`` table merged with the tail (see "On-disk
    layout"). It also holds the checkpoint rows the batch's saves made
    (``pending``, their values one after another in one flat list, as the
    multi-row INSERTs bind them), inserted by ``flush``: before the commit, and
    at the start of every op that reads the ``checkpoints`` table.
    """

    __slots__ = (
        "_committed",
        "_dropped",
        "_gone",
        "_overlay",
        "_skipped",
        "_write",
        "deferred",
        "pending",
    )

    def __init__(self) -> None:
        self._committed: dict[str, _Head] = {}
        self._overlay: dict[str, _Head] = {}
        self._write: set[str] = set()  # overlay heads this batch must write
        self._dropped: set[str] = set()  # tasks deleted by this batch (and not set since)
        self._gone: set[str] = set()  # tasks deleted by this batch (their table row too)
        self._skipped: set[str] = set()  # overlay heads ``dirty`` left deferred
        self.deferred: set[str] = set()  # committed heads ahead of the tasks table
        self.pending: builtins.list[Any] = []  # rows' values, _ROW_FIELDS a row

    def flush(self, conn: sqlite3.Connection) -> None:
        """Insert the checkpoint rows saved so far in this batch."""
        values = self.pending
        if not values:
            return
        self.pending = []
        left = len(values) // _ROW_FIELDS
        if left == _INSERT_MANY_MAX:  # a full batch of saves: bind the list as it is
            conn.execute(_INSERT_CHECKPOINTS[left], values)
            return
        start = 0
        while left:
            n = _INSERT_MANY_MAX
            while n > left:
                n >>= 1
            end = start + n * _ROW_FIELDS
            conn.execute(_INSERT_CHECKPOINTS[n], values[start:end])
            start = end
            left -= n

    def get(self, conn: sqlite3.Connection, task_id: str) -> _Head | None:
        head = self._overlay.get(task_id)  # never holds a dropped task
        if head is not None:
            return head
        if task_id in self._dropped:
            return None
        head = self._committed.get(task_id)
        if head is None:  # not deferred either: the table row is current
            row = conn.execute(
                "SELECT epoch, last_journal_seq, last_checkpoint_seq FROM tasks WHERE task_id = ?",
                (task_id,),
            ).fetchone()
            if row is not None:
                head = self._committed[task_id] = (int(row[0]), int(row[1]), int(row[2]))
        return head

    def set(self, task_id: str, head: _Head, write: bool = True) -> None:
        """Change a head in this batch; ``write=False`` (saves) lets it be deferred."""
        self._dropped.discard(task_id)
        self._overlay[task_id] = head
        if write:
            self._write.add(task_id)

    def defer(self, task_id: str, head: _Head) -> None:
        """``set(task_id, head, write=False)``: a save's head, which may be deferred."""
        self._dropped.discard(task_id)
        self._overlay[task_id] = head

    def drop(self, task_id: str) -> None:
        """The task's rows, its ``tasks`` row included, were deleted in this batch."""
        self._overlay.pop(task_id, None)
        self._write.discard(task_id)
        self._dropped.add(task_id)
        self._gone.add(task_id)

    def dirty(
        self,
    ) -> tuple[builtins.list[tuple[int, int, int, str]], builtins.list[tuple[str, int, int, int]]]:
        """The heads this batch writes: ``(epoch, journal, checkpoint, task_id)``
        of tasks whose ``tasks`` row exists (an UPDATE), ``(task_id, ...)`` of the
        others (an upsert). A head only saves changed, of a task whose row
        exists, is deferred instead."""
        stored: builtins.list[tuple[int, int, int, str]] = []
        new: builtins.list[tuple[str, int, int, int]] = []
        committed, write, gone = self._committed, self._write, self._gone
        skipped = self._skipped
        skipped.clear()
        if not write and not gone and self._overlay.keys() <= committed.keys():
            skipped.update(self._overlay)  # only saves of known tasks: all deferred
            return [], []
        for task_id, head in sorted(self._overlay.items()):
            if task_id not in committed or task_id in gone:
                new.append((task_id, *head))
            elif task_id in write:
                stored.append((*head, task_id))
            else:
                skipped.add(task_id)
        return stored, new

    def commit(self) -> None:
        for task_id in self._dropped:
            self._committed.pop(task_id, None)
            self.deferred.discard(task_id)
        self._committed.update(self._overlay)
        if len(self._skipped) == len(self._overlay):  # all deferred (skipped <= overlay)
            self.deferred.update(self._skipped)
        else:
            for task_id in self._overlay:
                if task_id in self._skipped:
                    self.deferred.add(task_id)
                else:
                    self.deferred.discard(task_id)
        self._clear()

    def rollback(self) -> None:
        self._clear()
        self.pending.clear()

    def _clear(self) -> None:
        self._overlay.clear()
        self._write.clear()
        self._dropped.clear()
        self._gone.clear()
        self._skipped.clear()

    def deferred_rows(self) -> builtins.list[tuple[int, int, int, str]]:
        """``(epoch, journal, checkpoint, task_id)`` of every deferred head."""
        return [(*self._committed[t], t) for t in sorted(self.deferred)]


_OpFn = Callable[[sqlite3.Connection, _Heads], T]

# WAL checkpoints. SQLite's own autocheckpoint (every 1000 WAL pages) runs inside
# whichever COMMIT crosses the mark, which may be a commit made on an event loop
# (see ``_commit_inline``); so the store checkpoints itself, on the writer thread
# or a sync caller's, after about as many pages (``_maybe_checkpoint``), and
# leaves SQLite's autocheckpoint as a backstop.
_PAGE_BYTES = 8192
_CHECKPOINT_EVERY_PAGES = 1000
_AUTOCHECKPOINT_BACKSTOP_PAGES = 4 * _CHECKPOINT_EVERY_PAGES
_OTHER_OP_PAGES = 16  # a guess for prune / fork / adopt / forget / meta


def _row_pages(payload_bytes: int) -> int:
    """Guess of the WAL pages one saved or appended row writes: its share of the
    checkpoint table's last leaf (or its overflow pages) and of the task heads."""
    return 1 + payload_bytes // 4000


# Keying the tail (``_fold_keys``): once this many checkpoint rows were appended
# above ``keys_through``. Bounds what a read scans besides the keys (~1024 rows,
# ~256 pages of 1 KiB rows) and makes a fold touch each task's key leaves once
# per ~1024 saves instead of once per commit.
_FOLD_TAIL_ROWS = 1024
_FOLD_RUNS = (
    "INSERT INTO checkpoint_runs (task_id, min_covers, max_covers, min_seq, max_seq, keys) "
    "SELECT task_id, MIN(covers_journal_seq), MAX(covers_journal_seq), "
    "MIN(seq), MAX(seq), json_group_array(json_array(covers_journal_seq, seq, id)) "
    "FROM checkpoints WHERE id > ? AND id <= ? GROUP BY task_id"
)


# Inline commits on the event loop (see ``_commit_inline``): only a write of at most
# this many payload bytes; after one took over _INLINE_SLOW_S, none for
# _INLINE_BACKOFF_FACTOR times as long as it took, so slow inline commits hold
# the loop for at most about 1/51 (2 %) of its time.
_INLINE_MAX_BYTES = 16 * 1024
_INLINE_SLOW_S = 0.002
_INLINE_BACKOFF_FACTOR = 50.0


@dataclass(slots=True)
class _Op:
    """A queued write: the function the writer runs, and where its outcome goes."""

    fn: _OpFn[Any]
    future: Future[Any] | None  # a thread waits on it (sync API)
    loop: asyncio.AbstractEventLoop | None  # or a coroutine awaits ``afuture`` on this loop
    afuture: asyncio.Future[Any] | None
    pages: int = _OTHER_OP_PAGES  # guess of the WAL pages it writes (checkpoint pacing)


_Outcome = tuple[Any, BaseException | None]  # (value, None) or (None, the error)


def _deliver(
    ops: Sequence[_Op],
    outcomes: Sequence[_Outcome],
    on_loop: asyncio.AbstractEventLoop | None = None,
) -> None:
    """Resolve callers, ``outcomes[i]`` being that of ``ops[i]``: threads
    directly, each event loop with a single wake-up.

    ``on_loop`` is the event loop running this call, if any: its futures are
    resolved directly, without a wake-up. When every op is of one loop (a
    loop's list, batched whole: the usual group commit), both sequences go to
    it as they are; the caller must not change them afterwards.
    """
    first = ops[0].loop if ops else None
    if first is not None:
        for op in ops:
            if op.loop is not first:
                break
        else:
            _to_loop(first, ops, outcomes, on_loop)
            return
    by_loop: dict[asyncio.AbstractEventLoop, tuple[builtins.list[_Op], builtins.list[_Outcome]]]
    by_loop = {}
    for op, outcome in zip(ops, outcomes, strict=True):
        if op.future is not None:
            value, err = outcome
            if err is not None:
                op.future.set_exception(err)
            else:
                op.future.set_result(value)
        elif op.loop is not None:
            mine = by_loop.get(op.loop)
            if mine is None:
                mine = by_loop[op.loop] = ([], [])
            mine[0].append(op)
            mine[1].append(outcome)
    for loop, (loop_ops, loop_outcomes) in by_loop.items():
        _to_loop(loop, loop_ops, loop_outcomes, on_loop)


def _to_loop(
    loop: asyncio.AbstractEventLoop,
    ops: Sequence[_Op],
    outcomes: Sequence[_Outcome],
    on_loop: asyncio.AbstractEventLoop | None,
) -> None:
    if loop is on_loop:
        _resolve_async(ops, outcomes)
        return
    with contextlib.suppress(RuntimeError):  # the loop was closed; nobody awaits
        loop.call_soon_threadsafe(_resolve_async, ops, outcomes)


def _resolve_async(ops: Sequence[_Op], outcomes: Sequence[_Outcome]) -> None:
    """Resolve the futures of ops of the event loop running this call."""
    for op, (value, err) in zip(ops, outcomes, strict=True):
        fut = op.afuture
        if fut is None or fut.done():  # the awaiting task was cancelled
            continue
        if err is not None:
            fut.set_exception(err)
        else:
            fut.set_result(value)


_STOP = object()


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """Result of ``verify``: every stored record checked against its checksum.

    Attributes:
        checkpoints: checkpoint records read.
        events: journal events read.
        corrupt_refs: refs of checkpoints that failed verification.
        corrupt_events: ``(task_id, seq)`` of journal events that failed.
    """

    checkpoints: int
    events: int
    corrupt_refs: tuple[str, ...]
    corrupt_events: tuple[tuple[str, int], ...]

    @property
    def ok(self) -> bool:
        return not self.corrupt_refs and not self.corrupt_events


class CheckpointStore:
    """Durable local checkpoints and journal of a node agent (DESIGN.md §8).

    Args:
        data_dir: directory of the node agent; created if missing. The database
            is ``<data_dir>/checkpoints.sqlite3``.
        durability: when writes return relative to fsync (see ``Durability``).
        compression: ``Compression.ZSTD`` stores payloads of at least
            ``compress_min_bytes`` compressed when that shrinks them.
        compress_min_bytes: smallest payload worth compressing, bytes.
        group_window_ms: longest a GROUP batch waits for company, milliseconds.
        group_max_batch: most writes one transaction carries.
        max_payload_bytes: largest checkpoint or event payload accepted, bytes.
        clock_ms: wall clock in Unix milliseconds (injected for tests).

    Raises:
        StoreLocked: another process holds the data directory.
        CorruptedRecord: the file is not a Lazarus checkpoint database.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        durability: Durability | str = Durability.SYNC,
        compression: Compression | str = Compression.NONE,
        compress_min_bytes: int = 1024,
        group_window_ms: float = 2.0,
        group_max_batch: int = 256,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        clock_ms: Callable[[], int] = _wall_clock_ms,
    ) -> None:
        self.durability = _enum_arg(Durability, durability, "durability")
        self.compression = _enum_arg(Compression, compression, "compression")
        self._zstd = self.compression is Compression.ZSTD
        self.compress_min_bytes = compress_min_bytes
        self.group_window_s = max(0.0, group_window_ms) / 1000.0
        self.group_max_batch = max(1, group_max_batch)
        self.max_payload_bytes = max_payload_bytes
        self._clock_ms = clock_ms
        self.data_dir = Path(data_dir)
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreIOError(f"data_dir: cannot create {self.data_dir}: {exc}") from exc
        self.path = self.data_dir / DB_FILENAME
        self._lock_fd = self._acquire_dir_lock()
        self._closed = False
        self._state_lock = threading.Lock()
        self._corrupted = 0
        self._commits = 0
        self._readers: list[sqlite3.Connection] = []
        self._local = threading.local()
        self._read_pool: ThreadPoolExecutor | None = None
        self._queue: queue.SimpleQueue[_Op | object] = queue.SimpleQueue()
        self._wlock = threading.Lock()  # held while a batch runs on the write connection
        self._heads = _Heads()  # guarded by _wlock
        self._wal_pages = 0  # guess of the WAL pages since the last checkpoint; under _wlock
        self._wal_scale = 1.0  # real WAL frames per guessed page, as checkpoints report
        self._wal_due_pages = _CHECKPOINT_EVERY_PAGES  # checkpoint at this many guessed pages
        self._inline_after = 0.0  # time.monotonic() before which no commit runs on a loop
        # the checkpoint rows' append order (see "On-disk layout"); under _wlock
        self._keys_through = 0  # ids up to this one are keyed in checkpoint_runs
        self._next_id = 1  # id of the next checkpoint row
        self._tail_rows = 0  # rows inserted above _keys_through (an upper bound)
        self._fold_due_rows = _FOLD_TAIL_ROWS
        # per event loop, the ops its coroutines submitted since its last ``_flush_loop``
        self._loop_pending: dict[asyncio.AbstractEventLoop, builtins.list[_Op]] = {}
        try:
            self._wconn = self._connect()
            sync = "OFF" if self.durability is Durability.NONE else "FULL"
            self._wconn.execute(f"PRAGMA synchronous={sync}")
            self._wconn.execute(f"PRAGMA wal_autocheckpoint={_AUTOCHECKPOINT_BACKSTOP_PAGES}")
            # a new database's page size (an existing one keeps its own): a group
            # commit of 32 x 1 KiB writes about half as many WAL frames as at 4 KiB
            self._wconn.execute(f"PRAGMA page_size={_PAGE_BYTES}")
            mode = self._wconn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreIOError(f"{self.path}: could not enable WAL mode (got {mode})")
            self._open_schema()
        except sqlite3.DatabaseError as exc:
            self._close_quietly()
            raise CorruptedRecord(str(self.path), f"not a usable SQLite database: {exc}") from exc
        except BaseException:
            self._close_quietly()
            raise
        self._writer = threading.Thread(
            target=self._writer_main, name=f"ckpt-writer:{self.data_dir.name}", daemon=True
        )
        self._writer.start()
        self.aio = AsyncCheckpointStore(self)

    # ------------------------------------------------------------------ set-up

    def _acquire_dir_lock(self) -> int:
        lock_path = self.data_dir / LOCK_FILENAME
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreIOError(f"data_dir: cannot open {lock_path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "another process"
            os.close(fd)
            raise StoreLocked(str(lock_path), f"pid {holder}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        return fd

    def _close_quietly(self) -> None:
        """Undo a failed open: close the write connection, release the data dir."""
        conn = getattr(self, "_wconn", None)
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        self._release_dir_lock()

    def _release_dir_lock(self) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=30.0
        )
        conn.execute("PRAGMA busy_timeout=30000")
        return conn

    def _reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            with self._state_lock:
                if self._closed:
                    raise StoreClosed()
                conn = self._connect()
                self._readers.append(conn)
            self._local.conn = conn
        return conn

    @contextlib.contextmanager
    def _read_txn(self) -> Iterator[sqlite3.Connection]:
        """One consistent snapshot for a multi-statement read."""
        if self._closed:
            raise StoreClosed()
        conn = self._reader()
        conn.execute("BEGIN")
        try:
            yield conn
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError):
                raise StoreIOError(f"{self.path}: {exc}") from exc
            raise CorruptedRecord(str(self.path), str(exc)) from exc
        finally:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("COMMIT")

    def _open_schema(self) -> None:
        """Create the schema in a new database, or check and migrate an existing one.

        All in one transaction: a migration interrupted by a crash leaves the
        database as it was.

        Raises:
            StoreIOError: the database was written by a newer schema, or this
                SQLite lacks the JSON functions the keys need (UNAVAILABLE).
            CorruptedRecord: the file is not a Lazarus checkpoint database.
        """
        conn = self._wconn
        try:
            conn.execute("SELECT json_group_array(json_array(1, 2)) FROM json_each('[0]')")
        except sqlite3.OperationalError as exc:
            raise StoreIOError(
                f"SQLite {sqlite3.sqlite_version} lacks the JSON functions the checkpoint "
                f"store needs (built in since 3.38): {exc}"
            ) from exc
        conn.execute("BEGIN IMMEDIATE")
        try:
            names = {
                r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
            if not names:
                version = 0
                for stmt in _statements(_SCHEMA):
                    conn.execute(stmt)
            else:
                row = None
                if "meta" in names:
                    row = conn.execute(
                        "SELECT value FROM meta WHERE key = 'schema_version'"
                    ).fetchone()
                if row is None or not str(row[0]).isdigit():
                    raise CorruptedRecord(
                        str(self.path), "not a Lazarus checkpoint database (no schema version)"
                    )
                version = int(row[0])
                if version > SCHEMA_VERSION:
                    raise StoreIOError(
                        f"{self.path}: schema version {version} was written by a newer Lazarus; "
                        f"this one reads versions up to {SCHEMA_VERSION} (upgrade it, or use "
                        "another data dir)"
                    )
                if version < 1:
                    raise CorruptedRecord(str(self.path), f"unknown schema version {version}")
                if version == 1:
                    for stmt in _statements(_MIGRATE_V1):
                        conn.execute(stmt)
                if version <= 2:
                    for stmt in _statements(_MIGRATE_V2):
                        conn.execute(stmt)
                conn.execute(_MATERIALIZE_HEADS)
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        if 0 < version < SCHEMA_VERSION:
            log.info(
                "checkpoint store %s: migrated schema %d -> %d", self.path, version, SCHEMA_VERSION
            )
        self._keys_through = self._read_keys_through(conn)
        tail_rows, max_id = conn.execute(
            "SELECT COUNT(*), MAX(id) FROM checkpoints WHERE id > ?", (self._keys_through,)
        ).fetchone()
        self._tail_rows = int(tail_rows)
        self._next_id = max(int(max_id or 0), self._keys_through) + 1

    @staticmethod
    def _read_keys_through(conn: sqlite3.Connection) -> int:
        row = conn.execute("SELECT value FROM meta WHERE key = 'keys_through'").fetchone()
        return int(row[0])

    # ------------------------------------------------------------------ writer

    def _enqueue(self, op: _Op | builtins.list[_Op]) -> None:
        with self._state_lock:
            if self._closed:
                raise StoreClosed()
            self._queue.put(op)

    def _call(self, fn: _OpFn[T], pages: int = _OTHER_OP_PAGES) -> T:
        """Run a write op and wait for its commit.

        When no batch is in flight the caller commits its own write inline, under
        the write lock, and skips two thread wake-ups (LevelDB's write group has
        its leader do the same). Otherwise the op joins the writer thread's queue,
        where it can share a batch and an fsync with its concurrent peers.
        """
        fut: Future[T] = Future()
        op = _Op(fn, fut, None, None, pages)
        if self._wlock.acquire(blocking=False):
            try:
                if self._closed:
                    raise StoreClosed()
                self._run_batch([op], self._heads)
                self._maybe_checkpoint()
            finally:
                self._wlock.release()
        else:
            self._enqueue(op)
        return fut.result()

    def _asubmit(self, fn: _OpFn[T], pages: int = _OTHER_OP_PAGES) -> asyncio.Future[T]:
        """Submit a write op from a coroutine; return the future its commit resolves.

        Ops submitted while the loop runs one batch of ready callbacks are
        collected and handed over together by ``_flush_loop``, which the first
        of them schedules: one queue put and one writer wake-up per loop
        iteration, not per op.
        """
        if self._closed:
            raise StoreClosed()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        op = _Op(fn, None, loop, fut, pages)
        pending = self._loop_pending.get(loop)
        if pending is None:
            self._loop_pending[loop] = [op]
            loop.call_soon(self._flush_loop, loop)
        else:
            pending.append(op)
        return fut

    async def _acall(self, fn: _OpFn[T], pages: int = _OTHER_OP_PAGES) -> T:
        """Run a write op on the writer thread; await its commit without blocking the loop."""
        return await self._asubmit(fn, pages)

    async def _acall_small(self, fn: _OpFn[T], pages: int) -> T:
        """``_acall`` for a small save or append: commit inline when that is cheap."""
        if self._closed:
            raise StoreClosed()
        loop = asyncio.get_running_loop()
        if loop not in self._loop_pending:
            done, value = self._commit_inline(fn, pages, loop)
            if done:
                await asyncio.sleep(0)  # still let the loop run others once
                return value  # type: ignore[no-any-return]
        return await self._asubmit(fn, pages)

    def _commit_inline(
        self, fn: _OpFn[Any], pages: int, loop: asyncio.AbstractEventLoop
    ) -> tuple[bool, Any]:
        """Commit one small write on the event loop running this call, if that is cheap.

        The inline commit: one small save or append (at most ``_INLINE_MAX_BYTES``
        of payload), the writer idle (the write lock free), and nothing else
        ready to run on this loop. Then the loop itself runs the transaction,
        fsync included, as a sync caller does: it is blocked for that commit
        (about 0.2 ms for 1 KiB on a local SSD) and saves the two thread
        wake-ups of a hand-over (loop -> writer -> loop), about 0.06 to 0.09 ms
        here (1 KiB, one task: 0.31 ms a save handed over, 0.22 ms inline).
        Only when no other callback is ready, so no other coroutine waits
        behind it; after an inline commit took over
        ``_INLINE_SLOW_S`` (a slow or busy disk), not for 50 times as long as it
        took (so slow ones hold the loop at most ~2 % of the time); never
        when a WAL checkpoint is due (the writer thread runs those). Only
        asyncio's own event loops are recognised (``_ready``); on others every
        op is handed over.

        Returns:
            ``(True, value)`` when the op committed here, ``(False, None)`` when
            it should be handed over.

        Raises:
            The op's refusal (``StaleEpoch``, ...) or ``StoreIOError``, as the
            writer would deliver them.
        """
        if (
            getattr(loop, "_ready", True)
            or self._wal_pages >= self._wal_due_pages
            or self._tail_rows >= self._fold_due_rows
            or time.monotonic() < self._inline_after
            or not self._wlock.acquire(blocking=False)
        ):
            return False, None
        try:
            if self._closed:
                raise StoreClosed()
            started = time.perf_counter()
            try:
                [(value, err)] = self._transact([_Op(fn, None, None, None, pages)], self._heads)
            finally:
                took_s = time.perf_counter() - started
                if took_s > _INLINE_SLOW_S:
                    self._inline_after = time.monotonic() + _INLINE_BACKOFF_FACTOR * took_s
        finally:
            self._wlock.release()
        if err is not None:
            raise err
        return True, value

    def _flush_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Hand the ops this loop collected to the writer, as one queue item."""
        ops = self._loop_pending.pop(loop, None)
        if not ops:
            return
        with self._state_lock:
            if not self._closed:
                self._queue.put(ops if len(ops) > 1 else ops[0])
                return
        _deliver(ops, [(None, StoreClosed()) for _ in ops], on_loop=loop)

    def _writer_main(self) -> None:
        recent: deque[int] = deque(maxlen=8)
        backlog: deque[_Op] = deque()  # ops of a handed-over list not yet batched
        stopping = False
        try:
            while True:
                if backlog:
                    start = [backlog.popleft()]
                elif stopping:
                    return
                else:
                    item = self._queue.get()
                    if item is _STOP:
                        return
                    if isinstance(item, builtins.list):
                        if self.durability is Durability.SYNC or len(item) > self.group_max_batch:
                            backlog.extend(item)
                            start = [backlog.popleft()]
                        else:  # a loop's list, whole: the batch starts as that list
                            start = item
                    else:
                        assert isinstance(item, _Op)
                        start = [item]
                with self._wlock:
                    batch, stop = self._gather(start, recent, backlog)
                    recent.append(len(batch))
                    self._run_batch(batch, self._heads)
                    self._maybe_checkpoint()
                stopping = stopping or stop
        except BaseException as exc:  # a bug in the writer: fail loudly, never hang callers
            log.exception("checkpoint writer died")
            with self._state_lock:
                self._closed = True
            self._fail_pending(StoreIOError(f"checkpoint writer died: {exc!r}"), backlog)
            raise
        finally:
            with self._wlock, contextlib.suppress(sqlite3.Error):
                self._wconn.close()

    def _gather(
        self, batch: builtins.list[_Op], recent: deque[int], backlog: deque[_Op]
    ) -> tuple[builtins.list[_Op], bool]:
        """Pick the next batch: ``batch`` (one op, or a loop's list of at most
        ``group_max_batch``; extended in place), then ops from ``backlog`` and the queue.

        Returns:
            The batch and whether ``_STOP`` was met (the caller finishes
            ``backlog``, then stops).
        """
        if self.durability is Durability.SYNC:
            return batch, False
        waiting = self.durability is Durability.GROUP and self.group_window_s > 0
        target = min(self.group_max_batch, max(recent, default=1))
        deadline = time.monotonic() + self.group_window_s
        while len(batch) < self.group_max_batch:
            if backlog:
                room = self.group_max_batch - len(batch)
                if len(backlog) <= room:  # a handed-over list, whole
                    batch.extend(backlog)
                    backlog.clear()
                else:
                    batch.extend(backlog.popleft() for _ in range(room))
                continue
            if not self._queue.empty():  # only this thread takes items: get_nowait gets one
                item = self._queue.get_nowait()
            else:
                remaining = deadline - time.monotonic()
                if not waiting or len(batch) >= target or remaining <= 0:
                    break
                try:
                    item = self._queue.get(timeout=remaining)
                except queue.Empty:
                    break
            if item is _STOP:
                return batch, True
            if isinstance(item, builtins.list):
                backlog.extend(item)
                continue
            assert isinstance(item, _Op)
            batch.append(item)
        return batch, False

    def _run_batch(self, batch: builtins.list[_Op], heads: _Heads) -> None:
        """Run a batch as one transaction (``_transact``); resolve each caller after it."""
        try:
            results = self._transact(batch, heads)
        except StoreIOError as err:
            _deliver(batch, [(None, err)] * len(batch))
            return
        _deliver(batch, results)

    def _transact(
        self, batch: Sequence[_Op], heads: _Heads
    ) -> builtins.list[tuple[Any, Exception | None]]:
        """Run a batch as one transaction and commit it; call with the write lock held.

        Ordering rule: every op makes its checks before its first write, so a
        refused op (an exception other than ``sqlite3.Error``) wrote nothing and
        the rest of the batch commits without it. An ``sqlite3.Error`` fails the
        whole batch: it is rolled back and every caller is told nothing was saved.

        Returns:
            Per op, in order, ``(value, None)`` or ``(None, the op's refusal)``.

        Raises:
            StoreIOError: the transaction failed and was rolled back.
        """
        conn = self._wconn
        results: list[tuple[Any, Exception | None]] = []
        any_ok = False
        try:
            conn.execute("BEGIN IMMEDIATE")
            for op in batch:
                try:
                    results.append((op.fn(conn, heads), None))
                    any_ok = True
                except sqlite3.Error:
                    raise
                except Exception as exc:
                    results.append((None, exc))
            heads.flush(conn)
            stored, new = heads.dirty()
            if stored:  # one seek each, where an upsert makes two
                conn.executemany(
                    "UPDATE tasks SET epoch = ?, last_journal_seq = ?, last_checkpoint_seq = ? "
                    "WHERE task_id = ?",
                    stored,
                )
            if new:
                conn.executemany(
                    "INSERT INTO tasks (task_id, epoch, last_journal_seq, last_checkpoint_seq) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT (task_id) DO UPDATE SET "
                    "epoch = excluded.epoch, last_journal_seq = excluded.last_journal_seq, "
                    "last_checkpoint_seq = excluded.last_checkpoint_seq",
                    new,
                )
            if any_ok:
                conn.execute("COMMIT")
                self._commits += 1
                heads.commit()
                self._wal_pages += 1 + sum(op.pages for op in batch)
            else:
                conn.execute("ROLLBACK")
                heads.rollback()
        except sqlite3.Error as exc:
            heads.rollback()
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            log.error("checkpoint batch of %d failed to commit: %s", len(batch), exc)
            raise StoreIOError(
                f"{self.path}: commit failed, nothing of this write was saved: {exc}"
            ) from exc
        return results

    def _maybe_checkpoint(self) -> None:
        """Key the tail when it is due (``_fold_keys``), then checkpoint the WAL when due."""
        if self._tail_rows >= self._fold_due_rows:
            self._fold_keys()
        self._maybe_wal_checkpoint()

    def _fold_keys(self) -> None:
        """Key the tail: one run per task in ``checkpoint_runs`` for the rows above
        ``keys_through`` (``_FOLD_RUNS``), and move the mark, in one transaction
        of its own.

        Called holding the write lock, after a batch's callers were resolved
        (so the loop's next round of saves overlaps it), never on an event loop.
        The transaction commits without an fsync (``synchronous=OFF``): it adds
        nothing a caller waits for, only keys derived from rows already durable;
        the next commit's fsync covers it (the WAL is one append-only file), and a
        crash before that drops it whole (WAL frames are checksummed), leaving
        the rows in the tail, where reads find them all the same.
        """
        conn = self._wconn
        upto = self._next_id - 1
        relax = self.durability is not Durability.NONE
        try:
            if relax:
                conn.execute("PRAGMA synchronous=OFF")
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(_FOLD_RUNS, (self._keys_through, upto))
            conn.execute("UPDATE meta SET value = ? WHERE key = 'keys_through'", (str(upto),))
            conn.executemany(
                "UPDATE tasks SET epoch = ?, last_journal_seq = ?, last_checkpoint_seq = ? "
                "WHERE task_id = ?",
                self._heads.deferred_rows(),
            )
            conn.execute("COMMIT")
        except sqlite3.Error as exc:  # the tail stays readable; try again later
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            self._fold_due_rows = 2 * max(self._fold_due_rows, self._tail_rows)
            log.warning("checkpoint store: keying the checkpoint tail failed: %s", exc)
            return
        finally:
            if relax:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("PRAGMA synchronous=FULL")
        self._wal_pages += 1 + self._tail_rows // 64
        self._heads.deferred.clear()
        self._keys_through = upto
        self._tail_rows = 0
        self._fold_due_rows = _FOLD_TAIL_ROWS

    def _maybe_wal_checkpoint(self) -> None:
        """Checkpoint the WAL into the database once about 1000 pages piled up.

        Called holding the write lock, after a batch's callers were resolved, on
        the writer thread or a sync caller's thread (never on an event loop).
        PASSIVE, as SQLite's autocheckpoint: it copies what no reader still needs.
        The pages a write adds are guessed (``_Op.pages``); the WAL's real frame
        count, which each checkpoint reports, rescales the guess.
        """
        if self._wal_pages < self._wal_due_pages:
            return
        guessed, self._wal_pages = self._wal_pages, 0
        try:
            rows = self._wconn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:  # the next commit works regardless; say so and go on
            log.warning("checkpoint store: WAL checkpoint failed: %s", exc)
            return
        frames = int(rows[0][1]) if rows and rows[0][1] is not None else -1
        if frames > 0 and guessed > 0:
            scale = min(20.0, max(0.05, frames / guessed))
            self._wal_scale = (self._wal_scale + scale) / 2
            self._wal_due_pages = int(_CHECKPOINT_EVERY_PAGES / self._wal_scale)

    def _fail_pending(self, err: BaseException, backlog: Sequence[_Op] = ()) -> None:
        failed = builtins.list(backlog)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, _Op):
                failed.append(item)
            elif isinstance(item, builtins.list):
                failed.extend(item)
        _deliver(failed, [(None, err)] * len(failed))

    # --------------------------------------------------------- write operations

    def _save_op(self, checkpoint: Checkpoint) -> _OpFn[SaveOutcome]:
        cp = validate_checkpoint(checkpoint, self.max_payload_bytes)

        def op(conn: sqlite3.Connection, heads: _Heads) -> SaveOutcome:
            task_id, epoch, covers = cp.task_id, cp.epoch, cp.covers_journal_seq
            head = heads.get(conn, task_id)
            if head is None:
                last_journal = last_seq = 0
            else:
                stored_epoch, last_journal, last_seq = head
                if epoch < stored_epoch:
                    raise StaleEpoch(task_id, epoch, stored_epoch)
            if covers > last_journal:
                raise FutureJournalSeq(task_id, covers, last_journal)
            seq = last_seq + 1
            heads.pending.extend(self._checkpoint_row(cp, seq, ""))
            heads.defer(task_id, (epoch, last_journal, seq))
            # make_ref(task_id, seq), spelled out
            return _save_outcome(f"{task_id}{_REF_SEPARATOR}{seq}", seq, covers, cp.terminal)

        return op

    def _checkpoint_row(
        self, cp: Checkpoint, seq: int, parent_ref: str, created: int | None = None
    ) -> tuple[Any, ...]:
        """The ``checkpoints`` row (``_INSERT_CHECKPOINT``) of ``cp`` saved as ``seq``.

        Takes the next id; call with the write lock held. ``created`` (Unix ms)
        defaults to now.
        """
        if self._zstd:
            encoding, stored = encode_payload(cp.payload, True, self.compress_min_bytes)
        else:
            encoding, stored = ENCODING_RAW, cp.payload
        if created is None:
            created = self._clock_ms()
        row_id = self._next_id
        self._next_id = row_id + 1
        self._tail_rows += 1
        terminal = cp.terminal
        return (
            row_id,
            cp.task_id,
            seq,
            cp.epoch,
            cp.covers_journal_seq,
            int(terminal),
            cp.label,
            created,
            parent_ref,
            encoding,
            stored,
            _checkpoint_checksum(
                cp.task_id,
                seq,
                cp.epoch,
                cp.covers_journal_seq,
                terminal,
                cp.label,
                created,
                parent_ref,
                encoding,
                stored,
            ),
        )

    def _ingest_op(
        self, items: Sequence[tuple[Checkpoint, int, int]]
    ) -> _OpFn[builtins.list[SaveOutcome | CheckpointStoreError | None]]:
        cps = [
            (validate_checkpoint(cp, self.max_payload_bytes), seq, created)
            for cp, seq, created in items
        ]

        def op(
            conn: sqlite3.Connection, heads: _Heads
        ) -> builtins.list[SaveOutcome | CheckpointStoreError | None]:
            out: builtins.list[SaveOutcome | CheckpointStoreError | None] = []
            for cp, seq, created in cps:
                task_id = cp.task_id
                epoch, last_journal, last_seq = heads.get(conn, task_id) or (cp.epoch, 0, 0)
                if cp.epoch < epoch:
                    out.append(StaleEpoch(task_id, cp.epoch, epoch))
                    continue
                if seq <= last_seq:
                    heads.flush(conn)
                    row = _row_at(conn, task_id, seq)
                    if row is not None and (row[2], row[3], row[5], row[6]) == (
                        cp.epoch,
                        cp.covers_journal_seq,
                        cp.label,
                        created,
                    ):
                        out.append(None)  # ingested before (its spool row outlived a crash)
                        continue
                if cp.covers_journal_seq > last_journal:
                    out.append(FutureJournalSeq(task_id, cp.covers_journal_seq, last_journal))
                    continue
                # Its next seq: the one it was given, unless the task's head moved
                # meanwhile (another writer of the task): then it is renumbered.
                seq = last_seq + 1
                heads.pending.extend(self._checkpoint_row(cp, seq, "", created))
                heads.set(task_id, (cp.epoch, last_journal, seq), write=False)
                out.append(
                    _save_outcome(make_ref(task_id, seq), seq, cp.covers_journal_seq, cp.terminal)
                )
            return out

        return op

    def _insert_checkpoint(
        self, conn: sqlite3.Connection, cp: Checkpoint, seq: int, parent_ref: str
    ) -> None:
        conn.execute(_INSERT_CHECKPOINT, self._checkpoint_row(cp, seq, parent_ref))

    def _append_op(self, task_id: str, event: bytes, epoch: int) -> _OpFn[int]:
        validate_task_id(task_id)
        validate_seq(epoch, "epoch")
        payload = validate_payload(event, self.max_payload_bytes, "event")

        def op(conn: sqlite3.Connection, heads: _Heads) -> int:
            stored_epoch, last_journal, last_seq = heads.get(conn, task_id) or (epoch, 0, 0)
            if epoch < stored_epoch:
                raise StaleEpoch(task_id, epoch, stored_epoch)
            seq = last_journal + 1
            created = self._clock_ms()
            checksum = _journal_checksum(task_id, seq, epoch, created, payload)
            conn.execute(
                "INSERT INTO journal (task_id, seq, epoch, created_at_ms, payload, checksum) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (task_id, seq, epoch, created, payload, checksum),
            )
            heads.set(task_id, (epoch, seq, last_seq))
            return seq

        return op

    def _prune_op(self, task_id: str, policy: PrunePolicy) -> _OpFn[PruneReport]:
        validate_task_id(task_id)
        if not isinstance(policy, PrunePolicy):
            raise InvalidArgument("policy", f"must be a PrunePolicy, got {type(policy).__name__}")
        cutoff = validate_seq(policy.prune_covered_before, "prune_covered_before")
        seq_cutoff = validate_seq(policy.prune_seq_before, "prune_seq_before")

        def op(conn: sqlite3.Connection, heads: _Heads) -> PruneReport:
            heads.flush(conn)
            head = heads.get(conn, task_id)
            if head is not None:  # its rows may carry a deferred head: write it first
                heads.set(task_id, head)
            rows = _task_rows(conn, task_id, "id, seq, covers_journal_seq, terminal")
            preserved: str | None = None
            keep_seq = -1
            if policy.preserve_latest_terminal:
                terminals = [(int(c), int(q)) for _, q, c, t in rows if t == 1]
                if terminals:
                    keep_seq = max(terminals)[1]
                    preserved = make_ref(task_id, keep_seq)
            doomed = [
                (i, c, q) for i, q, c, _ in rows if (c, q) < (cutoff, seq_cutoff) and q != keep_seq
            ]
            _delete_checkpoints(conn, task_id, doomed)
            kept = [
                int(c)
                for _, q, c, _ in rows
                if not ((c, q) < (cutoff, seq_cutoff) and q != keep_seq)
            ]
            compacted = 0
            if policy.compact_journal and kept:
                compacted = conn.execute(
                    "DELETE FROM journal WHERE task_id = ? AND seq <= ?", (task_id, min(kept))
                ).rowcount
            return PruneReport(task_id, len(doomed), len(kept), preserved, compacted)

        return op

    def _fork_op(
        self, from_ref: str, edits: Mapping[str, Any] | None, new_task_id: str | None
    ) -> _OpFn[str]:
        src_task, src_seq = parse_ref(from_ref)
        if edits is not None and (
            not isinstance(edits, Mapping) or not all(isinstance(k, str) for k in edits)
        ):
            raise InvalidArgument("edits", "must be a mapping with string keys")
        target = None if new_task_id is None else validate_task_id(new_task_id, "new_task_id")
        edit_bytes = JsonCodec.encode(dict(edits)) if edits else None  # fail fast, in the caller

        def op(conn: sqlite3.Connection, heads: _Heads) -> str:
            heads.flush(conn)
            row = _row_at(conn, src_task, src_seq)
            if row is None:
                raise UnknownCheckpoint(from_ref)
            _check_key(row, src_task, src_seq)
            source = self._decode_checkpoint(row)
            payload = source.payload
            if edit_bytes is not None:
                state = JsonCodec.decode(payload)
                if not isinstance(state, dict):
                    raise InvalidArgument("edits", f"checkpoint {from_ref!r} is not a JSON object")
                state.update(JsonCodec.decode(edit_bytes))
                payload = validate_payload(JsonCodec.encode(state), self.max_payload_bytes)
            new_id = target or f"{src_task}.fork-{uuid.uuid4().hex[:12]}"
            if heads.get(conn, new_id) is not None:
                raise TaskExists(new_id)
            cp = Checkpoint(new_id, source.epoch, payload, 0, False, f"fork-of:{from_ref}")
            self._insert_checkpoint(conn, cp, 1, parent_ref=from_ref)
            heads.set(new_id, (source.epoch, 0, 1))
            return new_id

        return op

    def _put_meta_op(self, task_id: str, meta: bytes) -> _OpFn[None]:
        validate_task_id(task_id)
        blob = validate_payload(meta, self.max_payload_bytes, "meta")

        def op(conn: sqlite3.Connection, heads: _Heads) -> None:
            conn.execute(
                "INSERT INTO task_meta (task_id, meta) VALUES (?, ?) "
                "ON CONFLICT (task_id) DO UPDATE SET meta = excluded.meta",
                (task_id, blob),
            )

        return op

    def _forget_op(self, task_id: str) -> _OpFn[None]:
        validate_task_id(task_id)

        def op(conn: sqlite3.Connection, heads: _Heads) -> None:
            heads.flush(conn)
            _delete_checkpoints(conn, task_id, _task_rows(conn, task_id, "id"))
            conn.execute("DELETE FROM checkpoint_runs WHERE task_id = ?", (task_id,))
            for table in ("journal", "task_meta", "tasks"):
                conn.execute(f"DELETE FROM {table} WHERE task_id = ?", (task_id,))
            heads.drop(task_id)

        return op

    def _adopt_op(
        self,
        task_id: str,
        epoch: int,
        checkpoint: AdoptedCheckpoint | None,
        events: Sequence[AdoptedEvent],
        bases: Mapping[int, tuple[int, int]] | None = None,
    ) -> _OpFn[AdoptOutcome]:
        validate_task_id(task_id)
        validate_seq(epoch, "epoch")
        for base_epoch, (base_j, base_ck) in (bases or {}).items():
            validate_seq(base_epoch, "bases epoch")
            validate_seq(base_j, f"bases[{base_epoch}] journal seq")
            validate_seq(base_ck, f"bases[{base_epoch}] checkpoint seq")
        if checkpoint is not None:
            validate_seq(checkpoint.seq, "checkpoint.seq")
            validate_seq(checkpoint.covers_journal_seq, "checkpoint.covers_journal_seq")
            if checkpoint.seq < 1:
                raise InvalidArgument("checkpoint.seq", "must be >= 1")
            if checkpoint.epoch > epoch:
                raise InvalidArgument("checkpoint.epoch", f"{checkpoint.epoch} > epoch {epoch}")
            validate_payload(checkpoint.payload, self.max_payload_bytes, "checkpoint.payload")
        covers = checkpoint.covers_journal_seq if checkpoint is not None else 0
        previous = covers
        for i, ev in enumerate(events):
            if ev.seq != previous + 1:
                raise InvalidArgument(
                    f"events[{i}].seq", f"must be {previous + 1} (contiguous after covers)"
                )
            if ev.epoch > epoch:
                raise InvalidArgument(f"events[{i}].epoch", f"{ev.epoch} > epoch {epoch}")
            validate_payload(ev.payload, self.max_payload_bytes, f"events[{i}].payload")
            previous = ev.seq
        remote_seq = checkpoint.seq if checkpoint is not None else 0

        def op(conn: sqlite3.Connection, heads: _Heads) -> AdoptOutcome:
            heads.flush(conn)
            local_epoch, _, _ = heads.get(conn, task_id) or (epoch, 0, 0)
            if epoch < local_epoch:
                raise StaleEpoch(task_id, epoch, local_epoch)
            remote_ck = {}
            if checkpoint is not None:
                remote_ck[checkpoint.seq] = (checkpoint.epoch, checkpoint.payload)
            remote_ev = {ev.seq: (ev.epoch, ev.payload) for ev in events}
            first_seq = max(remote_seq, 1) if checkpoint is not None else 1
            # The rows the adopted records replace, and every row above the
            # point where the adopted lineage left ours (``adopted_cut``), below
            # the adopted seqs too: the lineage has its own records at those
            # seqs, so ours there are no ancestors of it. Rows at or below the
            # cut are the common ancestry and stay.
            cut = adopted_cut(local_epoch, bases)
            cut_j, cut_ck = cut if cut is not None else (covers, first_seq - 1)
            ck_rows = sorted(
                (
                    r
                    for r in _task_rows(conn, task_id, f"id, {_CKPT_COLUMNS}")
                    if r[2] > min(cut_ck, first_seq - 1)
                ),
                key=lambda r: int(r[2]),
            )
            ids = {int(r[2]): (int(r[0]), int(r[4]), int(r[2])) for r in ck_rows}
            ev_rows = conn.execute(
                "SELECT task_id, seq, epoch, created_at_ms, payload, checksum FROM journal "
                "WHERE task_id = ? AND seq > ? ORDER BY seq",
                (task_id, min(cut_j, covers)),
            ).fetchall()
            divergent_ck: list[StoredCheckpoint] = []
            same_ck: set[int] = set()
            for row in ck_rows:
                try:
                    stored = self._decode_checkpoint(row[1:])
                except CorruptedCheckpoint as err:
                    self._note_corrupt("checkpoint", err)
                    continue
                if remote_ck.get(stored.seq) == (stored.epoch, stored.payload):
                    same_ck.add(stored.seq)
                else:
                    divergent_ck.append(stored)
            divergent_ev: list[JournalEvent] = []
            same_ev: set[int] = set()
            for row in ev_rows:
                try:
                    event = self._decode_event(row)
                except CorruptedJournalEvent as err:
                    self._note_corrupt("journal", err)
                    continue
                if remote_ev.get(event.seq) == (event.epoch, event.payload):
                    same_ev.add(event.seq)
                else:
                    divergent_ev.append(event)
            lineage = ""
            if divergent_ck or divergent_ev:
                top = max([c.epoch for c in divergent_ck] + [e.epoch for e in divergent_ev])
                lineage = f"{task_id}{LINEAGE_COPY_MARK}{top}"
                n = 1
                while heads.get(conn, lineage) is not None:
                    n += 1
                    lineage = f"{task_id}{LINEAGE_COPY_MARK}{top}-{n}"
                for stored in divergent_ck:
                    info = stored.info
                    self._insert_checkpoint(
                        conn,
                        Checkpoint(
                            lineage,
                            info.epoch,
                            stored.payload,
                            info.covers_journal_seq,
                            info.terminal,
                            info.label,
                        ),
                        info.seq,
                        parent_ref=info.ref,
                    )
                for event in divergent_ev:
                    created = self._clock_ms()
                    conn.execute(
                        "INSERT INTO journal (task_id, seq, epoch, created_at_ms, payload, "
                        "checksum) VALUES (?, ?, ?, ?, ?, ?)",
                        (
                            lineage,
                            event.seq,
                            event.epoch,
                            created,
                            event.payload,
                            _journal_checksum(
                                lineage, event.seq, event.epoch, created, event.payload
                            ),
                        ),
                    )
                heads.set(
                    lineage,
                    (
                        top,
                        max((e.seq for e in divergent_ev), default=0),
                        max((c.seq for c in divergent_ck), default=0),
                    ),
                )
                _delete_checkpoints(conn, task_id, [ids[c.info.seq] for c in divergent_ck])
                conn.executemany(
                    "DELETE FROM journal WHERE task_id = ? AND seq = ?",
                    [(task_id, e.seq) for e in divergent_ev],
                )
            if checkpoint is not None and checkpoint.seq not in same_ck:
                if checkpoint.seq in ids and checkpoint.seq not in {
                    c.info.seq for c in divergent_ck
                }:  # a local row that failed its checksum holds the seq (schema 1: UNIQUE)
                    raise sqlite3.IntegrityError(
                        "UNIQUE constraint failed: checkpoints.task_id, checkpoints.seq"
                    )
                self._insert_checkpoint(
                    conn,
                    Checkpoint(
                        task_id,
                        checkpoint.epoch,
                        checkpoint.payload,
                        checkpoint.covers_journal_seq,
                        checkpoint.terminal,
                        checkpoint.label,
                    ),
                    checkpoint.seq,
                    parent_ref="",
                )
            for ev in events:
                if ev.seq in same_ev:
                    continue
                created = self._clock_ms()
                conn.execute(
                    "INSERT INTO journal (task_id, seq, epoch, created_at_ms, payload, checksum) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        task_id,
                        ev.seq,
                        ev.epoch,
                        created,
                        ev.payload,
                        _journal_checksum(task_id, ev.seq, ev.epoch, created, ev.payload),
                    ),
                )
            last_ck = max((int(r[0]) for r in _task_rows(conn, task_id, "seq")), default=0)
            last_j = conn.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM journal WHERE task_id = ?", (task_id,)
            ).fetchone()[0]
            heads.set(task_id, (epoch, max(int(last_j), previous), int(last_ck)))
            return AdoptOutcome(
                task_id,
                epoch,
                int(last_ck),
                max(int(last_j), previous),
                lineage,
                len(divergent_ck),
                len(divergent_ev),
            )

        return op

    # ------------------------------------------------------------- decoding

    def _note_corrupt(self, kind: str, err: CorruptedRecord) -> None:
        with self._state_lock:
            self._corrupted += 1
        CORRUPT_RECORDS.labels(kind=kind).inc()
        log.warning("%s (data dir %s)", err, self.data_dir)

    @staticmethod
    def _info(row: tuple[Any, ...], stored_bytes: int) -> CheckpointInfo:
        task_id, seq, epoch, covers, terminal, label, created, parent = row[:8]
        return CheckpointInfo(
            ref=make_ref(task_id, seq),
            task_id=task_id,
            seq=int(seq),
            epoch=int(epoch),
            covers_journal_seq=int(covers),
            terminal=bool(terminal),
            label=label,
            created_at_ms=int(created),
            parent_ref=parent,
            stored_bytes=stored_bytes,
        )

    def _decode_checkpoint(self, row: tuple[Any, ...]) -> StoredCheckpoint:
        task_id, seq, epoch, covers, terminal, label, created, parent, enc, stored, checksum = row
        ref = make_ref(str(task_id), int(seq))
        try:
            expected = _checkpoint_checksum(
                task_id, seq, epoch, covers, bool(terminal), label, created, parent, enc, stored
            )
        except (TypeError, ValueError) as exc:
            raise CorruptedCheckpoint(ref, f"unreadable fields: {exc}") from exc
        if not isinstance(stored, bytes) or expected != checksum:
            raise CorruptedCheckpoint(
                ref, f"checksum mismatch (stored {checksum}, computed {expected})"
            )
        try:
            payload = decode_payload(int(enc), stored)
        except ValueError as exc:
            raise CorruptedCheckpoint(ref, str(exc)) from exc
        return StoredCheckpoint(self._info(row, len(stored)), payload)

    def _decode_event(self, row: tuple[Any, ...]) -> JournalEvent:
        task_id, seq, epoch, created, payload, checksum = row
        if not isinstance(payload, bytes) or checksum != _journal_checksum(
            task_id, seq, epoch, created, payload
        ):
            raise CorruptedJournalEvent(str(task_id), int(seq), "checksum mismatch")
        return JournalEvent(str(task_id), int(seq), int(epoch), int(created), payload)

    def _newest_valid(
        self, task_id: str, rows: Generator[tuple[tuple[int, int], tuple[Any, ...]], None, None]
    ) -> StoredCheckpoint | None:
        """The first row of ``rows`` (``_newest_first``) that verifies; the rest unread."""
        try:
            for (covers, seq), row in rows:
                try:
                    _check_key(row, task_id, seq, covers)
                    return self._decode_checkpoint(row)
                except CorruptedCheckpoint as err:
                    self._note_corrupt("checkpoint", err)
            return None
        finally:
            rows.close()  # its cursors, before the read transaction ends

    # ------------------------------------------------------------- sync API

    def save(self, checkpoint: Checkpoint) -> SaveOutcome:
        """Store a checkpoint durably (per the store's durability mode).

        Args:
            checkpoint: what to save; its ``epoch`` fences out older owners.

        Returns:
            ``SaveOutcome(ref, seq, covers_journal_seq, terminal)``.

        Raises:
            InvalidArgument: a malformed field, named (INVALID_ARGUMENT).
            FutureJournalSeq: covers a journal seq not yet appended (OUT_OF_RANGE).
            StaleEpoch: the task already has a newer epoch (FAILED_PRECONDITION).
            StoreIOError: the commit failed; nothing was saved (UNAVAILABLE).
            StoreClosed: the store is closed (UNAVAILABLE).
        """
        fn = self._save_op(checkpoint)
        return self._call(fn, _row_pages(len(checkpoint.payload)))

    def ingest(
        self, items: Sequence[tuple[Checkpoint, int, int]]
    ) -> builtins.list[SaveOutcome | CheckpointStoreError | None]:
        """Store checkpoints committed elsewhere under the seqs they were given, in one commit.

        For checkpoints a worker process spooled (``node_agent.spool``): it
        numbered them from the task's head (``task_head``) while it alone wrote
        the task. Each item is ``(checkpoint, seq, created_at_ms)``, in commit
        order; each is checked as ``save`` checks (epoch fence, covered journal)
        and stored as the task's next seq, which is ``seq`` unless the task's
        head moved meanwhile (then the outcome names the seq it got).

        Returns:
            Per item, in order: its ``SaveOutcome``; ``None`` when the store
            already holds it (the same epoch, covers, label and creation time
            at that seq: ingested before); or the refusal, not raised:
            ``StaleEpoch`` (a newer epoch wrote the task), ``FutureJournalSeq``.

        Raises:
            InvalidArgument: a malformed checkpoint (INVALID_ARGUMENT).
            StoreIOError: the commit failed; nothing was stored (UNAVAILABLE).
            StoreClosed: the store is closed (UNAVAILABLE).
        """
        if not items:
            return []
        fn = self._ingest_op(items)
        return self._call(fn, sum(_row_pages(len(cp.payload)) for cp, _, _ in items))

    def task_head(self, task_id: str) -> TaskHead | None:
        """The task's newest epoch and seqs (as ``task_heads``), or None when unknown."""
        with self._read_txn() as conn:
            row = conn.execute(_TASK_HEAD, (task_id,)).fetchone()
        return TaskHead(row[0], int(row[1]), int(row[2]), int(row[3])) if row else None

    def append(self, task_id: str, event: bytes, *, epoch: int) -> int:
        """Append an event to a task's journal.

        Args:
            task_id: the task.
            event: the event's bytes (at most ``max_payload_bytes``).
            epoch: the writer's epoch.

        Returns:
            The event's journal seq (1 for a task's first event).

        Raises:
            InvalidArgument, StaleEpoch, StoreIOError, StoreClosed: as ``save``.
        """
        fn = self._append_op(task_id, event, epoch)
        return self._call(fn, _row_pages(len(event)))

    def load(self, ref: str) -> StoredCheckpoint:
        """Return the checkpoint with this ref.

        Raises:
            InvalidArgument: malformed ref (INVALID_ARGUMENT).
            UnknownCheckpoint: no such checkpoint (NOT_FOUND).
            CorruptedCheckpoint: it failed verification (DATA_LOSS).
        """
        task_id, seq = parse_ref(ref)
        with self._read_txn() as conn:
            row = _row_at(conn, task_id, seq)
            if row is None:
                raise UnknownCheckpoint(ref)
            try:
                _check_key(row, task_id, seq)
                return self._decode_checkpoint(row)
            except CorruptedCheckpoint as err:
                self._note_corrupt("checkpoint", err)
                raise

    def load_latest(self, task_id: str) -> StoredCheckpoint | None:
        """Return the task's newest valid checkpoint, or None.

        "Newest" orders by (covers_journal_seq, seq). Corrupt checkpoints are
        counted, logged and skipped.

        Raises:
            InvalidArgument: malformed task id (INVALID_ARGUMENT).
        """
        validate_task_id(task_id)
        with self._read_txn() as conn:
            return self._newest_valid(task_id, _newest_first(conn, task_id))

    def load_at_or_before(self, task_id: str, journal_seq: int) -> StoredCheckpoint | None:
        """Return the newest valid checkpoint covering at most ``journal_seq``.

        Raises:
            InvalidArgument: malformed task id or negative seq (INVALID_ARGUMENT).
        """
        validate_task_id(task_id)
        validate_seq(journal_seq, "journal_seq")
        with self._read_txn() as conn:
            return self._newest_valid(task_id, _newest_first(conn, task_id, journal_seq))

    def list(self, task_id: str) -> InfoList:
        """Return the task's checkpoints' metadata, oldest first (by covers, then seq).

        Payloads are not read, so this does not verify checksums (``verify`` does).

        Raises:
            InvalidArgument: malformed task id (INVALID_ARGUMENT).
        """
        validate_task_id(task_id)
        with self._read_txn() as conn:
            rows = _task_rows(
                conn,
                task_id,
                "task_id, seq, epoch, covers_journal_seq, terminal, label, created_at_ms, "
                "parent_ref, length(payload)",
            )
        rows = sorted((r for r in rows if r[0] == task_id), key=lambda r: (r[3], r[1]))
        return [self._info(r, int(r[8])) for r in rows]

    def prune(self, task_id: str, policy: PrunePolicy) -> PruneReport:
        """Delete the task's checkpoints that cover less than the policy's cutoff.

        With ``policy.prune_seq_before`` those covering exactly the cutoff with a
        lower seq go too: the cutoff is ``(covers_journal_seq, seq)``.

        Returns:
            What was deleted and kept (``PruneReport``).

        Raises:
            InvalidArgument: malformed task id or policy (INVALID_ARGUMENT).
        """
        return self._call(self._prune_op(task_id, policy))

    def fork(
        self,
        from_ref: str,
        edits: Mapping[str, Any] | None = None,
        *,
        new_task_id: str | None = None,
    ) -> str:
        """Start a new task from a checkpoint, optionally editing its state.

        The new task's first checkpoint (seq 1, covering journal seq 0, same
        epoch) holds the source's state with ``edits`` applied key by key, which
        needs a JSON-object payload; its ``parent_ref`` is ``from_ref``.

        Args:
            from_ref: the checkpoint to fork from.
            edits: top-level keys to set in the JSON state, or None for none.
            new_task_id: the new task's id; default ``<task>.fork-<random>``.

        Returns:
            The new task's id.

        Raises:
            InvalidArgument: malformed ref or edits, or edits on a non-object state.
            UnknownCheckpoint: no such checkpoint (NOT_FOUND).
            CorruptedCheckpoint: the source failed verification (DATA_LOSS).
            TaskExists: ``new_task_id`` is taken (ALREADY_EXISTS).
        """
        return self._call(self._fork_op(from_ref, edits, new_task_id))

    def put_meta(self, task_id: str, meta: bytes) -> None:
        """Store a small opaque blob about the task (the node agent keeps its view there).

        Written through the same writer and durability as checkpoints. ``forget``
        deletes it with the rest of the task.

        Raises:
            InvalidArgument: malformed task id, or meta not bytes / too large.
        """
        self._call(self._put_meta_op(task_id, meta))

    def take_holder(self, incarnation: str) -> StoreHolder:
        """Record ``incarnation`` as the process holding this store's exclusive lock.

        Called once by a node agent after it opened the store. The store id is
        created on first use and never changes; the previous holder is the
        incarnation recorded by the process that held the lock before. Since
        the lock is an ``flock`` released when its process dies, a previous
        holder named here has stopped: on one host that is the proof of a
        restart in place (DESIGN.md §4). It says nothing about a process on
        another host that opened a copy of the files, so a data directory must
        never be shared or copied between hosts while an agent runs on it.

        Args:
            incarnation: the new holder's incarnation id, non-empty.

        Returns:
            The store id and the previous holder ("" for a new store).

        Raises:
            InvalidArgument: an empty incarnation.
        """
        if not incarnation:
            raise InvalidArgument("incarnation", "must not be empty")

        def op(conn: sqlite3.Connection, heads: _Heads) -> StoreHolder:
            rows = dict(
                conn.execute(
                    "SELECT key, value FROM meta WHERE key IN ('store_id', 'holder_incarnation')"
                ).fetchall()
            )
            store_id = str(rows.get("store_id") or uuid.uuid4().hex)
            previous = str(rows.get("holder_incarnation") or "")
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('store_id', ?), ('holder_incarnation', ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (store_id, incarnation),
            )
            return StoreHolder(store_id, previous)

        return self._call(op)

    def metas(self) -> dict[str, bytes]:
        """Every task's meta blob, by task id."""
        with self._read_txn() as conn:
            rows = conn.execute("SELECT task_id, meta FROM task_meta ORDER BY task_id").fetchall()
        return {str(r[0]): bytes(r[1]) for r in rows}

    def forget(self, task_id: str) -> None:
        """Delete every record of the task: checkpoints, journal, head and meta.

        For a task whose outcome the coordinator acknowledged; idempotent.

        Raises:
            InvalidArgument: malformed task id.
        """
        self._call(self._forget_op(task_id))

    def adopt(
        self,
        task_id: str,
        *,
        epoch: int,
        checkpoint: AdoptedCheckpoint | None,
        events: Sequence[AdoptedEvent] = (),
        bases: Mapping[int, tuple[int, int]] | None = None,
    ) -> AdoptOutcome:
        """Take another replica's newer lineage of a task (read from Redis) as ours.

        After a move the new owner continues the task's numbering: the adopted
        checkpoint keeps its seq, the events their seqs, so the next ``save``
        and ``append`` follow them and every replica agrees on what seq N is.
        Local rows the adopted lineage does not contain are not lost: the rows
        it replaces (checkpoints with seq >= the adopted one, events after its
        covers_journal_seq) that differ from it, and with ``bases`` every row
        above the point where it left ours (``lineage.adopted_cut``: the old
        owner's seq 2 when the newer epoch resumed from seq 1, whatever seq it
        adopts now). They are moved, re-checksummed, to a lineage task
        ``<task_id>~lineage-e<epoch>`` (``parent_ref`` names each original, the
        seqs are kept) and the outcome reports them — the fork of DESIGN.md §7;
        the task keeps the common ancestry and the adopted rows. The copy has no
        meta; the agent reports it as a fork and forgets it once the leader
        acknowledged it (``node_agent.core.core``, **Forgetting a lineage copy**;
        ``lineage_copy_of`` tells a copy's name).

        Args:
            task_id: the task.
            epoch: the adopting owner's epoch (>= the stored epoch).
            checkpoint: the newest checkpoint of the lineage, or None.
            events: the journal events after its covers_journal_seq, contiguous.
            bases: epoch -> (journal seq, checkpoint seq) where each epoch that
                claimed the task in Redis started (``RemoteState.bases``); None
                or empty when unknown: then only replaced rows can diverge.

        Raises:
            InvalidArgument: malformed arguments (the field is named).
            StaleEpoch: ``epoch`` is older than the task's stored epoch.
        """
        return self._call(self._adopt_op(task_id, epoch, checkpoint, events, bases))

    def replay(self, task_id: str, after_seq: int = 0) -> EventList:
        """Return the task's journal events with seq > ``after_seq``, in order.

        Raises:
            InvalidArgument: malformed task id or negative seq (INVALID_ARGUMENT).
            CorruptedJournalEvent: an event failed verification (DATA_LOSS).
        """
        validate_task_id(task_id)
        validate_seq(after_seq, "after_seq")
        with self._read_txn() as conn:
            return self._replay(conn, task_id, after_seq)

    def _replay(self, conn: sqlite3.Connection, task_id: str, after_seq: int) -> EventList:
        rows = conn.execute(
            "SELECT task_id, seq, epoch, created_at_ms, payload, checksum FROM journal "
            "WHERE task_id = ? AND seq > ? ORDER BY seq",
            (task_id, after_seq),
        )
        events = []
        for row in rows:
            try:
                events.append(self._decode_event(row))
            except CorruptedJournalEvent as err:
                self._note_corrupt("journal", err)
                raise
        return events

    def recover(self, task_id: str) -> Recovery:
        """Return what the task resumes from: newest valid checkpoint + later events.

        Read in one snapshot, so a concurrent writer cannot tear the pair.

        Raises:
            InvalidArgument: malformed task id (INVALID_ARGUMENT).
            CorruptedJournalEvent: an event after the checkpoint failed (DATA_LOSS).
        """
        validate_task_id(task_id)
        with self._read_txn() as conn:
            checkpoint = self._newest_valid(task_id, _newest_first(conn, task_id))
            after = 0 if checkpoint is None else checkpoint.covers_journal_seq
            return Recovery(checkpoint, self._replay(conn, task_id, after))

    def task_heads(self) -> builtins.list[TaskHead]:
        """Return every task the store holds with its newest epoch and seqs, by task id."""
        with self._read_txn() as conn:
            rows = conn.execute(_TASK_HEADS).fetchall()
        return [TaskHead(r[0], int(r[1]), int(r[2]), int(r[3])) for r in rows]

    def verify(self) -> VerifyReport:
        """Check every stored record against its checksum (for operators and tests)."""
        bad_refs: list[str] = []
        bad_events: list[tuple[str, int]] = []
        n_ckpt = n_evt = 0
        with self._read_txn() as conn:
            for row in conn.execute(f"SELECT {_CKPT_COLUMNS} FROM checkpoints"):
                n_ckpt += 1
                try:
                    self._decode_checkpoint(row)
                except CorruptedCheckpoint as err:
                    self._note_corrupt("checkpoint", err)
                    bad_refs.append(err.ref)
            for row in conn.execute(
                "SELECT task_id, seq, epoch, created_at_ms, payload, checksum FROM journal"
            ):
                n_evt += 1
                try:
                    self._decode_event(row)
                except CorruptedJournalEvent as err:
                    self._note_corrupt("journal", err)
                    bad_events.append((err.task_id, err.seq))
        return VerifyReport(n_ckpt, n_evt, tuple(bad_refs), tuple(bad_events))

    @property
    def corrupted_records(self) -> int:
        """Corrupt records met by this store object since it was opened."""
        return self._corrupted

    @property
    def commits(self) -> int:
        """Transactions the writer has finished (GROUP mode shares one among many writes)."""
        return self._commits

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Finish queued writes, then close every connection and release the data dir.

        Idempotent. Later calls raise ``StoreClosed``.
        """
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_STOP)
        self._writer.join()
        self._fail_pending(StoreClosed())
        if self._read_pool is not None:
            self._read_pool.shutdown(wait=True)
        with self._state_lock:
            readers, self._readers = self._readers, []
        for conn in readers:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        self._release_dir_lock()

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _pool(self) -> ThreadPoolExecutor:
        with self._state_lock:
            if self._closed:
                raise StoreClosed()
            if self._read_pool is None:
                self._read_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ckpt-read")
            return self._read_pool


@dataclass(frozen=True, slots=True)
class StoreHolder:
    """Who holds a local store (``CheckpointStore.take_holder``).

    Attributes:
        store_id: stable id of the store, 32 hex digits.
        previous_incarnation: the incarnation that held its lock before; "" for a new store.
    """

    store_id: str
    previous_incarnation: str


class AsyncCheckpointStore:
    """The asyncio face of a ``CheckpointStore`` (``store.aio``).

    Same methods, same errors, as coroutines. Writes await the writer thread's
    future; reads run on a thread pool. Argument validation runs on the loop,
    and so does one kind of write: a lone ``save`` / ``append`` of at most
    16 KiB while the writer is idle and nothing else is ready on the loop
    commits inline, blocking the loop for that commit (about 0.2 ms for 1 KiB;
    see ``CheckpointStore._commit_inline``). Nothing else blocks the loop.
    """

    def __init__(self, store: CheckpointStore) -> None:
        self._store = store

    @property
    def store(self) -> CheckpointStore:
        return self._store

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._store._pool(), fn, *args)

    async def save(self, checkpoint: Checkpoint) -> SaveOutcome:
        """See ``CheckpointStore.save``.

        A lone small save on an otherwise idle loop may commit on the loop
        itself, blocking it for that commit (see ``CheckpointStore._commit_inline``).
        """
        store = self._store
        fn = store._save_op(checkpoint)
        size = len(checkpoint.payload)
        loop = asyncio.get_running_loop()
        pending = store._loop_pending.get(loop)
        if pending is not None and not store._closed:
            # not the loop's first write in this iteration: it joins the loop's
            # list (``_asubmit`` and ``_row_pages``, spelled out: this is the
            # path of most saves)
            fut: asyncio.Future[SaveOutcome] = loop.create_future()
            pending.append(_Op(fn, None, loop, fut, 1 + size // 4000))
            return await fut
        if size > _INLINE_MAX_BYTES:
            return await store._asubmit(fn, _row_pages(size))
        return await store._acall_small(fn, _row_pages(size))

    async def append(self, task_id: str, event: bytes, *, epoch: int) -> int:
        """See ``CheckpointStore.append`` (and ``save`` for where it commits)."""
        store = self._store
        fn = store._append_op(task_id, event, epoch)
        size = len(event)
        if size > _INLINE_MAX_BYTES:
            return await store._asubmit(fn, _row_pages(size))
        if asyncio.get_running_loop() not in store._loop_pending:
            return await store._acall_small(fn, _row_pages(size))
        return await store._asubmit(fn, _row_pages(size))

    async def prune(self, task_id: str, policy: PrunePolicy) -> PruneReport:
        """See ``CheckpointStore.prune``."""
        return await self._store._acall(self._store._prune_op(task_id, policy))

    async def fork(
        self,
        from_ref: str,
        edits: Mapping[str, Any] | None = None,
        *,
        new_task_id: str | None = None,
    ) -> str:
        """See ``CheckpointStore.fork``."""
        return await self._store._acall(self._store._fork_op(from_ref, edits, new_task_id))

    async def put_meta(self, task_id: str, meta: bytes) -> None:
        """See ``CheckpointStore.put_meta``."""
        await self._store._acall(self._store._put_meta_op(task_id, meta))

    async def metas(self) -> dict[str, bytes]:
        """See ``CheckpointStore.metas``."""
        return await self._read(self._store.metas)

    async def forget(self, task_id: str) -> None:
        """See ``CheckpointStore.forget``."""
        await self._store._acall(self._store._forget_op(task_id))

    async def adopt(
        self,
        task_id: str,
        *,
        epoch: int,
        checkpoint: AdoptedCheckpoint | None,
        events: Sequence[AdoptedEvent] = (),
        bases: Mapping[int, tuple[int, int]] | None = None,
    ) -> AdoptOutcome:
        """See ``CheckpointStore.adopt``."""
        return await self._store._acall(
            self._store._adopt_op(task_id, epoch, checkpoint, events, bases)
        )

    async def load(self, ref: str) -> StoredCheckpoint:
        """See ``CheckpointStore.load``."""
        parse_ref(ref)
        return await self._read(self._store.load, ref)

    async def load_latest(self, task_id: str) -> StoredCheckpoint | None:
        """See ``CheckpointStore.load_latest``."""
        validate_task_id(task_id)
        return await self._read(self._store.load_latest, task_id)

    async def load_at_or_before(self, task_id: str, journal_seq: int) -> StoredCheckpoint | None:
        """See ``CheckpointStore.load_at_or_before``."""
        validate_task_id(task_id)
        validate_seq(journal_seq, "journal_seq")
        return await self._read(self._store.load_at_or_before, task_id, journal_seq)

    async def list(self, task_id: str) -> InfoList:
        """See ``CheckpointStore.list``."""
        validate_task_id(task_id)
        return await self._read(self._store.list, task_id)

    async def replay(self, task_id: str, after_seq: int = 0) -> EventList:
        """See ``CheckpointStore.replay``."""
        validate_task_id(task_id)
        validate_seq(after_seq, "after_seq")
        return await self._read(self._store.replay, task_id, after_seq)

    async def recover(self, task_id: str) -> Recovery:
        """See ``CheckpointStore.recover``."""
        validate_task_id(task_id)
        return await self._read(self._store.recover, task_id)

    async def task_heads(self) -> builtins.list[TaskHead]:
        """See ``CheckpointStore.task_heads``."""
        return await self._read(self._store.task_heads)

    async def close(self) -> None:
        """Close the store without blocking the loop while queued writes finish."""
        await asyncio.to_thread(self._store.close)


__all__ = [
    "LINEAGE_COPY_MARK",
    "AsyncCheckpointStore",
    "CheckpointStore",
    "CheckpointStoreError",
    "StoreHolder",
    "VerifyReport",
    "lineage_copy_of",
]
