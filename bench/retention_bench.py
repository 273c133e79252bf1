"""Retention: etcd's size and the leader's memory stay flat however many tasks run.

Starts a local dev cluster (``lazarus_dev.devcluster.LocalCluster``: one etcd with
periodic auto-compaction as the chart runs it, Redis, three ``lazarus
coordinator`` processes with a short ``--retention-s``, ``--agents`` node
agents running the demo app) and submits short ``sleep`` tasks (0.01 s, one
checkpoint) from ``--concurrency`` clients until ``--tasks`` were submitted
(default 200,000, the issue's figure) or ``--duration-s`` passed. Every
``--sample-s`` it records the tasks submitted so far, the task records etcd
holds (``etcdctl get --prefix --keys-only``, its ``count``), etcd's db size and
in-use size (``etcdctl endpoint status``; with auto-compaction the in-use size
is the live data, the db size only shrinks on defragmentation) and the
leader's resident memory (``/proc/<pid>/status`` VmRSS).

Results: ``bench/results/retention.json`` (every sample) and a summary on
stdout; ``bench/README.md`` holds the table of the recorded run. Every process
is stopped at the end.

Run: ``.venv/bin/python bench/retention_bench.py [--tasks 200000]
[--retention-s 10] [--agents 4] [--concurrency 32] [--compaction 1m]``
(about 30 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import grpc.aio

from lazarus.v1 import records_pb2
from lazarus_dev.devcluster import LocalCluster

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import measured_commit, today, write_section

ROOT = Path(__file__).resolve().parent
PAYLOAD = json.dumps({"seconds": 0.01, "checkpoints": 1}).encode()


def _etcd(endpoints: list[str], *args: str) -> str:
    done = subprocess.run(
        ["etcdctl", f"--endpoints={','.join(endpoints)}", *args],
        capture_output=True,
        text=True,
        timeout=10,
    )
    if done.returncode != 0:
        raise RuntimeError(f"etcdctl {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _sample(cluster: LocalCluster, name: str, leader_pid: int | None) -> dict[str, Any]:
    endpoints = cluster.etcd_endpoints
    count = _etcd(
        endpoints,
        "get",
        "--prefix",
        "--keys-only",
        "--limit=1",
        "-w",
        "json",
        f"/lazarus/{name}/tasks/",
    )
    status = json.loads(_etcd(endpoints, "endpoint", "status", "-w", "json"))[0]["Status"]
    rss_kib = 0
    if leader_pid is not None:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{leader_pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss_kib = int(line.split()[1])
    return {
        "etcd_task_records": int(json.loads(count).get("count", 0)),
        "etcd_db_bytes": int(status.get("dbSize", 0)),
        "etcd_db_in_use_bytes": int(status.get("dbSizeInUse", 0)),
        "leader_rss_bytes": rss_kib * 1024,
    }


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    name = f"ret-{uuid.uuid4().hex[:6]}"
    run_dir = Path(tempfile.mkdtemp(prefix="lazarus-retention-bench-"))
    cluster = LocalCluster(
        run_dir,
        coordinators=3,
        agents=args.agents,
        cluster=name,
        coordinator_args=["--retention-s", str(args.retention_s)],
        # as the chart runs etcd: auto-compaction keeps only recent revisions
        etcd_args=[
            "--auto-compaction-mode=periodic",
            f"--auto-compaction-retention={args.compaction}",
        ],
    )
    cluster.start()
    samples: list[dict[str, Any]] = []
    submitted = 0
    errors: dict[str, int] = {}
    try:
        await cluster.ready(timeout_s=60)
        started = time.monotonic()
        deadline = started + args.duration_s
        stop = asyncio.Event()

        async def client(index: int) -> None:
            nonlocal submitted
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    await cluster.submit(f"c{index}-{n}", "sleep", PAYLOAD)
                    submitted += 1
                except (grpc.aio.AioRpcError, RuntimeError) as exc:
                    errors[type(exc).__name__ + ": " + str(exc)[:160]] = (
                        errors.get(type(exc).__name__ + ": " + str(exc)[:160], 0) + 1
                    )
                    await asyncio.sleep(0.1)  # a refusal returns at once: do not spin the loop

        clients = [asyncio.create_task(client(i)) for i in range(args.concurrency)]
        while time.monotonic() < deadline and submitted < args.tasks:
            await asyncio.sleep(args.sample_s)
            index, _ = await cluster.leader()
            sample = await asyncio.to_thread(
                _sample, cluster, name, cluster.coordinators[index].pid
            )
            sample["t_s"] = round(time.monotonic() - started, 1)
            sample["submitted"] = submitted
            sample["submit_errors"] = sum(errors.values())
            samples.append(sample)
            print(json.dumps(sample), flush=True)
        stop.set()
        for task in clients:
            task.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
        elapsed_s = time.monotonic() - started
        tasks = await cluster.list_tasks()
        live = sum(1 for t in tasks if t.state != records_pb2.TASK_STATE_COMPLETED)
    finally:
        await asyncio.to_thread(cluster.stop)
    return {
        "bench": "retention",
        "host": platform.node(),
        "python": sys.version.split()[0],
        "duration_s": round(elapsed_s, 1),
        "retention_s": args.retention_s,
        "agents": args.agents,
        "concurrency": args.concurrency,
        "tasks_submitted": submitted,
        "submit_errors": errors,
        "etcd_auto_compaction": f"periodic {args.compaction}",
        "tasks_in_etcd_at_end_not_completed": live,
        "samples": samples,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--duration-s", type=float, default=3600.0, help="stop after this long at most"
    )
    parser.add_argument("--retention-s", type=float, default=10.0)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--sample-s", type=float, default=10.0)
    parser.add_argument(
        "--tasks", type=int, default=200_000, help="stop once this many tasks were submitted"
    )
    parser.add_argument(
        "--compaction", default="1m", help="etcd --auto-compaction-retention (periodic mode)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "retention.json")
    parser.add_argument("--no-readme", action="store_true", help="do not rewrite bench/README.md")
    parser.add_argument(
        "--readme-from", type=Path, help="write the README table from this JSON; run nothing"
    )
    args = parser.parse_args()
    if args.readme_from is not None:
        write_section("retention", readme(json.loads(args.readme_from.read_text())))
        return 0
    result = asyncio.run(_run(args))
    result["date"] = today()
    result["commit"] = measured_commit()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    first, last = result["samples"][0], result["samples"][-1]
    print(
        f"{result['tasks_submitted']} tasks in {result['duration_s']:.0f} s; etcd task records "
        f"{first['etcd_task_records']} -> {last['etcd_task_records']}, db in use "
        f"{first['etcd_db_in_use_bytes']} -> {last['etcd_db_in_use_bytes']} B, leader RSS "
        f"{first['leader_rss_bytes']} -> {last['leader_rss_bytes']} B"
    )
    if not args.no_readme:
        write_section("retention", readme(result))
    return 0


def readme(result: dict[str, Any]) -> str:
    """The README section: one row per ~10% of the run, first and last included."""
    samples = result["samples"]
    step = max(1, len(samples) // 10)
    picked = samples[::step]
    if picked[-1] is not samples[-1]:
        picked.append(samples[-1])
    rows = [
        "| t (s) | tasks submitted | task records in etcd | etcd db size MiB "
        "| etcd db in use MiB | leader RSS MiB |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    mib = 1024 * 1024
    for x in picked:
        rows.append(
            f"| {x['t_s']:,.0f} | {x['submitted']:,} | {x['etcd_task_records']:,} "
            f"| {x['etcd_db_bytes'] / mib:.1f} | {x['etcd_db_in_use_bytes'] / mib:.1f} "
            f"| {x['leader_rss_bytes'] / mib:.0f} |"
        )
    later = samples[len(samples) // 4 :]
    rss = [x["leader_rss_bytes"] / mib for x in later]
    records = [x["etcd_task_records"] for x in later]
    in_use = [x["etcd_db_in_use_bytes"] / mib for x in later]
    compaction = str(result.get("etcd_auto_compaction", "? ?")).split()[-1]
    return f"""## Retention: etcd size and leader memory, many short tasks (`retention_bench.py`)

