"""Anti-entropy planning: which replica ships which delta to whom after a partition.

Theory of operation
-------------------
Push-pull anti-entropy (Demers et al., 1987, "Epidemic Algorithms for
Replicated Database Maintenance") with state-vector summaries in place of
checksums, as in Bayou (Petersen et al., 1997) and the delta-CRDT sync of
Almeida et al. (2018). The leader gathers every replica's state vector per
document; the goal for a document is the join (pointwise max) of all of
them. For every replica that is behind the goal, the plan picks sources
greedily — the replica that fully covers the most of the target's missing
entries first, ties to the smaller replica id — until every missing entry
is covered. Each :class:`Transfer` says: ``source`` sends
``delta_since(since)`` of ``doc_id`` to ``target``, where ``since`` is the
target's state vector. Executing every transfer of a plan (in any order)
brings every replica to the goal, provided no replica changed meanwhile;
otherwise plan again. :func:`converged` holds when every replica reports the
same state vector for every document (a replica without a document counts
as the empty vector).

Pure: the plan is data. :func:`execute_plan` runs a plan against in-memory
:class:`~reconcile.documents.Document` replicas (tests, simulations,
benchmarks); the shell does the same over the network.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .documents import Document
from .vclock import VectorClock, check_replica_id

__all__ = [
    "AntiEntropyPlan",
    "InvariantViolation",
    "StateVectors",
    "Transfer",
    "converged",
    "execute_plan",
    "plan_anti_entropy",
    "state_vectors",
]


class InvariantViolation(RuntimeError):
    """The planner broke its own invariant (a bug here, not bad input)."""


# replica_id -> doc_id -> state vector
StateVectors = Mapping[str, Mapping[str, VectorClock]]


@dataclass(frozen=True, slots=True)
class Transfer:
    """One delta to ship.

    Attributes:
        doc_id: the document.
        source: the replica that computes ``delta_since(since)``.
        target: the replica that merges it.
        since: the target's state vector when planned.
        provides: the entries of the goal this transfer brings the target to
            (``{replica_id: counter}``, the part of the source's vector the
            target lacked).
    """

    doc_id: str
    source: str
    target: str
    since: VectorClock
    provides: VectorClock


@dataclass(frozen=True, slots=True)
class AntiEntropyPlan:
    """The transfers that bring every replica to ``goals``.

    Attributes:
        transfers: sorted by (doc_id, target, source).
        goals: doc_id -> the join of every replica's state vector.
    """

    transfers: tuple[Transfer, ...]
    goals: Mapping[str, VectorClock]

    def __len__(self) -> int:
        return len(self.transfers)

    def __bool__(self) -> bool:
        return bool(self.transfers)

    def for_target(self, replica_id: str) -> tuple[Transfer, ...]:
        """The transfers ``replica_id`` receives."""
        return tuple(t for t in self.transfers if t.target == replica_id)

    def for_source(self, replica_id: str) -> tuple[Transfer, ...]:
        """The transfers ``replica_id`` sends."""
        return tuple(t for t in self.transfers if t.source == replica_id)


def _check(replicas: object) -> dict[str, dict[str, VectorClock]]:
    if not isinstance(replicas, Mapping):
        raise TypeError(f"replicas must be a mapping, got {type(replicas).__name__}")
    out: dict[str, dict[str, VectorClock]] = {}
    for rid, docs in replicas.items():
        check_replica_id(rid, "replicas key")
        if not isinstance(docs, Mapping):
            raise TypeError(f"replicas[{rid!r}] must be a mapping of doc_id to VectorClock")
        clean: dict[str, VectorClock] = {}
        for doc_id, sv in docs.items():
            if type(doc_id) is not str:
                raise TypeError(f"replicas[{rid!r}] keys must be str doc ids")
            if not isinstance(sv, VectorClock):
                raise TypeError(
                    f"replicas[{rid!r}][{doc_id!r}] must be VectorClock, got {type(sv).__name__}"
                )
            clean[doc_id] = sv
        out[rid] = clean
    return out


def plan_anti_entropy(replicas: StateVectors) -> AntiEntropyPlan:
    """Plan the deltas that make every replica's state vectors equal.

    Args:
        replicas: ``{replica_id: {doc_id: state_vector}}``; a replica that
            lacks a document (or has never seen it) may omit it.

    Returns:
        An :class:`AntiEntropyPlan`; empty when :func:`converged` holds.

    Raises:
        TypeError / ValueError: a malformed mapping; the message names
            ``replicas[<id>][<doc>]`` (gRPC INVALID_ARGUMENT).
    """
    views = _check(replicas)
    empty = VectorClock()
    order = sorted(views)
    doc_ids = sorted({doc_id for docs in views.values() for doc_id in docs})
    goals: dict[str, VectorClock] = {}
    transfers: list[Transfer] = []
    for doc_id in doc_ids:
        goal = empty
        for rid in order:
            goal = goal.merge(views[rid].get(doc_id, empty))
        goals[doc_id] = goal
        for target in order:
            have = views[target].get(doc_id, empty)
            lacking = {r for r, n in goal.items() if have.get(r) < n}
            while lacking:
                best: str | None = None
                best_cover: set[str] = set()
                for source in order:
                    if source == target:
                        continue
                    sv = views[source].get(doc_id, empty)
                    cover = {r for r in lacking if sv.get(r) >= goal.get(r)}
                    if len(cover) > len(best_cover):
                        best, best_cover = source, cover
                if best is None:  # pragma: no cover - the goal's owner always covers
                    raise InvariantViolation(
                        f"no replica covers {sorted(lacking)} of {doc_id!r} for {target!r}"
                    )
                source_sv = views[best].get(doc_id, empty)
                provides = VectorClock._trusted(
                    {r: n for r, n in source_sv.items() if have.get(r) < n}
                )
                transfers.append(Transfer(doc_id, best, target, have, provides))
                lacking -= best_cover
    transfers.sort(key=lambda t: (t.doc_id, t.target, t.source))
    return AntiEntropyPlan(tuple(transfers), goals)


def converged(replicas: StateVectors) -> bool:
    """True when every replica has the same state vector for every document.

    Args / Raises: as :func:`plan_anti_entropy`.
    """
    views = _check(replicas)
    empty = VectorClock()
    doc_ids = {doc_id for docs in views.values() for doc_id in docs}
    for doc_id in doc_ids:
        vectors = {views[rid].get(doc_id, empty) for rid in views}
        if len(vectors) > 1:
            return False
    return True


def state_vectors(
    documents: Mapping[str, Mapping[str, Document]],
) -> dict[str, dict[str, VectorClock]]:
    """``{replica_id: {doc_id: doc.state_vector()}}`` for in-memory replicas."""
    return {
        rid: {doc_id: doc.state_vector() for doc_id, doc in docs.items()}
        for rid, docs in documents.items()
    }


def execute_plan(plan: AntiEntropyPlan, documents: Mapping[str, Mapping[str, Document]]) -> int:
    """Run ``plan`` against in-memory replicas: each source's delta is merged by its target.

    Args:
        plan: from :func:`plan_anti_entropy`.
        documents: ``{replica_id: {doc_id: Document}}``. A target without
            the document must have it created by the caller first.

    Returns:
        How many deltas were merged (``merge_delta`` returned True).

    Raises:
        KeyError: a replica or document named in the plan is missing.
    """
    merged = 0
    for transfer in plan.transfers:
        source = documents[transfer.source][transfer.doc_id]
        target = documents[transfer.target][transfer.doc_id]
        if target.merge_delta(source.delta_since(transfer.since)):
            merged += 1
    return merged
