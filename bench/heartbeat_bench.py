"""How many heartbeating nodes one coordinator leader sustains.

One real ``lazarus coordinator`` process (its defaults, except the heartbeat
period: ``--heartbeat-interval-s 1`` with ``--dead-after-s 6 --fence-after-s 4``,
the default 0.5 / 3 / 2 scaled to 1 s so that ``heartbeat_interval_s +
fence_after_s < dead_after_s`` holds as ``CoreSettings`` requires) on a real
etcd, both on 127.0.0.1. Simulated node agents are raw ``AgentService.Session``
streams (Hello, then one Heartbeat per second each, random phase, small
jitter), each on its own HTTP/2 connection, run by ``--workers`` load generator
processes (this script with ``--worker``) so they never share the leader's
event loop.

The node count ramps (100, 200, 400, … doubling up to ``--max-nodes``); nodes of
earlier steps keep heartbeating, so no node ever leaves and any SUSPECT or DEAD
verdict is false. The ramp stops at the first failing step; then a second
ramp on a fresh coordinator (new cluster name, same etcd) tries three steps
evenly between the last passing and the first failing count. Each step adds its
nodes, waits ``SETTLE_S``, then is held ``--step-s`` seconds and records:

- heartbeat ack round trip p50 / p99 / max, client side (send -> ack read);
- the leader process's CPU use (user + system, % of one core);
- the generators' own event-loop lag p99 (if that is high, the generator, not
  the leader, is the bottleneck);
- SUSPECT / DEAD verdicts: nodes whose record changed state since their Hello
  (``ListNodes``: ``state_changed_at_unix_ms != registered_at_unix_ms``),
  non-ALIVE nodes sampled by ``GetClusterStatus`` every second, the leader's
  ``lazarus_failure_detection_seconds_count`` (one per DEAD verdict), and
  streams that ended.

The answer is the largest step with p99 < 100 ms and no false DEAD (and no
stream lost). Results: ``bench/results/heartbeat.json`` and the "heartbeat"
section of ``bench/README.md``. Every process started here is stopped by pid at
the end.

With ``--tls`` the coordinator runs with mutual TLS and the authorization
policy (its default) and every simulated node holds its own node
certificate; without it, ``--auth none``. ``--compare-tls`` holds the same
fixed steps once in each mode, on fresh coordinators, and records the cost of
TLS per heartbeat (leader CPU per acked heartbeat, ack latency) beside the
plaintext figure: ``bench/results/heartbeat-tls.json`` and the "heartbeat-tls"
section of ``bench/README.md``.

Run: ``.venv/bin/python bench/heartbeat_bench.py [--max-nodes N] [--step-s S] [--quick]
[--tls | --compare-tls]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import RESULTS_DIR, measured_commit, today, write_json, write_section

from lazarus.tls import ClientTls, IdentityKind
from lazarus.v1 import agent_pb2, coordinator_pb2, coordinator_pb2_grpc, records_pb2
from lazarus_dev.devcluster import DevCertificates
from lazarus_dev.localservers import EtcdServer, free_loopback_ports

RESULTS = RESULTS_DIR / "heartbeat.json"
OVERLOAD_RESULTS = RESULTS_DIR / "heartbeat-overload.json"
TLS_RESULTS = RESULTS_DIR / "heartbeat-tls.json"
LAZARUS = Path(sys.executable).parent / "lazarus"
SESSION_METHOD = "/lazarus.v1.AgentService/Session"
SELF = Path(__file__).resolve()

HEARTBEAT_INTERVAL_S = 1.0
DEAD_AFTER_S = 6.0
FENCE_AFTER_S = 4.0
P99_LIMIT_MS = 100.0
JITTER_S = 0.02
"""Each heartbeat is sent up to this much after its slot (uniform)."""
HELLO_CONCURRENCY = 8
"""Hellos a worker has in flight at once while adding nodes (a rolling start)."""
SETTLE_S = 2.0
"""Pause after adding nodes before a step's measurement starts."""
HELLO_DEADLINE_S = 20.0
"""How long a simulated node keeps retrying a deferred Hello, seconds."""
STARTUP_S = 30.0
# Loopback only: never route through a proxy from the environment.
CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0), ("grpc.use_local_subchannel_pool", 1)]


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    idx = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[idx]


# ---------------------------------------------------------------- load generator (worker)


