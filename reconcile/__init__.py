"""Reconciliation after partitions: clocks, siblings, CRDT documents, anti-entropy.

Pure (DESIGN §2): no IO, no clock reads, no global randomness. Modules:

* :mod:`reconcile.vclock` — :class:`VectorClock`, :class:`Ordering` (Mattern 1989).
* :mod:`reconcile.hlc` — :class:`HybridLogicalClock`, :class:`HLCTimestamp`
  (Kulkarni et al. 2014), :class:`ClockDriftError`.
* :mod:`reconcile.versioned` — :class:`VersionedStore` with Dynamo-style
  siblings (DeCandia et al. 2007; dotted version vectors, Preguiça et al. 2010)
  and resolution policies.
* :mod:`reconcile.documents` — delta-state CRDT documents behind
  :class:`Document` (Almeida et al. 2018), partly on the ``crdts`` package.
* :mod:`reconcile.antientropy` — :func:`plan_anti_entropy`, :func:`converged`.
"""

from .antientropy import (
    AntiEntropyPlan,
    StateVectors,
    Transfer,
    converged,
    execute_plan,
    plan_anti_entropy,
    state_vectors,
)
from .documents import (
    KINDS,
    Add,
    Append,
    Decrement,
    Delete,
    Delta,
    Document,
    GCounter,
    Increment,
    LWWMap,
    MVMap,
    Operation,
    ORSet,
    PNCounter,
    Put,
    Remove,
    RGALog,
    decode_document,
    new_document,
)
from .hlc import DEFAULT_MAX_DRIFT_MS, ClockDriftError, HLCTimestamp, HybridLogicalClock
from .vclock import Ordering, VectorClock, check_replica_id
from .versioned import (
    Conflict,
    CrdtMerge,
    CustomResolver,
    GetResult,
    LastWriterWins,
    ResolutionPolicy,
    Sibling,
    VersionedStore,
)

StateVector = VectorClock
"""A document's state vector is a vector clock of per-replica operation counts."""

__all__ = [
    "DEFAULT_MAX_DRIFT_MS",
    "KINDS",
    "Add",
    "AntiEntropyPlan",
    "Append",
    "ClockDriftError",
    "Conflict",
    "CrdtMerge",
    "CustomResolver",
    "Decrement",
    "Delete",
    "Delta",
    "Document",
    "GCounter",
    "GetResult",
    "HLCTimestamp",
    "HybridLogicalClock",
    "Increment",
    "LWWMap",
    "LastWriterWins",
    "MVMap",
    "ORSet",
    "Operation",
    "Ordering",
    "PNCounter",
    "Put",
    "RGALog",
    "Remove",
    "ResolutionPolicy",
    "Sibling",
    "StateVector",
    "StateVectors",
    "Transfer",
    "VectorClock",
    "VersionedStore",
    "check_replica_id",
    "converged",
    "decode_document",
    "execute_plan",
    "new_document",
    "plan_anti_entropy",
    "state_vectors",
]
