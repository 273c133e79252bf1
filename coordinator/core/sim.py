"""A seeded simulator of a fleet around ``CoordinatorCore``, with invariant checkers.

Theory of operation (after TigerBeetle's VOPR): one ``random.Random(seed)``
drives everything: heartbeat jitter, message latency, task sizes, and a fault
schedule of process crashes (with and without a closed stream), restarts under
a new incarnation (on the same store, which proves the old process gone, or on
a fresh one), a second process started under a live node id (its own store, or
the holder's public incarnation id without its secret: DESIGN.md §4),
partitions (silent, stream left open), stream blips, mass
partitions of most of the fleet, drains, cancels, duplicate submissions, and
leader failovers that crash the leader part-way through a command list. Time
is simulated: an event queue ordered by (time, sequence number).

The pieces a real deployment has are modelled just enough to check the core:

- the shell: runs each command list in order; persists go to a dict standing
  in for etcd (the only thing a new leader loads from); a failover applies a
  random prefix of the list and drops the rest;
- Session streams: FIFO per direction, as gRPC over TCP; during a partition
  messages wait and arrive after it heals, unless the stream broke first;
- node agents: Hello with held tasks, heartbeats every interval plus jitter,
  self-fencing (no ack for a heartbeat sent at ``s`` -> pause every task at
  ``s + fence_after_s``, close the Session, start nothing until a new Welcome,
  say Hello again), work in steps that each end with a checkpoint replicated
  to a Redis stand-in that refuses older epochs;
- an orchestrator that submits, resubmits and cancels, and an operator who
  drains and uncordons.

Safety phase: faults happen. After every step the checkers run:
``check_invariants`` of the core; persist-before-send order; every persisted
task epoch never decreases, each (task, epoch) has one owner; every Assign
directive matches what etcd holds; every newly placed task goes to an ALIVE,
uncordoned, connected node; every accepted task is in the table in exactly one
state; a node is declared DEAD only after ``dead_after_s`` without a message
reaching the leader; and, on the agents' side, no task ever runs in two
unfenced processes at once, whatever their epochs (the old owner has paused
before the new one starts), and the Redis stand-in refuses a write of an older
epoch or of another incarnation at an equal one.
Liveness phase: every fault heals; by the end every accepted task is
terminal, every node is ALIVE, and the guard is released.

A failed check raises ``SimulationFailure`` whose message starts with the seed;
``Simulation(seed).run()`` replays it exactly.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from random import Random

from coordinator.core import notices
from coordinator.core.commands import (
    CloseSession,
    Command,
    EmitEvent,
    PersistNodes,
    PersistTasks,
    ReplyToRequest,
    SendDirective,
    StatusCode,
    StepDown,
    check_command_order,
)
from coordinator.core.core import CoordinatorCore, Role
from coordinator.core.directives import (
    Assign,
    HeartbeatAck,
    Release,
    Revoke,
    TaskUpdateAck,
    Welcome,
)
from coordinator.core.errors import CoreError
from coordinator.core.events import (
    CancelRequested,
    Checkpointed,
    Completed,
    DrainRequested,
    Event,
    HeartbeatReceived,
    LeadershipAcquired,
    MigrateRequested,
    Released,
    SessionClosed,
    SessionOpened,
    Started,
    TaskChange,
    TaskSubmitted,
    TaskUpdateReceived,
    Tick,
    UncordonRequested,
)
from coordinator.core.records import (
    AssignReason,
    CheckpointSummary,
    HeldTask,
    HeldTaskStatus,
    MoveReason,
    NodeRecord,
    NodeState,
    TaskProgress,
    TaskRecord,
    TaskResult,
    TaskSpec,
    TaskState,
    UpdateOutcome,
)
from coordinator.core.settings import CoreSettings, DetectorKind

__all__ = ["SimConfig", "SimReport", "Simulation", "SimulationFailure"]


class SimulationFailure(AssertionError):
    """A checker found a broken invariant; the message starts with ``seed=<n>``."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Shape of one simulated run.

    Attributes:
        nodes: node agents in the fleet.
        tasks: tasks the orchestrator submits during the safety phase.
        safety_s: length of the phase with faults, simulated seconds.
        liveness_s: length of the healed phase that must finish every task.
        fault_rate_per_s: expected faults per simulated second (whole fleet).
        failovers: whether leader failovers are part of the fault schedule.
        migrations: whether operator MigrateTask requests are part of it.
        detector: which failure detector the core uses.
        max_latency_s: one-way message latency is uniform in [0.5 ms, this].
        heartbeat_jitter_s: each heartbeat is late by up to this much.
        duplicates: whether identity faults are part of the schedule: second
            processes under a live node id, impostors of an incarnation id, and
            restarts on a fresh store (no proof the old process stopped).
    """

    nodes: int = 5
    tasks: int = 24
    safety_s: float = 15.0
    liveness_s: float = 25.0
    fault_rate_per_s: float = 0.4
    failovers: bool = True
    migrations: bool = True
    detector: DetectorKind = DetectorKind.FIXED_TIMEOUT
    max_latency_s: float = 0.02
    heartbeat_jitter_s: float = 0.1
    duplicates: bool = True


@dataclass(slots=True)
class SimReport:
    """What happened in a run (for tests that check the faults were exercised)."""

    seed: int
    steps: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    dead_verdicts: int = 0
    guard_engaged: int = 0
    zombies_fenced: int = 0
    moved_tasks: int = 0
    migrated_tasks: int = 0
    failovers: int = 0
    identity_conflicts: int = 0
    restarts_proven: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0


@dataclass(slots=True)
class _Held:
    epoch: int
    status: HeldTaskStatus
    progress: int
    token: int = 0


@dataclass(slots=True)
class _Agent:
    node_id: str
    incarnation_no: int = 0
    store_id: str = ""  # its local store; a restart on the same store proves the old process gone
    previous_incarnation: str = ""  # the store lock's previous holder, sent in Hello
    impostor_of: str = ""  # claims this incarnation id without its secret
    alive: bool = True
    partitioned_until: float = 0.0
    stream: str = ""
    welcomed: bool = False
    seq: int = 0
    sent_at: dict[int, float] = field(default_factory=dict)
    acked_through_s: float = 0.0
    update_seq: int = 0
    tasks: dict[str, _Held] = field(default_factory=dict)
    connecting: bool = False
    fenced_at: float | None = None  # self-fenced since; starts nothing until a new Welcome

    @property
    def incarnation(self) -> str:
        return self.impostor_of or f"{self.node_id}#{self.incarnation_no}"

    @property
    def secret_sha256(self) -> bytes:
        """Stands in for SHA-256 of the process's random secret: unique per process."""
        return f"{self.node_id}#{self.incarnation_no}:{self.store_id}".encode()


