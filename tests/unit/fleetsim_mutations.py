"""Mutations of safety rules on both cores (and the stand-ins) the fleet simulator must catch.

Each entry patches one rule through ``pytest.MonkeyPatch`` and may change the
run's config or coordinator settings; ``tests/unit/test_fleetsim.py`` asserts
that some seed among the first ``MUTATION_SEEDS`` raises ``SimulationFailure``.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import Any

import pytest

from coordinator.core import core as coordinator_core
from coordinator.core.core import CoordinatorCore
from coordinator.core.identity import ClaimKind, ClaimVerdict
from coordinator.core.settings import CoreSettings
from coordinator.core.tasks import TaskTrigger
from lazarus.v1 import agent_pb2
from lazarus_dev import fleetsim
from lazarus_dev.fleetsim import FleetConfig
from lazarus_dev.fleetsim_sweep import default_workers
from node_agent import core as agent_core
from node_agent.core import AgentCore, SessionState, SlotState
from node_agent.core import records as agent_records

MUTATION_SEEDS = 1000
"""Seeds each mutation may take to be caught. 200 sufficed until the model
carried fan-in's liveness digests: half the Sessions' heartbeats now reach the
leader up to a 50 ms batch later, which widens the margins some mutations eat
into (the slowest, "margin forgets the heartbeat interval", is caught at seed
898; three more at 178). Each stops at its first failure; ``first_failures``
spreads the search over both cores, about 20 s in all (39 s in one process)."""


@dataclass(frozen=True)
class Mutation:
    """One broken rule: ``apply`` patches; ``config`` / ``settings`` reshape the run."""

    name: str
    side: str  # "agent", "coordinator" or "stand-in"
    apply: Callable[[pytest.MonkeyPatch], None]
    config: Callable[[FleetConfig], FleetConfig] = lambda c: c
    settings: Callable[[CoreSettings], CoreSettings] = lambda s: s


def _unsafe(settings: CoreSettings, **changes: Any) -> CoreSettings:
    """``settings`` with fields changed past its own validation (a mutated rule)."""
    mutated = dataclasses.replace(settings)
    for name, value in changes.items():
        object.__setattr__(mutated, name, value)
    return mutated


def _nothing(mp: pytest.MonkeyPatch) -> None:
    return None


# ---------------------------------------------------------------- agent core


def _never_fence(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(AgentCore, "fence_deadline", lambda self: None)


def _fence_from_newest_heartbeat(mp: pytest.MonkeyPatch) -> None:
    def deadline(self: AgentCore) -> float | None:
        if not self._session.armed:
            return None
        due = self._acked_send_s + self._interval_s
        if self._unacked:
            due = max(self._unacked.values())  # the newest unacked, not the oldest
        return due + self._fence_after_s

    mp.setattr(AgentCore, "fence_deadline", deadline)


def _fence_from_ack_arrival(mp: pytest.MonkeyPatch) -> None:
    original = AgentCore._on_ack

    def on_ack(self: AgentCore, ack: agent_records.HeartbeatAck, now: float) -> list[Any]:
        out = original(self, ack, now)
        if out:
            self._acked_send_s = now  # the ack's arrival, not the heartbeat's send time
            self._unacked.clear()
        return out

    mp.setattr(AgentCore, "_on_ack", on_ack)


def _disarm_on_session_close(mp: pytest.MonkeyPatch) -> None:
    original = AgentCore.on_session_closed

    def closed(self: AgentCore, now: float, reason: str) -> list[Any]:
        out = original(self, now, reason)
        if self._session is SessionState.RECONNECTING:
            self._session = SessionState.IDLE  # "no Session, nothing to fence against"
        return out

    mp.setattr(AgentCore, "on_session_closed", closed)


def _ignore_revoke(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(AgentCore, "_on_revoke", lambda self, r, wall_ms: [])


def _resume_before_welcome(mp: pytest.MonkeyPatch) -> None:
    original = AgentCore.restore

    def restore(
        self: AgentCore,
        metas: dict[str, Any],
        unreadable: dict[str, str] | None = None,
    ) -> list[Any]:
        out = original(self, metas, unreadable)
        for task_id in sorted(self._slots):
            slot = self._slots[task_id]
            if slot.state is SlotState.PAUSED:
                wire = agent_pb2.Assign(task_id=task_id, epoch=slot.epoch, attempt=slot.attempt)
                wire.spec.kind = slot.kind
                wire.spec.payload = bytes([8])
                assign = agent_records.Assign(
                    task_id, slot.epoch, slot.attempt, slot.kind, wire=wire.SerializeToString()
                )
                out += self._start(slot, assign)
        return out

    mp.setattr(AgentCore, "restore", restore)


def _ignore_reattach_before_welcome(mp: pytest.MonkeyPatch) -> None:
    original = AgentCore._on_reattach

    def reattach(self: AgentCore, msg: Any, now: float, wall_ms: int) -> list[Any]:
        if self._session is SessionState.IDLE:
            return []  # "the first Hello is still in flight" (it went to a dead leader)
        return original(self, msg, now, wall_ms)

    mp.setattr(AgentCore, "_on_reattach", reattach)


def _late_fence_lead(config: FleetConfig) -> FleetConfig:
    return replace(config, fence_lead_s=-1.2)  # pause after the deadline, not before it


# ---------------------------------------------------------- coordinator core


def _admit_live_duplicate(mp: pytest.MonkeyPatch) -> None:
    original = coordinator_core.judge_claim

    def judge(*args: Any, **kwargs: Any) -> ClaimVerdict:
        verdict = original(*args, **kwargs)
        if verdict.kind is ClaimKind.CONFLICT:
            return ClaimVerdict(ClaimKind.HOLDER_GONE, verdict.heard_ago_s)
        return verdict

    mp.setattr(coordinator_core, "judge_claim", judge)


def _store_proof_unchecked(mp: pytest.MonkeyPatch) -> None:
    original = coordinator_core.judge_claim

    def judge(record: Any, claim: Any, **kwargs: Any) -> ClaimVerdict:
        verdict = original(record, claim, **kwargs)
        if verdict.kind is ClaimKind.CONFLICT and claim.store_id:
            return ClaimVerdict(ClaimKind.RESTART_PROVEN, verdict.heard_ago_s)
        return verdict

    mp.setattr(coordinator_core, "judge_claim", judge)


def _admit_impostor(mp: pytest.MonkeyPatch) -> None:
    original = coordinator_core.judge_claim

    def judge(*args: Any, **kwargs: Any) -> ClaimVerdict:
        verdict = original(*args, **kwargs)
        if verdict.kind is ClaimKind.IMPOSTOR:
            return ClaimVerdict(ClaimKind.SAME_INCARNATION, verdict.heard_ago_s)
        return verdict

    mp.setattr(coordinator_core, "judge_claim", judge)


def _no_zombie_revoke(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(CoordinatorCore, "_fence", lambda self, entry, task, stale, source, out: None)


def _no_epoch_bump(mp: pytest.MonkeyPatch) -> None:
    original = CoordinatorCore._put_task

    def put(self: CoordinatorCore, trigger: TaskTrigger, new: Any, out: Any) -> Any:
        if trigger is TaskTrigger.ASSIGN and new.epoch > 1:
            new = replace(new, epoch=new.epoch - 1)  # the new owner reuses the old epoch
        return original(self, trigger, new, out)

    mp.setattr(CoordinatorCore, "_put_task", put)


def _take_over_only_on_a_new_incarnation(mp: pytest.MonkeyPatch) -> None:
    # Tasks an earlier incarnation owns move only on the new incarnation's first Hello:
    # when the leader lost its lease between writing the node record and the tasks'
    # move, the next leader fences them at their old epoch and they stay RUNNING.
    original = CoordinatorCore._take_over

    def take_over(self: CoordinatorCore, entry: Any, held: Any, out: Any, *, joined: bool) -> Any:
        return original(self, entry, held, out, joined=joined) if joined else set()

    mp.setattr(CoordinatorCore, "_take_over", take_over)


def _retire_gone_nodes_regardless(mp: pytest.MonkeyPatch) -> None:
    # A DEAD node leaves etcd (and the leader) at its horizon though it still owns tasks.
    mp.setattr(CoordinatorCore, "_retirement_blocked", lambda self, entry, out: False)


def _short_retention(settings: CoreSettings) -> CoreSettings:
    return replace(settings, retention_s=0.5)


def _move_at_suspect(settings: CoreSettings) -> CoreSettings:
    # Tasks move after 1.5 s of silence: before the old owner's fence (2 s).
    return _unsafe(settings, dead_after_s=1.5, suspect_after_intervals=2)


def _margin_without_interval(settings: CoreSettings) -> CoreSettings:
    # fence_after < dead_after, but fence_after + heartbeat_interval > dead_after.
    return _unsafe(settings, fence_after_s=2.9)


def _fence_after_past_dead_after(settings: CoreSettings) -> CoreSettings:
    return _unsafe(settings, fence_after_s=3.5)  # sent in Welcome: the agents fence too late


# ------------------------------------------------------------------ stand-ins


def _redis_fence_ignores_owner(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(
        fleetsim.RedisStandIn, "fenced_out", lambda self, head, epoch, owner: epoch < head.epoch
    )


def _etcd_does_not_fence_deposed_leader(mp: pytest.MonkeyPatch) -> None:
    original = fleetsim.FleetSimulation._etcd_write

    def write(self: fleetsim.FleetSimulation, leader: Any, command: Any) -> bool:
        saved = self.etcd_term
        self.etcd_term = leader.term  # the deposed leader's write goes through
        try:
            return original(self, leader, command)
        finally:
            self.etcd_term = saved

    mp.setattr(fleetsim.FleetSimulation, "_etcd_write", write)


MUTATIONS: list[Mutation] = [
    Mutation("agent never self-fences", "agent", _never_fence),
    Mutation(
        "agent fence deadline from the newest heartbeat", "agent", _fence_from_newest_heartbeat
    ),
    Mutation("agent stops fence timing when its Session closes", "agent", _disarm_on_session_close),
    Mutation("agent resumes held tasks before a Welcome", "agent", _resume_before_welcome),
    Mutation(
        "agent ignores a Reattach before its first Welcome",
        "agent",
        _ignore_reattach_before_welcome,
    ),
    Mutation("agent pauses after the fence deadline", "agent", _nothing, config=_late_fence_lead),
    Mutation("coordinator admits a live duplicate", "coordinator", _admit_live_duplicate),
    Mutation("coordinator takes any store id as proof", "coordinator", _store_proof_unchecked),
    Mutation("coordinator admits an impostor", "coordinator", _admit_impostor),
    Mutation("coordinator reuses the epoch on a move", "coordinator", _no_epoch_bump),
    Mutation(
        "coordinator takes over only on a new incarnation's Hello",
        "coordinator",
        _take_over_only_on_a_new_incarnation,
    ),
    Mutation(
        "coordinator moves tasks at SUSPECT", "coordinator", _nothing, settings=_move_at_suspect
    ),
    Mutation(
        "coordinator retires a gone node that still owns tasks",
        "coordinator",
        _retire_gone_nodes_regardless,
        settings=_short_retention,
    ),
    Mutation(
        "coordinator sends fence_after >= dead_after",
        "coordinator",
        _nothing,
        settings=_fence_after_past_dead_after,
    ),
    Mutation(
        "coordinator's margin forgets the heartbeat interval",
        "coordinator",
        _nothing,
        settings=_margin_without_interval,
    ),
]


def first_failure(mutation: Mutation, seeds: range) -> fleetsim.SimulationFailure | None:
    """Run ``seeds`` under ``mutation``; the first failure, or None."""
    config = mutation.config(fleetsim.SHAPES["default"])
    settings = mutation.settings(CoreSettings(default_max_attempts=20, self_check=True))
    with pytest.MonkeyPatch.context() as mp:
        mutation.apply(mp)
        for seed in seeds:
            try:
                fleetsim.FleetSimulation(seed, config, settings).run()
            except fleetsim.SimulationFailure as exc:
                return exc
    return None


def first_failure_message(name: str, start: int, stop: int) -> str | None:
    """``first_failure`` of the mutation called ``name`` over seeds ``start..stop-1``,
    as its message: a worker process's entry point (a mutation is patched
    in the process that runs it)."""
    mutation = next(m for m in MUTATIONS if m.name == name)
    failure = first_failure(mutation, range(start, stop))
    return None if failure is None else str(failure)


def first_failures(
    seeds: range, block: int = 100, workers: int | None = None, names: list[str] | None = None
) -> dict[str, str | None]:
    """Every mutation's first failure over ``seeds``, found on ``workers`` spawned processes
    (None: ``lazarus_dev.fleetsim_sweep.default_workers()``, as the seed sweeps use).

    Each mutation's seeds are cut into blocks of ``block``; all blocks are
    queued, block 0 of every mutation first, and once a block of a mutation
    fails its later blocks are cancelled. The answer is what ``first_failure``
    gives in one process: the failure of the lowest failing block (the blocks
    below it all ran and held). Mutations are caught at seed 0 to 898 (see
    ``MUTATION_SEEDS``), so one slow mutation no longer runs alone.
    """
    bounds = [(a, min(a + block, seeds.stop)) for a in range(seeds.start, seeds.stop, block)]
    names = names or [m.name for m in MUTATIONS]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers or default_workers(), mp_context=context) as pool:
        futures: dict[str, list[Future[str | None]]] = {name: [] for name in names}
        for a, b in bounds:  # block 0 of every mutation first, then block 1, ...
            for name in names:
                futures[name].append(pool.submit(first_failure_message, name, a, b))
        owner = {f: (name, k) for name, fs in futures.items() for k, f in enumerate(fs)}
        results: dict[str, dict[int, str | None]] = {name: {} for name in names}
        pending = set(owner)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                if future.cancelled():
                    continue
                name, k = owner[future]
                results[name][k] = future.result()
                if results[name][k] is not None:
                    for later in futures[name][k + 1 :]:
                        later.cancel()
    out: dict[str, str | None] = {}
    for name in names:
        out[name] = None
        for k in range(len(bounds)):
            if results[name].get(k) is not None:
                out[name] = results[name][k]
                break
    return out


__all__ = [
    "MUTATIONS",
    "MUTATION_SEEDS",
    "Mutation",
    "agent_core",
    "first_failure",
    "first_failure_message",
    "first_failures",
]
