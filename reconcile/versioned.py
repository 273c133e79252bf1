"""Versioned values that keep concurrent siblings, Dynamo style, and resolve them.

Theory of operation
-------------------
DeCandia et al. (2007), "Dynamo: Amazon's Highly Available Key-value Store",
§4.4: a ``get`` returns every concurrent version (sibling) of a key plus an
opaque *context*; a ``put`` carries the context the client read, and
replaces exactly the versions that context covers. Versions the client did
not see survive as siblings.

Plain version vectors per sibling lose writes when two clients write through
the same replica (a new version's vector can dominate a sibling its writer
never saw), so each sibling carries a *dotted version vector* (Preguiça,
Baquero, Almeida, Fonte, Gonçalves, 2010, "Dotted Version Vectors: Logical
Clocks for Optimistic Replication"): the ``dot`` ``(replica_id, n)`` naming
the write and the ``context`` the writer had seen. A sibling is obsolete when
another sibling's context covers its dot.

Siblings are resolved by a policy: :class:`LastWriterWins` on the writers'
HLC timestamps (Kulkarni et al., 2014), :class:`CrdtMerge` (join of CRDT
documents, Shapiro et al., 2011), or :class:`CustomResolver` wrapping a
function the caller passes. Resolving writes the winner back with the
combined context, so it replaces every sibling it was computed from; each
resolution of two or more siblings is recorded as a :class:`Conflict`.

The store is pure and in-memory: replication between stores is
:meth:`VersionedStore.merge` with the other store's :meth:`siblings`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from ._codec import check_key
from .documents import Document
from .hlc import HLCTimestamp
from .vclock import VectorClock, check_replica_id

__all__ = [
    "Conflict",
    "CrdtMerge",
    "CustomResolver",
    "GetResult",
    "LastWriterWins",
    "ResolutionPolicy",
    "Sibling",
    "VersionedStore",
]

V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Sibling(Generic[V]):
    """One version of a key.

    Attributes:
        value: the stored value (opaque to the store).
        dot: ``(replica_id, n)``: the write that made this version.
        context: the key's version vector the writer had seen (excludes ``dot``).
        at: the writer's HLC timestamp (orders LWW resolution only).
    """

    value: V
    dot: tuple[str, int]
    context: VectorClock
    at: HLCTimestamp

    def version(self) -> VectorClock:
        """``context`` plus ``dot``: everything this version reflects."""
        rid, n = self.dot
        if self.context.get(rid) >= n:
            return self.context
        return self.context.merge(VectorClock._trusted({rid: n}))

    def obsoleted_by(self, other: Sibling[Any]) -> bool:
        """True when ``other``'s writer had seen this version."""
        return other.context.covers(self.dot[0], self.dot[1])


@dataclass(frozen=True, slots=True)
class GetResult(Generic[V]):
    """What :meth:`VersionedStore.get` returns.

    Attributes:
        siblings: the concurrent versions, ordered by dot; empty when the key
            was never written.
        context: pass it back to :meth:`VersionedStore.put` to replace all of
            ``siblings``.
    """

    siblings: tuple[Sibling[V], ...]
    context: VectorClock

    @property
    def values(self) -> tuple[V, ...]:
        """The sibling values, in sibling order."""
        return tuple(s.value for s in self.siblings)


@dataclass(frozen=True, slots=True)
class Conflict(Generic[V]):
    """A sibling set that a policy resolved.

    Attributes:
        key: the key.
        siblings: the versions that were resolved (two or more).
        policy: the policy's ``name``.
        resolved: the version written back.
    """

    key: str
    siblings: tuple[Sibling[V], ...]
    policy: str
    resolved: Sibling[V]


class ResolutionPolicy(Protocol[V]):
    """Turns a sibling set into one value.

    ``name`` labels the :class:`Conflict` records; ``resolve`` gets two or
    more siblings (ordered by dot) and returns the value to write back.
    """

    @property
    def name(self) -> str: ...

    def resolve(self, key: str, siblings: Sequence[Sibling[V]]) -> V: ...


class LastWriterWins(Generic[V]):
    """Pick the sibling with the largest ``(at, dot)``: HLC order, dot breaks ties.

    Follows Kulkarni et al. (2014): HLC order respects causality and never
    runs ahead of the physical clocks by more than the accepted drift.
    """

    name = "lww"

    def resolve(self, key: str, siblings: Sequence[Sibling[V]]) -> V:
        """The value of the latest sibling."""
        if not siblings:
            raise ValueError("siblings must not be empty")
        return max(siblings, key=lambda s: (s.at.wall_ms, s.at.logical, s.dot)).value


