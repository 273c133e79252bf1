"""Seeded chaos schedules for ``lazarus drill chaos`` (pure: no IO, no clock).

``make_schedule(seed, duration_s, agents=4, netns=True)`` returns the same
faults for the same arguments on every machine (``random.Random(seed)``), so a
failing run replays with its seed. The faults are those of the other drills,
overlapping in time:

=====================  =======================================================
``kill-agent``         SIGKILL a node agent; start it again (same node id, same
                       data dir) when the fault ends
``restart-agent``      SIGKILL a node agent and start it at once (same data dir)
``stop-agent``         SIGSTOP a node agent; SIGCONT when the fault ends
``partition-agent``    cut the agent in the network namespace off (only with
                       ``netns``); heal when the fault ends
``kill-leader``        SIGKILL the leading coordinator; start it again
``stop-leader``        SIGSTOP the leading coordinator; SIGCONT
``kill-etcd``          SIGKILL one etcd member; start it again
``stop-etcd``          SIGSTOP one etcd member; SIGCONT
``kill-redis``         SIGKILL Redis (fsync'd AOF); start it again
``stop-redis``         SIGSTOP Redis; SIGCONT
=====================  =======================================================

Constraints keep the cluster recoverable, so a failure is a bug and not an
impossible demand: at most one etcd member down at a time (quorum stays), at
most one coordinator fault at a time, at most one Redis fault at a time, at
least one node agent untouched at any moment, and never two faults on one
target at once. Every fault ends by ``duration_s``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum

__all__ = ["Fault", "FaultKind", "make_schedule", "schedule_lines"]


class FaultKind(Enum):
    """What a chaos fault does (see the module docstring)."""

    KILL_AGENT = "kill-agent"
    RESTART_AGENT = "restart-agent"
    STOP_AGENT = "stop-agent"
    PARTITION_AGENT = "partition-agent"
    KILL_LEADER = "kill-leader"
    STOP_LEADER = "stop-leader"
    KILL_ETCD = "kill-etcd"
    STOP_ETCD = "stop-etcd"
    KILL_REDIS = "kill-redis"
    STOP_REDIS = "stop-redis"

    @property
    def group(self) -> str:
        """The resource class the fault hits: agent, coordinator, etcd or redis."""
        return self.value.split("-", 1)[1].replace("leader", "coordinator")


_WEIGHTS: dict[FaultKind, int] = {
    FaultKind.KILL_AGENT: 3,
    FaultKind.RESTART_AGENT: 2,
    FaultKind.STOP_AGENT: 3,
    FaultKind.PARTITION_AGENT: 3,
    FaultKind.KILL_LEADER: 2,
    FaultKind.STOP_LEADER: 1,
    FaultKind.KILL_ETCD: 1,
    FaultKind.STOP_ETCD: 1,
    FaultKind.KILL_REDIS: 1,
    FaultKind.STOP_REDIS: 1,
}


@dataclass(frozen=True, slots=True)
class Fault:
    """One scheduled fault.

    Attributes:
        at_s: seconds after the chaos starts.
        duration_s: how long the fault lasts (0 for ``restart-agent``).
        kind: what it does.
        target: agent index (agent faults) or etcd member index; 0 otherwise
            (the leader and Redis are found when the fault starts).
    """

    at_s: float
    duration_s: float
    kind: FaultKind
    target: int = 0

    @property
    def end_s(self) -> float:
        """When the fault is healed, seconds after the chaos starts."""
        return self.at_s + self.duration_s

    def describe(self) -> str:
        """One line: ``t=12.30s +4.10s kill-agent agent-2``."""
        if self.kind.group == "agent":
            what = f" agent-{self.target}"
        elif self.kind.group == "etcd":
            what = f" etcd member {self.target}"
        else:
            what = ""
        return f"t={self.at_s:6.2f}s +{self.duration_s:5.2f}s {self.kind.value}{what}"


def make_schedule(
    seed: int,
    duration_s: float,
    *,
    agents: int = 4,
    etcd_members: int = 3,
    netns: bool = True,
    mean_gap_s: float = 3.0,
    max_fault_s: float = 8.0,
) -> tuple[Fault, ...]:
    """A seeded, overlapping fault schedule (the same for the same arguments).

    Args:
        seed: the random seed.
        duration_s: faults start and end within ``[0, duration_s]``.
        agents: node agents (>= 2); the last one is the namespace's when ``netns``.
        etcd_members: etcd members (1: no etcd faults; etcd would lose quorum).
        netns: whether ``partition-agent`` may be drawn.
        mean_gap_s: mean seconds between fault starts (exponential gaps).
        max_fault_s: longest fault.

    Returns:
        Faults sorted by start time.

    Raises:
        ValueError: ``duration_s`` <= 0, fewer than 2 agents, or non-positive gaps.
    """
    if duration_s <= 0:
        raise ValueError(f"duration_s: must be > 0, got {duration_s}")
    if agents < 2:
        raise ValueError(f"agents: must be >= 2, got {agents}")
    if mean_gap_s <= 0 or max_fault_s <= 0:
        raise ValueError("mean_gap_s and max_fault_s: must be > 0")
    rng = random.Random(seed)
    kinds = [
        k
        for k in _WEIGHTS
        if (netns or k is not FaultKind.PARTITION_AGENT)
        and (etcd_members >= 3 or k.group != "etcd")
    ]
    weights = [_WEIGHTS[k] for k in kinds]
    faults: list[Fault] = []
    t = rng.uniform(0.5, mean_gap_s)
    while t < duration_s - 1.0:
        kind = rng.choices(kinds, weights)[0]
        length = 0.0 if kind is FaultKind.RESTART_AGENT else rng.uniform(1.0, max_fault_s)
        length = min(length, duration_s - t)
        fault = _place(rng, kind, round(t, 2), round(length, 2), faults, agents, etcd_members)
        if fault is not None:
            faults.append(fault)
        t += rng.expovariate(1.0 / mean_gap_s)
    return tuple(sorted(faults, key=lambda f: (f.at_s, f.kind.value, f.target)))


def _active(faults: list[Fault], at_s: float, end_s: float) -> list[Fault]:
    """Faults overlapping ``[at_s, end_s]`` (a zero-length fault occupies its instant)."""
    return [f for f in faults if f.at_s <= end_s and at_s <= f.end_s]


def _place(
    rng: random.Random,
    kind: FaultKind,
    at_s: float,
    length_s: float,
    faults: list[Fault],
    agents: int,
    etcd_members: int,
) -> Fault | None:
    busy = _active(faults, at_s, at_s + length_s)
    if kind.group == "agent":
        candidates = [agents - 1] if kind is FaultKind.PARTITION_AGENT else list(range(agents))
        taken = {f.target for f in busy if f.kind.group == "agent"}
        free = [a for a in candidates if a not in taken]
        if not free or len(taken) + 1 >= agents:  # keep one agent untouched
            return None
        return Fault(at_s, length_s, kind, rng.choice(free))
    if any(f.kind.group == kind.group for f in busy):
        return None  # one fault per coordinator set, etcd cluster, Redis at a time
    target = rng.randrange(etcd_members) if kind.group == "etcd" else 0
    return Fault(at_s, length_s, kind, target)


def schedule_lines(seed: int, faults: tuple[Fault, ...]) -> list[str]:
    """The schedule as printable lines (the first names the seed, to replay it)."""
    return [f"chaos seed {seed}: {len(faults)} faults", *(f.describe() for f in faults)]