class SimNode:
    """One simulated node agent: a Session stream, a sender and a reader task."""

    def __init__(self, worker: Worker, address: str, node_id: str) -> None:
        self.worker = worker
        self.node_id = node_id
        tls = ClientTls()
        if worker.certs is not None:  # mTLS: this node's own certificate
            tls = worker.certs.client_tls(IdentityKind.NODE, node_id)
        self.channel = tls.aio_channel(address, CHANNEL_OPTIONS)
        self.call: Any = self.channel.stream_stream(
            SESSION_METHOD,
            request_serializer=agent_pb2.AgentMessage.SerializeToString,
            response_deserializer=agent_pb2.CoordinatorMessage.FromString,
        )()
        self.seq = 0
        self.deferred_only = True  # every answer to its Hellos so far was a deferral
        self.sent: dict[int, float] = {}
        self.tasks: list[asyncio.Task[None]] = []

    def _open(self) -> Any:
        return self.channel.stream_stream(
            SESSION_METHOD,
            request_serializer=agent_pb2.AgentMessage.SerializeToString,
            response_deserializer=agent_pb2.CoordinatorMessage.FromString,
        )()

    async def hello(self, gate: asyncio.Semaphore | None = None) -> None:
        """Hello until Welcome; a deferral (NotLeader naming this replica, with
        ``retry_after_ms``: admission past the Hello rate or Session cap) is
        honoured as the agent does: wait, then a new Session."""
        incarnation = uuid.uuid4().hex[:8]
        deadline = time.monotonic() + HELLO_DEADLINE_S
        while True:
            if gate is not None:
                await gate.acquire()
            try:
                await self._attempt_write(incarnation)
                retry_after_s, reply = await self._attempt_read()
            finally:
                if gate is not None:
                    gate.release()
            if reply is not grpc.aio.EOF and reply.WhichOneof("body") == "welcome":
                return
            if reply is not grpc.aio.EOF and reply.WhichOneof("body") == "not_leader":
                retry_after_s = max(0.05, reply.not_leader.retry_after_ms / 1000.0)
            if not retry_after_s:
                self.deferred_only = False
                raise RuntimeError(f"{self.node_id}: no Welcome: {reply!r}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.node_id}: still deferred after {HELLO_DEADLINE_S} s")
            self.worker.deferred += 1
            self.call.cancel()
            await asyncio.sleep(retry_after_s * random.uniform(1.0, 1.5))
            self.call = self._open()

    async def _attempt_write(self, incarnation: str) -> None:
        # A replica deferring Hellos may end the call before the write (grpc #36066):
        # the status is read next, as the agent does.
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await self._write_hello(incarnation)

    async def _write_hello(self, incarnation: str) -> None:
        await self.call.write(
            agent_pb2.AgentMessage(
                hello=agent_pb2.Hello(
                    node_id=self.node_id,
                    incarnation=incarnation,
                    capacity=records_pb2.NodeCapacity(slots=1),
                )
            )
        )

    async def _attempt_read(self) -> tuple[float, Any]:
        """(retry_after_s, reply): 0 and the reply, or a delay when deferred or unanswered."""
        try:
            async with asyncio.timeout(30):
                return 0.0, await self.call.read()
        except grpc.aio.AioRpcError as exc:
            # Deferred with an abort (UNAVAILABLE), or grpc-python failed the call
            # around the server's early end (#36066: INTERNAL "from Core"): retry.
            if exc.code() in (
                grpc.StatusCode.FAILED_PRECONDITION,
                grpc.StatusCode.INVALID_ARGUMENT,
            ):
                raise
            return 0.2, grpc.aio.EOF
        except TimeoutError:  # no answer at all in 30 s: a leader far past capacity
            return 1.0, grpc.aio.EOF

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._send()), asyncio.create_task(self._read())]

    async def _send(self) -> None:
        loop = asyncio.get_running_loop()
        slot = loop.time() + random.uniform(0.0, HEARTBEAT_INTERVAL_S)
        try:
            while True:
                await asyncio.sleep(max(0.0, slot + random.uniform(0.0, JITTER_S) - loop.time()))
                self.seq += 1
                self.sent[self.seq] = time.perf_counter()
                await self.call.write(
                    agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=self.seq))
                )
                self.worker.sent += 1
                slot += HEARTBEAT_INTERVAL_S
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.worker.ended(self.node_id, f"write: {exc!r}")

    async def _read(self) -> None:
        try:
            while True:
                reply = await self.call.read()
                if reply is grpc.aio.EOF:
                    self.worker.ended(self.node_id, f"EOF {await self.call.code()}")
                    return
                if reply.WhichOneof("body") != "heartbeat_ack":
                    continue
                sent = self.sent.pop(reply.heartbeat_ack.seq, None)
                if sent is not None:
                    self.worker.latencies.append((time.perf_counter() - sent) * 1000.0)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.worker.ended(self.node_id, f"read: {exc!r}")

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.call.cancel()
        await self.channel.close()