class CrdtMerge:
    """Join sibling values that are CRDT documents of one kind (Shapiro et al., 2011).

    The result is a fresh document (a copy of the first sibling's value with
    every other sibling merged in); no sibling is mutated.

    Raises (from ``resolve``):
        TypeError: a sibling value is not a ``reconcile.documents.Document``.
        ValueError: the documents are of different kinds.
    """

    name = "crdt-merge"

    def resolve(self, key: str, siblings: Sequence[Sibling[Document]]) -> Document:
        """The join of all sibling documents."""
        if not siblings:
            raise ValueError("siblings must not be empty")
        for index, sibling in enumerate(siblings):
            if not isinstance(sibling.value, Document):
                raise TypeError(
                    f"siblings[{index}].value must be a Document for crdt-merge, "
                    f"got {type(sibling.value).__name__}"
                )
        merged = siblings[0].value.copy()
        for sibling in siblings[1:]:
            merged.merge(sibling.value)
        return merged


class CustomResolver(Generic[V]):
    """Resolve with a caller's function ``fn(key, siblings) -> value``.

    Args:
        fn: called with the key and the siblings (ordered by dot); must not
            keep references to mutate later.
        name: recorded in :class:`Conflict`; default ``"custom"``.

    Raises:
        TypeError: ``fn`` is not callable or ``name`` is not a str.
    """

    def __init__(self, fn: Callable[[str, Sequence[Sibling[V]]], V], name: str = "custom") -> None:
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        if type(name) is not str or not name:
            raise TypeError("name must be a non-empty str")
        self._fn = fn
        self.name = name

    def resolve(self, key: str, siblings: Sequence[Sibling[V]]) -> V:
        """Whatever ``fn`` returns."""
        return self._fn(key, siblings)


def _check_sibling(sibling: object, field: str) -> Sibling[Any]:
    if not isinstance(sibling, Sibling):
        raise TypeError(f"{field} must be Sibling, got {type(sibling).__name__}")
    if not isinstance(sibling.context, VectorClock):
        raise TypeError(f"{field}.context must be VectorClock")
    if not isinstance(sibling.at, HLCTimestamp):
        raise TypeError(f"{field}.at must be HLCTimestamp")
    dot = sibling.dot
    if not (isinstance(dot, tuple) and len(dot) == 2):
        raise TypeError(f"{field}.dot must be (replica_id, n)")
    check_replica_id(dot[0], f"{field}.dot[0]")
    if type(dot[1]) is not int or dot[1] < 1:
        raise ValueError(f"{field}.dot[1] must be an int >= 1")
    if sibling.context.covers(dot[0], dot[1]):
        raise ValueError(f"{field}.context covers its own dot {dot}")
    return sibling


