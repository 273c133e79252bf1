"""The checkpoint spool: a worker process commits a ``local`` checkpoint itself.

Theory of operation: with ``isolation="process"`` a handler's ``ctx.checkpoint``
used to travel to the agent (pickled over the worker's pipe), be committed by a
relay thread there and answered back: two process wake-ups, a thread taking
the agent's GIL beside the busy handlers, and ~0.6 ms of agent CPU per
checkpoint on a 2-core machine full of CPU-bound handlers
(``bench/taskpath_bench.py``). For a task whose checkpoints promise only the
local disk (``durability="local"``), the worker now commits the checkpoint
into a small SQLite file of its own, the **spool** (WAL, ``synchronous=FULL``:
fsynced before ``checkpoint`` returns, the same promise as the agent's store),
and the agent moves spooled checkpoints into its store later, in batches
(``TaskRunner`` *ingests* them):

    worker                                   agent
    ctx.checkpoint(state)
      ownership checked (shared deadline, parent alive)
      INSERT + COMMIT (fsync) into spool ──▶ (nothing: no message, no wake-up)
      ownership checked again, seq returned
                                             every ~0.4 s (rows its worker wrote
                                             to Redis: every 1 s or 2 s, see
                                             core.spooled.ingest_now), at every
                                             other context call of the run,
                                             when the run ends
                                             and when its worker dies: read the
                                             spool, commit the rows to the store
                                             (epoch and seq checked, one
                                             transaction), delete them from the
                                             spool, hand the newest to Redis

A spool row carries what the store needs to check it: task, epoch, the seq the
worker assigned (the task's head seq at the run's start, plus one per
checkpoint: only the worker writes the task's checkpoints while it runs), the
journal seq it covers, and a CRC-32C over all of it. Ingestion refuses a row
of an older epoch than the store's (the run was superseded: it is stopped) and
a row whose seq is not the next one (a bug: logged and counted); a row at or
below the store's head is one already ingested (a crash between the store's
commit and the spool's delete) and is dropped.

A ``replicated`` task's checkpoints are spooled the same way; the worker then
writes each to Redis itself and tells the agent, through its shared array,
which seq Redis holds (``node_agent.isolation``): the agent reports those as
replicated when it ingests them, and ships any other row itself.

The spool lives in ``<data_dir>/spool/``, one file per worker process. An
agent that starts ingests every file it finds there before anything else reads
its store, then deletes them: a checkpoint a worker of a crashed agent
acknowledged is not lost. Such an orphaned worker stops at its next context
call (its parent process changed), so no row is written after that ingestion.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import google_crc32c

from lazarus.storage.errors import StoreIOError
from lazarus.v1 import records_pb2
from node_agent.checkpoint.model import make_ref

__all__ = [
    "SPOOL_DIRNAME",
    "SpoolReader",
    "SpoolRow",
    "SpoolWriter",
    "checkpoint_record",
    "encode_json",
    "leftover_spools",
    "spool_checksum",
]

log = logging.getLogger("lazarus.spool")

JSON_CONTENT_TYPE = "application/json"
"""The content type of a checkpoint state the SDK encoded (``encode_json``)."""

SPOOL_DIRNAME = "spool"
"""The directory under the agent's data dir that holds the workers' spool files."""

_SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS spool (
    id                 INTEGER PRIMARY KEY,
    task_id            TEXT NOT NULL,
    epoch              INTEGER NOT NULL,
    seq                INTEGER NOT NULL,
    covers_journal_seq INTEGER NOT NULL,
    label              TEXT NOT NULL,
    created_at_ms      INTEGER NOT NULL,
    payload            BLOB NOT NULL,
    checksum           INTEGER NOT NULL
)
"""
_COLUMNS = "id, task_id, epoch, seq, covers_journal_seq, label, created_at_ms, payload"
_HEAD = struct.Struct("<qqqq")


def encode_json(value: object, what: str) -> bytes:
    """A checkpoint state or journal event as the store keeps it: compact, sorted JSON.

    Raises:
        TypeError: not JSON-serialisable (a NaN included), naming ``what``.
    """
    try:
        return json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} is not JSON-serialisable: {exc}") from exc


def checkpoint_record(
    task_id: str,
    epoch: int,
    seq: int,
    covers: int,
    payload: bytes,
    *,
    label: str,
    terminal: bool,
    created_ms: int,
    node_id: str,
    incarnation: str,
) -> records_pb2.CheckpointRecord:
    """The Redis copy of a checkpoint whose state is JSON (``encode_json``).

    One shape for every writer of it: the agent (``TaskRunner._saved``) and a
    worker process writing its spooled checkpoints itself
    (``node_agent.isolation``). ``checkpoint_ref`` is the store's
    (``make_ref(task_id, seq)``); ``label`` is cut to 128 characters.
    """
    return records_pb2.CheckpointRecord(
        task_id=task_id,
        epoch=epoch,
        seq=seq,
        covers_journal_seq=covers,
        checkpoint_ref=make_ref(task_id, seq),
        terminal=terminal,
        label=label[:128],
        payload=payload,
        encoding=records_pb2.PAYLOAD_ENCODING_RAW,
        content_type=JSON_CONTENT_TYPE,
        decoded_bytes=len(payload),
        created_at_unix_ms=created_ms,
        node_id=node_id,
        incarnation=incarnation,
    )


