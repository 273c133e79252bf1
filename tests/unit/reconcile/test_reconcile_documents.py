"""CRDT documents: semantics per type, merge algebra, delivery-order convergence, codecs."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from reconcile_strategies import (
    ALL_KINDS,
    Step,
    deliver_until_quiet,
    examples,
    histories,
    joined,
    run_history,
    same,
)

from reconcile import (
    KINDS,
    Add,
    Append,
    Decrement,
    Delete,
    Delta,
    Document,
    GCounter,
    HLCTimestamp,
    Increment,
    LWWMap,
    MVMap,
    ORSet,
    PNCounter,
    Put,
    Remove,
    RGALog,
    VectorClock,
    decode_document,
    new_document,
)

T = HLCTimestamp

# ---- semantics, one type at a time ------------------------------------------------


def test_g_counter_sums_concurrent_increments_unlike_a_max_register() -> None:
    a, b = GCounter("a"), GCounter("b")
    a.apply(Increment(1))
    b.apply(Increment(1))
    a.merge(b)
    b.merge(a)
    assert a.value() == b.value() == 2
    assert a.state_vector() == VectorClock({"a": 1, "b": 1})


def test_g_counter_refuses_decrement_and_bad_amounts() -> None:
    counter = GCounter("a")
    with pytest.raises(TypeError, match="op must be Increment"):
        counter.apply(Decrement(1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"op\.amount"):
        counter.apply(Increment(0))
    with pytest.raises(TypeError, match=r"op\.amount"):
        counter.apply(Increment(True))
    assert counter.state_vector() == VectorClock()


def test_pn_counter_goes_negative_and_converges() -> None:
    a, b = PNCounter("a"), PNCounter("b")
    a.apply(Increment(3))
    b.apply(Decrement(5))
    b.apply(Increment(1))
    a.merge(b)
    b.merge(a)
    assert a.value() == b.value() == -1


def test_or_set_add_wins_over_a_concurrent_remove() -> None:
    a, b = ORSet("a"), ORSet("b")
    a.apply(Add("x"))
    b.merge(a)
    b.apply(Remove("x"))
    a.apply(Add("x"))  # concurrent with b's remove: a new dot b never saw
    a.merge(b)
    b.merge(a)
    assert a.value() == b.value() == frozenset({"x"})


def test_or_set_remove_of_an_unseen_add_does_nothing() -> None:
    # crdts.ORSet would let this remove win: its Lamport time is later.
    a, b = ORSet("a"), ORSet("b")
    for _ in range(5):
        b.apply(Add("other"))
    a.apply(Add("x"))
    b.apply(Remove("x"))
    a.merge(b)
    assert "x" in a
    assert a.value() == frozenset({"x", "other"})


def test_or_set_observed_remove_propagates() -> None:
    a, b = ORSet("a"), ORSet("b")
    a.apply(Add(1))
    a.apply(Add("y"))
    b.merge(a)
    b.apply(Remove(1))
    a.merge(b)
    assert a.value() == b.value() == frozenset({"y"})


def test_or_set_members_must_be_str_or_int() -> None:
    s = ORSet("a")
    with pytest.raises(TypeError, match=r"op\.member"):
        s.apply(Add(True))
    with pytest.raises(TypeError, match=r"op\.member"):
        s.apply(Add(1.5))  # type: ignore[arg-type]


def test_lww_map_latest_hlc_wins_whatever_the_arrival_order() -> None:
    a, b = LWWMap("a"), LWWMap("b")
    late = a.apply(Put("k", "late", T(20)))
    early = b.apply(Put("k", "early", T(10, 5)))
    c1, c2 = LWWMap("c1"), LWWMap("c2")
    assert c1.merge_delta(late)
    assert c1.merge_delta(early)
    assert c2.merge_delta(early)
    assert c2.merge_delta(late)
    assert c1.value() == c2.value() == {"k": "late"}
    assert c1.get("k") == (True, "late", T(20))


def test_lww_map_equal_hlc_is_broken_by_replica_id() -> None:
    a, b = LWWMap("a"), LWWMap("b")
    a.apply(Put("k", 1, T(7)))
    b.apply(Put("k", 2, T(7)))
    a.merge(b)
    b.merge(a)
    assert a.value() == b.value() == {"k": 2}


def test_lww_map_delete_is_a_tombstone_that_later_puts_beat() -> None:
    a, b = LWWMap("a"), LWWMap("b")
    a.apply(Put("k", 1, T(1)))
    b.merge(a)
    b.apply(Delete("k", T(2)))
    a.merge(b)
    assert a.value() == {}
    assert a.get("k") == (False, None, T(2))
    a.apply(Put("k", 3, T(3)))
    b.merge(a)
    assert b.value() == {"k": 3}


def test_lww_map_remove_and_set_with_equal_stamps_converge() -> None:
    # crdts.LWWMap diverges here (the remove's None overwrites only when second).
    a, b = LWWMap("a"), LWWMap("b")
    put = a.apply(Put("k", "v", T(5)))
    delete = b.apply(Delete("k", T(5)))
    x, y = LWWMap("x"), LWWMap("y")
    x.merge_delta(put)
    x.merge_delta(delete)
    y.merge_delta(delete)
    y.merge_delta(put)
    assert x.value() == y.value()


def test_lww_map_requires_a_timestamp_and_json_values() -> None:
    m = LWWMap("a")
    with pytest.raises(TypeError, match=r"op\.at"):
        m.apply(Put("k", 1))
    with pytest.raises(TypeError, match=r"op\.value"):
        m.apply(Put("k", (1, 2), T(1)))
    with pytest.raises(ValueError, match=r"op\.value"):
        m.apply(Put("k", float("nan"), T(1)))
    with pytest.raises(TypeError, match=r"op\.key"):
        m.apply(Put(3, 1, T(1)))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"op\.value\['x'\]"):
        m.apply(Put("k", {"x": {1, 2}}, T(1)))


def test_mv_map_keeps_concurrent_writes_as_siblings() -> None:
    a, b = MVMap("a"), MVMap("b")
    a.apply(Put("k", "from-a"))
    b.apply(Put("k", "from-b"))
    a.merge(b)
    assert a.value() == {"k": ["from-a", "from-b"]}
    a.apply(Put("k", "resolved"))  # saw both: replaces both
    b.merge(a)
    assert b.value() == {"k": ["resolved"]}


def test_mv_map_keeps_a_sibling_a_later_write_never_saw() -> None:
    # crdts.MVRegister drops "from-b" here: the later write from a has a larger timestamp.
    a, b, c = MVMap("a"), MVMap("b"), MVMap("c")
    a.apply(Put("k", 1))
    b.apply(Put("k", "from-b"))
    c.merge(a)
    c.merge(b)
    a.apply(Put("k", 2))  # a never saw b's write
    c.merge(a)
    assert c.value() == {"k": [2, "from-b"]}  # ordered by dot: (a, 2) < (b, 1)


def test_mv_map_delete_concurrent_with_put_keeps_the_put() -> None:
    a, b = MVMap("a"), MVMap("b")
    a.apply(Put("k", 1))
    b.merge(a)
    a.apply(Delete("k"))
    b.apply(Put("k", 2))
    a.merge(b)
    b.merge(a)
    assert a.value() == b.value() == {"k": [2]}
    with pytest.raises(TypeError, match=r"op\.at must be None"):
        a.apply(Put("k", 1, T(1)))


def test_rga_log_keeps_equal_items_and_causal_order() -> None:
    # crdts.RGArray would collapse the two "ok" entries (it hashes items by value).
    a, b = RGALog("a"), RGALog("b")
    a.apply(Append("ok"))
    b.merge(a)
    b.apply(Append("ok"))
    a.apply(Append({"role": "user"}))
    a.merge(b)
    b.merge(a)
    assert a.value() == b.value()
    assert a.value()[0] == "ok"
    assert a.value().count("ok") == 2
    a.apply(Append("last"))
    b.merge(a)
    assert b.value()[-1] == "last"
    assert len(b) == 4


def test_merge_delta_refuses_a_delta_that_skips_operations() -> None:
    a, b = ORSet("a"), ORSet("b")
    a.apply(Add("x"))
    second = a.apply(Add("y"))
    assert b.merge_delta(second) is False  # b lacks a's first add
    assert b.value() == frozenset()
    assert b.state_vector() == VectorClock()
    assert b.merge_delta(a.delta_since(b.state_vector())) is True
    assert b.value() == frozenset({"x", "y"})
    assert b.merge_delta(second) is True  # now applicable, and a no-op
    assert b.value() == frozenset({"x", "y"})


def test_merge_checks_kinds_and_types() -> None:
    with pytest.raises(ValueError, match=r"delta\.kind"):
        ORSet("a").merge_delta(GCounter("b").delta_since(VectorClock()))
    with pytest.raises(TypeError, match="delta must be Delta"):
        ORSet("a").merge_delta(b"nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"other\.kind"):
        ORSet("a").merge(GCounter("b"))
    with pytest.raises(TypeError, match="state_vector"):
        ORSet("a").delta_since({"a": 1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kind"):
        new_document("nope", "a")
    with pytest.raises(ValueError, match="replica_id"):
        ORSet("")


def test_delta_since_ships_only_what_is_missing() -> None:
    a = LWWMap("a")
    for i in range(5):
        a.apply(Put(f"k{i}", i, T(i)))
    b = a.copy("b")
    a.apply(Put("k9", 9, T(9)))
    delta = a.delta_since(b.state_vector())
    assert [entry[0] for entry in delta.payload] == ["k9"]
    assert a.delta_since(a.state_vector()).is_empty()


def test_decode_takes_a_new_replica_id_and_checks_the_kind() -> None:
    a = PNCounter("a")
    a.apply(Increment(2))
    data = a.encode()
    b = PNCounter.decode(data, replica_id="b")
    assert b.replica_id == "b"
    assert b.value() == 2
    b.apply(Increment(1))
    a.merge(b)
    assert a.value() == 3
    assert isinstance(decode_document(data), PNCounter)
    with pytest.raises(ValueError, match=r"document\.kind"):
        ORSet.decode(data)


def test_decode_refuses_state_beyond_its_state_vector() -> None:
    a = ORSet("a")
    a.apply(Add("x"))
    doc = json.loads(a.encode())
    doc["sv"] = {}
    with pytest.raises(ValueError, match="beyond the state vector"):
        ORSet.decode(json.dumps(doc).encode())


# ---- merge algebra, every type -----------------------------------------------------


@pytest.mark.parametrize("kind", ALL_KINDS)
@examples(30)
@given(data=st.data())
def test_merge_is_commutative_associative_and_idempotent(kind: str, data: st.DataObject) -> None:
    steps = data.draw(histories(kind, 3, max_steps=18), label="history")
    (a, b, c), _ = run_history(kind, 3, steps)
    assert same(joined(a, b), joined(b, a))
    assert same(joined(joined(a, b), c), joined(a, joined(b, c)))
    assert same(joined(a, a), a)
    ab = joined(a, b)
    assert same(joined(ab, b), ab)


@pytest.mark.parametrize("kind", ALL_KINDS)
@examples(30)
@given(data=st.data())
def test_any_delivery_order_with_duplicates_converges(kind: str, data: st.DataObject) -> None:
    n = data.draw(st.integers(2, 4), label="replicas")
    steps = data.draw(histories(kind, n, max_steps=24), label="history")
    rng = data.draw(st.randoms(use_true_random=False), label="network")
    docs, op_deltas = run_history(kind, n, steps)

    # Every op delta to every other replica, 1-3 copies each, through bytes.
    bag: list[tuple[int, Delta]] = []
    for origin, delta in op_deltas:
        wire = Delta.decode(delta.encode())
        assert wire == delta
        for target in range(n):
            if target != origin:
                bag += [(target, wire)] * rng.randint(1, 3)
    # Plus state-vector deltas computed now (targets' vectors only grow, so
    # they stay applicable) and strays sent to the wrong replica once.
    for _ in range(rng.randint(0, 4)):
        source, target = rng.randrange(n), rng.randrange(n)
        bag.append((target, docs[source].delta_since(docs[target].state_vector())))
    strays = [docs[rng.randrange(n)].delta_since(docs[rng.randrange(n)].state_vector())]
    for stray in strays:
        docs[rng.randrange(n)].merge_delta(stray)

    deliver_until_quiet(docs, bag, rng)
    for doc in docs[1:]:
        assert same(doc, docs[0]), (doc.value(), docs[0].value())
    expected = joined(*docs)
    assert same(expected, docs[0])


# ---- encoding -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ALL_KINDS)
@examples(25)
@given(data=st.data())
def test_documents_and_deltas_round_trip_through_bytes(kind: str, data: st.DataObject) -> None:
    steps = data.draw(histories(kind, 2, max_steps=15), label="history")
    (a, b), op_deltas = run_history(kind, 2, steps)
    for doc in (a, b):
        data_bytes = doc.encode()
        again = type(doc).decode(data_bytes)
        assert same(again, doc)
        assert again.replica_id == doc.replica_id
        assert again.encode() == data_bytes
    for _, delta in op_deltas:
        assert Delta.decode(delta.encode()) == delta
    delta = a.delta_since(b.state_vector())
    assert Delta.decode(delta.encode()) == delta


def _decodes_or_value_error(blob: bytes) -> None:
    for decoder in (Delta.decode, Document.decode, decode_document):
        with contextlib.suppress(ValueError):
            decoder(blob)


@examples(150)
@given(blob=st.binary(max_size=200))
def test_garbage_bytes_raise_value_error_only(blob: bytes) -> None:
    _decodes_or_value_error(blob)


garbage_json = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 2**65) | st.text(max_size=3) | st.floats(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=12,
)


@examples(200)
@given(
    kind=st.sampled_from([*ALL_KINDS, "nope"]),
    what=st.sampled_from(["delta", "document"]),
    body=garbage_json,
    sv=garbage_json | st.just({"r0": 5, "r1": 5}),
)
def test_well_formed_json_with_garbage_fields_raises_value_error_only(
    kind: str, what: str, body: object, sv: object
) -> None:
    top: dict[str, object] = {"format": f"lazarus.reconcile.{what}", "v": 1, "kind": kind}
    if what == "delta":
        top |= {"base": {}, "sv": sv, "payload": body}
    else:
        top |= {"replica": "r0", "sv": sv, "state": body}
    try:
        blob = json.dumps(top).encode()
    except ValueError:
        return
    _decodes_or_value_error(blob)
    # The same garbage wrapped one level down, where a payload entry belongs.
    if what == "delta":
        top["payload"] = [body, body]
    else:
        top["state"] = [body]
    _decodes_or_value_error(json.dumps(top).encode())


@pytest.mark.parametrize("kind", ALL_KINDS)
@examples(20)
@given(data=st.data())
def test_mutated_encodings_raise_value_error_only(kind: str, data: st.DataObject) -> None:
    steps = data.draw(histories(kind, 2, max_steps=8), label="history")
    (a, _), _ = run_history(kind, 2, steps)
    blob = bytearray(
        data.draw(st.sampled_from([a.encode(), a.delta_since(VectorClock()).encode()]))
    )
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(blob) - 1))
        action = data.draw(st.integers(0, 2))
        if action == 0:
            blob[i] = data.draw(st.integers(0, 255))
        elif action == 1:
            del blob[i]
        else:
            blob.insert(i, data.draw(st.sampled_from(b'0123456789",[]{}:-aert')))
        if not blob:
            break
    _decodes_or_value_error(bytes(blob))


def test_specific_bad_payloads_name_the_field() -> None:
    def delta(kind: str, payload: object, sv: dict[str, int] | None = None) -> bytes:
        return json.dumps(
            {
                "format": "lazarus.reconcile.delta",
                "v": 1,
                "kind": kind,
                "base": {},
                "sv": sv if sv is not None else {"a": 3},
                "payload": payload,
            }
        ).encode()

    cases = [
        (delta("g-counter", [["a", 1, 1, 1]]), r"payload\[0\]\[2\] must be 0"),
        (delta("or-set", [["a", "a", 1, True]]), r"payload\[0\]\[3\]"),
        (delta("or-set", [["a", "a", 9, "x"]]), "beyond the state vector"),
        (delta("lww-map", [["k", 1, 0, "a", 1, False, 3]]), r"payload\[0\]\[6\] must be null"),
        (delta("mv-map", [["k", "a", 1, {"a": 1}, True, 1]]), "covers the sibling's own dot"),
        (delta("rga-log", [["a", 1, 0, "x"]]), r"payload\[0\]\[2\]"),
        (delta("rga-log", [], sv={"a": 0}), r"delta\.sv\['a'\]"),
        (delta("nope", []), r"delta\.kind 'nope' is unknown"),
        (b"\xff", "not valid UTF-8 JSON"),
        (b"[" * 100_000, "JSON"),
        (b'{"format": "lazarus.reconcile.delta", "v": NaN}', "NaN"),
    ]
    for blob, message in cases:
        with pytest.raises(ValueError, match=message):
            Delta.decode(blob)


def test_every_kind_is_registered_and_constructible() -> None:
    assert set(KINDS) == {"g-counter", "pn-counter", "or-set", "lww-map", "mv-map", "rga-log"}
    for kind, cls in KINDS.items():
        doc = new_document(kind, "a")
        assert isinstance(doc, cls)
        assert doc.kind == kind
        assert Step(0).op is None
