"""LangGraph checkpointer puts: LazarusSaver against SqliteSaver, at equal durability.

Each writer owns one LangGraph thread and puts checkpoints in a loop for
``--duration`` seconds: a real ``Checkpoint`` whose ``messages`` channel (a
list of ~1 KiB of message dicts) changes on every put, so every put stores
that channel's new value, as a graph with a growing conversation would.

* ``lazarus-saver``: ``LazarusSaver.local(dir, durability=mode).put`` from
  ``concurrency`` threads (the sync API, as ``graph.invoke`` calls it);
* ``lazarus-saver-async``: ``LazarusSaver.aput`` from ``concurrency`` asyncio tasks;
* ``langgraph-sqlite``: ``SqliteSaver.put`` from ``concurrency`` threads on one
  connection (WAL), ``synchronous=FULL`` for sync / group (a put is fsynced
  before it returns, as ours are) and ``synchronous=OFF`` for none.

RedisSaver (``langgraph-checkpoint-redis``) is not measured: it needs the
RedisJSON and RediSearch modules (Redis Stack or Redis >= 8), which the Debian
``redis-server`` (7.0) this project runs on lacks. LazarusSaver inside a task
with durability "replicated" also waits for Redis; that path is measured by the
recovery bench, not here.

Each cell runs ``--rounds`` times, the implementations interleaved, each in a
fresh directory; saves/s is the median over rounds, latency percentiles pool
all rounds. Results: ``bench/results/langgraph.json`` and the ``langgraph``
section of ``bench/README.md``.

Run: ``.venv/bin/python bench/langgraph_bench.py [--quick]``.
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
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint

from node_agent.langgraph import LazarusSaver

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import RESULTS_DIR, today, write_json, write_section
from checkpoint_bench import _percentile, _threaded

RESULTS = RESULTS_DIR / "langgraph.json"
MODES = ["sync", "group", "none"]
CONCURRENCY = [1, 32]
MESSAGES = [{"role": "user", "content": "x" * 120, "n": i} for i in range(8)]  # ~1 KiB


@dataclass
class Cell:
    impl: str
    durability: str
    concurrency: int
    puts_per_s: float
    rounds_puts_per_s: list[float]
    p50_ms: float
    p99_ms: float
    puts: int


def _putter(saver: BaseCheckpointSaver[Any], i: int) -> Callable[[], Any]:
    config: Any = {"configurable": {"thread_id": f"bench-{i}", "checkpoint_ns": ""}}
    version: Any = None

    def put() -> None:
        nonlocal config, version
        version = saver.get_next_version(version, None)
        ck = empty_checkpoint()
        ck["channel_values"] = {"messages": MESSAGES}
        ck["channel_versions"] = {"messages": version}
        config = saver.put(config, ck, {"source": "loop", "step": 0}, {"messages": version})

    return put


def run_lazarus(workdir: Path, mode: str, concurrency: int, duration_s: float) -> Any:
    saver = LazarusSaver.local(workdir, durability=mode)
    try:
        return _threaded(concurrency, duration_s, lambda i: _putter(saver, i))
    finally:
        saver.close()


def run_lazarus_async(workdir: Path, mode: str, concurrency: int, duration_s: float) -> Any:
    saver = LazarusSaver.local(workdir, durability=mode)
    latencies: list[float] = []

    async def main() -> tuple[int, float]:
        deadline = time.perf_counter() + duration_s
        count = 0

        async def writer(i: int) -> None:
            nonlocal count
            config: Any = {"configurable": {"thread_id": f"bench-{i}", "checkpoint_ns": ""}}
            version: Any = None
            while time.perf_counter() < deadline:
                version = saver.get_next_version(version, None)
                ck = empty_checkpoint()
                ck["channel_values"] = {"messages": MESSAGES}
                ck["channel_versions"] = {"messages": version}
                t0 = time.perf_counter()
                config = await saver.aput(
                    config, ck, {"source": "loop", "step": 0}, {"messages": version}
                )
                latencies.append(time.perf_counter() - t0)
                count += 1

        start = time.perf_counter()
        await asyncio.gather(*(writer(i) for i in range(concurrency)))
        return count, time.perf_counter() - start

    try:
        count, elapsed = asyncio.run(main())
    finally:
        saver.close()
    return count, elapsed, latencies


def run_sqlite(workdir: Path, mode: str, concurrency: int, duration_s: float) -> Any:
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(workdir / "langgraph.sqlite", check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={'OFF' if mode == 'none' else 'FULL'}")
    saver = SqliteSaver(conn)
    saver.setup()
    try:
        return _threaded(concurrency, duration_s, lambda i: _putter(saver, i))
    finally:
        conn.close()


RUNNERS: dict[str, Callable[[Path, str, int, float], Any]] = {
    "lazarus-saver": run_lazarus,
    "lazarus-saver-async": run_lazarus_async,
    "langgraph-sqlite": run_sqlite,
}


def bench(duration_s: float, rounds: int) -> list[Cell]:
    cells: list[Cell] = []
    for mode in MODES:
        for concurrency in CONCURRENCY:
            per: dict[str, tuple[list[float], list[float], int]] = {k: ([], [], 0) for k in RUNNERS}
            for _ in range(rounds):
                for impl, runner in RUNNERS.items():
                    workdir = Path(tempfile.mkdtemp(prefix="lazarus-lg-bench-"))
                    try:
                        count, elapsed, lats = runner(workdir, mode, concurrency, duration_s)
                    finally:
                        shutil.rmtree(workdir, ignore_errors=True)
                    rates, all_lats, total = per[impl]
                    rates.append(count / elapsed)
                    all_lats.extend(lats)
                    per[impl] = (rates, all_lats, total + count)
            for impl, (rates, lats, total) in per.items():
                lats.sort()
                cell = Cell(
                    impl=impl,
                    durability=mode,
                    concurrency=concurrency,
                    puts_per_s=round(statistics.median(rates), 1),
                    rounds_puts_per_s=[round(r, 1) for r in rates],
                    p50_ms=round(_percentile(lats, 0.50) * 1000, 3),
                    p99_ms=round(_percentile(lats, 0.99) * 1000, 3),
                    puts=total,
                )
                cells.append(cell)
                print(
                    f"{impl:20} {mode:>5} x{concurrency:<2} {cell.puts_per_s:>9.0f} puts/s  "
                    f"p50 {cell.p50_ms:7.3f} ms  p99 {cell.p99_ms:7.3f} ms",
                    flush=True,
                )
    return cells


def table(cells: list[Cell]) -> str:
    index = {(c.impl, c.durability, c.concurrency): c for c in cells}
    lines = [
        "| durability | threads | LazarusSaver.put puts/s (p50/p99 ms) "
        "| LazarusSaver.aput puts/s (p50/p99 ms) | SqliteSaver.put puts/s (p50/p99 ms) "
        "| ratio put | ratio aput |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]

    def fmt(c: Cell) -> str:
        return f"{c.puts_per_s:,.0f} ({c.p50_ms:.2f} / {c.p99_ms:.2f})"

    for mode in MODES:
        for n in CONCURRENCY:
            ours = index[("lazarus-saver", mode, n)]
            ours_a = index[("lazarus-saver-async", mode, n)]
            theirs = index[("langgraph-sqlite", mode, n)]
            r = ours.puts_per_s / theirs.puts_per_s if theirs.puts_per_s else float("nan")
            ra = ours_a.puts_per_s / theirs.puts_per_s if theirs.puts_per_s else float("nan")
            lines.append(
                f"| {mode} | {n} | {fmt(ours)} | {fmt(ours_a)} | {fmt(theirs)} "
                f"| **{r:.1f}x** | {ra:.1f}x |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=1.5, help="seconds per run")
    parser.add_argument("--rounds", type=int, default=3, help="runs per cell (median taken)")
    parser.add_argument("--quick", action="store_true", help="0.2 s x 1 round, no README")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results path")
    parser.add_argument("--commit", default="", help="commit measured (for the README)")
    args = parser.parse_args(argv)
    duration, rounds = (0.2, 1) if args.quick else (args.duration, args.rounds)
    started = time.time()
    cells = bench(duration, rounds)
    result = {
        "benchmark": "langgraph_lazarussaver_vs_sqlitesaver",
        "started_at_unix_s": round(started),
        "commit": args.commit,
        "duration_s_per_run": duration,
        "rounds": rounds,
        "equal_durability": {
            "sync": "LazarusSaver: local store, one fsync'd txn per put; "
            "SqliteSaver: WAL, synchronous=FULL",
            "group": "LazarusSaver: group commit, each put returns after the fsync covering it; "
            "SqliteSaver: WAL, synchronous=FULL",
            "none": "both commit without fsync",
        },
        "redis_saver": "not measured: langgraph-checkpoint-redis needs RedisJSON + RediSearch "
        "(Redis Stack / Redis >= 8); Debian's redis-server 7.0 has neither",
        "cells": [asdict(c) for c in cells],
    }
    write_json(args.out, result)
    md = table(cells)
    print(f"\nwrote {args.out}\n{md}")
    if not args.quick:
        commit = f" at commit `{args.commit}`" if args.commit else ""
        write_section(
            "langgraph",
            f"LangGraph checkpointer puts{commit}, measured {today()} on {os.cpu_count()} cores "
            f"(shared with other workers: noisy), Python {platform.python_version()}, "
            f"SQLite {sqlite3.sqlite_version}; {rounds} rounds x {duration:g} s per cell, "
            "median puts/s, pooled latency percentiles; one LangGraph thread per writer, "
            "each put stores a changed ~1 KiB `messages` channel.\n"
            "`.venv/bin/python bench/langgraph_bench.py`; raw figures in "
            "`bench/results/langgraph.json`. RedisSaver is not measured: it needs the "
            "RedisJSON and RediSearch modules, which Debian's redis-server 7.0 lacks.\n\n" + md,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