@dataclass
class Worker:
    """A load generator process: simulated nodes, commanded by JSON lines on stdin."""

    address: str
    prefix: str
    certs: DevCertificates | None = None
    nodes: list[SimNode] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    lags: list[float] = field(default_factory=list)
    ends: list[str] = field(default_factory=list)
    gone: set[str] = field(default_factory=set)
    sent: int = 0
    deferred: int = 0
    not_admitted: int = 0
    next_index: int = 0

    def ended(self, node_id: str, why: str) -> None:
        """A node's stream ended (counted once per node, by its reader or its writer)."""
        if node_id not in self.gone:
            self.gone.add(node_id)
            self.ends.append(f"{node_id}: {' '.join(why.split())[:300]}")

    async def add(self, count: int, concurrency: int = HELLO_CONCURRENCY) -> None:
        gate = asyncio.Semaphore(concurrency)
        first = self.next_index  # never reuse the id of a node kept out earlier
        self.next_index += count

        async def one(index: int) -> SimNode | None:
            node = SimNode(self, self.address, f"{self.prefix}-{index:05d}")
            try:
                await node.hello(gate)  # the gate bounds attempts in flight, not waits
            except RuntimeError:
                # Still deferred at HELLO_DEADLINE_S: a leader past capacity keeps
                # newcomers out (counted); one that answers otherwise fails the add.
                if not node.deferred_only:
                    raise
                self.not_admitted += 1
                await node.close()
                return None
            node.start()
            return node

        added = await asyncio.gather(*(one(first + i) for i in range(count)))
        self.nodes.extend(node for node in added if node is not None)

    async def lag_probe(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(0.05)
            self.lags.append((loop.time() - before - 0.05) * 1000.0)

    def take(self) -> dict[str, Any]:
        out = {
            "latencies_ms": self.latencies,
            "lags_ms": self.lags,
            "ends": self.ends,
            "sent": self.sent,
            "nodes": len(self.nodes),
        }
        self.latencies, self.lags, self.ends, self.sent = [], [], [], 0
        return out


async def worker_main(address: str, prefix: str, tls: list[str]) -> None:
    """Serve commands from stdin: add <n>, reset, take, stop; one JSON reply line each."""
    certs = DevCertificates(Path(tls[0]), tls[1]) if tls else None
    worker = Worker(address, prefix, certs)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    probe = asyncio.create_task(worker.lag_probe())

    def reply(message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    try:
        while line := await reader.readline():
            command = json.loads(line)
            op = command["op"]
            if op == "add":
                started = time.perf_counter()
                worker.deferred = worker.not_admitted = 0
                await worker.add(command["count"], command.get("concurrency", HELLO_CONCURRENCY))
                reply(
                    {
                        "ok": True,
                        "nodes": len(worker.nodes),
                        "s": time.perf_counter() - started,
                        "deferred": worker.deferred,
                        "not_admitted": worker.not_admitted,
                    }
                )
            elif op == "take":
                reply({"ok": True, **worker.take()})
            elif op == "stop":
                break
    finally:
        probe.cancel()
        await asyncio.gather(*(node.close() for node in worker.nodes), return_exceptions=True)
        reply({"ok": True, "stopped": True})


# ---------------------------------------------------------------- orchestration


class WorkerProcess:
    """Handle on one load generator subprocess: a JSON command line in, a JSON reply line out."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def spawn(
        cls, address: str, prefix: str, certs: DevCertificates | None = None
    ) -> WorkerProcess:
        """This script's ``--worker``: simulated nodes of one leader at ``address``."""
        tls = [str(certs.directory), certs.cluster] if certs is not None else []
        return await cls.spawn_script(SELF, "--worker", address, prefix, *tls)

    @classmethod
    async def spawn_script(cls, script: Path, *args: str) -> WorkerProcess:
        """``python <script> <args>`` speaking this protocol (other benches' workers)."""
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=1 << 28,
        )
        return cls(process)

    async def ask(self, op: str, timeout_s: float = 120.0, **kw: Any) -> dict[str, Any]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write((json.dumps({"op": op, **kw}) + "\n").encode())
        await self.process.stdin.drain()
        async with asyncio.timeout(timeout_s):
            line = await self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.process.pid} ended (exit {self.process.returncode})")
        return json.loads(line)  # type: ignore[no-any-return]

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self.ask("stop", timeout_s=20.0)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.process.wait(), 10.0)
        _kill(self.process.pid)
        with contextlib.suppress(Exception):
            await self.process.wait()


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@dataclass
class Coordinator:
    process: subprocess.Popen[bytes]
    address: str
    metrics_url: str
    cluster: str
    log_path: Path
    certs: DevCertificates | None = None

    @property
    def client_tls(self) -> ClientTls:
        """How the bench calls CoordinatorService (an admin certificate under mTLS)."""
        if self.certs is None:
            return ClientTls()
        return self.certs.client_tls(IdentityKind.CLIENT, "bench", "admin")


def start_coordinator(
    etcd_endpoint: str, workdir: Path, label: str, tls: bool = False
) -> Coordinator:
    """A real ``lazarus coordinator`` (defaults, 1 s heartbeats) in its own process."""
    grpc_port, metrics_port = free_loopback_ports(2)
    cluster = f"hbbench-{uuid.uuid4().hex[:8]}"
    log_path = workdir / f"coordinator-{label}.log"
    certs = DevCertificates(workdir / f"tls-{label}", cluster) if tls else None
    security = ["--auth", "none"]
    if certs is not None:
        cert, key = certs.member("bench-c1", [])
        security = [
            "--tls-cert-file",
            cert,
            "--tls-key-file",
            key,
            "--tls-client-ca-file",
            certs.ca_file,
        ]
    process = subprocess.Popen(
        [
            str(LAZARUS),
            "coordinator",
            "--cluster",
            cluster,
            "--member-id",
            "bench-c1",
            "--listen",
            f"127.0.0.1:{grpc_port}",
            "--metrics-listen",
            f"127.0.0.1:{metrics_port}",
            "--etcd-endpoint",
            etcd_endpoint,
            "--heartbeat-interval-s",
            str(HEARTBEAT_INTERVAL_S),
            "--dead-after-s",
            str(DEAD_AFTER_S),
            "--fence-after-s",
            str(FENCE_AFTER_S),
            *security,
        ],
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
    )
    return Coordinator(
        process,
        f"127.0.0.1:{grpc_port}",
        f"http://127.0.0.1:{metrics_port}/metrics",
        cluster,
        log_path,
        certs,
    )


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url, timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
    raise RuntimeError(f"{name} missing from {url}")


async def wait_leading(stub: Any, coordinator: Coordinator) -> None:
    async with asyncio.timeout(STARTUP_S):
        while True:
            if coordinator.process.poll() is not None:
                raise RuntimeError(f"coordinator exited; see {coordinator.log_path}")
            with contextlib.suppress(grpc.aio.AioRpcError):
                status = await stub.GetClusterStatus(
                    coordinator_pb2.GetClusterStatusRequest(), timeout=2
                )
                if status.leader_id == "bench-c1":
                    return
            await asyncio.sleep(0.2)


