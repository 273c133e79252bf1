"""``lazarus drill``: recovery drills on real processes, with a verdict.

The scenarios of state_recovery_patterns.md, each run against a live cluster:

========================  ==========================================================
``kill-node``             agent crash: SIGKILL the node agent running most tasks
``kill-leader``           orchestrator restart: SIGKILL the leading coordinator
``partition-heal``        network partition: cut a node agent off for 10 s (a network
                          namespace when root; otherwise SIGSTOP, labelled so)
``etcd-member-loss``      partial system failure: SIGKILL one of three etcd members
``redis-restart``         SIGTERM Redis, restart it 3 s later (fsync'd AOF)
========================  ==========================================================

Each drill submits a workload (word/n-gram statistics over public-domain
novels, ``node_agent.demo_app``), injects the fault while it runs, heals, waits
for every task to finish and reports: detection s (fault → DEAD verdict),
recovery s (DEAD → the node's last task RUNNING elsewhere), leader failover s,
tasks lost, duplicate completions, wrong results, work redone (upper bound),
reconcile convergence s. The invariants — 0 tasks lost, 0 duplicate
completions, every result equal to a direct computation — decide the exit
status. The facts come from the coordinators' structured event log (every
replica's, so a leader change loses nothing).

Output: a rich table (``print_report``), JSON (``DrillReport.to_json``) and a
timeline PNG of node states, task moves, leader changes and the fault window
(``write_timeline``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from lazarus.devcluster import ChildProcess, LocalCluster
from lazarus.localservers import EtcdCluster
from lazarus.netns import Namespace, namespaces_available
from lazarus.v1 import records_pb2
from node_agent import demo_app

__all__ = [
    "SCENARIOS",
    "DrillReport",
    "DrillResult",
    "make_drill_cluster",
    "print_report",
    "run_drills",
    "write_timeline",
]

SCENARIOS = ("kill-node", "kill-leader", "partition-heal", "etcd-member-loss", "redis-restart")
"""Every drill, in the order ``all`` runs them."""

PARTITION_S = 10.0
"""How long partition-heal keeps the node cut off, seconds."""

_EVENT = re.compile(r"event term=(\d+) (\w+)\((.*)\)$")
_FIELD = re.compile(r"(\w+)=('(?:[^']*)'|[^,]+)")
_DONE = (records_pb2.TASK_STATE_COMPLETED, records_pb2.TASK_STATE_FAILED)


@dataclass
class DrillResult:
    """What one drill measured and whether its invariants held.

    Times are seconds; None when the scenario does not produce that figure.
    ``events`` are (seconds since the drill started, event type, fields) for
    the timeline.
    """

    scenario: str
    fault: str
    tasks: int
    detection_s: float | None = None
    recovery_s: float | None = None
    leader_failover_s: float | None = None
    leader_changes: int | None = None
    tasks_lost: int = 0
    duplicate_completions: int = 0
    wrong_results: int = 0
    tasks_moved: int = 0
    work_redone_s: float = 0.0
    forks_kept: int = 0
    reconcile_convergence_s: float | None = None
    duration_s: float = 0.0
    started_at: float = 0.0
    inject_at_s: float = 0.0
    heal_at_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    events: list[tuple[float, str, dict[str, str]]] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    leaders: list[tuple[float, str]] = field(default_factory=list)

    @property
    def held(self) -> bool:
        """True when no task was lost, none completed twice, every result was right."""
        return self.tasks_lost == 0 and self.duplicate_completions == 0 and self.wrong_results == 0


@dataclass
class DrillReport:
    """Every drill of one run."""

    results: list[DrillResult]
    run_dir: str

    @property
    def held(self) -> bool:
        """True when every drill held its invariants."""
        return all(r.held for r in self.results)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (events left out; the PNG shows them)."""
        out = []
        for r in self.results:
            d = asdict(r)
            d.pop("events")
            d.pop("leaders")
            d["held"] = r.held
            out.append(d)
        return {"held": self.held, "run_dir": self.run_dir, "drills": out}


# ---------------------------------------------------------------------------
# The cluster a drill runs on.
# ---------------------------------------------------------------------------


