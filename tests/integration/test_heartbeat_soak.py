"""Issue 3 acceptance: heartbeats against a real ``lazarus coordinator`` process on real etcd.

- 50 simulated nodes (raw ``AgentService.Session`` streams, one HTTP/2
  connection each) heartbeat every 0.5 s (the default) with small jitter for
  60 s: no node is ever SUSPECT or DEAD. Checked four ways: GetClusterStatus
  every second (every node ALIVE), ListNodes every 5 s (ALIVE and connected),
  ListNodes at the end (no record's state changed since its Hello:
  ``state_changed_at_unix_ms == registered_at_unix_ms``; a SUSPECT that
  recovered would have moved it) and the leader's
  ``lazarus_failure_detection_seconds_count`` (one per DEAD verdict) staying 0;
  and no stream ends. The ack round trip (send -> ack read) is printed as
  ``MEASURED heartbeat_ack_*`` (run with ``-s``).
- On the same kind of process: a node that stops sending is DEAD within
  ``dead_after + one heartbeat interval``; a node whose stream closes is SUSPECT
  at once (long before silence could make it so).

The coordinator runs with its defaults (heartbeat 0.5 s, dead_after 3 s) and is
stopped by pid at teardown (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from coordinator.core import CoreSettings
from lazarus.v1 import agent_pb2, coordinator_pb2, coordinator_pb2_grpc, records_pb2
from lazarus_dev.localservers import free_loopback_ports

LAZARUS = Path(sys.executable).parent / "lazarus"
SESSION_METHOD = "/lazarus.v1.AgentService/Session"
DEFAULTS = CoreSettings()
INTERVAL_S = DEFAULTS.heartbeat_interval_s
DEAD_AFTER_S = DEFAULTS.dead_after_s
NODES = 50
SOAK_S = 60.0
JITTER_S = 0.02
STARTUP_S = 30.0
ALIVE = records_pb2.NODE_STATE_ALIVE
# Loopback only; one connection per simulated node, as separate agents would have.
CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0), ("grpc.use_local_subchannel_pool", 1)]


@dataclass
class Process:
    member_id: str
    address: str
    metrics_url: str
    process: subprocess.Popen[bytes]
    log_path: Path


@pytest.fixture
def coordinator(etcd: Any, tmp_path: Path) -> Iterator[Process]:
    """One real ``lazarus coordinator`` with default settings on the session etcd."""
    grpc_port, metrics_port = free_loopback_ports(2)
    cluster = f"soak-{uuid.uuid4().hex[:10]}"
    log_path = tmp_path / "coordinator.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                str(LAZARUS),
                "coordinator",
                "--cluster",
                cluster,
                "--member-id",
                "soak-c1",
                "--listen",
                f"127.0.0.1:{grpc_port}",
                "--metrics-listen",
                f"127.0.0.1:{metrics_port}",
                "--etcd-endpoint",
                str(etcd.endpoint),
                "--auth",  # plaintext: the soak measures heartbeats, test_security covers auth
                "none",
                # The detector's timing is the subject: no extra grace after the election
                # (tests/unit/core/test_failover_grace.py covers that grace).
                "--failover-reconnect-s",
                "0",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield Process(
            "soak-c1",
            f"127.0.0.1:{grpc_port}",
            f"http://127.0.0.1:{metrics_port}/metrics",
            process,
            log_path,
        )
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


@pytest.fixture
async def api(coordinator: Process) -> AsyncIterator[Any]:
    """CoordinatorService stub on the process, once it leads."""
    async with grpc.aio.insecure_channel(coordinator.address, options=CHANNEL_OPTIONS) as channel:
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)  # type: ignore[no-untyped-call]
        async with asyncio.timeout(STARTUP_S):
            while True:
                assert coordinator.process.poll() is None, coordinator.log_path.read_text()
                with contextlib.suppress(grpc.aio.AioRpcError):
                    status = await stub.GetClusterStatus(
                        coordinator_pb2.GetClusterStatusRequest(), timeout=2
                    )
                    if status.leader_id == coordinator.member_id:
                        break
                await asyncio.sleep(0.1)
        yield stub


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url, timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
    raise AssertionError(f"{name} missing")


async def _nodes(stub: Any) -> dict[str, Any]:
    reply = await stub.ListNodes(coordinator_pb2.ListNodesRequest(page_size=1000), timeout=5)
    assert not reply.next_page_token
    return {info.record.node_id: info for info in reply.nodes}


@dataclass
class SimNode:
    """A node agent made of a raw Session stream: Hello, then timed heartbeats."""

    node_id: str
    address: str
    latencies_s: list[float] = field(default_factory=list)
    ended: str = ""
    seq: int = 0
    sent: dict[int, float] = field(default_factory=dict)
    channel: Any = None
    call: Any = None

    async def hello(self) -> None:
        """Open a Session; a Hello the leader defers (NotLeader naming itself with
        ``retry_after_ms``: admission under load) is sent again after that pause,
        as the real agent does, for up to 30 s."""
        deadline = time.monotonic() + 30.0
        while True:
            self.channel = grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS)
            self.call = self.channel.stream_stream(
                SESSION_METHOD,
                request_serializer=agent_pb2.AgentMessage.SerializeToString,
                response_deserializer=agent_pb2.CoordinatorMessage.FromString,
            )()
            await self.call.write(
                agent_pb2.AgentMessage(
                    hello=agent_pb2.Hello(
                        node_id=self.node_id,
                        incarnation=uuid.uuid4().hex[:8],
                        capacity=records_pb2.NodeCapacity(slots=1),
                    )
                )
            )
            async with asyncio.timeout(10):
                reply = await self.call.read()
            assert reply is not grpc.aio.EOF
            deferred = reply.WhichOneof("body") == "not_leader" and reply.not_leader.retry_after_ms
            if not deferred or time.monotonic() >= deadline:
                break
            self.call.cancel()
            await self.channel.close()
            await asyncio.sleep(reply.not_leader.retry_after_ms / 1000.0)
        assert reply.WhichOneof("body") == "welcome", reply
        assert reply.welcome.heartbeat_interval_ms == int(INTERVAL_S * 1000)

    async def heartbeat(self) -> None:
        self.seq += 1
        self.sent[self.seq] = time.monotonic()
        await self.call.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=self.seq)))

    async def beat_until(self, stop: asyncio.Event) -> None:
        """Heartbeat every INTERVAL_S (random phase, +-JITTER_S) until ``stop`` is set."""
        slot = time.monotonic() + random.uniform(0.0, INTERVAL_S)
        while not self.ended:
            wait = slot + random.uniform(-JITTER_S, JITTER_S) - time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, wait))
            if stop.is_set():
                return
            try:
                await self.heartbeat()
            except Exception as exc:
                self.ended = self.ended or f"write failed: {exc!r}"
                return
            slot += INTERVAL_S

    async def read_acks(self) -> None:
        try:
            while True:
                reply = await self.call.read()
                if reply is grpc.aio.EOF:
                    self.ended = f"stream ended: {await self.call.code()}"
                    return
                assert reply.WhichOneof("body") == "heartbeat_ack", reply
                sent = self.sent.pop(reply.heartbeat_ack.seq)
                self.latencies_s.append(time.monotonic() - sent)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.ended = self.ended or f"read failed: {exc!r}"

    async def close(self) -> None:
        if self.call is not None:
            self.call.cancel()
        if self.channel is not None:
            await self.channel.close()


def _percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, max(0, int(len(sorted_values) * q) - 1))]


async def _sample(stub: Any, stop: asyncio.Event, problems: list[str]) -> int:
    """GetClusterStatus every second, ListNodes every 5th: every node ALIVE and connected."""
    samples = 0
    while not stop.is_set():
        status = await stub.GetClusterStatus(coordinator_pb2.GetClusterStatusRequest(), timeout=5)
        counts = {records_pb2.NodeState.Name(c.state): c.count for c in status.nodes_by_state}
        if counts != {"NODE_STATE_ALIVE": NODES}:
            problems.append(f"GetClusterStatus at sample {samples}: {counts}")
        if samples % 5 == 0:
            for node_id, info in (await _nodes(stub)).items():
                if info.record.state != ALIVE or not info.liveness.connected:
                    problems.append(f"ListNodes at sample {samples}: {node_id} {info}")
        samples += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
    return samples


@pytest.mark.timeout(150)
async def test_fifty_nodes_heartbeat_sixty_seconds_none_suspect_or_dead(
    coordinator: Process, api: Any
) -> None:
    nodes = [SimNode(f"soak-{i:02d}", coordinator.address) for i in range(NODES)]
    readers: list[asyncio.Task[None]] = []
    beaters: list[asyncio.Task[None]] = []
    stop_beating = asyncio.Event()
    try:
        await asyncio.gather(*(node.hello() for node in nodes))
        readers = [asyncio.create_task(node.read_acks()) for node in nodes]
        problems: list[str] = []
        stop_sampling = asyncio.Event()
        sampler = asyncio.create_task(_sample(api, stop_sampling, problems))
        started = time.monotonic()
        beaters = [asyncio.create_task(node.beat_until(stop_beating)) for node in nodes]
        await asyncio.sleep(SOAK_S)
        stop_sampling.set()
        samples = await sampler
        # Final checks while the nodes still heartbeat (a silent second would be SUSPECT).
        final = await _nodes(api)
        dead_verdicts = await asyncio.to_thread(
            _metric, coordinator.metrics_url, "lazarus_failure_detection_seconds_count"
        )
        stop_beating.set()
        await asyncio.gather(*beaters)
        soak_s = time.monotonic() - started
        await asyncio.sleep(0.5)  # the last acks arrive
        received = await asyncio.to_thread(
            _metric, coordinator.metrics_url, "lazarus_heartbeats_received_total"
        )

        ends = {node.node_id: node.ended for node in nodes if node.ended}
        assert ends == {}, ends
        unacked = {node.node_id: sorted(node.sent) for node in nodes if node.sent}
        assert unacked == {}, unacked
        assert problems == [], problems[:10]
        assert samples >= SOAK_S - 5
        assert sorted(final) == sorted(node.node_id for node in nodes)
        changed = {
            node_id: records_pb2.NodeState.Name(info.record.state)
            for node_id, info in final.items()
            if info.record.state != ALIVE
            or info.record.state_changed_at_unix_ms != info.record.registered_at_unix_ms
            or not info.liveness.connected
        }
        assert changed == {}, f"nodes SUSPECT or DEAD at some point: {changed}"
        assert dead_verdicts == 0

        latencies = sorted(x for node in nodes for x in node.latencies_s)
        sent = sum(node.seq for node in nodes)
        assert len(latencies) == sent == received
        assert sent >= NODES * (SOAK_S / INTERVAL_S) * 0.95
        p50, p99, worst = _percentile(latencies, 0.5), _percentile(latencies, 0.99), latencies[-1]
        print(
            f"\nMEASURED heartbeat_soak {NODES} nodes x {soak_s:.1f} s: {sent} heartbeats acked, "
            f"{samples} status samples, 0 SUSPECT, 0 DEAD"
        )
        print(
            f"MEASURED heartbeat_ack_p50_s {p50:.4f} heartbeat_ack_p99_s {p99:.4f} "
            f"heartbeat_ack_max_s {worst:.4f}"
        )
        # An agent pauses its tasks fence_after_s after an unacked heartbeat: never here.
        assert worst < DEFAULTS.fence_after_s
    finally:
        stop_beating.set()
        for task in [*beaters, *readers]:
            task.cancel()
        await asyncio.gather(*beaters, *readers, return_exceptions=True)
        await asyncio.gather(*(node.close() for node in nodes), return_exceptions=True)


async def _wait_state(stub: Any, node_id: str, state: int, timeout_s: float) -> Any:
    async with asyncio.timeout(timeout_s):
        while True:
            info = (await _nodes(stub)).get(node_id)
            if info is not None and info.record.state == state:
                return info
            await asyncio.sleep(0.01)


@pytest.mark.timeout(60)
async def test_silent_node_is_dead_and_closed_stream_suspect_at_once(
    coordinator: Process, api: Any
) -> None:
    silent = SimNode("n-silent", coordinator.address)
    closed = SimNode("n-closed", coordinator.address)
    try:
        for node in (silent, closed):
            await node.hello()
            await node.heartbeat()
            async with asyncio.timeout(5):
                assert (await node.call.read()).WhichOneof("body") == "heartbeat_ack"

        # Closed stream: SUSPECT at once, not after 2 silent intervals (1 s) of ticks.
        await closed.call.done_writing()
        closed_at = time.monotonic()
        await _wait_state(api, "n-closed", records_pb2.NODE_STATE_SUSPECT, 5.0)
        suspect_s = time.monotonic() - closed_at
        print(f"\nMEASURED closed_stream_to_suspect_s {suspect_s:.3f}")
        assert suspect_s < DEFAULTS.suspect_after_intervals * INTERVAL_S / 2

        # Silence: DEAD within dead_after + one heartbeat interval of the last heartbeat.
        last_heartbeat = silent.sent.get(1) or time.monotonic()
        info = await _wait_state(api, "n-silent", records_pb2.NODE_STATE_DEAD, 10.0)
        dead_s = time.monotonic() - last_heartbeat
        recorded_s = (
            info.record.state_changed_at_unix_ms - info.record.last_heartbeat_at_unix_ms
        ) / 1000
        print(f"MEASURED silence_to_dead_s {dead_s:.3f} (leader's record: {recorded_s:.3f})")
        assert DEAD_AFTER_S <= recorded_s <= DEAD_AFTER_S + INTERVAL_S
        assert dead_s <= DEAD_AFTER_S + INTERVAL_S
        async with asyncio.timeout(5):
            with contextlib.suppress(grpc.aio.AioRpcError):
                while await silent.call.read() is not grpc.aio.EOF:
                    pass
        assert await silent.call.code() is grpc.StatusCode.ABORTED
        assert "DEAD" in await silent.call.details()
    finally:
        await silent.close()
        await closed.close()


FLOOD_NODES = 200
FLOOD_TASKS = 3000
FLOOD_S = 10.0
FLOOD_CLIENTS = 32
FLOOD_PROCESSES = 2
FLOOD_LABELS = {f"team-{k:02d}.example.com/owner": "x" * 40 for k in range(16)}
"""Labels of every flood task (about 1.3 KiB): what a real orchestrator attaches."""
_FLOOD_SCRIPT = """
import asyncio, sys, grpc.aio
from lazarus.v1 import coordinator_pb2
async def one(call):
    request = coordinator_pb2.ListTasksRequest(page_size=1000)
    while True:
        try:
            await call(request, timeout=10)  # the reply stays bytes: the server does the work
        except grpc.aio.AioRpcError:
            await asyncio.sleep(0.01)
