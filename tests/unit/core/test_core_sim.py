"""The seeded fleet simulator (coordinator.core.sim) over a few hundred seeds.

Each seed runs a safety phase with crashes, restarts, partitions, stream
blips, mass partitions, drains, cancels and leader failovers, checking every
invariant after every step, then a liveness phase in which every task must
finish. A failure names its seed: replay it with
``Simulation(seed, SimConfig(...)).run()`` (see the failing assertion).
``LAZARUS_SIM_SEEDS`` sets how many seeds run (default 200).
"""

from __future__ import annotations

import os

import pytest

from coordinator.core import DetectorKind
from coordinator.core import core as core_module
from coordinator.core.identity import ClaimKind, ClaimVerdict
from coordinator.core.sim import SimConfig, SimReport, Simulation, SimulationFailure

SEEDS = int(os.environ.get("LAZARUS_SIM_SEEDS", "200"))
SHORT = SimConfig(nodes=4, tasks=16, safety_s=10.0, liveness_s=15.0)


def run(seed: int, config: SimConfig) -> SimReport:
    try:
        return Simulation(seed, config).run()
    except SimulationFailure as failure:
        pytest.fail(f"{failure}\nreplay: Simulation({seed}, {config!r}).run()", pytrace=False)


def test_seeded_fleets_keep_every_invariant_and_finish_every_task() -> None:
    reports = []
    for seed in range(SEEDS):
        detector = DetectorKind.PHI_ACCRUAL if seed % 2 else DetectorKind.FIXED_TIMEOUT
        config = SimConfig(
            nodes=SHORT.nodes,
            tasks=SHORT.tasks,
            safety_s=SHORT.safety_s,
            liveness_s=SHORT.liveness_s,
            detector=detector,
        )
        reports.append(run(seed, config))
    # The runs exercised what they claim to (numbers for 200 seeds are far above these).
    total = {
        field: sum(getattr(r, field) for r in reports)
        for field in (
            "dead_verdicts",
            "guard_engaged",
            "zombies_fenced",
            "moved_tasks",
            "failovers",
            "completed",
            "cancelled",
            "identity_conflicts",
            "restarts_proven",
        )
    }
    floor = max(1, SEEDS // 40)
    assert all(v >= floor for v in total.values()), total


def test_a_larger_fleet_with_the_default_shape() -> None:
    for seed in (1000, 1001, 1002):
        run(seed, SimConfig())


def test_the_same_seed_replays_the_same_run() -> None:
    first = Simulation(7, SHORT).run()
    second = Simulation(7, SHORT).run()
    assert first == second


def test_agents_that_never_fence_themselves_are_caught_with_the_seed() -> None:
    """The checkers can fail: without self-fencing a cut-off owner keeps running its tasks."""
    failures = []
    for seed in range(40):
        sim = Simulation(seed, SHORT)
        sim._fence_check = lambda agent, incarnation, sent: None  # type: ignore[method-assign]
        try:
            sim.run()
        except SimulationFailure as failure:
            failures.append(str(failure))
            break
    assert failures, "no seed in 40 caught an unfenced zombie"
    assert failures[0].startswith("seed=")
    assert "still runs it" in failures[0]


def _caught(mutate: object, seeds: int = 60) -> str:
    """Run seeds with ``mutate(sim)`` applied until one fails; return its message."""
    for seed in range(seeds):
        sim = Simulation(seed, SHORT)
        mutate(sim)  # type: ignore[operator]
        try:
            sim.run()
        except SimulationFailure as failure:
            return str(failure)
    return ""


def test_a_core_that_lets_a_second_live_process_in_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mutation of DESIGN.md §4 rule 2: the newest Hello wins, as before [identity]."""
    monkeypatch.setattr(ClaimKind, "admitted", property(lambda self: True))
    failure = _caught(lambda sim: None)
    assert failure.startswith("seed="), "no seed caught two processes under one node id"


def test_a_core_that_takes_any_store_as_proof_of_a_restart_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mutation of rule 3: the store proof is not checked against the registered holder."""
    real = core_module.judge_claim

    def lax(record, claim, **kwargs):  # type: ignore[no-untyped-def]
        verdict = real(record, claim, **kwargs)
        if verdict.kind is ClaimKind.CONFLICT and claim.store_id:
            return ClaimVerdict(ClaimKind.RESTART_PROVEN)
        return verdict

    monkeypatch.setattr(core_module, "judge_claim", lax)
    failure = _caught(lambda sim: None)
    assert failure.startswith("seed="), "no seed caught a false restart proof"
