"""Issue [fan-in], first part: a follower holds agents' Sessions and forwards them to the leader.

Real etcd, Redis, three ``lazarus coordinator --fan-in`` replicas with mutual
TLS (the Forward stream runs under the member certificates) and ``lazarus
node-agent`` processes dialling a follower only. What is checked from outside:
the tasks' own side effects (``identity_apps.steplog``: every step start and
completion logged with pid and epoch, one owner per epoch), each replica's
``/metrics`` (which replica holds which Sessions), and the agents' logs.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

import aetcd
import pytest
import test_identity
from test_identity import (
    APP,
    _side_effects,
    _submit,
    _wait_done,
    check_one_owner,
)

from coordinator.core.fanin import FanInSettings
from coordinator.etcd_store import election_prefix
from lazarus.tls import IdentityKind
from lazarus.v1 import agent_pb2, coordinator_pb2, coordinator_pb2_grpc, records_pb2
from lazarus_dev.devcluster import LocalCluster

pytestmark = pytest.mark.integration

MakeCluster = Callable[..., LocalCluster]
make_cluster = test_identity.make_cluster
"""The identity tests' fixture: clusters with the test apps on PYTHONPATH, stopped after."""


def _series(url: str, name: str, labels: str = "") -> float:
    """Sum of the samples of ``name`` (whose label set contains ``labels``) at ``url``."""
    body = urllib.request.urlopen(url, timeout=5).read().decode()
    total = 0.0
    for line in body.splitlines():
        if line.startswith("#"):
            continue
        sample, _, value = line.rpartition(" ")
        metric = sample.split("{", 1)[0]
        if metric == name and labels in sample:
            total += float(value)
    return total


async def _until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.2)


async def _replicas(make_cluster: MakeCluster) -> tuple[LocalCluster, int]:
    """Three replicas with fan-in, no agent yet; and the leader's index."""
    cluster = make_cluster(
        coordinators=3,
        agents=0,
        coordinator_args=["--fan-in"],
        agent_args=["--app", APP, "--slots", "4"],
    )
    await cluster.ready(40)
    leader, _ = await cluster.leader()
    return cluster, leader


async def _fan_in_cluster(make_cluster: MakeCluster) -> tuple[LocalCluster, int, list[int]]:
    """Three replicas with fan-in and one agent per follower, dialling only that follower."""
    cluster, leader = await _replicas(make_cluster)
    followers = [i for i in range(3) if i != leader]
    for i in followers:
        cluster.add_agent("--coordinators", cluster.coordinator_addresses[i])
    await cluster.ready(40)
    return cluster, leader, followers


async def test_agents_on_followers_run_their_tasks_through_the_leader_once(
    make_cluster: MakeCluster,
) -> None:
    cluster, leader, followers = await _fan_in_cluster(make_cluster)
    metrics = cluster.coordinator_metrics
    # Each follower holds its agent's Session; the leader serves both forwarded.
    for i in followers:
        assert _series(metrics[i], "lazarus_forwarded_sessions", 'side="follower"') == 1
    assert _series(metrics[leader], "lazarus_forwarded_sessions", 'side="leader"') == 2
    key = f"effects-{uuid.uuid4().hex[:6]}"
    ids = await _submit(cluster, 8, steps=20, step_ms=20, key=key)
    tasks = await _wait_done(cluster, ids, timeout_s=90)
    assert all(t.state == records_pb2.TASK_STATE_COMPLETED for t in tasks.values())
    log = _side_effects(cluster, key)
    figures = check_one_owner(log, ids)
    assert all(epochs == [1] for epochs in figures["epochs"].values()), figures
    assert {e["pid"] for e in log} <= {a.pid for a in cluster.agents}
    for i in followers:
        # Heartbeats went through the follower and their acks came back through it.
        assert _series(metrics[i], "lazarus_forward_ack_seconds_count") > 0
        assert _series(metrics[i], "lazarus_forward_batches_total", 'direction="sent"') > 0
    # The leader stepped them as liveness digests (one core event per batch),
    # only those queued behind an older message of their Session one by one.
    digest = _series(metrics[leader], "lazarus_forward_heartbeats_total", 'path="digest"')
    one_by_one = _series(metrics[leader], "lazarus_forward_heartbeats_total", 'path="message"')
    assert digest > 0
    assert digest >= one_by_one, (digest, one_by_one)
    # The leader's ListNodes names the replica holding each node's Session.
    async with cluster.channel(leader) as channel:
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)  # type: ignore[no-untyped-call]
        reply = await stub.ListNodes(coordinator_pb2.ListNodesRequest(), timeout=10)
        status = await stub.GetClusterStatus(coordinator_pb2.GetClusterStatusRequest(), timeout=10)
    held = {info.record.node_id: info.liveness.session_replica for info in reply.nodes}
    assert held == {f"agent-{k}": f"coordinator-{i}" for k, i in enumerate(followers)}, held
    # lazarus status: the Sessions each replica holds.
    assert dict(status.sessions_by_replica) == {f"coordinator-{i}": 1 for i in followers}
    for agent, i in zip(cluster.agents, followers, strict=True):
        # Never redirected to the leader: every Session it opened was with its follower.
        opened = re.findall(r"session open with (\S+)", agent.log_path.read_text(errors="replace"))
        assert opened
        assert set(opened) == {cluster.coordinator_addresses[i]}, opened
        # The leader's Welcome came through: it carries the fan-in profile's fence.
        assert "fence_after_s=5.0" in agent.log_path.read_text(errors="replace")


