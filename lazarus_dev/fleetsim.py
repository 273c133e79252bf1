"""A seeded simulator that runs the REAL node agent core against the REAL coordinator core.

Theory of operation: ``coordinator.core.sim`` checks the coordinator core
against a model of an agent. This module drives N processes, each a real
``node_agent.core.AgentCore``, against a real ``CoordinatorCore``, over a
simulated wire that is the real wire: every message is an ``agent_pb2``
message serialized to bytes, parsed on arrival, and translated by the same
pure converters the shells use (``coordinator.convert.hello_to_event``,
``heartbeat_to_event``, ``task_update_to_event``, ``directive_to_pb``), the
way ``coordinator/session.py``, ``coordinator/runtime.py`` and
``node_agent/agent.py`` do. Only the shells are modelled:

- **agent shell**: a tick every ``agent_tick_s`` of its own clock; carries
  out the core's commands in order (Send, PersistMeta to a local store,
  StartTask / StopTask to a task runner, CloseSession, ForgetTask);
- **task runner**: restores by claiming the task in the Redis stand-in (the
  fence is raised first, as ``claim_load`` does), works in steps, each ending
  with a checkpoint written locally and replicated; a STALE answer is
  ``task_lost``; a stop takes a moment and then ``task_stopped``;
- **local store**: survives restarts of the same data dir; a lock names its
  previous holder (the store proof sent in Hello: ``store_id``,
  ``store_previous_incarnation``); a restart on a fresh store proves nothing;
- **Redis stand-in**: the Lua fence of ``node_agent.replication``: (epoch,
  owner incarnation); an older epoch, or an equal epoch from another owner once
  one is recorded, is STALE;
- **etcd stand-in**: the leader's batches are fenced by its term: a deposed
  leader's writes fail, it steps ``LeadershipLost`` and drops the rest of the
  command list (``runtime._run_locked``); records are stored as the protobuf
  bytes ``convert.*_record_to_pb`` makes and loaded back by a new leader;
- **network**: per stream, per direction FIFO with random delay; partitions
  hold messages until they heal or break the stream; a broken stream is seen
  by each end after its own delay (half-open streams);
- **clocks**: each process's monotonic clock runs at a rate within
  ``1 ± clock_drift`` of true time; **stalls** (a starved CPU) freeze a
  process: its tick, its handler steps and its message handling all run late,
  so its self-fence fires late;
- **leaders**: failover elects a new ``CoordinatorCore`` that loads etcd; the
  deposed one keeps running (acking heartbeats) for up to ``deposed_run_s``,
  its writes failing, then its streams break; a leader's ``RetireRecords``
  (retention: terminal tasks, DEAD or LEFT nodes owning nothing) delete from
  etcd, fenced, the tasks kept in an archive the end check reads (with the
  default 24 h retention nothing is retired in a run; a test runs 0.5 s);
- **identities**: crash and restart on the same store (proof), on a fresh
  store (no proof), a second process under a live node id with its own store,
  and an impostor that reuses an incarnation id without its secret.

Checkers run as each action happens: no two processes execute one task in
overlapping simulated time (a task executes from StartTask until its handler
stopped, finished or its process died); epochs never go down (etcd task
records; no handler starts at an epoch below one that already ran; the Redis
fence only rises); no acknowledged (replicated) checkpoint is lost: Redis never
holds less than one, and a task always resumes at or after it; the commands'
order (``check_command_order``) and the coordinator core's own
``check_invariants`` (``self_check``). After the heal phase every accepted task
is terminal and every node ALIVE. A failure raises ``SimulationFailure`` whose
message starts with ``seed=<n>`` and ends with the replay command.

A leader can also lose its lease between the etcd writes of one step (the
node records committed, the task records not: separate transactions), the rest
of the step dropped.

Not modelled (yet): Redis restarts that lose data, message duplication and
reordering inside a stream (gRPC over TCP does neither), one write's batch of
over 128 operations split non-atomically, coordinator replicas behind a
fan-in, and the lineage path (``ReportLineage`` is carried out as a no-op, so "every divergent
lineage kept or merged" is not checked here).

Purity: no clock, no IO, randomness only from ``random.Random(seed)``
(``tests/unit/test_fleetsim.py`` runs the purity checker on this module).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from random import Random

from coordinator import convert
from coordinator.core import notices
from coordinator.core.commands import (
    CloseSession,
    Command,
    EmitEvent,
    PersistNodes,
    PersistTasks,
    ReplyToRequest,
    RetireRecords,
    SendDirective,
    StatusCode,
    StepDown,
    check_command_order,
)
from coordinator.core.core import CoordinatorCore
from coordinator.core.errors import CoreError
from coordinator.core.events import (
    Event,
    GoodbyeReceived,
    HeartbeatDigest,
    HeartbeatReceived,
    LeadershipAcquired,
    LeadershipLost,
    SessionClosed,
    TaskSubmitted,
    Tick,
)
from coordinator.core.records import NodeState, TaskRecord, TaskSpec, TaskState
from coordinator.core.relay import digest_eligible
from coordinator.core.settings import CoreSettings
from lazarus.v1 import agent_pb2, records_pb2
from node_agent import convert as agent_convert
from node_agent import core as agent_core
from node_agent.core import AgentCore
from node_agent.core import records as agent_records

__all__ = [
    "FleetConfig",
    "FleetReport",
    "FleetSimulation",
    "SimulationFailure",
    "replay_command",
]


class SimulationFailure(AssertionError):
    """A checker found a broken invariant; the message starts with ``seed=<n>``."""


def replay_command(seed: int, shape: str = "default") -> str:
    """The shell command that replays ``seed``."""
    return f"python -m lazarus_dev.fleetsim --seed {seed} --shape {shape}"


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """Shape of one run.

    Attributes:
        nodes: node ids in the fleet (one primary process each).
        tasks: tasks the orchestrator submits during the safety phase.
        safety_s: length of the phase with faults, simulated seconds.
        liveness_s: length of the healed phase that must finish every task.
        fault_rate_per_s: expected faults per simulated second (whole fleet).
        max_latency_s: one-way message latency is uniform in [0.5 ms, this].
        clock_drift: each process clock runs at a rate in [1 - d, 1 + d].
        max_stall_s: a CPU stall freezes a process for up to this long.
        deposed_run_s: a deposed leader keeps running up to this long after
            the new one is elected.
        failovers, identity_faults, stalls: fault classes on or off.
        partial_writes: with ``failovers``, a leader can lose its lease between
            two etcd writes of one step (nodes, then tasks: separate
            transactions), the first committed, the rest dropped, as
            ``runtime._run_locked`` drops them after a failed persist.
        fan_in: with ``failovers``, about half of a deposed leader's Sessions
            were held by a follower (``coordinator/forwarding.py``): the
            agent's stream stays open, what it sends is dropped until, 0.05 to
            1.5 s later (one time in five 1.5 to 8 s: a follower cut off from
            the leaders), the follower carries it to the next leader with a
            ``Reattach``; the agent's new Hello reaches that leader on the same
            stream. No leader reachable then: the follower ends the stream.
            Also with ``fan_in``, about half of all Sessions are forwarded by a
            follower (every reattached one is): the leader receives their
            messages in batches that linger ``batch_linger_s`` and steps each
            batch's heartbeats as one ``HeartbeatDigest``, except a heartbeat
            queued behind an older message of its Session in the batch, which
            is stepped after that message (``ForwardService._read``).
        batch_linger_s: a follower's batch linger (``forwarding.BATCH_LINGER_S``).
        agent_tick_s: the agent shell's tick period (its own clock).
        step_s: a task handler's step (one checkpoint) takes this long.
        fence_lead_s: ``AgentCore(fence_lead_s=...)``.
        progress_report_interval_s: ``AgentCore(progress_report_interval_s=...)``;
            1 s, not the agent's 5 s default, so that the short safety phase
            carries Checkpointed updates (and their races) at all.
        shape: the name printed in the replay command.
    """

    nodes: int = 3
    tasks: int = 4
    safety_s: float = 6.0
    liveness_s: float = 12.0
    fault_rate_per_s: float = 1.0
    max_latency_s: float = 0.02
    clock_drift: float = 0.002
    max_stall_s: float = 0.8
    deposed_run_s: float = 0.2
    failovers: bool = True
    identity_faults: bool = True
    stalls: bool = True
    partial_writes: bool = True
    fan_in: bool = True
    batch_linger_s: float = 0.05
    agent_tick_s: float = 0.2
    step_s: float = 0.3
    fence_lead_s: float = 0.5
    progress_report_interval_s: float = 1.0
    shape: str = "default"


SHAPES: dict[str, FleetConfig] = {
    "default": FleetConfig(),
    "large": FleetConfig(nodes=5, tasks=16, safety_s=15.0, liveness_s=25.0, shape="large"),
    # CPU stalls longer than the fence margin: the late self-fence becomes visible.
    "starved": FleetConfig(max_stall_s=3.0, fault_rate_per_s=1.0, shape="starved"),
}


@dataclass(slots=True)
class FleetReport:
    """What happened in a run (tests check the faults were exercised)."""

    seed: int
    actions: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    retired_tasks: int = 0
    retired_nodes: int = 0
    starts: int = 0
    stale_writes: int = 0
    completed: int = 0
    failed: int = 0
    fences: int = 0
    identity_refusals: int = 0
    partial_writes: int = 0  # steps whose first etcd write committed and the rest never did
    takeovers: int = 0  # a new incarnation replaced a previous one (store proof or holder DEAD)
    reattaches: int = 0  # Sessions a follower carried to the next leader (fan-in)
    digested: int = 0  # heartbeats a leader stepped in a HeartbeatDigest (fan-in)


# ---------------------------------------------------------------------------
# Stand-ins.
# ---------------------------------------------------------------------------


@dataclass(slots=True)
class _RedisTask:
    epoch: int = 0
    owner: str = ""
    seq: int = 0  # newest checkpoint (units of work done)


class RedisStandIn:
    """The checkpoint replica's fence (``node_agent.replication`` Lua)."""

    def __init__(self) -> None:
        self.tasks: dict[str, _RedisTask] = {}

    def fenced_out(self, head: _RedisTask, epoch: int, owner: str) -> bool:
        """True when (epoch, owner) is STALE against ``head``."""
        if epoch < head.epoch:
            return True
        return epoch == head.epoch and head.owner != "" and owner != head.owner

    def _raise(self, head: _RedisTask, epoch: int, owner: str) -> None:
        if owner and (epoch > head.epoch or head.owner == ""):
            head.owner = owner
        head.epoch = max(head.epoch, epoch)

    def claim(self, task_id: str, epoch: int, owner: str) -> tuple[bool, int, int]:
        """``claim_load``: raise the fence, read the resume point. (ok, seq, head epoch)."""
        head = self.tasks.setdefault(task_id, _RedisTask())
        if self.fenced_out(head, epoch, owner):
            return False, 0, head.epoch
        self._raise(head, epoch, owner)
        return True, head.seq, head.epoch

    def write(self, task_id: str, epoch: int, owner: str, seq: int) -> tuple[bool, int]:
        """Write checkpoint ``seq``. (ok, head epoch)."""
        head = self.tasks.setdefault(task_id, _RedisTask())
        if self.fenced_out(head, epoch, owner):
            return False, head.epoch
        self._raise(head, epoch, owner)
        head.seq = seq
        return True, head.epoch


