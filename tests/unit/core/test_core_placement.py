"""Placement: eligibility, capacity, selectors, spreading, order and determinism."""

from __future__ import annotations

from collections import Counter
from random import Random

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core import NodeState, TaskRecord, TaskSpec, as_labels
from coordinator.core.placement import Candidate, is_eligible, place, placement_order


def task(
    task_id: str,
    *,
    epoch: int = 0,
    priority: int = 0,
    slots: int = 1,
    selector: dict[str, str] | None = None,
    kind: str = "work",
    submitted: float = 0.0,
) -> TaskRecord:
    spec = TaskSpec(
        kind=kind, slots=slots, priority=priority, node_selector=as_labels(selector or {})
    )
    return TaskRecord(
        task_id=task_id, request_id=f"r-{task_id}", spec=spec, epoch=epoch, submitted_at_s=submitted
    )


def node(
    node_id: str,
    *,
    state: NodeState = NodeState.ALIVE,
    cordoned: bool = False,
    connected: bool = True,
    capacity: int = 4,
    used: int = 0,
    labels: dict[str, str] | None = None,
    kinds: tuple[str, ...] = (),
) -> Candidate:
    return Candidate(
        node_id, state, cordoned, connected, capacity, used, as_labels(labels or {}), kinds
    )


def test_only_alive_uncordoned_connected_nodes_with_room_are_eligible() -> None:
    assert is_eligible(node("a"))
    for bad in (
        node("b", state=NodeState.SUSPECT),
        node("c", state=NodeState.DEAD),
        node("d", state=NodeState.DRAINING, cordoned=True),
        node("e", state=NodeState.LEFT),
        node("f", cordoned=True),
        node("g", connected=False),
        node("h", capacity=0),
    ):
        assert not is_eligible(bad), bad
        assert place([task("t")], [bad], Random(0)) == []


def test_least_loaded_node_wins_and_capacity_is_never_exceeded() -> None:
    nodes = [
        node("a", capacity=4, used=3),
        node("b", capacity=10, used=5),
        node("c", capacity=2, used=0),
    ]
    result = place([task(f"t{i}") for i in range(10)], nodes, Random(1))
    counts = Counter(p.node_id for p in result)
    assert counts == {"c": 2, "b": 5, "a": 1}  # everything that fits, and nothing more
    assert result[0].node_id == "c"  # 0/2 is the lowest load


def test_labels_and_kinds_restrict_the_choice() -> None:
    nodes = [
        node("gpu", labels={"gpu": "a100", "zone": "x"}),
        node("cpu", labels={"zone": "x"}, kinds=("work",)),
    ]
    result = place(
        [
            task("needs-gpu", selector={"gpu": "a100"}),
            task("other-kind", kind="render"),
            task("any"),
        ],
        nodes,
        Random(0),
    )
    where = {p.task_id: p.node_id for p in result}
    assert where["needs-gpu"] == "gpu"
    assert where["other-kind"] == "gpu"  # "cpu" only declares the kind "work"
    assert "any" in where


def test_spreading_among_equal_load_uses_the_nodes_that_got_less_of_this_round() -> None:
    nodes = [node(f"n{i}", capacity=100) for i in range(4)]
    result = place([task(f"t{i:02d}") for i in range(8)], nodes, Random(3))
    assert Counter(p.node_id for p in result) == {"n0": 2, "n1": 2, "n2": 2, "n3": 2}


def test_interrupted_tasks_go_first_then_priority_then_age() -> None:
    tasks = [
        task("new-old", submitted=1.0),
        task("new-urgent", priority=5, submitted=9.0),
        task("interrupted", epoch=3, submitted=5.0),
        task("new-young", submitted=2.0),
    ]
    order = [t.task_id for t in placement_order(tasks)]
    assert order == ["interrupted", "new-urgent", "new-old", "new-young"]
    # A full cluster resumes interrupted work before it starts anything new.
    result = place(tasks, [node("only", capacity=1)], Random(0))
    assert [p.task_id for p in result] == ["interrupted"]


def test_limit_caps_a_round() -> None:
    assert (
        len(place([task(f"t{i}") for i in range(10)], [node("a", capacity=20)], Random(0), limit=3))
        == 3
    )


# -- properties ---------------------------------------------------------------------------

STATES = st.sampled_from(list(NodeState))
LABELS = st.dictionaries(st.sampled_from(["zone", "gpu"]), st.sampled_from(["x", "y"]), max_size=2)

nodes_strategy = st.lists(
    st.builds(
        node,
        node_id=st.sampled_from([f"n{i}" for i in range(8)]),
        state=STATES,
        cordoned=st.booleans(),
        connected=st.booleans(),
        capacity=st.integers(0, 6),
        used=st.integers(0, 6),
        labels=LABELS,
    ),
    max_size=8,
    unique_by=lambda c: c.node_id,
)
tasks_strategy = st.lists(
    st.builds(
        task,
        task_id=st.sampled_from([f"t{i}" for i in range(30)]),
        epoch=st.integers(0, 3),
        priority=st.integers(-2, 2),
        slots=st.integers(0, 3),
        selector=LABELS,
    ),
    max_size=30,
    unique_by=lambda t: t.task_id,
)


@settings(max_examples=150, deadline=None)
@given(tasks=tasks_strategy, nodes=nodes_strategy, seed=st.integers(0, 2**32))
def test_placement_never_picks_an_ineligible_node_nor_overfills_one(
    tasks: list[TaskRecord], nodes: list[Candidate], seed: int
) -> None:
    result = place(tasks, nodes, Random(seed))
    by_id = {n.node_id: n for n in nodes}
    specs = {t.task_id: t.spec for t in tasks}
    assert len({p.task_id for p in result}) == len(result)
    used = {n.node_id: n.used_slots for n in nodes}
    for p in result:
        target = by_id[p.node_id]
        assert target.state is NodeState.ALIVE, target  # never DEAD, SUSPECT, DRAINING, LEFT
        assert not target.cordoned
        assert target.connected
        assert set(specs[p.task_id].node_selector) <= set(target.labels)
        used[p.node_id] += specs[p.task_id].effective_slots
        assert used[p.node_id] <= target.capacity_slots


@settings(max_examples=60, deadline=None)
@given(tasks=tasks_strategy, nodes=nodes_strategy, seed=st.integers(0, 2**32))
def test_placement_is_deterministic_for_the_same_input_and_seed(
    tasks: list[TaskRecord], nodes: list[Candidate], seed: int
) -> None:
    first = place(tasks, nodes, Random(seed))
    assert place(list(reversed(tasks)), list(reversed(nodes)), Random(seed)) == first


@settings(max_examples=60, deadline=None)
@given(tasks=tasks_strategy, nodes=nodes_strategy, seed=st.integers(0, 2**32))
def test_a_task_left_out_fits_on_no_eligible_node(
    tasks: list[TaskRecord], nodes: list[Candidate], seed: int
) -> None:
    result = place(tasks, nodes, Random(seed))
    placed = {p.task_id for p in result}
    used = {n.node_id: n.used_slots for n in nodes}
    for p in result:
        used[p.node_id] += next(t for t in tasks if t.task_id == p.task_id).spec.effective_slots
    for t in tasks:
        if t.task_id in placed:
            continue
        for n in nodes:
            if is_eligible(n) and set(t.spec.node_selector) <= set(n.labels):
                assert used[n.node_id] + t.spec.effective_slots > n.capacity_slots