def _longest_step_gap(log: list[dict[str, Any]]) -> tuple[float, str]:
    """The longest time between two consecutive steps of one task, and that task."""
    by_task: dict[str, list[float]] = {}
    for e in log:
        if e["what"] == "step":
            by_task.setdefault(e["task"], []).append(e["t"])
    worst = (0.0, "")
    for task, times in by_task.items():
        times.sort()
        for a, b in itertools.pairwise(times):
            worst = max(worst, (b - a, task))
    return worst


async def _kill_mid_run(
    cluster: LocalCluster, victim: int, tasks: int, steps: int
) -> tuple[float, list[dict[str, Any]]]:
    """Run ``tasks`` steplog tasks, SIGKILL coordinator ``victim`` 1.5 s in, wait, check.

    Every task completes once per epoch, never leaves epoch 1 (nothing is moved:
    no node is judged DEAD) and never stands still longer than a step plus 1 s.

    Returns:
        (the kill's wall time, the side-effect log).
    """
    key = f"effects-{uuid.uuid4().hex[:6]}"
    ids = await _submit(cluster, tasks, steps=steps, step_ms=100, key=key)
    await asyncio.sleep(1.5)
    killed_at = time.time()
    cluster.coordinators[victim].kill()
    done = await _wait_done(cluster, ids, timeout_s=120)
    assert all(t.state == records_pb2.TASK_STATE_COMPLETED for t in done.values())
    log = _side_effects(cluster, key)
    figures = check_one_owner(log, ids)
    assert all(epochs == [1] for epochs in figures["epochs"].values()), figures
    gap, task = _longest_step_gap(log)
    assert gap < 0.1 + 1.0, f"{task} stood still {gap:.2f} s"
    return killed_at, log


async def test_the_leader_sigkilled_under_forwarded_sessions_drops_none_and_pauses_no_task(
    make_cluster: MakeCluster,
) -> None:
    cluster, leader, followers = await _fan_in_cluster(make_cluster)
    # No task stands still: the next leader is there before any agent would fence
    # (fan-in profile: fence 5 s, lease 3 s), and no Session has to be re-dialled.
    killed_at, _ = await _kill_mid_run(cluster, leader, tasks=8, steps=60)
    new_leader, _ = await cluster.leader()
    assert new_leader in followers
    for agent, i in zip(cluster.agents, followers, strict=True):
        lines = agent.log_path.read_text(errors="replace").splitlines()
        after = [line for line in lines if _ts(line) > killed_at]
        # Both followers kept their agent's stream, the one now leading too: a
        # Reattach, a Hello on the same stream, the new leader's Welcome; no
        # session ended, none redialled, no self-fence.
        assert any('"reattach' in line for line in after), agent.log_tail(30)
        assert not any("session with" in line and "ended" in line for line in after), after
        assert not any("session_closed" in line for line in after), after
        text = "\n".join(lines)
        opened = re.findall(r"session open with (\S+) \(leader \S+, term (\d+)\)", text)
        assert len(opened) == 2, opened
        assert {address for address, _ in opened} == {cluster.coordinator_addresses[i]}
        assert int(opened[1][1]) > int(opened[0][1])
        assert "self-fence" not in text
    metrics = cluster.coordinator_metrics
    for i in followers:  # each still holds its agent's Session...
        assert _series(metrics[i], "lazarus_forwarded_sessions", 'side="follower"') == 1
    # ...and the new leader serves both, its own through a link to itself.
    assert _series(metrics[new_leader], "lazarus_forwarded_sessions", 'side="leader"') == 2
    nodes = {n.node_id: n for n in await cluster.list_nodes()}
    assert all(n.state == records_pb2.NODE_STATE_ALIVE for n in nodes.values()), nodes


