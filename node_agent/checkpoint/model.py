"""Value types of the checkpoint store and the validation of their fields.

Shapes follow the seeds in ``shared/reference/`` (checkpoint_store.rs:
``save`` → ``SaveOutcome(ref, covers_journal_seq, terminal)``, prune policy and
report; agents_state_checkpointer.rs: ``fork(from, edits)``), in our words:
a *checkpoint* is a snapshot of a task's state that *covers* the journal up to
``covers_journal_seq``; recovery is the newest checkpoint plus a replay of the
journal events after that seq.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from lazarus.storage.errors import InvalidArgument

MAX_TASK_ID_BYTES = 256
MAX_LABEL_CHARS = 1024
DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024 * 1024
_REF_SEPARATOR = "@"
# control characters, DEL and lone surrogates: what a task id must not hold
_BAD_TASK_ID_CHAR = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")


class Durability(enum.Enum):
    """When ``save`` / ``append`` return relative to the disk.

    SYNC: each write is its own transaction, fsynced before the call returns.
    GROUP: concurrent writes share one transaction and one fsync inside a bounded
        window; each caller returns only after the fsync that covers its write.
    NONE: committed to SQLite but not fsynced; survives a process crash, not a
        power loss.
    """

    SYNC = "sync"
    GROUP = "group"
    NONE = "none"


class Compression(enum.Enum):
    """How checkpoint payloads are stored. Reads detect the encoding per record."""

    NONE = "none"
    ZSTD = "zstd"


@dataclass(frozen=True, slots=True, init=False)
class Checkpoint:
    """A checkpoint to save.

    Attributes:
        task_id: the task's id; 1..256 UTF-8 bytes, no control characters.
        epoch: the writer's ownership epoch (>= 0); older than stored → StaleEpoch.
        payload: the task's state, opaque bytes (see ``JsonCodec``).
        covers_journal_seq: newest journal seq folded into ``payload`` (>= 0; 0 = none).
        terminal: True for the task's final state (completed / failed / cancelled).
        label: free text for operators, e.g. the reason of the checkpoint.
    """

    task_id: str
    epoch: int
    payload: bytes
    covers_journal_seq: int = 0
    terminal: bool = False
    label: str = ""

    def __init__(
        self,
        task_id: str,
        epoch: int,
        payload: bytes,
        covers_journal_seq: int = 0,
        terminal: bool = False,
        label: str = "",
    ) -> None:
        # the generated __init__ of a frozen dataclass, in half the time: it sets
        # each slot through ``object.__setattr__``; this sets them through their
        # descriptors (one Checkpoint is made per save)
        _CP_TASK_ID(self, task_id)
        _CP_EPOCH(self, epoch)
        _CP_PAYLOAD(self, payload)
        _CP_COVERS(self, covers_journal_seq)
        _CP_TERMINAL(self, terminal)
        _CP_LABEL(self, label)


_CP_TASK_ID, _CP_EPOCH, _CP_PAYLOAD, _CP_COVERS, _CP_TERMINAL, _CP_LABEL = (
    Checkpoint.__dict__[name].__set__
    for name in ("task_id", "epoch", "payload", "covers_journal_seq", "terminal", "label")
)


@dataclass(frozen=True, slots=True)
class SaveOutcome:
    """What ``save`` stored.

    Attributes:
        ref: the checkpoint's ref, ``"<task_id>@<seq>"``.
        seq: the checkpoint's per-task sequence number, 1, 2, 3, ...
        covers_journal_seq: as saved.
        terminal: as saved.
    """

    ref: str
    seq: int
    covers_journal_seq: int
    terminal: bool


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """A stored checkpoint's metadata (``list`` returns these; payloads are not read).

    Attributes:
        ref, task_id, seq, epoch, covers_journal_seq, terminal, label: as saved.
        created_at_ms: wall-clock time of the save, Unix milliseconds.
        parent_ref: for a fork's first checkpoint, the ref it was forked from; else "".
        stored_bytes: payload size on disk (after compression), bytes.
    """

    ref: str
    task_id: str
    seq: int
    epoch: int
    covers_journal_seq: int
    terminal: bool
    label: str
    created_at_ms: int
    parent_ref: str
    stored_bytes: int


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """A checkpoint read back and verified against its checksum.

    Attributes:
        info: its metadata.
        payload: the state bytes as saved (decompressed).
    """

    info: CheckpointInfo
    payload: bytes

    @property
    def ref(self) -> str:
        return self.info.ref

    @property
    def seq(self) -> int:
        return self.info.seq

    @property
    def epoch(self) -> int:
        return self.info.epoch

    @property
    def covers_journal_seq(self) -> int:
        return self.info.covers_journal_seq


@dataclass(frozen=True, slots=True)
class JournalEvent:
    """One journal event, verified against its checksum.

    Attributes:
        task_id: the task it belongs to.
        seq: per-task journal sequence number, 1, 2, 3, ...
        epoch: the writer's epoch.
        created_at_ms: wall-clock time of the append, Unix milliseconds.
        payload: the event, opaque bytes.
    """

    task_id: str
    seq: int
    epoch: int
    created_at_ms: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Recovery:
    """What a restarted task resumes from.

    Attributes:
        checkpoint: the newest valid checkpoint, or None when there is none.
        events: the journal events after ``checkpoint.covers_journal_seq`` (after 0
            when there is no checkpoint), in seq order.
    """

    checkpoint: StoredCheckpoint | None
    events: list[JournalEvent] = field(default_factory=list)

    def __iter__(self) -> Iterator[StoredCheckpoint | list[JournalEvent] | None]:
        """Unpack as ``checkpoint, events = store.recover(task_id)``."""
        yield self.checkpoint
        yield self.events


@dataclass(frozen=True, slots=True)
class PrunePolicy:
    """Which checkpoints ``prune`` deletes.

    Attributes:
        prune_covered_before: delete checkpoints whose covers_journal_seq is below this.
        preserve_latest_terminal: keep the newest terminal checkpoint whatever it covers.
        compact_journal: also delete journal events that no retained checkpoint
            needs for recovery (seq <= the smallest covers_journal_seq retained).
        prune_seq_before: also delete the checkpoints covering exactly
            ``prune_covered_before`` whose seq is below this (>= 0; 0 = none). The
            cutoff is then the pair ``(prune_covered_before, prune_seq_before)`` in
            the order recovery ranks checkpoints (covers_journal_seq, then seq):
            the only way to thin the history of a task whose checkpoints all cover
            the same journal seq (one that never appends an event covers 0 each time).
    """

    prune_covered_before: int
    preserve_latest_terminal: bool = True
    compact_journal: bool = False
    prune_seq_before: int = 0


@dataclass(frozen=True, slots=True)
class PruneReport:
    """What ``prune`` did.

    Attributes:
        task_id: the task pruned.
        pruned_count: checkpoints deleted.
        retained_count: checkpoints left.
        preserved_terminal_ref: the terminal checkpoint kept by the policy, or None.
        compacted_events: journal events deleted (0 unless ``compact_journal``).
    """

    task_id: str
    pruned_count: int
    retained_count: int
    preserved_terminal_ref: str | None
    compacted_events: int = 0


@dataclass(frozen=True, slots=True)
class TaskHead:
    """The newest state the store knows for one task (what a Hello reports).

    Attributes:
        task_id: the task.
        epoch: the newest epoch written for it.
        last_checkpoint_seq: the newest checkpoint seq (0 = none).
        last_journal_seq: the newest journal seq (0 = none).
    """

    task_id: str
    epoch: int
    last_checkpoint_seq: int
    last_journal_seq: int


@dataclass(frozen=True, slots=True)
class AdoptedCheckpoint:
    """A checkpoint of another replica's lineage, for ``CheckpointStore.adopt``.

    Attributes:
        seq: its per-task seq (kept as is).
        epoch: the epoch that wrote it.
        covers_journal_seq: newest journal seq folded into it.
        payload: the state bytes (decoded, not compressed).
        terminal, label: as saved by its writer.
    """

    seq: int
    epoch: int
    covers_journal_seq: int
    payload: bytes
    terminal: bool = False
    label: str = ""


@dataclass(frozen=True, slots=True)
class AdoptedEvent:
    """A journal event of another replica's lineage (seq, writer epoch, payload bytes)."""

    seq: int
    epoch: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class AdoptOutcome:
    """What ``adopt`` did.

    Attributes:
        task_id: the task.
        epoch: its epoch now.
        last_checkpoint_seq: newest checkpoint seq now (the next save gets +1).
        last_journal_seq: newest journal seq now (the next append gets +1).
        lineage_task_id: where replaced divergent local rows were kept ("" = none).
        divergent_checkpoints: checkpoints moved there.
        divergent_events: journal events moved there.
    """

    task_id: str
    epoch: int
    last_checkpoint_seq: int
    last_journal_seq: int
    lineage_task_id: str = ""
    divergent_checkpoints: int = 0
    divergent_events: int = 0


