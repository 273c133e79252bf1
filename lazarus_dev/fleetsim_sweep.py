"""Run many fleet-simulator seeds on every core: the shell around ``lazarus_dev.fleetsim``.

The simulator itself is pure (no clock, no IO, one seed = one deterministic
run); this module only spreads seeds over worker processes, the way
``make sim`` and ``make test`` sweep thousands of them within a time budget.
Each worker runs a contiguous block of seeds and returns the failure messages
(``seed=<n> ...`` with the replay command), so a failure found in a worker
reads exactly as one found in-process.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

from lazarus_dev.fleetsim import SHAPES, FleetSimulation, SimulationFailure

__all__ = ["default_workers", "sweep"]


def default_workers() -> int:
    """Worker processes for a sweep: the CPUs this process may use (at least 1)."""
    return max(1, len(os.sched_getaffinity(0)))


def _block(start: int, stop: int, shape: str) -> list[str]:
    failures = []
    config = SHAPES[shape]
    for seed in range(start, stop):
        try:
            FleetSimulation(seed, config).run()
        except SimulationFailure as exc:
            failures.append(str(exc))
    return failures


def sweep(start: int, count: int, shape: str = "default", workers: int | None = None) -> list[str]:
    """Run seeds ``start .. start+count-1`` of ``shape``; return the failures in seed order.

    Args:
        start: first seed.
        count: number of seeds (>= 0).
        shape: a key of ``lazarus_dev.fleetsim.SHAPES``.
        workers: processes to use; ``None`` = ``default_workers()``; 1 runs in-process.

    Returns:
        One message per failed seed (each starts with ``seed=<n>`` and names the
        replay command); empty when every seed held.

    Raises:
        KeyError: unknown ``shape``.
    """
    SHAPES[shape]  # unknown shape: KeyError before any work
    n = workers or default_workers()
    if n == 1 or count < 2 * n:
        return _block(start, start + count, shape)
    # Small blocks keep both workers busy to the end (seeds differ in cost).
    size = max(1, min(250, count // (n * 4)))
    bounds = [(s, min(s + size, start + count)) for s in range(start, start + count, size)]
    # spawn, not fork: the caller (pytest, a CLI) may run gRPC or asyncio
    # threads, whose locks a forked child would inherit held.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=n, mp_context=context) as pool:
        results = pool.map(_block, *zip(*bounds, strict=True), [shape] * len(bounds))
        return [msg for block in results for msg in block]