def _ts(line: str) -> float:
    match = re.search(r'"ts": ([0-9.]+)', line)
    return float(match.group(1)) if match else 0.0


async def test_a_follower_sigkilled_sends_its_agent_to_another_replica_with_no_dead_verdict(
    make_cluster: MakeCluster,
) -> None:
    cluster, leader = await _replicas(make_cluster)
    victim = (leader + 1) % 3
    other = 3 - leader - victim
    addresses = cluster.coordinator_addresses
    # The agent dials the victim first, then the other follower, then the leader.
    agent = cluster.add_agent(
        "--coordinators", ",".join([addresses[victim], addresses[other], addresses[leader]])
    )
    await cluster.ready(40)
    # Nothing moves (the node is never judged DEAD) and nothing stands still...
    killed_at, _ = await _kill_mid_run(cluster, victim, tasks=4, steps=40)
    lines = agent.log_path.read_text(errors="replace").splitlines()
    after = "\n".join(line for line in lines if _ts(line) > killed_at)
    # ...and the agent went on through the next replica of its list.
    assert f"session open with {addresses[other]}" in after, agent.log_tail(30)
    assert "self-fence" not in after
    metrics = cluster.coordinator_metrics
    assert _series(metrics[other], "lazarus_forwarded_sessions", 'side="follower"') == 1
    assert _series(metrics[leader], "lazarus_failure_detection_seconds_count") == 0


async def test_a_follower_acks_nothing_the_leader_did_not_hear(
    make_cluster: MakeCluster,
) -> None:
    """Rule (a) of docs/fan-in.md, checked from the tasks' side effects.

    The leader and etcd are SIGSTOPped together: the followers' links stay
    open but nothing answers, and no next leader can be elected. A follower
    that acked heartbeats on its own would keep its agent's fence deadline
    moving and its tasks stepping; the rule says the agents fence within
    their fence bound (heartbeat 0.5 s + fence 5 s after the last heartbeat
    the leader acked), and every task's steps stop by then.
    """
    cluster, leader, _ = await _fan_in_cluster(make_cluster)
    key = f"effects-{uuid.uuid4().hex[:6]}"
    await _submit(cluster, 4, steps=400, step_ms=100, key=key)
    await _until(
        lambda: len({e["task"] for e in _side_effects(cluster, key) if e["what"] == "step"}) == 4,
        30,
        "all 4 tasks stepping",
    )
    assert cluster.etcd is not None
    stopped_at = time.time()
    cluster.coordinators[leader].pause()
    cluster.etcd.pause()
    try:
        await asyncio.sleep(0.5 + 5.0 + 2.5)
        last_step = max(e["t"] for e in _side_effects(cluster, key) if e["what"] == "step")
    finally:
        cluster.etcd.resume()
        cluster.coordinators[leader].resume()
    # Every heartbeat the leader acked was sent before the stop: the fence
    # bound is h + f after it, plus one step that had already begun.
    assert last_step < stopped_at + 0.5 + 5.0 + 0.1 + 0.3, last_step - stopped_at
    for agent in cluster.agents:
        assert "self-fence" in agent.log_path.read_text(errors="replace"), agent.log_tail(20)


