"""Run many simulator seeds on every core: the shell around ``lazarus_dev.fleetsim``
and ``lazarus_dev.fanin_sim``.

The simulators themselves are pure (no clock, no IO, one seed = one
deterministic run); this module only spreads seeds over worker processes, the
way ``make sim`` and ``make test`` sweep thousands of them within a time
budget. Each worker runs a contiguous block of seeds and returns the failure
messages (``seed=<n> ...`` with the replay command), so a failure found in a
worker reads exactly as one found in-process.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

from lazarus_dev import fanin_sim
from lazarus_dev.fleetsim import SHAPES, FleetSimulation, SimulationFailure

__all__ = ["default_workers", "fanin_sweep", "sweep"]

A = TypeVar("A")


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
    return _in_blocks(_block, start, count, shape, workers)


def _fanin_block(start: int, stop: int, config: fanin_sim.FanInConfig | None) -> list[str]:
    return fanin_sim.sweep(range(start, stop), config)


def fanin_sweep(
    seeds: range, config: fanin_sim.FanInConfig | None = None, workers: int | None = None
) -> list[str]:
    """``lazarus_dev.fanin_sim.sweep`` over worker processes: the same failures, in seed order.

    Args:
        seeds: the seeds (step 1).
        config: the runs' shape (default ``FanInConfig()``).
        workers: as for :func:`sweep`.
    """
    return _in_blocks(_fanin_block, seeds.start, len(seeds), config, workers)


def _in_blocks(
    block: Callable[[int, int, A], list[str]],
    start: int,
    count: int,
    arg: A,
    workers: int | None,
) -> list[str]:
    """``block(a, b, arg)`` over contiguous seed blocks in worker processes, in seed order."""
    n = workers or default_workers()
    if n == 1 or count < 2 * n:
        return block(start, start + count, arg)
    # Small blocks keep both workers busy to the end (seeds differ in cost).
    size = max(1, min(250, count // (n * 4)))
    bounds = [(s, min(s + size, start + count)) for s in range(start, start + count, size)]
    # spawn, not fork: the caller (pytest, a CLI) may run gRPC or asyncio
    # threads, whose locks a forked child would inherit held.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=n, mp_context=context) as pool:
        results = pool.map(block, *zip(*bounds, strict=True), [arg] * len(bounds))
        return [msg for block_failures in results for msg in block_failures]
