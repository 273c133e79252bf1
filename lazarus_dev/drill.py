"""``lazarus drill``: recovery drills on real processes, with a verdict.

The scenarios of state_recovery_patterns.md, each run against a live cluster:

========================  ==========================================================
``kill-node``             agent crash: SIGKILL the node agent running most tasks
``kill-leader``           orchestrator restart: SIGKILL the leading coordinator
``partition-heal``        network partition: cut a node agent off for 10 s (a network
                          namespace when root; otherwise SIGSTOP, labelled so)
``etcd-member-loss``      partial system failure: SIGKILL one of three etcd members
``redis-restart``         SIGTERM Redis, restart it 3 s later (fsync'd AOF)
``duplicate-identity``    a second ``lazarus node-agent`` with a running agent's
                          ``--node-id`` (another data dir) for 12 s: it must be refused
``complete-failure``      SIGKILL every process at once (agents, coordinators, every
                          etcd member, Redis), restart them all
``chaos``                 a seeded random schedule of overlapping faults
                          (``lazarus_dev.chaos``), then heal
========================  ==========================================================

Each drill submits a workload (word/n-gram statistics over public-domain
novels, ``node_agent.demo_app``), injects the fault while it runs, heals, waits
for every task to finish and reports: detection s (fault → DEAD verdict),
recovery s (DEAD → the node's last task RUNNING elsewhere), leader failover s,
tasks lost, duplicate completions, wrong results, work redone (upper bound),
reconcile s (the reconcile session after the heal, from the coordinators'
``reconcile … completed`` log line). The facts come from the coordinators'
structured event log (every replica's, so a leader change loses nothing).

The safety invariants are read from the tasks' own side effects, not from
Lazarus's bookkeeping: the workload (demo app kind ``drill``) appends every
step start, acknowledged checkpoint and executed completion, with pid, node
and epoch, to files under ``<run_dir>/effects/`` before the step's work, and
``lazarus_dev.drill_invariants`` checks them: one process per task and epoch,
epochs rising, no step of an old epoch after a newer one began, one executed
completion per task (``dup exec``), no acknowledged checkpoint lost.
partition-heal also writes four shared documents (counter, set, map, log) on
both sides of the cut and checks every replica and the canonical copy
against the acknowledged operations. Any violation, a task lost, a
completion accepted twice (``dup``), or a result different from a direct
computation fails the drill.

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
import shutil
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lazarus.v1 import records_pb2
from lazarus_dev.chaos import Fault, FaultKind, make_schedule, schedule_lines
from lazarus_dev.devcluster import ChildProcess, LocalCluster, json_log_entries
from lazarus_dev.drill_invariants import ViolationKind, check, pauses, read_sink
from lazarus_dev.localservers import EtcdCluster, free_loopback_ports
from lazarus_dev.netns import Namespace, namespaces_available
from node_agent import demo_app

__all__ = [
    "SCENARIOS",
    "DrillReport",
    "DrillResult",
    "expected_documents",
    "make_drill_cluster",
    "parse_reconcile_seconds",
    "print_report",
    "run_drills",
    "write_timeline",
]

SCENARIOS = (
    "kill-node",
    "kill-leader",
    "partition-heal",
    "etcd-member-loss",
    "redis-restart",
    "redis-loss",
    "duplicate-identity",
    "complete-failure",
    "chaos",
)
"""Every drill, in the order ``all`` runs them."""

CHAOS_SECONDS = 60.0
"""Length of the chaos schedule ``all`` runs, seconds."""

LEADER_LOOKUP_S = 9.0
"""How long a leader fault waits to learn who leads before it is skipped, seconds."""

SETTLE_TIMEOUT_S = 240.0
"""How long a drill waits after its faults for every task to finish, seconds."""

DRILL_MAX_ATTEMPTS = 100
"""max_attempts of the drill workload's tasks."""

DUPLICATE_S = 12.0
"""How long duplicate-identity keeps the second process running, seconds."""

IDENTITY_REFUSED = ("held by another live process", "FAILED_PRECONDITION")
"""Text in the second agent's log showing its Hello was refused."""

PARTITION_S = 10.0
"""How long partition-heal keeps the node cut off, seconds."""

RECONCILE_WAIT_S = 15.0
"""How long partition-heal waits, once its tasks ended, for the healed node's
reconcile session to be logged before it judges, seconds."""

