"""Hybrid logical clocks: last-writer-wins order that does not trust wall clocks.

Theory of operation
-------------------
Kulkarni, Demirbas, Madappa, Avva, Leone (2014), "Logical Physical Clocks and
Consistent Snapshots in Globally Distributed Databases" (OPODIS 2014). A
timestamp is ``(l, c)``: ``l`` (here ``wall_ms``) is the largest physical time,
in milliseconds, the node has heard of; ``c`` (``logical``) counts events that
share that ``l``. Timestamps are ordered lexicographically. The algorithm
(Figure 5 of the paper) guarantees:

* monotonic: each timestamp a node issues is larger than the previous one,
  even when the physical clock steps backwards;
* causal: if event ``e`` happened before ``f`` then ``ts(e) < ts(f)``;
* bounded: ``l - pt`` never exceeds the clock skew the node has accepted.

The physical clock is *passed in* (``physical_ms``): this module never reads a
clock (DESIGN §2). A remote timestamp whose ``wall_ms`` is more than
``max_drift_ms`` ahead of our physical time is refused with
:class:`ClockDriftError` instead of being allowed to drag our clock forward;
that is the guard the paper recommends (§3, "HLC is resilient to ... a
message with a timestamp far in the future").

Equal ``(l, c)`` pairs on different nodes are possible; callers that need a
total order (LWW) break ties with the replica id.
"""

from __future__ import annotations

from dataclasses import dataclass

from .vclock import MAX_COUNTER, _get_varint, _put_varint, check_replica_id

__all__ = [
    "DEFAULT_MAX_DRIFT_MS",
    "ClockDriftError",
    "HLCTimestamp",
    "HybridLogicalClock",
]

DEFAULT_MAX_DRIFT_MS = 60_000
_FORMAT_VERSION = 1


class ClockDriftError(ValueError):
    """A remote timestamp is further ahead of our physical clock than allowed.

    Maps to gRPC INVALID_ARGUMENT (the peer's clock, not ours, is wrong).
    """


def _check_ms(value: object, field: str) -> int:
    if type(value) is not int:
        raise TypeError(f"{field} must be int (milliseconds), got {type(value).__name__}")
    if value < 0 or value > MAX_COUNTER:
        raise ValueError(f"{field} must be in 0..2**64-1 ms, got {value}")
    return value


@dataclass(frozen=True, slots=True, order=True)
class HLCTimestamp:
    """One hybrid logical clock reading ``(l, c)`` (Kulkarni et al., 2014).

    Ordered lexicographically by ``(wall_ms, logical)``.

    Attributes:
        wall_ms: ``l``, physical time in ms since the Unix epoch, 0 .. 2**64-1.
        logical: ``c``, events sharing ``wall_ms``, 0 .. 2**64-1.

    Raises:
        TypeError / ValueError: a field is not an int in range; the message
            names the field (gRPC INVALID_ARGUMENT).
    """

    wall_ms: int
    logical: int = 0

    def __post_init__(self) -> None:
        _check_ms(self.wall_ms, "wall_ms")
        if type(self.logical) is not int:
            raise TypeError(f"logical must be int, got {type(self.logical).__name__}")
        if self.logical < 0 or self.logical > MAX_COUNTER:
            raise ValueError(f"logical must be in 0..2**64-1, got {self.logical}")

    def compare(self, other: HLCTimestamp) -> int:
        """-1, 0 or 1 as this timestamp is before, equal to or after ``other``."""
        if not isinstance(other, HLCTimestamp):
            raise TypeError(f"other must be HLCTimestamp, got {type(other).__name__}")
        mine = (self.wall_ms, self.logical)
        theirs = (other.wall_ms, other.logical)
        return (mine > theirs) - (mine < theirs)

    def encode(self) -> bytes:
        """Compact bytes: ``0x01``, varint wall_ms, varint logical (canonical)."""
        out = bytearray((_FORMAT_VERSION,))
        _put_varint(out, self.wall_ms)
        _put_varint(out, self.logical)
        return bytes(out)

    @classmethod
    def decode(cls, data: bytes) -> HLCTimestamp:
        """Parse :meth:`encode` output.

        Raises:
            TypeError: ``data`` is not bytes.
            ValueError: wrong version, truncated, overlong or trailing bytes;
                the message names the field (gRPC INVALID_ARGUMENT).
        """
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"data must be bytes, got {type(data).__name__}")
        buf = bytes(data)
        if not buf or buf[0] != _FORMAT_VERSION:
            raise ValueError(f"hlc timestamp version must be {_FORMAT_VERSION}")
        wall_ms, pos = _get_varint(buf, 1, "wall_ms")
        logical, pos = _get_varint(buf, pos, "logical")
        if pos != len(buf):
            raise ValueError(f"hlc timestamp has {len(buf) - pos} trailing bytes")
        return cls(wall_ms, logical)


