"""The task path, measured from outside: what a checkpoint per step costs a handler.

Issue [task-path] item 4. Workload (the issue's): T tasks x S steps, each step
either I/O-bound (``sleep``) or CPU-bound Python (hashing, ``step_s`` of the
thread's CPU time), a ``ctx.checkpoint`` after every step, plain ``def``
handlers, on a real local cluster (etcd, Redis, 1 coordinator, ``--agents``
node agents with ``--slots`` slots each; ``lazarus_dev.devcluster.LocalCluster``).
Every (step kind, isolation, durability) runs ``--rounds`` interleaved pairs of
jobs: one without any checkpoint (the no-checkpoint ideal for the same slots),
then one with a checkpoint per step; the first job after each change of kind
or isolation is a warm-up and is not counted.

Per task (``bench/taskpath_app.py`` logs it): task time (handler start to
return, monotonic), work (steps x step_s), every checkpoint call's duration
and every step's wall time (work plus its checkpoint). Reported:

- ``overhead_ms`` p50/p99: (task time - work) / steps, with checkpoints. For
  I/O-bound steps this is the checkpoint's cost; for CPU-bound steps with more
  slots than cores it also holds the wait for a core, so compare with the ideal;
- ``vs_ideal_ms`` p50: median step wall with checkpoints - median without, per
  round, median over rounds: what a checkpoint adds to a step;
  ``vs_ideal_task_ms``: the same from median task times / steps. Both move
  with how the waves of tasks overlap (a task that runs while fewer others
  run is faster): on CPU-bound rows single rounds spread by +-1.5 ms, so
  read the rounds and the job ratio with them.
- ``ckpt_call_ms`` p50/p99: one ``ctx.checkpoint`` call as the handler saw it;
- ``hops_ms``: mean of each hop of the sync short path, from the agents'
  ``lazarus_agent_checkpoint_hop_seconds`` (commit, handoff, redis, wake);
- ``cpu_ms_per_ckpt``: CPU of each process role, (with - without) / checkpoints;
- ``job_s`` and ``ideal_job_s``: first submit to last completion, with and
  without checkpoints; ``job_ratio`` = their quotient (median over rounds).

Isolation: ``thread`` (a thread of the agent) and ``process`` (a worker process
per slot, ``@agent.task(..., isolation="process")``). Results:
``bench/results/taskpath.json`` and the "taskpath" section of ``bench/README.md``.
Processes are stopped by pid at the end.

Run: ``.venv/bin/python bench/taskpath_bench.py [--tasks 20] [--steps 20]
[--step-s 0.1] [--kinds io,cpu] [--isolations thread,process]
[--durability local,replicated] [--rounds 3]`` (about 12 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import RESULTS_DIR, today, write_json, write_section

from lazarus.v1 import records_pb2
from lazarus_dev.devcluster import LocalCluster
from lazarus_dev.localservers import EtcdCluster

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
DURABILITY = {
    "local": records_pb2.CHECKPOINT_DURABILITY_LOCAL,
    "replicated": records_pb2.CHECKPOINT_DURABILITY_REPLICATED,
}


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


_TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu_s(pid: int | None, children: bool = False) -> float:
    """CPU seconds (user + system) of ``pid``; with ``children``, of its live child processes."""
    if pid is None:
        return 0.0
    total = 0.0
    pids = [pid]
    if children:
        pids = []
        for task in Path(f"/proc/{pid}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                pids += [int(c) for c in task.read_text().split()]
    for p in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _TICK
    return total


def _etcd_pids(cluster: LocalCluster) -> list[int | None]:
    etcd = cluster.etcd
    if etcd is None:
        return []
    if isinstance(etcd, EtcdCluster):
        return etcd.pids
    return [etcd.pid]


def _cpu(cluster: LocalCluster) -> dict[str, float]:
    """CPU seconds so far per role: agents, their worker processes, coordinator, redis, etcd."""
    return {
        "agent": sum(_proc_cpu_s(a.pid) for a in cluster.agents),
        "workers": sum(_proc_cpu_s(a.pid, children=True) for a in cluster.agents),
        "coordinator": sum(_proc_cpu_s(c.pid) for c in cluster.coordinators),
        "redis": _proc_cpu_s(cluster.redis.pid) if cluster.redis else 0.0,
        "etcd": sum(_proc_cpu_s(pid) for pid in _etcd_pids(cluster)),
    }


def _count_lines(path: Path) -> int:
    with contextlib.suppress(OSError):
        return path.read_bytes().count(b"\n")
    return 0


def _hops(urls: list[str]) -> dict[str, tuple[float, float]]:
    """hop -> (sum seconds, count) over every agent's metrics."""
    out: dict[str, list[float]] = {}
    for url in urls:
        try:
            text = urllib.request.urlopen(url, timeout=5).read().decode()
        except OSError:
            continue
        for line in text.splitlines():
            if not line.startswith("lazarus_agent_checkpoint_hop_seconds_"):
                continue
            name, value = line.rsplit(" ", 1)
            hop = name.split('hop="', 1)[1].split('"', 1)[0]
            acc = out.setdefault(hop, [0.0, 0.0])
            if name.startswith("lazarus_agent_checkpoint_hop_seconds_sum"):
                acc[0] += float(value)
            elif name.startswith("lazarus_agent_checkpoint_hop_seconds_count"):
                acc[1] += float(value)
    return {k: (v[0], v[1]) for k, v in out.items()}