async def list_nodes(stub: Any) -> list[Any]:
    nodes: list[Any] = []
    token = ""
    while True:
        page = await stub.ListNodes(
            coordinator_pb2.ListNodesRequest(page_size=1000, page_token=token), timeout=10
        )
        nodes.extend(page.nodes)
        token = page.next_page_token
        if not token:
            return nodes


@dataclass
class Step:
    nodes: int
    seconds: float
    heartbeats_sent: int
    acks: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    generator_lag_p99_ms: float
    leader_cpu_pct: float
    add_s: float
    suspect_or_dead_nodes: int
    dead_verdicts: int
    leader_changes: int
    non_alive_samples: int
    streams_ended: int
    ok: bool
    failure: str
    ends: list[str]
    hellos_deferred: int = 0
    nodes_not_admitted: int = 0
    ramp: str = ""
    coordinator_log: list[str] = field(default_factory=list)


async def sample_states(stub: Any, stop: asyncio.Event, other_load: set[str]) -> int:
    """Non-ALIVE nodes summed over one GetClusterStatus per second until ``stop``.

    Also notes, every second, which other benchmarks run (into ``other_load``).
    """
    total = 0
    while not stop.is_set():
        other_load |= await asyncio.to_thread(_other_benchmarks)
        with contextlib.suppress(grpc.aio.AioRpcError):
            status = await stub.GetClusterStatus(
                coordinator_pb2.GetClusterStatusRequest(), timeout=5
            )
            total += sum(
                c.count for c in status.nodes_by_state if c.state != records_pb2.NODE_STATE_ALIVE
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
    return total


async def run_step(
    stub: Any,
    coordinator: Coordinator,
    workers: list[WorkerProcess],
    total: int,
    current: int,
    step_s: float,
    other_load: set[str],
    hello_concurrency: int = HELLO_CONCURRENCY,
) -> Step:
    add = total - current
    # Leader changes count from before the join: a burst of Hellos must not cost the lease.
    changes_before = await asyncio.to_thread(
        _metric, coordinator.metrics_url, "lazarus_leader_changes_total"
    )
    started = time.perf_counter()
    share = [
        add // len(workers) + (1 if i < add % len(workers) else 0) for i in range(len(workers))
    ]
    added = await asyncio.gather(
        *(
            w.ask(
                "add",
                count=n,
                concurrency=hello_concurrency,
                timeout_s=60 + HELLO_DEADLINE_S + n / 5,
            )
            for w, n in zip(workers, share, strict=True)
        )
    )
    add_s = time.perf_counter() - started
    deferred = sum(int(a.get("deferred", 0)) for a in added)
    not_admitted = sum(int(a.get("not_admitted", 0)) for a in added)
    total -= not_admitted  # the nodes the leader kept out are not part of this step
    await asyncio.sleep(SETTLE_S)
    dead_before = await asyncio.to_thread(
        _metric, coordinator.metrics_url, "lazarus_failure_detection_seconds_count"
    )
    await asyncio.gather(*(w.ask("take") for w in workers))  # discard the ramp-up
    cpu_before, wall_before = _cpu_s(coordinator.process.pid), time.perf_counter()
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_states(stub, stop, other_load))
    await asyncio.sleep(step_s)
    taken = await asyncio.gather(*(w.ask("take") for w in workers))
    cpu_pct = (
        100.0 * (_cpu_s(coordinator.process.pid) - cpu_before) / (time.perf_counter() - wall_before)
    )
    stop.set()
    non_alive_samples = await sampler
    dead_after = await asyncio.to_thread(
        _metric, coordinator.metrics_url, "lazarus_failure_detection_seconds_count"
    )
    leader_changes = int(
        await asyncio.to_thread(_metric, coordinator.metrics_url, "lazarus_leader_changes_total")
        - changes_before
    )
    nodes = await list_nodes(stub)
    # A record whose state changed since its Hello was SUSPECT or DEAD at some point.
    changed = [
        n.record.node_id
        for n in nodes
        if n.record.state != records_pb2.NODE_STATE_ALIVE
        or n.record.state_changed_at_unix_ms != n.record.registered_at_unix_ms
    ]
    latencies = sorted(x for t in taken for x in t["latencies_ms"])
    lags = sorted(x for t in taken for x in t["lags_ms"])
    ends = [e for t in taken for e in t["ends"]]
    p99 = _percentile(latencies, 0.99)
    dead = int(dead_after - dead_before)
    failure = []
    if not latencies:
        failure.append("no acks")
    elif p99 >= P99_LIMIT_MS:
        failure.append(f"p99 {p99:.1f} ms >= {P99_LIMIT_MS:.0f} ms")
    if leader_changes:
        failure.append(
            f"the leader lost leadership and re-campaigned ({leader_changes} leader changes; "
            "it closed every stream, and the simulated nodes do not reconnect)"
        )
    if dead:
        failure.append(f"{dead} DEAD verdicts")
    if ends:
        failure.append(f"{len(ends)} streams ended")
    if len(nodes) != total:
        failure.append(f"ListNodes shows {len(nodes)} nodes, expected {total}")
    return Step(
        nodes=total,
        seconds=step_s,
        heartbeats_sent=sum(t["sent"] for t in taken),
        acks=len(latencies),
        p50_ms=_percentile(latencies, 0.50),
        p99_ms=p99,
        max_ms=latencies[-1] if latencies else float("nan"),
        generator_lag_p99_ms=_percentile(lags, 0.99),
        leader_cpu_pct=cpu_pct,
        add_s=add_s,
        suspect_or_dead_nodes=len(changed),
        dead_verdicts=dead,
        leader_changes=leader_changes,
        non_alive_samples=non_alive_samples,
        streams_ended=len(ends),
        hellos_deferred=deferred,
        nodes_not_admitted=not_admitted,
        ok=not failure,
        failure="; ".join(failure),
        ends=ends[:20],
    )