class _ProbeAgent:
    """A node agent reduced to its Session: Hello, a heartbeat every 0.5 s, what came back.

    Everything is timed on this process's monotonic clock, which on one host is
    the replicas' clock too.
    """

    def __init__(self, cluster: LocalCluster, address: str, node_id: str) -> None:
        assert cluster.certs is not None
        tls = cluster.certs.client_tls(IdentityKind.NODE, node_id)
        self.node_id = node_id
        self.channel = tls.aio_channel(address)
        self.call: Any = self.channel.stream_stream(
            "/lazarus.v1.AgentService/Session",
            request_serializer=agent_pb2.AgentMessage.SerializeToString,
            response_deserializer=agent_pb2.CoordinatorMessage.FromString,
        )()
        self.incarnation = uuid.uuid4().hex[:12]
        self.open = False  # as the agent: heartbeats only on a Welcomed Session
        self.sent: dict[int, float] = {}
        self.received: list[tuple[float, str, Any]] = []  # (when, body, message)
        self._seq = 0
        self.hellos = 0  # Hello.hello_seq, as the agent counts them
        self._tasks: list[asyncio.Task[None]] = []
        self._writing = asyncio.Lock()  # grpc.aio: one write at a time on a call

    async def start(self) -> None:
        await self.hello()
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._beat())]

    async def hello(self) -> None:
        self.hellos += 1
        hello = agent_pb2.Hello(
            node_id=self.node_id,
            incarnation=self.incarnation,
            capacity=records_pb2.NodeCapacity(slots=1),
            hello_seq=self.hellos,
        )
        async with self._writing:
            await self.call.write(agent_pb2.AgentMessage(hello=hello))

    async def _read(self) -> None:
        async for reply in self.call:
            body = reply.WhichOneof("body")
            self.received.append((time.monotonic(), body, getattr(reply, body)))
            if body == "welcome":
                self.open = True
            if body == "reattach":
                self.open = False
                await self.hello()  # as the agent does: a fresh Hello on the same stream

    async def _beat(self) -> None:
        while True:
            if not self.open:
                await asyncio.sleep(0.05)
                continue
            self._seq += 1
            now = time.monotonic()
            self.sent[self._seq] = now
            beat = agent_pb2.Heartbeat(
                seq=self._seq,
                sent_at_unix_ms=int(time.time() * 1000),
                sent_at_monotonic_ms=int(now * 1000),
            )
            async with self._writing:
                await self.call.write(agent_pb2.AgentMessage(heartbeat=beat))
            await asyncio.sleep(0.5)

    def interregnum_acks(self) -> list[tuple[float, int]]:
        """(when, seq) of the acks a follower gave by rule (b): no node state in them."""
        return [
            (when, message.seq)
            for when, body, message in self.received
            if body == "heartbeat_ack" and message.node_state == records_pb2.NODE_STATE_UNSPECIFIED
        ]

    def first(self, body: str, after: float = 0.0) -> float | None:
        return next((t for t, b, _ in self.received if b == body and t > after), None)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        self.call.cancel()
        await self.channel.close()


