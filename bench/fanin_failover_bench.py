"""Fan-in (issue 20): a leader crash with many nodes attached, measured from the nodes.

Three real ``lazarus coordinator`` replicas (``--auth none``, default timings:
0.5 s heartbeats; with ``--fan-in`` its profile, fence 5 s / dead 6 s) on one
local etcd. Simulated node agents, run by three load generator processes
(this script with ``--worker``), follow the real agent's Session rules: Hello
until Welcome; a heartbeat every 0.5 s; a ``Reattach`` answered with a Hello
on the same stream; a stream that ends, or a NotLeader, answered by dialling
the next replica of their list after a short random backoff (the list starts
at the replica the generator was given, so nodes spread over the replicas as a
Kubernetes Service spreads them; the order is the agent's own
``node_agent.core.dial.DialPlan``, which skips a replica it could not reach for
3 s); and the agent's fence rule: a node *would
have self-fenced* when no heartbeat it sent in the last ``h + f - lead``
seconds was acked (``f`` from the Welcome, ``lead`` 0.5 s), which pauses its
tasks.

The run: attach ``--nodes`` nodes, settle, hold ``--hold-s`` seconds, then
signal a replica (``--faults``: ``kill-leader``, ``term-leader``,
``kill-follower``) and watch ``--after-s`` seconds.
Reported, per placement (``--fan-in`` on and off): nodes that would have
self-fenced, Sessions dropped (streams that ended) on the surviving replicas
and on the killed one, Reattaches, DEAD and SUSPECT verdicts by the new leader
(every node stays alive, so each is false), ack p50 / p99 in the window after
the kill, and the time until every node was acked again.

Results: ``bench/results/fanin-failover.json`` and the "fanin-failover"
section of ``bench/README.md``. Every process started here is stopped.

Run: ``.venv/bin/python bench/fanin_failover_bench.py [--nodes N,N] [--faults F,F]``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import json
import math
import random
import shutil
import signal
import sys
import tempfile
import time
import types
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import RESULTS_DIR, measured_commit, today, write_json, write_section
from heartbeat_bench import WorkerProcess

from lazarus.v1 import agent_pb2, records_pb2
from lazarus_dev.devcluster import LocalCluster, json_log_entries
from node_agent.core.dial import DialEnd, DialPlan

RESULTS = RESULTS_DIR / "fanin-failover.json"
FAULTS = {
    "kill-leader": ("kill", "leader"),
    "term-leader": ("term", "leader"),
    "kill-follower": ("kill", "follower"),
}
"""Fault name -> (signal, which replica)."""
SELF = Path(__file__).resolve()
SESSION_METHOD = "/lazarus.v1.AgentService/Session"
CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0), ("grpc.use_local_subchannel_pool", 1)]
FENCE_LEAD_S = 0.5
HELLO_CONCURRENCY = 16
SETTLE_S = 3.0


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))]


# ---------------------------------------------------------------- load generator


class FanNode:
    """One simulated agent: the real agent's Session rules, no tasks."""

    def __init__(self, stats: Stats, addresses: list[str], node_id: str) -> None:
        self.stats = stats
        self.plan = DialPlan(addresses)
        self.node_id = node_id
        self.incarnation = uuid.uuid4().hex[:12]
        self.channel: grpc.aio.Channel | None = None
        self.call: Any = None
        self.seq = 0
        self.sent: dict[int, float] = {}
        self.interval_s = 0.5
        self.fence_s = 2.0
        self.acked_send_s = 0.0  # send time of the newest acked beat (or the Hello)
        self.open = False
        self.fenced = False
        self.task: asyncio.Task[None] | None = None
        self.dialled = ""
        self.hello_sent_s = 0.0
        self.stats_welcomed = False
        self.writing = asyncio.Lock()  # one write at a time on a call (grpc.aio's rule)

    async def _dial(self) -> None:
        if self.channel is not None:
            self.call.cancel()
            await self.channel.close()
        address = self.plan.next(time.monotonic()).address
        self.dialled = address
        self.channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.call = self.channel.stream_stream(
            SESSION_METHOD,
            request_serializer=agent_pb2.AgentMessage.SerializeToString,
            response_deserializer=agent_pb2.CoordinatorMessage.FromString,
        )()

    async def _hello(self) -> None:
        self.hello_sent_s = time.monotonic()
        async with self.writing:
            await self.call.write(
                agent_pb2.AgentMessage(
                    hello=agent_pb2.Hello(
                        node_id=self.node_id,
                        incarnation=self.incarnation,
                        capacity=records_pb2.NodeCapacity(slots=1),
                    )
                )
            )

    async def connect(self, gate: asyncio.Semaphore | None = None) -> None:
        """Dial until a Welcome: the next replica after a failure, NotLeader's delay honoured."""
        while True:
            async with gate if gate is not None else contextlib.nullcontext():
                await self._dial()
                delay = random.uniform(0.05, 0.2)
                end: DialEnd | None = None  # what the agent's shell reports: judged by the plan
                try:
                    await self._hello()
                    async with asyncio.timeout(10):
                        reply = await self.call.read()
                except grpc.aio.AioRpcError as exc:
                    reply, end = grpc.aio.EOF, DialEnd(status=exc.code().name)
                except TimeoutError:
                    reply, end = grpc.aio.EOF, DialEnd(silent=True)
                except asyncio.InvalidStateError:
                    reply, end = grpc.aio.EOF, DialEnd(broken=True)
                now = time.monotonic()
                if end is None:  # ended without an error: by the status it carries, if any
                    end = DialEnd()
                    if reply is grpc.aio.EOF:
                        with contextlib.suppress(Exception):
                            end = DialEnd(status=(await self.call.code()).name)
                if reply is not grpc.aio.EOF and reply.WhichOneof("body") == "welcome":
                    self.plan.ended(self.dialled, now, DialEnd(welcomed=True))
                    self._welcomed(reply.welcome)
                    self._attempt("welcome")
                    return
                if reply is not grpc.aio.EOF and reply.WhichOneof("body") == "not_leader":
                    retry_after_s = reply.not_leader.retry_after_ms / 1000.0
                    redirect = reply.not_leader.leader_address  # "": the next one
                    if redirect:
                        self.plan.redirect(redirect)
                    pause = self.plan.ended(
                        self.dialled,
                        now,
                        DialEnd(not_leader=True, retry_after_s=retry_after_s),
                    )
                    delay = max(delay, pause or 0.0)
                    self._attempt("deferred" if redirect else "no leader")
                else:
                    self.plan.ended(self.dialled, now, end)
                    self._attempt("failed")
            await asyncio.sleep(delay)

    def _attempt(self, outcome: str) -> None:
        now = time.monotonic()
        self.stats.attempts.append((time.time(), outcome, self.dialled, now - self.hello_sent_s))

    def _welcomed(self, welcome: Any) -> None:
        self.stats_welcomed = True
        self.open = True
        self.fenced = False
        self.interval_s = welcome.heartbeat_interval_ms / 1000.0 or self.interval_s
        self.fence_s = welcome.fence_after_ms / 1000.0 or self.fence_s
        self.acked_send_s = self.hello_sent_s
        self.stats.welcomes += 1
        self.stats.welcomed.append((time.time(), self.node_id))

    def check_fence(self, now: float) -> None:
        """The agent's rule: pause at the newest acked send + h + f - lead."""
        # As the agent: from its first Welcome on, open Session or not, until a new Welcome.
        deadline = self.acked_send_s + self.interval_s + self.fence_s - FENCE_LEAD_S
        if self.stats_welcomed and not self.fenced and now > deadline:
            self.fenced = True
            self.stats.fenced.add(self.node_id)

    async def run(self) -> None:
        sender = asyncio.create_task(self._send())
        try:
            while True:
                reason = ""
                code: grpc.StatusCode | None = None
                try:
                    reply = await self.call.read()
                except grpc.aio.AioRpcError as exc:
                    reply, reason, code = (
                        grpc.aio.EOF,
                        f"{exc.code().name}: {exc.details()}",
                        exc.code(),
                    )
                if reply is grpc.aio.EOF:
                    self.open = False
                    if not reason:
                        with contextlib.suppress(Exception):
                            code = await self.call.code()
                            reason = f"{code.name}: {await self.call.details()}"
                    self.stats.ends.append((time.time(), self.dialled, reason))
                    # As the agent: a transport failure holds the replica off.
                    self.plan.ended(
                        self.dialled,
                        time.monotonic(),
                        DialEnd(welcomed=True, status=code.name if code is not None else ""),
                    )
                    await asyncio.sleep(random.uniform(0.05, 0.2))
                    await self.connect()
                    continue
                body = reply.WhichOneof("body")
                if body == "heartbeat_ack" and self.open:
                    # As the agent: an ack counts only on a Welcomed Session
                    # (not between a Reattach and the next Welcome).
                    sent = self.sent.pop(reply.heartbeat_ack.seq, None)
                    if sent is not None:
                        now = time.monotonic()
                        self.stats.latencies.append((time.time(), (now - sent) * 1000.0))
                        self.acked_send_s = max(self.acked_send_s, sent)
                elif body == "reattach":
                    self.open = False
                    self.stats.reattaches += 1
                    with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                        await self._hello()
                elif body == "welcome":
                    self._welcomed(reply.welcome)
                elif body == "not_leader":
                    self.open = False
        finally:
            sender.cancel()

    async def _send(self) -> None:
        await asyncio.sleep(random.uniform(0.0, self.interval_s))
        while True:
            if self.open:
                self.seq += 1
                self.sent[self.seq] = time.monotonic()
                with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                    async with self.writing:
                        await self.call.write(
                            agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=self.seq))
                        )
                while len(self.sent) > 64:
                    self.sent.pop(next(iter(self.sent)))
            await asyncio.sleep(self.interval_s + random.uniform(0.0, 0.02))

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
        if self.channel is not None:
            self.call.cancel()
            await self.channel.close()


