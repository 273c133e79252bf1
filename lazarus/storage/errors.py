"""Typed errors of the checkpoint store.

Errors split as h11 splits them: the caller misused the store
(:class:`InvalidArgument` and its kin, fix the call) versus the store found
bad bytes on disk (:class:`CorruptedRecord`, report and fall back). Each error
names the gRPC status it maps to in ``grpc_code`` so adapters translate without
deciding anything.
"""

from __future__ import annotations


class CheckpointStoreError(Exception):
    """Base class of every error the checkpoint store raises.

    Attributes:
        grpc_code: name of the ``grpc.StatusCode`` this error maps to.
    """

    grpc_code: str = "INTERNAL"


class InvalidArgument(CheckpointStoreError, ValueError):
    """A request field is malformed (maps to INVALID_ARGUMENT).

    Attributes:
        field: the offending field's name, e.g. ``"task_id"``.
    """

    grpc_code = "INVALID_ARGUMENT"

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class FutureJournalSeq(InvalidArgument):
    """A checkpoint claims to cover journal events that were never appended.

    Maps to OUT_OF_RANGE: the seq is well-formed but past the journal's end.
    """

    grpc_code = "OUT_OF_RANGE"

    def __init__(self, task_id: str, covers_journal_seq: int, newest_journal_seq: int) -> None:
        self.task_id = task_id
        self.covers_journal_seq = covers_journal_seq
        self.newest_journal_seq = newest_journal_seq
        super().__init__(
            "covers_journal_seq",
            f"{covers_journal_seq} is beyond the newest appended journal seq "
            f"{newest_journal_seq} of task {task_id!r}; append the events first",
        )


class StaleEpoch(CheckpointStoreError):
    """A write carries an epoch older than the newest stored for its task.

    This is the fencing rule of DESIGN.md §4: a deposed owner's writes are
    refused. Maps to FAILED_PRECONDITION.
    """

    grpc_code = "FAILED_PRECONDITION"

    def __init__(self, task_id: str, epoch: int, current_epoch: int) -> None:
        self.task_id = task_id
        self.epoch = epoch
        self.current_epoch = current_epoch
        super().__init__(
            f"task {task_id!r}: write at epoch {epoch} refused, the store already holds "
            f"epoch {current_epoch} (this owner was fenced)"
        )


class UnknownCheckpoint(CheckpointStoreError, LookupError):
    """No checkpoint has the given ref (maps to NOT_FOUND)."""

    grpc_code = "NOT_FOUND"

    def __init__(self, ref: str) -> None:
        self.ref = ref
        super().__init__(f"ref: no checkpoint {ref!r}")


class TaskExists(CheckpointStoreError):
    """A fork asked for a task id that is already in use (maps to ALREADY_EXISTS)."""

    grpc_code = "ALREADY_EXISTS"

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        super().__init__(f"new_task_id: task {task_id!r} already exists")


class CorruptedRecord(CheckpointStoreError):
    """A stored record failed its checksum or could not be decoded (maps to DATA_LOSS)."""

    grpc_code = "DATA_LOSS"

    def __init__(self, what: str, detail: str) -> None:
        self.what = what
        self.detail = detail
        super().__init__(f"{what} is corrupted: {detail}")


class CorruptedCheckpoint(CorruptedRecord):
    """A checkpoint record failed verification; ``load_latest`` skips past it."""

    def __init__(self, ref: str, detail: str) -> None:
        self.ref = ref
        super().__init__(f"checkpoint {ref!r}", detail)


class CorruptedJournalEvent(CorruptedRecord):
    """A journal event failed verification; replay cannot skip it without reordering."""

    def __init__(self, task_id: str, seq: int, detail: str) -> None:
        self.task_id = task_id
        self.seq = seq
        super().__init__(f"journal event {task_id!r}#{seq}", detail)


class StoreClosed(CheckpointStoreError):
    """The store was closed; open it again (maps to UNAVAILABLE)."""

    grpc_code = "UNAVAILABLE"

    def __init__(self) -> None:
        super().__init__("the checkpoint store is closed")


class StoreLocked(CheckpointStoreError):
    """Another process holds the data directory (maps to FAILED_PRECONDITION)."""

    grpc_code = "FAILED_PRECONDITION"

    def __init__(self, path: str, holder: str) -> None:
        self.path = path
        super().__init__(
            f"data directory lock {path} is held by {holder}; one node agent per data "
            "directory — stop the other process or pick another --data-dir"
        )


class StoreIOError(CheckpointStoreError, OSError):
    """SQLite failed to commit (disk full, I/O error); nothing of the batch was saved.

    Maps to UNAVAILABLE: the caller may retry once the disk recovers.
    """

    grpc_code = "UNAVAILABLE"
