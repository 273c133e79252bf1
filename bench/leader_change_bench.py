"""False DEAD verdicts across a leader change: real node agents, leader SIGKILLed and SIGTERMed.

Issue 16 item 9: a leader change must produce no false DEAD verdict. Setup, all
on 127.0.0.1: etcd (``--etcd-members`` 1 or 3) and Redis, three ``lazarus
coordinator`` processes at their defaults (heartbeat 0.5 s, dead_after 3 s,
fence_after 2 s, lease TTL 3 s, new-leader grace ``failover_reconnect_s`` 7 s +
dead_after), started by ``lazarus_dev.devcluster.LocalCluster`` (``agents=0``;
``--auth none`` unless ``--tls``).

**The simulated nodes are real agents.** Each is a full
``node_agent.agent.NodeAgent`` built as ``lazarus node-agent`` builds one
(``AgentSettings`` + ``AgentMetrics``): its own data directory, checkpoint store
and shared-document store, its Session loop (``_session_loop`` / ``_one_session``:
dials the three addresses in turn, follows NotLeader redirects, honours
``retry_after_ms``), its 50 ms clock and its ``AgentCore`` (heartbeats, self-fence).
The only differences from a ``lazarus node-agent`` process: the app is an empty
``Agent`` (no task kinds; the bench submits no tasks), no metrics listener, and
``--workers`` processes (this script with ``--worker``) each run many agents on
one event loop. Every agent dials on its own HTTP/2 connection (a channel
option, ``grpc.use_local_subchannel_pool``, added by a ``ClientTls`` subclass),
as agents on separate hosts would; without it grpc-python would multiplex all
agents of a process onto one connection. Full agents were light enough here
(500 over 4 processes on 2 cores), so the lighter fallback (the session loop
alone) was not needed.

**A trial.** Wait until every node is ALIVE (``ListNodes``) and every agent
holds a Session, then ``SETTLE_S``; read the baseline (each replica's
``lazarus_failure_detection_seconds_count`` = DEAD verdicts and
``lazarus_leader_changes_total``; each agent's Session term); send the signal to
the leader's pid (t0). Then, every ``POLL_S``: ask the survivors
``GetClusterStatus`` for the new leader; ``ListNodes`` (nodes seen SUSPECT or
DEAD); the workers, for each agent's first Welcome from a higher term (its
reconnect time) and its self-fences. The window lasts at least ``--window-s``
(20 s: past the new leader's grace, so a node that never came back would be
judged DEAD inside it) and until every agent reconnected plus
``AFTER_RECONNECT_S``; at most ``MAX_WINDOW_S``. A ``WatchEvents`` stream
(``lazarus.client.Client.watch``, resuming on another replica when one dies)
collects NODE_DEAD / NODE_SUSPECTED events throughout. False DEAD verdicts =
the largest of: the new leader's DEAD-verdict metric delta, the nodes seen DEAD
by ``ListNodes`` (polls and the final listing), the nodes named by NODE_DEAD
events. Every node keeps running, so every DEAD verdict is false. Then the
signalled replica is started again (same address), the fleet settles, and the
next trial runs: ``--trials`` with SIGKILL, then ``--trials`` with SIGTERM.

**Control** (``--control``): afterwards, with no leader change, one worker is
SIGSTOPped for ``CONTROL_STOP_S`` (past dead_after); the same three counters
must each report its nodes DEAD, so a 0 above is not a blind counter.

Results: ``bench/results/leader_change.json`` and the table between the
``leader-change-bench`` markers of ``bench/README.md``. Every process started
here (etcd, Redis, coordinators, workers) is stopped by pid at the end, also on
Ctrl-C, SIGTERM or an error.

Run: ``flock /tmp/lazarus-heavy.lock .venv/bin/python bench/leader_change_bench.py
[--nodes N] [--trials N] [--workers N] [--control] [--quick] [--out PATH]
[--no-readme]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import types
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import RESULTS_DIR, today, write_json, write_section

from lazarus.client import Client
from lazarus.tls import ClientTls, IdentityKind
from lazarus.v1 import coordinator_pb2, coordinator_pb2_grpc, records_pb2
from lazarus_dev.devcluster import DevCertificates, LocalCluster

RESULTS = RESULTS_DIR / "leader_change.json"
SELF = Path(__file__).resolve()

POLL_S = 0.5
"""Cadence of the leader / ListNodes / worker polls during a trial."""
SETTLE_S = 3.0
"""Held after every node is ALIVE and connected, before the signal (6 heartbeats)."""
WINDOW_S = 20.0
"""Shortest observation window after the signal (past the new leader's grace)."""
QUICK_WINDOW_S = 8.0
AFTER_RECONNECT_S = 5.0
"""The window lasts at least this long after the last agent reconnected (> dead_after)."""
MAX_WINDOW_S = 60.0
READY_S = 120.0
"""Bound on every node turning ALIVE (start-up and after a restart)."""
START_CONCURRENCY = 8
"""Agents a worker starts at once."""
STOP_GRACE_S = 30.0
CONTROL_STOP_S = 6.0
"""``--control``: how long one worker is SIGSTOPped (> dead_after + a tick)."""
SIGNALS = {"sigkill": signal.SIGKILL, "sigterm": signal.SIGTERM}


class BenchError(Exception):
    """The fleet did not reach the state a trial needs."""


# ---------------------------------------------------------------- worker: real node agents


class _OwnConnection(ClientTls):
    """``ClientTls`` whose channels never share a connection with another agent's."""

    __slots__ = ()

    def options(self) -> tuple[tuple[str, Any], ...]:
        return (
            *super().options(),
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.enable_http_proxy", 0),  # loopback only
        )


async def worker_main(config: dict[str, Any]) -> None:
    """Run ``config["node_ids"]`` agents; serve JSON-line commands on stdin until stop."""
    from node_agent.agent import NodeAgent
    from node_agent.metrics import AgentMetrics
    from node_agent.sdk import Agent
    from node_agent.settings import AgentSettings

    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    certs = (
        DevCertificates(Path(config["tls_dir"]), config["cluster"]) if config["tls_dir"] else None
    )
    app = Agent("leader-change-bench")
    agents: dict[str, NodeAgent] = {}
    for node_id in config["node_ids"]:
        tls = _OwnConnection()
        if certs is not None:
            issued = certs.client_tls(IdentityKind.NODE, node_id)
            tls = _OwnConnection(issued.ca_file, issued.cert_file, issued.key_file)
        settings = AgentSettings(
            node_id=node_id,
            coordinators=tuple(config["coordinators"]),
            data_dir=Path(config["data_root"]) / node_id,
            redis_url=config["redis_url"],
            tls=tls,
        )
        agents[node_id] = NodeAgent(settings, app=app, metrics=AgentMetrics())
    base_term: dict[str, int] = {}
    base_fences: dict[str, int] = {}
    reconnected: dict[str, float] = {}
    lags: list[float] = []
    loop = asyncio.get_running_loop()

    async def watch() -> None:
        while True:
            before = loop.time()
            await asyncio.sleep(0.02)
            lags.append((loop.time() - before - 0.02) * 1000.0)
            if base_term:
                now = time.monotonic()
                for node_id, agent in agents.items():
                    if (
                        node_id not in reconnected
                        and agent.core.session_open
                        and agent.core.term > base_term[node_id]
                    ):
                        reconnected[node_id] = now

    async def start_all() -> None:
        gate = asyncio.Semaphore(START_CONCURRENCY)

        async def one(agent: NodeAgent) -> None:
            async with gate:
                await agent.start()

        await asyncio.gather(*(one(a) for a in agents.values()))

    def where(node_id: str) -> list[str]:
        """Where a closed agent's session task waits: its coroutine chain, innermost last."""
        for task in getattr(agents[node_id], "_tasks", []):  # diagnostics only
            if task.get_name() != "agent-session":
                continue
            if task.done():
                if not task.cancelled():
                    return [f"session task ended: {task.exception()!r}"]
                # Where the CancelledError was raised (Python keeps it as the context).
                error = task._make_cancelled_error()  # diagnostics only
                origin = error.__context__ or error
                return [
                    "session task ended cancelled",
                    *traceback.format_exception(origin)[-8:],
                ]
            chain: list[str] = []
            coro: Any = task.get_coro()
            while coro is not None:
                frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
                if frame is not None:
                    chain.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
                coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
            return chain
        return ["no session task"]

    def fences(agent: NodeAgent) -> int:
        return sum(1 for e in agent.fence_log if e["event"] == "self_fence")

    def reply(message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    watcher = asyncio.create_task(watch())
    try:
        while line := await reader.readline():
            op = json.loads(line)["op"]
            if op == "start":
                t = time.monotonic()
                await start_all()
                reply({"ok": True, "s": round(time.monotonic() - t, 2)})
            elif op == "mark":
                reconnected.clear()
                lags.clear()
                base_fences.update({n: fences(a) for n, a in agents.items()})
                base_term.update({n: a.core.term for n, a in agents.items()})
                reply({"ok": True, "terms": sorted(set(base_term.values()))})
            elif op == "report":
                fenced = [n for n, a in agents.items() if fences(a) > base_fences.get(n, 0)]
                closed = [n for n, a in agents.items() if not a.core.session_open]
                ended = [
                    n
                    for n, a in agents.items()
                    if any(
                        t.get_name() == "agent-session" and t.done()
                        for t in getattr(a, "_tasks", [])  # diagnostics only
                    )
                ]
                ordered = sorted(lags)
                reply(
                    {
                        "ok": True,
                        "open": sum(a.core.session_open for a in agents.values()),
                        "closed": {n: where(n) for n in [*ended, *closed][:5]},
                        "ended": ended,
                        "reconnected": reconnected,
                        "fenced": fenced,
                        "lag_p99_ms": ordered[int(0.99 * (len(ordered) - 1))] if ordered else 0,
                        "lag_max_ms": ordered[-1] if ordered else 0,
                    }
                )
            elif op == "stop":
                break
    finally:
        watcher.cancel()
        gate = asyncio.Semaphore(32)

        async def stop(agent: NodeAgent) -> None:
            async with gate:
                with contextlib.suppress(Exception):
                    await agent.stop(goodbye=False, timeout_s=2.0)

        await asyncio.gather(*(stop(a) for a in agents.values()))
        reply({"ok": True, "stopped": True})


# ---------------------------------------------------------------- orchestration


class WorkerProcess:
    """One ``--worker`` subprocess, commanded by JSON lines."""

    def __init__(self, process: asyncio.subprocess.Process, node_ids: list[str]) -> None:
        self.process = process
        self.node_ids = node_ids

    @classmethod
    async def spawn(cls, config: dict[str, Any], log_path: Path) -> WorkerProcess:
        with log_path.open("ab") as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                str(SELF),
                "--worker",
                json.dumps(config),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                limit=1 << 24,
                start_new_session=True,  # a terminal's Ctrl-C is ours to handle
            )
        return cls(process, list(config["node_ids"]))

    async def ask(self, op: str, timeout_s: float = 60.0) -> dict[str, Any]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write((json.dumps({"op": op}) + "\n").encode())
        await self.process.stdin.drain()
        async with asyncio.timeout(timeout_s):
            line = await self.process.stdout.readline()
        if not line:
            raise BenchError(f"worker {self.process.pid} ended (exit {self.process.returncode})")
        return json.loads(line)  # type: ignore[no-any-return]

    async def stop(self) -> None:
        """Ask it to stop its agents; SIGKILL it by pid if it has not exited in time."""
        if self.process.returncode is None:
            with contextlib.suppress(Exception):
                await self.ask("stop", timeout_s=STOP_GRACE_S)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.process.wait(), 10.0)
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)
            await self.process.wait()


