"""CRDT documents behind one interface: local ops, state vectors, deltas, encoding.

Theory of operation
-------------------
Every document is a delta-state CRDT (Almeida, Shoker, Baquero, 2018,
"Delta State Replicated Data Types", JPDC 111) whose replicas are named by
replica ids. Each local operation gets a *dot* ``(replica_id, seq)`` with
``seq`` = that replica's previous count + 1, and the document keeps a *state
vector* (a :class:`~reconcile.vclock.VectorClock`): ``sv[r] = n`` means every
operation of replica ``r`` with ``seq <= n`` is reflected in this replica's
state. Every element of state carries the dot of the operation that made it,
so what a peer lacks can be computed from the peer's state vector alone
(the "state vector" / "delta since" scheme Yjs and Automerge use):

* :meth:`Document.apply` runs a local operation and returns its *delta
  mutation* (a :class:`Delta` holding just that operation's effect);
* :meth:`Document.delta_since` returns every element whose dot the given
  state vector does not cover, plus our own state vector;
* :meth:`Document.merge_delta` joins a delta in. A delta records the state
  vector it was computed against (``base``); it is applied only when this
  replica already covers ``base`` (otherwise it would skip operations we lack)
  and then the state vector becomes ``sv ⊔ delta.state_vector``. A delta that
  arrives too early is refused (``False``) and changes nothing; duplicates and
  re-orderings of applicable deltas are harmless because the merge is a join.

Because nothing is merged without also advancing the state vector and
vice versa, two replicas with equal state vectors hold equal state: that is
what ``reconcile.antientropy.converged`` checks.

Document types and where their logic comes from
-----------------------------------------------
==============  ===============================================  =============================
``kind``        semantics                                        built on
==============  ===============================================  =============================
``g-counter``   grow-only counter, one entry per replica         ``crdts.CounterSet``
``pn-counter``  increment / decrement counter                    ``crdts.CounterSet``
``or-set``      add-wins observed-remove set                     ours (see below)
``lww-map``     str -> value, last writer (by HLC) wins per key  ``crdts.LWWRegister`` per key
``mv-map``      str -> concurrent values kept as siblings        ours (see below)
``rga-log``     append-only replicated growable array            ours (see below)
==============  ===============================================  =============================

Where ``crdts`` 0.0.4 is used, and where it is not, and why:

* ``crdts.CounterSet`` is a map ``counter_id -> PNCounter`` merged by
  per-entry max (Shapiro et al., 2011, "A comprehensive study of CRDTs",
  §3.1.2): correct when each replica only bumps its own entry, which is how
  we use it. ``crdts.Counter`` / ``crdts.PNCounter`` alone are *max registers*
  (two replicas each adding 1 merge to 1, not 2), so we do not use them bare.
* ``crdts.ORSet`` is not an observed-remove set: it keeps one Lamport
  timestamp per member and lets the later of add / remove win, so a remove
  by a replica that never saw an add can still delete it, and it has no dots
  to compute deltas from. ``or-set`` here is the optimized add-wins OR-Set of
  Bieniusa et al. (2012, "An optimized conflict-free replicated set"): each
  add has a unique dot, a remove tombstones exactly the dots it observed.
* ``crdts.LWWMap`` re-computes its whole name set on every update (O(n) per
  operation, so O(n^2) to merge n keys), and with equal Lamport timestamps a
  remove and a set of the same key converge differently depending on
  delivery order (the remove's ``None`` overwrites the register only when it
  arrives second). ``lww-map`` therefore keeps one ``crdts.LWWRegister`` per
  key, ordered by ``(HLC wall_ms, HLC logical, replica_id, seq)`` — a total
  order, so the register's tie-break never runs — and deletes by writing a
  tombstone (Shapiro et al., 2011, LWW-element map).
* ``crdts.MVRegister`` / ``crdts.MVMap`` decide concurrency by *equal*
  Lamport timestamps and do not merge timestamps, so a later write from one
  replica drops a concurrent sibling from another. ``mv-map`` uses dotted
  version vectors instead (Preguiça, Baquero, Almeida, Fonte, Gonçalves,
  2010, "Dotted Version Vectors"), the same sibling logic as
  :mod:`reconcile.versioned`.
* ``crdts.RGArray`` stores items in its ORSet hashed by *value only*, so two
  equal log entries (the same message twice) collapse into one, and each
  update re-reads the whole set (4,000 appends take ~6 s). ``rga-log`` is the
  append-only case of RGA (Roh, Jeon, Kim, Lee, 2011, "Replicated abstract
  data types"): items ordered by ``(Lamport time, replica_id, seq)``, which
  respects causality (an entry appended after seeing another sorts after it).

Replica ids must be unique per document, and a replica must keep its state
(or come back under a new id, like an ``incarnation``): two live replicas
issuing dots under one id, or a replica restarting its ``seq`` from zero,
would reuse dots and silently diverge.

Not done here: garbage collection of tombstones (OR-Set removed dots, LWW /
MV tombstones) once every replica's state vector covers them.

Encoding: deltas and documents encode to compact UTF-8 JSON with sorted
keys (``Delta.encode`` / ``Document.encode``); decoding validates every field
and raises ``ValueError`` naming it, never anything else, for any bytes.
"""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from crdts import CounterSet, LWWRegister, ScalarClock, StateUpdate