@dataclass(slots=True)
class _Store:
    """A node's data dir: metas and local checkpoints survive a restart."""

    store_id: str
    holder: str = ""  # incarnation holding the lock ("" when free)
    previous: str = ""  # the lock's previous holder
    metas: dict[str, bytes] = field(default_factory=dict)
    checkpoints: dict[str, tuple[int, int]] = field(default_factory=dict)  # task -> (epoch, seq)


@dataclass(slots=True)
class _Run:
    task_id: str
    epoch: int
    target: int
    seq: int = 0
    token: int = 0
    stopping: bool = False
    started_at: float = 0.0


@dataclass(slots=True)
class _Stream:
    sid: str
    proc: _Proc
    leader: _Leader
    broken: bool = False
    agent_open: bool = True
    leader_open: bool = True
    hello_seen: bool = False
    node_id: str = ""
    forwarded: bool = False  # held by a follower: reaches the leader in batches (fan-in)
    up_at: float = 0.0  # FIFO: last arrival time per direction
    down_at: float = 0.0


@dataclass(slots=True)
class _Proc:
    pid: int
    node_id: str
    incarnation: str
    secret: bytes
    store: _Store
    core: AgentCore
    hello: agent_pb2.Hello
    rate: float
    offset: float
    extra: bool = False
    alive: bool = True
    stalled_until: float = 0.0
    stream: _Stream | None = None
    connecting: bool = False
    runs: dict[str, _Run] = field(default_factory=dict)
    tokens: int = 0


