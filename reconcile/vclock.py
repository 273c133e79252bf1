"""Vector clocks: per-replica event counters that order events by happens-before.

Theory of operation
-------------------
A vector clock (Fidge 1988; Mattern 1989, "Virtual Time and Global States of
Distributed Systems") maps each replica id to the number of events of that
replica the holder has seen. Replica ``r`` ticks its own entry on every local
event (:meth:`VectorClock.increment`); a receiver merges the sender's clock
(:meth:`VectorClock.merge`, pointwise max) and then ticks. For two clocks
``a`` and ``b``: ``a`` happened before ``b`` iff ``a <= b`` pointwise and
``a != b``; neither dominating the other means the events are concurrent.

The same type is the *state vector* of a CRDT document (``reconcile.documents``):
``sv[r] = n`` means "every operation replica ``r`` made with sequence number
``<= n`` is reflected here".

Clocks are immutable values: every operation returns a new clock. Entries
equal to zero are dropped, so two clocks that mean the same thing compare
and encode equal.

Compact encoding (version 1), all integers unsigned LEB128 varints in their
shortest form::

    0x01                      format version
    varint  n                 number of entries (no zero counters stored)
    n times:
        varint  len           length of the replica id in UTF-8 bytes (1..255)
        bytes   replica id    UTF-8, entries strictly ascending by these bytes
        varint  counter       1 .. 2**64 - 1

The encoding is canonical: equal clocks give equal bytes. :meth:`decode`
refuses anything else (trailing bytes, overlong varints, unsorted or repeated
ids, zero counters) with ``ValueError``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping

__all__ = [
    "MAX_COUNTER",
    "MAX_REPLICA_ID_BYTES",
    "Ordering",
    "VectorClock",
    "check_replica_id",
]

MAX_COUNTER = 2**64 - 1
MAX_REPLICA_ID_BYTES = 255
_FORMAT_VERSION = 1


class Ordering(enum.Enum):
    """How two vector clocks (or the events they stamp) are ordered."""

    BEFORE = "before"
    AFTER = "after"
    EQUAL = "equal"
    CONCURRENT = "concurrent"


def check_replica_id(replica_id: object, field: str = "replica_id") -> str:
    """Validate a replica id and return it.

    Args:
        replica_id: a non-empty ``str`` of at most 255 UTF-8 bytes.
        field: the name reported in errors.

    Returns:
        ``replica_id`` unchanged.

    Raises:
        TypeError: ``replica_id`` is not a ``str`` (gRPC INVALID_ARGUMENT).
        ValueError: it is empty, longer than 255 UTF-8 bytes or not encodable
            as UTF-8 (gRPC INVALID_ARGUMENT).
    """
    if type(replica_id) is not str:
        raise TypeError(f"{field} must be str, got {type(replica_id).__name__}")
    try:
        size = len(replica_id.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValueError(f"{field} is not valid UTF-8: {exc}") from None
    if size == 0:
        raise ValueError(f"{field} must not be empty")
    if size > MAX_REPLICA_ID_BYTES:
        raise ValueError(f"{field} is {size} bytes in UTF-8; the limit is {MAX_REPLICA_ID_BYTES}")
    return replica_id


def _check_counter(value: object, field: str) -> int:
    if type(value) is not int:
        raise TypeError(f"{field} must be int, got {type(value).__name__}")
    if value < 0 or value > MAX_COUNTER:
        raise ValueError(f"{field} must be in 0..2**64-1, got {value}")
    return value


class VectorClock:
    """An immutable vector clock: replica id -> counter (events seen).

    Follows Mattern (1989) and Fidge (1988). Missing replicas count as zero.

    Args:
        counters: ``{replica_id: counter}``; counters are ints in
            ``0 .. 2**64-1`` (zero entries are dropped), replica ids as
            :func:`check_replica_id` accepts.

    Raises:
        TypeError: ``counters`` is not a mapping, or a key / value has the
            wrong type; the message names ``counters[<id>]`` (gRPC
            INVALID_ARGUMENT).
        ValueError: a counter is negative or too large, or a replica id is
            invalid (gRPC INVALID_ARGUMENT).
    """

    __slots__ = ("_counters", "_hash")

    _counters: dict[str, int]
    _hash: int | None

    def __init__(self, counters: Mapping[str, int] | None = None) -> None:
        clean: dict[str, int] = {}
        if counters is not None:
            if not isinstance(counters, Mapping):
                raise TypeError(f"counters must be a mapping, got {type(counters).__name__}")
            for replica_id, counter in counters.items():
                check_replica_id(replica_id, "counters key")
                _check_counter(counter, f"counters[{replica_id!r}]")
                if counter:
                    clean[replica_id] = counter
        self._counters = clean
        self._hash = None

    @classmethod
    def _trusted(cls, counters: dict[str, int]) -> VectorClock:
        """Wrap an already-validated dict without zero entries (no copy)."""
        clock = cls.__new__(cls)
        clock._counters = counters
        clock._hash = None
        return clock

    # ---- reading ---------------------------------------------------------------

    def get(self, replica_id: str) -> int:
        """The counter of ``replica_id`` (0 when absent)."""
        return self._counters.get(replica_id, 0)

    def __getitem__(self, replica_id: str) -> int:
        return self._counters.get(replica_id, 0)

    def replicas(self) -> tuple[str, ...]:
        """The replica ids with a non-zero counter, sorted."""
        return tuple(sorted(self._counters))

    def as_dict(self) -> dict[str, int]:
        """A fresh ``{replica_id: counter}`` dict (non-zero entries only, sorted keys)."""
        return {k: self._counters[k] for k in sorted(self._counters)}

    def items(self) -> Iterator[tuple[str, int]]:
        """``(replica_id, counter)`` pairs in ascending replica id order."""
        for key in sorted(self._counters):
            yield key, self._counters[key]

    def __len__(self) -> int:
        return len(self._counters)

    def __bool__(self) -> bool:
        return bool(self._counters)

    def total(self) -> int:
        """Sum of all counters: the number of events this clock has seen."""
        return sum(self._counters.values())

    # ---- operations ------------------------------------------------------------

    def increment(self, replica_id: str, by: int = 1) -> VectorClock:
        """A new clock with ``replica_id``'s counter raised by ``by`` (a local event).

        Args:
            replica_id: the replica that made the event.
            by: how many events, >= 1.

        Raises:
            TypeError / ValueError: bad ``replica_id`` or ``by``, or the counter
                would pass 2**64-1 (gRPC INVALID_ARGUMENT).
        """
        check_replica_id(replica_id)
        _check_counter(by, "by")
        if by < 1:
            raise ValueError(f"by must be >= 1, got {by}")
        value = self._counters.get(replica_id, 0) + by
        _check_counter(value, f"counter of {replica_id!r}")
        counters = dict(self._counters)
        counters[replica_id] = value
        return VectorClock._trusted(counters)

    def merge(self, other: VectorClock) -> VectorClock:
        """The pointwise maximum (least upper bound) of two clocks.

        Raises:
            TypeError: ``other`` is not a VectorClock (gRPC INVALID_ARGUMENT).
        """
        if not isinstance(other, VectorClock):
            raise TypeError(f"other must be VectorClock, got {type(other).__name__}")
        if not other._counters:
            return self
        if not self._counters:
            return other
        counters = dict(self._counters)
        for key, value in other._counters.items():
            if value > counters.get(key, 0):
                counters[key] = value
        return VectorClock._trusted(counters)

    def meet(self, other: VectorClock) -> VectorClock:
        """The pointwise minimum (greatest lower bound) of two clocks."""
        if not isinstance(other, VectorClock):
            raise TypeError(f"other must be VectorClock, got {type(other).__name__}")
        counters = {
            key: min(value, other._counters[key])
            for key, value in self._counters.items()
            if key in other._counters
        }
        return VectorClock._trusted(counters)

    def descends(self, other: VectorClock) -> bool:
        """True when this clock has seen everything ``other`` has (``other <= self`` pointwise)."""
        if not isinstance(other, VectorClock):
            raise TypeError(f"other must be VectorClock, got {type(other).__name__}")
        mine = self._counters
        return all(mine.get(key, 0) >= value for key, value in other._counters.items())

    def covers(self, replica_id: str, counter: int) -> bool:
        """True when event ``counter`` of ``replica_id`` is within this clock."""
        return self._counters.get(replica_id, 0) >= counter

    def compare(self, other: VectorClock) -> Ordering:
        """Order this clock against ``other`` by happens-before.

        Returns:
            ``BEFORE`` (self < other), ``AFTER`` (self > other), ``EQUAL`` or
            ``CONCURRENT`` (neither dominates).

        Raises:
            TypeError: ``other`` is not a VectorClock (gRPC INVALID_ARGUMENT).
        """
        if not isinstance(other, VectorClock):
            raise TypeError(f"other must be VectorClock, got {type(other).__name__}")
        less = greater = False
        mine, theirs = self._counters, other._counters
        for key, value in mine.items():
            o = theirs.get(key, 0)
            if value > o:
                greater = True
            elif value < o:
                less = True
        for key, value in theirs.items():
            if key not in mine and value > 0:
                less = True
        if less and greater:
            return Ordering.CONCURRENT
        if less:
            return Ordering.BEFORE
        if greater:
            return Ordering.AFTER
        return Ordering.EQUAL

    # ---- value semantics -------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, VectorClock):
            return NotImplemented
        return self._counters == other._counters

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self._counters.items()))
        return self._hash

    def __le__(self, other: VectorClock) -> bool:
        return other.descends(self)

    def __ge__(self, other: VectorClock) -> bool:
        return self.descends(other)

    def __lt__(self, other: VectorClock) -> bool:
        return self.compare(other) is Ordering.BEFORE

    def __gt__(self, other: VectorClock) -> bool:
        return self.compare(other) is Ordering.AFTER

    def __repr__(self) -> str:
        inner = ", ".join(f"{k!r}: {v}" for k, v in self.items())
        return f"VectorClock({{{inner}}})"

    # ---- encoding --------------------------------------------------------------

    def encode(self) -> bytes:
        """The canonical compact encoding (format in the module docstring)."""
        out = bytearray((_FORMAT_VERSION,))
        entries = sorted((k.encode("utf-8"), v) for k, v in self._counters.items())
        _put_varint(out, len(entries))
        for key, value in entries:
            _put_varint(out, len(key))
            out += key
            _put_varint(out, value)
        return bytes(out)

    @classmethod
    def decode(cls, data: bytes) -> VectorClock:
        """Parse :meth:`encode` output.

        Args:
            data: bytes in the version-1 format of the module docstring.

        Raises:
            TypeError: ``data`` is not bytes (gRPC INVALID_ARGUMENT).
            ValueError: the bytes are not a canonical version-1 clock; the
                message says which field is wrong (gRPC INVALID_ARGUMENT).
        """
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"data must be bytes, got {type(data).__name__}")
        buf = bytes(data)
        if not buf:
            raise ValueError("vector clock data is empty")
        if buf[0] != _FORMAT_VERSION:
            raise ValueError(f"vector clock version must be {_FORMAT_VERSION}, got {buf[0]}")
        pos = 1
        count, pos = _get_varint(buf, pos, "entry count")
        if count > len(buf):
            raise ValueError(f"vector clock entry count {count} exceeds the data size")
        counters: dict[str, int] = {}
        previous: bytes | None = None
        for index in range(count):
            size, pos = _get_varint(buf, pos, f"entries[{index}].replica_id length")
            if size < 1 or size > MAX_REPLICA_ID_BYTES:
                raise ValueError(f"entries[{index}].replica_id length must be 1..255, got {size}")
            raw = buf[pos : pos + size]
            if len(raw) != size:
                raise ValueError(f"entries[{index}].replica_id is truncated")
            pos += size
            if previous is not None and raw <= previous:
                raise ValueError(f"entries[{index}].replica_id is not in strictly ascending order")
            previous = raw
            try:
                replica_id = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"entries[{index}].replica_id is not valid UTF-8") from None
            counter, pos = _get_varint(buf, pos, f"entries[{index}].counter")
            if counter == 0:
                raise ValueError(f"entries[{index}].counter must be >= 1 (zeros are not stored)")
            counters[replica_id] = counter
        if pos != len(buf):
            raise ValueError(f"vector clock has {len(buf) - pos} trailing bytes")
        return cls._trusted(counters)


def _put_varint(out: bytearray, value: int) -> None:
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return


def _get_varint(buf: bytes, pos: int, field: str) -> tuple[int, int]:
    """Read one canonical LEB128 varint (< 2**64) at ``pos``; return (value, new pos)."""
    value = 0
    shift = 0
    start = pos
    while True:
        if pos >= len(buf):
            raise ValueError(f"{field} is truncated")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
        if shift >= 70:
            raise ValueError(f"{field} varint is too long")
    if pos - start > 1 and buf[pos - 1] == 0:
        raise ValueError(f"{field} varint is not in its shortest form")
    if value > MAX_COUNTER:
        raise ValueError(f"{field} exceeds 2**64-1")
    return value, pos