def _metric(url: str, name: str) -> float | None:
    """Value of an unlabelled sample ``name`` at ``url``; None if unreachable."""
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            for line in response.read().decode().splitlines():
                if line.startswith(f"{name} "):
                    return float(line.split()[1])
    except OSError:
        return None
    return 0.0


DEAD_METRIC = "lazarus_failure_detection_seconds_count"
CHANGES_METRIC = "lazarus_leader_changes_total"


async def _replica_metrics(cluster: LocalCluster) -> list[dict[str, float | None]]:
    out = []
    for url in cluster.coordinator_metrics:
        dead, changes = await asyncio.gather(
            asyncio.to_thread(_metric, url, DEAD_METRIC),
            asyncio.to_thread(_metric, url, CHANGES_METRIC),
        )
        out.append({"dead": dead, "changes": changes})
    return out


async def _status(cluster: LocalCluster, index: int) -> coordinator_pb2.GetClusterStatusResponse:
    async with cluster.channel(index) as channel:
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)  # type: ignore[no-untyped-call]
        reply: coordinator_pb2.GetClusterStatusResponse = await stub.GetClusterStatus(
            coordinator_pb2.GetClusterStatusRequest(), timeout=2.0
        )
    return reply


async def _list_nodes(cluster: LocalCluster, index: int) -> list[records_pb2.NodeRecord]:
    async with cluster.channel(index) as channel:
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)  # type: ignore[no-untyped-call]
        reply = await stub.ListNodes(coordinator_pb2.ListNodesRequest(page_size=1000), timeout=5.0)
    return [info.record for info in reply.nodes]


