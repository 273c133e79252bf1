"""Durable local checkpoint store of the node agent (DESIGN.md §8).

Quick use::

    from node_agent.checkpoint import Checkpoint, CheckpointStore, JsonCodec

    with CheckpointStore("/var/lib/lazarus", durability="group") as store:
        seq = store.append("task-1", b"item 1 done", epoch=1)
        store.save(Checkpoint("task-1", epoch=1, payload=JsonCodec.encode({"n": 1}),
                              covers_journal_seq=seq))
        recovery = store.recover("task-1")   # newest checkpoint + events after it

In asyncio code use ``store.aio`` (same methods, awaitable; only a lone small
write on an idle loop commits on the loop, about 0.2 ms, see ``store.py``).
"""

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
from node_agent.checkpoint.codec import JsonCodec
from node_agent.checkpoint.model import (
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
)
from node_agent.checkpoint.store import (
    DB_FILENAME,
    AsyncCheckpointStore,
    CheckpointStore,
    VerifyReport,
)

__all__ = [
    "DB_FILENAME",
    "AdoptOutcome",
    "AdoptedCheckpoint",
    "AdoptedEvent",
    "AsyncCheckpointStore",
    "Checkpoint",
    "CheckpointInfo",
    "CheckpointStore",
    "CheckpointStoreError",
    "Compression",
    "CorruptedCheckpoint",
    "CorruptedJournalEvent",
    "CorruptedRecord",
    "Durability",
    "FutureJournalSeq",
    "InvalidArgument",
    "JournalEvent",
    "JsonCodec",
    "PrunePolicy",
    "PruneReport",
    "Recovery",
    "SaveOutcome",
    "StaleEpoch",
    "StoreClosed",
    "StoreIOError",
    "StoreLocked",
    "StoredCheckpoint",
    "TaskExists",
    "TaskHead",
    "UnknownCheckpoint",
    "VerifyReport",
    "make_ref",
    "parse_ref",
]
