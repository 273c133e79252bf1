"""Checkpoint store throughput and latency, against langgraph's SqliteSaver.

For every payload size (1 KiB, 256 KiB), durability mode (sync, group, none)
and concurrency (1, 32 tasks), saves checkpoints for ``--duration`` seconds and
records saves/s and p50 / p99 latency. The same workload runs through
``langgraph.checkpoint.sqlite.SqliteSaver.put`` — what an agent developer would
pick instead — at equal durability: WAL with ``synchronous=FULL`` (a commit is
fsynced before ``put`` returns) for our sync and group modes, ``synchronous=OFF``
for none; concurrency there is threads, since SqliteSaver is synchronous.

Each cell runs ``--rounds`` times, ours and theirs interleaved, each round in a
fresh database; saves/s is the median over rounds, latency percentiles pool all
rounds. Results: ``bench/results/checkpoint.json`` and the table between the
markers in ``bench/README.md``.

Run: ``make bench`` or ``.venv/bin/python bench/checkpoint_bench.py [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from node_agent.checkpoint import Checkpoint, CheckpointStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import RESULTS_DIR, measured_commit, today, write_json, write_section

RESULTS = RESULTS_DIR / "checkpoint.json"

NOTES = """\
How to read the async rows (`CheckpointStore.aio`, `node_agent/checkpoint/store.py`):

* **On-disk layout (schema 3).** Checkpoint rows are stored in append order
  under a growing id and keyed in bulk: a *fold* keys the last ~1024 rows in
  one statement, reads scan the unkeyed tail besides the keys, and a save of a
  known task defers its head row to the next fold (its checkpoint row carries
  epoch and seq). Schema 1 had two indexes led by `task_id`, so a 32-task
  group commit touched a leaf of each per task: ~75 WAL pages of 4 KiB per
  commit; now ~7 frames of 8 KiB (new databases use 8 KiB pages). Schema 2's
  fold wrote one key per row into `checkpoint_keys (task_id,
  covers_journal_seq, seq) -> id` (~2.1 ms per fold of 1024 rows of 32 tasks,
  the statement alone); schema 3's writes one *run* per task, its keys as one
  JSON array, at the end of `checkpoint_runs` (~0.7 ms). Schema 1 and 2 data
  dirs are migrated at open.
* **1 task: the save commits on the event loop.** A lone save or append of at
  most 16 KiB, made while the writer thread is idle and no other callback is
  ready on the loop, runs its transaction (fsync included) on the loop itself,
  as the sync API's caller does: the loop is blocked for that commit (p50 about
  0.2 ms for 1 KiB here) instead of paying two thread wake-ups. After one
  slower than 2 ms it stays off for 50 times as long as that commit took; WAL
  checkpoints and folds run on the writer thread, never on the loop. One fsync
  per save on both sides, so this cell stays near 1x.