async def test_a_follower_acks_by_rule_b_while_no_leader_can_and_only_within_its_window(
    make_cluster: MakeCluster,
) -> None:
    """Rule (b) of docs/fan-in.md, checked from the agent's side of its stream.

    A probe agent holds its Session on a follower; the leader is SIGKILLed.
    No leader can ack a heartbeat sent after that and before the probe's
    Reattach (the next leader hears only the Hello that follows it), so every
    ack of one is the follower's own (b) ack. The rule gives some (the probe's
    fence does not have to bridge the whole election), and only for
    heartbeats that arrived within W of the last moment the old leader's
    election key existed; etcd is polled from here every 20 ms to time its
    deletion from outside. With ``--no-interregnum-acks`` no such ack comes
    (shown once when the test was written: the first assertion fails).
    """
    cluster, leader = await _replicas(make_cluster)
    host, _, port = cluster.etcd_endpoints[0].rpartition(":")
    etcd = aetcd.Client(host=host, port=int(port), timeout=2.0)
    prefix = election_prefix(cluster.cluster).encode()
    window_s = FanInSettings().interregnum_window_s  # the fan-in profile's W, 0.381 s
    # The probe holds its Session on the replica with the newest election key:
    # not the next leader (a replica that leads carries Sessions to itself).
    keys: list[Any] = []
    deadline = time.monotonic() + 20
    while len(keys) < 3 and time.monotonic() < deadline:  # every replica campaigns
        await asyncio.sleep(0.1)
        keys = sorted(await etcd.get_prefix(prefix), key=lambda kv: int(kv.create_revision))
    assert len(keys) == 3, keys
    old_term = int(keys[0].create_revision)
    follower = cluster.coordinator_addresses.index(bytes(keys[-1].value).decode())
    assert follower != leader
    probe = _ProbeAgent(cluster, cluster.coordinator_addresses[follower], "probe-1")
    try:
        await probe.start()
        await _until(lambda: probe.first("welcome") is not None, 20, "the leader's Welcome")
        await asyncio.sleep(3.0)  # a few heartbeats acked by the leader, through the follower
        assert probe.first("heartbeat_ack") is not None
        killed_at = time.monotonic()
        cluster.coordinators[leader].kill()
        gone_at = None
        while gone_at is None and time.monotonic() < killed_at + 10:
            terms = {int(kv.create_revision) for kv in await etcd.get_prefix(prefix)}
            if old_term not in terms:
                gone_at = time.monotonic()
            await asyncio.sleep(0.02)
        assert gone_at is not None, "the dead leader's key was never deleted"
        await _until(lambda: probe.first("reattach", killed_at) is not None, 20, "a Reattach")
        reattach_at = probe.first("reattach", killed_at)
        assert reattach_at is not None
        await _until(
            lambda: probe.first("welcome", reattach_at) is not None,
            20,
            f"a new Welcome; read {[(round(t - killed_at, 2), b) for t, b, _ in probe.received]}",
        )
        await asyncio.sleep(1.5)
        # Never judged: still ALIVE while its stream is open (closing it makes it SUSPECT).
        nodes = {n.node_id: n for n in await cluster.list_nodes()}
        assert nodes["probe-1"].state == records_pb2.NODE_STATE_ALIVE
    finally:
        await probe.close()
        await etcd.close()
    # Acks of heartbeats sent after the kill and before the Reattach: no
    # leader heard those, so each is the follower's own, and says so (no node
    # state: a follower does not judge nodes), under the term of the Session
    # it extends (the leader that Welcomed it). It may reach the probe after
    # the Reattach when the next leader was quicker than the follower's read.
    welcomed_term = next(m.term for _, body, m in probe.received if body == "welcome")
    assert welcomed_term == old_term
    own = [
        message
        for _, body, message in probe.received
        if body == "heartbeat_ack" and killed_at < probe.sent[message.seq] < reattach_at
    ]
    assert own, (
        f"no (b) ack: killed at 0, key gone at {gone_at - killed_at:.2f} s, "
        f"Reattach at {reattach_at - killed_at:.2f} s"
    )
    for message in own:
        assert message.node_state == records_pb2.NODE_STATE_UNSPECIFIED, message
        assert message.term == welcomed_term, message
    # Every (b) ack, whenever it came, is for a heartbeat sent (so arrived) no
    # later than W after the key went: none on the next leader's Session.
    given = probe.interregnum_acks()
    assert len(given) >= len(own)
    for _, seq in given:
        sent = probe.sent[seq]
        assert sent <= gone_at + window_s, (seq, sent - gone_at, window_s)
    metrics = cluster.coordinator_metrics
    assert _series(metrics[follower], "lazarus_forward_interregnum_acks_total") == len(given)
    # The new leader's acks resumed after its Welcome.
    welcome_at = probe.first("welcome", reattach_at)
    assert welcome_at is not None
    assert probe.first("heartbeat_ack", welcome_at) is not None
    # Each Welcome, carried through the follower, names the Hello it answers:
    # the first Hello's, then the one said on the same stream after the Reattach.
    echoed = [m.hello_seq for _, body, m in probe.received if body == "welcome"]
    assert echoed == [1, 2], echoed