class HybridLogicalClock:
    """One node's hybrid logical clock (Kulkarni et al., 2014, Figure 5).

    Args:
        node_id: the node this clock belongs to (only for error messages and
            tie-breaks by callers); see :func:`reconcile.vclock.check_replica_id`.
        max_drift_ms: the most a remote ``wall_ms`` may be ahead of our
            physical clock before :meth:`receive` refuses it; >= 0.
        last: resume from this timestamp (e.g. the last one persisted).

    Raises:
        TypeError / ValueError: bad argument; the message names it (gRPC
            INVALID_ARGUMENT).
    """

    __slots__ = ("_c", "_l", "max_drift_ms", "node_id")

    def __init__(
        self,
        node_id: str,
        *,
        max_drift_ms: int = DEFAULT_MAX_DRIFT_MS,
        last: HLCTimestamp | None = None,
    ) -> None:
        self.node_id = check_replica_id(node_id, "node_id")
        self.max_drift_ms = _check_ms(max_drift_ms, "max_drift_ms")
        if last is not None and not isinstance(last, HLCTimestamp):
            raise TypeError(f"last must be HLCTimestamp, got {type(last).__name__}")
        self._l = last.wall_ms if last else 0
        self._c = last.logical if last else 0

    def peek(self) -> HLCTimestamp:
        """The last timestamp issued (no event)."""
        return HLCTimestamp(self._l, self._c)

    def send(self, physical_ms: int) -> HLCTimestamp:
        """Timestamp a local or send event.

        ``l' = max(l, pt)``; ``c`` increments when ``l`` did not move, else resets.

        Args:
            physical_ms: the caller's physical clock reading, ms since the epoch.

        Returns:
            A timestamp strictly greater than every one this clock issued before.

        Raises:
            TypeError / ValueError: ``physical_ms`` is not an int in range
                (gRPC INVALID_ARGUMENT).
        """
        pt = _check_ms(physical_ms, "physical_ms")
        if pt > self._l:
            self._l, self._c = pt, 0
        else:
            self._c += 1
        return HLCTimestamp(self._l, self._c)

    local_event = send

    def receive(self, remote: HLCTimestamp, physical_ms: int) -> HLCTimestamp:
        """Timestamp the receipt of a message stamped ``remote``.

        Args:
            remote: the sender's timestamp.
            physical_ms: the caller's physical clock reading, ms since the epoch.

        Returns:
            A timestamp greater than both ``remote`` and every timestamp this
            clock issued before.

        Raises:
            TypeError: ``remote`` is not an HLCTimestamp or ``physical_ms`` is
                not an int (gRPC INVALID_ARGUMENT).
            ClockDriftError: ``remote.wall_ms`` is more than ``max_drift_ms``
                ahead of ``physical_ms``; the clock is unchanged (gRPC
                INVALID_ARGUMENT).
        """
        if not isinstance(remote, HLCTimestamp):
            raise TypeError(f"remote must be HLCTimestamp, got {type(remote).__name__}")
        pt = _check_ms(physical_ms, "physical_ms")
        ahead_ms = remote.wall_ms - pt
        if ahead_ms > self.max_drift_ms:
            raise ClockDriftError(
                f"remote.wall_ms={remote.wall_ms} is {ahead_ms} ms ahead of "
                f"physical_ms={pt} on {self.node_id!r} (max_drift_ms={self.max_drift_ms})"
            )
        l_old = self._l
        l_new = max(l_old, remote.wall_ms, pt)
        if l_new == l_old and l_new == remote.wall_ms:
            c_new = max(self._c, remote.logical) + 1
        elif l_new == l_old:
            c_new = self._c + 1
        elif l_new == remote.wall_ms:
            c_new = remote.logical + 1
        else:
            c_new = 0
        self._l, self._c = l_new, c_new
        return HLCTimestamp(l_new, c_new)

    @staticmethod
    def compare(a: HLCTimestamp, b: HLCTimestamp) -> int:
        """-1, 0 or 1 as ``a`` is before, equal to or after ``b``."""
        return a.compare(b)