async def main():
    async with grpc.aio.insecure_channel(sys.argv[1]) as channel:
        call = channel.unary_unary(
            "/lazarus.v1.CoordinatorService/ListTasks",
            request_serializer=coordinator_pb2.ListTasksRequest.SerializeToString,
        )
        await asyncio.gather(*(one(call) for _ in range(int(sys.argv[2]))))
asyncio.run(main())
"""


@pytest.mark.timeout(180)
async def test_list_tasks_flood_does_not_delay_heartbeat_acks(
    coordinator: Process, api: Any
) -> None:
    """Issue 16 item 2: orchestrator reads on the leader never starve the Session loop.

    3,000 tasks with 16 labels each (submitted, then cancelled); 200 simulated
    nodes heartbeat while two other processes flood ListTasks (page of 1,000)
    from 32 concurrent callers each for 10 s. No heartbeat may go unacked for
    ``fence_after`` (an agent would self-fence), no stream may end, no node may
    turn DEAD. (Measured 2026-11-24 on the main before [hardening], 6444744,
    with this load and with 2 x 256 callers: ack p99 0.15 / 0.13 s, 0 late;
    the Session loop was not starved there either, so this test guards the
    property rather than reproducing a failure; the Hello-burst test in
    test_admission.py is item 2's test that fails on that main.)
    """
    sem = asyncio.Semaphore(64)

    async def submit(i: int) -> None:
        async with sem:  # then cancelled: listed, but never placed
            reply = await api.SubmitTask(
                coordinator_pb2.SubmitTaskRequest(
                    request_id=f"flood-{i}",
                    spec=records_pb2.TaskSpec(
                        kind="flood", node_selector={"pool": "none"}, labels=FLOOD_LABELS
                    ),
                ),
                timeout=30,
            )
            await api.CancelTask(
                coordinator_pb2.CancelTaskRequest(task_id=reply.task.task_id), timeout=30
            )

    await asyncio.gather(*(submit(i) for i in range(FLOOD_TASKS)))
    nodes = [SimNode(f"flood-{i:03d}", coordinator.address) for i in range(FLOOD_NODES)]
    readers: list[asyncio.Task[None]] = []
    beaters: list[asyncio.Task[None]] = []
    stop_beating = asyncio.Event()
    floods: list[subprocess.Popen[bytes]] = []
    try:
        for start in range(0, FLOOD_NODES, 25):
            batch = nodes[start : start + 25]
            await asyncio.gather(*(node.hello() for node in batch))
            readers += [asyncio.create_task(node.read_acks()) for node in batch]
            beaters += [asyncio.create_task(node.beat_until(stop_beating)) for node in batch]
        await asyncio.sleep(2.0)
        floods = [
            subprocess.Popen(  # noqa: ASYNC220 - started once, killed by pid
                [sys.executable, "-c", _FLOOD_SCRIPT, coordinator.address, str(FLOOD_CLIENTS)]
            )
            for _ in range(FLOOD_PROCESSES)
        ]
        await asyncio.sleep(FLOOD_S)
        now = time.monotonic()
        late = {
            node.node_id: round(now - min(node.sent.values()), 2)
            for node in nodes
            if node.sent and now - min(node.sent.values()) >= DEFAULTS.fence_after_s
        }
        dead_verdicts = await asyncio.to_thread(
            _metric, coordinator.metrics_url, "lazarus_failure_detection_seconds_count"
        )
        stop_beating.set()
        await asyncio.gather(*beaters)
        latencies = sorted(x for node in nodes for x in node.latencies_s)
        fenced = sum(1 for x in latencies if x >= DEFAULTS.fence_after_s)
        print(
            f"\nMEASURED list_tasks_flood {FLOOD_NODES} nodes {FLOOD_TASKS} tasks "
            f"{FLOOD_PROCESSES} x {FLOOD_CLIENTS} callers x {FLOOD_S:g} s: ack p50 "
            f"{_percentile(latencies, 0.5):.3f} s p99 {_percentile(latencies, 0.99):.3f} s "
            f"max {latencies[-1]:.3f} s, acks >= fence_after: {fenced}"
        )
        ends = {node.node_id: node.ended for node in nodes if node.ended}
        assert ends == {}, list(ends.items())[:5]
        assert late == {}, list(late.items())[:5]
        assert fenced == 0, "heartbeat acks later than fence_after: those agents self-fence"
        assert dead_verdicts == 0
    finally:
        for flood in floods:
            flood.kill()
            flood.wait(timeout=10)
        stop_beating.set()
        for task in [*beaters, *readers]:
            task.cancel()
        await asyncio.gather(*beaters, *readers, return_exceptions=True)
        await asyncio.gather(*(node.close() for node in nodes), return_exceptions=True)