async def _job(
    cluster: LocalCluster,
    kind: str,
    durability: str,
    args: argparse.Namespace,
    checkpoint: bool,
    isolation: str = "thread",
) -> dict[str, Any]:
    out = Path(tempfile.mkstemp(prefix="taskpath-", suffix=".jsonl", dir=cluster.run_dir)[1])
    # The previous job's last local-durability records may still linger on their
    # way to Redis (up to a tick plus --replication-linger-s): let them land
    # before this job's hop and CPU counters start.
    await asyncio.sleep(0.5)
    hops0 = _hops(cluster.agent_metrics)
    cpu0 = _cpu(cluster)
    payload = {
        "steps": args.steps,
        "step_s": args.step_s,
        "out": str(out),
        "checkpoint": checkpoint,
    }
    t0 = time.time()
    ids = set()
    for i in range(args.tasks):
        rec = await cluster.submit(
            f"{kind}-{durability}-{checkpoint}-{i}-{uuid.uuid4().hex[:6]}",
            f"tp-{kind}" + ("-process" if isolation == "process" else ""),
            json.dumps(payload).encode(),
            durability=DURABILITY[durability],
        )
        ids.add(rec.task_id)
    # Every task appends one line to ``out`` when its handler ends: wait for them
    # by reading that file (cheap), and ask the coordinator only every 2 s (for
    # failures) and at the end. Polling ListTasks every 50 ms cost the
    # coordinator more CPU than the checkpoints' progress updates did, and that
    # CPU came out of the handlers' cores.
    deadline = time.monotonic() + 600
    next_list = time.monotonic() + 2.0
    while True:
        finished = await asyncio.to_thread(_count_lines, out)
        if finished >= len(ids) or time.monotonic() >= next_list:
            next_list = time.monotonic() + 2.0
            tasks = [t for t in await cluster.list_tasks() if t.task_id in ids]
            done = [
                t
                for t in tasks
                if t.state in (records_pb2.TASK_STATE_COMPLETED, records_pb2.TASK_STATE_FAILED)
            ]
            if len(done) == len(ids):
                break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{finished}/{len(ids)} handlers ended")
        await asyncio.sleep(0.05)
    failed = [t for t in done if t.state != records_pb2.TASK_STATE_COMPLETED]
    text = await asyncio.to_thread(out.read_text)
    lines = [json.loads(x) for x in text.splitlines() if x.strip()]
    job_s = max(x["end_wall"] for x in lines) - t0
    hops1 = _hops(cluster.agent_metrics)
    cpu1 = _cpu(cluster)
    hops = {
        hop: (hops1[hop][0] - hops0.get(hop, (0.0, 0.0))[0])
        / max(1.0, hops1[hop][1] - hops0.get(hop, (0.0, 0.0))[1])
        * 1000
        for hop in hops1
        if hops1[hop][1] - hops0.get(hop, (0.0, 0.0))[1] > 0
    }
    cpu = {role: cpu1[role] - cpu0[role] for role in cpu1}
    return {"lines": lines, "job_s": job_s, "failed": len(failed), "hops_ms": hops, "cpu_s": cpu}


