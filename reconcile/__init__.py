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
* :mod:`reconcile.hub` — :class:`~reconcile.hub.DocumentHub`, the leader's
  canonical replicas and reconcile sessions.
* :mod:`reconcile.endpoint` — :class:`~reconcile.endpoint.ReplicaEndpoint`, an
  agent's replicas and its side of the delta protocol.

What production runs: ``hub`` (the coordinator's ``coordinator/documents.py``),
``endpoint`` (the agent's ``node_agent/shared.py``), and under them
``documents``, ``vclock``, ``hlc`` and ``_codec``. Library-only, used by
tests and by no server:

* ``versioned`` (Dynamo-style siblings for a plain key-value store): the
  product's multi-value map is the ``mv-map`` document, whose dotted version
  vectors come from the same design; ``VersionedStore`` stays as the tested
  reference of that rule for an embedder that wants versioned values without
  CRDT documents.
* ``antientropy`` (a full pairwise plan over every replica's state vectors):
  the hub does the same exchange incrementally per node and per reconcile
  session, because the leader never sees all replicas at once. The plan stays
  as a tested reference of the exchange for offline tools (for example a
  repair script that holds several replicas' files).

``bench/reconcile_bench.py`` measures the production path (hub + endpoints +
wire codec), not these two.
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