from ._codec import (
    JsonValue,
    check_key,
    check_member,
    check_positive,
    check_value,
    clock_json,
    dumps,
    loads,
    want_bool,
    want_clock,
    want_dict,
    want_int,
    want_list,
    want_member,
    want_replica,
    want_str,
    want_value,
)
from .hlc import HLCTimestamp
from .vclock import VectorClock, check_replica_id

__all__ = [
    "KINDS",
    "Add",
    "Append",
    "Decrement",
    "Delete",
    "Delta",
    "Document",
    "GCounter",
    "Increment",
    "LWWMap",
    "MVMap",
    "ORSet",
    "Operation",
    "PNCounter",
    "Put",
    "RGALog",
    "Remove",
    "decode_document",
    "new_document",
]

_DELTA_FORMAT = "lazarus.reconcile.delta"
_DOC_FORMAT = "lazarus.reconcile.document"
_VERSION = 1

Dot = tuple[str, int]
D = TypeVar("D", bound="Document")


# ---- operations ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Increment:
    """Add ``amount`` (1 .. 2**64-1) to a ``g-counter`` or ``pn-counter``."""

    amount: int = 1


@dataclass(frozen=True, slots=True)
class Decrement:
    """Subtract ``amount`` (1 .. 2**64-1) from a ``pn-counter``."""

    amount: int = 1


@dataclass(frozen=True, slots=True)
class Add:
    """Add ``member`` (str or int) to an ``or-set``."""

    member: str | int


@dataclass(frozen=True, slots=True)
class Remove:
    """Remove ``member`` from an ``or-set`` (only the adds this replica has seen)."""

    member: str | int


@dataclass(frozen=True, slots=True)
class Put:
    """Set ``key`` to ``value`` (a JSON value) in an ``lww-map`` or ``mv-map``.

    ``at`` is the writer's HLC timestamp: required by ``lww-map`` (it orders
    writes), must be ``None`` for ``mv-map`` (order there is causal only).
    """

    key: str
    value: JsonValue
    at: HLCTimestamp | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    """Remove ``key`` from an ``lww-map`` (``at`` required) or ``mv-map`` (``at`` None)."""

    key: str
    at: HLCTimestamp | None = None


@dataclass(frozen=True, slots=True)
class Append:
    """Append ``item`` (a JSON value) to an ``rga-log``."""

    item: JsonValue


Operation = Increment | Decrement | Add | Remove | Put | Delete | Append


# ---- deltas ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=True)
class Delta:
    """What a replica whose state vector covers ``base`` lacks of a document.

    Attributes:
        kind: the document type (``Document.kind``).
        base: the state vector the delta was computed against; the receiver
            must cover it (:meth:`Document.merge_delta`).
        state_vector: what the receiver covers after merging (the sender's
            state vector, or ``base`` plus one dot for an operation delta).
        payload: kind-specific JSON-ready list (see each Document type);
            treat as opaque.

    Encoding (:meth:`encode`): UTF-8 JSON object with sorted keys
    ``{"base": {id: n}, "format": "lazarus.reconcile.delta", "kind": str,
    "payload": [...], "sv": {id: n}, "v": 1}``.
    """

    kind: str
    base: VectorClock
    state_vector: VectorClock
    payload: Any

    def __hash__(self) -> int:
        raise TypeError("Delta is not hashable")

    def is_empty(self) -> bool:
        """True when merging the delta cannot change the receiver's state."""
        return not self.payload and self.base.descends(self.state_vector)

    def encode(self) -> bytes:
        """Deterministic bytes for the delta (format in the class docstring)."""
        return dumps(
            {
                "format": _DELTA_FORMAT,
                "v": _VERSION,
                "kind": self.kind,
                "base": clock_json(self.base),
                "sv": clock_json(self.state_vector),
                "payload": self.payload,
            }
        )

    @staticmethod
    def decode(data: bytes) -> Delta:
        """Parse :meth:`encode` output, validating every field.

        Raises:
            TypeError: ``data`` is not bytes.
            ValueError: anything malformed: not JSON, unknown ``kind``, a
                field with the wrong shape, a dot outside ``(base, sv]``; the
                message names the field (gRPC INVALID_ARGUMENT).
        """
        top = want_dict(loads(data, "delta"), "delta")
        if top.get("format") != _DELTA_FORMAT:
            raise ValueError(f"delta.format must be {_DELTA_FORMAT!r}")
        if top.get("v") != _VERSION:
            raise ValueError(f"delta.v must be {_VERSION}")
        kind = want_str(top.get("kind"), "delta.kind")
        cls = KINDS.get(kind)
        if cls is None:
            raise ValueError(f"delta.kind {kind!r} is unknown; known: {sorted(KINDS)}")
        base = want_clock(top.get("base"), "delta.base")
        sv = want_clock(top.get("sv"), "delta.sv")
        payload = want_list(top.get("payload"), "delta.payload")
        cls._check_payload(payload, base, sv, "delta.payload")
        return Delta(kind, base, sv, payload)