def _row(
    kind: str,
    durability: str,
    isolation: str,
    args: argparse.Namespace,
    rounds: list[tuple[dict[str, Any], dict[str, Any]]],
) -> dict[str, Any]:
    """One table row from ``rounds`` of (no-checkpoint ideal, with checkpoints) jobs.

    Per round: ``vs_ideal`` = median step wall with checkpoints - without, and the
    job ratio; the row gives their medians over rounds. Per-task and per-call
    figures are pooled over rounds.
    """
    lines = [x for _, run in rounds for x in run["lines"]]
    over = [(x["task_s"] - x["work_s"]) / x["steps"] * 1000 for x in lines]
    calls = [c * 1000 for x in lines for c in x["ckpt_s"]]
    vs_step, vs_task, job_ratio = [], [], []
    for ideal, run in rounds:
        walls = [w for x in run["lines"] for w in x["step_walls"]]
        ideal_walls = [w for x in ideal["lines"] for w in x["step_walls"]]
        vs_step.append((statistics.median(walls) - statistics.median(ideal_walls)) * 1000)
        task_med = statistics.median(x["task_s"] for x in run["lines"])
        ideal_task = statistics.median(x["task_s"] for x in ideal["lines"])
        vs_task.append((task_med - ideal_task) / args.steps * 1000)
        job_ratio.append(run["job_s"] / ideal["job_s"])
    n_calls = max(1, len(calls))
    cpu_with = {
        role: sum(run["cpu_s"][role] for _, run in rounds) for role in rounds[0][1]["cpu_s"]
    }
    cpu_without = {
        role: sum(ideal["cpu_s"][role] for ideal, _ in rounds) for role in rounds[0][0]["cpu_s"]
    }
    hops: dict[str, float] = {}
    for hop in {h for _, run in rounds for h in run["hops_ms"]}:
        hops[hop] = statistics.mean(
            run["hops_ms"][hop] for _, run in rounds if hop in run["hops_ms"]
        )
    return {
        "kind": kind,
        "durability": durability,
        "isolation": isolation,
        "tasks": args.tasks,
        "steps": args.steps,
        "step_s": args.step_s,
        "slots": args.slots * args.agents,
        "rounds": len(rounds),
        "overhead_ms_p50": _pct(over, 0.5),
        "overhead_ms_p99": _pct(over, 0.99),
        "vs_ideal_ms_p50": statistics.median(vs_step),
        "vs_ideal_ms_rounds": vs_step,
        "vs_ideal_task_ms_p50": statistics.median(vs_task),
        "vs_ideal_task_ms_rounds": vs_task,
        "ckpt_call_ms_p50": _pct(calls, 0.5),
        "ckpt_call_ms_p99": _pct(calls, 0.99),
        "task_s_p50": statistics.median(x["task_s"] for x in lines),
        "task_s_p90": _pct([x["task_s"] for x in lines], 0.9),
        "ideal_task_s_p50": statistics.median(
            x["task_s"] for ideal, _ in rounds for x in ideal["lines"]
        ),
        "hops_ms": hops,
        # CPU ms per checkpoint per role: (with - without) / checkpoints
        "cpu_ms_per_ckpt": {
            role: (cpu_with[role] - cpu_without[role]) / n_calls * 1000 for role in cpu_with
        },
        "job_s": statistics.median(run["job_s"] for _, run in rounds),
        "ideal_job_s": statistics.median(ideal["job_s"] for ideal, _ in rounds),
        "job_ratio": statistics.median(job_ratio),
        "job_ratio_rounds": job_ratio,
        "failed": sum(run["failed"] for _, run in rounds),
    }


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="lazarus-taskpath-bench-") as tmp:
        cluster = LocalCluster(
            Path(tmp),
            coordinators=1,
            agents=args.agents,
            cluster=f"tpb-{uuid.uuid4().hex[:6]}",
            agent_args=["--slots", str(args.slots), "--app", "taskpath_app:agent"],
            env={"PYTHONPATH": f"{BENCH}:{REPO}"},
        )
        try:
            cluster.start()
            await cluster.ready(60)
            combos = [(k, i) for k in args.kinds.split(",") for i in args.isolations.split(",")]
            durabilities = args.durability.split(",")
            for kind, isolation in combos:
                # Warm-up: the first job after a start pays for worker processes.
                await _job(cluster, kind, "local", args, False, isolation)
                per: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {
                    d: [] for d in durabilities
                }
                for r in range(args.rounds):
                    for durability in durabilities:
                        ideal = await _job(cluster, kind, "local", args, False, isolation)
                        run = await _job(cluster, kind, durability, args, True, isolation)
                        per[durability].append((ideal, run))
                        print(
                            f"{kind}/{isolation}/{durability} round {r + 1}/{args.rounds}: "
                            f"job {run['job_s']:.2f} s vs ideal {ideal['job_s']:.2f} s",
                            file=sys.stderr,
                            flush=True,
                        )
                for durability in durabilities:
                    row = _row(kind, durability, isolation, args, per[durability])
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        finally:
            await asyncio.to_thread(cluster.stop)
    return {"rows": rows}