def validate_task_id(task_id: object, field_name: str = "task_id") -> str:
    """Return ``task_id`` if it is a usable task id.

    Raises:
        InvalidArgument: not a str, empty, over 256 UTF-8 bytes, or holding a
            control character (INVALID_ARGUMENT).
    """
    if not isinstance(task_id, str):
        raise InvalidArgument(field_name, f"must be a string, got {type(task_id).__name__}")
    if not task_id:
        raise InvalidArgument(field_name, "must not be empty")
    # a str of n characters encodes to at most 4n UTF-8 bytes
    if (
        len(task_id) * 4 > MAX_TASK_ID_BYTES
        and len(task_id.encode("utf-8", "surrogatepass")) > MAX_TASK_ID_BYTES
    ):
        raise InvalidArgument(field_name, f"must be at most {MAX_TASK_ID_BYTES} UTF-8 bytes")
    if _BAD_TASK_ID_CHAR.search(task_id) is not None:
        raise InvalidArgument(field_name, "must not contain control characters or surrogates")
    return task_id


def validate_seq(value: object, field_name: str) -> int:
    """Return ``value`` if it is a non-negative int (bools refused).

    Raises:
        InvalidArgument: not an int or negative (INVALID_ARGUMENT).
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(field_name, f"must be an integer, got {type(value).__name__}")
    if value < 0:
        raise InvalidArgument(field_name, f"must be >= 0, got {value}")
    if value >= 2**63:
        raise InvalidArgument(field_name, f"must be < 2**63, got {value}")
    return value


def validate_payload(payload: object, max_bytes: int, field_name: str = "payload") -> bytes:
    """Return ``payload`` as bytes if it is bytes-like and within ``max_bytes``.

    Raises:
        InvalidArgument: not bytes-like or too large (INVALID_ARGUMENT).
    """
    if isinstance(payload, bytes):
        data = payload
    elif isinstance(payload, bytearray | memoryview):
        data = bytes(payload)
    else:
        raise InvalidArgument(
            field_name,
            f"must be bytes, got {type(payload).__name__} (encode state with JsonCodec)",
        )
    if len(data) > max_bytes:
        raise InvalidArgument(field_name, f"is {len(data)} bytes, over the {max_bytes}-byte limit")
    return data


# Task ids ``validate_task_id`` accepted lately (exact ``str`` only): a save of a
# known task skips the regex. Cleared whole once it holds this many.
_VALID_TASK_IDS: set[str] = set()
_VALID_TASK_IDS_MAX = 4096
_SEQ_LIMIT = 2**63


def validate_checkpoint(checkpoint: object, max_payload_bytes: int) -> Checkpoint:
    """Check every field of a checkpoint to save.

    A checkpoint whose fields all have their exact types (a ``Checkpoint`` of a
    ``str`` task id, ``int`` seqs, ``bytes`` payload, ``bool`` terminal, ``str``
    label) is checked on a fast path, once per save on the event loop; any
    other, or any bad value, takes the field-by-field checks below, which name
    the first bad field.

    Raises:
        InvalidArgument: naming the first bad field (INVALID_ARGUMENT).
    """
    if type(checkpoint) is Checkpoint:
        task_id, epoch, payload = checkpoint.task_id, checkpoint.epoch, checkpoint.payload
        covers, label = checkpoint.covers_journal_seq, checkpoint.label
        if (
            type(epoch) is int
            and 0 <= epoch < _SEQ_LIMIT
            and type(covers) is int
            and 0 <= covers < _SEQ_LIMIT
            and type(payload) is bytes
            and len(payload) <= max_payload_bytes
            and type(checkpoint.terminal) is bool
            and type(label) is str
            and len(label) <= MAX_LABEL_CHARS
            and type(task_id) is str
        ):
            if task_id in _VALID_TASK_IDS:
                return checkpoint
            validate_task_id(task_id)
            if len(_VALID_TASK_IDS) >= _VALID_TASK_IDS_MAX:
                _VALID_TASK_IDS.clear()
            _VALID_TASK_IDS.add(task_id)
            return checkpoint
    if not isinstance(checkpoint, Checkpoint):
        raise InvalidArgument(
            "checkpoint", f"must be a Checkpoint, got {type(checkpoint).__name__}"
        )
    validate_task_id(checkpoint.task_id)
    validate_seq(checkpoint.epoch, "epoch")
    validate_seq(checkpoint.covers_journal_seq, "covers_journal_seq")
    payload = validate_payload(checkpoint.payload, max_payload_bytes)
    if not isinstance(checkpoint.terminal, bool):
        raise InvalidArgument("terminal", "must be a bool")
    if not isinstance(checkpoint.label, str) or len(checkpoint.label) > MAX_LABEL_CHARS:
        raise InvalidArgument("label", f"must be a string of at most {MAX_LABEL_CHARS} characters")
    if payload is not checkpoint.payload:
        return Checkpoint(
            checkpoint.task_id,
            checkpoint.epoch,
            payload,
            checkpoint.covers_journal_seq,
            checkpoint.terminal,
            checkpoint.label,
        )
    return checkpoint


def make_ref(task_id: str, seq: int) -> str:
    """Return the ref of checkpoint ``seq`` of ``task_id``: ``"<task_id>@<seq>"``."""
    return f"{task_id}{_REF_SEPARATOR}{seq}"


def parse_ref(ref: object) -> tuple[str, int]:
    """Split a ref into ``(task_id, seq)``.

    Raises:
        InvalidArgument: not of the form ``"<task_id>@<seq>"`` (INVALID_ARGUMENT).
    """
    if not isinstance(ref, str):
        raise InvalidArgument("ref", f"must be a string, got {type(ref).__name__}")
    task_id, sep, seq_text = ref.rpartition(_REF_SEPARATOR)
    if not sep or not seq_text.isascii() or not seq_text.isdigit():
        raise InvalidArgument("ref", f"{ref!r} is not of the form '<task_id>@<seq>'")
    validate_task_id(task_id, "ref")
    seq = int(seq_text)
    if seq < 1 or seq >= 2**63:
        raise InvalidArgument("ref", f"{ref!r} has seq {seq}; seqs start at 1")
    return task_id, seq