def make_drill_cluster(
    run_dir: Path, *, agents: int = 4, use_netns: bool = True
) -> tuple[LocalCluster, Namespace | None, str]:
    """A local cluster fit for every drill: 3 etcd members, 3 coordinators, ``agents`` agents.

    When network namespaces are available (root) the last agent lives in its
    own namespace, reaching the coordinators and Redis over a veth in
    198.18.0.0/15, so partition-heal is a real partition.

    Returns:
        (cluster, namespace or None, why there is no namespace or "").
    """
    ok, why = namespaces_available() if use_netns else (False, "disabled")
    ns: Namespace | None = None
    if ok:
        pid = os.getpid()
        ns = Namespace(f"lzdrill{pid}", subnet_index=64 + pid % 16384).create()
    cluster = LocalCluster(
        run_dir,
        coordinators=3,
        agents=0,
        etcd_members=3,
        cluster="drill",
        listen_host=ns.host_ip if ns else "127.0.0.1",
        redis_bind=[ns.host_ip] if ns else [],
    )
    cluster.start()
    for i in range(agents):
        if ns is not None and i == agents - 1:
            cluster.add_agent(wrapper=ns.wrapper(), redis_host=ns.host_ip)
        else:
            cluster.add_agent()
    return cluster, ns, why


# ---------------------------------------------------------------------------
# Facts: the coordinators' event logs.
# ---------------------------------------------------------------------------


def _events(cluster: LocalCluster, since: float) -> list[tuple[float, str, dict[str, str]]]:
    seen: set[tuple[str, str]] = set()
    out = []
    for child in cluster.coordinators:
        with contextlib.suppress(OSError):
            for line in child.log_path.read_text(errors="replace").splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                ts = float(rec.get("ts", 0))
                if ts < since:
                    continue
                m = _EVENT.search(str(rec.get("msg", "")))
                if not m:
                    continue
                key = (m.group(2), m.group(3))
                if key in seen:  # the same event logged by two leaders' replays
                    continue
                seen.add(key)
                fields = {k: v.strip("'") for k, v in _FIELD.findall(m.group(3))}
                out.append((ts, m.group(2), fields))
    return sorted(out, key=lambda e: e[0])


def _leaderships(cluster: LocalCluster, since: float) -> list[tuple[float, str]]:
    """(ts, member) each time a replica started leading, from the coordinators' logs."""
    out = []
    for child in cluster.coordinators:
        with contextlib.suppress(OSError):
            for line in child.log_path.read_text(errors="replace").splitlines():
                if '"leading: term=' not in line:
                    continue
                with contextlib.suppress(json.JSONDecodeError, ValueError):
                    ts = float(json.loads(line)["ts"])
                    if ts >= since:
                        out.append((ts, child.name))
    return sorted(out)


# ---------------------------------------------------------------------------
# One drill.
# ---------------------------------------------------------------------------