async def ramp(
    etcd_endpoint: str,
    counts: list[int],
    step_s: float,
    n_workers: int,
    workdir: Path,
    other_load: set[str],
    label: str,
    tls: bool = False,
    *,
    stop_on_fail: bool = True,
    hello_concurrency: int = HELLO_CONCURRENCY,
) -> tuple[list[Step], float]:
    """Fresh coordinator and generators; the steps of ``counts`` until one fails.

    With ``stop_on_fail`` False (the overload ramp) every count is held unless
    the leader lost leadership or streams ended (past that the nodes are gone).

    Returns:
        The steps run and the coordinator's resident memory at the end, MiB.
    """
    coordinator = start_coordinator(etcd_endpoint, workdir, label, tls)
    workers: list[WorkerProcess] = []
    steps: list[Step] = []
    rss = float("nan")
    try:
        async with coordinator.client_tls.aio_channel(
            coordinator.address, CHANNEL_OPTIONS
        ) as channel:
            stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)  # type: ignore[no-untyped-call]
            await wait_leading(stub, coordinator)
            workers = list(
                await asyncio.gather(
                    *(
                        WorkerProcess.spawn(coordinator.address, f"w{i}", coordinator.certs)
                        for i in range(n_workers)
                    )
                )
            )
            current = 0
            for total in counts:
                other_load |= _other_benchmarks()
                step = await run_step(
                    stub,
                    coordinator,
                    workers,
                    total,
                    current,
                    step_s,
                    other_load,
                    hello_concurrency=hello_concurrency,
                )
                step.ramp = label
                if not step.ok:
                    step.coordinator_log = _log_excerpt(coordinator.log_path)
                current = (
                    step.nodes
                )  # the nodes attached (a leader past capacity may keep some out)
                steps.append(step)
                print(
                    f"[{label}] {step.nodes:>6} nodes: {step.acks} acks, "
                    f"p50 {step.p50_ms:.2f} ms, p99 {step.p99_ms:.2f} ms, "
                    f"max {step.max_ms:.1f} ms, "
                    f"leader CPU {step.leader_cpu_pct:.0f}%, "
                    f"generator lag p99 {step.generator_lag_p99_ms:.1f} ms, "
                    f"suspect/dead {step.suspect_or_dead_nodes}, dead {step.dead_verdicts}"
                    + ("" if step.ok else f"  FAILED: {step.failure}"),
                    flush=True,
                )
                other_load |= _other_benchmarks()
                if not step.ok and (stop_on_fail or step.leader_changes or step.streams_ended):
                    break
        rss = _rss_mb(coordinator.process.pid)
        return steps, rss
    finally:
        await asyncio.gather(*(w.stop() for w in workers), return_exceptions=True)
        if coordinator.process.poll() is None:
            os.kill(coordinator.process.pid, signal.SIGTERM)
            try:
                coordinator.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _kill(coordinator.process.pid)
                coordinator.process.wait(timeout=10)


def refinement(steps: list[Step]) -> list[int]:
    """Three steps between the last passing and the first failing doubling step."""
    failed = next((s for s in steps if not s.ok), None)
    passed = [s.nodes for s in steps if s.ok]
    if failed is None or not passed:
        return []
    low, high = max(passed), failed.nodes
    gap = (high - low) // 4
    return [low + k * gap for k in (1, 2, 3)] if gap >= 10 else []


async def bench(
    counts: list[int],
    step_s: float,
    n_workers: int,
    workdir: Path,
    other_load: set[str],
    refine: bool,
    tls: bool = False,
) -> tuple[list[Step], dict[str, Any]]:
    etcd = EtcdServer(base_dir=workdir)
    try:
        etcd.start()
        steps, rss = await ramp(
            str(etcd.endpoint), counts, step_s, n_workers, workdir, other_load, "doubling", tls
        )
        finer = refinement(steps) if refine else []
        if finer:
            more, rss_fine = await ramp(
                str(etcd.endpoint), finer, step_s, n_workers, workdir, other_load, "refine", tls
            )
            steps += more
            rss = max(rss, rss_fine)
        config = {
            "heartbeat_interval_s": HEARTBEAT_INTERVAL_S,
            "dead_after_s": DEAD_AFTER_S,
            "fence_after_s": FENCE_AFTER_S,
            "p99_limit_ms": P99_LIMIT_MS,
            "step_s": step_s,
            "settle_s": SETTLE_S,
            "workers": n_workers,
            "jitter_s": JITTER_S,
            "coordinator_rss_mb_max": rss,
            "security": "mtls" if tls else "none",
        }
        return steps, config
    finally:
        etcd.stop()


