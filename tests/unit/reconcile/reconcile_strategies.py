"""Hypothesis strategies and a small replica harness for the reconcile tests.

Example counts stay modest so the whole reconcile suite runs well under a
minute on a 2-core machine. ``LAZARUS_HYPOTHESIS_PROFILE=thorough`` multiplies
them by ten. No global hypothesis profile is loaded: other suites keep theirs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from random import Random

from hypothesis import settings
from hypothesis import strategies as st

from reconcile import (
    KINDS,
    Add,
    Append,
    Decrement,
    Delete,
    Delta,
    Document,
    HLCTimestamp,
    Increment,
    Operation,
    Put,
    Remove,
    new_document,
)

THOROUGH = os.environ.get("LAZARUS_HYPOTHESIS_PROFILE", "") == "thorough"


def examples(n: int) -> settings:
    """``settings`` with ``n`` examples (10x under the thorough profile), no deadline."""
    return settings(max_examples=n * 10 if THOROUGH else n, deadline=None)


REPLICAS = ("r0", "r1", "r2", "r3")
ALL_KINDS = sorted(KINDS)

json_scalars = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=6)
json_values = st.recursive(
    json_scalars | st.floats(allow_nan=False, allow_infinity=False, width=64),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
members = st.sampled_from(["a", "b", "c", "d", 1, 2])
keys = st.sampled_from(["k1", "k2", "k3", "k4"])
stamps = st.builds(HLCTimestamp, st.integers(0, 6), st.integers(0, 3))


def ops_for(kind: str) -> st.SearchStrategy[Operation]:
    """Operations a document of ``kind`` accepts (small domains, so they collide)."""
    if kind == "g-counter":
        return st.builds(Increment, st.integers(1, 5))
    if kind == "pn-counter":
        return st.builds(Increment, st.integers(1, 5)) | st.builds(Decrement, st.integers(1, 5))
    if kind == "or-set":
        return st.builds(Add, members) | st.builds(Remove, members)
    if kind == "lww-map":
        return st.builds(Put, keys, json_values, stamps) | st.builds(Delete, keys, stamps)
    if kind == "mv-map":
        return st.builds(Put, keys, json_values) | st.builds(Delete, keys)
    if kind == "rga-log":
        return st.builds(Append, json_scalars)
    raise AssertionError(kind)


@dataclass(frozen=True)
class Step:
    """``op`` at replica ``at``; or, when ``op`` is None, ``at`` pulls from ``source``."""

    at: int
    op: Operation | None = None
    source: int = 0


@st.composite
def histories(draw: st.DrawFn, kind: str, n_replicas: int, max_steps: int = 20) -> list[Step]:
    """A script of local ops and pairwise syncs over ``n_replicas`` replicas."""
    steps: list[Step] = []
    for _ in range(draw(st.integers(0, max_steps))):
        at = draw(st.integers(0, n_replicas - 1))
        if draw(st.integers(0, 3)) == 0 and n_replicas > 1:
            steps.append(Step(at, None, draw(st.integers(0, n_replicas - 1))))
        else:
            steps.append(Step(at, draw(ops_for(kind))))
    return steps


def run_history(
    kind: str, n_replicas: int, steps: list[Step]
) -> tuple[list[Document], list[tuple[int, Delta]]]:
    """Play ``steps``; return the replicas and every op delta as (origin, delta)."""
    docs = [new_document(kind, REPLICAS[i]) for i in range(n_replicas)]
    op_deltas: list[tuple[int, Delta]] = []
    for step in steps:
        if step.op is None:
            if step.source != step.at:
                docs[step.at].merge(docs[step.source])
        else:
            op_deltas.append((step.at, docs[step.at].apply(step.op)))
    return docs, op_deltas


def joined(*docs: Document, replica_id: str = "j") -> Document:
    """A fresh replica holding the join of ``docs`` (left to right)."""
    out = docs[0].copy(replica_id)
    for doc in docs[1:]:
        out.merge(doc)
    return out


def same(a: Document, b: Document) -> bool:
    """Equal value and equal state vector."""
    return bool(a.value() == b.value() and a.state_vector() == b.state_vector())


def deliver_until_quiet(
    docs: list[Document], bag: list[tuple[int, Delta]], rng: Random, max_rounds: int = 1000
) -> int:
    """Deliver ``(target, delta)`` messages in random order, re-queueing refused ones.

    Duplicates in ``bag`` are delivered as duplicates. Returns how many
    merges were accepted. Fails if the bag never drains (a delta that can
    never become applicable).
    """
    pending = list(bag)
    accepted = 0
    for _ in range(max_rounds):
        if not pending:
            return accepted
        rng.shuffle(pending)
        refused = []
        for target, delta in pending:
            if docs[target].merge_delta(delta):
                accepted += 1
            else:
                refused.append((target, delta))
        pending = refused
    raise AssertionError(f"{len(pending)} deltas never became applicable")