class EventLog:
    """NODE_DEAD / NODE_SUSPECTED / NODE_RECOVERED / LEADER_ELECTED events, as they arrive."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.client = Client(
            cluster.coordinator_addresses, tls=cluster.client_tls, retry_max_s=MAX_WINDOW_S
        )
        self.events: list[tuple[float, records_pb2.Event]] = []
        self.error = ""
        self.gaps: list[int] = []
        self.reconnects = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        stream = self.client.watch(
            types=["node_dead", "node_suspected", "node_recovered", "leader_elected"],
            progress_interval_ms=500,
        )
        try:
            async for event in stream:
                self.events.append((time.monotonic(), event))
                self.gaps, self.reconnects = list(stream.gaps), stream.reconnects
        except Exception as exc:  # recorded in the report, never fatal
            self.error = repr(exc)
        finally:
            self.gaps, self.reconnects = list(stream.gaps), stream.reconnects

    def since(self, t0: float) -> dict[str, Any]:
        """Counts of the events that arrived after ``t0`` (monotonic)."""
        dead: set[str] = set()
        suspected: set[str] = set()
        reasons: dict[str, int] = {}
        elected = []
        for at, e in self.events:
            if at < t0:
                continue
            body = e.WhichOneof("body")
            if body == "node_dead":
                dead.add(e.node_dead.node_id)
            elif body == "node_suspected":
                suspected.add(e.node_suspected.node_id)
                reason = records_pb2.SuspicionReason.Name(e.node_suspected.reason)
                key = f"term {e.term}: {reason}"
                reasons[key] = reasons.get(key, 0) + 1
            elif body == "leader_elected":
                elected.append(e.leader_elected.leader_id)
        return {
            "node_dead_nodes": sorted(dead),
            "node_suspected_nodes": sorted(suspected),
            "node_suspected_by_term_and_reason": reasons,
            "leader_elected": elected,
            "watch_reconnects": self.reconnects,
            "watch_gaps": self.gaps,
            "watch_error": self.error,
        }

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        with contextlib.suppress(Exception):
            await self.client.close()


async def _report_all(workers: list[WorkerProcess]) -> dict[str, Any]:
    replies = await asyncio.gather(*(w.ask("report") for w in workers))
    reconnected: dict[str, float] = {}
    fenced: list[str] = []
    closed: dict[str, list[str]] = {}
    ended: list[str] = []
    for r in replies:
        closed.update(r["closed"])
        ended += r["ended"]
        reconnected.update(r["reconnected"])
        fenced += r["fenced"]
    return {
        "open": sum(r["open"] for r in replies),
        "closed": closed,
        "ended": ended,
        "reconnected": reconnected,
        "fenced": fenced,
        "lag_p99_ms": max(r["lag_p99_ms"] for r in replies),
        "lag_max_ms": max(r["lag_max_ms"] for r in replies),
    }


LOST_WHERE: dict[str, list[str]] = {}
"""For some of ``LOST``: where the Session loop ended (a traceback when it was cancelled)."""
LOST: dict[str, str] = {}
"""Agents whose Session loop ended (the task finished while the agent runs), by phase.

