"""The checkpoint store refuses an SQLite that lacks what its schema needs."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from lazarus.storage.errors import StoreIOError
from node_agent.checkpoint import Checkpoint, CheckpointStore


def _without_json(conn: sqlite3.Connection) -> sqlite3.Connection:
    """As an SQLite built without the JSON functions answers: the call fails."""

    def authorize(action: int, arg1: str | None, arg2: str | None, *_: object) -> int:
        if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").startswith("json"):
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    conn.set_authorizer(authorize)
    return conn


def test_an_sqlite_without_json_functions_is_refused_with_a_readable_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = CheckpointStore._connect
    monkeypatch.setattr(CheckpointStore, "_connect", lambda self: _without_json(original(self)))
    with pytest.raises(StoreIOError, match="lacks the JSON functions"):
        CheckpointStore(tmp_path / "s")
    monkeypatch.undo()
    # The refusal left nothing half-open: the directory lock is free, the store opens.
    with CheckpointStore(tmp_path / "s") as store:
        store.save(Checkpoint("t", 1, b"{}"))
        assert store.load_latest("t") is not None