def _commit() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
    ).stdout.strip()


def _table(result: dict[str, Any]) -> str:
    r0 = result["rows"][0]
    head = (
        f"Measured {today()} at commit `{result['commit']}` on 2 cores (shared with other "
        f"workers: noisy). {r0['tasks']} tasks x {r0['steps']} steps of "
        f"{r0['step_s'] * 1000:.0f} ms, a checkpoint per step, {r0['slots']} slots on "
        f"{result['agents']} agents, sync handlers; {r0.get('rounds', 1)} interleaved rounds "
        "per row.\n"
        "`.venv/bin/python bench/taskpath_bench.py`; "
        "raw figures in `bench/results/taskpath.json`.\n\n"
        "| step | durability | isolation | overhead/step p50 / p99 ms | "
        "vs no-checkpoint, ms per step: by steps (rounds); by tasks | "
        "ckpt call p50 / p99 ms | hops (mean ms) | CPU per ckpt ms | task s p50 / p90 | "
        "job s (ideal): ratio |\n"
        "|---|---|---|---:|---:|---:|---|---|---:|---:|\n"
    )
    body = ""
    for r in result["rows"]:
        hops = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["hops_ms"].items()))
        cpu = r["cpu_ms_per_ckpt"]
        cpu_txt = ", ".join(
            f"{role} {cpu[role]:.2f}" for role in ("agent", "coordinator", "redis", "etcd")
        )
        rounds = ", ".join(f"{v:.1f}" for v in r.get("vs_ideal_ms_rounds", []))
        body += (
            f"| {r['kind']} | {r['durability']} | {r['isolation']} | "
            f"{r['overhead_ms_p50']:.1f} / {r['overhead_ms_p99']:.1f} | "
            f"**{r['vs_ideal_ms_p50']:.1f}** ({rounds}); {r.get('vs_ideal_task_ms_p50', 0):.1f} | "
            f"{r['ckpt_call_ms_p50']:.2f} / {r['ckpt_call_ms_p99']:.2f} | {hops} | {cpu_txt} | "
            f"{r['task_s_p50']:.2f} / {r['task_s_p90']:.2f} | "
            f"{r['job_s']:.1f} ({r['ideal_job_s']:.1f}): {100 * (r['job_ratio'] - 1):+.1f} % |\n"
        )
    return head + body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tasks", type=int, default=20, help="tasks per job (default 20)")
    parser.add_argument("--steps", type=int, default=20, help="steps per task (default 20)")
    parser.add_argument(
        "--step-s", type=float, default=0.1, help="work per step, seconds (default 0.1)"
    )
    parser.add_argument("--agents", type=int, default=2, help="node agents (default 2)")
    parser.add_argument("--slots", type=int, default=2, help="slots per agent (default 2)")
    parser.add_argument("--kinds", default="io,cpu", help="step kinds: io (sleep), cpu (hashing)")
    parser.add_argument(
        "--isolations", default="thread,process", help="handler isolation: thread, process"
    )
    parser.add_argument(
        "--durability", default="local,replicated", help="checkpoint durability: local, replicated"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="interleaved (ideal, with checkpoints) pairs per row; medians over rounds (default 3)",
    )
    parser.add_argument(
        "--out", type=Path, default=RESULTS_DIR / "taskpath.json", help="JSON results file"
    )
    args = parser.parse_args()
    result = asyncio.run(_main(args))
    result["commit"] = _commit()
    result["agents"] = args.agents
    write_json(args.out, result)
    write_section("taskpath", _table(result))
    print(_table(result))


if __name__ == "__main__":
    main()