_EVENT = re.compile(r"event term=(\d+) (\w+)\((.*)\)$")
_RECONCILED = re.compile(r"reconcile (\S+) completed: converged=(\w+).* in ([0-9.]+) s")
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
    dup_exec: int = 0
    two_owners: int = 0
    stale_steps: int = 0
    epoch_regressions: int = 0
    progress_lost: int = 0
    effect_records: int = 0
    paused_tasks: int = 0
    longest_pause_s: float = 0.0
    effects_checked: bool = False
    violations: list[str] = field(default_factory=list)
    shared_ops: int = 0
    shared_mismatches: int = 0
    identity_refused: bool | None = None
    data_loss_reported: int = 0
    reshipped: int = 0
    time_to_all_running_s: float | None = None
    seed: int | None = None
    schedule: list[str] = field(default_factory=list)
    fault_windows: list[tuple[float, float, str]] = field(default_factory=list)
    duration_s: float = 0.0
    started_at: float = 0.0
    inject_at_s: float = 0.0
    heal_at_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    events: list[tuple[float, str, dict[str, str]]] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    leaders: list[tuple[float, str]] = field(default_factory=list)

    @property
    def safety_violations(self) -> int:
        """Invariant violations read from the side-effect log (all kinds)."""
        return (
            self.two_owners
            + self.stale_steps
            + self.epoch_regressions
            + self.progress_lost
            + self.dup_exec
        )

    @property
    def held(self) -> bool:
        """True when every invariant held.

        No task lost, none accepted or executed twice, every result right, no
        side-effect invariant broken (when the drill could read the side
        effects, it must have read some), shared documents equal to the
        acknowledged operations, a duplicate node id refused, and on
        partition-heal a reconcile session measured.
        """
        ok = (
            self.tasks_lost == 0
            and self.duplicate_completions == 0
            and self.wrong_results == 0
            and self.safety_violations == 0
            and self.shared_mismatches == 0
            and self.identity_refused is not False
        )
        if self.effects_checked and self.effect_records == 0:
            ok = False
        if (
            self.scenario == "partition-heal"
            and self.shared_ops
            and (self.reconcile_convergence_s is None)
        ):
            ok = False
        return ok


@dataclass
class DrillReport:
    """Every drill of one run."""

    results: list[DrillResult]
    run_dir: str
    mtls: bool = True

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
            d["safety_violations"] = r.safety_violations
            out.append(d)
        return {
            "held": self.held,
            "run_dir": self.run_dir,
            "mtls": "on" if self.mtls else "off",
            "drills": out,
        }


# ---------------------------------------------------------------------------
# The cluster a drill runs on.
# ---------------------------------------------------------------------------