@dataclass(slots=True)
class _Leader:
    term: int
    core: CoordinatorCore
    alive: bool = True
    lost: bool = False  # stepped LeadershipLost after a fenced write failed
    cut_mid_step: bool = False  # its lease runs out after the first write of a step with two
    streams: dict[str, _Stream] = field(default_factory=dict)
    batch: list[tuple[_Stream, bytes]] = field(default_factory=list)  # forwarded, not yet read


# ---------------------------------------------------------------------------
# The simulation.
# ---------------------------------------------------------------------------


class FleetSimulation:
    """One seeded run; ``run()`` returns a report or raises ``SimulationFailure``."""

    def __init__(
        self, seed: int, config: FleetConfig | None = None, settings: CoreSettings | None = None
    ) -> None:
        """Prepare a run.

        Args:
            seed: drives every random choice; the same seed replays the same run.
            config: the shape (``SHAPES["default"]`` when None).
            settings: coordinator settings (defaults with ``self_check`` when None).
        """
        self.seed = seed
        self.config = config if config is not None else SHAPES["default"]
        self.settings = (
            settings
            if settings is not None
            else CoreSettings(default_max_attempts=20, self_check=True)
        )
        self.rng = Random(seed)
        self.report = FleetReport(seed)
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._counter = 0
        self.redis = RedisStandIn()
        self.etcd_term = 0
        self.etcd_nodes: dict[str, bytes] = {}
        self.etcd_tasks: dict[str, bytes] = {}
        self.etcd_epochs: dict[str, int] = {}
        self.archived_tasks: dict[str, TaskRecord] = {}
        """Tasks retired from etcd (the Redis record archive ``GetTask`` reads)."""
        self.leaders: list[_Leader] = []
        self.procs: list[_Proc] = []
        self.stores: dict[str, _Store] = {}
        self._stores = 0
        self._pids = 0
        self._sids = 0
        self.partitioned_until: dict[str, float] = {}  # node id -> true time
        self.slow_down: dict[str, tuple[float, float]] = {}  # node id -> (until, extra delay)
        self.executing: dict[str, tuple[int, float]] = {}  # task -> (pid, since)
        self.started_epochs: dict[str, int] = {}  # task -> newest epoch a handler started at
        self.acked_seq: dict[str, int] = {}  # task -> newest acknowledged replicated checkpoint
        self.accepted: dict[str, str] = {}
        self.units: dict[str, int] = {}
        self.healing = False

    # ------------------------------------------------------------------ driver

    def run(self) -> FleetReport:
        """Run the safety then the liveness phase and check the end state.

        Returns:
            The report.

        Raises:
            SimulationFailure: a checker failed (the message starts with the seed).
        """
        try:
            self._run()
        except SimulationFailure:
            raise
        except (CoreError, ValueError, KeyError, AttributeError, TypeError) as exc:
            raise SimulationFailure(self._where(f"{type(exc).__name__}: {exc}")) from exc
        return self.report

    def _run(self) -> None:
        cfg = self.config
        end = cfg.safety_s + cfg.liveness_s
        self._elect()
        for i in range(cfg.nodes):
            node_id = f"n{i}"
            self._spawn(node_id, self._new_store(node_id))
        for i in range(cfg.tasks):
            self._at(self.rng.uniform(0.3, cfg.safety_s * 0.6), partial(self._submit, i))
        t = self.rng.expovariate(cfg.fault_rate_per_s)
        while t < cfg.safety_s:
            self._at(t, self._fault)
            t += self.rng.expovariate(cfg.fault_rate_per_s)
        self._at(cfg.safety_s, self._heal)
        tick = self.settings.tick_interval_s
        n = 1
        while n * tick <= end:
            self._at(n * tick, self._leader_tick)
            n += 1
        while self._queue:
            when, _, action = heapq.heappop(self._queue)
            if when > end:
                break
            self.now = when
            self.report.actions += 1
            action()
        self._check_end()

    def _at(self, when: float, action: Callable[[], None]) -> None:
        self._counter += 1
        heapq.heappush(self._queue, (max(when, self.now), self._counter, action))

    def _where(self, message: str) -> str:
        return (
            f"seed={self.seed} t={self.now:.3f}s: {message}\n"
            f"replay: {replay_command(self.seed, self.config.shape)}"
        )

    def _fail(self, message: str) -> None:
        raise SimulationFailure(self._where(message))

    def _latency(self) -> float:
        return self.rng.uniform(0.0005, self.config.max_latency_s)

    # ------------------------------------------------------------- processes

    def _new_store(self, node_id: str) -> _Store:
        self._stores += 1
        store = _Store(f"{node_id}/store{self._stores}")
        self.stores[store.store_id] = store
        return store

    def _spawn(
        self, node_id: str, store: _Store, *, extra: bool = False, impostor: str = ""
    ) -> _Proc:
        """Start a process on ``store`` (the store lock names the previous holder)."""
        self._pids += 1
        incarnation = impostor or f"{node_id}#{self._pids}"
        if store.holder:  # the lock is held: only a broken lock lets a second process in
            store.previous = store.holder
        store.holder = incarnation
        hello = agent_pb2.Hello(
            address=node_id,
            agent_version="sim",
            incarnation_secret=self.rng.getrandbits(128).to_bytes(16, "big"),
            store_id=store.store_id,
            store_previous_incarnation=store.previous,
        )
        hello.capacity.slots = 4
        core = AgentCore(
            node_id,
            incarnation,
            fence_lead_s=self.config.fence_lead_s,
            progress_report_interval_s=self.config.progress_report_interval_s,
        )
        drift = self.config.clock_drift
        proc = _Proc(
            pid=self._pids,
            node_id=node_id,
            incarnation=incarnation,
            secret=bytes(hello.incarnation_secret),
            store=store,
            core=core,
            hello=hello,
            rate=self.rng.uniform(1.0 - drift, 1.0 + drift),
            offset=self.rng.uniform(0.0, 1000.0),
            extra=extra,
        )
        self.procs.append(proc)
        self._agent_exec(proc, core.restore(*agent_convert.decode_metas(dict(store.metas))))
        self._proc_at(proc, self.now + self.rng.uniform(0.0, 0.3), lambda: self._connect(proc))
        self._proc_at(proc, self.now + self.rng.uniform(0.0, 0.1), lambda: self._agent_tick(proc))
        return proc

    def _local(self, proc: _Proc) -> float:
        return proc.offset + proc.rate * self.now

    def _wall_ms(self, proc: _Proc) -> int:
        return int((1_700_000_000.0 + self._local(proc)) * 1000)

    def _proc_at(self, proc: _Proc, when: float, action: Callable[[], None]) -> None:
        """Run ``action`` on ``proc`` at ``when``, later while it is stalled, never once dead."""

        def run() -> None:
            if not proc.alive:
                return
            if proc.stalled_until > self.now:
                self._at(proc.stalled_until, run)
                return
            action()

        self._at(when, run)

    def _crash(self, proc: _Proc) -> None:
        """The process dies: its handlers stop at once, its store lock is free."""
        if not proc.alive:
            return
        proc.alive = False
        for run in proc.runs.values():
            self._stop_executing(proc, run.task_id)
        proc.runs.clear()
        if proc.store.holder == proc.incarnation:
            proc.store.holder = ""
            proc.store.previous = proc.incarnation
        if proc.stream is not None:
            self._break(proc.stream, agent_delay=0.0, leader_delay=self.rng.uniform(0.001, 1.0))

    # ------------------------------------------------------------ agent shell

    def _agent_tick(self, proc: _Proc) -> None:
        self._agent_exec(proc, proc.core.tick(self._local(proc), self._wall_ms(proc)))
        self._proc_at(
            proc, self.now + self.config.agent_tick_s / proc.rate, lambda: self._agent_tick(proc)
        )

    def _agent_exec(self, proc: _Proc, commands: list[agent_core.Command]) -> None:
        """``Agent._execute``: the core's commands, in order (checked: persist before start)."""
        agent_core.check_command_order(commands)
        for cmd in commands:
            if not proc.alive:
                return
            if isinstance(cmd, agent_core.Send):
                self._send_up(proc, agent_convert.agent_message_to_pb(cmd.message, proc.hello))
            elif isinstance(cmd, agent_core.PersistMeta):
                proc.store.metas[cmd.task_id] = agent_convert.encode_meta(cmd.meta)
            elif isinstance(cmd, agent_core.PersistMetas):
                for task_id, meta in cmd.metas:
                    proc.store.metas[task_id] = agent_convert.encode_meta(meta)
            elif isinstance(cmd, agent_core.ForgetTask):
                proc.store.metas.pop(cmd.task_id, None)
                proc.store.checkpoints.pop(cmd.task_id, None)
            elif isinstance(cmd, agent_core.StartTask):
                self._start_task(proc, agent_convert.assign_to_pb(cmd.assign))
            elif isinstance(cmd, agent_core.StopTask):
                self._stop_task(proc, cmd.task_id, cmd.epoch)
            elif isinstance(cmd, agent_core.CloseSession):
                if proc.stream is not None:
                    stream = proc.stream
                    self._break(stream, agent_delay=None, leader_delay=self._latency())
                    proc.stream = None
                    self._agent_exec(
                        proc, proc.core.on_session_closed(self._local(proc), cmd.reason)
                    )
                    self._reconnect_soon(proc)
            elif isinstance(cmd, agent_core.Notice) and cmd.kind == "self_fence":
                self.report.fences += 1

    def _reconnect_soon(self, proc: _Proc) -> None:
        if proc.connecting:
            return
        proc.connecting = True
        self._proc_at(proc, self.now + self.rng.uniform(0.1, 0.8), lambda: self._connect(proc))

    def _connect(self, proc: _Proc) -> None:
        proc.connecting = False
        if proc.stream is not None:
            return
        leader = self.leaders[-1] if self.leaders else None
        if leader is None or not leader.alive or self._partitioned(proc.node_id):
            self._reconnect_soon(proc)
            return
        self._open_stream(proc, leader)
        hello = proc.core.hello(self._local(proc), self._wall_ms(proc))
        self._send_up(proc, agent_convert.hello_to_pb(hello, proc.hello))

    def _open_stream(self, proc: _Proc, leader: _Leader, *, forwarded: bool = False) -> _Stream:
        """A new Session stream of ``proc`` to ``leader``, now the process's current one.

        ``forwarded``: held by a follower; otherwise, with fan-in, it is one
        time in two (the agent dialled a follower).
        """
        self._sids += 1
        if self.config.fan_in and not forwarded:
            forwarded = self.rng.random() < 0.5
        stream = _Stream(f"s{self._sids}", proc, leader, forwarded=forwarded)
        stream.up_at = stream.down_at = self.now
        leader.streams[stream.sid] = stream
        proc.stream = stream
        return stream

    def _send_up(self, proc: _Proc, message: agent_pb2.AgentMessage) -> None:
        stream = proc.stream
        if stream is None or stream.broken:
            return
        raw = message.SerializeToString()
        arrive = max(self.now, self.partitioned_until.get(proc.node_id, 0.0)) + self._latency()
        arrive = max(arrive, stream.up_at)
        stream.up_at = arrive
        self._at(arrive, lambda: self._leader_receive(stream, raw))

    def _agent_receive(self, stream: _Stream, raw: bytes) -> None:
        proc = stream.proc
        if stream.broken or proc.stream is not stream:
            return
        msg = agent_convert.coordinator_message_from_pb(
            agent_pb2.CoordinatorMessage.FromString(raw)
        )
        self._agent_exec(proc, proc.core.on_message(msg, self._local(proc), self._wall_ms(proc)))

    def _agent_stream_ended(self, stream: _Stream) -> None:
        proc = stream.proc
        if proc.stream is not stream:
            return
        proc.stream = None
        self._agent_exec(proc, proc.core.on_session_closed(self._local(proc), "stream ended"))
        self._reconnect_soon(proc)

    # ------------------------------------------------------------- task runner

    def _start_task(self, proc: _Proc, assign: agent_pb2.Assign) -> None:
        task_id, epoch = assign.task_id, assign.epoch
        if task_id in proc.runs:
            self._fail(f"{proc.incarnation} started {task_id}@{epoch} while its handler runs")
        self._check_start_epoch(proc, task_id, epoch)
        self._start_executing(proc, task_id)
        target = assign.spec.payload[0] if assign.spec.payload else 1
        run = _Run(task_id, epoch, target, started_at=self.now)
        proc.runs[task_id] = run
        proc.tokens += 1
        run.token = proc.tokens
        token = run.token
        self._proc_at(
            proc, self.now + self._latency(), lambda: self._restore(proc, task_id, epoch, token)
        )

    def _restore(self, proc: _Proc, task_id: str, epoch: int, token: int) -> None:
        run = proc.runs.get(task_id)
        if run is None or run.token != token or run.stopping:
            return
        ok, seq, head = self.redis.claim(task_id, epoch, proc.incarnation)
        if not ok:
            self.report.stale_writes += 1
            self._agent_exec(proc, proc.core.task_lost(task_id, epoch, head))
            return
        local = proc.store.checkpoints.get(task_id)
        if local is not None and local[0] == epoch and local[1] > seq:
            seq = local[1]  # our own newer lineage at this epoch (reattach)
        acked = self.acked_seq.get(task_id, 0)
        if seq < acked:
            self._fail(
                f"{proc.incarnation} resumed {task_id}@{epoch} at checkpoint {seq}, "
                f"below the acknowledged replicated checkpoint {acked}"
            )
        run.seq = seq
        started = agent_records.Started(
            resumed_from=self._summary(task_id, epoch, seq) if seq else None
        )
        self._agent_exec(proc, proc.core.task_started(task_id, epoch, started, self._wall_ms(proc)))
        self._schedule_step(proc, run)

    def _summary(self, task_id: str, epoch: int, seq: int) -> agent_records.CheckpointSummary:
        return agent_records.CheckpointSummary(
            checkpoint_ref=f"{task_id}@{seq}", task_id=task_id, epoch=epoch, seq=seq
        )

    def _schedule_step(self, proc: _Proc, run: _Run) -> None:
        token = run.token
        delay = self.config.step_s * self.rng.uniform(0.5, 1.5) / proc.rate
        self._proc_at(proc, self.now + delay, lambda: self._step(proc, run.task_id, token))

    def _step(self, proc: _Proc, task_id: str, token: int) -> None:
        run = proc.runs.get(task_id)
        if run is None or run.token != token or run.stopping:
            return
        if run.seq < run.target:
            run.seq += 1
            proc.store.checkpoints[task_id] = (run.epoch, run.seq)
            summary = self._summary(task_id, run.epoch, run.seq)
            self._agent_exec(proc, proc.core.task_progress(task_id, run.epoch, checkpoint=summary))
            ok, head = self.redis.write(task_id, run.epoch, proc.incarnation, run.seq)
            self._check_redis(task_id)
            seq, epoch = run.seq, run.epoch
            self._proc_at(
                proc,
                self.now + self._latency(),
                lambda: self._replicated(proc, task_id, epoch, seq, ok, head),
            )
            if ok and run.seq < run.target:
                self._schedule_step(proc, run)
                return
            if not ok:
                return
        # The handler returns: its final checkpoint is written and replicated.
        del proc.runs[task_id]
        self._stop_executing(proc, task_id)
        payload = task_id.encode()
        result = agent_records.TaskResult(payload=payload, size_bytes=len(payload))
        self._agent_exec(
            proc,
            proc.core.task_finished(
                task_id,
                run.epoch,
                result=result,
                final_checkpoint=self._summary(task_id, run.epoch, run.seq),
                wall_ms=self._wall_ms(proc),
            ),
        )

    def _replicated(
        self, proc: _Proc, task_id: str, epoch: int, seq: int, ok: bool, head: int
    ) -> None:
        if ok:
            self.acked_seq[task_id] = max(self.acked_seq.get(task_id, 0), seq)
            self._agent_exec(
                proc, proc.core.task_progress(task_id, epoch, replicated_checkpoint_seq=seq)
            )
        else:
            self.report.stale_writes += 1
            self._agent_exec(proc, proc.core.task_lost(task_id, epoch, head))

    def _stop_task(self, proc: _Proc, task_id: str, epoch: int) -> None:
        run = proc.runs.get(task_id)
        if run is None or run.epoch != epoch:
            # The handler already returned (or never ran): report the stop at once.
            local = proc.store.checkpoints.get(task_id)
            seq = local[1] if local is not None and local[0] == epoch else 0
            summary = self._summary(task_id, epoch, seq) if seq else None
            self._agent_exec(
                proc,
                proc.core.task_stopped(
                    task_id, epoch, checkpoint=summary, wall_ms=self._wall_ms(proc)
                ),
            )
            return
        run.stopping = True
        token = run.token

        def stopped() -> None:
            current = proc.runs.get(task_id)
            if current is None or current.token != token:
                return
            del proc.runs[task_id]
            self._stop_executing(proc, task_id)
            summary = self._summary(task_id, epoch, current.seq) if current.seq else None
            self._agent_exec(
                proc,
                proc.core.task_stopped(
                    task_id, epoch, checkpoint=summary, wall_ms=self._wall_ms(proc)
                ),
            )

        self._proc_at(proc, self.now + self.rng.uniform(0.001, 0.1), stopped)

    # ------------------------------------------------------------- checkers

    def _start_executing(self, proc: _Proc, task_id: str) -> None:
        other = self.executing.get(task_id)
        if other is not None and other[0] != proc.pid:
            holder = next(p for p in self.procs if p.pid == other[0])
            self._fail(
                f"task {task_id} executes in {proc.incarnation} (node {proc.node_id}) while "
                f"{holder.incarnation} (node {holder.node_id}) executes it since "
                f"t={other[1]:.3f}s"
            )
        self.executing[task_id] = (proc.pid, self.now)
        self.report.starts += 1

    def _check_start_epoch(self, proc: _Proc, task_id: str, epoch: int) -> None:
        newest = self.started_epochs.get(task_id, 0)
        if epoch < newest:
            self._fail(
                f"{proc.incarnation} started {task_id} at epoch {epoch} after epoch {newest} ran"
            )
        self.started_epochs[task_id] = epoch

    def _stop_executing(self, proc: _Proc, task_id: str) -> None:
        other = self.executing.get(task_id)
        if other is not None and other[0] == proc.pid:
            del self.executing[task_id]

    def _check_redis(self, task_id: str) -> None:
        head = self.redis.tasks[task_id]
        acked = self.acked_seq.get(task_id, 0)
        if head.seq < acked:
            self._fail(
                f"Redis holds checkpoint {head.seq} of {task_id}, below the acknowledged {acked}"
            )

    # --------------------------------------------------------- coordinator shell

    def _elect(self) -> None:
        self.etcd_term += 1
        core = CoordinatorCore(self.settings, rng=Random(self.rng.getrandbits(32)))
        leader = _Leader(self.etcd_term, core)
        nodes = tuple(
            convert.node_record_from_pb(records_pb2.NodeRecord.FromString(self.etcd_nodes[k]))
            for k in sorted(self.etcd_nodes)
        )
        tasks = tuple(
            convert.task_record_from_pb(records_pb2.TaskRecord.FromString(self.etcd_tasks[k]))
            for k in sorted(self.etcd_tasks)
        )
        self.leaders.append(leader)
        self._feed(leader, LeadershipAcquired(leader.term, self.now, nodes, tasks))

    def _leader_tick(self) -> None:
        for leader in list(self.leaders):
            if leader.alive:
                self._feed(leader, Tick(self.now))

    def _feed(self, leader: _Leader, event: Event) -> None:
        if not leader.alive or leader.lost:
            return  # the runtime feeds nothing once it does not lead
        commands = leader.core.step(event)
        check_command_order(commands)
        self._leader_exec(leader, commands)

    def _leader_exec(self, leader: _Leader, commands: list[Command]) -> None:
        """``CoordinatorRuntime._run_locked``."""
        written = 0
        for command in commands:
            if not leader.alive:
                return
            if isinstance(command, PersistNodes | PersistTasks):
                if leader.cut_mid_step and written and leader is self.leaders[-1]:
                    # The lease ran out between two writes: the first is in etcd, this one
                    # and everything after it (sends, acks) never happen.
                    leader.cut_mid_step = False
                    self.report.partial_writes += 1
                    self._depose(leader)
                    self._lose_lease(leader, "lease lost mid-step")
                    return
                written += 1
                if not self._etcd_write(leader, command):
                    self._lose_lease(leader, "fenced write rejected")
                    return
            elif isinstance(command, RetireRecords):
                # Archived, then deleted from etcd in a fenced transaction (only the
                # tasks' archive is kept, for the end check).
                if leader.term != self.etcd_term or leader.lost:
                    self._lose_lease(leader, "fenced delete rejected")
                    return
                self.report.retired_tasks += len(command.tasks)
                self.report.retired_nodes += len(command.nodes)
                for task in command.tasks:
                    self.archived_tasks[task.task_id] = task
                    self.etcd_tasks.pop(task.task_id, None)
                for node in command.nodes:
                    self.etcd_nodes.pop(node.node_id, None)
            elif isinstance(command, EmitEvent):
                body = command.body
                if isinstance(body, notices.IdentityConflict):
                    self.report.identity_refusals += 1
                elif isinstance(body, notices.NodeJoined) and body.previous_incarnation:
                    self.report.takeovers += 1
            elif isinstance(command, SendDirective):
                stream = leader.streams.get(command.session_id)
                if stream is None or stream.broken or not stream.leader_open:
                    continue
                message = convert.directive_to_pb(
                    command.directive,
                    session_id=command.session_id,
                    leader_id=f"leader-{leader.term}",
                    cluster_name="sim",
                    now_s=self.now,
                )
                self._send_down(stream, message.SerializeToString())
            elif isinstance(command, CloseSession):
                stream = leader.streams.get(command.session_id)
                if stream is not None and stream.leader_open:
                    stream.leader_open = False
                    end = max(self.now + self._latency(), stream.down_at)
                    stream.down_at = end
                    self._at(end, partial(self._agent_stream_ended, stream))
                    # The servicer feeds SessionClosed when the stream ends; the core ignores it.
                    self._at(self.now + self._latency(), partial(self._leader_stream_ended, stream))
            elif isinstance(command, ReplyToRequest):
                if command.status is StatusCode.OK and command.created:
                    self.accepted[command.request_id] = command.task_id
            elif isinstance(command, StepDown):
                self._depose(leader)
                return

    def _lose_lease(self, leader: _Leader, reason: str) -> None:
        """A write of ``leader``'s was fenced out: it steps ``LeadershipLost`` and
        runs what that returns (the rest of its step is dropped by the caller)."""
        leader.lost = True
        self._leader_exec(leader, leader.core.step(LeadershipLost(self.now, reason)))

    def _etcd_write(self, leader: _Leader, command: PersistNodes | PersistTasks) -> bool:
        if leader.term != self.etcd_term or leader.lost:
            return False
        if isinstance(command, PersistNodes):
            for node in command.records:
                self.etcd_nodes[node.node_id] = convert.node_record_to_pb(node).SerializeToString()
        else:
            for task in command.records:
                previous = self.etcd_epochs.get(task.task_id, 0)
                if task.epoch < previous:
                    self._fail(
                        f"etcd: epoch of {task.task_id} went down {previous} -> {task.epoch}"
                    )
                self.etcd_epochs[task.task_id] = task.epoch
                self.etcd_tasks[task.task_id] = convert.task_record_to_pb(task).SerializeToString()
        return True

    def _send_down(self, stream: _Stream, raw: bytes) -> None:
        node = stream.proc.node_id
        arrive = max(self.now, self.partitioned_until.get(node, 0.0)) + self._latency()
        slow_until, extra = self.slow_down.get(node, (0.0, 0.0))
        if self.now < slow_until:
            arrive += extra
        arrive = max(arrive, stream.down_at)
        stream.down_at = arrive
        proc = stream.proc
        self._proc_at(proc, arrive, lambda: self._agent_receive(stream, raw))

    def _leader_receive(self, stream: _Stream, raw: bytes) -> None:
        """A message reaches the leader: at once, or in its follower's next batch."""
        leader = stream.leader
        if not stream.forwarded:
            self._leader_step_message(stream, raw)
            return
        if not leader.batch:
            self._at(self.now + self.config.batch_linger_s, lambda: self._read_batch(leader))
        leader.batch.append((stream, raw))

    def _read_batch(self, leader: _Leader) -> None:
        """``ForwardService._read``: a batch's heartbeats as one digest, then the rest in order.

        A heartbeat whose Session has an older message in the batch (a Hello
        not yet stepped, a task update) is stepped after that message, as the
        leader's Session servicer does; every other heartbeat goes into the
        batch's ``HeartbeatDigest``, stepped first (the real rule,
        ``coordinator.core.relay.digest_eligible``, decides).
        """
        batch, leader.batch = leader.batch, []
        digest: list[HeartbeatReceived] = []
        behind: list[tuple[_Stream, bytes]] = []
        queued: dict[str, int] = {}  # Session -> its messages in this batch not yet stepped
        for stream, raw in batch:
            if stream.broken or not stream.leader_open or not leader.alive:
                continue
            message = agent_pb2.AgentMessage.FromString(raw)
            if message.WhichOneof("body") == "heartbeat" and digest_eligible(
                queued.get(stream.sid, 0), stream.hello_seen, not stream.leader_open
            ):
                digest.append(
                    convert.heartbeat_to_event(
                        stream.sid, stream.node_id, message.heartbeat, self.now
                    )
                )
                continue
            queued[stream.sid] = queued.get(stream.sid, 0) + 1
            behind.append((stream, raw))
        if digest:
            self.report.digested += len(digest)
            self._feed(leader, HeartbeatDigest(tuple(digest), self.now))
        for stream, raw in behind:
            self._leader_step_message(stream, raw)

    def _leader_step_message(self, stream: _Stream, raw: bytes) -> None:
        """``AgentSessionService._receive``: bytes -> event -> the leader's core."""
        leader = stream.leader
        if stream.broken or not stream.leader_open or not leader.alive:
            return
        message = agent_pb2.AgentMessage.FromString(raw)
        which = message.WhichOneof("body")
        sid = stream.sid
        event: Event
        if which == "hello":
            event = convert.hello_to_event(sid, message.hello, self.now)
            if stream.hello_seen:
                event = replace(event, node_id=stream.node_id)
            else:
                stream.hello_seen = True
                stream.node_id = message.hello.node_id
        elif not stream.hello_seen:
            return
        elif which == "heartbeat":
            event = convert.heartbeat_to_event(sid, stream.node_id, message.heartbeat, self.now)
        elif which == "task_update":
            event = convert.task_update_to_event(sid, stream.node_id, message.task_update, self.now)
        elif which == "lineage_report":
            event = convert.lineage_report_to_event(
                sid, stream.node_id, message.lineage_report, self.now
            )
        elif which == "goodbye":
            bye = message.goodbye
            event = GoodbyeReceived(sid, stream.node_id, self.now, bye.reason, bye.released_all)
        else:
            return
        self._feed(leader, event)

    def _leader_stream_ended(self, stream: _Stream) -> None:
        leader = stream.leader
        stream.leader_open = False
        if leader.streams.pop(stream.sid, None) is None or not stream.hello_seen:
            return
        self._feed(leader, SessionClosed(stream.sid, stream.node_id, self.now, "stream ended"))

    def _break(self, stream: _Stream, *, agent_delay: float | None, leader_delay: float) -> None:
        """The stream breaks; each end learns after its own delay (None: it knows already)."""
        if stream.broken:
            return
        stream.broken = True
        if agent_delay is not None:
            self._at(self.now + agent_delay, lambda: self._agent_stream_ended(stream))
        self._at(self.now + leader_delay, lambda: self._leader_stream_ended(stream))

    def _hold_for_reattach(self, stream: _Stream) -> None:
        """Fan-in: a follower held this Session; it detaches it, then carries it to the next leader.

        ``SessionForwarder``: the agent's stream stays open and what the agent
        sends meanwhile is dropped; once a leader answers, the agent gets a
        ``Reattach`` and its next Hello opens a Session there on the same
        stream. An agent that closed the Session itself (a self-fence) or died
        is not reattached; with no leader to reach the stream is ended.
        """
        stream.broken = True  # the old leader's side is gone; nothing crosses it any more
        proc = stream.proc

        def reattach() -> None:
            if not proc.alive or proc.stream is not stream:
                return
            leader = self.leaders[-1]
            if not leader.alive or leader.lost or self._partitioned(proc.node_id):
                self._agent_stream_ended(stream)
                return
            self._open_stream(proc, leader, forwarded=True)
            self.report.reattaches += 1
            message = agent_records.Reattach(term=leader.term)
            self._agent_exec(
                proc, proc.core.on_message(message, self._local(proc), self._wall_ms(proc))
            )

        # Mostly as soon as the next leader answers; sometimes much later (a
        # follower cut off from the leaders for a while), past the agent's fence.
        late = self.rng.random() < 0.2
        delay = self.rng.uniform(1.5, 8.0) if late else self.rng.uniform(0.05, 1.5)
        self._proc_at(proc, self.now + delay, reattach)

    def _depose(self, leader: _Leader) -> None:
        """The leader loses its lease: a new one is elected; it runs on a little, then stops."""
        if leader is not self.leaders[-1]:
            return
        self._elect()
        run_on = self.rng.uniform(0.0, self.config.deposed_run_s)

        def stop() -> None:
            leader.alive = False
            for stream in list(leader.streams.values()):
                if self.config.fan_in and self.rng.random() < 0.5:
                    self._hold_for_reattach(stream)
                else:
                    self._break(stream, agent_delay=self.rng.uniform(0.001, 0.5), leader_delay=0.0)
            leader.streams.clear()

        self._at(self.now + run_on, stop)

    # ---------------------------------------------------------- orchestrator

    def _submit(self, i: int) -> None:
        request_id = f"req-{i}"
        units = self.units.setdefault(request_id, self.rng.randint(3, 10))
        spec = TaskSpec(kind="work", payload=bytes([units]))
        leader = self.leaders[-1]
        if not leader.alive or leader.lost:
            self._at(self.now + 0.5, lambda: self._submit(i))
            return
        self._feed(leader, TaskSubmitted(request_id, spec, self.now, task_id=f"t{i}"))
        if request_id not in self.accepted:
            self._at(self.now + 0.5, lambda: self._submit(i))

    # ---------------------------------------------------------------- faults

    def _partitioned(self, node_id: str) -> bool:
        return self.partitioned_until.get(node_id, 0.0) > self.now

    def _primaries(self) -> list[_Proc]:
        return [p for p in self.procs if p.alive and not p.extra]

    def _count(self, name: str) -> None:
        self.report.faults[name] = self.report.faults.get(name, 0) + 1

    def _fault(self) -> None:
        if self.healing:
            return
        cfg = self.config
        kinds = ["partition", "partition", "partition", "break", "crash_same", "crash_fresh"]
        kinds += ["half_open", "slow_link"]
        if cfg.stalls:
            kinds += ["stall", "stall"]
        if cfg.failovers:
            kinds.append("failover")
            if cfg.partial_writes:
                kinds.append("partial_write")
        if cfg.identity_faults:
            kinds += ["duplicate", "impostor"]
        kind = self.rng.choice(kinds)
        alive = [p for p in self.procs if p.alive]
        if not alive:
            return
        busy = [p for p in alive if p.runs]
        proc = self.rng.choice(busy if busy and self.rng.random() < 0.7 else alive)
        self._count(kind)
        if kind == "partition":
            length = self.rng.uniform(0.5, 6.0)
            self.partitioned_until[proc.node_id] = max(
                self.partitioned_until.get(proc.node_id, 0.0), self.now + length
            )
            if proc.stream is not None and self.rng.random() < 0.7:
                # The stream breaks during the partition; each end finds out on its own.
                self._break(
                    proc.stream,
                    agent_delay=self.rng.uniform(0.001, 3.0),
                    leader_delay=self.rng.uniform(0.001, length + 2.0),
                )
        elif kind == "break":
            if proc.stream is not None:
                self._break(
                    proc.stream,
                    agent_delay=self.rng.uniform(0.001, 0.2),
                    leader_delay=self.rng.uniform(0.001, 0.2),
                )
        elif kind == "slow_link":  # leader -> agent messages lag (a congested link)
            until = self.now + self.rng.uniform(1.0, 4.0)
            self.slow_down[proc.node_id] = (until, self.rng.uniform(0.2, 1.5))
            if self.rng.random() < 0.5:  # a link that degrades, then drops
                length = self.rng.uniform(3.0, 6.0)
                node_id = proc.node_id

                def drop() -> None:
                    if not self.healing:
                        self.partitioned_until[node_id] = max(
                            self.partitioned_until.get(node_id, 0.0), self.now + length
                        )

                self._at(self.rng.uniform(self.now, until), drop)
        elif kind == "half_open":
            if proc.stream is not None:  # the agent sees it at once, the leader much later
                self._break(proc.stream, agent_delay=0.001, leader_delay=self.rng.uniform(1.0, 8.0))
        elif kind in ("crash_same", "crash_fresh"):
            self._crash(proc)
            fresh = kind == "crash_fresh"
            if not proc.extra:
                store = self._new_store(proc.node_id) if fresh else proc.store

                def respawn(node_id: str = proc.node_id, store: _Store = store) -> None:
                    if not self.healing and not self._node_has_primary(node_id):
                        self._spawn(node_id, store)

                self._at(self.now + self.rng.uniform(0.1, 4.0), respawn)
        elif kind == "stall":
            proc.stalled_until = max(
                proc.stalled_until, self.now + self.rng.uniform(0.01, cfg.max_stall_s)
            )
        elif kind == "failover":
            self._depose(self.leaders[-1])
        elif kind == "partial_write":
            self.leaders[-1].cut_mid_step = True
        elif kind == "duplicate":
            self._spawn(proc.node_id, self._new_store(proc.node_id), extra=True)
        elif kind == "impostor":
            self._spawn(
                proc.node_id, self._new_store(proc.node_id), extra=True, impostor=proc.incarnation
            )

    def _node_has_primary(self, node_id: str) -> bool:
        return any(p.alive and not p.extra and p.node_id == node_id for p in self.procs)

    def _heal(self) -> None:
        """End of the safety phase: partitions heal, extras stop, every node gets a process."""
        self.healing = True
        self.partitioned_until.clear()
        self.slow_down.clear()
        for proc in self.procs:
            proc.stalled_until = min(proc.stalled_until, self.now)
            if proc.alive and proc.extra:
                self._crash(proc)
        for i in range(self.config.nodes):
            node_id = f"n{i}"
            if not self._node_has_primary(node_id):
                stores = [p.store for p in self.procs if p.node_id == node_id and not p.extra]
                self._spawn(node_id, stores[-1])
        leader = self.leaders[-1]
        if not leader.alive or leader.lost:
            self._elect()

    def _check_end(self) -> None:
        leader = self.leaders[-1]
        snapshot = leader.core.snapshot()
        tasks = {t.task_id: t for t in snapshot.tasks}
        for request_id, task_id in sorted(self.accepted.items()):
            task = tasks.get(task_id) or self.archived_tasks.get(task_id)
            if task is None:
                self._fail(f"accepted task {task_id} ({request_id}) was lost")
            elif not task.state.terminal:
                self._fail(f"task {task_id} is still {task.state.name} after the heal phase")
            elif task.state is TaskState.COMPLETED:
                self.report.completed += 1
            elif task.state is TaskState.FAILED:
                self.report.failed += 1
        for view in snapshot.nodes:
            if view.record.state is not NodeState.ALIVE:
                self._fail(f"node {view.record.node_id} is {view.record.state.name} at the end")


def _main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Replay or sweep fleet simulation seeds.")
    parser.add_argument("--seed", type=int, default=None, help="replay one seed")
    parser.add_argument("--seeds", type=int, default=100, help="seeds to sweep from --start")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="default")
    args = parser.parse_args(argv)
    config = SHAPES[args.shape]
    seeds = [args.seed] if args.seed is not None else range(args.start, args.start + args.seeds)
    failures = 0
    for seed in seeds:
        try:
            FleetSimulation(seed, config).run()
        except SimulationFailure as exc:
            failures += 1
            print(exc)
    print(f"{len(seeds)} seeds, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(_main())
