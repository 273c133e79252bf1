"""The fleet simulator: the real AgentCore against the real CoordinatorCore, under faults.

``test_seeds_of_the_default_shape`` sweeps ``LAZARUS_FLEETSIM_SEEDS`` seeds
(default ``CI_SEEDS``: 5,000 seeds spread over every core by
``lazarus_dev.fleetsim_sweep``; see the fleetsim section of ``bench/README.md`` for
seeds/s; ``make sim SEEDS=...`` runs more).
``test_the_mutations_are_caught`` breaks one safety rule at a time, on the
agent core and on the coordinator core, and asserts a seed fails with
``SimulationFailure`` naming it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from coordinator.core.settings import CoreSettings
from lazarus_dev import fleetsim
from lazarus_dev.fleetsim import SHAPES, FleetSimulation, SimulationFailure
from lazarus_dev.fleetsim_sweep import sweep

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleetsim_mutations import MUTATION_SEEDS, MUTATIONS, Mutation, first_failure, first_failures
from test_core_purity import violations

CI_SEEDS = 5000
ROOT = Path(__file__).resolve().parents[2]


def test_the_simulator_is_pure_but_for_the_wire_stubs() -> None:
    path = ROOT / "lazarus_dev" / "fleetsim.py"
    found = violations(path.read_text(encoding="utf-8"), "lazarus_dev/fleetsim.py")
    # It speaks the real wire: the protobuf stubs are the one allowed exception.
    problems = [v for v in found if "wire stubs" not in v]
    assert problems == [], problems
    # The CLI entry point imports argparse only inside _main; no clock anywhere.
    assert "import time" not in path.read_text(encoding="utf-8")


def test_a_seed_replays_exactly() -> None:
    assert FleetSimulation(7).run() == FleetSimulation(7).run()


def test_the_fault_set_is_exercised() -> None:
    faults: dict[str, int] = {}
    fences = refusals = starts = takeovers = partial_writes = reattaches = digested = 0
    for seed in range(60):
        report = FleetSimulation(seed).run()
        for name, count in report.faults.items():
            faults[name] = faults.get(name, 0) + count
        fences += report.fences
        refusals += report.identity_refusals
        starts += report.starts
        takeovers += report.takeovers
        partial_writes += report.partial_writes
        reattaches += report.reattaches
        digested += report.digested
    for kind in (
        "partition",
        "break",
        "half_open",
        "slow_link",
        "crash_same",
        "crash_fresh",
        "stall",
        "failover",
        "partial_write",
        "duplicate",
        "impostor",
    ):
        assert faults.get(kind, 0) > 0, (kind, faults)
    assert fences > 0  # agents self-fenced
    assert refusals > 0  # duplicate processes were refused (IdentityConflict)
    assert takeovers > 0  # restarts took over their previous incarnation
    assert partial_writes > 0  # leaders lost their lease between a step's etcd writes
    assert reattaches > 0  # followers carried Sessions to the next leader (fan-in)
    assert digested > 0  # leaders stepped forwarded heartbeats as liveness digests
    assert starts > 60 * SHAPES["default"].tasks  # tasks moved and resumed


@pytest.mark.timeout(300)  # about 60 s on two free cores; the default 120 s is per test
def test_seeds_of_the_default_shape() -> None:
    count = int(os.environ.get("LAZARUS_FLEETSIM_SEEDS", CI_SEEDS))
    start = int(os.environ.get("LAZARUS_FLEETSIM_START", 0))
    failures = sweep(start, count)
    # Each message starts with seed=<n> and names its replay command.
    assert failures == [], "\n\n".join(failures[:3])


def test_a_sweep_reports_what_a_single_run_reports() -> None:
    """The worker processes find the same failures, in seed order, as one process."""
    in_process = sweep(0, 40, "starved", workers=1)
    assert in_process, "some starved seed of 40 fails (see the starved-agent test)"
    assert sweep(0, 40, "starved", workers=2) == in_process


def test_a_starved_agent_fences_late_and_the_overlap_is_caught() -> None:
    """CPU stalls beyond the fence margin: the late self-fence is visible (issue 18)."""
    failure = None
    for seed in range(300):
        try:
            FleetSimulation(seed, SHAPES["starved"]).run()
        except SimulationFailure as exc:
            failure = exc
            break
    assert failure is not None, "no starved seed of 300 showed the late fence"
    assert "executes in" in str(failure)
    assert f"python -m lazarus_dev.fleetsim --seed {seed} --shape starved" in str(failure)


def test_there_are_thirteen_mutations_on_both_cores() -> None:
    sides = {m.side for m in MUTATIONS}
    assert len(MUTATIONS) >= 13
    assert {"agent", "coordinator"} <= sides


@pytest.fixture(scope="module")
def caught() -> dict[str, str | None]:
    """Every mutation's first failure over ``MUTATION_SEEDS``, on both cores."""
    return first_failures(range(MUTATION_SEEDS))


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.name)
def test_the_mutations_are_caught(mutation: Mutation, caught: dict[str, str | None]) -> None:
    failure = caught[mutation.name]
    assert failure is not None, f"{mutation.name}: no seed of {MUTATION_SEEDS} failed"
    assert failure.startswith("seed=")
    assert "replay: python -m lazarus_dev.fleetsim --seed" in failure


def test_the_parallel_search_finds_what_one_process_finds() -> None:
    # The first failure of the lowest failing block: the seed a sequential
    # search stops at (a mutation caught early, and one caught in block 1).
    # Caught at seed 24: blocks 0 and 1 hold, block 2 fails, block 3 is cancelled.
    fast = next(m for m in MUTATIONS if m.name == "agent resumes held tasks before a Welcome")
    parallel = first_failures(range(40), block=10, names=[fast.name])
    single = first_failure(fast, range(40))
    assert single is not None
    assert parallel == {fast.name: str(single)}


def test_the_cli_replays_a_seed(capsys: pytest.CaptureFixture[str]) -> None:
    assert fleetsim._main(["--seed", "3"]) == 0
    assert "1 seeds, 0 failed" in capsys.readouterr().out


SHORT_RETENTION = CoreSettings(default_max_attempts=20, self_check=True, retention_s=0.5)
"""Records leave etcd half a second after they may (terminal tasks, DEAD or LEFT nodes
owning nothing): the retention path runs under every fault of the default shape."""


def test_retention_under_faults_keeps_every_rule() -> None:
    retired_nodes = retired_tasks = 0
    for seed in range(300):
        report = FleetSimulation(seed, SHAPES["default"], SHORT_RETENTION).run()
        retired_nodes += report.retired_nodes
        retired_tasks += report.retired_tasks
    assert retired_nodes > 20  # crashed nodes that stayed away left etcd
    assert retired_tasks > 1000