def _log_excerpt(path: Path, lines: int = 40) -> list[str]:
    """The coordinator's last WARNING / ERROR log lines (and how many there were)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    bad = [line[:400] for line in text if '"level": "INFO"' not in line]
    return [f"{len(bad)} non-INFO lines of {len(text)}", *bad[-lines:]]


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def _other_benchmarks() -> set[str]:
    """Other benchmark scripts running now (they share the cores), by file name."""
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=False)
    found = set()
    for line in out.stdout.splitlines():
        if "python" not in line or "heartbeat_bench" in line:
            continue
        for word in line.split():
            if word.endswith("_bench.py"):
                found.add(Path(word).name)
    return found


def table(steps: list[Step]) -> str:
    rows = [
        "| ramp | nodes | heartbeats acked | ack p50 ms | ack p99 ms | ack max ms | leader CPU "
        "| generator lag p99 ms | SUSPECT/DEAD nodes | DEAD verdicts | leader changes "
        "| streams lost | verdict |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for s in steps:
        rows.append(
            f"| {s.ramp} | {s.nodes:,} | {s.acks:,} | {s.p50_ms:.2f} | {s.p99_ms:.2f} "
            f"| {s.max_ms:.1f} | {s.leader_cpu_pct:.0f}% | {s.generator_lag_p99_ms:.1f} "
            f"| {s.suspect_or_dead_nodes} | {s.dead_verdicts} | {s.leader_changes} "
            f"| {s.streams_ended} "
            f"| {'ok' if s.ok else 'FAIL: ' + s.failure} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        asyncio.run(worker_main(argv[1], argv[2], argv[3:]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-nodes", type=int, default=6400, help="largest step (cap)")
    parser.add_argument("--min-nodes", type=int, default=100, help="first step")
    parser.add_argument("--step-s", type=float, default=20.0, help="seconds each step is held")
    parser.add_argument("--workers", type=int, default=2, help="load generator processes")
    parser.add_argument("--quick", action="store_true", help="one 20-node step of 5 s, no README")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results path")
    parser.add_argument("--no-readme", action="store_true", help="do not rewrite bench/README.md")
    parser.add_argument("--tls", action="store_true", help="coordinator with mTLS (its default)")
    parser.add_argument(
        "--compare-tls",
        type=str,
        default="",
        metavar="N,N",
        help="hold these node counts with --auth none, then with mTLS; TLS cost per heartbeat",
    )
    parser.add_argument(
        "--overload",
        type=str,
        default="",
        metavar="N,N",
        help="hold these node counts past capacity, Hellos in bursts; the leader must keep leading",
    )
    parser.add_argument(
        "--hello-concurrency",
        type=int,
        default=0,
        help=f"Hellos in flight per generator (default {HELLO_CONCURRENCY}; --overload: 64)",
    )
    args = parser.parse_args(argv)
    if args.overload:
        return overload([int(n) for n in args.overload.split(",")], args)
    if args.compare_tls:
        return compare_tls([int(n) for n in args.compare_tls.split(",")], args)
    if args.quick:
        counts, step_s, n_workers = [20], 5.0, 1
    else:
        counts, step_s, n_workers = [], args.step_s, args.workers
        n = args.min_nodes
        while n <= args.max_nodes:
            counts.append(n)
            n *= 2
    seen: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="lazarus-hbbench-") as tmp:
        steps, config = asyncio.run(
            bench(counts, step_s, n_workers, Path(tmp), seen, refine=not args.quick, tls=args.tls)
        )
    other = ", ".join(sorted(seen))
    # Each ramp stops at its first failing step, so every passing step had only
    # passing steps below it in its ramp.
    passing = [s.nodes for s in steps if s.ok]
    sustained = max(passing) if passing and steps[0].ok else 0
    failing = [s for s in steps if not s.ok]
    next_failed = min(failing, key=lambda s: s.nodes) if failing else None
    result = {
        "date": today(),
        "config": config,
        "other_load": other,
        "sustained_nodes": sustained,
        "first_failing_step": asdict(next_failed) if next_failed is not None else None,
        "steps": [asdict(s) for s in steps],
    }
    write_json(args.out, result)
    print(f"sustained: {sustained} nodes at 1 heartbeat/s; wrote {args.out}")
    if not (args.quick or args.no_readme):
        write_section("heartbeat", readme(steps, config, sustained, next_failed, other))
    return 0


def overload(counts: list[int], args: argparse.Namespace) -> int:
    """[hardening] item 3: hold ``counts`` past capacity; the leader must keep leading.

    One coordinator, generators that join nodes in bursts (``--hello-concurrency``
    Hellos in flight each, deferred Hellos retried as the agent does), every
    count held for ``--step-s`` without stopping at the p99 limit. A row keeps
    leading when the step (join included) had no leader change, no stream
    ended and no DEAD verdict.
    """
    seen: set[str] = set()
    concurrency = args.hello_concurrency or 64

    async def run(tmp: Path) -> tuple[list[Step], float]:
        etcd = EtcdServer(base_dir=tmp)
        etcd.start()
        try:
            return await ramp(
                str(etcd.endpoint),
                counts,
                args.step_s,
                args.workers,
                tmp,
                seen,
                "overload",
                args.tls,
                stop_on_fail=False,
                hello_concurrency=concurrency,
            )
        finally:
            etcd.stop()

    with tempfile.TemporaryDirectory(prefix="lazarus-hbbench-") as tmp:
        steps, rss = asyncio.run(run(Path(tmp)))
    commit = measured_commit()
    result = {
        "date": today(),
        "commit": commit,
        "hello_concurrency_per_generator": concurrency,
        "generators": args.workers,
        "step_s": args.step_s,
        "leader_rss_mb_at_end": rss,
        "other_load": ", ".join(sorted(seen)),
        "steps": [asdict(s) for s in steps],
    }
    out = args.out if args.out != RESULTS else OVERLOAD_RESULTS
    write_json(out, result)
    for st in steps:
        print(
            f"{st.nodes} nodes ({st.nodes_not_admitted} kept out): leader changes "
            f"{st.leader_changes}, streams ended "
            f"{st.streams_ended}, DEAD {st.dead_verdicts}, deferred Hellos {st.hellos_deferred}, "
            f"join {st.add_s:.1f} s, ack p99 {st.p99_ms:.0f} ms"
        )
    if not args.no_readme:
        write_section("heartbeat-overload", overload_readme(steps, result))
    return 0


def overload_readme(steps: list[Step], result: dict[str, Any]) -> str:
    rows = [
        "| nodes attached | kept out | join s | Hellos deferred | ack p50 ms | ack p99 ms "
        "| leader CPU | DEAD verdicts | leader changes | streams ended | kept leading |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for st in steps:
        kept = st.leader_changes == 0 and st.streams_ended == 0 and st.dead_verdicts == 0
        rows.append(
            f"| {st.nodes:,} | {st.nodes_not_admitted:,} | {st.add_s:.1f} "
            f"| {st.hellos_deferred:,} | {st.p50_ms:.1f} "
            f"| {st.p99_ms:.1f} | {st.leader_cpu_pct:.0f}% | {st.dead_verdicts} "
            f"| {st.leader_changes} | {st.streams_ended} | {'yes' if kept else 'NO'} |"
        )
    other = result["other_load"]
    concurrent = f" Other benchmarks ran on the same cores: {other}." if other else ""
    asked = ",".join(str(st.nodes + st.nodes_not_admitted) for st in steps)
    return f"""## Past capacity: the leader keeps leading (`heartbeat_bench.py --overload`)

