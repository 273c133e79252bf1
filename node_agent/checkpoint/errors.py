"""The checkpoint store's errors; defined in :mod:`lazarus.storage.errors`.

They are shared with the Redis replica and the coordinator, which must not
import the node agent; this module keeps the store's own import path.
"""

from __future__ import annotations

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

__all__ = [
    "CheckpointStoreError",
    "CorruptedCheckpoint",
    "CorruptedJournalEvent",
    "CorruptedRecord",
    "FutureJournalSeq",
    "InvalidArgument",
    "StaleEpoch",
    "StoreClosed",
    "StoreIOError",
    "StoreLocked",
    "TaskExists",
    "UnknownCheckpoint",
]