class VersionedStore(Generic[V]):
    """One replica's keys, each holding its concurrent siblings (Dynamo + DVV).

    Args:
        replica_id: the replica that coordinates this store's puts.

    Raises:
        TypeError / ValueError: bad ``replica_id`` (gRPC INVALID_ARGUMENT).
    """

    def __init__(self, replica_id: str) -> None:
        self.replica_id = check_replica_id(replica_id)
        self._keys: dict[str, dict[tuple[str, int], Sibling[V]]] = {}
        self._conflicts: list[Conflict[V]] = []

    # ---- reads -------------------------------------------------------------------

    def keys(self) -> tuple[str, ...]:
        """Every key ever written, sorted."""
        return tuple(sorted(self._keys))

    def siblings(self, key: str) -> tuple[Sibling[V], ...]:
        """The siblings of ``key`` ordered by dot (empty if never written)."""
        check_key(key)
        stored = self._keys.get(key, {})
        return tuple(stored[dot] for dot in sorted(stored))

    def get(self, key: str) -> GetResult[V]:
        """The siblings of ``key`` and the context that covers them all.

        Raises:
            TypeError: ``key`` is not a str (gRPC INVALID_ARGUMENT).
        """
        siblings = self.siblings(key)
        context = VectorClock()
        for sibling in siblings:
            context = context.merge(sibling.version())
        return GetResult(siblings, context)

    # ---- writes ------------------------------------------------------------------

    def put(self, key: str, value: V, context: VectorClock, at: HLCTimestamp) -> Sibling[V]:
        """Write ``value``, replacing the siblings ``context`` covers.

        Args:
            key: the key.
            value: the new value.
            context: the ``GetResult.context`` the client read (empty clock
                for a blind write, which replaces nothing).
            at: the client's or coordinator's HLC timestamp for the write.

        Returns:
            The new sibling; its dot is ``(replica_id, n)`` with ``n`` above
            every ``replica_id`` counter this key has seen.

        Raises:
            TypeError: a field has the wrong type; the message names it
                (gRPC INVALID_ARGUMENT).
        """
        check_key(key)
        if not isinstance(context, VectorClock):
            raise TypeError(f"context must be VectorClock, got {type(context).__name__}")
        if not isinstance(at, HLCTimestamp):
            raise TypeError(f"at must be HLCTimestamp, got {type(at).__name__}")
        stored = self._keys.setdefault(key, {})
        me = self.replica_id
        n = context.get(me)
        for sibling in stored.values():
            n = max(n, sibling.version().get(me))
        new = Sibling(value, (me, n + 1), context, at)
        for dot in [d for d in stored if context.covers(d[0], d[1])]:
            del stored[dot]
        stored[new.dot] = new
        return new

    def merge(self, key: str, siblings: Iterable[Sibling[V]]) -> int:
        """Join siblings replicated from another store (DVV sync).

        Args:
            key: the key.
            siblings: the other store's ``siblings(key)``.

        Returns:
            How many of them were new here and kept.

        Raises:
            TypeError / ValueError: a malformed sibling; the message names
                ``siblings[i]`` (gRPC INVALID_ARGUMENT).
        """
        check_key(key)
        incoming = [_check_sibling(s, f"siblings[{i}]") for i, s in enumerate(siblings)]
        stored = self._keys.setdefault(key, {})
        kept = 0
        for sibling in incoming:
            if sibling.dot in stored:
                continue
            if any(sibling.obsoleted_by(other) for other in stored.values()):
                continue
            for dot in [d for d, s in stored.items() if s.obsoleted_by(sibling)]:
                del stored[dot]
            stored[sibling.dot] = sibling
            kept += 1
        return kept

    def merge_store(self, other: VersionedStore[V]) -> int:
        """Join every key of ``other``; return how many siblings were kept."""
        if not isinstance(other, VersionedStore):
            raise TypeError(f"other must be VersionedStore, got {type(other).__name__}")
        return sum(self.merge(key, other.siblings(key)) for key in other._keys)

    # ---- resolution --------------------------------------------------------------

    def resolve(self, key: str, policy: ResolutionPolicy[V], at: HLCTimestamp) -> V | None:
        """Collapse the siblings of ``key`` to one value with ``policy``.

        With two or more siblings the policy's value is written back with the
        combined context (replacing them all) and a :class:`Conflict` is
        recorded; with one sibling its value is returned unchanged.

        Args:
            key: the key.
            policy: a :class:`ResolutionPolicy`.
            at: HLC timestamp of the resolving write.

        Returns:
            The resolved value, or None when the key has no siblings.

        Raises:
            TypeError: bad argument types (gRPC INVALID_ARGUMENT); whatever
                the policy raises.
        """
        if not callable(getattr(policy, "resolve", None)):
            raise TypeError("policy must have a resolve(key, siblings) method")
        result = self.get(key)
        if not result.siblings:
            return None
        if len(result.siblings) == 1:
            return result.siblings[0].value
        value = policy.resolve(key, result.siblings)
        written = self.put(key, value, result.context, at)
        self._conflicts.append(Conflict(key, result.siblings, str(policy.name), written))
        return value

    def resolve_all(self, policy: ResolutionPolicy[V], at: HLCTimestamp) -> int:
        """Resolve every key with siblings; return how many conflicts that was."""
        before = len(self._conflicts)
        for key in self.keys():
            if len(self._keys[key]) > 1:
                self.resolve(key, policy, at)
        return len(self._conflicts) - before

    @property
    def conflict_count(self) -> int:
        """How many sibling sets this store has resolved."""
        return len(self._conflicts)

    def conflicts(self, key: str | None = None) -> tuple[Conflict[V], ...]:
        """The recorded conflicts, oldest first (only ``key``'s when given)."""
        if key is None:
            return tuple(self._conflicts)
        return tuple(c for c in self._conflicts if c.key == key)
