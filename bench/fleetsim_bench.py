"""Fleet simulator throughput: seeds per second of the real agent core against the real coordinator.

Runs ``lazarus_dev.fleetsim.FleetSimulation`` over ``--seeds`` seeds of a shape
(default: the CI shape), fails on the first broken invariant with its replay
command, and records seeds/s in ``bench/results/fleetsim.json`` and the
``fleetsim`` section of ``bench/README.md``. ``make sim SEEDS=...`` runs it.

Usage: ``.venv/bin/python bench/fleetsim_bench.py --seeds 5000 [--start N] [--shape default]``
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _report import RESULTS_DIR, machine, today, write_json, write_section

from lazarus_dev.fleetsim import SHAPES
from lazarus_dev.fleetsim_sweep import default_workers, sweep


def _commit() -> str:
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    return out.stdout.strip() or "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2000)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="default")
    parser.add_argument(
        "--workers", type=int, default=default_workers(), help="processes (default: every CPU)"
    )
    parser.add_argument("--no-record", action="store_true", help="do not write results")
    args = parser.parse_args()
    config = SHAPES[args.shape]
    started = time.perf_counter()
    failures = sweep(args.start, args.seeds, args.shape, workers=args.workers)
    for failure in failures:
        print(failure, flush=True)
    elapsed = time.perf_counter() - started
    rate = args.seeds / elapsed
    print(
        f"{args.seeds} seeds of shape {args.shape} in {elapsed:.1f} s: {rate:.1f} seeds/s, "
        f"{len(failures)} failed ({args.workers} worker processes)"
    )
    if not args.no_record:
        result = {
            "date": today(),
            "commit": _commit(),
            "shape": args.shape,
            "config": repr(config),
            "seeds": args.seeds,
            "start": args.start,
            "elapsed_s": round(elapsed, 2),
            "seeds_per_s": round(rate, 1),
            "workers": args.workers,
            "failures": failures,
        }
        write_json(RESULTS_DIR / f"fleetsim-{args.shape}.json", result)
        write_section(
            f"fleetsim-{args.shape}",
            f"""## Fleet simulator, shape `{args.shape}` (`fleetsim_bench.py`)

The real `AgentCore` against the real `CoordinatorCore` (`lazarus_dev/fleetsim.py`),
seeds {args.start}..{args.start + args.seeds - 1}; measured {today()} at commit
`{result["commit"]}` on {machine()["cpus"]} CPUs shared with other workers (noisy).

| shape | seeds | worker processes | elapsed | seeds/s | failed |
| --- | --- | --- | --- | --- | --- |
| {args.shape} | {args.seeds} | {args.workers} | {elapsed:.1f} s | {rate:.1f} | {len(failures)} |

`make test` runs `CI_SEEDS` = 5,000 seeds of the default shape over every CPU
(`lazarus_dev/fleetsim_sweep.py`; tests/unit/test_fleetsim.py) plus the 12
mutations. `make sim SEEDS=N
[SHAPE=default|large|starved]` runs more (`starved` stalls agents past the
fence margin and is expected to fail: the late self-fence).""",
        )
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