def spool_checksum(
    task_id: str, epoch: int, seq: int, covers: int, label: str, created_ms: int, payload: bytes
) -> int:
    """CRC-32C of a spool row's fields (what ingestion verifies before it trusts the row)."""
    crc = google_crc32c.value(task_id.encode() + b"\0" + label.encode() + b"\0")
    crc = google_crc32c.extend(crc, _HEAD.pack(epoch, seq, covers, created_ms))
    return int(google_crc32c.extend(crc, payload))


@dataclass(frozen=True, slots=True)
class SpoolRow:
    """One spooled checkpoint, as the agent reads it.

    Attributes:
        id: the row's id in its spool file (grows).
        task_id, epoch, seq, covers_journal_seq, label: the checkpoint's fields.
        created_at_ms: wall-clock time of the commit, Unix ms.
        payload: the encoded state (JSON bytes).
        intact: whether the row matches its checksum.
    """

    id: int
    task_id: str
    epoch: int
    seq: int
    covers_journal_seq: int
    label: str
    created_at_ms: int
    payload: bytes
    intact: bool


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


class SpoolWriter:
    """The worker's end: appends checkpoints to its spool file, one fsynced commit each.

    Args:
        path: the spool file (created with its directory).

    Raises:
        sqlite3.Error: the file cannot be opened or created.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._conn = _connect(path)
        self._conn.execute(_SCHEMA)
        self._conn.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")

    def append(
        self, task_id: str, epoch: int, seq: int, covers: int, label: str, payload: bytes
    ) -> int:
        """Commit one checkpoint durably (returns after the fsync).

        Returns:
            The row's creation time, Unix ms (what the agent's copy will carry).

        Raises:
            StoreIOError: the commit failed (a full disk, an I/O error); nothing
                was saved.
        """
        created = time.time_ns() // 1_000_000
        crc = spool_checksum(task_id, epoch, seq, covers, label, created, payload)
        # One statement in autocommit mode: its own transaction, fsynced at its end.
        try:
            self._conn.execute(
                "INSERT INTO spool (task_id, epoch, seq, covers_journal_seq, label, "
                "created_at_ms, payload, checksum) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (task_id, epoch, seq, covers, label, created, payload, crc),
            )
        except sqlite3.Error as exc:
            raise StoreIOError(
                f"{self.path}: checkpoint commit failed, nothing of it was saved: {exc}"
            ) from exc
        return created

    def close(self) -> None:
        """Close the file."""
        with contextlib.suppress(sqlite3.Error):
            self._conn.close()


class SpoolReader:
    """The agent's end of one spool file: read rows in order, delete ingested ones.

    Not thread-safe: its caller serialises access (one lock per worker).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None

    def _open(self) -> sqlite3.Connection | None:
        if self._conn is None:
            if not self.path.exists():
                return None  # the worker has not created it yet: nothing spooled
            self._conn = _connect(self.path)
            self._conn.execute("PRAGMA synchronous=OFF")  # deletes need no fsync
        return self._conn

    def read(self, limit: int = 10_000) -> list[SpoolRow]:
        """The rows still in the spool, oldest first (at most ``limit``)."""
        conn = self._open()
        if conn is None:
            return []
        try:
            rows = conn.execute(
                f"SELECT {_COLUMNS}, checksum FROM spool ORDER BY id LIMIT ?", (limit,)
            ).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []
            raise
        out = []
        for r in rows:
            intact = r[8] == spool_checksum(r[1], r[2], r[3], r[4], r[5], r[6], r[7])
            out.append(SpoolRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], intact))
        return out

    def delete_through(self, row_id: int) -> None:
        """Delete every row up to ``row_id`` (ingested: the store holds them durably)."""
        conn = self._open()
        if conn is not None:
            conn.execute("DELETE FROM spool WHERE id <= ?", (row_id,))

    def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None

    def remove(self) -> None:
        """Close and delete the file (its rows were ingested; its worker is dead)."""
        self.close()
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.path}{suffix}")


def leftover_spools(spool_dir: Path) -> Iterator[Path]:
    """The spool files in ``spool_dir`` (left by workers of an earlier agent process)."""
    if not spool_dir.is_dir():
        return iter(())
    return iter(sorted(p for p in spool_dir.iterdir() if p.suffix == ".db"))
