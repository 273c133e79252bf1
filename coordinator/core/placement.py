"""Placement: choose a node for each PENDING task.

Theory of operation: one round places a batch of PENDING tasks on the nodes
that may take work. It is a pure function of its inputs and an injected
``random.Random``, so the same tasks, nodes and seed give the same answer.

Order of tasks: interrupted tasks first (they ran before: epoch > 0, so they
have progress to resume or an attempt already spent), then higher
``spec.priority``, then older submissions, then task id. A full cluster thus
resumes interrupted work before it starts anything new.

Eligible nodes: ALIVE (never SUSPECT, DEAD, DRAINING or LEFT), not cordoned,
with an open Session (an Assign must have somewhere to go), whose labels
contain the task's ``node_selector``, that declare the task's kind (or no
kinds at all), and with room for the task's slots.

Choice among eligible nodes, by this key, smallest first:

1. load over capacity (``used_slots / capacity_slots``, compared exactly),
   counting what this round already placed;
2. tasks placed on the node in this round (spreading: among equal load the
   node that got less of this batch);
3. a rank from one ``rng.shuffle`` of the eligible nodes per round;
4. node id.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from random import Random

from coordinator.core.records import Labels, NodeState, TaskRecord, labels_match

__all__ = ["Candidate", "Placement", "is_eligible", "place", "placement_order"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A node as placement sees it."""

    node_id: str
    state: NodeState
    cordoned: bool
    connected: bool
    capacity_slots: int
    used_slots: int
    labels: Labels = ()
    kinds: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Placement:
    """Put ``task_id`` on ``node_id``."""

    task_id: str
    node_id: str


def is_eligible(node: Candidate) -> bool:
    """Tell whether a node may receive new tasks at all (state, cordon, Session, capacity > 0)."""
    return (
        node.state is NodeState.ALIVE
        and not node.cordoned
        and node.connected
        and node.capacity_slots > 0
    )


def _fits(task: TaskRecord, node: Candidate, used_slots: int) -> bool:
    spec = task.spec
    return (
        used_slots + spec.effective_slots <= node.capacity_slots
        and labels_match(node.labels, spec.node_selector)
        and (not node.kinds or spec.kind in node.kinds)
    )


def placement_order(tasks: Sequence[TaskRecord]) -> list[TaskRecord]:
    """Sort tasks into the order a round places them (interrupted, priority, age, id).

    Args:
        tasks: PENDING tasks.

    Returns:
        A new list in placement order.
    """
    return sorted(
        tasks,
        key=lambda t: (
            t.epoch == 0,
            -t.spec.priority,
            t.submitted_at_s if t.submitted_at_s is not None else 0.0,
            t.task_id,
        ),
    )


def place(
    tasks: Sequence[TaskRecord],
    nodes: Sequence[Candidate],
    rng: Random,
    *,
    limit: int | None = None,
) -> list[Placement]:
    """Place as many of ``tasks`` as fit, at most ``limit``.

    Args:
        tasks: PENDING tasks (any order; they are sorted by ``placement_order``).
        nodes: every known node (ineligible ones are skipped).
        rng: the injected random source; one shuffle per round that has both
            tasks and eligible nodes.
        limit: most placements in this round (None: no limit).

    Returns:
        The placements, in placement order. Tasks that fit nowhere are left out.
    """
    eligible = sorted((n for n in nodes if is_eligible(n)), key=lambda n: n.node_id)
    if not tasks or not eligible:
        return []
    shuffled = list(eligible)
    rng.shuffle(shuffled)
    rank = {n.node_id: i for i, n in enumerate(shuffled)}
    used = {n.node_id: n.used_slots for n in eligible}
    load = {n.node_id: Fraction(n.used_slots, n.capacity_slots) for n in eligible}
    placed_here = dict.fromkeys(used, 0)
    result: list[Placement] = []
    for task in placement_order(tasks):
        if limit is not None and len(result) >= limit:
            break
        best: Candidate | None = None
        best_key: tuple[Fraction, int, int, str] | None = None
        for node in eligible:
            if not _fits(task, node, used[node.node_id]):
                continue
            key = (load[node.node_id], placed_here[node.node_id], rank[node.node_id], node.node_id)
            if best_key is None or key < best_key:
                best, best_key = node, key
        if best is None:
            continue
        node_id = best.node_id
        used[node_id] += task.spec.effective_slots
        load[node_id] = Fraction(used[node_id], best.capacity_slots)
        placed_here[node_id] += 1
        result.append(Placement(task.task_id, node_id))
    return result