Such an agent never dials again: it is dropped from ``node_ids`` (the fleet a
trial watches) and reported; one that ends inside a trial's window counts there."""


async def wait_steady(
    cluster: LocalCluster, workers: list[WorkerProcess], node_ids: set[str], phase: str = ""
) -> tuple[int, str]:
    """Wait until one leader serves, every node is ALIVE and every agent holds a Session.

    Agents whose Session loop ended are removed from ``node_ids`` (in place) into ``LOST``.
    """
    deadline = time.monotonic() + READY_S
    missing: set[str] = set(node_ids)
    opened = 0
    closed: dict[str, list[str]] = {}
    while time.monotonic() < deadline:
        for child in cluster.coordinators:
            if child.popen is not None and child.popen.poll() is not None:
                raise BenchError(f"{child.name} exited: {child.log_tail(5)}")
        try:
            nodes = await cluster.list_nodes()
            alive = {n.node_id for n in nodes if n.state == records_pb2.NODE_STATE_ALIVE}
            missing = node_ids - alive
            report = await _report_all(workers)
            opened, closed = report["open"], report["closed"]
            for node_id in report["ended"]:
                if node_id in node_ids:
                    node_ids.discard(node_id)
                    LOST[node_id] = phase
                    if node_id in closed:
                        LOST_WHERE[node_id] = closed[node_id]
                    print(f"{node_id}: its Session loop ended ({phase}); dropped", flush=True)
            missing = node_ids - alive
        except (grpc.aio.AioRpcError, RuntimeError):
            await asyncio.sleep(0.5)
            continue
        if not missing and opened == len(node_ids):
            return await cluster.leader()
        await asyncio.sleep(0.5)
    raise BenchError(
        f"not steady after {READY_S} s: {len(missing)} nodes not ALIVE, "
        f"{opened}/{len(node_ids)} Sessions open; not ALIVE: {sorted(missing)[:10]}; "
        f"where closed agents' Session loops wait: {json.dumps(closed)}"
    )


