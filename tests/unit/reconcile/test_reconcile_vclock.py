"""Vector clocks: operations, happens-before on simulated histories, the compact encoding."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from reconcile_strategies import examples

from reconcile import Ordering, VectorClock

ids = st.sampled_from(["a", "b", "c", "d", "é", "node-7"])
clocks = st.dictionaries(ids, st.integers(0, 2**64 - 1), max_size=6).map(VectorClock)
small_clocks = st.dictionaries(ids, st.integers(0, 4), max_size=4).map(VectorClock)


def test_basics() -> None:
    v = VectorClock({"a": 2, "b": 0})
    assert v == VectorClock({"a": 2})
    assert v.get("b") == 0
    assert v.increment("b").as_dict() == {"a": 2, "b": 1}
    assert v.merge(VectorClock({"a": 1, "c": 3})) == VectorClock({"a": 2, "c": 3})
    assert v.compare(v.increment("a")) is Ordering.BEFORE
    assert v.increment("a").compare(v) is Ordering.AFTER
    assert v.compare(VectorClock({"a": 2})) is Ordering.EQUAL
    assert VectorClock({"a": 1}).compare(VectorClock({"b": 1})) is Ordering.CONCURRENT
    assert VectorClock({"a": 1}) < VectorClock({"a": 1, "b": 1})
    assert hash(v) == hash(VectorClock({"a": 2}))
    assert repr(v) == "VectorClock({'a': 2})"


def test_bad_arguments_name_the_field() -> None:
    with pytest.raises(TypeError, match=r"counters\['a'\] must be int"):
        VectorClock({"a": "1"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match=r"counters\['a'\]"):
        VectorClock({"a": -1})
    with pytest.raises(TypeError, match="counters key must be str"):
        VectorClock({1: 1})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="replica_id must not be empty"):
        VectorClock().increment("")
    with pytest.raises(ValueError, match="255"):
        VectorClock({"x" * 256: 1})
    with pytest.raises(ValueError, match="2\\*\\*64-1"):
        VectorClock({"a": 2**64 - 1}).increment("a")
    with pytest.raises(TypeError, match="other must be VectorClock"):
        VectorClock().compare({"a": 1})  # type: ignore[arg-type]


@examples(100)
@given(a=small_clocks, b=small_clocks, c=small_clocks)
def test_merge_is_a_join(a: VectorClock, b: VectorClock, c: VectorClock) -> None:
    assert a.merge(b) == b.merge(a)
    assert a.merge(b).merge(c) == a.merge(b.merge(c))
    assert a.merge(a) == a
    assert a.merge(b).descends(a)
    assert a.merge(b).descends(b)
    order = a.compare(b)
    assert (
        b.compare(a)
        is {
            Ordering.BEFORE: Ordering.AFTER,
            Ordering.AFTER: Ordering.BEFORE,
            Ordering.EQUAL: Ordering.EQUAL,
            Ordering.CONCURRENT: Ordering.CONCURRENT,
        }[order]
    )
    assert (order is Ordering.EQUAL) == (a == b)


# ---- happens-before on simulated message-passing histories ----------------------

history_steps = st.lists(
    st.tuples(st.sampled_from(["local", "send", "recv"]), st.integers(0, 3), st.integers(0, 50)),
    max_size=40,
)


@examples(120)
@given(n=st.integers(2, 4), script=history_steps)
def test_compare_agrees_with_happens_before(n: int, script: list[tuple[str, int, int]]) -> None:
    names = [f"p{i}" for i in range(n)]
    clocks = [VectorClock() for _ in range(n)]
    last_event: list[int | None] = [None] * n
    stamps: list[VectorClock] = []
    edges: list[set[int]] = []  # event -> events it directly precedes
    in_flight: list[tuple[int, VectorClock, int]] = []  # (to, clock, send event)

    def event(p: int, clock: VectorClock, extra_pred: int | None = None) -> int:
        idx = len(stamps)
        stamps.append(clock)
        edges.append(set())
        if last_event[p] is not None:
            edges[last_event[p]].add(idx)
        if extra_pred is not None:
            edges[extra_pred].add(idx)
        last_event[p] = idx
        return idx

    for kind, who, pick in script:
        p = who % n
        if kind == "recv" and in_flight:
            to, msg_clock, send_idx = in_flight.pop(pick % len(in_flight))
            clocks[to] = clocks[to].merge(msg_clock).increment(names[to])
            event(to, clocks[to], send_idx)
        else:
            clocks[p] = clocks[p].increment(names[p])
            idx = event(p, clocks[p])
            if kind == "send":
                in_flight.append(((p + 1 + pick) % n, clocks[p], idx))

    reach: list[set[int]] = [set() for _ in stamps]
    for i in reversed(range(len(stamps))):  # edges only go forward in creation order
        for j in edges[i]:
            reach[i] |= {j} | reach[j]
    for i in range(len(stamps)):
        for j in range(len(stamps)):
            got = stamps[i].compare(stamps[j])
            if i == j:
                assert got is Ordering.EQUAL
            elif j in reach[i]:
                assert got is Ordering.BEFORE, (i, j)
            elif i in reach[j]:
                assert got is Ordering.AFTER, (i, j)
            else:
                assert got is Ordering.CONCURRENT, (i, j)


# ---- encoding -----------------------------------------------------------------------


def test_encoding_is_documented_and_canonical() -> None:
    v = VectorClock({"b": 300, "a": 1})
    assert v.encode() == b"\x01\x02\x01a\x01\x01b\xac\x02"
    assert VectorClock().encode() == b"\x01\x00"
    assert VectorClock.decode(v.encode()) == v


@examples(150)
@given(v=clocks)
def test_encoding_round_trips(v: VectorClock) -> None:
    data = v.encode()
    assert VectorClock.decode(data) == v
    assert VectorClock.decode(data).encode() == data


@examples(200)
@given(blob=st.binary(max_size=64))
def test_garbage_raises_value_error_only(blob: bytes) -> None:
    try:
        v = VectorClock.decode(blob)
    except ValueError:
        return
    assert v.encode() == blob  # anything accepted is canonical


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (b"", "empty"),
        (b"\x02\x00", "version"),
        (b"\x01\x01\x01a", "counter is truncated"),
        (b"\x01\x01\x01a\x00", "counter must be >= 1"),
        (b"\x01\x02\x01b\x01\x01a\x01", "ascending"),
        (b"\x01\x01\x01a\x81\x00", "shortest form"),
        (b"\x01\x01\x01a\x01\x00", "trailing"),
        (b"\x01\x01\x02\xff\xfe\x01", "UTF-8"),
        (b"\x01\x01\x01a" + b"\xff" * 9 + b"\x7f", "exceeds 2\\*\\*64-1"),
        (b"\x01\xff\xff\x03", "entry count"),
    ],
)
def test_decode_names_what_is_wrong(blob: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        VectorClock.decode(blob)