def make_drill_cluster(
    run_dir: Path,
    *,
    agents: int = 4,
    use_netns: bool = True,
    env: dict[str, str] | None = None,
    fan_in: bool = False,
) -> tuple[LocalCluster, Namespace | None, str]:
    """A local cluster fit for every drill: 3 etcd members, 3 coordinators, ``agents`` agents.

    When network namespaces are available (root) the last agent lives in its
    own namespace, reaching the coordinators and Redis over a veth in
    198.18.0.0/15, so partition-heal is a real partition.

    Args:
        run_dir: logs, stores and the side-effect sink go under it.
        agents: node agents (>= 2).
        use_netns: put the last agent in a network namespace when root.
        env: extra environment of every child (e.g. the mutation test's
            ``LAZARUS_UNSAFE_DISABLE_SELF_FENCE``).
        fan_in: coordinators run ``--fan-in`` and agents spread over the
            replicas (agent i dials replica i mod 3 first), so followers hold
            and forward Sessions.

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
        env=env,
        coordinator_args=["--fan-in"] if fan_in else [],
        spread_agents=fan_in,
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
    logs = (child.log_path for child in cluster.coordinators)
    for ts, rec, _ in json_log_entries(logs, since=since):
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
    by_log = {child.log_path: child.name for child in cluster.coordinators}
    return sorted(
        (ts, by_log[path])
        for ts, _, path in json_log_entries(by_log, since=since, needle='"leading: term=')
    )


def _reconciles(cluster: LocalCluster, since: float) -> list[tuple[float, str, bool, float]]:
    """(ts, session id, converged, seconds) of every ``reconcile … completed`` log line."""
    out: dict[str, tuple[float, str, bool, float]] = {}
    logs = (child.log_path for child in cluster.coordinators)
    for ts, rec, _ in json_log_entries(logs, since=since, needle="completed: converged="):
        m = _RECONCILED.search(str(rec.get("msg", "")))
        if m:
            out.setdefault(m.group(1), (ts, m.group(1), m.group(2) == "True", float(m.group(3))))
    return sorted(out.values())


def parse_reconcile_seconds(
    sessions: list[tuple[float, str, bool, float]], heal_at: float
) -> float | None:
    """Seconds of the first converged reconcile session completed after ``heal_at`` (or None)."""
    for ts, _, converged, seconds in sessions:
        if ts >= heal_at and converged:
            return seconds
    return None


def _read_acked(sink: Path) -> list[dict[str, Any]]:
    """The acknowledged shared-document operations the workload logged under ``sink``."""
    acked: list[dict[str, Any]] = []
    for path in sorted(sink.glob("acked-*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                acked.append(json.loads(line))
    return acked


def _value(doc: Any) -> Any:
    value = doc.value()
    if doc.kind == "or-set":
        return sorted(value)
    return value


def expected_documents(acked: list[dict[str, Any]]) -> dict[str, Any]:
    """Each shared document's value computed from its acknowledged operations alone.

    Counters sum, sets hold every added member (the drill never removes), maps
    keep per key the write with the greatest (HLC wall, logical, replica, seq),
    logs hold every appended item (compared as a sorted list: RGA decides the
    order, which every replica must agree on, checked separately).
    """
    out: dict[str, Any] = {}
    winners: dict[str, dict[str, tuple[tuple[int, int, str, int], str]]] = {}
    for op in acked:
        doc, kind, arg = op["doc"], op["kind"], op["arg"]
        if kind == "pn-counter":
            out[doc] = out.get(doc, 0) + int(arg)
        elif kind == "or-set":
            out.setdefault(doc, set()).add(arg)
        elif kind == "lww-map":
            stamp = (op["at"][0], op["at"][1], op["replica"], op["seq"])
            key, value = arg
            w = winners.setdefault(doc, {})
            if key not in w or w[key][0] < stamp:
                w[key] = (stamp, value)
        else:
            out.setdefault(doc, []).append(arg)
    for doc, w in winners.items():
        out[doc] = {k: v for k, (_, v) in sorted(w.items())}
    return {d: sorted(v) if isinstance(v, set | list) else v for d, v in sorted(out.items())}


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
        self.chaos_s = CHAOS_SECONDS
        self.chaos_seed = 1
        self.settle_timeout_s = SETTLE_TIMEOUT_S
        self.round = 0
        self.expect_data_loss: set[str] = set()
        # Request ids must be new in every run: SubmitTask is idempotent on them,
        # and a repeated id would hand back the tasks of an earlier run, finished.
        self.token = uuid.uuid4().hex[:8]

    def _sink_root(self) -> Path | None:
        """Where the workload's side effects go (None: a remote cluster; not checked)."""
        run_dir = getattr(self.cluster, "run_dir", None)
        return Path(run_dir) / "effects" if run_dir is not None else None

    def _workload(self, scenario: str) -> tuple[int, int, float, int]:
        """(tasks, lines per task, work ms per line, lines between checkpoints) for ``scenario``."""
        if scenario == "chaos":
            # Tasks outlast the schedule, so every fault meets running tasks.
            work_ms = max(self.work_ms, self.chaos_s * 0.8 * 1000 / demo_app.MAX_SPAN_LINES)
            lines = min(demo_app.MAX_SPAN_LINES, int(self.chaos_s * 0.8 * 1000 / work_ms))
            return max(4, self.n_tasks // 2), lines, work_ms, 20
        if scenario == "duplicate-identity":
            work_ms = max(self.work_ms, 25.0)
            lines = min(demo_app.MAX_SPAN_LINES, int(DUPLICATE_S * 1500 / work_ms))
            return self.n_tasks, lines, work_ms, 20
        if scenario == "redis-loss":
            # Tasks outlast two kills, the Redis restart and the wait for the re-ship,
            # so the second victim still runs its tasks when it is killed.
            work_ms = max(self.work_ms, 60.0)
            return self.n_tasks, min(demo_app.MAX_SPAN_LINES, 500), work_ms, 20
        if scenario == "partition-heal":
            # Journal only, local durability (no wait on Redis stalls a cut-off owner)
            # and tasks that outlast the DEAD verdict: only the self-fence stops the
            # old owner in time (the drill submits them with local durability).
            return self.n_tasks, 400, max(self.work_ms, 20.0), 0
        return self.n_tasks, self.lines, self.work_ms, 20

    async def run(self, scenario: str) -> DrillResult:
        c = self.cluster
        self.round += 1
        await c.ready(90)
        t0 = time.time()
        n_tasks, lines, work_ms, every = self._workload(scenario)
        durability = {
            "partition-heal": records_pb2.CHECKPOINT_DURABILITY_LOCAL,
            # Redis's loss is judged against what Redis acknowledged; a ``local``
            # checkpoint promises nothing of Redis (reported every 5 s, not 1 s).
            "redis-loss": records_pb2.CHECKPOINT_DURABILITY_REPLICATED,
        }.get(scenario, records_pb2.CHECKPOINT_DURABILITY_UNSPECIFIED)
        payloads = demo_app.make_payloads(
            n_tasks, lines_per_task=lines, every=every, work_ms=work_ms, seed=self.round
        )
        root = self._sink_root()
        sink = root / f"{self.round:02d}-{scenario}" if root is not None else None
        shared = f"drill{self.token}r{self.round}" if scenario == "partition-heal" else ""
        by_id: dict[str, dict[str, Any]] = {}
        for i, payload in enumerate(payloads):
            kind, body = "textstats", payload
            if sink is not None:
                kind, body = "drill", {**payload, "sink": str(sink), "shared": shared}
            # A drill tests losses, not the retry budget: chaos may take a task's
            # node away more often than the default max_attempts allows.
            record = await c.submit(
                f"drill-{self.token}-{self.round}-{scenario}-{i}",
                kind,
                json.dumps(body).encode(),
                max_attempts=DRILL_MAX_ATTEMPTS,
                durability=durability,
            )
            by_id[record.task_id] = payload
        await asyncio.sleep(1.5)
        result = DrillResult(scenario=scenario, fault="", tasks=len(by_id), started_at=t0)
        inject: Callable[[DrillResult], Any] = getattr(self, "_" + scenario.replace("-", "_"))
        await inject(result)
        tasks = await self._wait_done(set(by_id), timeout_s=self.settle_timeout_s)
        heal_at = result.heal_at_s
        if shared and heal_at and isinstance(self.cluster, LocalCluster):
            # The healed node's reconcile session (what partition-heal measures)
            # may come after the tasks end: a dial that failed inside the
            # partition holds the leader's address off for a few seconds.
            cluster = self.cluster
            await self._wait_for(
                lambda: parse_reconcile_seconds(_reconciles(cluster, t0), heal_at) is not None,
                RECONCILE_WAIT_S,
            )
        await asyncio.sleep(1.0)  # the last events reach the logs
        await self._judge(result, t0, tasks, by_id)
        if sink is not None:
            self._judge_effects(result, sink, set(by_id))
            if shared:
                await self._judge_shared(result, sink, shared)
        result.duration_s = time.time() - t0
        return result

    async def _judge_shared(self, r: DrillResult, sink: Path, prefix: str) -> None:
        """Every replica and the canonical copy of the shared documents vs the acknowledged ops.

        Waits up to 30 s for convergence; what still differs then is a mismatch.
        """
        acked = _read_acked(sink)
        r.shared_ops = len(acked)
        if not acked:
            r.notes.append("no shared-document operation was acknowledged")
            r.shared_mismatches += 1
            return
        want = expected_documents(acked)
        deadline = time.monotonic() + 30.0
        problems: list[str] = []
        while True:
            problems = await asyncio.to_thread(self._shared_problems, want)
            if not problems or time.monotonic() > deadline:
                break
            await asyncio.sleep(1.0)
        r.shared_mismatches = len(problems)
        sides = {op["replica"].split("~")[0] for op in acked}
        r.notes.append(
            f"shared documents: {len(acked)} acknowledged ops from {len(sides)} nodes "
            f"({', '.join(sorted(sides))}); {len(problems)} replica(s) differ"
        )
        r.notes.extend(problems[:5])

    def _shared_problems(self, want: dict[str, Any]) -> list[str]:
        import redis

        from coordinator.documents import decode_record
        from lazarus.storage.keys import document_key
        from node_agent.shared import read_replicas
        from reconcile.documents import decode_document

        cluster = self.cluster
        assert isinstance(cluster, LocalCluster)
        replicas: dict[str, dict[str, Any]] = {}
        try:
            client = redis.Redis.from_url(cluster.redis_url, socket_timeout=5)
            canonical = {}
            for doc_id in want:
                data = client.get(document_key(doc_id))
                if data is not None:
                    record = decode_record(bytes(data))  # type: ignore[arg-type]
                    canonical[doc_id] = decode_document(bytes(record.state))
            client.close()
            replicas["canonical"] = canonical
        except Exception as exc:
            return [f"canonical copy unreadable: {exc}"]
        for agent in cluster.agents:
            with contextlib.suppress(Exception):
                replicas[agent.name] = read_replicas(cluster.run_dir / agent.name)
        problems = []
        orders: dict[str, dict[str, Any]] = {}
        for where, docs in replicas.items():
            for doc_id, value in want.items():
                doc = docs.get(doc_id)
                if doc is None:
                    if where == "canonical":
                        problems.append(f"canonical: {doc_id} missing")
                    continue
                got = _value(doc)
                if doc.kind == "rga-log":
                    orders.setdefault(doc_id, {})[where] = list(got)
                    got = sorted(got)
                if got != value:
                    problems.append(f"{where}: {doc_id} = {str(got)[:80]} != {str(value)[:80]}")
        for doc_id, by_where in orders.items():
            if len({json.dumps(v) for v in by_where.values()}) > 1:
                problems.append(f"{doc_id}: replicas disagree on the log's order")
        return problems

    def _judge_effects(self, r: DrillResult, sink: Path, tasks: set[str]) -> None:
        """The side-effect invariants (``lazarus_dev.drill_invariants``) over ``sink``."""
        records = read_sink(sink, tasks)
        report = check(records)
        stood = pauses(records)
        r.paused_tasks = len({p.task for p in stood})
        r.longest_pause_s = stood[0].gap_s if stood else 0.0
        counts = report.counts()
        r.effects_checked = True
        r.effect_records = report.records
        r.dup_exec = report.dup_exec
        r.two_owners = counts[ViolationKind.TWO_OWNERS.name]
        r.stale_steps = counts[ViolationKind.STALE_STEP.name]
        r.epoch_regressions = counts[ViolationKind.EPOCH_REGRESSED.name]
        r.progress_lost = counts[ViolationKind.PROGRESS_LOST.name]
        r.violations = [str(v) for v in report.violations[:50]]
        if report.records == 0:
            r.notes.append(f"no side effects logged under {sink}: nothing to judge")
        for v in report.violations[:5]:
            r.notes.append(f"VIOLATION {v}")

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
        r.duplicate_completions = sum(1 for epochs in completions.values() if len(epochs) > 1)
        if r.heal_at_s and isinstance(self.cluster, LocalCluster):
            r.reconcile_convergence_s = parse_reconcile_seconds(
                _reconciles(self.cluster, t0), r.heal_at_s
            )
        for task_id, payload in by_id.items():
            task = tasks.get(task_id)
            if (
                task is not None
                and task.state == records_pb2.TASK_STATE_FAILED
                and task.last_error.code == records_pb2.TASK_ERROR_CODE_DATA_LOSS
                and task_id in self.expect_data_loss
            ):
                # redis-loss: its owner died with Redis, so its acknowledged checkpoint
                # exists nowhere; reported (TaskFailed DATA_LOSS), not silently redone.
                r.data_loss_reported += 1
                continue
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

    async def _redis_loss(self, r: DrillResult) -> None:
        """SIGKILL one agent, then lose Redis's data; later SIGKILL a second agent.

        Redis restarts with its AOF deleted, as one without persistence would.
        The first victim's tasks had acknowledged checkpoints that are now in
        no store: their new owners must report DATA_LOSS, never resume them
        from scratch. The live agents see the new generation marker and
        re-ship their tasks from their local stores; the second victim's tasks
        then resume from that re-shipped state with nothing redone
        (``node_agent/core/redisloss.py``).
        """
        c = self.cluster
        redis = c.redis
        if not isinstance(c, LocalCluster) or redis is None:
            r.fault = "redis-loss needs a local cluster; skipped"
            return
        await asyncio.sleep(1.0)  # replicated checkpoints exist
        netns_agent = {c.agents[-1].name} if self.ns else set()
        first = await self._busiest_agent(netns_agent)
        # The promise under test covers the checkpoints the leader recorded as
        # acknowledged (its Assign's ResumePoint). A task whose first checkpoint
        # it has not heard of yet (its owner reports every
        # --progress-report-interval-s) restarts from its start when its owner
        # and Redis's data are lost together: nothing anywhere says it had
        # progress, until the old owner's agent starts again and reports it as
        # a fork (docs/operator.md). Inject once the leader knows a checkpoint
        # of every task the victim runs (CI at 02fd09a: one task 1.2 s old
        # restarted from its start, judged PROGRESS_LOST).
        held, unrecorded = await self._recorded_checkpoints(first.name, timeout_s=10.0)
        if unrecorded:
            r.notes.append(
                f"redis-loss: {len(unrecorded)} task(s) of {first.name} had no checkpoint the "
                f"leader recorded after 10 s: {sorted(unrecorded)}"
            )
        at = time.time()
        r.inject_at_s = at
        first.kill()
        redis.kill()
        data = c.run_dir / "redis"
        shutil.rmtree(data / "appendonlydir", ignore_errors=True)
        (data / "dump.rdb").unlink(missing_ok=True)
        redis.start()
        self.expect_data_loss = held
        # The live agents re-ship (a gap found by their next write, or the new
        # generation marker within 2 s); wait until it stops growing.
        deadline, last, stable_since = time.monotonic() + 15.0, -1, time.monotonic()
        while time.monotonic() < deadline:
            now_count = sum(self._reshipped(at).values())
            if now_count != last:
                last, stable_since = now_count, time.monotonic()
            elif now_count > 0 and time.monotonic() - stable_since >= 2.5:
                break
            await asyncio.sleep(0.25)
        by_agent = self._reshipped(at)
        running: dict[str, int] = {}
        for t in await c.list_tasks():
            if t.state == records_pb2.TASK_STATE_RUNNING:
                running[t.owner_node_id] = running.get(t.owner_node_id, 0) + 1
        live = [a for a in c.agents if a.alive and a.name not in netns_agent | {first.name}]
        # The agent with the most running tasks among those that re-shipped.
        second = max(live, key=lambda a: (by_agent.get(a.name, 0) > 0, running.get(a.name, 0)))
        second.kill()
        r.fault = (
            f"SIGKILL {first.name}; Redis SIGKILLed and restarted empty (AOF deleted); "
            f"SIGKILL {second.name} after the re-ship"
        )
        r.heal_at_s = time.time()
        dead = await self._wait_for(lambda: self._node_dead(second.name, at)[0], 20)
        if dead is not None:
            r.detection_s = dead - r.heal_at_s
        r.recovery_s = await self._wait_for(lambda: self._recovery(second.name, at), 30)
        first.start()
        second.start()
        r.reshipped = sum(self._reshipped(at).values())
        r.notes.append(
            f"redis-loss: {len(held)} task(s) of {first.name} had acknowledged checkpoints "
            f"when their owner and Redis's data were lost (expected: DATA_LOSS reported); "
            f"{r.reshipped} task(s) re-shipped from the live agents' local stores; "
            f"{second.name}'s tasks then resumed from that state"
        )

    async def _recorded_checkpoints(
        self, node: str, *, timeout_s: float
    ) -> tuple[set[str], set[str]]:
        """Tasks ``node`` runs: (those with a checkpoint the leader recorded, those without).

        Polls until the second set is empty or ``timeout_s`` passed.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            owned = [t for t in await self.cluster.list_tasks() if t.owner_node_id == node]
            recorded = {t.task_id for t in owned if t.HasField("last_replicated_checkpoint")}
            missing = {
                t.task_id for t in owned if t.state == records_pb2.TASK_STATE_RUNNING
            } - recorded
            if not missing or time.monotonic() >= deadline:
                return recorded, missing
            await asyncio.sleep(0.2)

    def _reshipped(self, since: float) -> dict[str, int]:
        """Per agent: re-ships to Redis from its local store acknowledged since ``since``."""
        by_log = {agent.log_path: agent.name for agent in self.cluster.agents}
        counts: dict[str, int] = {}
        for _, _, path in json_log_entries(by_log, since=since, needle="re-shipped checkpoint"):
            counts[by_log[path]] = counts.get(by_log[path], 0) + 1
        return counts

    async def _duplicate_identity(self, r: DrillResult) -> None:
        c = self.cluster
        original = c.agents[0]
        (metrics_port,) = free_loopback_ports(1)
        argv = list(original.argv)
        argv[argv.index("--data-dir") + 1] = str(c.run_dir / f"{original.name}-duplicate")
        argv[argv.index("--metrics-listen") + 1] = f"127.0.0.1:{metrics_port}"
        dup = ChildProcess(
            f"{original.name}-duplicate", argv, c.run_dir / f"{original.name}-duplicate.log", c.env
        )
        r.fault = (
            f"a second node agent with --node-id {original.name} (pid {original.pid} runs it), "
            f"another data dir, for {DUPLICATE_S:g} s"
        )
        at = time.time()
        r.inject_at_s = at
        dup.start()
        try:
            await asyncio.sleep(DUPLICATE_S)
        finally:
            dup.kill()
        r.heal_at_s = time.time()
        conflicts = [
            f
            for _, kind, f in self._collect(at)
            if kind == "IdentityConflict" and f.get("node_id") == original.name
        ]
        told = any(marker in dup.log_tail(400) for marker in IDENTITY_REFUSED)
        refused = bool(conflicts) and told
        r.identity_refused = refused
        r.notes.append(
            f"identity: {len(conflicts)} IdentityConflict event(s) for {original.name}; "
            f"the second process {'was' if told else 'was NOT'} told it was refused"
        )
        if not refused:
            r.notes.append(
                "the second process was NOT refused (an IdentityConflict event and a refusal in "
                "its log are both required): expected before the [identity] work lands"
            )

    async def _complete_failure(self, r: DrillResult) -> None:
        c = self.cluster
        await asyncio.sleep(2.0)  # checkpoints exist to resume from
        r.fault = "SIGKILL every process at once: agents, coordinators, every etcd member, Redis"
        at = time.time()
        r.inject_at_s = at
        children = [*c.agents, *c.coordinators]
        for child in children:
            child.signal(signal.SIGKILL)
        members = c.etcd.members if isinstance(c.etcd, EtcdCluster) else [c.etcd]
        for member in members:
            if member is not None:
                member.kill()
        if c.redis is not None:
            c.redis.kill()
        for child in children:
            child.kill()  # reap
        await asyncio.sleep(1.0)
        restart = time.time()
        r.heal_at_s = restart

        def start_stores() -> None:
            for member in members:
                if member is not None:
                    member.start(wait=False)
            for member in members:
                if member is not None:
                    member.wait_ready()
            if c.redis is not None:
                c.redis.start()

        await asyncio.to_thread(start_stores)
        for child in children:
            child.start()
        r.time_to_all_running_s = await self._all_running(restart, timeout_s=120)
        r.recovery_s = r.time_to_all_running_s
        if r.time_to_all_running_s is None:
            r.notes.append("not every unfinished task was RUNNING again within 120 s")

    async def _all_running(self, since: float, timeout_s: float) -> float | None:
        """Seconds from ``since`` until every workload task is RUNNING or finished."""
        deadline = time.monotonic() + timeout_s
        prefix = f"drill-{self.token}-{self.round}-"
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                tasks = [
                    t for t in await self.cluster.list_tasks() if t.request_id.startswith(prefix)
                ]
                live = (records_pb2.TASK_STATE_RUNNING, *_DONE)
                if tasks and all(t.state in live for t in tasks):
                    # RUNNING in the record may predate the crash: require a live owner.
                    nodes = {
                        n.node_id
                        for n in await self.cluster.list_nodes()
                        if n.state == records_pb2.NODE_STATE_ALIVE
                    }
                    if all(t.state in _DONE or t.owner_node_id in nodes for t in tasks):
                        return time.time() - since
            await asyncio.sleep(0.2)
        return None

    async def _chaos(self, r: DrillResult) -> None:
        c = self.cluster
        seed, duration = self.chaos_seed, self.chaos_s
        etcd_members = len(c.etcd.members) if isinstance(c.etcd, EtcdCluster) else 1
        faults = make_schedule(
            seed,
            duration,
            agents=len(c.agents),
            etcd_members=etcd_members,
            netns=self.ns is not None,
        )
        r.seed = seed
        r.schedule = schedule_lines(seed, faults)
        r.fault = f"chaos seed {seed}: {len(faults)} overlapping faults over {duration:g} s"
        for line in r.schedule:
            self.console.print(f"  {line}")
        start = time.time()
        r.inject_at_s = start
        await asyncio.gather(*(self._one_fault(r, f, start) for f in faults))
        await asyncio.to_thread(self._heal_everything)
        r.heal_at_s = time.time()

    async def _one_fault(self, r: DrillResult, fault: Fault, start: float) -> None:
        c = self.cluster
        await asyncio.sleep(max(0.0, start + fault.at_s - time.time()))
        began = time.time()
        kind = fault.kind
        heal: Callable[[], Any]
        label = fault.kind.value
        if kind.group == "agent":
            agent = c.agents[fault.target]
            label += f" {agent.name}"
            if kind is FaultKind.PARTITION_AGENT and self.ns is not None:
                self.ns.cut()
                heal = self.ns.heal
            elif kind is FaultKind.STOP_AGENT:
                agent.pause()
                heal = agent.resume
            else:  # kill / restart: same node id, same data dir
                agent.kill()
                heal = agent.start
        elif kind.group == "coordinator":
            try:
                # A replica answers who leads from etcd: with an etcd member stopped
                # its read may wait out a 2 s timeout, so give the lookup time to try
                # every replica rather than skip the fault (seed 1's stop-leader meets
                # a stopped member; it found CI's stuck-task bug when it did hit).
                index, member = await asyncio.wait_for(c.leader(), LEADER_LOOKUP_S)
            except (TimeoutError, RuntimeError):
                r.notes.append(f"{fault.describe()}: no leader to hit, skipped")
                return
            leader = c.coordinators[index]
            label += f" {member}"
            if kind is FaultKind.STOP_LEADER:
                leader.pause()
                heal = leader.resume
            else:
                leader.kill()
                heal = leader.start
        elif kind.group == "etcd":
            assert isinstance(c.etcd, EtcdCluster)
            member_server = c.etcd.members[fault.target]
            label += f" {fault.target}"
            if kind is FaultKind.STOP_ETCD:
                member_server.pause()
                heal = member_server.resume
            else:
                member_server.kill()
                heal = member_server.start
        else:
            redis_server = c.redis
            assert redis_server is not None
            if kind is FaultKind.STOP_REDIS:
                redis_server.pause()
                heal = redis_server.resume
            else:
                redis_server.kill()
                heal = redis_server.start
        await asyncio.sleep(fault.duration_s)
        try:
            await asyncio.to_thread(heal)
        except Exception as exc:
            r.notes.append(f"{fault.describe()}: heal failed: {exc}")
        r.fault_windows.append((began - r.started_at, time.time() - r.started_at, label))

    def _heal_everything(self) -> None:
        """After chaos: every process running and unpaused, the namespace's link up."""
        c = self.cluster
        if self.ns is not None:
            with contextlib.suppress(Exception):
                self.ns.heal()
        if isinstance(c.etcd, EtcdCluster):
            for member in c.etcd.members:
                with contextlib.suppress(Exception):
                    if member.running:
                        member.resume()
                    else:
                        member.start()
        if c.redis is not None:
            with contextlib.suppress(Exception):
                if c.redis.running:
                    c.redis.resume()
                else:
                    c.redis.start()
        for child in [*c.coordinators, *c.agents]:
            child.resume()
            if not child.alive:
                child.start()


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
    chaos_seeds: tuple[int, ...] = (1,),
    chaos_s: float = CHAOS_SECONDS,
    settle_timeout_s: float = SETTLE_TIMEOUT_S,
) -> list[DrillResult]:
    """Run ``scenarios`` one after another on ``cluster``; return what each measured.

    ``chaos`` runs once per seed of ``chaos_seeds``, each schedule ``chaos_s`` long.
    After its faults each drill waits up to ``settle_timeout_s`` seconds for every
    task to finish; a task unfinished then counts as lost, with its state in the notes.
    """
    drill = _Drill(cluster, ns, no_ns_reason, console, tasks, lines, work_ms)
    drill.chaos_s = chaos_s
    drill.settle_timeout_s = settle_timeout_s
    results = []
    for scenario in scenarios:
        for seed in chaos_seeds if scenario == "chaos" else (0,):
            drill.chaos_seed = seed
            name = f"chaos seed {seed}" if scenario == "chaos" else scenario
            with console.status(f"drill {name}: workload, fault, heal, wait"):
                result = await drill.run(scenario)
            verdict = "[green]held[/]" if result.held else "[red]FAILED[/]"
            console.print(f"drill [bold]{name}[/]: {result.fault} — {verdict}")
            for v in result.violations[:3]:
                console.print(f"    [red]{escape(v)}[/]")
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
        ("all running s", "right"),
        ("lost", "right"),
        ("dup", "right"),
        ("dup exec", "right"),
        ("safety", "right"),
        ("wrong", "right"),
        ("held", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in report.results:
        table.add_row(
            f"chaos {r.seed}" if r.seed is not None else r.scenario,
            _fmt(r.detection_s),
            _fmt(r.recovery_s),
            _fmt(r.leader_failover_s),
            str(r.tasks_moved),
            str(r.forks_kept),
            f"{r.work_redone_s:.2f}",
            _fmt(r.reconcile_convergence_s),
            _fmt(r.time_to_all_running_s),
            str(r.tasks_lost),
            str(r.duplicate_completions),
            str(r.dup_exec) if r.effects_checked else "n/a",
            str(r.safety_violations) if r.effects_checked else "n/a",
            str(r.wrong_results),
            "[green]yes[/]" if r.held else "[red]NO[/]",
        )
    console.print(table)
    console.print(f"  mTLS: {'on' if report.mtls else 'off'}")
    for r in report.results:
        console.print(f"  {r.scenario}: {r.fault}")
        if r.effects_checked:
            console.print(
                f"    side effects: {r.effect_records} records; two owners {r.two_owners}, "
                f"stale steps {r.stale_steps}, epoch regressions {r.epoch_regressions}, "
                f"progress lost {r.progress_lost}, dup exec {r.dup_exec}; "
                f"paused tasks {r.paused_tasks} (longest gap {r.longest_pause_s:.1f} s)"
            )
        for line in r.schedule:
            console.print(f"    {line}")
        for note in r.notes[:8]:
            console.print(f"    note: {escape(note)}")


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
        for w_start, w_end, _label in r.fault_windows:
            ax.axvspan(w_start, max(w_end, w_start + 0.05), color="#e91e63", alpha=0.12)
        if r.inject_at_s and not r.fault_windows:
            start = r.inject_at_s - r.started_at
            stop = (r.heal_at_s - r.started_at) if r.heal_at_s else start
            ax.axvspan(start, max(stop, start + 0.05), color="#e91e63", alpha=0.15)
        ax.set_yticks(range(len(nodes)))
        ax.set_yticklabels(nodes, fontsize=7)
        ax.set_xlim(0, end)
        ax.set_ylim(-0.6, len(nodes) + 1.0)
        verdict = "held" if r.held else "FAILED"
        extra = (
            f" — dup exec {r.dup_exec}, safety {r.safety_violations}" if r.effects_checked else ""
        )
        ax.set_title(f"{r.scenario}: {r.fault[:90]} — {verdict}{extra}", fontsize=8, loc="left")
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
