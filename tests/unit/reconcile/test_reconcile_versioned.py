"""Dynamo-style siblings with dotted version vectors, resolution policies, conflict records."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st
from reconcile_strategies import examples

from reconcile import (
    Add,
    CrdtMerge,
    CustomResolver,
    GCounter,
    HLCTimestamp,
    LastWriterWins,
    ORSet,
    Sibling,
    VectorClock,
    VersionedStore,
)

T = HLCTimestamp


def test_put_with_the_read_context_replaces_what_was_read() -> None:
    store: VersionedStore[str] = VersionedStore("a")
    first = store.put("k", "v1", VectorClock(), T(1))
    assert first.dot == ("a", 1)
    got = store.get("k")
    assert got.values == ("v1",)
    store.put("k", "v2", got.context, T(2))
    assert store.get("k").values == ("v2",)
    assert store.get("missing").siblings == ()


def test_two_clients_writing_through_one_replica_keep_both_versions() -> None:
    # Plain version vectors would let the second write dominate the first.
    store: VersionedStore[str] = VersionedStore("a")
    base = store.get("k").context
    store.put("k", "client-1", base, T(1))
    store.put("k", "client-2", base, T(2))  # blind of client-1's write
    got = store.get("k")
    assert sorted(got.values) == ["client-1", "client-2"]
    assert got.context == VectorClock({"a": 2})
    store.put("k", "merged", got.context, T(3))
    assert store.get("k").values == ("merged",)


def test_replication_keeps_concurrent_siblings_and_drops_obsolete_ones() -> None:
    a: VersionedStore[str] = VersionedStore("a")
    b: VersionedStore[str] = VersionedStore("b")
    a.put("k", "from-a", VectorClock(), T(5))
    b.put("k", "from-b", VectorClock(), T(3))
    assert a.merge("k", b.siblings("k")) == 1
    assert b.merge_store(a) == 1
    assert a.get("k").values == b.get("k").values == ("from-a", "from-b")
    assert a.merge("k", b.siblings("k")) == 0  # idempotent
    b.put("k", "newer", b.get("k").context, T(9))
    a.merge("k", b.siblings("k"))
    assert a.get("k").values == ("newer",)


def test_lww_resolution_uses_hlc_then_dot_and_is_recorded() -> None:
    a: VersionedStore[str] = VersionedStore("a")
    b: VersionedStore[str] = VersionedStore("b")
    a.put("k", "older-wall-clock-but-later-hlc", VectorClock(), T(100, 2))
    b.put("k", "loser", VectorClock(), T(100, 1))
    a.merge("k", b.siblings("k"))
    assert a.conflict_count == 0
    value = a.resolve("k", LastWriterWins(), T(101))
    assert value == "older-wall-clock-but-later-hlc"
    assert a.get("k").values == (value,)
    assert a.conflict_count == 1
    (conflict,) = a.conflicts()
    assert conflict.key == "k"
    assert conflict.policy == "lww"
    assert len(conflict.siblings) == 2
    assert conflict.resolved.value == value
    assert a.resolve("k", LastWriterWins(), T(102)) == value  # one sibling: no conflict
    assert a.conflict_count == 1
    # The resolution replaces b's sibling once replicated back.
    b.merge("k", a.siblings("k"))
    assert b.get("k").values == (value,)


def test_crdt_merge_resolution_joins_documents() -> None:
    a: VersionedStore[ORSet] = VersionedStore("a")
    s1, s2 = ORSet("x"), ORSet("y")
    s1.apply(Add("apple"))
    s2.apply(Add("pear"))
    a.put("cart", s1, VectorClock(), T(1))
    a.put("cart", s2, VectorClock(), T(2))
    merged = a.resolve("cart", CrdtMerge(), T(3))
    assert merged is not None
    assert merged.value() == frozenset({"apple", "pear"})
    assert s1.value() == frozenset({"apple"})  # siblings untouched
    assert a.conflicts("cart")[0].policy == "crdt-merge"


def test_crdt_merge_refuses_non_documents() -> None:
    store: VersionedStore[object] = VersionedStore("a")
    store.put("k", 1, VectorClock(), T(1))
    store.put("k", GCounter("g"), VectorClock(), T(2))
    with pytest.raises(TypeError, match=r"siblings\[0\]\.value must be a Document"):
        store.resolve("k", CrdtMerge(), T(3))  # type: ignore[arg-type]
    assert store.conflict_count == 0


def test_custom_resolver_and_resolve_all() -> None:
    store: VersionedStore[int] = VersionedStore("a")
    for key in ("x", "y", "z"):
        store.put(key, 1, VectorClock(), T(1))
        store.put(key, 2, VectorClock(), T(2))
    store.put("single", 7, VectorClock(), T(1))

    def total(key: str, siblings: Sequence[Sibling[int]]) -> int:
        return sum(s.value for s in siblings)

    assert store.resolve_all(CustomResolver(total, name="sum"), T(3)) == 3
    assert store.get("x").values == (3,)
    assert [c.key for c in store.conflicts()] == ["x", "y", "z"]
    assert {c.policy for c in store.conflicts()} == {"sum"}
    with pytest.raises(TypeError, match="fn must be callable"):
        CustomResolver(3)  # type: ignore[arg-type]


def test_bad_arguments_name_the_field() -> None:
    store: VersionedStore[int] = VersionedStore("a")
    with pytest.raises(TypeError, match="context must be VectorClock"):
        store.put("k", 1, {"a": 1}, T(1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="at must be HLCTimestamp"):
        store.put("k", 1, VectorClock(), 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key must be str"):
        store.get(5)  # type: ignore[arg-type]
    bad = Sibling(1, ("b", 1), VectorClock({"b": 1}), T(1))
    with pytest.raises(ValueError, match=r"siblings\[0\]\.context covers its own dot"):
        store.merge("k", [bad])


# Property: replicas that exchange sibling sets in any order end with the same
# siblings, and no write that was never read is lost.
actions = st.lists(
    st.tuples(
        st.integers(0, 2), st.sampled_from(["blind", "read-write", "sync"]), st.integers(0, 2)
    ),
    max_size=25,
)


@examples(80)
@given(script=actions, order=st.permutations([0, 1, 2]))
def test_sibling_sync_converges_and_loses_no_unread_write(
    script: list[tuple[int, str, int]], order: list[int]
) -> None:
    stores: list[VersionedStore[int]] = [VersionedStore(f"r{i}") for i in range(3)]
    written = 0
    superseded: set[int] = set()
    for who, action, other in script:
        store = stores[who]
        if action == "sync":
            store.merge("k", stores[other].siblings("k"))
            continue
        written += 1
        if action == "read-write":
            superseded |= set(store.get("k").values)
            store.put("k", written, store.get("k").context, T(written))
        else:
            store.put("k", written, VectorClock(), T(written))
    for i in order:
        for j in order:
            stores[i].merge("k", stores[j].siblings("k"))
    for i in order:
        for j in order:
            stores[i].merge("k", stores[j].siblings("k"))
    final = [s.get("k") for s in stores]
    assert final[0].values == final[1].values == final[2].values
    assert final[0].context == final[1].context == final[2].context
    # Exactly the writes no client read-and-replaced survive (dotted version
    # vectors do not let a blind write dominate a sibling it never saw).
    assert set(final[0].values) == set(range(1, written + 1)) - superseded
