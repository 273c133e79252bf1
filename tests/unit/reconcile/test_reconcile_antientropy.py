"""Anti-entropy planning: who sends which delta to whom, and convergence after a partition."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from reconcile_strategies import ALL_KINDS, REPLICAS, examples, histories, run_history, same

from reconcile import (
    Add,
    Append,
    Document,
    HLCTimestamp,
    LWWMap,
    ORSet,
    Put,
    Transfer,
    VectorClock,
    converged,
    execute_plan,
    new_document,
    plan_anti_entropy,
    state_vectors,
)

V = VectorClock


def test_plan_sends_each_side_what_it_lacks() -> None:
    plan = plan_anti_entropy(
        {
            "a": {"doc": V({"a": 3, "b": 1})},
            "b": {"doc": V({"b": 2})},
            "c": {},
        }
    )
    assert plan.goals == {"doc": V({"a": 3, "b": 2})}
    assert plan.transfers == (
        Transfer("doc", "b", "a", V({"a": 3, "b": 1}), V({"b": 2})),
        Transfer("doc", "a", "b", V({"b": 2}), V({"a": 3})),
        Transfer("doc", "a", "c", V(), V({"a": 3, "b": 1})),
        Transfer("doc", "b", "c", V(), V({"b": 2})),
    )
    assert [t.source for t in plan.for_target("c")] == ["a", "b"]
    assert len(plan.for_source("a")) == 2
    assert not converged({"a": {"doc": V({"a": 1})}, "b": {}})


def test_one_source_covering_everything_is_preferred() -> None:
    plan = plan_anti_entropy(
        {
            "a": {"d": V({"a": 1})},
            "b": {"d": V({"b": 1})},
            "c": {"d": V({"a": 1, "b": 1})},
            "z": {},
        }
    )
    assert [(t.source, t.target) for t in plan.for_target("z")] == [("c", "z")]


def test_converged_and_empty_plans() -> None:
    same_views = {"a": {"d": V({"a": 1})}, "b": {"d": V({"a": 1})}}
    assert converged(same_views)
    assert not plan_anti_entropy(same_views)
    assert converged({})
    assert converged({"a": {"d": V()}, "b": {}})


def test_bad_input_names_the_field() -> None:
    with pytest.raises(TypeError, match=r"replicas\['a'\]\['d'\] must be VectorClock"):
        plan_anti_entropy({"a": {"d": {"a": 1}}})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="replicas must be a mapping"):
        converged([])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="replicas key must not be empty"):
        plan_anti_entropy({"": {}})


def test_partition_heals_in_one_round() -> None:
    left = {r: {"cart": ORSet(r), "prefs": LWWMap(r)} for r in ("a", "b")}
    right = {r: {"cart": ORSet(r), "prefs": LWWMap(r)} for r in ("c",)}
    docs: dict[str, dict[str, Document]] = {**left, **right}
    docs["a"]["cart"].apply(Add("apple"))
    docs["b"]["cart"].apply(Add("pear"))
    docs["c"]["cart"].apply(Add("fig"))
    docs["a"]["prefs"].apply(Put("theme", "dark", HLCTimestamp(10)))
    docs["c"]["prefs"].apply(Put("theme", "light", HLCTimestamp(12)))
    plan = plan_anti_entropy(state_vectors(docs))
    assert execute_plan(plan, docs) == len(plan)
    assert converged(state_vectors(docs))
    for r in docs:
        assert docs[r]["cart"].value() == frozenset({"apple", "pear", "fig"})
        assert docs[r]["prefs"].value() == {"theme": "light"}


@pytest.mark.parametrize("kind", ALL_KINDS)
@examples(25)
@given(data=st.data())
def test_plans_converge_even_after_stray_deltas(kind: str, data: st.DataObject) -> None:
    """Deltas sent to the wrong replica are refused, so state vectors stay honest.

    Afterwards anti-entropy alone (no op deltas) must reach equal state vectors
    *and* equal values: a replica that had claimed operations it lacked would
    never be sent them.
    """
    n = data.draw(st.integers(2, 4), label="replicas")
    steps = data.draw(histories(kind, n, max_steps=20), label="history")
    rng = data.draw(st.randoms(use_true_random=False), label="strays")
    docs, _ = run_history(kind, n, steps)
    for _ in range(rng.randint(0, 6)):
        source, meant_for, hits = rng.randrange(n), rng.randrange(n), rng.randrange(n)
        docs[hits].merge_delta(docs[source].delta_since(docs[meant_for].state_vector()))
    by_replica = {REPLICAS[i]: {"doc": docs[i]} for i in range(n)}
    plan = plan_anti_entropy(state_vectors(by_replica))
    execute_plan(plan, by_replica)
    assert converged(state_vectors(by_replica))
    assert not plan_anti_entropy(state_vectors(by_replica))
    for doc in docs[1:]:
        assert same(doc, docs[0])


@examples(60)
@given(
    views=st.dictionaries(
        st.sampled_from(["a", "b", "c", "d"]),
        st.dictionaries(
            st.sampled_from(["x", "y"]),
            st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 5)).map(V),
        ),
        max_size=4,
    )
)
def test_a_plan_covers_every_gap(views: dict[str, dict[str, VectorClock]]) -> None:
    plan = plan_anti_entropy(views)
    after = {r: dict(docs) for r, docs in views.items()}
    for t in plan.transfers:
        assert t.source != t.target
        assert t.since == views[t.target].get(t.doc_id, V())
        source_sv = views[t.source][t.doc_id]
        after[t.target][t.doc_id] = after[t.target].get(t.doc_id, V()).merge(source_sv)
    assert converged(after)
    assert converged(views) == (not plan)


def test_new_replica_without_a_document_gets_all_of_it() -> None:
    a = new_document("rga-log", "a")
    for i in range(3):
        a.apply(Append(i))
    docs: dict[str, dict[str, Document]] = {
        "a": {"log": a},
        "b": {"log": new_document("rga-log", "b")},
    }
    views = state_vectors(docs)
    views["b"] = {}
    plan = plan_anti_entropy(views)
    execute_plan(plan, docs)
    assert docs["b"]["log"].value() == [0, 1, 2]