[hardening] item 5. A local dev cluster (1 etcd member with
`--auto-compaction-mode=periodic --auto-compaction-retention={compaction}`,
Redis, 3 coordinators with `--retention-s {result["retention_s"]:g}`,
{result["agents"]} demo-app agents) runs short `sleep` tasks (0.01 s, one
checkpoint) from {result["concurrency"]} concurrent clients; every 10 s the bench
records the task records in etcd, etcd's db size and in-use size and the
leader's RSS. Terminal tasks leave etcd for the Redis archive after the
retention period, so the records in etcd stay near throughput x retention
however many tasks ran; compaction keeps the in-use size flat (the db file
itself only shrinks on `etcdctl defrag`, see docs/operator.md).

Measured {result.get("date", "?")} at commit `{result.get("commit", "?")}` on 2 shared cores:
**{result["tasks_submitted"]:,} tasks in {result["duration_s"]:,.0f} s**. From the first
quarter of the run on: task records in etcd {min(records):,}-{max(records):,}, etcd
in use {min(in_use):.1f}-{max(in_use):.1f} MiB, leader RSS {min(rss):.0f}-{max(rss):.0f} MiB; the db
file reached {samples[-1]["etcd_db_bytes"] / mib:.0f} MiB early and stayed there.
{result.get("tasks_in_etcd_at_end_not_completed", 0):,} tasks were still queued or running when
submitting stopped. Throughput varies with what else runs on the machine
(other tests and drills shared it during the recorded run).
`.venv/bin/python bench/retention_bench.py` (about 30 minutes); every sample in
`bench/results/retention.json`.

{chr(10).join(rows)}
"""


if __name__ == "__main__":
    sys.exit(main())
