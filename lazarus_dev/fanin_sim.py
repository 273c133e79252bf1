"""A seeded simulator of fan-in: replicas that hold Sessions, an etcd lease election, real agents.

Theory of operation: one seed drives every clock, delay and fault. Three
coordinator replicas each hold node Sessions and run the REAL
``coordinator.core.fanin.FollowerCore``; they campaign in an etcd stand-in
(one lease and one key per campaign, the lowest create revision leads, leases
expire on etcd's own clock, checked every ``lessor_interval_s`` as etcd's
lessor does). Nodes are the REAL ``node_agent.core.AgentCore``: its heartbeat
and self-fence rule (``fence_deadline``) decide when a node stops; the shell
around it is modelled (a tick every ``node_tick_s`` of its clock, reconnect to
a random replica after a Session ends, a Hello timeout). Only the leader is a
model of ``coordinator.core.core``'s liveness part, faithful to it in what the
proof uses:

- it judges only while it holds authority: from reading its key lowest until
  ``safe_lease_deadline`` of its newest answered keepalive (then it steps down
  and campaigns again with a new lease);
- a forwarded heartbeat counts at its arrival, on the leader's clock; a
  confirmation is sent only under authority; a heartbeat of a node it (or an
  earlier leader) declared DEAD is refused until that node's Hello is
  confirmed (the Welcome);
- after its election it judges no node for ``dead_after_s +
  new_leader_floor_s`` (``leader_grace_s``), then a node is DEAD after
  ``dead_after_s`` of silence (the first tick at or after it).

Relay mode (``FanInConfig.relay``): replicas carry Sessions as the shell
(``coordinator.forwarding``) does, with the REAL pure
``coordinator.core.relay``: a replica that leads serves its Sessions itself; a
follower holds each agent stream in a ``SessionRelay`` and forwards its
messages (``route()``) over its one link to the leader that ``LinkPolicy``
chose (an election read, ``newest_leader``, ``choose``, a dial and the
leader's accept, ``link_accepted``; a new Session waits ``session_wait_s`` /
``retry_new_session_s`` for that attempt, else NotLeader and the agent
redials). The leader steps what a link carries at its arrival, on its clock
(``digest_eligible``: a Session must start with a Hello) and answers over the
link; a leader that stops leading ends each forwarded Session UNAVAILABLE and
its links within ``LEADERSHIP_CHECK_S``. A link fails when its leader crashes,
stops leading or the election moves past it (``link_outdated``; ``failed``
with ``link_led``); its Sessions are detached (``leader_end_detaches`` for a
Session the leader ended), Reattached at the pace of ``reattach()`` /
``next_reattach_s()`` once a leader answers (a follower that leads links to
itself), opened at the new leader by the agent's next Hello, ended when
``expired()``. Rule (b) runs as the shell runs it: ``FollowerCore(forward=False)``
fed the heartbeats of Sessions whose Welcome it covers, its acks moving a
detached Session to the deferred queue. A link's messages are not lost to a
partition (TCP, no keepalive): they stall until it heals.

Faults: partitions between every pair of kinds (node-replica,
replica-replica, replica-etcd, which includes leader-etcd), replica crash and
restart (the leader more often), leader resign, node crash and restart (a new
incarnation), message delay spikes (messages reorder), and clock rates in
``1 ± clock_drift`` (half the processes at the extremes). A safety phase with
faults is followed by a healed phase.

The checker runs after every event: a node that an authority declared DEAD
(and whose Hello no leader confirmed since) must not consider itself unfenced:
``AgentCore.ownership().valid_at(its clock now)`` must be False. A failure
raises ``SimulationFailure`` whose message starts with ``seed=<n>`` and ends
with the replay command. At the end of the healed phase every live node must
hold an open Session (a liveness check, so a run that fenced everything does
not pass for safe).

Not modelled (yet): tasks (only the fence is checked: the task layer above it
is ``lazarus_dev.fleetsim``'s), process stalls, etcd as several members (one
linearizable store; a read's answer reflects etcd when it handled it), the
mass-failure guard, message duplication, Hello/Welcome reconciliation of held
tasks, and the shell's admission control on reconnect storms. In relay mode:
the election watch is the core's reads (at the fast interval, not slowed
while the leader's acks come through: reads also drive the replicas' own
roles here), liveness digests and their batch linger (each carried heartbeat
is stepped alone at its arrival), a replaced Session at the leader (a second
Hello of a node elsewhere), the outbound-queue limit, replicas with
different timings (every Welcome is covered), and NotLeader's retry_after
(the agent redials after its own 0.05-0.5 s).

Purity: no clock, no IO, randomness only from ``random.Random(seed)``
(``tests/unit/test_fanin_sim.py`` runs the purity checker on this module).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from random import Random

from coordinator.core import fanin
from coordinator.core.fanin import (
    Ack,
    AckBasis,
    BatchConfirmed,
    ElectionObserved,
    EntryKind,
    FanInSettings,
    FollowerCore,
    ForwardBatch,
    HeartbeatReceived,
    ReadElection,
    SessionEnded,
    safe_lease_deadline,
)
from coordinator.core.relay import (
    ELECTION_READ_TIMEOUT_S,
    LEADERSHIP_CHECK_S,
    LINK_CONNECT_TIMEOUT_S,
    RELINK_INTERVAL_S,
    UNAVAILABLE,
    Carry,
    LinkChoice,
    LinkPolicy,
    RelaySettings,
    Route,
    SessionRelay,
    digest_eligible,
    leader_end_detaches,
    link_accepted,
    link_led,
    link_outdated,
    newest_leader,
)
from node_agent import core as agent_core
from node_agent.core import AgentCore, SessionState
from node_agent.core import records as agent_records
from node_agent.core.dial import HOLD_OFF_S, DialEnd, DialPlan

__all__ = [
    "FAULT_KINDS",
    "FanInConfig",
    "FanInReport",
    "FanInSimulation",
    "SimulationFailure",
    "replay_command",
    "sweep",
]

FAULT_KINDS = (
    "partition_node_replica",
    "partition_replica_replica",
    "partition_replica_etcd",
    "partition_leader_etcd",
    "crash_leader",
    "crash_replica",
    "resign",
    "crash_node",
)
"""Every fault the safety phase draws from (uniformly)."""

ETCD = "etcd"
AGENT_DIALS = ("service", "list")

CANCELLED = 1
FAILED_PRECONDITION = 9


class SimulationFailure(AssertionError):
    """A checker found a broken invariant; the message starts with ``seed=<n>``."""


def replay_command(seed: int, *, relay: bool = False) -> str:
    """The shell command that replays ``seed`` (in relay mode with ``relay``)."""
    return f"python -m lazarus_dev.fanin_sim --seed {seed}" + (" --relay" if relay else "")


@dataclass(frozen=True, slots=True)
class FanInConfig:
    """Shape of one run.

    Attributes:
        settings: the fan-in timing under test (replicas, leader, Welcome).
        nodes: node agents in the fleet.
        replicas: coordinator replicas.
        safety_s: simulated seconds with faults.
        heal_s: simulated seconds after every fault healed.
        fault_rate_per_s: expected faults per simulated second.
        faults: the fault kinds drawn (a subset of ``FAULT_KINDS``).
        max_latency_s: one-way delay is uniform in [0.5 ms, this].
        spike_probability: chance a message takes a spike delay instead.
        max_spike_s: a spike delay is uniform in [max_latency_s, this].
        clock_drift: each clock's rate is in [1 - d, 1 + d] (at most the
            settings' ``clock_drift``, which the rule assumes).
        node_tick_s: the agent shell's tick period (node clock).
        replica_tick_s: a replica's FollowerCore tick period.
        leader_tick_s: the leader's verdict tick period.
        fence_lead_s: the agents' ``fence_lead_s``.
        progress_report_interval_s: the agents' ``progress_report_interval_s``
            (1 s, not the 5 s default, so short runs carry Checkpointed updates).
        hello_timeout_s: an agent gives up on a Hello without Welcome after this.
        keepalives_per_ttl: keepalives per lease TTL (``coordinator.election``: 6).
        lessor_interval_s: etcd checks lease expiry this often (its clock).
        leader_grace_s: a new leader's grace; None: ``dead_after_s + new_leader_floor_s``.
        script: (time, fault kind) pairs run instead of random faults when not empty.
        max_down_s: a crashed process or a partition lasts up to this long.
        relay: followers carry Sessions as ``coordinator.forwarding`` does (the
            real ``SessionRelay`` and ``LinkPolicy``, a link per follower,
            ``FollowerCore(forward=False)`` for rule (b) only); False: the
            core's own forwarding (``ForwardBatch``/``BatchConfirmed``).
        reattach_rate_per_s: the relay's Reattach pace. The shell's 500/s over
            333 Sessions per follower (1,000 nodes) takes as long as 4/s over
            this fleet's 2 or 3: scaled so pacing and deferral matter.
        agent_dial: how an agent picks the replica it dials. ``"service"``: at
            random each time, the crashed one included (one Kubernetes
            Service address: kube-proxy picks); ``"list"``: the real agent's
            ``node_agent.core.dial.DialPlan`` over every replica (a
            ``--coordinators`` list, each node starting where the agent does,
            ``spread_start`` of its node id),
            holding off a replica it could not reach for ``dial_hold_off_s``.
        dial_hold_off_s: ``DialPlan``'s hold-off in ``"list"`` mode (node clock).
    """

    settings: FanInSettings = field(default_factory=FanInSettings)
    nodes: int = 6
    replicas: int = 3
    safety_s: float = 30.0
    heal_s: float = 15.0
    fault_rate_per_s: float = 0.5
    faults: tuple[str, ...] = FAULT_KINDS
    max_latency_s: float = 0.01
    spike_probability: float = 0.02
    max_spike_s: float = 0.6
    clock_drift: float = 0.01
    node_tick_s: float = 0.1
    replica_tick_s: float = 0.05
    leader_tick_s: float = 0.1
    fence_lead_s: float = 0.5
    progress_report_interval_s: float = 1.0
    hello_timeout_s: float = 2.0
    keepalives_per_ttl: int = 6
    lessor_interval_s: float = 0.5
    leader_grace_s: float | None = None
    script: tuple[tuple[float, str], ...] = ()
    max_down_s: float = 10.0
    relay: bool = False
    reattach_rate_per_s: float = 4.0
    agent_dial: str = "service"
    dial_hold_off_s: float = HOLD_OFF_S

    def __post_init__(self) -> None:
        if self.agent_dial not in AGENT_DIALS:
            raise ValueError(f"agent_dial must be one of {AGENT_DIALS}, got {self.agent_dial!r}")


@dataclass(frozen=True, slots=True)
class FanInReport:
    """What one run did (for tests that the faults were exercised)."""

    seed: int
    events: int
    acks: dict[str, int]
    verdicts: int
    fences: int
    elections: int
    faults: dict[str, int]
    relay: dict[str, int] = field(default_factory=dict)


# ---------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Clock:
    rate: float
    offset: float

    def local(self, t: float) -> float:
        return self.offset + self.rate * t

    def real_after(self, local_s: float) -> float:
        return local_s / self.rate


@dataclass(slots=True)
class _Lease:
    lease_id: int
    expiry_s: float  # etcd clock


@dataclass(slots=True)
class _Etcd:
    clock: _Clock
    revision: int = 1
    next_lease: int = 1
    leases: dict[int, _Lease] = field(default_factory=dict)
    keys: dict[int, tuple[str, int]] = field(default_factory=dict)  # term -> (replica, lease)

    def delete_lease(self, lease_id: int) -> None:
        if self.leases.pop(lease_id, None) is None:
            return
        for term in [t for t, (_, lease) in self.keys.items() if lease == lease_id]:
            self.revision += 1
            del self.keys[term]

    def lowest(self) -> tuple[int | None, str]:
        if not self.keys:
            return None, ""
        term = min(self.keys)
        return term, self.keys[term][0]


@dataclass(slots=True)
class _Leading:
    term: int
    elected_s: float
    grace_until_s: float
    last_heard: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class _Link:
    """A follower's Forward stream to a leader (both ends' state; each end touches its own)."""

    link_id: int
    follower: str
    leader: str
    term: int
    said_accepted: bool | None = None  # the leader's answer: accepted, refused, not in time
    decided: bool = False  # the follower took its accept decision
    replied: bool = False  # a reply came through (``link_led``)
    closed: bool = False  # the follower's end failed it
    last_ack_s: float | None = None
    next_sid: int = 0
    sessions: dict[str, _Held] = field(default_factory=dict)  # follower: forwarded id -> held
    served: dict[str, tuple[str, bool]] = field(default_factory=dict)  # leader: id -> (node, hello)


@dataclass(slots=True, eq=False)
class _Held:
    """One agent Session a follower carries (``coordinator.forwarding._Held``)."""

    stream: str
    node_id: str
    link: _Link | None = None
    fsid: str = ""
    acked_at: float | None = None
    extended: bool = False
    ikey: tuple[str, str] | None = None  # its FollowerCore key while rule (b) may ack it
    term: int = 0
    arrived: dict[int, float] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class _Attempt:
    """One link attempt in progress (election read, dial, accept)."""

    to_self: bool
    dialling: tuple[str, int] | None = None
    connecting: bool = False
    done: bool = False
    finish: Callable[[], None] = lambda: None
    waiters: list[Callable[[], None]] = field(default_factory=list)


@dataclass(slots=True)
class _Replica:
    replica_id: str
    clock: _Clock
    alive: bool = False
    gen: int = 0
    core: FollowerCore | None = None
    lease_id: int | None = None
    term: int | None = None
    safe_deadline_s: float = float("-inf")
    campaigning: bool = False
    leading: _Leading | None = None
    sessions: dict[str, str] = field(default_factory=dict)  # session id -> node id
    read_revision: int = -1  # newest etcd revision this replica's role followed
    # relay mode (the shell's SessionForwarder and ForwardService)
    relay: SessionRelay[str] | None = None
    policy: LinkPolicy | None = None
    link: _Link | None = None
    attempt: _Attempt | None = None
    why_unlinked: LinkChoice = LinkChoice.NO_LEADER
    observed: tuple[str, int] | None = None
    held: dict[str, _Held] = field(default_factory=dict)  # agent stream -> carried Session
    by_ikey: dict[tuple[str, str], _Held] = field(default_factory=dict)
    direct: dict[str, str] = field(default_factory=dict)  # leader-served stream -> node id
    opening: set[str] = field(default_factory=set)  # streams waiting for a link (``hold``)
    reattaching: bool = False
    links_in: dict[int, _Link] = field(default_factory=dict)  # leader: accepted links


@dataclass(slots=True)
class _Node:
    node_id: str
    clock: _Clock
    agent: AgentCore | None = None
    incarnation: int = 0
    gen: int = 0
    session: tuple[str, str] | None = None  # (replica id, session id)
    hello_deadline_s: float | None = None
    dial: DialPlan | None = None  # agent_dial "list": the agent's plan over the replicas
    welcomed: bool = False  # a Welcome came on the current Session


# ---------------------------------------------------------------------------
# The simulation
# ---------------------------------------------------------------------------


class FanInSimulation:
    """One seeded run; ``run()`` returns a report or raises ``SimulationFailure``.

    Args:
        seed: drives every random choice.
        config: the run's shape.
    """

    def __init__(self, seed: int, config: FanInConfig | None = None) -> None:
        self.seed = seed
        self.config = config or FanInConfig()
        self.settings = self.config.settings
        self.rng = Random(seed)
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._order = 0
        self._events = 0
        self._partitions: dict[frozenset[str], int] = {}
        self._dead: dict[str, str] = {}  # node id -> who declared it DEAD (the etcd record)
        self._acks = {basis.value: 0 for basis in AckBasis}
        self._verdicts = 0
        self._fences = 0
        self._elections = 0
        self._faults: dict[str, int] = {}
        self._next_session = 0
        self._next_link = 0
        self._open_links: dict[int, _Link] = {}
        self._relay_counts: dict[str, int] = {}
        self._relay_settings = RelaySettings(
            reattach_rate_per_s=self.config.reattach_rate_per_s,
            fence_after_ack_s=self.settings.heartbeat_interval_s
            + self.settings.fence_after_s
            - self.config.fence_lead_s,
        )
        self._grace_s = (
            self.config.leader_grace_s
            if self.config.leader_grace_s is not None
            else self.settings.dead_after_s + self.settings.new_leader_floor_s
        )
        self.etcd = _Etcd(self._new_clock())
        self.replicas = {
            f"r{i}": _Replica(f"r{i}", self._new_clock()) for i in range(self.config.replicas)
        }
        self.nodes = {f"n{i}": _Node(f"n{i}", self._new_clock()) for i in range(self.config.nodes)}

    # ------------------------------------------------------------ the loop

    def run(self) -> FanInReport:
        """Run the safety phase, heal, run the healed phase, check liveness.

        Raises:
            SimulationFailure: an invariant broke (message: seed, what, replay command).
        """
        cfg = self.config
        self._at(0.0, self._lessor)
        for replica in self.replicas.values():
            self._at(self.rng.uniform(0.0, 0.05), partial(self._start_replica, replica))
        for node in self.nodes.values():
            self._at(self.rng.uniform(0.3, 1.0), partial(self._spawn, node))
        for when, kind in cfg.script:
            self._at(when, partial(self._fault, kind))
        t = 2.0
        while not cfg.script and cfg.fault_rate_per_s > 0 and cfg.faults:
            t += self.rng.expovariate(cfg.fault_rate_per_s)
            if t >= cfg.safety_s:
                break
            self._at(t, self._fault)
        self._at(cfg.safety_s, self._heal)
        end = cfg.safety_s + cfg.heal_s
        while self._queue and self._queue[0][0] <= end:
            when, _, action = heapq.heappop(self._queue)
            self.now = when
            self._events += 1
            action()
            self._check()
        self._check_liveness()
        return FanInReport(
            seed=self.seed,
            events=self._events,
            acks=dict(self._acks),
            verdicts=self._verdicts,
            fences=self._fences,
            elections=self._elections,
            faults=dict(sorted(self._faults.items())),
            relay=dict(sorted(self._relay_counts.items())),
        )

    def _at(self, when: float, action: Callable[[], None]) -> None:
        self._order += 1
        heapq.heappush(self._queue, (when, self._order, action))

    def _fail(self, message: str) -> None:
        replay = replay_command(self.seed, relay=self.config.relay)
        raise SimulationFailure(f"seed={self.seed} t={self.now:.4f}: {message}\nreplay: {replay}")

    def _new_clock(self) -> _Clock:
        d = self.config.clock_drift
        roll = self.rng.random()
        rate = 1 - d if roll < 0.25 else 1 + d if roll < 0.5 else self.rng.uniform(1 - d, 1 + d)
        return _Clock(rate, self.rng.uniform(0.0, 1000.0))

    def _every(
        self, clock: _Clock, period_s: float, alive: Callable[[], bool], fn: Callable[[], None]
    ) -> None:
        """Call ``fn`` every ``period_s`` of ``clock`` while ``alive()``."""

        def go() -> None:
            if not alive():
                return
            fn()
            if alive():
                self._at(self.now + clock.real_after(period_s), go)

        self._at(self.now + clock.real_after(period_s) * self.rng.random(), go)

    # ------------------------------------------------------------ network

    def _up(self, a: str, b: str) -> bool:
        return frozenset((a, b)) not in self._partitions

    def _delay(self) -> float:
        """A message's transit time: up to ``max_latency_s``, now and then a spike."""
        cfg = self.config
        if self.rng.random() < cfg.spike_probability:
            return self.rng.uniform(cfg.max_latency_s, cfg.max_spike_s)
        return self.rng.uniform(0.0005, cfg.max_latency_s)

    def _send(self, src: str, dst: str, deliver: Callable[[], None]) -> None:
        """Deliver after a random delay unless a partition between the ends drops it."""
        if not self._up(src, dst):
            return

        def arrive() -> None:
            if self._up(src, dst):
                deliver()

        self._at(self.now + self._delay(), arrive)

    # ------------------------------------------------------------ etcd

    def _lessor(self) -> None:
        etcd = self.etcd
        local = etcd.clock.local(self.now)
        for lease in sorted(etcd.leases.values(), key=lambda lease: lease.lease_id):
            if lease.expiry_s <= local:
                etcd.delete_lease(lease.lease_id)
        self._at(self.now + etcd.clock.real_after(self.config.lessor_interval_s), self._lessor)

    def _etcd_campaign(self, replica_id: str) -> tuple[int, int, float]:
        etcd = self.etcd
        lease_id = etcd.next_lease
        etcd.next_lease += 1
        ttl = self.settings.lease_ttl_s
        etcd.leases[lease_id] = _Lease(lease_id, etcd.clock.local(self.now) + ttl)
        etcd.revision += 1
        etcd.keys[etcd.revision] = (replica_id, lease_id)
        return lease_id, etcd.revision, ttl

    def _etcd_keepalive(self, lease_id: int) -> float:
        lease = self.etcd.leases.get(lease_id)
        if lease is None:
            return 0.0
        ttl = self.settings.lease_ttl_s
        lease.expiry_s = self.etcd.clock.local(self.now) + ttl
        return ttl

    # ------------------------------------------------------------ replicas

    def _alive(self, replica: _Replica, gen: int) -> Callable[[], bool]:
        return lambda: replica.alive and replica.gen == gen

    def _start_replica(self, replica: _Replica) -> None:
        replica.alive = True
        replica.gen += 1
        replica.core = FollowerCore(self.settings, forward=not self.config.relay)
        if self.config.relay:
            replica.relay = SessionRelay(self._relay_settings)
            replica.policy = LinkPolicy(self._relay_settings)
        replica.link = replica.attempt = replica.observed = None
        replica.why_unlinked = LinkChoice.NO_LEADER
        replica.held, replica.by_ikey, replica.direct = {}, {}, {}
        replica.opening, replica.links_in = set(), {}
        replica.reattaching = False
        replica.lease_id = replica.term = None
        replica.safe_deadline_s = float("-inf")
        replica.campaigning = False
        replica.leading = None
        replica.sessions = {}
        replica.read_revision = -1
        gen = replica.gen
        alive = self._alive(replica, gen)
        self._campaign(replica)
        ttl = self.settings.lease_ttl_s
        self._every(
            replica.clock,
            ttl / self.config.keepalives_per_ttl,
            alive,
            lambda: self._keepalive(replica),
        )
        self._every(
            replica.clock, self.config.replica_tick_s, alive, lambda: self._replica_tick(replica)
        )
        self._every(
            replica.clock, self.config.leader_tick_s, alive, lambda: self._leader_tick(replica)
        )

    def _rlocal(self, replica: _Replica) -> float:
        return replica.clock.local(self.now)

    def _campaign(self, replica: _Replica) -> None:
        if replica.campaigning:
            return
        replica.campaigning = True
        sent = self._rlocal(replica)
        gen = replica.gen
        rid = replica.replica_id

        def at_etcd() -> None:
            lease_id, term, ttl = self._etcd_campaign(rid)
            self._send(ETCD, rid, lambda: answered(lease_id, term, ttl))

        def answered(lease_id: int, term: int, ttl: float) -> None:
            if not (replica.alive and replica.gen == gen):
                return
            replica.campaigning = False
            replica.lease_id, replica.term = lease_id, term
            replica.safe_deadline_s = safe_lease_deadline(sent, ttl, self.settings.clock_drift)

        self._send(rid, ETCD, at_etcd)
        # A lost request or answer: try again (a new lease) after the TTL.
        self._at(
            self.now + replica.clock.real_after(self.settings.lease_ttl_s),
            lambda: self._campaign_timeout(replica, gen),
        )

    def _campaign_timeout(self, replica: _Replica, gen: int) -> None:
        if (
            replica.alive
            and replica.gen == gen
            and replica.campaigning
            and replica.lease_id is None
        ):
            replica.campaigning = False
            self._campaign(replica)

    def _keepalive(self, replica: _Replica) -> None:
        lease_id = replica.lease_id
        if lease_id is None:
            return
        sent = self._rlocal(replica)
        gen = replica.gen
        rid = replica.replica_id

        def answered(ttl: float) -> None:
            if not (replica.alive and replica.gen == gen and replica.lease_id == lease_id):
                return
            if ttl <= 0:
                self._lose_lease(replica)
                return
            replica.safe_deadline_s = max(
                replica.safe_deadline_s, safe_lease_deadline(sent, ttl, self.settings.clock_drift)
            )

        self._send(
            rid,
            ETCD,
            lambda: self._send(ETCD, rid, partial(answered, self._etcd_keepalive(lease_id))),
        )

    def _lose_lease(self, replica: _Replica) -> None:
        """The lease is gone or its safe deadline passed: step down, campaign with a new lease."""
        self._step_down(replica)
        replica.lease_id = replica.term = None
        replica.safe_deadline_s = float("-inf")
        self._campaign(replica)

    def _step_down(self, replica: _Replica) -> None:
        if replica.leading is not None and self.config.relay:
            self._relay_stop_leading(replica)
        replica.leading = None

    def _authority(self, replica: _Replica) -> bool:
        """Leading and within the safe lease deadline (the leader's own clock)."""
        return replica.leading is not None and self._rlocal(replica) < replica.safe_deadline_s

    def _replica_tick(self, replica: _Replica) -> None:
        now = self._rlocal(replica)
        if replica.lease_id is not None and now >= replica.safe_deadline_s:
            self._lose_lease(replica)
        if replica.core is not None:  # a live replica always has one
            self._run(replica, replica.core.tick(now))

    def _run(self, replica: _Replica, commands: list[fanin.Command]) -> None:
        for command in commands:
            if isinstance(command, ReadElection):
                self._read(replica, command.read_id)
            elif isinstance(command, ForwardBatch):
                self._forward(replica, command)
            elif isinstance(command, Ack):
                if self.config.relay:
                    self._relay_interregnum_ack(replica, command)
                else:
                    self._ack(replica, command)

    def _step(self, replica: _Replica, event: fanin.Event) -> None:
        if replica.core is not None:
            self._run(replica, replica.core.step(event))

    def _read(self, replica: _Replica, read_id: int) -> None:
        gen = replica.gen
        rid = replica.replica_id

        def at_etcd() -> None:
            revision = self.etcd.revision
            term, leader_id = self.etcd.lowest()
            self._send(ETCD, rid, lambda: answered(revision, term, leader_id))

        def answered(revision: int, term: int | None, leader_id: str) -> None:
            if not (replica.alive and replica.gen == gen):
                return
            if revision >= replica.read_revision:
                replica.read_revision = revision
                self._observe_election(replica, term)
                if self.config.relay and term is not None:
                    self._leader_observed(replica, leader_id, term)
            self._step(
                replica, ElectionObserved(read_id, revision, term, leader_id, self._rlocal(replica))
            )

        self._send(rid, ETCD, at_etcd)

    def _observe_election(self, replica: _Replica, leader_term: int | None) -> None:
        """The replica's own role: lead when its key is the lowest and its lease is safe."""
        if replica.term is None or leader_term is None:
            return
        if leader_term == replica.term:
            if replica.leading is None and self._rlocal(replica) < replica.safe_deadline_s:
                self._become_leader(replica)
        elif replica.leading is not None:
            self._lose_lease(replica)  # our key is gone (another key is lowest)

    def _become_leader(self, replica: _Replica) -> None:
        now = self._rlocal(replica)
        if replica.term is None:
            return
        replica.leading = _Leading(replica.term, now, now + self._grace_s)
        self._elections += 1

    def _leader_tick(self, replica: _Replica) -> None:
        if replica.leading is None:
            return
        if not self._authority(replica):
            self._step_down(replica)
            return
        leading = replica.leading
        now = self._rlocal(replica)
        if now < leading.grace_until_s:
            return
        for node_id in sorted(self.nodes):
            if node_id in self._dead:
                continue
            last = leading.last_heard.get(node_id)
            if last is not None and now < last + self.settings.dead_after_s:
                continue
            self._declare_dead(replica, node_id)

    def _declare_dead(self, replica: _Replica, node_id: str) -> None:
        self._dead[node_id] = (
            f"{replica.replica_id} (term {replica.leading.term if replica.leading else '?'})"
        )
        self._verdicts += 1
        self._check_node(node_id)

    def _confirm(self, replica: _Replica, batch: ForwardBatch) -> tuple[str, ...] | None:
        """The leader's side of a batch: None without authority, else the refused nodes."""
        if not self._authority(replica) or replica.leading is None:
            return None
        if batch.leader_term != replica.leading.term:
            return None
        now = self._rlocal(replica)
        refused: list[str] = []
        for entry in batch.entries:
            if entry.kind is EntryKind.HEARTBEAT and entry.node_id in self._dead:
                refused.append(entry.node_id)
                continue
            replica.leading.last_heard[entry.node_id] = now
            if entry.kind is EntryKind.HELLO:
                self._dead.pop(entry.node_id, None)
        return tuple(sorted(set(refused)))

    def _forward(self, replica: _Replica, batch: ForwardBatch) -> None:
        rid = replica.replica_id
        if batch.leader_id == rid:
            refused = self._confirm(replica, batch)
            if refused is not None:
                self._step(replica, BatchConfirmed(batch.batch_id, self._rlocal(replica), refused))
            return
        leader = self.replicas.get(batch.leader_id)
        if leader is None:
            return
        gen = replica.gen

        def at_leader(lgen: int = leader.gen) -> None:
            if not (leader.alive and leader.gen == lgen):
                return
            refused = self._confirm(leader, batch)
            if refused is not None:
                self._send(leader.replica_id, rid, lambda: confirmed(refused))

        def confirmed(refused: tuple[str, ...]) -> None:
            if replica.alive and replica.gen == gen:
                self._step(replica, BatchConfirmed(batch.batch_id, self._rlocal(replica), refused))

        self._send(rid, leader.replica_id, at_leader)

    def _ack(self, replica: _Replica, ack: Ack) -> None:
        self._acks[ack.basis.value] += 1
        term = replica.leading.term if replica.leading else 0
        message: agent_records.CoordinatorMessage
        if ack.kind is EntryKind.HELLO:
            message = self._welcome(term, replica.replica_id, ack.session_id)
        else:
            message = agent_records.HeartbeatAck(ack.seq, term)
        self._to_agent(replica, ack.session_id, ack.node_id, message)

    def _replica_receive(
        self, replica: _Replica, gen: int, node_id: str, session_id: str, seq: int, kind: EntryKind
    ) -> None:
        if not (replica.alive and replica.gen == gen):
            return
        if self.config.relay:
            self._relay_receive(replica, node_id, session_id, seq, kind)
            return
        if kind is EntryKind.HELLO:
            replica.sessions[session_id] = node_id
        elif replica.sessions.get(session_id) != node_id:
            return
        self._step(
            replica, HeartbeatReceived(node_id, session_id, seq, self._rlocal(replica), kind)
        )

    def _replica_session_ended(
        self, replica: _Replica, gen: int, node_id: str, session_id: str
    ) -> None:
        if self.config.relay:
            if replica.alive and replica.gen == gen:
                self._relay_stream_ended(replica, session_id)
            return
        if (
            replica.alive
            and replica.gen == gen
            and replica.sessions.pop(session_id, None) is not None
        ):
            self._step(replica, SessionEnded(node_id, session_id, self._rlocal(replica)))

    def _crash_replica(self, replica: _Replica, down_s: float) -> None:
        if not replica.alive:
            return
        replica.alive = False
        replica.gen += 1
        replica.leading = None
        replica.core = None
        if self.config.relay:
            self._relay_crash(replica)
        for node in self.nodes.values():
            if node.session is not None and node.session[0] == replica.replica_id:
                session = node.session
                self._at(
                    self.now + self.rng.uniform(0.02, 1.0),
                    partial(self._node_stream_broke, node, session),
                )
        replica.sessions = {}
        self._at(self.now + down_s, lambda: self._start_replica(replica))

    def _resign(self, replica: _Replica) -> None:
        if replica.leading is None or replica.lease_id is None:
            return
        lease_id = replica.lease_id
        self._step_down(replica)  # stop first, then revoke (election.Leadership.resign)
        replica.lease_id = replica.term = None
        replica.safe_deadline_s = float("-inf")
        self._send(replica.replica_id, ETCD, lambda: self.etcd.delete_lease(lease_id))
        gen = replica.gen
        self._at(
            self.now + 0.3,
            lambda: self._campaign(replica) if replica.alive and replica.gen == gen else None,
        )

    # ------------------------------------------------------------ relay mode
    #
    # The shell's SessionForwarder (follower) and ForwardService (leader) as
    # events: every decision is the real relay's or link policy's.

    def _count(self, what: str) -> None:
        self._relay_counts[what] = self._relay_counts.get(what, 0) + 1

    def _send_stream(self, src: str, dst: str, deliver: Callable[[], None]) -> None:
        """A message on an established link (TCP): a partition delays it until it heals.

        The shell sets no gRPC keepalive: a cut-off link neither breaks nor
        loses what was written; it stalls, then delivers (in the sim's order).
        """

        def arrive() -> None:
            if self._up(src, dst):
                deliver()
            else:
                self._at(self.now + 0.1, arrive)

        self._at(self.now + self._delay(), arrive)

    def _to_agent(
        self,
        replica: _Replica,
        stream: str,
        node_id: str,
        message: agent_records.CoordinatorMessage,
    ) -> None:
        node = self.nodes[node_id]
        session = (replica.replica_id, stream)
        self._send(replica.replica_id, node_id, lambda: self._node_receive(node, session, message))

    def _end_agent_stream(self, replica: _Replica, stream: str, node_id: str) -> None:
        """The replica ends the agent's stream (a status): the agent sees it broken."""
        node = self.nodes[node_id]
        session = (replica.replica_id, stream)
        self._send(replica.replica_id, node_id, lambda: self._node_stream_broke(node, session))

    def _welcome(self, term: int, leader_id: str, session_id: str) -> agent_records.Welcome:
        s = self.settings
        return agent_records.Welcome(
            term=term,
            leader_id=leader_id,
            session_id=session_id,
            heartbeat_interval_ms=round(s.heartbeat_interval_s * 1000),
            fence_after_ms=round(s.fence_after_s * 1000),
            dead_after_ms=round(s.dead_after_s * 1000),
        )

    def _leader_step(self, replica: _Replica, node_id: str, kind: EntryKind) -> bool | None:
        """The leader steps a Hello or heartbeat at its arrival: None without authority,
        False when refused (a heartbeat of a node declared DEAD), else True."""
        if not self._authority(replica) or replica.leading is None:
            return None
        if kind is EntryKind.HEARTBEAT and node_id in self._dead:
            return False
        replica.leading.last_heard[node_id] = self._rlocal(replica)
        if kind is EntryKind.HELLO:
            self._dead.pop(node_id, None)
        return True

    # -- an agent's stream at a replica (AgentSessionService.Session)

    def _relay_receive(
        self, replica: _Replica, node_id: str, stream: str, seq: int, kind: EntryKind
    ) -> None:
        if stream in replica.direct:
            self._direct_message(replica, stream, node_id, seq, kind)
        elif stream in replica.held:
            self._carried_message(replica, replica.held[stream], seq, kind)
        elif kind is EntryKind.HELLO and stream not in replica.opening:
            if replica.leading is not None:  # runtime.leading: served here
                replica.direct[stream] = node_id
                self._count("direct_sessions")
                self._direct_message(replica, stream, node_id, seq, kind)
            else:
                self._new_session(replica, node_id, stream)

    def _direct_message(
        self, replica: _Replica, stream: str, node_id: str, seq: int, kind: EntryKind
    ) -> None:
        if self._leader_step(replica, node_id, kind) is not True or replica.leading is None:
            return
        term = replica.leading.term
        if kind is EntryKind.HELLO:
            message: agent_records.CoordinatorMessage = self._welcome(
                term, replica.replica_id, stream
            )
        else:
            message = agent_records.HeartbeatAck(seq, term)
            self._acks[AckBasis.CONFIRMED.value] += 1
        self._to_agent(replica, stream, node_id, message)

    def _relay_stream_ended(self, replica: _Replica, stream: str) -> None:
        """The agent's stream ended (``SessionForwarder.hold``'s finally)."""
        replica.direct.pop(stream, None)
        replica.opening.discard(stream)
        held = replica.held.pop(stream, None)
        if held is None:
            return
        assert replica.relay is not None
        replica.relay.released(stream)
        self._interregnum_ended(replica, held)
        self._forget(replica, held)

    def _forget(self, replica: _Replica, held: _Held) -> None:
        """End ``held``'s forwarded Session at the leader (``_Link.forget``)."""
        link, fsid = held.link, held.fsid
        if link is None or not fsid:
            return
        link.sessions.pop(fsid, None)
        held.link, held.fsid = None, ""
        if not link.closed:
            self._link_entry(replica, link, fsid, "end", 0)

    def _relay_end(self, replica: _Replica, held: _Held) -> None:
        """The follower ends a held Session with UNAVAILABLE (``SessionForwarder._end``)."""
        replica.held.pop(held.stream, None)
        assert replica.relay is not None
        replica.relay.released(held.stream)
        self._interregnum_ended(replica, held)
        self._forget(replica, held)
        self._end_agent_stream(replica, held.stream, held.node_id)

    # -- a new Session at a follower (hold, _link_for_new_session)

    def _new_session(self, replica: _Replica, node_id: str, stream: str) -> None:
        policy = replica.policy
        assert policy is not None
        replica.opening.add(stream)
        gen = replica.gen
        started = self._rlocal(replica)
        node = self.nodes[node_id]

        def gone() -> bool:
            return (
                not (replica.alive and replica.gen == gen)
                or stream not in replica.opening
                or node.session != (replica.replica_id, stream)
            )

        def not_leader() -> None:
            replica.opening.discard(stream)
            self._count("not_leader")
            self._to_agent(replica, stream, node_id, agent_records.NotLeader())

        def settled() -> bool:
            """Gone, or admitted on the open link: nothing left to decide."""
            if gone():
                return True
            link = replica.link
            if link is not None and not link.closed:
                admit(link)
                return True
            return False

        def loop() -> None:
            if settled():
                return
            attempt = replica.attempt
            if attempt is None:
                self._current_link(replica, False, after)
                return
            wait_s = policy.session_wait_s(attempt.dialling)
            if wait_s <= 0:
                not_leader()
                return
            left_s = max(0.0, wait_s - (self._rlocal(replica) - started))
            fired = [False]

            def outcome() -> None:
                if not fired[0]:
                    fired[0] = True
                    after()

            def timeout() -> None:
                if not fired[0] and not gone():
                    fired[0] = True
                    not_leader()

            attempt.waiters.append(outcome)
            self._at(self.now + replica.clock.real_after(left_s), timeout)

        def after() -> None:
            if settled():
                return
            retry_s = policy.retry_new_session_s(
                replica.why_unlinked, self._rlocal(replica) - started
            )
            if retry_s is None:
                not_leader()
                return
            self._at(self.now + replica.clock.real_after(retry_s), loop)

        def admit(link: _Link) -> None:
            assert replica.relay is not None
            replica.opening.discard(stream)
            held = _Held(stream, node_id)
            replica.held[stream] = held
            replica.relay.held(stream)
            self._open(link, held)
            self._count("carried_sessions")
            self._carried_message(replica, held, 0, EntryKind.HELLO)

        loop()

    # -- links (_current_link, _attempt_link)

    def _current_link(self, replica: _Replica, to_self: bool, done: Callable[[], None]) -> None:
        """Call ``done`` once the open link is there or an attempt for one ended."""
        link = replica.link
        if link is not None and not link.closed:
            done()
            return
        attempt = replica.attempt
        if attempt is not None:  # the lock: wait for it, then look again
            attempt.waiters.append(lambda: self._current_link(replica, to_self, done))
            return
        self._attempt_link(replica, to_self).waiters.append(done)

    def _attempt_link(self, replica: _Replica, to_self: bool) -> _Attempt:
        policy = replica.policy
        assert policy is not None
        attempt = _Attempt(to_self)
        replica.attempt = attempt
        replica.why_unlinked = LinkChoice.RETRY_SOON
        gen = replica.gen
        rid = replica.replica_id

        def finish() -> None:
            if attempt.done:
                return
            attempt.done = True
            if replica.attempt is attempt:
                replica.attempt = None
            for waiter in attempt.waiters:
                waiter()

        def live() -> bool:
            return replica.alive and replica.gen == gen and not attempt.done

        def at_etcd() -> None:
            term, leader_id = self.etcd.lowest()
            self._send(ETCD, rid, lambda: read(term, leader_id))

        def read(term: int | None, leader_id: str) -> None:
            if not live() or attempt.connecting or attempt.dialling is not None:
                return
            leader = newest_leader(
                (leader_id, term) if term is not None else None, replica.observed
            )
            choice = policy.choose(
                leader[0] if leader is not None else "",
                leader[1] if leader is not None else 0,
                rid,
                leading=replica.leading is not None,
                to_self=to_self,
                now_s=self._rlocal(replica),
            )
            if choice is not LinkChoice.DIAL or leader is None:
                replica.why_unlinked = (
                    choice if choice is not LinkChoice.DIAL else LinkChoice.NO_LEADER
                )
                finish()
                return
            dial(leader)

        def read_timeout() -> None:
            if live() and attempt.dialling is None:
                finish()  # etcd cut off or slow: no leader we can name

        def dial(leader: tuple[str, int]) -> None:
            address, term = leader
            attempt.dialling = leader
            attempt.connecting = True
            target = self.replicas[address]

            def at_target() -> None:
                if target.alive:  # the process answers the connection
                    self._send(address, rid, connected)

            def connected() -> None:
                if live() and attempt.connecting:
                    attempt.connecting = False
                    attempt.dialling = None
                    self._open_link(replica, address, term, finish)

            def connect_timeout() -> None:
                if live() and attempt.connecting:
                    attempt.connecting = False
                    attempt.dialling = None
                    policy.failed(address, term, self._rlocal(replica), accepted=False)
                    finish()

            self._send(rid, address, at_target)
            self._at(self.now + replica.clock.real_after(LINK_CONNECT_TIMEOUT_S), connect_timeout)

        attempt.finish = finish
        self._send(rid, ETCD, at_etcd)
        self._at(self.now + replica.clock.real_after(ELECTION_READ_TIMEOUT_S), read_timeout)
        return attempt

    def _open_link(
        self, replica: _Replica, address: str, term: int, finish: Callable[[], None]
    ) -> None:
        """Open the Forward stream and wait for the leader's answer (``_Link.accept``)."""
        policy = replica.policy
        assert policy is not None
        self._next_link += 1
        rid = replica.replica_id
        link = _Link(self._next_link, rid, address, term)
        self._open_links[link.link_id] = link
        target = self.replicas[address]
        tgen = target.gen
        gen = replica.gen

        def at_target() -> None:
            if not (target.alive and target.gen == tgen):
                return  # that process is gone: its crash breaks the stream
            if target.leading is None:  # ForwardService: only a leader accepts
                self._send_stream(address, rid, lambda: answer(False))
                return
            target.links_in[link.link_id] = link
            self._send_stream(address, rid, lambda: answer(True))

        def answer(accepted: bool) -> None:
            if not (replica.alive and replica.gen == gen) or link.closed:
                return
            if not link.decided:
                link.said_accepted = accepted
                decide(ended=not accepted)
            elif not accepted:  # accepted by silence, refused after all
                self._link_fail(replica, link)

        def decide(ended: bool) -> None:
            link.decided = True
            if not link_accepted(link.said_accepted, ended):
                self._link_fail(replica, link)
            else:
                replica.link = link
                policy.linked()
                self._count("links")
            finish()

        def accept_timeout() -> None:
            if replica.alive and replica.gen == gen and not link.decided and not link.closed:
                self._count("accepted_by_silence")
                decide(ended=False)

        self._send_stream(rid, address, at_target)
        self._at(self.now + replica.clock.real_after(LINK_CONNECT_TIMEOUT_S), accept_timeout)

    def _link_fail(self, replica: _Replica, link: _Link) -> None:
        """The follower's end of a link failed: its Sessions are detached (``_Link.fail``)."""
        if link.closed:
            return
        link.closed = True
        self._open_links.pop(link.link_id, None)
        if replica.link is link:
            replica.link = None
        assert replica.policy is not None
        replica.policy.failed(
            link.leader,
            link.term,
            self._rlocal(replica),
            accepted=link_led(link.said_accepted, link.replied),
        )
        self._count("link_failures")
        sessions, link.sessions = link.sessions, {}
        for fsid in sorted(sessions):
            held = sessions[fsid]
            held.link, held.fsid = None, ""
            self._detach(replica, held)
        leader = self.replicas[link.leader]
        lgen = leader.gen

        def cancelled() -> None:  # the leader's end of the stream sees it cancelled
            if leader.gen == lgen:
                leader.links_in.pop(link.link_id, None)

        self._send_stream(replica.replica_id, link.leader, cancelled)

    def _link_broke(self, replica: _Replica, gen: int, link: _Link) -> None:
        if replica.alive and replica.gen == gen:
            self._link_fail(replica, link)

    def _open(self, link: _Link, held: _Held) -> None:
        """Carry ``held`` on ``link`` from now on (``_Link.open``)."""
        link.next_sid += 1
        fsid = f"f{link.next_sid}"
        link.sessions[fsid] = held
        held.link, held.fsid = link, fsid

    def _detach(self, replica: _Replica, held: _Held) -> None:
        if held.stream not in replica.held or replica.relay is None:
            return
        replica.relay.detach(held.stream, held.acked_at, deferrable=held.extended)
        self._count("detached")
        self._wake_reattacher(replica)

    def _leader_observed(self, replica: _Replica, leader_id: str, term: int) -> None:
        """The election watch showed a leader (``SessionForwarder._leader_observed``)."""
        replica.observed = (leader_id, term)
        attempt = replica.attempt
        if (
            attempt is not None
            and attempt.connecting
            and attempt.dialling is not None
            and link_outdated(*attempt.dialling, leader_id, term)
        ):
            attempt.connecting = False
            attempt.dialling = None
            attempt.finish()
        link = replica.link
        if (
            link is not None
            and not link.closed
            and link_outdated(link.leader, link.term, leader_id, term)
        ):
            self._count("link_outdated")
            self._link_fail(replica, link)

    # -- an agent's message on a carried Session (_pump)

    def _carried_message(self, replica: _Replica, held: _Held, seq: int, kind: EntryKind) -> None:
        relay = replica.relay
        assert relay is not None
        if kind is EntryKind.HEARTBEAT:
            self._interregnum_heartbeat(replica, held, seq)  # arrived, linked or not
        link = held.link
        route = relay.route(
            held.stream,
            hello=kind is EntryKind.HELLO,
            link_open=link is not None and not link.closed,
            attached=link is not None and bool(held.fsid),
        )
        if route is Route.DETACH:
            self._count("hello_detached")
            self._wake_reattacher(replica)
            return
        if route is Route.DROP or link is None:
            return
        if route is Route.OPEN:
            self._open(link, held)
            self._count("reattach_hellos")
        self._relay_forward(replica, held, link, seq, kind)

    def _relay_forward(
        self, replica: _Replica, held: _Held, link: _Link, seq: int, kind: EntryKind
    ) -> None:
        """Put the agent's message on its link (to the leader)."""
        self._link_entry(replica, link, held.fsid, kind.value, seq, held.node_id)

    def _link_entry(
        self, replica: _Replica, link: _Link, fsid: str, what: str, seq: int, node_id: str = ""
    ) -> None:
        leader = self.replicas[link.leader]
        lgen = leader.gen
        fgen = replica.gen

        def reply(message: agent_records.CoordinatorMessage | int) -> None:
            self._send_stream(
                leader.replica_id,
                replica.replica_id,
                lambda: self._link_reply(replica, fgen, link, fsid, message),
            )

        def at_leader() -> None:
            if not (leader.alive and leader.gen == lgen) or link.link_id not in leader.links_in:
                return
            if what == "end":
                link.served.pop(fsid, None)
                return
            if what == EntryKind.HELLO.value:
                link.served[fsid] = (node_id, True)
                if self._leader_step(leader, node_id, EntryKind.HELLO) and leader.leading:
                    reply(self._welcome(leader.leading.term, leader.replica_id, fsid))
                return
            served = link.served.get(fsid)
            if served is None or not digest_eligible(0, served[1], False):
                # The Session servicer: a Session's first message must be a Hello.
                link.served.pop(fsid, None)
                reply(FAILED_PRECONDITION)
                return
            if self._leader_step(leader, served[0], EntryKind.HEARTBEAT) and leader.leading:
                reply(agent_records.HeartbeatAck(seq, leader.leading.term))

        self._send_stream(replica.replica_id, link.leader, at_leader)

    def _link_reply(
        self,
        replica: _Replica,
        gen: int,
        link: _Link,
        fsid: str,
        message: agent_records.CoordinatorMessage | int,
    ) -> None:
        """What the leader wrote for a forwarded Session (``_Link._route``); an int ends it."""
        if not (replica.alive and replica.gen == gen) or link.closed:
            return
        link.replied = True
        held = link.sessions.get(fsid)
        if held is None:
            return  # the agent already went
        if isinstance(message, int):
            del link.sessions[fsid]
            held.link, held.fsid = None, ""
            if leader_end_detaches(message):
                self._count("leader_end_detached")
                self._detach(replica, held)
            else:
                self._count("leader_ended")
                self._relay_end(replica, held)
            return
        if isinstance(message, agent_records.HeartbeatAck):
            now = self._rlocal(replica)
            link.last_ack_s = now
            held.acked_at = now
            held.extended = False
            self._acks[AckBasis.CONFIRMED.value] += 1
        elif isinstance(message, agent_records.Welcome):
            self._interregnum_welcomed(replica, held, message)
        self._to_agent(replica, held.stream, held.node_id, message)

    # -- the leader stops (runtime: channels closed UNAVAILABLE; ForwardService watchdog)

    def _relay_stop_leading(self, replica: _Replica) -> None:
        for stream, node_id in sorted(replica.direct.items()):
            self._end_agent_stream(replica, stream, node_id)
        replica.direct = {}
        links, replica.links_in = replica.links_in, {}
        for link_id in sorted(links):
            link = links[link_id]
            follower = self.replicas[link.follower]
            fgen = follower.gen
            for fsid in sorted(link.served):
                self._send_stream(
                    replica.replica_id,
                    link.follower,
                    partial(self._link_reply, follower, fgen, link, fsid, UNAVAILABLE),
                )
            link.served = {}
            self._at(
                self.now + self.rng.uniform(0.0, LEADERSHIP_CHECK_S),
                partial(
                    self._send_stream,
                    replica.replica_id,
                    link.follower,
                    partial(self._link_broke, follower, fgen, link),
                ),
            )

    def _relay_crash(self, replica: _Replica) -> None:
        rid = replica.replica_id
        for link_id in sorted(self._open_links):
            link = self._open_links[link_id]
            if link.follower == rid:
                link.closed = True  # its leader's end sees the stream cancelled
            elif link.leader == rid:
                follower = self.replicas[link.follower]
                self._at(
                    self.now + self.rng.uniform(0.02, 1.0),
                    partial(self._link_broke, follower, follower.gen, link),
                )
        for link_id in [i for i, link in self._open_links.items() if link.follower == rid]:
            del self._open_links[link_id]
        replica.links_in, replica.held, replica.by_ikey, replica.direct = {}, {}, {}, {}
        replica.opening = set()
        replica.link = replica.attempt = None
        replica.reattaching = False

    # -- the reattach loop (SessionForwarder._reattach)

    def _wake_reattacher(self, replica: _Replica) -> None:
        if replica.reattaching:
            return
        replica.reattaching = True
        self._at(self.now, partial(self._reattach_step, replica, replica.gen))

    def _reattach_step(self, replica: _Replica, gen: int) -> None:
        relay = replica.relay
        if not (replica.alive and replica.gen == gen) or relay is None:
            return
        if not relay.pending:
            replica.reattaching = False
            return

        def again(wait_s: float) -> None:
            self._at(
                self.now + replica.clock.real_after(wait_s),
                partial(self._reattach_step, replica, gen),
            )

        for stream in relay.expired(self._rlocal(replica)):
            held = replica.held.get(stream)
            if held is not None:
                self._count("expired")
                self._relay_end(replica, held)
        if not relay.detached:
            again(RELINK_INTERVAL_S)
            return

        def linked() -> None:
            if not (replica.alive and replica.gen == gen):
                return
            link = replica.link
            if link is None or link.closed:
                again(RELINK_INTERVAL_S)
                return
            now = self._rlocal(replica)
            for stream in relay.reattach(now):
                held = replica.held[stream]
                held.link = link
                self._count("reattached")
                self._to_agent(replica, stream, held.node_id, agent_records.Reattach(link.term))
            wait_s = relay.next_reattach_s() - self._rlocal(replica)
            again(min(RELINK_INTERVAL_S, max(0.001, wait_s)))

        self._current_link(replica, True, linked)

    # -- rule (b) in a follower (_Interregnum)

    def _interregnum_welcomed(
        self, replica: _Replica, held: _Held, welcome: agent_records.Welcome
    ) -> None:
        self._interregnum_ended(replica, held)
        held.term = welcome.term
        held.arrived.clear()
        if not self.settings.covers(
            welcome.heartbeat_interval_ms / 1000.0,
            welcome.fence_after_ms / 1000.0,
            welcome.dead_after_ms / 1000.0,
        ):
            return
        link_id = held.link.link_id if held.link is not None else 0
        key = (held.stream, f"{link_id}/{welcome.session_id}")
        held.ikey = key
        replica.by_ikey[key] = held

    def _interregnum_ended(self, replica: _Replica, held: _Held) -> None:
        key, held.ikey = held.ikey, None
        if key is not None and replica.by_ikey.pop(key, None) is not None:
            self._step(replica, SessionEnded(key[0], key[1], self._rlocal(replica)))

    def _interregnum_heartbeat(self, replica: _Replica, held: _Held, seq: int) -> None:
        key = held.ikey
        if key is None:
            return
        now = self._rlocal(replica)
        held.arrived[seq] = now
        while len(held.arrived) > self.settings.max_pending_per_session:
            held.arrived.pop(next(iter(held.arrived)))
        self._step(replica, HeartbeatReceived(key[0], key[1], seq, now))

    def _relay_interregnum_ack(self, replica: _Replica, ack: Ack) -> None:
        if ack.basis is not AckBasis.INTERREGNUM:
            return
        held = replica.by_ikey.get((ack.node_id, ack.session_id))
        if held is None:
            return
        self._acks[AckBasis.INTERREGNUM.value] += 1
        self._to_agent(
            replica, held.stream, held.node_id, agent_records.HeartbeatAck(ack.seq, held.term)
        )
        arrived = held.arrived.get(ack.seq)
        if arrived is None:
            return
        held.acked_at = max(held.acked_at if held.acked_at is not None else -math.inf, arrived)
        held.extended = True
        relay = replica.relay
        if relay is not None and relay.state(held.stream) is Carry.DETACHED:
            relay.detach(held.stream, held.acked_at, deferrable=True)
            self._count("deferred")

    # ------------------------------------------------------------ nodes

    def _nlocal(self, node: _Node) -> float:
        return node.clock.local(self.now)

    def _spawn(self, node: _Node) -> None:
        node.incarnation += 1
        node.gen += 1
        node.agent = AgentCore(
            node.node_id,
            f"{node.node_id}-i{node.incarnation}",
            fence_lead_s=self.config.fence_lead_s,
            progress_report_interval_s=self.config.progress_report_interval_s,
        )
        node.session = None
        if self.config.agent_dial == "list":  # a new process: a new plan, from its list's start
            node.dial = DialPlan(
                sorted(self.replicas), hold_off_s=self.config.dial_hold_off_s, node_id=node.node_id
            )
        gen = node.gen
        self._every(
            node.clock,
            self.config.node_tick_s,
            lambda: node.agent is not None and node.gen == gen,
            lambda: self._node_tick(node),
        )
        self._connect(node)

    def _connect(self, node: _Node) -> None:
        if node.agent is None or node.session is not None:
            return
        if node.dial is not None:
            replica = self.replicas[node.dial.next(self._nlocal(node)).address]
        else:
            replica = self.replicas[self.rng.choice(sorted(self.replicas))]
        node.welcomed = False
        self._next_session += 1
        session_id = f"s{self._next_session}"
        node.session = (replica.replica_id, session_id)
        node.hello_deadline_s = self._nlocal(node) + self.config.hello_timeout_s
        node.agent.hello(self._nlocal(node), 0)
        if not replica.alive:  # connection refused: try another replica soon
            session = node.session
            self._at(
                self.now + self.rng.uniform(0.01, 0.2),
                lambda: self._node_stream_broke(node, session),
            )
            return
        self._node_send(node, 0, EntryKind.HELLO)

    def _reconnect_soon(self, node: _Node) -> None:
        gen = node.gen
        self._at(
            self.now + self.rng.uniform(0.05, 0.5),
            lambda: self._connect(node) if node.gen == gen else None,
        )

    def _dial_ended(self, node: _Node, rid: str, end: DialEnd) -> None:
        """Tell the node's ``DialPlan`` (agent_dial "list") how its Session with ``rid`` ended.

        The pause it returns is not used: the simulated node redials after
        its own jittered delay (``_reconnect_soon``).
        """
        if node.dial is not None:
            node.dial.ended(rid, self._nlocal(node), replace(end, welcomed=node.welcomed))

    def _close_session(self, node: _Node, *, silent: bool = False) -> None:
        if node.session is None:
            return
        rid, session_id = node.session
        node.session = None
        self._dial_ended(node, rid, DialEnd(silent=silent))
        replica = self.replicas[rid]
        gen = replica.gen
        self._send(
            node.node_id,
            rid,
            lambda: self._replica_session_ended(replica, gen, node.node_id, session_id),
        )
        self._reconnect_soon(node)

    def _node_tick(self, node: _Node) -> None:
        agent = node.agent
        if agent is None:
            return
        now = self._nlocal(node)
        self._node_exec(node, agent.tick(now, 0))
        if (
            node.session is not None
            and agent.session is not SessionState.OPEN
            and node.hello_deadline_s is not None
            and now >= node.hello_deadline_s
        ):
            self._close_session(node, silent=True)  # nothing came back

    def _node_exec(self, node: _Node, commands: list[agent_core.Command]) -> None:
        for command in commands:
            if isinstance(command, agent_core.Send) and isinstance(
                command.message, agent_records.Heartbeat
            ):
                self._node_send(node, command.message.seq, EntryKind.HEARTBEAT)
            elif isinstance(command, agent_core.Send) and isinstance(
                command.message, agent_records.Hello
            ):
                # After a Reattach: a Hello again on the same stream (relay mode).
                self._node_send(node, 0, EntryKind.HELLO)
            elif isinstance(command, agent_core.CloseSession):
                if command.reason.startswith("self-fenced"):
                    self._fences += 1
                self._close_session(node)
            elif isinstance(command, agent_core.Notice) and command.kind == "self_fence":
                pass

    def _node_send(self, node: _Node, seq: int, kind: EntryKind) -> None:
        """A heartbeat (``seq``) or Hello on the node's open stream, if it has one."""
        if node.session is None:
            return
        rid, session_id = node.session
        replica = self.replicas[rid]
        self._send(
            node.node_id,
            rid,
            partial(
                self._replica_receive, replica, replica.gen, node.node_id, session_id, seq, kind
            ),
        )

    def _node_receive(
        self, node: _Node, session: tuple[str, str], message: agent_records.CoordinatorMessage
    ) -> None:
        if node.agent is None or node.session != session:
            return
        self._node_exec(node, node.agent.on_message(message, self._nlocal(node), 0))
        if node.agent is not None and node.agent.session is SessionState.OPEN:
            node.welcomed = True

    def _node_stream_broke(self, node: _Node, session: tuple[str, str]) -> None:
        if node.agent is None or node.session != session:
            return
        node.session = None
        self._dial_ended(node, session[0], DialEnd(status="UNAVAILABLE"))
        self._node_exec(node, node.agent.on_session_closed(self._nlocal(node), "stream broken"))
        self._reconnect_soon(node)

    def _crash_node(self, node: _Node, down_s: float) -> None:
        if node.agent is None:
            return
        node.agent = None
        node.gen += 1
        if node.session is not None:
            rid, session_id = node.session
            replica = self.replicas[rid]
            gen = replica.gen
            self._at(
                self.now + self.rng.uniform(0.02, 1.0),
                lambda: self._replica_session_ended(replica, gen, node.node_id, session_id),
            )
        node.session = None
        self._at(self.now + down_s, lambda: self._spawn(node))

    # ------------------------------------------------------------ faults

    def _leader(self) -> _Replica | None:
        leaders = [r for r in self.replicas.values() if r.leading is not None]
        return self.rng.choice(leaders) if leaders else None

    def _partition(self, a: str, b: str, duration_s: float) -> None:
        key = frozenset((a, b))
        self._partitions[key] = self._partitions.get(key, 0) + 1

        def heal() -> None:
            left = self._partitions.get(key, 0) - 1
            if left <= 0:
                self._partitions.pop(key, None)
            else:
                self._partitions[key] = left

        self._at(self.now + duration_s, heal)

    def _fault(self, kind: str = "") -> None:
        rng = self.rng
        kind = kind or rng.choice(self.config.faults)
        replica_ids = sorted(self.replicas)
        leader = self._leader()
        duration = rng.uniform(0.5, self.config.max_down_s)
        if kind == "partition_node_replica":
            self._partition(rng.choice(sorted(self.nodes)), rng.choice(replica_ids), duration)
        elif kind == "partition_replica_replica":
            a, b = rng.sample(replica_ids, 2)
            self._partition(a, b, duration)
        elif kind == "partition_replica_etcd":
            self._partition(rng.choice(replica_ids), ETCD, duration)
        elif kind == "partition_leader_etcd":
            if leader is None:
                return
            self._partition(leader.replica_id, ETCD, duration)
            if rng.random() < 0.5:  # and from its followers: the fleet's worst case
                for rid in replica_ids:
                    if rid != leader.replica_id:
                        self._partition(leader.replica_id, rid, duration)
        elif kind == "crash_leader":
            if leader is None:
                return
            self._crash_replica(leader, duration)
        elif kind == "crash_replica":
            self._crash_replica(self.replicas[rng.choice(replica_ids)], duration)
        elif kind == "resign":
            if leader is None:
                return
            self._resign(leader)
        elif kind == "crash_node":
            self._crash_node(self.nodes[rng.choice(sorted(self.nodes))], duration)
        self._faults[kind] = self._faults.get(kind, 0) + 1

    def _heal(self) -> None:
        self._partitions.clear()

    # ------------------------------------------------------------ checks

    def _check(self) -> None:
        for node_id in sorted(self._dead):
            self._check_node(node_id)

    def _check_node(self, node_id: str) -> None:
        who = self._dead.get(node_id)
        node = self.nodes[node_id]
        if who is None or node.agent is None:
            return
        now = self._nlocal(node)
        ownership = node.agent.ownership()
        if ownership.valid_at(now):
            self._fail(
                f"node {node_id} was declared DEAD by {who} but is unfenced for "
                f"{ownership.deadline_s - now:.3f} s more of its clock "  # type: ignore[operator]
                f"(session {node.agent.session.value})"
            )

    def _check_liveness(self) -> None:
        stuck = [
            n.node_id
            for n in self.nodes.values()
            if n.agent is not None and n.agent.session is not SessionState.OPEN
        ]
        if stuck:
            self._fail(
                f"after {self.config.heal_s} s healed, nodes without an open Session: {stuck}"
            )


def sweep(seeds: range, config: FanInConfig | None = None) -> list[str]:
    """Run every seed; return the failure messages (empty when all held)."""
    failures: list[str] = []
    for seed in seeds:
        try:
            FanInSimulation(seed, config).run()
        except SimulationFailure as failure:
            failures.append(str(failure))
    return failures


def _main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Run the fan-in simulator for seeds.")
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--count", type=int, default=1, help="seeds to run")
    parser.add_argument("--relay", action="store_true", help="Sessions carried by the relay")
    args = parser.parse_args(argv)
    failures = sweep(range(args.seed, args.seed + args.count), FanInConfig(relay=args.relay))
    for message in failures:
        print(message)
    print(f"{args.count - len(failures)}/{args.count} seeds held")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(_main())
