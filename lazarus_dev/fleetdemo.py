"""``lazarus demo fleet``: a real cluster on this machine survives a SIGKILLed node.

What it proves, end to end and with real processes: etcd, Redis, three
coordinators (one leader) and three node agents run the demo app
(``node_agent.demo_app``: word and n-gram statistics over public-domain
novels). Mid-run one agent is SIGKILLed. The leader sees its Session close,
declares it DEAD after ``dead_after``, moves its tasks (epoch + 1) to the
survivors, which resume each from its newest replicated checkpoint plus the
journal after it. Every result is then checked against a direct computation,
and every task must have completed exactly once. Exit status 1 otherwise.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from lazarus.v1 import records_pb2
from lazarus_dev.devcluster import LocalCluster
from node_agent import demo_app

__all__ = ["run_fleet_demo"]


def run_fleet_demo(
    run_dir: Path | None, tasks: int, lines: int, every: int, work_ms: float, kill_after_s: float
) -> int:
    """Run the demo; return 0 when every check held, else 1."""
    console = Console()
    root = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="lazarus-fleet-"))
    console.print(f"[bold]Lazarus fleet demo[/] — logs and stores under {root}")
    cluster = LocalCluster(root, coordinators=3, agents=3, cluster="demo")
    try:
        with console.status("starting etcd, Redis, 3 coordinators, 3 node agents"):
            cluster.start()
            asyncio.run(cluster.ready(60))
        return asyncio.run(_run(cluster, console, tasks, lines, every, work_ms, kill_after_s))
    finally:
        with console.status("stopping the cluster"):
            cluster.stop()


async def _run(
    cluster: LocalCluster,
    console: Console,
    n_tasks: int,
    lines: int,
    every: int,
    work_ms: float,
    kill_after_s: float,
) -> int:
    payloads = demo_app.make_payloads(n_tasks, lines_per_task=lines, every=every, work_ms=work_ms)
    by_id: dict[str, dict[str, Any]] = {}
    for i, payload in enumerate(payloads):
        record = await cluster.submit(f"demo-{i}", "textstats", json.dumps(payload).encode())
        by_id[record.task_id] = payload
    console.print(
        f"submitted {n_tasks} textstats tasks ({lines} lines each, checkpoint every {every}, "
        f"{work_ms:g} ms of work per line)"
    )
    await asyncio.sleep(kill_after_s)
    victim = cluster.agents[0]
    owned = [t for t in await cluster.list_tasks() if t.owner_node_id == victim.name]
    running = [t for t in owned if t.state == records_pb2.TASK_STATE_RUNNING]
    console.print(
        f"[red]SIGKILL[/] {victim.name} (pid {victim.pid}) holding {len(owned)} task(s), "
        f"{len(running)} running"
    )
    killed_at = time.monotonic()
    victim.kill()
    done: dict[str, records_pb2.TaskRecord] = {}
    with console.status("waiting for every task to finish") as status:
        while time.monotonic() - killed_at < 180:
            tasks = {t.task_id: t for t in await cluster.list_tasks() if t.task_id in by_id}
            finished = [t for t in tasks.values() if t.state in _DONE]
            status.update(f"{len(finished)}/{len(by_id)} tasks finished")
            if len(finished) == len(by_id):
                done = tasks
                break
            await asyncio.sleep(0.5)
    elapsed = time.monotonic() - killed_at
    correct = [
        t
        for t in done.values()
        if t.state == records_pb2.TASK_STATE_COMPLETED
        and json.loads(t.result.payload) == demo_app.direct_result(by_id[t.task_id])
    ]
    resumed = _resumes(cluster)
    table = Table(title="fleet demo")
    table.add_column("check")
    table.add_column("value", justify="right")
    table.add_column("held")
    ok = True

    def row(name: str, value: object, held: bool) -> None:
        nonlocal ok
        ok = ok and held
        table.add_row(name, str(value), "[green]yes[/]" if held else "[red]NO[/]")

    row("tasks finished", f"{len(done)}/{len(by_id)}", len(done) == len(by_id))
    row(
        "results equal to a direct computation",
        f"{len(correct)}/{len(by_id)}",
        len(correct) == len(by_id),
    )
    row(
        f"tasks moved off {victim.name} (epoch + 1)",
        f"{sum(1 for t in owned if done.get(t.task_id, t).epoch > t.epoch)}/{len(owned)}",
        all(done.get(t.task_id, t).epoch > t.epoch for t in owned),
    )
    row(
        "running ones resumed from Redis, not from scratch",
        f"{sum(1 for t in running if t.task_id in resumed)}/{len(running)}",
        all(t.task_id in resumed for t in running),
    )
    twice = [task_id for task_id, n in _completions(cluster).items() if n > 1]
    row("tasks completed more than once", len(twice), not twice)
    row("seconds from SIGKILL to all finished", f"{elapsed:.1f}", bool(done))
    console.print(table)
    if not ok:
        console.print("[red]a check failed[/]; logs are under", cluster.run_dir)
    return 0 if ok else 1


_DONE = (records_pb2.TASK_STATE_COMPLETED, records_pb2.TASK_STATE_FAILED)


def _resumes(cluster: LocalCluster) -> set[str]:
    """Tasks some agent resumed from Redis (``task_started`` log fields)."""
    out: set[str] = set()
    for child in cluster.agents:
        for line in child.log_path.read_text(errors="replace").splitlines():
            try:
                fields = json.loads(line).get("fields", {})
            except json.JSONDecodeError:
                continue
            if fields.get("event") == "task_started" and fields.get("source") == "redis":
                out.add(fields["task_id"])
    return out


def _completions(cluster: LocalCluster) -> dict[str, int]:
    """TaskCompleted events per task, from every coordinator's log."""
    counts: dict[str, int] = {}
    for child in cluster.coordinators:
        for line in child.log_path.read_text(errors="replace").splitlines():
            marker = "TaskCompleted(task_id='"
            if marker in line:
                task_id = line.split(marker, 1)[1].split("'", 1)[0]
                counts[task_id] = counts.get(task_id, 0) + 1
    return counts