[hardening] item 3. The setup of the heartbeat bench above (one real coordinator,
simulated Session streams at 1 heartbeat/s), but nodes join in bursts
({result["hello_concurrency_per_generator"]} Hellos in flight per generator,
{result["generators"]} generators; a deferred Hello is retried after its
`retry_after_ms`, as the agent does) and every count is held
{result["step_s"]:g} s **past** the 1 heartbeat/s capacity without stopping at the p99
limit. Leader changes count from before the join. Before this work the leader
lost its lease while 2,000-3,200 nodes joined. The election keepalive runs on its
own thread, but a saturated loop still starved it of the GIL (a first run of
this bench lost the lease at 3,200 nodes); now no Hello is admitted while the
loop lags past `degraded_after_lag_s` (0.5 s), so past capacity newcomers are
kept out ("kept out": still deferred after {HELLO_DEADLINE_S:g} s) and the
attached nodes keep their acks.{concurrent}

Measured {result["date"]} at commit `{result["commit"]}`;
`.venv/bin/python bench/heartbeat_bench.py --overload {asked}`;
raw figures in `bench/results/heartbeat-overload.json`.

{chr(10).join(rows)}
"""


def _per_heartbeat(step: Step) -> dict[str, Any]:
    acks_per_s = step.acks / step.seconds if step.seconds else float("nan")
    cpu_us = 1e6 * step.leader_cpu_pct / 100.0 / acks_per_s if acks_per_s else float("nan")
    return {
        "nodes": step.nodes,
        "acks_per_s": acks_per_s,
        "leader_cpu_pct": step.leader_cpu_pct,
        "leader_cpu_us_per_heartbeat": cpu_us,
        "p50_ms": step.p50_ms,
        "p99_ms": step.p99_ms,
        "ok": step.ok,
        "failure": step.failure,
    }


def compare_tls(counts: list[int], args: argparse.Namespace) -> int:
    """Hold ``counts`` with ``--auth none`` and with mTLS; write the TLS cost per heartbeat."""
    seen: set[str] = set()
    modes: dict[str, list[dict[str, Any]]] = {}
    config: dict[str, Any] = {}
    for tls in (False, True):
        with tempfile.TemporaryDirectory(prefix="lazarus-hbbench-") as tmp:
            steps, config = asyncio.run(
                bench(counts, args.step_s, args.workers, Path(tmp), seen, refine=False, tls=tls)
            )
        modes["mtls" if tls else "plaintext"] = [_per_heartbeat(s) for s in steps]
    config.pop("security", None)
    other = ", ".join(sorted(seen))
    commit = measured_commit()
    result = {
        "date": today(),
        "commit": commit,
        "config": config,
        "other_load": other,
        "modes": modes,
    }
    out = args.out if args.out != RESULTS else TLS_RESULTS
    write_json(out, result)
    print(json.dumps(modes, indent=2))
    if not args.no_readme:
        write_section("heartbeat-tls", tls_readme(modes, config, other, commit))
    return 0


def tls_readme(
    modes: dict[str, list[dict[str, Any]]], config: dict[str, Any], other: str, commit: str = ""
) -> str:
    rows = [
        "| nodes | security | heartbeats acked/s | leader CPU | leader CPU per heartbeat | "
        "ack p50 ms | ack p99 ms | verdict |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    plain = {r["nodes"]: r for r in modes.get("plaintext", [])}
    for mode in ("plaintext", "mtls"):
        for r in modes.get(mode, []):
            extra = ""
            base = plain.get(r["nodes"])
            if mode == "mtls" and base is not None:
                added = r["leader_cpu_us_per_heartbeat"] - base["leader_cpu_us_per_heartbeat"]
                extra = f" ({added:+.0f})"
            rows.append(
                f"| {r['nodes']:,} | {'mTLS' if mode == 'mtls' else '--auth none'} "
                f"| {r['acks_per_s']:,.0f} | {r['leader_cpu_pct']:.0f}% "
                f"| {r['leader_cpu_us_per_heartbeat']:.0f} µs{extra} "
                f"| {r['p50_ms']:.2f} | {r['p99_ms']:.2f} "
                f"| {'ok' if r['ok'] else 'FAIL: ' + r['failure']} |"
            )
    counts = ",".join(str(r["nodes"]) for r in modes.get("plaintext", []))
    step_s = config.get("step_s", "?")
    deltas = [
        (r["leader_cpu_us_per_heartbeat"] - plain[r["nodes"]]["leader_cpu_us_per_heartbeat"])
        / plain[r["nodes"]]["leader_cpu_us_per_heartbeat"]
        for r in modes.get("mtls", [])
        if r["nodes"] in plain
    ]
    if deltas and max(abs(d) for d in deltas) < 0.15:
        verdict = (
            "**mTLS costs no measurable leader CPU per heartbeat here**: the differences "
            f"({', '.join(f'{100 * d:+.0f}%' for d in deltas)}) are below the noise of "
            "this shared machine (a negative figure cannot be a TLS saving). The leader "
            "spends its ~0.7-0.9 ms per heartbeat in Python (asyncio, protobuf, the core); "
            "AES-GCM of two ~100-byte frames is a few microseconds, and the authorization "
            "check runs once per Session, not per heartbeat."
        )
    else:
        verdict = (
            "mTLS changes the leader's CPU per heartbeat by "
            f"{', '.join(f'{100 * d:+.0f}%' for d in deltas)} (per row above)."
        )
    concurrent = (
        f"\n\nOther benchmarks ran on the same 2 cores during this run ({other})." if other else ""
    )
    return f"""## What TLS costs per heartbeat (`heartbeat_bench.py --compare-tls`)

