"""Shared-document wire codecs: ``reconcile`` CRDT deltas and state vectors <-> protobuf.

One codec for both ends of a Session (the agent's :mod:`node_agent.shared` and
the coordinator's :mod:`coordinator.documents` hub) and for the canonical
replicas in Redis. A delta whose ``codec`` is not :data:`CODEC`, or whose ops do
not decode, is skipped and logged, never applied (a poison delta cannot stop
the stream).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from lazarus.v1 import records_pb2
from reconcile.documents import Delta
from reconcile.hub import DocDelta, DocState
from reconcile.vclock import VectorClock

__all__ = [
    "CODEC",
    "crdt_type",
    "deltas_from_pb",
    "deltas_to_pb",
    "doc_states_from_pb",
    "doc_states_to_pb",
    "kind_of",
]

_log = logging.getLogger("lazarus.storage.codecs")

CODEC = "lazarus-crdt-v1"
"""DocumentDelta.codec / DocumentRecord.codec of ``reconcile`` encodings."""

_TYPES: dict[str, int] = {
    "g-counter": records_pb2.CRDT_TYPE_G_COUNTER,
    "pn-counter": records_pb2.CRDT_TYPE_PN_COUNTER,
    "or-set": records_pb2.CRDT_TYPE_OR_SET,
    "lww-map": records_pb2.CRDT_TYPE_LWW_MAP,
    "mv-map": records_pb2.CRDT_TYPE_MV_MAP,
    "rga-log": records_pb2.CRDT_TYPE_RGA,
}
_KINDS_BY_TYPE: dict[int, str] = {int(v): k for k, v in _TYPES.items()}


def crdt_type(kind: str) -> int:
    """records.proto CrdtType of a ``reconcile`` kind."""
    return _TYPES[kind]


def kind_of(crdt: int) -> str:
    """The ``reconcile`` kind of a CrdtType ("" when unknown)."""
    return _KINDS_BY_TYPE.get(int(crdt), "")


def doc_states_to_pb(
    states: Iterable[DocState], target: Any
) -> None:  # target: repeated DocumentStateVector
    """Append ``states`` to a repeated DocumentStateVector field."""
    for ds in states:
        item = target.add(doc_id=ds.doc_id, crdt_type=crdt_type(ds.kind))
        item.state_vector.counters.update(ds.state_vector.as_dict())
        item.op_count = ds.state_vector.total()


def doc_states_from_pb(items: Iterable[records_pb2.DocumentStateVector]) -> tuple[DocState, ...]:
    """DocStates of DocumentStateVectors (entries with an unknown type or bad ids skipped)."""
    out = []
    for item in items:
        kind = kind_of(item.crdt_type)
        if not kind:
            continue
        try:
            sv = VectorClock(dict(item.state_vector.counters))
        except (TypeError, ValueError):
            continue
        out.append(DocState(item.doc_id, kind, sv))
    return tuple(out)


def deltas_to_pb(deltas: Iterable[DocDelta], origin: str, target: Any) -> None:
    """Append ``deltas`` to a repeated DocumentDelta field."""
    for dd in deltas:
        d = dd.delta
        item = target.add(
            doc_id=dd.doc_id,
            crdt_type=crdt_type(d.kind),
            ops=d.encode(),
            codec=CODEC,
            op_count=max(0, d.state_vector.total() - d.base.meet(d.state_vector).total()),
            origin_node_id=origin,
        )
        item.since.counters.update(d.base.as_dict())
        item.until.counters.update(d.state_vector.as_dict())


def deltas_from_pb(items: Iterable[records_pb2.DocumentDelta]) -> tuple[DocDelta, ...]:
    """DocDeltas of DocumentDeltas (unknown codecs and malformed deltas skipped, logged)."""
    out = []
    for item in items:
        if item.codec != CODEC:
            _log.warning("delta of %s: unknown codec %r, skipped", item.doc_id, item.codec)
            continue
        try:
            out.append(DocDelta(item.doc_id, Delta.decode(bytes(item.ops))))
        except (TypeError, ValueError) as exc:
            _log.warning("delta of %s unreadable, skipped: %s", item.doc_id, exc)
    return tuple(out)