class Simulation:
    """One seeded run; ``run()`` returns a report or raises ``SimulationFailure``."""

    def __init__(
        self, seed: int, config: SimConfig | None = None, settings: CoreSettings | None = None
    ) -> None:
        """Prepare a run.

        Args:
            seed: drives every random choice; the same seed replays the same run.
            config: shape of the run (defaults when None).
            settings: core settings (defaults with ``self_check`` and 10 attempts when None).
        """
        self.seed = seed
        self.config = config if config is not None else SimConfig()
        self.settings = (
            settings
            if settings is not None
            else CoreSettings(
                detector=self.config.detector, default_max_attempts=10, self_check=True
            )
        )
        self.rng = Random(seed)
        self.report = SimReport(seed)
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._counter = 0
        self.core: CoordinatorCore | None = None
        self.term = 0
        self.etcd_nodes: dict[str, NodeRecord] = {}
        self.etcd_tasks: dict[str, TaskRecord] = {}
        self.redis: dict[str, tuple[int, int, str]] = {}  # epoch, progress, owner
        self.agents = {
            f"n{i}": _Agent(f"n{i}", store_id=f"n{i}/store0") for i in range(self.config.nodes)
        }
        # Second processes under a node id the primary holds (DESIGN.md §4 faults).
        self.extras: list[_Agent] = []
        self._stores = 0
        self.work_units: dict[str, int] = {}
        self.accepted: dict[str, str] = {}  # request id -> task id
        self.epoch_owner: dict[tuple[str, int], str] = {}
        self.assigned_epochs: dict[str, int] = {}
        self.last_heard: dict[str, float] = {}
        self.healing = False
        self._session_counter = 0
        self._fifo: dict[tuple[str, bool], float] = {}
        self._broken: set[tuple[str, bool]] = set()
        self.trace: Callable[[float, Event, list[Command]], None] | None = None

    # ------------------------------------------------------------------
    # Driver.
    # ------------------------------------------------------------------

    def run(self) -> SimReport:
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
        except CoreError as exc:
            raise SimulationFailure(self._where(f"{type(exc).__name__}: {exc}")) from exc
        return self.report

    def _run(self) -> None:
        cfg = self.config
        end_safety = cfg.safety_s
        end = cfg.safety_s + cfg.liveness_s
        self._at(0.0, self._elect)
        for agent in self.agents.values():
            self._at(self.rng.uniform(0.0, 0.4), partial(self._connect, agent))
            self._at(self.rng.uniform(0.0, 0.5), partial(self._heartbeat, agent, 0))
        for i in range(cfg.tasks):
            self._at(self.rng.uniform(0.5, end_safety), partial(self._submit, i))
        t = self.rng.expovariate(cfg.fault_rate_per_s)
        while t < end_safety:
            self._at(t, self._fault)
            t += self.rng.expovariate(cfg.fault_rate_per_s)
        self._at(end_safety, self._heal_all)
        tick = self.settings.tick_interval_s
        n = 1
        while n * tick <= end:
            self._at(n * tick, self._tick)
            n += 1
        while self._queue:
            when, _, action = heapq.heappop(self._queue)
            if when > end:
                break
            self.now = when
            action()
        self._check_end()

    def _at(self, when: float, action: Callable[[], None]) -> None:
        self._counter += 1
        heapq.heappush(self._queue, (max(when, self.now), self._counter, action))

    def _latency(self) -> float:
        return self.rng.uniform(0.0005, self.config.max_latency_s)

    def _where(self, message: str) -> str:
        return f"seed={self.seed} t={self.now:.3f}s step={self.report.steps}: {message}"

    def _fail(self, message: str) -> None:
        raise SimulationFailure(self._where(message))

    # ------------------------------------------------------------------
    # The shell: feed events, run commands, fail over.
    # ------------------------------------------------------------------

    def _elect(self) -> None:
        self.term += 1
        self.core = CoordinatorCore(self.settings, rng=Random(self.rng.getrandbits(32)))
        self.last_heard = {}
        nodes = tuple(self.etcd_nodes[k] for k in sorted(self.etcd_nodes))
        tasks = tuple(self.etcd_tasks[k] for k in sorted(self.etcd_tasks))
        self._feed(LeadershipAcquired(self.term, self.now, nodes, tasks))
        snapshot = self.core.snapshot() if self.core is not None else None
        if snapshot is not None and {t.task_id for t in snapshot.tasks} != set(self.etcd_tasks):
            self._fail("the new leader's task table differs from etcd")

    def _failover(self, commands: list[Command] | None = None) -> None:
        """The leader dies; a prefix of ``commands`` was carried out."""
        self.report.failovers += 1
        if commands:
            self._execute(commands[: self.rng.randrange(len(commands) + 1)])
        self.core = None
        for agent in self._processes():
            if agent.stream:  # the leader's end of every stream is gone
                self._break(agent.stream)
                self._at(self.now + self._latency(), partial(self._lost, agent, agent.stream))
        self._at(self.now + self.rng.uniform(0.3, 3.0), self._elect)

    def _feed(self, event: Event) -> None:
        core = self.core
        if core is None:
            return
        commands = core.step(event)
        self.report.steps += 1
        if self.trace is not None:
            self.trace(self.now, event, commands)
        if isinstance(event, HeartbeatReceived | SessionOpened):
            view = core.node(event.node_id)
            if view is not None and view.session_id == event.session_id:
                self.last_heard[event.node_id] = self.now  # accepted on its current Session
        check_command_order(commands)
        self._check_step(core, commands)
        if self.config.failovers and not self.healing and commands and self.rng.random() < 0.002:
            self._failover(commands)
            return
        self._execute(commands)

    def _execute(self, commands: list[Command]) -> None:
        for command in commands:
            if isinstance(command, PersistNodes):
                for node in command.records:
                    self.etcd_nodes[node.node_id] = node
            elif isinstance(command, PersistTasks):
                for task in command.records:
                    self._check_persisted(task)
                    self.etcd_tasks[task.task_id] = task
            elif isinstance(command, EmitEvent):
                self._observe(command.body)
            elif isinstance(command, SendDirective):
                assign = command.directive
                if isinstance(assign, Assign) and assign.reason is not AssignReason.REATTACH:
                    previous = self.assigned_epochs.get(assign.task_id, 0)
                    if assign.epoch <= previous:
                        self._fail(
                            f"{assign.task_id} assigned epoch {assign.epoch} after {previous}"
                        )
                    self.assigned_epochs[assign.task_id] = assign.epoch
                self._deliver(command)
            elif isinstance(command, ReplyToRequest):
                if command.status is StatusCode.OK and command.created:
                    self.accepted[command.request_id] = command.task_id
            elif isinstance(command, CloseSession):
                agent = self._process_for(command.node_id, command.session_id)
                if agent is not None:  # the close follows what was sent before it
                    self._transmit(
                        agent,
                        command.session_id,
                        False,
                        partial(self._lost, agent, command.session_id),
                    )
                # The shell reports the close it made; the core must ignore it.
                self._at(self.now + self._latency(), partial(self._closed_by_us, command))
            elif isinstance(command, StepDown):
                self._failover()
                return

    def _tick(self) -> None:
        self._feed(Tick(self.now))

    def _closed_by_us(self, command: CloseSession) -> None:
        self._feed(SessionClosed(command.session_id, command.node_id, self.now, command.reason))

    # ------------------------------------------------------------------
    # Checkers.
    # ------------------------------------------------------------------

    def _check_persisted(self, task: TaskRecord) -> None:
        old = self.etcd_tasks.get(task.task_id)
        if old is not None and task.epoch < old.epoch:
            self._fail(f"task {task.task_id} epoch went down {old.epoch} -> {task.epoch}")
        if old is not None and old.state.terminal and task != old:
            self._fail(f"task {task.task_id} left terminal state {old.state.name}")
        if task.state.owned:
            key = (task.task_id, task.epoch)
            owner = self.epoch_owner.setdefault(key, task.owner_node_id)
            if owner != task.owner_node_id:
                self._fail(
                    f"task {task.task_id}@{task.epoch}: owners {owner}, {task.owner_node_id}"
                )

    def _check_step(self, core: CoordinatorCore, commands: list[Command]) -> None:
        persisted = {
            r.task_id: r for c in commands if isinstance(c, PersistTasks) for r in c.records
        }
        if core.role is Role.LEADER:
            for task_id in self.accepted.values():
                if core.task(task_id) is None:
                    self._fail(f"accepted task {task_id} is missing from the table")
        for command in commands:
            if not isinstance(command, SendDirective) or not isinstance(command.directive, Assign):
                continue
            assign = command.directive
            record = persisted.get(assign.task_id) or self.etcd_tasks.get(assign.task_id)
            if (
                record is None
                or record.epoch != assign.epoch
                or record.owner_node_id != command.node_id
            ):
                self._fail(
                    f"Assign {assign.task_id}@{assign.epoch} to {command.node_id} not persisted"
                )
            if assign.reason is AssignReason.REATTACH:
                continue
            node = core.node(command.node_id)
            if (
                node is None
                or node.record.state is not NodeState.ALIVE
                or node.record.cordoned
                or not node.connected
            ):
                self._fail(f"task {assign.task_id} placed on {command.node_id} ({node})")
        for body in (c.body for c in commands if isinstance(c, EmitEvent)):
            if isinstance(body, notices.NodeDead):
                heard = self.last_heard.get(body.node_id)
                dead_after = self.settings.dead_after_s
                if heard is not None and self.now - heard < dead_after - 1e-9:
                    self._fail(
                        f"{body.node_id} declared DEAD {self.now - heard:.3f}s after a message"
                    )

    def _processes(self) -> list[_Agent]:
        return [*self.agents.values(), *self.extras]

    def _check_two_owners(self, task_id: str, agent: _Agent, epoch: int) -> None:
        """No other live process runs the task, at any epoch (time, not epochs)."""
        for other in self._processes():
            if other is agent or not other.alive:
                continue
            held = other.tasks.get(task_id)
            if held is not None and held.status is HeldTaskStatus.RUNNING:
                self._fail(
                    f"task {task_id} starts on {agent.node_id}/{agent.incarnation}@{epoch} while "
                    f"{other.node_id}/{other.incarnation}@{held.epoch} still runs it"
                )

    def _observe(self, body: notices.Notice) -> None:
        if isinstance(body, notices.NodeDead):
            self.report.dead_verdicts += 1
        elif isinstance(body, notices.MassFailureGuardChanged) and body.active:
            self.report.guard_engaged += 1
        elif isinstance(body, notices.ZombieFenced):
            self.report.zombies_fenced += 1
        elif isinstance(body, notices.IdentityConflict):
            self.report.identity_conflicts += 1
        elif isinstance(body, notices.NodeJoined) and body.previous_incarnation:
            agent = self.agents.get(body.node_id)
            if agent is not None and agent.previous_incarnation == body.previous_incarnation:
                self.report.restarts_proven += 1
        elif isinstance(body, notices.TaskReassigned):
            self.report.moved_tasks += 1
            if body.reason is MoveReason.MIGRATE:
                self.report.migrated_tasks += 1

    def _check_end(self) -> None:
        if self.core is None:
            raise SimulationFailure(self._where("no leader at the end of the liveness phase"))
        snapshot = self.core.snapshot()
        tasks = {t.task_id: t for t in snapshot.tasks}
        for request_id, task_id in sorted(self.accepted.items()):
            task = tasks.get(task_id)
            if task is None:
                self._fail(f"accepted task {task_id} ({request_id}) was lost")
            elif not task.state.terminal:
                self._fail(f"task {task_id} is still {task.state.name} after the liveness phase")
        for task in tasks.values():
            if task.state is TaskState.COMPLETED:
                self.report.completed += 1
            elif task.state is TaskState.FAILED:
                self.report.failed += 1
            elif task.state is TaskState.CANCELLED:
                self.report.cancelled += 1
        for view in snapshot.nodes:
            if view.record.state is not NodeState.ALIVE:
                self._fail(f"node {view.record.node_id} is {view.record.state.name} at the end")
        if snapshot.guard_active:
            self._fail("the mass-failure guard is still active at the end")

    # ------------------------------------------------------------------
    # Orchestrator and operator.
    # ------------------------------------------------------------------

    def _submit(self, i: int, attempt: int = 0) -> None:
        request_id = f"req-{i}"
        if request_id not in self.work_units:
            self.work_units[request_id] = self.rng.randint(1, 6)
        units = self.work_units[request_id]
        spec = TaskSpec(kind="work", payload=units.to_bytes(1, "big"))
        if self.core is None:
            if attempt < 50:
                self._at(self.now + 0.5, lambda: self._submit(i, attempt + 1))
            return
        self._feed(TaskSubmitted(request_id, spec, self.now, task_id=f"t{i}"))
        if self.rng.random() < 0.2:  # a client retry with the same request id
            self._at(self.now + self.rng.uniform(0.0, 2.0), lambda: self._submit(i, attempt + 1))

    def _fault(self) -> None:
        agents = sorted(self.agents)
        agent = self.agents[self.rng.choice(agents)]
        kind = self.rng.choices(
            [
                "crash",
                "silent_crash",
                "partition",
                "blip",
                "mass_partition",
                "drain",
                "cancel",
                "failover",
                "migrate",
                "duplicate",
                "impostor",
            ],
            weights=[
                3,
                2,
                3,
                2,
                0.6,
                1,
                1,
                0.6 if self.config.failovers else 0,
                1 if self.config.migrations else 0,
                1 if self.config.duplicates else 0,
                0.5 if self.config.duplicates else 0,
            ],
        )[0]
        self.report.faults[kind] = self.report.faults.get(kind, 0) + 1
        if kind in ("crash", "silent_crash"):
            if agent.alive:
                self._crash(agent, close=kind == "crash")
                self._at(self.now + self.rng.uniform(0.5, 6.0), lambda: self._restart(agent))
        elif kind == "partition":
            self._partition(agent, self.rng.uniform(0.3, 6.0))
        elif kind == "blip":
            if agent.stream:
                stream = agent.stream
                self._break(stream)
                self._at(self.now + self._latency(), partial(self._lost, agent, stream))
                self._feed(SessionClosed(stream, agent.node_id, self.now, "blip"))
        elif kind == "mass_partition":
            count = len(agents) // 2 + 1
            length = self.rng.uniform(1.0, 6.0)
            for node_id in self.rng.sample(agents, count):
                self._partition(self.agents[node_id], length)
        elif kind == "drain":
            self._feed(DrainRequested(f"drain-{self.now:.3f}", agent.node_id, self.now, "sim"))
            self._at(
                self.now + self.rng.uniform(1.0, 5.0),
                lambda: self._feed(
                    UncordonRequested(f"uncordon-{self.now:.3f}", agent.node_id, self.now)
                ),
            )
        elif kind == "cancel" and self.accepted:
            task_id = self.accepted[self.rng.choice(sorted(self.accepted))]
            self._feed(CancelRequested(f"cancel-{self.now:.3f}", task_id, self.now, "sim"))
        elif kind == "failover" and self.core is not None:
            self._failover()
        elif kind == "migrate" and self.core is not None:
            self._migrate(agent.node_id)
        elif kind in ("duplicate", "impostor"):
            self._start_duplicate(agent, impostor=kind == "impostor")

    def _start_duplicate(self, primary: _Agent, *, impostor: bool) -> None:
        """A second process under ``primary``'s node id, on a store of its own.

        ``impostor``: it claims the primary's public incarnation id without its
        secret. It runs the agent's rules like any process (Hello, heartbeats,
        self-fence) until the operator stops it.
        """
        self._stores += 1
        extra = _Agent(
            primary.node_id,
            incarnation_no=1000 + self._stores,
            store_id=f"{primary.node_id}/dup{self._stores}",
            impostor_of=primary.incarnation if impostor else "",
            acked_through_s=self.now,
        )
        self.extras.append(extra)
        self._connect(extra)
        self._at(
            self.now + self.rng.uniform(0.0, 0.5),
            partial(self._heartbeat, extra, extra.incarnation_no),
        )
        self._at(
            self.now + self.rng.uniform(2.0, 12.0),
            lambda: self._crash(extra, close=True) if extra.alive else None,
        )

    def _migrate(self, target: str) -> None:
        """An operator moves a random owned task to ``target`` (or anywhere, or stale)."""
        core = self.core
        if core is None:
            return
        owned = [t for t in core.snapshot().tasks if t.state.owned]
        if not owned:
            return
        task = self.rng.choice(owned)
        roll = self.rng.random()
        self._feed(
            MigrateRequested(
                f"migrate-{self.now:.3f}",
                task.task_id,
                self.now,
                target_node_id="" if roll < 0.2 else target,
                expected_epoch=task.epoch - 1 if roll > 0.9 else task.epoch,
                reason="sim",
                release_timeout_s=self.rng.uniform(0.5, 3.0),
            )
        )

    def _heal_all(self) -> None:
        self.healing = True
        for extra in self.extras:
            if extra.alive:  # the operator stops the second process
                self._crash(extra, close=True)
        for agent in self.agents.values():
            agent.partitioned_until = min(agent.partitioned_until, self.now)
            if not agent.alive:
                self._restart(agent)
            elif not agent.stream:
                self._reconnect_soon(agent)
        for delay in (0.0, 4.0, 8.0, 12.0):  # the operator retries while there is no leader
            self._at(self.now + delay, self._uncordon_all)

    def _uncordon_all(self) -> None:
        if self.core is None:
            return
        for view in self.core.snapshot().nodes:
            if view.record.cordoned:
                node_id = view.record.node_id
                self._feed(UncordonRequested(f"heal-{node_id}-{self.now:.3f}", node_id, self.now))

    # ------------------------------------------------------------------
    # Streams: in order, late across a partition, lost only when broken.
    # ------------------------------------------------------------------

    def _transmit(self, agent: _Agent, session: str, up: bool, action: Callable[[], None]) -> None:
        """Carry one message on a Session stream, as gRPC over TCP does: FIFO per direction."""
        key = (session, up)
        when = max(self.now + self._latency(), self._fifo.get(key, 0.0))
        self._fifo[key] = when
        self._at(when, partial(self._arrive, agent, session, up, action))

    def _arrive(self, agent: _Agent, session: str, up: bool, action: Callable[[], None]) -> None:
        if (session, up) in self._broken:
            return
        if self._partitioned(agent):
            # Buffered until the partition heals; rescheduling keeps the order.
            self._at(agent.partitioned_until, partial(self._arrive, agent, session, up, action))
            return
        action()

    def _break(self, session: str) -> None:
        self._broken.add((session, True))
        self._broken.add((session, False))

    # ------------------------------------------------------------------
    # Node agents.
    # ------------------------------------------------------------------

    def _partitioned(self, agent: _Agent) -> bool:
        return self.now < agent.partitioned_until

    def _partition(self, agent: _Agent, length_s: float) -> None:
        agent.partitioned_until = max(agent.partitioned_until, self.now + length_s)
        self._at(agent.partitioned_until, partial(self._heal, agent))

    def _heal(self, agent: _Agent) -> None:
        if agent.alive and not self._partitioned(agent) and not agent.stream:
            self._reconnect_soon(agent)

    def _send_up(self, agent: _Agent, make: Callable[[str], Event]) -> None:
        """Send a message on the agent's Session, if it has a welcomed one."""
        if not agent.alive or not agent.welcomed or not agent.stream:
            return
        event = make(agent.stream)
        self._transmit(agent, agent.stream, True, partial(self._feed_restamped, event))

    def _feed_restamped(self, event: Event) -> None:
        self._feed(_restamp(event, self.now))

    def _reconnect_soon(self, agent: _Agent) -> None:
        if not agent.connecting:
            agent.connecting = True
            self._at(self.now + self.rng.uniform(0.05, 0.5), partial(self._connect, agent))

    def _connect(self, agent: _Agent) -> None:
        agent.connecting = False
        if not agent.alive or agent.stream:
            return
        if self._partitioned(agent) or self.core is None:
            agent.connecting = True
            self._at(self.now + self.rng.uniform(0.2, 0.6), partial(self._connect, agent))
            return
        self._session_counter += 1
        session = f"s{self._session_counter}"
        agent.stream = session
        agent.welcomed = False
        agent.seq = 0
        agent.sent_at = {}
        held = tuple(
            HeldTask(task_id, h.epoch, h.status, checkpoint_seq=h.progress)
            for task_id, h in sorted(agent.tasks.items())
        )
        hello = SessionOpened(
            session,
            agent.node_id,
            agent.incarnation,
            self.now,
            capacity_slots=4,
            held_tasks=held,
            incarnation_secret_sha256=agent.secret_sha256,
            store_id=agent.store_id,
            store_previous_incarnation=agent.previous_incarnation,
        )
        self._transmit(agent, session, True, partial(self._feed_restamped, hello))

    def _lost(self, agent: _Agent, session_id: str) -> None:
        """The agent learns its Session ``session_id`` ended."""
        if agent.stream != session_id:
            return
        if self._partitioned(agent):
            self._at(agent.partitioned_until, partial(self._lost, agent, session_id))
            return
        agent.stream = ""
        agent.welcomed = False
        if agent.alive:
            self._reconnect_soon(agent)

    def _close_from_agent(self, agent: _Agent, reason: str) -> None:
        """The agent closes its own stream (after fencing): the leader hears it in order."""
        stream = agent.stream
        if not stream:
            return
        event = SessionClosed(stream, agent.node_id, self.now, reason)
        self._transmit(agent, stream, True, partial(self._feed_restamped, event))
        self._broken.add((stream, False))
        agent.stream = ""
        agent.welcomed = False

    def _crash(self, agent: _Agent, *, close: bool) -> None:
        if close:
            self._close_from_agent(agent, "crash")  # the kernel sends RST
        elif agent.stream:
            self._break(agent.stream)  # power loss: nothing more on this stream
        agent.alive = False
        agent.stream = ""
        agent.welcomed = False
        agent.connecting = False
        for held in agent.tasks.values():
            if held.status is HeldTaskStatus.RUNNING:
                held.status = HeldTaskStatus.PAUSED
            held.token += 1

    def _restart(self, agent: _Agent) -> None:
        """Start the node's process again: usually on its store (the lock names the
        crashed incarnation: proof it stopped), sometimes on a fresh volume."""
        if agent.alive:
            return
        agent.alive = True
        if self.config.duplicates and self.rng.random() < 0.25:
            self._stores += 1
            agent.store_id = f"{agent.node_id}/store{self._stores}"
            agent.previous_incarnation = ""
            agent.tasks = {}
        else:
            agent.previous_incarnation = agent.incarnation
        agent.incarnation_no += 1
        agent.acked_through_s = self.now
        self._connect(agent)
        self._at(
            self.now + self.rng.uniform(0.0, 0.5),
            partial(self._heartbeat, agent, agent.incarnation_no),
        )

    def _heartbeat(self, agent: _Agent, incarnation_no: int) -> None:
        if not agent.alive or agent.incarnation_no != incarnation_no:
            return
        sent = self.now
        interval = self.settings.heartbeat_interval_s
        self._at(
            sent + interval + self.rng.uniform(0.0, self.config.heartbeat_jitter_s),
            partial(self._heartbeat, agent, incarnation_no),
        )
        fence_at = sent + self.settings.fence_after_s
        self._at(fence_at, partial(self._fence_check, agent, incarnation_no, sent))
        if not agent.welcomed:
            return
        agent.seq += 1
        seq = agent.seq
        agent.sent_at[seq] = sent
        progress = tuple(
            TaskProgress(task_id, h.epoch)
            for task_id, h in sorted(agent.tasks.items())
            if h.status in (HeldTaskStatus.RUNNING, HeldTaskStatus.PAUSED)
        )
        self._send_up(
            agent,
            lambda session: HeartbeatReceived(session, agent.node_id, seq, sent, tasks=progress),
        )

    def _fence_check(self, agent: _Agent, incarnation_no: int, sent: float) -> None:
        """Self-fencing: no ack for the heartbeat sent at ``sent`` -> pause everything."""
        if not agent.alive or agent.incarnation_no != incarnation_no:
            return
        if agent.acked_through_s >= sent:
            return
        if agent.fenced_at is None:
            agent.fenced_at = self.now
        running = [h for h in agent.tasks.values() if h.status is HeldTaskStatus.RUNNING]
        for held in running:
            held.status = HeldTaskStatus.PAUSED
            held.token += 1
        if agent.stream:  # re-register: the leader re-attaches what it still owns
            self._close_from_agent(agent, "fenced")
            self._reconnect_soon(agent)

    def _process_for(self, node_id: str, session_id: str) -> _Agent | None:
        """The process whose stream ``session_id`` is (else the node's primary process)."""
        for agent in self.extras:
            if agent.node_id == node_id and agent.stream == session_id:
                return agent
        return self.agents.get(node_id)

    def _deliver(self, command: SendDirective) -> None:
        agent = self._process_for(command.node_id, command.session_id)
        if agent is not None:
            self._transmit(agent, command.session_id, False, partial(self._receive, agent, command))

    def _receive(self, agent: _Agent, command: SendDirective) -> None:
        if not agent.alive or agent.stream != command.session_id:
            return
        directive = command.directive
        if isinstance(directive, HeartbeatAck):
            sent = agent.sent_at.get(directive.seq)
            if sent is not None:
                agent.acked_through_s = max(agent.acked_through_s, sent)
        elif isinstance(directive, Assign):
            self._on_assign(agent, directive)
        elif isinstance(directive, Revoke):
            held = agent.tasks.get(directive.task_id)
            if held is not None and held.epoch <= directive.epoch:
                del agent.tasks[directive.task_id]
        elif isinstance(directive, Release):
            held = agent.tasks.get(directive.task_id)
            if held is not None and held.epoch == directive.epoch:
                del agent.tasks[directive.task_id]
                ckpt = self._checkpoint(directive.task_id, held, agent)
                self._update(
                    agent, directive.task_id, held.epoch, Released(directive.move_id, ckpt)
                )
        elif isinstance(directive, TaskUpdateAck):
            held = agent.tasks.get(directive.task_id)
            done = held is not None and held.status is HeldTaskStatus.COMPLETED
            if done and directive.outcome in (UpdateOutcome.ACCEPTED, UpdateOutcome.DUPLICATE):
                del agent.tasks[directive.task_id]
        elif isinstance(directive, Welcome) and not agent.welcomed:
            agent.welcomed = True
            agent.fenced_at = None
            agent.acked_through_s = max(agent.acked_through_s, self.now)
            for task_id, held in sorted(agent.tasks.items()):
                if held.status is HeldTaskStatus.COMPLETED:
                    self._update(agent, task_id, held.epoch, Completed(_result(task_id)))

    def _on_assign(self, agent: _Agent, assign: Assign) -> None:
        held = agent.tasks.get(assign.task_id)
        if held is not None and held.epoch > assign.epoch:
            return
        # A self-fenced agent takes the task but keeps it paused: the directive may be
        # stale (buffered while it was cut off); its next Hello settles it.
        fenced = agent.fenced_at is not None
        if held is not None and held.epoch == assign.epoch:
            if held.status is not HeldTaskStatus.PAUSED or fenced:
                return
            self._check_two_owners(assign.task_id, agent, assign.epoch)
            held.status = HeldTaskStatus.RUNNING
        else:
            stored = self.redis.get(assign.task_id, (0, 0, ""))[1]
            resume = assign.resume_from.seq if assign.resume_from is not None else 0
            if resume > stored:
                self._fail(f"{assign.task_id} resumes from seq {resume}, Redis has {stored}")
            status = HeldTaskStatus.PAUSED if fenced else HeldTaskStatus.RUNNING
            held = _Held(assign.epoch, status, stored)
            agent.tasks[assign.task_id] = held
            if fenced:
                return
            self._check_two_owners(assign.task_id, agent, assign.epoch)
            self._update(agent, assign.task_id, assign.epoch, Started(assign.resume_from))
        held.token += 1
        self._at(
            self.now + self.rng.uniform(0.2, 0.8),
            partial(self._work, agent, assign.task_id, held.token),
        )

    def _work(self, agent: _Agent, task_id: str, token: int) -> None:
        held = agent.tasks.get(task_id)
        if not agent.alive or held is None or held.token != token:
            return
        if held.status is not HeldTaskStatus.RUNNING:
            return
        held.progress += 1
        units = self.work_units.get(_request_of(task_id), 3)
        if held.progress >= units:
            held.status = HeldTaskStatus.COMPLETED
            held.token += 1
            self._update(agent, task_id, held.epoch, Completed(_result(task_id)))
            return
        ckpt = self._checkpoint(task_id, held, agent)
        self._update(agent, task_id, held.epoch, Checkpointed(ckpt, held.progress, held.progress))
        self._at(self.now + self.rng.uniform(0.2, 0.8), partial(self._work, agent, task_id, token))

    def _checkpoint(self, task_id: str, held: _Held, agent: _Agent) -> CheckpointSummary:
        stored_epoch, _, owner = self.redis.get(task_id, (0, 0, ""))
        # The Lua script's fence: an older epoch, or an equal one of another owner, is STALE.
        replicated = held.epoch > stored_epoch or (
            held.epoch == stored_epoch and owner in ("", agent.incarnation)
        )
        if replicated:
            self.redis[task_id] = (held.epoch, held.progress, agent.incarnation)
        return CheckpointSummary(
            f"{task_id}@{held.progress}", held.epoch, held.progress, held.progress, replicated
        )

    def _update(self, agent: _Agent, task_id: str, epoch: int, change: TaskChange) -> None:
        agent.update_seq += 1
        update_seq = agent.update_seq
        self._send_up(
            agent,
            lambda session: TaskUpdateReceived(
                session, agent.node_id, update_seq, task_id, epoch, change, self.now
            ),
        )


def _restamp(event: Event, now_s: float) -> Event:
    """The event as observed on arrival (``now_s`` is the leader's clock at receipt)."""
    return replace(event, now_s=now_s)


def _request_of(task_id: str) -> str:
    return f"req-{task_id[1:]}"


def _result(task_id: str) -> TaskResult:
    payload = task_id.encode()
    return TaskResult(payload=payload, size_bytes=len(payload))