* **32 tasks, group: one list per loop iteration, one fsync per batch.** The
  loop hands the writer all saves made in one iteration as one queue item; the
  writer commits them (32 per batch here) with one fsync and resolves their
  futures with one loop wake-up. Where the time goes (instrumented run on
  2026-11-26, 1 KiB, group, 32 tasks, ~43k saves/s, ~23 us a save): COMMIT
  ~6.7 us (~215 us a batch, ~160 of them the fdatasync of ~7.5 WAL frames of
  8 KiB: the database header, the table's interior page, the leaves), the
  loop's turn (resuming 32 coroutines, their next saves) ~5.0 us and its
  wake-up ~1.3 us, the writer's Python for the ops ~2.7 us, row inserts
  ~2.2 us (multi-row INSERTs of up to 32 rows: ~0.35 us a row cheaper than
  one statement step per row), WAL checkpoints ~1.8 us (every byte is written
  twice in WAL mode), folds ~1.2 us (~2.1 us under schema 2), resolving
  callers ~0.65 us (within the turn; the turn was ~6.4 us on 2026-11-25, and
  `aio.save` now asks for the running loop once a save instead of twice: in
  CPython 3.11 each ask is a `getpid()` system call). What caps it:
  the loop's and the writer's Python cannot overlap under the GIL, and in
  this closed loop (every task awaits its save) nothing is left to run during
  the fsync; running the batch on the loop itself was not kept (writes other
  than a lone one stay off the loop). Interleaved runs on 2026-11-26 (7
  rounds of 2 s, medians): 41.4k saves/s against SqliteSaver's 3.86k, 10.7x;
  the code before schema 3 made 37.7k (9.8x) in the same runs.
* **Tried on 2026-11-25 and not kept** (interleaved A/B of the async 1 KiB
  group 32-task cell, medians of 3-6 runs of 2 s; per batch of 32 the
  instrumented writer spends ~200 us on ops and inserts and ~210 us in COMMIT,
  the loop ~160 us on its turn, the two thread wake-ups ~45 us): batches of 16
  out of a 32-save list, so one half's fsync overlaps the other's Python (29k
  saves/s against 39k: the extra commit and wake-ups cost more than the
  overlap gains), also with COMMIT at `synchronous=OFF` and the WAL's
  fdatasync on a thread of its own (32k at 16, 28k at 8, and no gain with one
  batch of 32); WAL checkpoints on a thread and connection of their own (no
  gain; likely because commits made beside a checkpoint keep the WAL from
  starting over, and an fdatasync of a growing file costs ~186 us here against
  ~117 us when rewriting one; completing them on the writer still took ~3 ms);
  WAL checkpoints every ~33 or ~150 pages (37k, 40k against 39.5k); 16 or 32
  KiB pages (36k, 36k against 38k); a leaner save path (the writer's ops 8-19
  us cheaper per batch of 32, the loop's closures 10-24 us dearer). With folds
  switched off (keys never written; a test only) this cell ran 15 % faster
  (40.4k against 35.1k), and 4096-row folds only 4 %: keying the rows (~1.2 us
  a row in the fold's one statement) is the largest cost left beside the
  fsync, and it is per row, not per fold (hence schema 3).
* **Tried on 2026-11-26 and not kept** (same cell, interleaved, medians of
  5-14 runs of 2 s): runs keyed by task, `(task_id, through_id)`, instead of
  appended (the fold's statement ~1.4 ms against ~0.7 ms a fold, and +5 %
  saves/s against +9 % for appended runs); runs of row ids only (~0.5 ms a
  fold, but a key would no longer name the seq and covers a read checks the
  row against); folds every 256 or 4096 rows (37.6k, 35.5k against 38.1k);
  WAL checkpoints every ~4000 pages (40.9k against 40.2k); resolving callers
  right after COMMIT, before the writer's bookkeeping of the batch (36.3k
  both).
* **Cheaper per save (later on 2026-11-26).** On the loop: `Checkpoint()`
  sets its slots through their descriptors instead of the frozen
  dataclass's `object.__setattr__` (~0.4 us a save; every caller makes one),
  and `validate_checkpoint` checks a checkpoint of exact field types on a fast
  path that remembers up to 4096 valid task ids (no regex per save). On the
  writer: a batch's rows go to the multi-row INSERT as the one flat list they
  were appended to (no per-batch flattening of 32 tuples, ~8 us), a loop's
  list of ops starts its batch as it is (no deque round trip) and its
  outcomes go back to the loop as the two lists they are (no per-op tuples,
  ~10 us), a batch of saves of known tasks skips the sort of the heads it
  defers, and the save op reads its fields once. Instrumented (3 s runs,
  medians per batch of 32, before -> after): the loop's turn 153 -> 131 us,
  row inserts 66 -> 57, COMMIT to callers resolved 37 -> 27, heads 8 -> 3.
  Four runs each of this bench on this cell (`--only lazarus --only
  langgraph-sqlite --only 1KiB --only group --only 32 --rounds 5`), the code
  before and after alternating, on a machine shared with other test runs:
  ours 40.3k, 43.3k, 42.1k, 37.5k saves/s before, 42.2k, 47.6k, 46.0k, 40.9k
  after (+9 % median of the pairs), SqliteSaver 3.7k-4.1k in all of them:
  10.9x, 10.8x, 10.5x, 9.7x before, 10.6x, 11.9x, 11.3x, 10.6x after. One
  task (`--only 1`): 1.1x before and after.
* **Tried later on 2026-11-26 and not kept** (same cell, interleaved): the
  fold's SELECT on the read pool, only its INSERT of the runs on the writer
  (the writer's fold 1.2 -> 0.46 ms, but -6 % saves/s; likely a third
  thread contending for the GIL, and a read connection that re-reads the
  tail's pages from the WAL); WAL checkpoints on a thread and connection of
  their own, completed on the writer (a quick probe: 13k saves/s; likely the
  writer's commits waiting in SQLite's busy handler, which sleeps in
  milliseconds, while the other connection checkpoints); WAL checkpoints every
  ~4000 pages again (the checkpoints' share fell from ~64 to ~57 us a batch
  but COMMIT rose, the WAL growing for four times as long before it first
  starts over: an fdatasync of a growing file is ~186 us here against ~108
  us when rewriting one); the garbage collector off (no change: allocations
  are not the cost). What is left per batch of 32 (~700 us): COMMIT ~205 us
  (16 pwrites ~32 us and the fdatasync ~108 us of it, measured raw), the
  loop's turn ~131 us (~79 us of it asyncio and the bench's coroutine, with
  a save that only makes a future), the writer's ops ~90 us and inserts
  ~57 us, WAL checkpoints ~60 us and folds ~36 us (each ~1.2 ms a fold of
  1024 rows, ~7 ms a WAL checkpoint of ~1000 frames, whose DB fdatasync
  grows the file), the two thread wake-ups ~48 us.
"""

PAYLOADS = {"1KiB": 1024, "256KiB": 256 * 1024}
MODES = ["sync", "group", "none"]
CONCURRENCY = [1, 32]


@dataclass
class Cell:
    impl: str
    payload: str
    durability: str
    concurrency: int
    saves_per_s: float
    rounds_saves_per_s: list[float]
    p50_ms: float
    p99_ms: float
    saves: int


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    idx = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[idx]


def run_ours(
    workdir: Path, payload: bytes, mode: str, concurrency: int, duration_s: float
) -> tuple[int, float, list[float]]:
    """Save through ``CheckpointStore.aio`` from ``concurrency`` asyncio tasks."""
    store = CheckpointStore(workdir, durability=mode)
    latencies: list[float] = []

    async def main() -> tuple[int, float]:
        a = store.aio
        deadline = time.perf_counter() + duration_s
        count = 0

        async def saver(i: int) -> None:
            nonlocal count
            task_id = f"bench-{i}"
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                await a.save(Checkpoint(task_id, 1, payload))
                latencies.append(time.perf_counter() - t0)
                count += 1

        start = time.perf_counter()
        await asyncio.gather(*(saver(i) for i in range(concurrency)))
        return count, time.perf_counter() - start

    try:
        count, elapsed = asyncio.run(main())
    finally:
        store.close()
    return count, elapsed, latencies


def _threaded(
    concurrency: int, duration_s: float, make_save: Callable[[int], Callable[[], object]]
) -> tuple[int, float, list[float]]:
    """Run ``make_save(i)()`` in a loop on ``concurrency`` threads for ``duration_s``."""
    latencies: list[float] = []
    lat_lock = threading.Lock()
    deadline = time.perf_counter() + duration_s

    def worker(i: int) -> None:
        save = make_save(i)
        mine: list[float] = []
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            save()
            mine.append(time.perf_counter() - t0)
        with lat_lock:
            latencies.extend(mine)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(latencies), time.perf_counter() - start, latencies


def run_ours_sync(
    workdir: Path, payload: bytes, mode: str, concurrency: int, duration_s: float
) -> tuple[int, float, list[float]]:
    """Save through the sync ``CheckpointStore.save`` from ``concurrency`` threads."""
    store = CheckpointStore(workdir, durability=mode)

    def make_save(i: int) -> Callable[[], object]:
        task_id = f"bench-{i}"
        return lambda: store.save(Checkpoint(task_id, 1, payload))

    try:
        return _threaded(concurrency, duration_s, make_save)
    finally:
        store.close()


def run_theirs(
    workdir: Path, payload: bytes, mode: str, concurrency: int, duration_s: float
) -> tuple[int, float, list[float]]:
    """Save through ``SqliteSaver.put`` from ``concurrency`` threads, equal durability."""
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(workdir / "langgraph.sqlite", check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={'OFF' if mode == 'none' else 'FULL'}")
    saver = SqliteSaver(conn)
    saver.setup()

    def make_save(i: int) -> Callable[[], object]:
        config: Any = {"configurable": {"thread_id": f"bench-{i}", "checkpoint_ns": ""}}
        step = 0

        def save() -> None:
            nonlocal config, step
            checkpoint = empty_checkpoint()
            checkpoint["channel_values"] = {"state": payload}
            config = saver.put(config, checkpoint, {"source": "loop", "step": step}, {})
            step += 1

        return save

    try:
        return _threaded(concurrency, duration_s, make_save)
    finally:
        conn.close()


RUNNERS: dict[str, Callable[[Path, bytes, str, int, float], tuple[int, float, list[float]]]] = {
    "lazarus": run_ours,
    "lazarus-sync-api": run_ours_sync,
    "langgraph-sqlite": run_theirs,
}


def bench(
    duration_s: float,
    rounds: int,
    only: set[str] | None = None,
    payloads: set[str] | None = None,
    modes: set[str] | None = None,
    tasks: set[int] | None = None,
) -> list[Cell]:
    cells: list[Cell] = []
    for payload_name, size in PAYLOADS.items():
        if payloads and payload_name not in payloads:
            continue
        payload = os.urandom(size)
        for mode in MODES:
            if modes and mode not in modes:
                continue
            for concurrency in CONCURRENCY:
                if tasks and concurrency not in tasks:
                    continue
                per_impl: dict[str, tuple[list[float], list[float], int]] = {
                    impl: ([], [], 0) for impl in RUNNERS
                }
                for _ in range(rounds):
                    for impl, runner in RUNNERS.items():
                        if only and impl not in only:
                            continue
                        workdir = Path(tempfile.mkdtemp(prefix="lazarus-bench-"))
                        try:
                            count, elapsed, lats = runner(
                                workdir, payload, mode, concurrency, duration_s
                            )
                        finally:
                            shutil.rmtree(workdir, ignore_errors=True)
                        rates, all_lats, total = per_impl[impl]
                        rates.append(count / elapsed)
                        all_lats.extend(lats)
                        per_impl[impl] = (rates, all_lats, total + count)
                for impl, (rates, lats, total) in per_impl.items():
                    if not rates:
                        continue
                    lats.sort()
                    cell = Cell(
                        impl=impl,
                        payload=payload_name,
                        durability=mode,
                        concurrency=concurrency,
                        saves_per_s=round(statistics.median(rates), 1),
                        rounds_saves_per_s=[round(r, 1) for r in rates],
                        p50_ms=round(_percentile(lats, 0.50) * 1000, 3),
                        p99_ms=round(_percentile(lats, 0.99) * 1000, 3),
                        saves=total,
                    )
                    cells.append(cell)
                    print(
                        f"{impl:17} {payload_name:>6} {mode:>5} x{concurrency:<2} "
                        f"{cell.saves_per_s:>10.0f} saves/s  p50 {cell.p50_ms:7.3f} ms  "
                        f"p99 {cell.p99_ms:7.3f} ms",
                        flush=True,
                    )
    return cells


def ratios(cells: list[Cell]) -> list[dict[str, Any]]:
    """Our saves/s over SqliteSaver's, per cell, for the async and the sync API."""
    index = {(c.impl, c.payload, c.durability, c.concurrency): c for c in cells}
    out = []
    for c in cells:
        if c.impl != "lazarus":
            continue
        key = (c.payload, c.durability, c.concurrency)
        theirs = index.get(("langgraph-sqlite", *key))
        sync_api = index.get(("lazarus-sync-api", *key))
        if theirs is None or theirs.saves_per_s == 0:
            continue
        out.append(
            {
                "payload": c.payload,
                "durability": c.durability,
                "concurrency": c.concurrency,
                "lazarus_saves_per_s": c.saves_per_s,
                "lazarus_sync_api_saves_per_s": sync_api.saves_per_s if sync_api else None,
                "langgraph_saves_per_s": theirs.saves_per_s,
                "ratio": round(c.saves_per_s / theirs.saves_per_s, 2),
                "ratio_sync_api": (
                    round(sync_api.saves_per_s / theirs.saves_per_s, 2) if sync_api else None
                ),
            }
        )
    return out


def table(cells: list[Cell], rat: list[dict[str, Any]]) -> str:
    index = {(c.impl, c.payload, c.durability, c.concurrency): c for c in cells}
    lines = [
        "| payload | durability | tasks | lazarus async saves/s (p50/p99 ms) "
        "| lazarus sync API saves/s (p50/p99 ms) | SqliteSaver saves/s (p50/p99 ms) "
        "| ratio async | ratio sync API |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]

    def fmt(c: Cell | None) -> str:
        if c is None:
            return "-"
        return f"{c.saves_per_s:,.0f} ({c.p50_ms:.2f} / {c.p99_ms:.2f})"

    for r in rat:
        key = (r["payload"], r["durability"], r["concurrency"])
        ours = index[("lazarus", *key)]
        sync_api = index.get(("lazarus-sync-api", *key))
        theirs = index[("langgraph-sqlite", *key)]
        sync_ratio = "-" if r["ratio_sync_api"] is None else f"{r['ratio_sync_api']:.1f}x"
        lines.append(
            f"| {r['payload']} | {r['durability']} | {r['concurrency']} | {fmt(ours)} "
            f"| {fmt(sync_api)} | {fmt(theirs)} | **{r['ratio']:.1f}x** | {sync_ratio} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per run")
    parser.add_argument("--rounds", type=int, default=3, help="runs per cell (median taken)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="0.2 s x 1 round, no README, JSON to the temp dir unless --out",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results path")
    parser.add_argument(
        "--only",
        action="append",
        metavar="FILTER",
        help="run only matching cells (repeatable): an impl (lazarus, lazarus-sync-api, "
        "langgraph-sqlite), a payload (1KiB), a mode (group) or a task count (32); "
        "filters of one kind are OR-ed, kinds AND-ed; a filtered run writes no README",
    )
    args = parser.parse_args(argv)
    duration, rounds = (0.2, 1) if args.quick else (args.duration, args.rounds)
    impls: set[str] = set()
    payloads: set[str] = set()
    modes: set[str] = set()
    tasks: set[int] = set()
    for f in args.only or []:
        if f in RUNNERS:
            impls.add(f)
        elif f in PAYLOADS:
            payloads.add(f)
        elif f in MODES:
            modes.add(f)
        elif f.isdigit() and int(f) in CONCURRENCY:
            tasks.add(int(f))
        else:
            parser.error(f"--only {f!r}: not an impl, payload, mode or task count")
    if (args.quick or args.only) and args.out == RESULTS:  # keep the committed figures
        args.out = Path(tempfile.gettempdir()) / "checkpoint-partial.json"

    started = time.time()
    commit = measured_commit()
    cells = bench(duration, rounds, impls, payloads, modes, tasks)
    rat = ratios(cells)
    result = {
        "benchmark": "checkpoint_store_vs_langgraph_sqlitesaver",
        "commit": commit,
        "started_at_unix_s": round(started),
        "duration_s_per_run": duration,
        "rounds": rounds,
        "equal_durability": {
            "sync": "lazarus: txn per save, synchronous=FULL; SqliteSaver: synchronous=FULL",
            "group": "lazarus: shared txn + one fsync per batch, callers return after it; "
            "SqliteSaver: synchronous=FULL",
            "none": "both synchronous=OFF",
        },
        "cells": [asdict(c) for c in cells],
        "ratios": rat,
    }
    write_json(args.out, result)
    print(f"\nwrote {args.out}")
    md = table(cells, rat)
    print(md)
    if not args.quick and not args.only:
        write_section(
            "checkpoint",
            f"Commit `{commit}` measured {today()} on {os.cpu_count()} cores, "
            f"Python {platform.python_version()}, "
            f"SQLite {sqlite3.sqlite_version}; {rounds} rounds x {duration:g} s per cell, "
            "median saves/s, pooled latency percentiles.\n"
            "`.venv/bin/python bench/checkpoint_bench.py` (or `make bench`); raw figures in "
            "`bench/results/checkpoint.json`. The machine is shared with other "
            "workers: single cells move by +-15 % between runs.\n\n" + md + "\n\n" + NOTES,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