class Stats:
    def __init__(self) -> None:
        self.latencies: list[tuple[float, float]] = []
        self.ends: list[tuple[float, str, str]] = []  # when, the replica dialled, its status
        self.fenced: set[str] = set()
        self.reattaches = 0
        self.welcomes = 0
        self.welcomed: list[tuple[float, str]] = []  # (wall time, node) of each Welcome
        # (wall time, outcome, ...) of each Hello sent by dialling: welcome, deferred
        # (NotLeader naming the replica: admission control), no leader, failed
        self.attempts: list[tuple[float, str, str, float]] = []  # + replica, Hello to reply s

    def take(self) -> dict[str, Any]:
        out = {
            "welcomed": self.welcomed,
            "latencies": self.latencies,
            "ends": self.ends,
            "fenced": sorted(self.fenced),
            "reattaches": self.reattaches,
            "welcomes": self.welcomes,
            "attempts": self.attempts,
        }
        self.__init__()  # type: ignore[misc]
        return out


async def worker_main(addresses: list[str], prefix: str) -> None:
    """Serve JSON commands on stdin: add <count>, take, stop; one JSON line each."""
    stats = Stats()
    nodes: list[FanNode] = []
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    async def fence_check() -> None:
        while True:
            now = time.monotonic()
            for node in nodes:
                node.check_fence(now)
            await asyncio.sleep(0.05)

    checker = asyncio.create_task(fence_check())

    def reply(message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    try:
        while line := await reader.readline():
            command = json.loads(line)
            if command["op"] == "add":
                gate = asyncio.Semaphore(HELLO_CONCURRENCY)
                batch = [
                    FanNode(stats, addresses, f"{prefix}-{len(nodes) + i:05d}")
                    for i in range(command["count"])
                ]
                await asyncio.gather(*(n.connect(gate) for n in batch))
                for n in batch:
                    n.task = asyncio.create_task(n.run())
                nodes.extend(batch)
                reply({"ok": True, "nodes": len(nodes)})
            elif command["op"] == "take":
                reply({"ok": True, **stats.take()})
            elif command["op"] == "stop":
                break
    finally:
        checker.cancel()
        await asyncio.gather(*(n.close() for n in nodes), return_exceptions=True)
        reply({"ok": True, "stopped": True})


# ---------------------------------------------------------------- orchestration


def _series(url: str, name: str, labels: str = "") -> float:
    with urllib.request.urlopen(url, timeout=5) as response:
        body = response.read().decode()
    total = 0.0
    for line in body.splitlines():
        if line.startswith("#"):
            continue
        sample, _, value = line.rpartition(" ")
        if sample.split("{", 1)[0] == name and labels in sample:
            total += float(value)
    return total


async def one_run(args: argparse.Namespace, fan_in: bool, nodes: int, fault: str) -> dict[str, Any]:
    """One cluster, ``nodes`` simulated agents, one ``fault`` (``kill-leader``, ...)."""
    sig, victim = FAULTS[fault]
    with tempfile.TemporaryDirectory(prefix="fanin-failover-") as tmp:
        cluster = LocalCluster(
            Path(tmp),
            coordinators=3,
            agents=0,
            cluster=f"fifo-{uuid.uuid4().hex[:6]}",
            tls=False,
            durable_redis=False,
            coordinator_args=["--fan-in"] if fan_in else [],
        )
        cluster.start()
        workers: list[WorkerProcess] = []
        try:
            await cluster.ready(40)
            leader, _ = await cluster.leader()
            addresses = cluster.coordinator_addresses
            for k in range(3):
                rotated = addresses[k:] + addresses[:k]
                workers.append(
                    await WorkerProcess.spawn_script(SELF, "--worker", ",".join(rotated), f"w{k}")
                )
            share = nodes // 3
            started = time.monotonic()
            await asyncio.gather(*(w.ask("add", count=share) for w in workers))
            attach_s = time.monotonic() - started
            await asyncio.sleep(SETTLE_S)
            await asyncio.gather(*(w.ask("take") for w in workers))
            await asyncio.sleep(args.hold_s)
            before = await asyncio.gather(*(w.ask("take") for w in workers))
            victim_index = leader if victim == "leader" else (leader + 1) % 3
            survivors = [i for i in range(3) if i != victim_index]
            killed_address = addresses[victim_index]
            dead_before = {
                i: _series(
                    cluster.coordinator_metrics[i], "lazarus_failure_detection_seconds_count"
                )
                for i in survivors
            }
            killed_at = time.time()
            victim = cluster.coordinators[victim_index]
            if sig == "kill":
                victim.kill()
            else:
                victim.signal(signal.SIGTERM)
            await asyncio.sleep(args.after_s)
            after = await asyncio.gather(*(w.ask("take") for w in workers))
            new_leader, _ = await cluster.leader()
            metrics = cluster.coordinator_metrics[new_leader]
            dead = sum(
                _series(cluster.coordinator_metrics[i], "lazarus_failure_detection_seconds_count")
                - dead_before[i]
                for i in survivors
            )
            not_alive = {
                state: _series(metrics, "lazarus_nodes", f'state="{state}"')
                for state in ("suspect", "dead")
            }
            # New Sessions the survivors answered NotLeader, by reason (whole run).
            sent_away = {
                reason: sum(
                    _series(
                        cluster.coordinator_metrics[i],
                        "lazarus_forward_sessions_sent_away_total",
                        f'reason="{reason}"',
                    )
                    for i in survivors
                )
                for reason in ("no_leader", "leader_gone", "link_busy")
            }
        finally:
            for w in workers:
                await w.stop()
            await asyncio.to_thread(cluster.stop)
        timeline = failover_timeline(
            [Path(tmp) / f"coordinator-{i}.log" for i in survivors],
            killed_at,
            killed_at + args.after_s,
        )
        if args.keep_logs is not None:
            mode = "fanin" if fan_in else "direct"
            kept = args.keep_logs / f"{fault}-{nodes}-{mode}-{killed_at:.3f}"
            await asyncio.to_thread(_keep_logs, Path(tmp), kept)
    ends = [e for a in after for e in a["ends"]]
    on_killed = sum(1 for _, address, _ in ends if address == killed_address)
    window = [ms for a in after for t, ms in a["latencies"] if t >= killed_at]
    last_gap = 0.0
    acked_times = sorted(t for a in after for t, _ in a["latencies"])
    for a, b in itertools.pairwise(acked_times):
        last_gap = max(last_gap, b - a)
    # When each of the victim's nodes had its next Welcome, seconds after the signal.
    first_welcome: dict[str, float] = {}
    for t, node in after[victim_index]["welcomed"]:
        if t >= killed_at:
            first_welcome[node] = min(first_welcome.get(node, math.inf), t - killed_at)
    rewelcomed = sorted(first_welcome.values())
    return {
        "fan_in": fan_in,
        "nodes": nodes,
        "fault": fault,
        # The victim's nodes (worker k's began on replica k): their next Welcome
        # after the signal, seconds (p50, p90, max; fence at about 4.5-5 s).
        # What the victim's nodes' Hellos got after the signal (redials, not Reattaches).
        "victims_hellos": dict(
            collections.Counter(a[1] for a in after[victim_index]["attempts"] if a[0] >= killed_at)
        ),
        # How long each kind of answer took (Hello to reply, p50 / max, seconds).
        "victims_hello_s": {
            outcome: [round(_percentile(rtts, 0.5), 3), round(max(rtts), 3)]
            for outcome in ("welcome", "no leader", "failed", "deferred")
            if (
                rtts := [
                    a[3]
                    for a in after[victim_index]["attempts"]
                    if a[0] >= killed_at and a[1] == outcome
                ]
            )
        },
        # Their Welcomes: by the replica that gave it (next leader or follower), with
        # the Hello's round trip p50 / max, seconds.
        "victims_welcomes_by": welcomes_by(
            [a for a in after[victim_index]["attempts"] if a[0] >= killed_at and a[1] == "welcome"],
            addresses[new_leader],
        ),
        "victims_welcome_s": [
            _percentile(rewelcomed, 0.5),
            _percentile(rewelcomed, 0.9),
            rewelcomed[-1] if rewelcomed else float("nan"),
        ],
        "attach_s": attach_s,
        "ack_p99_before_ms": _percentile([ms for b in before for _, ms in b["latencies"]], 0.99),
        "nodes_fenced": len({n for a in after for n in a["fenced"]}),
        # Worker k's nodes began on replica k: those of the killed leader had to redial.
        "fenced_of_the_victims_nodes": len(after[victim_index]["fenced"]),
        "fenced_of_the_other_nodes": sum(
            len(a["fenced"]) for k, a in enumerate(after) if k != victim_index
        ),
        "sessions_dropped_on_survivors": len(ends) - on_killed,
        # Why they ended (the status each agent's stream ended with), at most 20.
        "survivor_end_reasons": [
            reason for _, address, reason in ends if address != killed_address
        ][:20],
        "sessions_dropped_on_victim": on_killed,
        "reattaches": sum(a["reattaches"] for a in after),
        "dead_verdicts": dead,
        "suspect_or_dead_at_end": not_alive["suspect"] + not_alive["dead"],
        "ack_p50_after_ms": _percentile(window, 0.5),
        "ack_p99_after_ms": _percentile(window, 0.99),
        "longest_ack_silence_s": last_gap,
        "timeline_s": timeline,
        "sessions_sent_away": sent_away,
    }


TIMELINE = {
    # what a surviving replica logs -> the timeline's name for its first time after the kill
    "the leader's election key was seen gone": "key_seen_gone",
    "leading: key=": "elected",
    "leading: term=": "leading",
    "forwarding Sessions to the leader": "linked",
}


def _keep_logs(run_dir: Path, kept: Path) -> None:
    kept.mkdir(parents=True, exist_ok=True)
    for log in run_dir.glob("*.log"):
        shutil.copy(log, kept / log.name)
    print(f"logs kept in {kept}", file=sys.stderr)


def welcomes_by(welcomes: list[list[Any]], leader_address: str) -> dict[str, list[float]]:
    """Welcomes by who gave them: count, Hello round trip p50 and max (seconds)."""
    out: dict[str, list[float]] = {}
    for role in ("leader", "follower"):
        rtts = sorted(a[3] for a in welcomes if (a[2] == leader_address) == (role == "leader"))
        if rtts:
            out[role] = [len(rtts), round(_percentile(rtts, 0.5), 3), round(rtts[-1], 3)]
    return out


def failover_timeline(logs: list[Path], killed_at: float, until: float) -> dict[str, float]:
    """Seconds from the kill to each step of the takeover, from the survivors' JSON logs.

    ``key_seen_gone``: a follower's read first showed the old leader's key deleted
    (its lease expired); ``elected``: the next leader's campaign won; ``leading``:
    its runtime loaded the state and leads; ``linked``: a follower's Forward
    stream to it was accepted. Each is the earliest over the survivors, until
    ``until`` (the end of the watch: not the cluster's shutdown); a step no log
    shows is absent.
    """
    first: dict[str, float] = {}
    for ts, entry, _ in json_log_entries(logs, since=killed_at, until=until):
        msg = str(entry.get("msg", ""))
        for needle, name in TIMELINE.items():
            if msg.startswith(needle):
                first[name] = min(first.get(name, math.inf), ts - killed_at)
    return {name: round(first[name], 3) for name in TIMELINE.values() if name in first}


def readme(result: dict[str, Any]) -> str:
    rows = []
    for r in result["runs"]:
        rows.append(
            f"| {'on' if r['fan_in'] else 'off'} | {r['nodes']:,} | "
            f"{r['fault']} | "
            f"**{r['nodes_fenced']}** | {r['sessions_dropped_on_survivors']} | "
            f"{r['sessions_dropped_on_victim']} | {r['reattaches']} | "
            f"**{r['dead_verdicts']:.0f}** | {r['ack_p50_after_ms']:.1f} / "
            f"{r['ack_p99_after_ms']:.1f} | {r['longest_ack_silence_s']:.2f} |"
        )
    header = (
        "| fan-in | nodes | fault | nodes that would self-fence | Sessions dropped on "
        "survivors | on the victim | Reattaches | false DEAD | ack p50 / p99 ms after "
        "| longest ack silence s |\n|---|---:|---|---:|---:|---:|---:|---:|---|---:|"
    )
    table = "\n".join(rows)
    return f"""## Fan-in: a leader crash under load (`fanin_failover_bench.py`)

Commit `{result["commit"]}` measured {result["date"]} on 2 cores. Three `lazarus
coordinator` replicas (default timings; with fan-in its profile: fence 5 s, dead
6 s), simulated agents spread over the replicas by three load generators
(heartbeat 0.5 s, the agent's Session and fence rules), a replica signalled
after {result["config"]["hold_s"]:.0f} s and watched for {result["config"]["after_s"]:.0f} s.
Everything shares the 2 cores; every node stays alive, so any DEAD verdict is false.
`.venv/bin/python bench/fanin_failover_bench.py`; raw figures in
`bench/results/fanin-failover.json`.

{header}
{table}
"""


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    runs = []
    for nodes in args.nodes:
        for fault in args.faults:
            # Fan-in off is the baseline of the leader crash only (followers hold nothing).
            modes = (False, True) if args.compare and fault == "kill-leader" else (True,)
            for fan_in in modes:
                run = await one_run(args, fan_in, nodes, fault)
                print(json.dumps(run), flush=True)
                runs.append(run)
    return {
        "commit": measured_commit(),
        "date": today(),
        "config": {"nodes": args.nodes, "hold_s": args.hold_s, "after_s": args.after_s},
        "runs": runs,
    }


def _sigterm_as_interrupt(signum: int, frame: types.FrameType | None) -> None:
    raise KeyboardInterrupt(f"received signal {signum}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        asyncio.run(worker_main(argv[1].split(","), argv[2]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--nodes",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[600],
        help="simulated nodes per run, comma-separated (each split over 3 generators)",
    )
    parser.add_argument(
        "--faults",
        type=lambda v: v.split(","),
        default=["kill-leader"],
        help=f"comma-separated, of {', '.join(FAULTS)}",
    )
    parser.add_argument("--hold-s", type=float, default=10.0, help="seconds before the kill")
    parser.add_argument("--after-s", type=float, default=25.0, help="seconds watched after")
    parser.add_argument(
        "--no-compare", dest="compare", action="store_false", help="fan-in only (no baseline)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results path")
    parser.add_argument("--no-readme", action="store_true", help="do not rewrite bench/README.md")
    parser.add_argument(
        "--keep-logs",
        type=Path,
        default=None,
        metavar="DIR",
        help="copy each run's replica logs (JSON lines) to a directory under DIR",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="30 nodes, kill-leader off and on, 3 s + 10 s, no README (a smoke run)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.faults, args.compare = [30], ["kill-leader"], True
        args.hold_s, args.after_s, args.no_readme = 3.0, 10.0, True
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)  # stop the cluster on SIGTERM too
    result = asyncio.run(bench(args))
    write_json(args.out, result)
    if not args.no_readme:
        write_section("fanin-failover", readme(result))
    print(readme(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