The heartbeat bench's setup (one real coordinator, simulated nodes at 1 heartbeat/s
each on its own HTTP/2 connection, {config.get("workers", "?")} generator processes),
holding the same node counts for {config.get("step_s", "?")} s twice on fresh
coordinators: once with `--auth none` (plaintext), once with the default mutual TLS
and the authorization interceptor, every simulated node holding its own node
certificate (ECDSA P-256, TLS 1.3). "Leader CPU per heartbeat" is the leader
process's CPU time over the step divided by the heartbeats it acked; the figure in
brackets is what mTLS adds. A Session is one long-lived stream, so the handshake
is paid once per connection; what remains per heartbeat is record encryption
(AES-GCM) of two small frames and nothing of the interceptor (it runs once per
Session, not per message).

Measured {today()} at commit {commit or "?"};
`.venv/bin/python bench/heartbeat_bench.py --compare-tls {counts} --step-s {step_s}`;
raw figures in `bench/results/heartbeat-tls.json`. The machine is shared by
other workers (2 cores): the figures are noisy.{concurrent}

{chr(10).join(rows)}

{verdict}
"""


def readme(
    steps: list[Step],
    config: dict[str, Any],
    sustained: int,
    failed: Step | None,
    other: str,
) -> str:
    cap = (
        f"the first failing step was {failed.nodes:,} nodes ({failed.failure})"
        if failed is not None
        else f"no step failed up to the cap of {steps[-1].nodes:,} nodes"
    )
    concurrent = (
        f"\n\nAnother benchmark was running on the same 2 cores during this run ({other}); "
        "the figures are a lower bound."
        if other
        else ""
    )
    return f"""## Heartbeats one leader sustains (`heartbeat_bench.py`)

One real `lazarus coordinator` process (defaults, except `--heartbeat-interval-s 1
--dead-after-s 6 --fence-after-s 4`: the default 0.5 / 3 / 2 scaled to one heartbeat
per second) on one local etcd. Simulated node agents are raw `AgentService.Session`
streams, one HTTP/2 connection each, run by {config["workers"]} load generator
processes: Hello, then one heartbeat per second each at a random phase. The node
count doubles every step ({config["step_s"]:.0f} s held, after {config["settle_s"]:.0f} s
to settle); earlier nodes keep heartbeating, so any SUSPECT or DEAD verdict is false.
The doubling ramp stops at its first failing step; a second ramp ("refine") on a
fresh coordinator then tries three counts between the last pass and that failure.
Ack round trip is measured by the generator (send -> ack read), so it includes the
generators' own scheduling delay (the "generator lag" column; everything shares
the same 2 cores). Leader CPU is the coordinator process's user + system time over
the step, in % of one core (it runs one asyncio event loop). A step passes with ack
p99 < {P99_LIMIT_MS:.0f} ms, no DEAD verdict and no stream lost. SUSPECT/DEAD nodes:
records (ListNodes, after the step) whose state changed since their Hello, so ever
SUSPECT or DEAD in that ramp; DEAD verdicts: the step's increase of the leader's
`lazarus_failure_detection_seconds_count`; leader changes: of
`lazarus_leader_changes_total` (a leader that loses leadership closes every
Session; these simulated nodes do not reconnect, so they then go DEAD). Near the
knee, p99 moves by tens of ms between runs on this shared VM: read the answer as
plus or minus one step.

Measured {today()}; `.venv/bin/python bench/heartbeat_bench.py`; raw figures in
`bench/results/heartbeat.json`.

**One leader sustains {sustained:,} nodes at 1 heartbeat/s** with ack p99 under
{P99_LIMIT_MS:.0f} ms and no false DEAD on this machine; {cap}.{concurrent}

{table(steps)}
"""


if __name__ == "__main__":
    sys.exit(main())
