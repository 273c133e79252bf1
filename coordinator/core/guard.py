"""The mass-failure guard: stop moving tasks when too many nodes fail together.

Theory of operation (DESIGN.md §6): if most nodes go silent at once, the
likelier story is that the leader is the one cut off, not that the fleet died.
Moving every task would then only create zombies. So, like the Kubernetes node
lifecycle controller for a fully disrupted zone, the leader keeps declaring
nodes DEAD (those are facts about silence) but stops redistributing their
tasks while the guard is active.

Evaluation, once per tick, after the detector's verdicts and before any task
moves:

- *window start*: ``now_s - window_s`` while the guard is inactive; frozen at
  the value it had when the guard engaged, for the whole episode.
- *population*: every node that has not LEFT, except those already DEAD before
  the window start (a node dead for an hour is not part of the failure).
- *failing*: population nodes that turned DEAD since the window start, plus
  those SUSPECT now. Counting suspects matters: when the leader is cut off,
  every node's silence began at the same moment but the DEAD verdicts trickle
  in over one heartbeat interval; by the first verdict the others are already
  SUSPECT, so the guard engages before the first task moves.
- engage when the population has at least ``min_nodes`` nodes, at least one
  failing node is DEAD, and ``failing / population > threshold_ratio``;
- release when that no longer holds (nodes came back, or left).

While active, tasks of DEAD nodes stay owned by them; a node that reconnects
gets its tasks back at the same epoch. When the guard releases, the remaining
DEAD nodes' tasks move.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from coordinator.core.records import NodeState

__all__ = ["GuardInput", "GuardStatus", "MassFailureGuard"]


@dataclass(frozen=True, slots=True)
class GuardInput:
    """One node as the guard sees it."""

    node_id: str
    state: NodeState
    dead_since_s: float | None


@dataclass(frozen=True, slots=True)
class GuardStatus:
    """Result of one evaluation.

    Attributes:
        active: whether redistribution is stopped.
        changed: whether ``active`` flipped in this evaluation.
        dead_nodes: failing nodes that are DEAD.
        failing_nodes: DEAD-in-window plus SUSPECT nodes.
        total_nodes: the population.
    """

    active: bool
    changed: bool
    dead_nodes: int
    failing_nodes: int
    total_nodes: int


class MassFailureGuard:
    """Decides whether the leader may move tasks of DEAD nodes."""

    __slots__ = ("_active", "_episode_start_s", "_min_nodes", "_threshold", "_window_s")

    def __init__(self, *, threshold_ratio: float, min_nodes: int, window_s: float) -> None:
        """Build an inactive guard.

        Args:
            threshold_ratio: engage when more than this share fails (0..1).
            min_nodes: only judge populations of at least this many nodes.
            window_s: how far back a DEAD verdict counts as "together".
        """
        self._threshold = threshold_ratio
        self._min_nodes = min_nodes
        self._window_s = window_s
        self._active = False
        self._episode_start_s = 0.0

    @property
    def active(self) -> bool:
        """True while redistribution is stopped."""
        return self._active

    @property
    def threshold_ratio(self) -> float:
        """The configured share."""
        return self._threshold

    def evaluate(self, nodes: Iterable[GuardInput], now_s: float, healthy: int = 0) -> GuardStatus:
        """Re-evaluate the guard at ``now_s``.

        Args:
            nodes: every known node, or every node but ``healthy`` ALIVE or
                DRAINING ones (they count in the population only; the leader
                passes the count rather than one input per node per tick).
            now_s: the leader's clock.
            healthy: ALIVE or DRAINING nodes not in ``nodes``.

        Returns:
            The status, with ``changed`` set when the guard engaged or released.
        """
        start = self._episode_start_s if self._active else now_s - self._window_s
        population, failing, dead = healthy, 0, 0
        for node in nodes:
            if node.state is NodeState.LEFT:
                continue
            if node.state is NodeState.DEAD:
                if node.dead_since_s is None or node.dead_since_s < start:
                    continue
                population += 1
                failing += 1
                dead += 1
            else:
                population += 1
                if node.state is NodeState.SUSPECT:
                    failing += 1
        holds = (
            population >= self._min_nodes and dead > 0 and failing / population > self._threshold
        )
        changed = holds != self._active
        if changed:
            self._active = holds
            self._episode_start_s = start
        return GuardStatus(self._active, changed, dead, failing, population)