async def trial(
    cluster: LocalCluster,
    workers: list[WorkerProcess],
    events: EventLog,
    node_ids: set[str],
    sig_name: str,
    window_s: float,
) -> dict[str, Any]:
    """Signal the leader; observe the window; restart it and wait for steady state."""
    leader_index, leader_id = await wait_steady(cluster, workers, node_ids, "before " + sig_name)
    fleet = set(node_ids)
    n = len(fleet)
    await asyncio.sleep(SETTLE_S)
    base_metrics = await _replica_metrics(cluster)
    marks = await asyncio.gather(*(w.ask("mark") for w in workers))
    terms = sorted({t for m in marks for t in m["terms"]})
    old_term = (await _status(cluster, leader_index)).term
    survivors = [i for i in range(len(cluster.coordinators)) if i != leader_index]
    loadavg = os.getloadavg()[0]
    t0 = time.monotonic()
    cluster.coordinators[leader_index].signal(SIGNALS[sig_name])
    print(f"{sig_name}: sent to leader {leader_id} (term {old_term})", flush=True)

    new_leader: tuple[int, str] | None = None
    leader_s: float | None = None
    seen_dead: dict[str, float] = {}
    seen_suspect: set[str] = set()
    report: dict[str, Any] = {}
    all_back_s: float | None = None
    while True:
        now = time.monotonic() - t0
        if new_leader is None:
            for i in survivors:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    status = await _status(cluster, i)
                    if status.term > old_term and status.leader_id:
                        index = next(
                            (
                                k
                                for k, c in enumerate(cluster.coordinators)
                                if c.name == status.leader_id
                            ),
                            -1,
                        )
                        if index in survivors:
                            new_leader = (index, status.leader_id)
                            leader_s = round(time.monotonic() - t0, 3)
                            break
        with contextlib.suppress(grpc.aio.AioRpcError):
            for record in await _list_nodes(cluster, survivors[0]):
                if record.node_id not in fleet:
                    continue
                if record.state == records_pb2.NODE_STATE_DEAD:
                    seen_dead.setdefault(record.node_id, round(time.monotonic() - t0, 3))
                elif record.state == records_pb2.NODE_STATE_SUSPECT:
                    seen_suspect.add(record.node_id)
        report = await _report_all(workers)
        ended = fleet & set(report["ended"])
        if (
            all_back_s is None
            and fleet - ended <= set(report["reconnected"])
            and report["reconnected"]
        ):
            all_back_s = round(max(report["reconnected"].values()) - t0, 3)
        now = time.monotonic() - t0
        done = now >= window_s and (
            all_back_s is not None and now >= all_back_s + AFTER_RECONNECT_S
        )
        if done or now >= MAX_WINDOW_S:
            break
        await asyncio.sleep(POLL_S)

    observed_s = round(time.monotonic() - t0, 3)
    after = await _replica_metrics(cluster)
    final_dead: list[str] = []
    final_not_alive = 0
    with contextlib.suppress(grpc.aio.AioRpcError):
        final = await _list_nodes(cluster, new_leader[0] if new_leader else survivors[0])
        final = [r for r in final if r.node_id in fleet]
        final_dead = [r.node_id for r in final if r.state == records_pb2.NODE_STATE_DEAD]
        final_not_alive = sum(1 for r in final if r.state != records_pb2.NODE_STATE_ALIVE)
    for node_id in final_dead:
        seen_dead.setdefault(node_id, observed_s)
    ev = events.since(t0)

    def delta(i: int, key: str) -> float | None:
        b, a = base_metrics[i][key], after[i][key]
        return None if a is None or b is None else a - b

    metric_dead = delta(new_leader[0], "dead") if new_leader else None
    dead_union = sorted(set(seen_dead) | (set(ev["node_dead_nodes"]) & fleet))
    false_dead = max(int(metric_dead or 0), len(dead_union))
    times = sorted(t - t0 for t in report["reconnected"].values())
    result: dict[str, Any] = {
        "signal": sig_name,
        "nodes": n,
        "old_leader": leader_id,
        "old_term": old_term,
        "agent_terms_before": terms,
        "new_leader": new_leader[1] if new_leader else None,
        "new_leader_after_s": leader_s,
        "first_reconnect_s": round(times[0], 3) if times else None,
        "median_reconnect_s": round(times[len(times) // 2], 3) if times else None,
        "all_reconnected_s": all_back_s,
        "reconnected": len(times),
        "observed_s": observed_s,
        "false_dead": false_dead,
        "dead_verdicts_metric_new_leader": metric_dead,
        "dead_verdicts_metric_all_replicas": [
            delta(i, "dead") for i in range(len(cluster.coordinators))
        ],
        "leader_changes_metric": [delta(i, "changes") for i in range(len(cluster.coordinators))],
        "nodes_seen_dead": dead_union,
        "nodes_seen_dead_at_s": seen_dead,
        "nodes_seen_suspect": len(seen_suspect | set(ev["node_suspected_nodes"])),
        "final_not_alive": final_not_alive,
        "events": ev,
        "self_fenced_nodes": len(report["fenced"]),
        "session_loops_ended_in_window": sorted(ended),
        "session_loops_ended_where": {k: v for k, v in report["closed"].items() if k in ended},
        "worker_lag_p99_ms": round(report["lag_p99_ms"], 1),
        "worker_lag_max_ms": round(report["lag_max_ms"], 1),
        "loadavg_at_signal": round(loadavg, 2),
    }
    print(
        f"{sig_name}: new leader {result['new_leader']} after {leader_s} s, all {n} nodes "
        f"reconnected after {all_back_s} s, false DEAD {false_dead} "
        f"(metric {metric_dead}, seen {len(dead_union)}), "
        f"self-fenced {len(report['fenced'])}",
        flush=True,
    )
    # Start the signalled replica again; wait for it and the fleet to be steady.
    child = cluster.coordinators[leader_index]
    popen = child.popen
    assert popen is not None
    try:
        result["old_leader_exit_code"] = await asyncio.to_thread(popen.wait, 15)
    except subprocess.TimeoutExpired:
        child.kill()
        result["old_leader_exit_code"] = popen.returncode
    child.start()
    await wait_steady(cluster, workers, node_ids, "after " + sig_name)
    return result


async def control_run(
    cluster: LocalCluster, workers: list[WorkerProcess], events: EventLog, node_ids: set[str]
) -> dict[str, Any]:
    """The counters are not blind: SIGSTOP one worker past dead_after; its nodes must be DEAD.

    No leader change here; every DEAD verdict is true. The same three signals
    (metric delta, ListNodes, NODE_DEAD events) must each see the stopped
    worker's nodes.
    """
    leader_index, _ = await wait_steady(cluster, workers, node_ids, "before control")
    await asyncio.sleep(SETTLE_S)
    before = await _replica_metrics(cluster)
    stopped = workers[0]
    t0 = time.monotonic()
    os.kill(stopped.process.pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(CONTROL_STOP_S)
    finally:
        os.kill(stopped.process.pid, signal.SIGCONT)
    seen: set[str] = set()
    mine = set(stopped.node_ids) & node_ids
    with contextlib.suppress(grpc.aio.AioRpcError):
        seen = {
            r.node_id
            for r in await _list_nodes(cluster, leader_index)
            if r.state == records_pb2.NODE_STATE_DEAD and r.node_id in mine
        }
    await asyncio.sleep(2.0)  # the events reach the watcher
    after = await _replica_metrics(cluster)
    b, a = before[leader_index]["dead"], after[leader_index]["dead"]
    result = {
        "stopped_nodes": len(mine),
        "stopped_s": CONTROL_STOP_S,
        "dead_verdicts_metric": None if a is None or b is None else a - b,
        "nodes_seen_dead": len(seen),
        "node_dead_events": len(set(events.since(t0)["node_dead_nodes"]) & mine),
    }
    print(f"control (SIGSTOP one worker {CONTROL_STOP_S:g} s): {result}", flush=True)
    await wait_steady(cluster, workers, node_ids, "after control")
    return result


async def bench(args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    cluster = LocalCluster(
        run_dir,
        coordinators=3,
        agents=0,
        etcd_members=args.etcd_members,
        cluster=f"lcbench-{uuid.uuid4().hex[:6]}",
        tls=args.tls,
        durable_redis=False,
    )
    workers: list[WorkerProcess] = []
    events: EventLog | None = None
    try:
        cluster.start()
        await cluster.leader()
        node_ids = [f"lc-{i:05d}" for i in range(args.nodes)]
        shards = [node_ids[w :: args.workers] for w in range(args.workers)]
        for w, shard in enumerate(shards):
            config = {
                "node_ids": shard,
                "coordinators": cluster.coordinator_addresses,
                "data_root": str(run_dir / "agents"),
                "redis_url": cluster.redis_url,
                "tls_dir": str(cluster.certs.directory) if cluster.certs else "",
                "cluster": cluster.cluster,
            }
            workers.append(await WorkerProcess.spawn(config, run_dir / f"worker-{w}.log"))
        t = time.monotonic()
        started = await asyncio.gather(*(w.ask("start", timeout_s=READY_S) for w in workers))
        print(f"{args.nodes} agents started in {[s['s'] for s in started]} s", flush=True)
        fleet = set(node_ids)
        await wait_steady(cluster, workers, fleet, "start-up")
        print(f"all {len(fleet)} nodes ALIVE after {time.monotonic() - t:.1f} s", flush=True)
        events = EventLog(cluster)
        events.start()
        trials: dict[str, list[dict[str, Any]]] = {}
        for sig_name in SIGNALS:
            for _ in range(args.trials):
                trials.setdefault(sig_name, []).append(
                    await trial(cluster, workers, events, fleet, sig_name, args.window_s)
                )
        control = await control_run(cluster, workers, events, fleet) if args.control else None
        return {
            "trials": trials,
            "control": control,
            "session_loops_ended": LOST,
            "session_loops_ended_where": LOST_WHERE,
            "coordinator_logs": _log_excerpts(cluster),
        }
    except BaseException:
        with contextlib.suppress(Exception):
            print(json.dumps(_log_excerpts(cluster), indent=1), file=sys.stderr)
        raise
    finally:
        if events is not None:
            await events.close()
        await asyncio.gather(*(w.stop() for w in workers), return_exceptions=True)
        cluster.stop()


def _log_excerpts(cluster: LocalCluster, lines: int = 15) -> dict[str, list[str]]:
    """Each coordinator's WARNING / ERROR lines (count, then the last ``lines``)."""
    out = {}
    for child in cluster.coordinators:
        try:
            text = child.log_path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        bad = [
            line[:300]
            for line in text
            if ("WARNING" in line or "ERROR" in line) and "--auth none" not in line
        ]
        out[child.name] = [f"{len(bad)} WARNING/ERROR lines of {len(text)}", *bad[-lines:]]
    return out


def summarize(trials: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out = {}
    for sig_name, ts in trials.items():

        def worst(key: str, ts: list[dict[str, Any]] = ts) -> float | None:
            values = [t[key] for t in ts if t[key] is not None]
            return max(values) if values else None

        out[sig_name] = {
            "trials": len(ts),
            "false_dead_total": sum(t["false_dead"] for t in ts),
            "new_leader_after_s_max": worst("new_leader_after_s"),
            "all_reconnected_s_max": worst("all_reconnected_s"),
            "self_fenced_nodes_max": worst("self_fenced_nodes"),
            "passed": all(t["false_dead"] == 0 and t["reconnected"] == t["nodes"] for t in ts),
        }
    return out


def table(trials: dict[str, list[dict[str, Any]]]) -> str:
    def s(v: float | None, digits: int = 2) -> str:
        return "-" if v is None else f"{v:.{digits}f}"

    labels = {"sigkill": "SIGKILL (lease expires)", "sigterm": "SIGTERM (resigns)"}
    rows = [
        "| signal to the leader | nodes | false DEAD | DEAD-verdict metric (new leader) "
        "| nodes seen SUSPECT | new leader after (s) | first / median / all nodes "
        "reconnected (s) | nodes self-fenced | load avg | verdict |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for sig_name, ts in trials.items():
        for t in ts:
            ok = t["false_dead"] == 0 and t["reconnected"] == t["nodes"]
            rows.append(
                f"| {labels[sig_name]} | {t['nodes']:,} | **{t['false_dead']}** "
                f"| {s(t['dead_verdicts_metric_new_leader'], 0)} | {t['nodes_seen_suspect']} "
                f"| {s(t['new_leader_after_s'])} | {s(t['first_reconnect_s'])} / "
                f"{s(t['median_reconnect_s'])} / {s(t['all_reconnected_s'])} "
                f"| {t['self_fenced_nodes']} | {t['loadavg_at_signal']:.1f} "
                f"| {'ok' if ok else 'FAIL'} |"
            )
    return "\n".join(rows)


def readme(result: dict[str, Any], command: str) -> str:
    cfg = result["config"]
    control = result.get("control")
    tree = (
        f" plus {len(result['uncommitted_package_changes'])} uncommitted package files"
        if result.get("uncommitted_package_changes")
        else ""
    )
    if result.get("package_root", "") != str(SELF.parents[1]):
        tree = " (packages imported from a clean `git archive` export of it)"
    checked = ""
    lost = result.get("session_loops_ended") or {}
    if lost:
        phases = sorted(set(lost.values()))
        checked += (
            f"\n\n**{len(lost)} of {cfg['nodes']} agents' Session loops ended** while their "
            f"processes ran ({', '.join(phases)}): the agent's `agent-session` task finished "
            "(cancelled), so it never dials again, an agent defect this bench reports and does "
            'not hide. They were dropped from the fleet the later trials watch (the "nodes" '
            "column); `session_loops_ended` in the JSON lists them."
        )
    if control:
        checked += (
            f"\n\nControl (the counters are not blind): one worker SIGSTOPped for "
            f"{control['stopped_s']:g} s with no leader change; of its "
            f"{control['stopped_nodes']} nodes the DEAD-verdict metric counted "
            f"{control['dead_verdicts_metric']:g}, `ListNodes` showed {control['nodes_seen_dead']} "
            f"DEAD and NODE_DEAD events named {control['node_dead_events']}."
        )
    return f"""## No false DEAD across a leader change (`leader_change_bench.py`)

Issue 16 item 9. {cfg["nodes"]:,} real node agents (`NodeAgent`: Session loop, redirect
and `retry_after_ms` handling, self-fence, each with its own store and its own HTTP/2
connection) in {cfg["workers"]} processes, on 3 `lazarus coordinator` processes at their
defaults (heartbeat 0.5 s, dead_after 3 s, lease TTL 3 s) with {cfg["etcd_members"]}
etcd member(s) and Redis, all on 127.0.0.1 ({cfg["security"]}). The leader's pid gets
SIGKILL (its lease must expire) or SIGTERM (it resigns); every agent keeps running, so
any DEAD verdict is false. Watched for at least {cfg["window_s"]:g} s after the signal
(past the new leader's grace of `failover_reconnect_s` + `dead_after_s`) and until
{AFTER_RECONNECT_S:g} s after the last agent reconnected. False DEAD = the most of: the
new leader's `lazarus_failure_detection_seconds_count` delta, nodes `ListNodes` showed
DEAD (polled every {POLL_S:g} s and at the end), nodes named by NODE_DEAD events
(`WatchEvents`). Nodes seen SUSPECT: by `ListNodes` or NODE_SUSPECTED events (a
suspicion moves no task). "Reconnected" = the agent's first Welcome from the new term
(client side, every agent). The killed replica is restarted and the fleet settles between trials.

Measured {result["date"]} at commit {result["commit"]}{tree} on {result["machine_cpus"]} cores
shared with other work (load average in the table); `{command}`; every figure in
`bench/results/leader_change.json`.

{table(result["trials"])}

With SIGKILL every agent self-fences once (no HeartbeatAck within `fence_after` 2 s
while the dead leader's 3 s lease runs out), by design: it pauses its tasks, it is
not a DEAD verdict, and it reconnects to the new leader.{checked}
"""


def _package_tree() -> dict[str, Any]:
    """Where the measured packages were imported from, and their uncommitted changes.

    A clean export of a commit (``git archive`` on ``PYTHONPATH``) measures that
    commit alone when the checkout holds others' unfinished work.
    """
    import node_agent

    root = Path(node_agent.__file__).resolve().parents[1]
    changed: list[str] = []
    if root == SELF.parents[1]:
        changed = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--",
                "lazarus",
                "coordinator",
                "node_agent",
                "reconcile",
                "proto",
            ],
            capture_output=True,
            text=True,
            check=False,
            cwd=root,
        ).stdout.splitlines()
    return {"package_root": str(root), "uncommitted_package_changes": changed}


def _sigterm_as_interrupt(signum: int, frame: types.FrameType | None) -> None:
    raise KeyboardInterrupt(f"received signal {signum}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
        asyncio.run(worker_main(json.loads(argv[1])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=500, help="node agents (<= 1000)")
    parser.add_argument("--trials", type=int, default=1, help="leader changes per signal")
    parser.add_argument("--workers", type=int, default=4, help="agent processes")
    parser.add_argument("--etcd-members", type=int, default=1, choices=(1, 3))
    parser.add_argument("--window-s", type=float, default=WINDOW_S, help="shortest window")
    parser.add_argument("--tls", action="store_true", help="mutual TLS (the default of a cluster)")
    parser.add_argument(
        "--control",
        action="store_true",
        help="then SIGSTOP one worker past dead_after: the counters must see its nodes DEAD",
    )
    parser.add_argument("--quick", action="store_true", help="50 nodes, 2 workers, no README")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results path")
    parser.add_argument("--no-readme", action="store_true", help="do not rewrite bench/README.md")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.workers, args.trials = 50, 2, 1
        args.window_s = min(args.window_s, QUICK_WINDOW_S)
    if not 1 <= args.nodes <= 1000:
        parser.error("--nodes: 1..1000 (one ListNodes page)")
    args.workers = max(1, min(args.workers, args.nodes))
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)

    command = "flock /tmp/lazarus-heavy.lock .venv/bin/python bench/leader_change_bench.py" + (
        f" {' '.join(argv)}" if argv else ""
    )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
        cwd=SELF.parent,
    ).stdout.strip()
    tree = _package_tree()
    started = time.time()
    load_before = os.getloadavg()
    run_dir = Path(tempfile.mkdtemp(prefix="lazarus-lcbench-"))
    ok = False
    try:
        out = asyncio.run(bench(args, run_dir))
        ok = True
    finally:
        if ok:
            shutil.rmtree(run_dir, ignore_errors=True)
        else:
            print(f"logs kept in {run_dir}", file=sys.stderr)
    result = {
        "benchmark": "leader_change_false_dead",
        "date": today(),
        "commit": commit,
        "command": command,
        **tree,
        "started_at_unix_s": round(started),
        "elapsed_s": round(time.time() - started, 1),
        "machine_cpus": os.cpu_count(),
        "python": platform.python_version(),
        "config": {
            "nodes": args.nodes,
            "workers": args.workers,
            "trials_per_signal": args.trials,
            "etcd_members": args.etcd_members,
            "window_s": args.window_s,
            "after_reconnect_s": AFTER_RECONNECT_S,
            "poll_s": POLL_S,
            "settle_s": SETTLE_S,
            "security": "mutual TLS" if args.tls else "--auth none",
            "coordinator_settings": "defaults: heartbeat 0.5 s, dead_after 3 s, "
            "fence_after 2 s, lease TTL 3 s, failover_reconnect 7 s",
        },
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "summary": summarize(out["trials"]),
        **out,
    }
    write_json(args.out, result)
    print(f"\nwrote {args.out}")
    print(table(out["trials"]))
    if not (args.quick or args.no_readme):
        write_section("leader-change", readme(result, command))
    return 0 if all(m["passed"] for m in result["summary"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