class _Drill:
    def __init__(
        self,
        cluster: LocalCluster,
        ns: Namespace | None,
        no_ns_reason: str,
        console: Console,
        tasks: int,
        lines: int,
        work_ms: float,
    ) -> None:
        self.cluster = cluster
        self.ns = ns
        self.no_ns_reason = no_ns_reason
        self.console = console
        self.n_tasks = tasks
        self.lines = lines
        self.work_ms = work_ms
        self.round = 0
        # Request ids must be new in every run: SubmitTask is idempotent on them,
        # and a repeated id would hand back the tasks of an earlier run, finished.
        self.token = uuid.uuid4().hex[:8]

    async def run(self, scenario: str) -> DrillResult:
        c = self.cluster
        self.round += 1
        await c.ready(60)
        t0 = time.time()
        payloads = demo_app.make_payloads(
            self.n_tasks,
            lines_per_task=self.lines,
            every=20,
            work_ms=self.work_ms,
            seed=self.round,
        )
        by_id: dict[str, dict[str, Any]] = {}
        for i, payload in enumerate(payloads):
            record = await c.submit(
                f"drill-{self.token}-{self.round}-{scenario}-{i}",
                "textstats",
                json.dumps(payload).encode(),
            )
            by_id[record.task_id] = payload
        await asyncio.sleep(1.5)
        result = DrillResult(scenario=scenario, fault="", tasks=len(by_id), started_at=t0)
        inject: Callable[[DrillResult], Any] = getattr(self, "_" + scenario.replace("-", "_"))
        await inject(result)
        tasks = await self._wait_done(set(by_id), timeout_s=180)
        await asyncio.sleep(1.0)  # the last events reach the logs
        await self._judge(result, t0, tasks, by_id)
        result.duration_s = time.time() - t0
        return result

    async def _wait_done(
        self, ids: set[str], timeout_s: float
    ) -> dict[str, records_pb2.TaskRecord]:
        deadline = time.monotonic() + timeout_s
        tasks: dict[str, records_pb2.TaskRecord] = {}
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                tasks = {t.task_id: t for t in await self.cluster.list_tasks() if t.task_id in ids}
                if len(tasks) == len(ids) and all(t.state in _DONE for t in tasks.values()):
                    return tasks
            await asyncio.sleep(0.5)
        return tasks

    def _collect(self, since: float) -> list[tuple[float, str, dict[str, str]]]:
        """Core events since ``since`` (wall time): the coordinators' logs."""
        return _events(self.cluster, since)

    def _leaderships(self, since: float) -> list[tuple[float, str]]:
        return _leaderships(self.cluster, since)

    async def _node_names(self) -> list[str]:
        return [a.name for a in self.cluster.agents]

    async def _judge(
        self,
        r: DrillResult,
        t0: float,
        tasks: dict[str, records_pb2.TaskRecord],
        by_id: dict[str, dict[str, Any]],
    ) -> None:
        events = self._collect(t0)
        r.events = [(ts - t0, kind, f) for ts, kind, f in events]
        r.nodes = await self._node_names()
        r.leaders = [(ts - t0, member) for ts, member in self._leaderships(t0)]
        completions: dict[str, set[str]] = {}
        for _, kind, f in events:
            if kind == "TaskCompleted" and f.get("task_id") in by_id:
                completions.setdefault(f["task_id"], set()).add(f.get("epoch", ""))
            if kind == "TaskReassigned" and f.get("task_id") in by_id:
                r.tasks_moved += 1
            if kind == "TaskResumed" and f.get("task_id") in by_id:
                with contextlib.suppress(ValueError):
                    r.work_redone_s += float(f.get("work_redone_s", "0"))
                if f.get("redone_checkpoints", "0") not in ("0", ""):
                    r.notes.append(f"data loss on {f['task_id']}: {f}")
                    r.tasks_lost += 1
            if kind == "ConflictDetected" and f.get("task_id") in by_id:
                r.forks_kept += 1
            if kind == "ReconcileCompleted" and r.reconcile_convergence_s is None:
                with contextlib.suppress(ValueError):
                    r.reconcile_convergence_s = float(f.get("seconds", f.get("duration_s", "")))
        r.duplicate_completions = sum(1 for epochs in completions.values() if len(epochs) > 1)
        for task_id, payload in by_id.items():
            task = tasks.get(task_id)
            if task is None or task.state != records_pb2.TASK_STATE_COMPLETED:
                r.tasks_lost += 1
                why = records_pb2.TaskState.Name(task.state) if task else "missing"
                r.notes.append(f"{task_id}: {why} {task.last_error.message if task else ''}")
                continue
            if json.loads(task.result.payload) != demo_app.direct_result(payload):
                r.wrong_results += 1

    def _node_dead(self, node: str, after: float) -> tuple[float | None, dict[str, str] | None]:
        for ts, kind, f in self._collect(after):
            if kind == "NodeDead" and f.get("node_id") == node:
                return ts, f
        return None, None

    def _recovery(self, node: str, after: float) -> float | None:
        for _, kind, f in self._collect(after):
            if kind == "RecoveryCompleted" and f.get("node_id") == node:
                with contextlib.suppress(ValueError):
                    return float(f["recovery_s"])
        return None

    async def _wait_for(self, check: Callable[[], Any], timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            await asyncio.sleep(0.1)
        return None

    async def _busiest_agent(self, exclude: set[str]) -> ChildProcess:
        """The live agent running most of the workload (waits up to 10 s for one to run any)."""
        live = [a for a in self.cluster.agents if a.alive and a.name not in exclude]
        counts: dict[str, int] = {}
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            counts = {}
            for t in await self.cluster.list_tasks():
                if t.state == records_pb2.TASK_STATE_RUNNING:
                    counts[t.owner_node_id] = counts.get(t.owner_node_id, 0) + 1
            if any(counts.get(a.name, 0) for a in live):
                break
            await asyncio.sleep(0.2)
        return max(live, key=lambda a: counts.get(a.name, 0))

    # -- the faults --------------------------------------------------------

    async def _kill_node(self, r: DrillResult) -> None:
        netns_agent = {self.cluster.agents[-1].name} if self.ns else set()
        victim = await self._busiest_agent(netns_agent)
        r.fault = f"SIGKILL node agent {victim.name} (pid {victim.pid})"
        at = time.time()
        r.inject_at_s = at
        victim.kill()
        dead = await self._wait_for(lambda: self._node_dead(victim.name, at)[0], 20)
        if dead is not None:
            r.detection_s = dead - at
        recovery = await self._wait_for(lambda: self._recovery(victim.name, at), 20)
        r.recovery_s = recovery
        victim.start()  # heal: the node comes back (same id, same data dir)
        r.heal_at_s = time.time()

    async def _kill_leader(self, r: DrillResult) -> None:
        index, member = await self.cluster.leader()
        leader = self.cluster.coordinators[index]
        r.fault = f"SIGKILL leading coordinator {member} (pid {leader.pid})"
        at = time.time()
        r.inject_at_s = at
        leader.kill()
        while time.time() - at < 30:
            with contextlib.suppress(Exception):
                _, now_leader = await self.cluster.leader()
                if now_leader != member:
                    r.leader_failover_s = time.time() - at
                    break
            await asyncio.sleep(0.05)
        leader.start()  # heal: the replica rejoins as a follower
        r.heal_at_s = time.time()

    async def _partition_heal(self, r: DrillResult) -> None:
        at = time.time()
        r.inject_at_s = at
        if self.ns is not None:
            victim = self.cluster.agents[-1]
            r.fault = f"network partition: {victim.name} cut off (namespace {self.ns.name})"
            self.ns.cut()
            try:
                await asyncio.sleep(PARTITION_S)
            finally:
                self.ns.heal()
        else:
            victim = await self._busiest_agent(set())
            r.fault = (
                f"process pause of {victim.name} (SIGSTOP {PARTITION_S:g} s) — not a network "
                f"partition: {self.no_ns_reason}"
            )
            victim.pause()
            try:
                await asyncio.sleep(PARTITION_S)
            finally:
                victim.resume()
        r.heal_at_s = time.time()
        dead, _ = self._node_dead(victim.name, at)
        if dead is not None:
            r.detection_s = dead - at
            r.recovery_s = await self._wait_for(lambda: self._recovery(victim.name, at), 20)

    async def _etcd_member_loss(self, r: DrillResult) -> None:
        etcd = self.cluster.etcd
        at = time.time()
        r.inject_at_s = at
        _, member = await self.cluster.leader()
        index = int(member.rsplit("-", 1)[1]) if "-" in member else 0
        if not isinstance(etcd, EtcdCluster):
            r.fault = "etcd-member-loss needs a 3-member etcd cluster; skipped"
            return
        victim = etcd.members[index % len(etcd.members)]
        r.fault = f"SIGKILL etcd member {index % len(etcd.members)} (the leader's endpoint)"
        victim.kill()
        # Watch the leader for a while (issue 16: target 0 changes); count each change.
        r.leader_changes, current = 0, member
        while time.time() - at < 10:
            with contextlib.suppress(Exception):
                _, now_leader = await self.cluster.leader()
                if now_leader != current:
                    r.leader_changes += 1
                    current = now_leader
                    if r.leader_failover_s is None:
                        r.leader_failover_s = time.time() - at
            await asyncio.sleep(0.1)
        victim.start()  # heal: the member rejoins with its data
        r.heal_at_s = time.time()
        r.notes.append(f"leader changes: {r.leader_changes}")
        if r.leader_failover_s is None:
            r.notes.append("the leader kept leading (its etcd calls reached a quorum)")

    async def _redis_restart(self, r: DrillResult) -> None:
        redis = self.cluster.redis
        assert redis is not None
        r.fault = "Redis stopped (SIGTERM) for 3 s, restarted from its fsync'd AOF"
        at = time.time()
        r.inject_at_s = at
        redis.stop()
        await asyncio.sleep(3.0)
        redis.start()
        r.heal_at_s = time.time()


# ---------------------------------------------------------------------------
# Running, reporting, the timeline.
# ---------------------------------------------------------------------------


async def run_drills(
    cluster: LocalCluster,
    scenarios: list[str],
    *,
    ns: Namespace | None,
    no_ns_reason: str,
    console: Console,
    tasks: int = 24,
    lines: int = 400,
    work_ms: float = 8.0,
) -> list[DrillResult]:
    """Run ``scenarios`` one after another on ``cluster``; return what each measured."""
    drill = _Drill(cluster, ns, no_ns_reason, console, tasks, lines, work_ms)
    results = []
    for scenario in scenarios:
        with console.status(f"drill {scenario}: workload, fault, heal, wait"):
            result = await drill.run(scenario)
        verdict = "[green]held[/]" if result.held else "[red]FAILED[/]"
        console.print(f"drill [bold]{scenario}[/]: {result.fault} — {verdict}")
        results.append(result)
    return results


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def print_report(report: DrillReport, console: Console) -> None:
    """The rich table: one row per drill, the invariants last."""
    table = Table(title="Lazarus drills")
    for name, justify in (
        ("drill", "left"),
        ("detection s", "right"),
        ("recovery s", "right"),
        ("failover s", "right"),
        ("moved", "right"),
        ("forks", "right"),
        ("redone s", "right"),
        ("reconcile s", "right"),
        ("lost", "right"),
        ("dup", "right"),
        ("wrong", "right"),
        ("held", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in report.results:
        table.add_row(
            r.scenario,
            _fmt(r.detection_s),
            _fmt(r.recovery_s),
            _fmt(r.leader_failover_s),
            str(r.tasks_moved),
            str(r.forks_kept),
            f"{r.work_redone_s:.2f}",
            _fmt(r.reconcile_convergence_s),
            str(r.tasks_lost),
            str(r.duplicate_completions),
            str(r.wrong_results),
            "[green]yes[/]" if r.held else "[red]NO[/]",
        )
    console.print(table)
    for r in report.results:
        console.print(f"  {r.scenario}: {r.fault}")
        for note in r.notes[:5]:
            console.print(f"    note: {note}")


_STATE_COLOURS = {
    "ALIVE": "#4caf50",
    "SUSPECT": "#ffc107",
    "DEAD": "#f44336",
    "LEFT": "#9e9e9e",
}


def write_timeline(report: DrillReport, path: Path) -> Path:
    """A PNG: per drill, node states over time, task moves, leader changes, the fault window."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    n = len(report.results)
    fig, axes = plt.subplots(n, 1, figsize=(11, 2.4 * n + 0.6), squeeze=False)
    for ax, r in zip(axes[:, 0], report.results, strict=True):
        nodes = sorted(
            set(r.nodes)
            | {f["node_id"] for _, k, f in r.events if k.startswith("Node") and "node_id" in f}
        )
        end = max([r.duration_s, *(t for t, _, _ in r.events)], default=1.0)
        rows = {node: i for i, node in enumerate(nodes)}
        for node in nodes:
            state, since = "ALIVE", 0.0
            for t, kind, f in r.events:
                if f.get("node_id") != node:
                    continue
                new = {
                    "NodeSuspected": "SUSPECT",
                    "NodeDead": "DEAD",
                    "NodeRecovered": "ALIVE",
                    "NodeJoined": "ALIVE",
                    "NodeLeft": "LEFT",
                }.get(kind)
                if new is None or new == state:
                    continue
                ax.broken_barh(
                    [(since, t - since)], (rows[node] - 0.35, 0.7), color=_STATE_COLOURS[state]
                )
                state, since = new, t
            ax.broken_barh(
                [(since, end - since)], (rows[node] - 0.35, 0.7), color=_STATE_COLOURS[state]
            )
        moves = [t for t, k, _ in r.events if k == "TaskReassigned"]
        if moves:
            ax.scatter(moves, [len(nodes) + 0.1] * len(moves), marker="v", s=18, color="#3f51b5")
        done = sorted(t for t, k, _ in r.events if k == "TaskCompleted")
        if done:
            twin = ax.twinx()
            twin.step(done, range(1, len(done) + 1), where="post", color="#212121", lw=1)
            twin.set_ylabel("tasks completed", fontsize=7)
            twin.set_ylim(0, max(r.tasks, len(done)) * 1.05)
            twin.tick_params(labelsize=7)
        for t, member in r.leaders:
            ax.axvline(t, color="#000000", linestyle="--", linewidth=0.8)
            ax.text(t, len(nodes) + 0.35, f" {member} leads", fontsize=6, va="bottom")
        if r.inject_at_s:
            start = r.inject_at_s - r.started_at
            stop = (r.heal_at_s - r.started_at) if r.heal_at_s else start
            ax.axvspan(start, max(stop, start + 0.05), color="#e91e63", alpha=0.15)
        ax.set_yticks(range(len(nodes)))
        ax.set_yticklabels(nodes, fontsize=7)
        ax.set_xlim(0, end)
        ax.set_ylim(-0.6, len(nodes) + 1.0)
        verdict = "held" if r.held else "FAILED"
        ax.set_title(f"{r.scenario}: {r.fault[:90]} — {verdict}", fontsize=8, loc="left")
        ax.set_xlabel("seconds since the workload was submitted", fontsize=7)
    handles = [Rectangle((0, 0), 1, 1, color=c, label=s) for s, c in _STATE_COLOURS.items()]
    handles.append(Rectangle((0, 0), 1, 1, color="#e91e63", alpha=0.15, label="fault"))
    handles.append(Rectangle((0, 0), 1, 1, color="#3f51b5", label="task moved (v)"))
    fig.legend(handles=handles, loc="upper right", fontsize=7, ncol=5)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