def _check_dot(rid: str, seq: int, base: VectorClock | None, sv: VectorClock, field: str) -> None:
    if seq > sv.get(rid):
        raise ValueError(f"{field} dot ({rid!r}, {seq}) is beyond the state vector")
    if base is not None and seq <= base.get(rid):
        raise ValueError(f"{field} dot ({rid!r}, {seq}) is already covered by base")


# ---- the interface -----------------------------------------------------------------


class Document(ABC):
    """One replica of a CRDT document (see the module docstring).

    Args:
        replica_id: this replica's id (non-empty str, <= 255 UTF-8 bytes).

    Raises:
        TypeError / ValueError: bad ``replica_id`` (gRPC INVALID_ARGUMENT).
    """

    kind: ClassVar[str]

    def __init__(self, replica_id: str) -> None:
        self._replica_id = check_replica_id(replica_id)
        self._sv: dict[str, int] = {}

    @property
    def replica_id(self) -> str:
        """This replica's id."""
        return self._replica_id

    # ---- the common algorithm --------------------------------------------------

    def state_vector(self) -> VectorClock:
        """Per-replica counts of the operations reflected here (see module docstring)."""
        return VectorClock._trusted(dict(self._sv))

    def apply(self, op: Operation) -> Delta:
        """Run a local operation and return its delta mutation.

        Args:
            op: one of the operation types this document accepts.

        Returns:
            A :class:`Delta` with ``base = {replica_id: seq - 1}`` and
            ``state_vector = {replica_id: seq}``: any replica that has all our
            earlier operations can merge it.

        Raises:
            TypeError: ``op`` is not an operation of this document type, or a
                field has the wrong type; the message names the field.
            ValueError: a field is out of range (gRPC INVALID_ARGUMENT).
        """
        self._validate_op(op)
        seq = self._sv.get(self._replica_id, 0) + 1
        payload = self._apply(op, seq)
        self._sv[self._replica_id] = seq
        base = {self._replica_id: seq - 1} if seq > 1 else {}
        return Delta(
            self.kind,
            VectorClock._trusted(base),
            VectorClock._trusted({self._replica_id: seq}),
            payload,
        )

    def delta_since(self, state_vector: VectorClock) -> Delta:
        """Everything a replica whose state vector is ``state_vector`` lacks.

        Args:
            state_vector: the receiver's :meth:`state_vector`.

        Returns:
            A :class:`Delta` with ``base = state_vector`` and this replica's
            state vector; empty payload when the receiver lacks nothing.

        Raises:
            TypeError: ``state_vector`` is not a VectorClock (gRPC INVALID_ARGUMENT).
        """
        if not isinstance(state_vector, VectorClock):
            raise TypeError(f"state_vector must be VectorClock, got {type(state_vector).__name__}")
        return Delta(self.kind, state_vector, self.state_vector(), self._since(state_vector))

    def merge_delta(self, delta: Delta) -> bool:
        """Join ``delta`` into this replica if it is applicable.

        Returns:
            True when merged (the state vector is now ``sv ⊔ delta.state_vector``);
            False when ``delta.base`` is not covered by our state vector —
            merging it would skip operations we lack — and nothing changed.
            Ask the sender for ``delta_since(state_vector())`` instead.

        Raises:
            TypeError: ``delta`` is not a Delta (gRPC INVALID_ARGUMENT).
            ValueError: ``delta.kind`` is not this document's kind (gRPC
                INVALID_ARGUMENT).
        """
        if not isinstance(delta, Delta):
            raise TypeError(f"delta must be Delta, got {type(delta).__name__}")
        if delta.kind != self.kind:
            raise ValueError(f"delta.kind is {delta.kind!r}; this document is {self.kind!r}")
        sv = self._sv
        for rid, seq in delta.base._counters.items():
            if sv.get(rid, 0) < seq:
                return False
        self._merge(delta.payload)
        for rid, seq in delta.state_vector._counters.items():
            if seq > sv.get(rid, 0):
                sv[rid] = seq
        return True

    def merge(self, other: Document) -> None:
        """Join the whole state of ``other`` (same kind) into this replica.

        Raises:
            TypeError: ``other`` is not a Document.
            ValueError: ``other`` is of another kind (gRPC INVALID_ARGUMENT).
        """
        if not isinstance(other, Document):
            raise TypeError(f"other must be Document, got {type(other).__name__}")
        if other.kind != self.kind:
            raise ValueError(f"other.kind is {other.kind!r}; this document is {self.kind!r}")
        self.merge_delta(other.delta_since(self.state_vector()))

    def encode(self) -> bytes:
        """The whole replica as UTF-8 JSON with sorted keys.

        Format: ``{"format": "lazarus.reconcile.document", "kind": str,
        "replica": str, "state": <payload of delta_since({})>, "sv": {id: n},
        "v": 1}``.
        """
        return dumps(
            {
                "format": _DOC_FORMAT,
                "v": _VERSION,
                "kind": self.kind,
                "replica": self._replica_id,
                "sv": clock_json(self._sv),
                "state": self._since(VectorClock()),
            }
        )

    @classmethod
    def decode(cls: type[D], data: bytes, replica_id: str | None = None) -> D:
        """Rebuild a replica from :meth:`encode` output.

        Args:
            data: the encoded document.
            replica_id: take over the state under another id (a new replica
                seeded from a snapshot); default: the encoded id.

        Raises:
            TypeError: ``data`` is not bytes.
            ValueError: malformed data, a kind other than this class's, or
                state beyond the encoded state vector; the message names the
                field (gRPC INVALID_ARGUMENT).
        """
        top = want_dict(loads(data, "document"), "document")
        if top.get("format") != _DOC_FORMAT:
            raise ValueError(f"document.format must be {_DOC_FORMAT!r}")
        if top.get("v") != _VERSION:
            raise ValueError(f"document.v must be {_VERSION}")
        kind = want_str(top.get("kind"), "document.kind")
        target = KINDS.get(kind)
        if target is None:
            raise ValueError(f"document.kind {kind!r} is unknown; known: {sorted(KINDS)}")
        if cls is not Document and target is not cls:
            raise ValueError(f"document.kind is {kind!r}; expected {cls.kind!r}")
        replica = want_replica(top.get("replica"), "document.replica")
        sv = want_clock(top.get("sv"), "document.sv")
        state = want_list(top.get("state"), "document.state")
        target._check_payload(state, None, sv, "document.state")
        doc = target(replica if replica_id is None else replica_id)
        doc._merge(state)
        doc._sv = sv.as_dict()
        return doc  # type: ignore[return-value]

    def copy(self: D, replica_id: str | None = None) -> D:
        """An independent replica with the same state (optionally another id)."""
        return type(self).decode(self.encode(), replica_id)

    @abstractmethod
    def value(self) -> Any:
        """The current value (type-specific; see each class)."""

    # ---- per-type hooks --------------------------------------------------------

    @abstractmethod
    def _validate_op(self, op: object) -> None:
        """Raise TypeError / ValueError for an op this type cannot run."""

    @abstractmethod
    def _apply(self, op: Any, seq: int) -> list[Any]:
        """Run a validated local op with dot (replica_id, seq); return its payload."""

    @abstractmethod
    def _since(self, sv: VectorClock) -> list[Any]:
        """Payload of every element whose dot ``sv`` does not cover."""

    @abstractmethod
    def _merge(self, payload: list[Any]) -> None:
        """Join a (validated) payload into the state."""

    @classmethod
    @abstractmethod
    def _check_payload(
        cls, payload: list[Any], base: VectorClock | None, sv: VectorClock, field: str
    ) -> None:
        """Raise ValueError unless ``payload`` is well formed with dots in (base, sv]."""

    def _wrong_op(self, op: object, accepted: str) -> TypeError:
        return TypeError(f"op must be {accepted} for {self.kind}, got {type(op).__name__}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(replica_id={self._replica_id!r}, sv={self._sv!r})"


# ---- counters on crdts.CounterSet ------------------------------------------------------

_COUNTER_CLOCK_UUID = b"lazarus.counter1"


class _CounterBase(Document):
    """Counters as a ``crdts.CounterSet`` keyed by replica id.

    Payload: ``[[replica_id, positive, negative, seq], ...]`` sorted by id,
    where ``seq`` is the dot of that replica's last counter operation.
    """

    _decrements: ClassVar[bool]

    def __init__(self, replica_id: str) -> None:
        super().__init__(replica_id)
        clock = ScalarClock(counter=1, uuid=_COUNTER_CLOCK_UUID)
        self._set = CounterSet(uuid=_COUNTER_CLOCK_UUID, clock=clock)
        self._seq: dict[str, int] = {}

    def value(self) -> int:
        """The counter's value: sum of increments minus decrements over replicas."""
        return int(self._set.read())

    def _validate_op(self, op: object) -> None:
        if isinstance(op, Increment) or (self._decrements and isinstance(op, Decrement)):
            check_positive(op.amount, "op.amount")
            return
        raise self._wrong_op(op, "Increment or Decrement" if self._decrements else "Increment")

    def _entry(self, rid: str) -> tuple[int, int]:
        counter = self._set.counters.get(rid)
        if counter is None:
            return 0, 0
        return int(counter.positive), int(counter.negative)

    def _apply(self, op: Increment | Decrement, seq: int) -> list[Any]:
        rid = self._replica_id
        positive, negative = self._entry(rid)
        if isinstance(op, Increment):
            positive += op.amount
        else:
            negative += op.amount
        self._put(rid, positive, negative, seq)
        return [[rid, positive, negative, seq]]

    def _put(self, rid: str, positive: int, negative: int, seq: int) -> None:
        self._set.update(StateUpdate(_COUNTER_CLOCK_UUID, seq, (rid, positive, negative)))
        if seq > self._seq.get(rid, 0):
            self._seq[rid] = seq

    def _since(self, sv: VectorClock) -> list[Any]:
        out = []
        for rid in sorted(self._seq):
            seq = self._seq[rid]
            if seq > sv.get(rid):
                positive, negative = self._entry(rid)
                out.append([rid, positive, negative, seq])
        return out

    def _merge(self, payload: list[Any]) -> None:
        for rid, positive, negative, seq in payload:
            old_p, old_n = self._entry(rid)
            if positive > old_p or negative > old_n or seq > self._seq.get(rid, 0):
                self._put(rid, positive, negative, seq)

    @classmethod
    def _check_payload(
        cls, payload: list[Any], base: VectorClock | None, sv: VectorClock, field: str
    ) -> None:
        seen: set[str] = set()
        for index, entry in enumerate(payload):
            where = f"{field}[{index}]"
            rid, positive, negative, seq = want_list(entry, where, 4)
            want_replica(rid, f"{where}[0]")
            if rid in seen:
                raise ValueError(f"{where}[0] repeats replica {rid!r}")
            seen.add(rid)
            want_int(positive, f"{where}[1]")
            want_int(negative, f"{where}[2]")
            if negative and not cls._decrements:
                raise ValueError(f"{where}[2] must be 0 for a g-counter")
            want_int(seq, f"{where}[3]", minimum=1)
            _check_dot(rid, seq, base, sv, where)


class GCounter(_CounterBase):
    """Grow-only counter (Shapiro et al., 2011, §3.1.1) on ``crdts.CounterSet``.

    Ops: :class:`Increment`. ``value()``: int >= 0.
    """

    kind = "g-counter"
    _decrements = False


class PNCounter(_CounterBase):
    """Increment / decrement counter (Shapiro et al., 2011, §3.1.2) on ``crdts.CounterSet``.

    Ops: :class:`Increment`, :class:`Decrement`. ``value()``: int.
    """

    kind = "pn-counter"
    _decrements = True


# ---- add-wins OR-Set (ours) -------------------------------------------------------------


class ORSet(Document):
    """Add-wins observed-remove set (Bieniusa et al., 2012, optimized OR-Set).

    Ops: :class:`Add`, :class:`Remove`. ``value()``: ``frozenset`` of members
    (str or int). A remove deletes the adds (dots) this replica has observed;
    an add concurrent with it survives.

    Payload: ``[["a", replica_id, seq, member], ...]`` for live adds and
    ``["r", add_replica, add_seq, remover_replica, remover_seq]`` for removed
    dots, the remover's dot being the smallest that removed it.
    """

    kind = "or-set"

    def __init__(self, replica_id: str) -> None:
        super().__init__(replica_id)
        self._adds: dict[Dot, str | int] = {}
        self._removed: dict[Dot, Dot] = {}
        self._dots: dict[str | int, set[Dot]] = {}

    def value(self) -> frozenset[str | int]:
        """The members with at least one live add."""
        return frozenset(self._dots)

    def __contains__(self, member: object) -> bool:
        return member in self._dots

    def _validate_op(self, op: object) -> None:
        if not isinstance(op, Add | Remove):
            raise self._wrong_op(op, "Add or Remove")
        check_member(op.member, "op.member")

    def _apply(self, op: Add | Remove, seq: int) -> list[Any]:
        me = (self._replica_id, seq)
        if isinstance(op, Add):
            self._add(me, op.member)
            return [["a", me[0], seq, op.member]]
        payload: list[Any] = []
        for dot in sorted(self._dots.get(op.member, ())):
            self._remove(dot, me)
            payload.append(["r", dot[0], dot[1], me[0], seq])
        return payload

    def _add(self, dot: Dot, member: str | int) -> None:
        if dot in self._removed or dot in self._adds:
            return
        self._adds[dot] = member
        self._dots.setdefault(member, set()).add(dot)

    def _remove(self, dot: Dot, by: Dot) -> None:
        old = self._removed.get(dot)
        if old is None or by < old:
            self._removed[dot] = by
        member = self._adds.pop(dot, None)
        if member is not None:
            dots = self._dots[member]
            dots.discard(dot)
            if not dots:
                del self._dots[member]

    def _since(self, sv: VectorClock) -> list[Any]:
        out: list[Any] = []
        for dot in sorted(self._adds):
            if dot[1] > sv.get(dot[0]):
                out.append(["a", dot[0], dot[1], self._adds[dot]])
        for dot in sorted(self._removed):
            by = self._removed[dot]
            if by[1] > sv.get(by[0]):
                out.append(["r", dot[0], dot[1], by[0], by[1]])
        return out

    def _merge(self, payload: list[Any]) -> None:
        for entry in payload:
            if entry[0] == "r":
                self._remove((entry[1], entry[2]), (entry[3], entry[4]))
        for entry in payload:
            if entry[0] == "a":
                self._add((entry[1], entry[2]), entry[3])

    @classmethod
    def _check_payload(
        cls, payload: list[Any], base: VectorClock | None, sv: VectorClock, field: str
    ) -> None:
        for index, entry in enumerate(payload):
            where = f"{field}[{index}]"
            tag = want_list(entry, where)[0] if entry else None
            if tag == "a":
                _, rid, seq, member = want_list(entry, where, 4)
                want_replica(rid, f"{where}[1]")
                want_int(seq, f"{where}[2]", minimum=1)
                want_member(member, f"{where}[3]")
                _check_dot(rid, seq, base, sv, where)
            elif tag == "r":
                _, rid, seq, by_rid, by_seq = want_list(entry, where, 5)
                want_replica(rid, f"{where}[1]")
                want_int(seq, f"{where}[2]", minimum=1)
                want_replica(by_rid, f"{where}[3]")
                want_int(by_seq, f"{where}[4]", minimum=1)
                # The removed add may be one this replica has not seen yet (an
                # operation delta): only the remover's dot must lie in (base, sv].
                _check_dot(by_rid, by_seq, base, sv, where)
            else:
                raise ValueError(f'{where}[0] must be "a" or "r"')


# ---- LWW map on crdts.LWWRegister ---------------------------------------------------------

_LWW_CLOCK_UUID = b"lazarus.lwwmap01"
# The register's timestamp: (wall_ms, logical, replica_id, seq). A total order.
LwwStamp = tuple[int, int, str, int]


class _StampOrder:
    """A ``crdts.ClockProtocol`` that orders LWW stamps; it keeps no time itself.

    ``crdts.LWWRegister`` asks its clock whether one timestamp is later than
    another and tells it about each timestamp it sees; the stamps here are
    total, so "concurrent" only ever means "the same write".
    """

    uuid = _LWW_CLOCK_UUID
    default_ts: LwwStamp = (-1, -1, "", 0)

    def read(self) -> LwwStamp:
        return self.default_ts

    def update(self, data: Any = None) -> Any:
        return data

    @staticmethod
    def is_later(ts1: LwwStamp, ts2: LwwStamp) -> bool:
        return ts1 > ts2

    @staticmethod
    def are_concurrent(ts1: LwwStamp, ts2: LwwStamp) -> bool:
        return ts1 == ts2

    @staticmethod
    def compare(ts1: LwwStamp, ts2: LwwStamp) -> int:
        return (ts1 > ts2) - (ts1 < ts2)

    def pack(self) -> bytes:
        return self.uuid

    @classmethod
    def unpack(cls, data: bytes, /, *, inject: dict[str, Any] | None = None) -> _StampOrder:
        return cls()


_STAMP_ORDER = _StampOrder()


class LWWMap(Document):
    """str -> JSON value map; per key the write with the largest stamp wins.

    Stamps are ``(at.wall_ms, at.logical, replica_id, seq)`` with ``at`` the
    writer's HLC timestamp (Kulkarni et al., 2014), so the order respects
    causality and does not trust wall clocks; replica id and seq break ties.
    Deletes write a tombstone (LWW-element map, Shapiro et al., 2011). Each
    key is a ``crdts.LWWRegister`` holding ``(live, value)``.

    Ops: :class:`Put` and :class:`Delete` with ``at`` set. ``value()``:
    ``dict[str, value]`` of live keys.

    Payload: ``[[key, wall_ms, logical, replica_id, seq, live, value], ...]``
    sorted by key.
    """

    kind = "lww-map"

    def __init__(self, replica_id: str) -> None:
        super().__init__(replica_id)
        self._registers: dict[str, LWWRegister] = {}

    def value(self) -> dict[str, JsonValue]:
        """The live keys and their winning values."""
        out: dict[str, JsonValue] = {}
        for key in sorted(self._registers):
            live, value = self._registers[key].value
            if live:
                out[key] = value
        return out

    def get(self, key: str) -> tuple[bool, JsonValue, HLCTimestamp | None]:
        """``(present, value, winning HLC timestamp)`` for ``key``."""
        register = self._registers.get(key)
        if register is None:
            return False, None, None
        live, value = register.value
        stamp = register.last_update
        return bool(live), value if live else None, HLCTimestamp(stamp[0], stamp[1])

    def _validate_op(self, op: object) -> None:
        if not isinstance(op, Put | Delete):
            raise self._wrong_op(op, "Put or Delete")
        check_key(op.key, "op.key")
        if not isinstance(op.at, HLCTimestamp):
            raise TypeError(f"op.at must be HLCTimestamp for lww-map, got {type(op.at).__name__}")
        if isinstance(op, Put):
            check_value(op.value, "op.value")

    def _apply(self, op: Put | Delete, seq: int) -> list[Any]:
        if op.at is None:  # _validate_op refused it already; this narrows the type
            raise TypeError("op.at must be HLCTimestamp for lww-map")
        live = isinstance(op, Put)
        value = op.value if isinstance(op, Put) else None
        entry = [op.key, op.at.wall_ms, op.at.logical, self._replica_id, seq, live, value]
        self._write(entry)
        return [entry]

    def _write(self, entry: list[Any]) -> None:
        key, wall_ms, logical, rid, seq, live, value = entry
        stamp = (wall_ms, logical, rid, seq)
        register = self._registers.get(key)
        if register is None:
            self._registers[key] = LWWRegister(key, (live, value), _STAMP_ORDER, stamp, rid)
        elif stamp > register.last_update:
            register.update(StateUpdate(_LWW_CLOCK_UUID, stamp, (rid, (live, value))))

    def _since(self, sv: VectorClock) -> list[Any]:
        out: list[Any] = []
        for key in sorted(self._registers):
            register = self._registers[key]
            wall_ms, logical, rid, seq = register.last_update
            if seq > sv.get(rid):
                live, value = register.value
                out.append([key, wall_ms, logical, rid, seq, live, value])
        return out

    def _merge(self, payload: list[Any]) -> None:
        for entry in payload:
            self._write(entry)

    @classmethod
    def _check_payload(
        cls, payload: list[Any], base: VectorClock | None, sv: VectorClock, field: str
    ) -> None:
        for index, entry in enumerate(payload):
            where = f"{field}[{index}]"
            key, wall_ms, logical, rid, seq, live, value = want_list(entry, where, 7)
            want_str(key, f"{where}[0]")
            want_int(wall_ms, f"{where}[1]")
            want_int(logical, f"{where}[2]")
            want_replica(rid, f"{where}[3]")
            want_int(seq, f"{where}[4]", minimum=1)
            if not want_bool(live, f"{where}[5]") and value is not None:
                raise ValueError(f"{where}[6] must be null for a deleted key")
            want_value(value, f"{where}[6]")
            _check_dot(rid, seq, base, sv, where)


# ---- multi-value map with dotted version vectors (ours) --------------------------------


class MVMap(Document):
    """str -> all concurrent values (siblings), by dotted version vectors.

    Follows Preguiça et al. (2010), "Dotted Version Vectors": each write of a
    key is a sibling with a dot and the context (version vector of the key)
    its writer had seen; a sibling is dropped once another sibling's context
    covers its dot. A delete is a tombstone sibling, so a concurrent write
    survives it.

    Ops: :class:`Put` and :class:`Delete` with ``at=None``. ``value()``:
    ``dict[str, list[value]]``, the live siblings of each key ordered by dot.

    Payload: ``[[key, replica_id, seq, {context}, live, value], ...]``.
    """

    kind = "mv-map"

    def __init__(self, replica_id: str) -> None:
        super().__init__(replica_id)
        # key -> dot -> (context, live, value)
        self._keys: dict[str, dict[Dot, tuple[VectorClock, bool, JsonValue]]] = {}

    def value(self) -> dict[str, list[JsonValue]]:
        """Live siblings per key, ordered by (replica_id, seq); keys without any omitted."""
        out: dict[str, list[JsonValue]] = {}
        for key in sorted(self._keys):
            siblings = self._keys[key]
            values = [siblings[dot][2] for dot in sorted(siblings) if siblings[dot][1]]
            if values:
                out[key] = values
        return out

    def context(self, key: str) -> VectorClock:
        """The version vector of ``key``: every write of it this replica has seen."""
        counters: dict[str, int] = {}
        for (rid, seq), (ctx, _, _) in self._keys.get(key, {}).items():
            for crid, cseq in ctx._counters.items():
                if cseq > counters.get(crid, 0):
                    counters[crid] = cseq
            if seq > counters.get(rid, 0):
                counters[rid] = seq
        return VectorClock._trusted(counters)

    def _validate_op(self, op: object) -> None:
        if not isinstance(op, Put | Delete):
            raise self._wrong_op(op, "Put or Delete")
        check_key(op.key, "op.key")
        if op.at is not None:
            raise TypeError("op.at must be None for mv-map (siblings are ordered causally)")
        if isinstance(op, Put):
            check_value(op.value, "op.value")

    def _apply(self, op: Put | Delete, seq: int) -> list[Any]:
        context = self.context(op.key)
        live = isinstance(op, Put)
        value = op.value if isinstance(op, Put) else None
        self._keys[op.key] = {(self._replica_id, seq): (context, live, value)}
        return [[op.key, self._replica_id, seq, context.as_dict(), live, value]]

    def _since(self, sv: VectorClock) -> list[Any]:
        out: list[Any] = []
        for key in sorted(self._keys):
            siblings = self._keys[key]
            for dot in sorted(siblings):
                if dot[1] > sv.get(dot[0]):
                    ctx, live, value = siblings[dot]
                    out.append([key, dot[0], dot[1], ctx.as_dict(), live, value])
        return out

    def _merge(self, payload: list[Any]) -> None:
        for key, rid, seq, ctx, live, value in payload:
            siblings = self._keys.setdefault(key, {})
            dot = (rid, seq)
            if dot in siblings:
                continue
            if any(other[0].get(rid) >= seq for other in siblings.values()):
                continue  # an existing sibling already saw (and replaced) this write
            context = VectorClock._trusted(dict(ctx))
            for old in [d for d in siblings if context.get(d[0]) >= d[1]]:
                del siblings[old]
            siblings[dot] = (context, live, value)

    @classmethod
    def _check_payload(
        cls, payload: list[Any], base: VectorClock | None, sv: VectorClock, field: str
    ) -> None:
        for index, entry in enumerate(payload):
            where = f"{field}[{index}]"
            key, rid, seq, ctx, live, value = want_list(entry, where, 6)
            want_str(key, f"{where}[0]")
            want_replica(rid, f"{where}[1]")
            want_int(seq, f"{where}[2]", minimum=1)
            context = want_clock(ctx, f"{where}[3]")
            if context.get(rid) >= seq:
                raise ValueError(f"{where}[3] context covers the sibling's own dot")
            if not want_bool(live, f"{where}[4]") and value is not None:
                raise ValueError(f"{where}[5] must be null for a tombstone")
            want_value(value, f"{where}[5]")
            _check_dot(rid, seq, base, sv, where)


# ---- append-only RGA (ours) ----------------------------------------------------------------


class RGALog(Document):
    """Append-only replicated log (RGA, Roh et al., 2011, appends at the end only).

    Each entry gets a Lamport time one above the largest this replica has
    seen, so an entry appended after another was seen sorts after it;
    concurrent appends order by ``(lamport, replica_id, seq)``.

    Ops: :class:`Append`. ``value()``: ``list`` of items in log order.

    Payload: ``[[replica_id, seq, lamport, item], ...]`` in log order.
    """

    kind = "rga-log"

    def __init__(self, replica_id: str) -> None:
        super().__init__(replica_id)
        self._order: list[tuple[int, str, int]] = []
        self._items: dict[Dot, JsonValue] = {}
        self._lamport = 0

    def value(self) -> list[JsonValue]:
        """The items in log order."""
        items = self._items
        return [items[(rid, seq)] for _, rid, seq in self._order]

    def __len__(self) -> int:
        return len(self._order)

    def _validate_op(self, op: object) -> None:
        if not isinstance(op, Append):
            raise self._wrong_op(op, "Append")
        check_value(op.item, "op.item")

    def _apply(self, op: Append, seq: int) -> list[Any]:
        lamport = self._lamport + 1
        self._insert(self._replica_id, seq, lamport, op.item)
        return [[self._replica_id, seq, lamport, op.item]]

    def _insert(self, rid: str, seq: int, lamport: int, item: JsonValue) -> None:
        if (rid, seq) in self._items:
            return
        self._items[(rid, seq)] = item
        position = (lamport, rid, seq)
        if not self._order or position > self._order[-1]:
            self._order.append(position)
        else:
            bisect.insort(self._order, position)
        if lamport > self._lamport:
            self._lamport = lamport

    def _since(self, sv: VectorClock) -> list[Any]:
        items = self._items
        return [
            [rid, seq, lamport, items[(rid, seq)]]
            for lamport, rid, seq in self._order
            if seq > sv.get(rid)
        ]

    def _merge(self, payload: list[Any]) -> None:
        for rid, seq, lamport, item in payload:
            self._insert(rid, seq, lamport, item)

    @classmethod
    def _check_payload(
        cls, payload: list[Any], base: VectorClock | None, sv: VectorClock, field: str
    ) -> None:
        for index, entry in enumerate(payload):
            where = f"{field}[{index}]"
            rid, seq, lamport, item = want_list(entry, where, 4)
            want_replica(rid, f"{where}[0]")
            want_int(seq, f"{where}[1]", minimum=1)
            want_int(lamport, f"{where}[2]", minimum=1)
            want_value(item, f"{where}[3]")
            _check_dot(rid, seq, base, sv, where)


KINDS: dict[str, type[Document]] = {
    cls.kind: cls for cls in (GCounter, PNCounter, ORSet, LWWMap, MVMap, RGALog)
}


def new_document(kind: str, replica_id: str) -> Document:
    """An empty replica of the document type named ``kind`` (a key of ``KINDS``).

    Raises:
        ValueError: unknown ``kind`` (gRPC INVALID_ARGUMENT).
        TypeError / ValueError: bad ``replica_id``.
    """
    cls = KINDS.get(kind)
    if cls is None:
        raise ValueError(f"kind {kind!r} is unknown; known: {sorted(KINDS)}")
    return cls(replica_id)


def decode_document(data: bytes, replica_id: str | None = None) -> Document:
    """Decode a document of any kind (dispatch on the encoded ``kind``); see ``Document.decode``."""
    return Document.decode(data, replica_id)
