"""Hypothesis properties of CoordinatorCore (issue 3 acceptance).

A rule-based state machine feeds the core arbitrary interleavings of Hellos
(with made-up held tasks), heartbeats (with stale task progress), closed
streams, Goodbyes, submissions (repeated request ids), task updates at the
current, an older or a never-assigned epoch, cancels, drains, the passage of
time, and leader changes that reload only what was persisted. After every
step it checks:

- at most one owner per task per epoch, across every record ever persisted;
- epochs strictly increase: persisted epochs never go down, and every new
  Assign carries a higher epoch than the one before it;
- an update older than the task's epoch is refused (STALE_EPOCH and a Revoke)
  and changes nothing;
- no task leaves the table unaccounted: the table holds exactly the accepted
  tasks, each in one state;
- placement never picks a DEAD, SUSPECT, DRAINING or LEFT node (nor a
  cordoned or disconnected one);
- every command list puts persists before sends, and ``check_invariants``.

A second property: the mass-failure guard stops redistribution when more
than half the nodes die together, and lets it happen otherwise.
"""

from __future__ import annotations

from random import Random

from core_harness import Harness, directives, notices_of, persisted_nodes, persisted_tasks, sent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from coordinator.core import (
    Assign,
    AssignReason,
    CancelRequested,
    Checkpointed,
    CheckpointSummary,
    Command,
    Completed,
    CoreSettings,
    DrainRequested,
    Failed,
    GoodbyeReceived,
    HeldTask,
    HeldTaskStatus,
    NodeRecord,
    NodeState,
    Released,
    ReplyToRequest,
    Revoke,
    Started,
    TaskChange,
    TaskError,
    TaskErrorCode,
    TaskProgress,
    TaskRecord,
    TaskResult,
    TaskUpdateAck,
    UncordonRequested,
    UpdateOutcome,
    as_labels,
    check_command_order,
)
from coordinator.core import notices as n

NODES = st.sampled_from(["a", "b", "c", "d"])
TASK_IDS = [f"t{i}" for i in range(8)]
TASKS = st.sampled_from(TASK_IDS)


class CoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.settings = CoreSettings(self_check=True, default_max_attempts=3)
        self.term = 1
        self.h = Harness(self.settings)
        self.etcd_nodes: dict[str, NodeRecord] = {}
        self.etcd_tasks: dict[str, TaskRecord] = {}
        self.accepted: set[str] = set()
        self.epoch_owner: dict[tuple[str, int], str] = {}
        self.assigned_epoch: dict[str, int] = {}
        self.h.after_step = self.apply  # every step's list is checked as it happens
        self.h.lead(term=self.term)

    # -- the checks every command list goes through ---------------------------------

    def apply(self, commands: list[Command]) -> list[Command]:
        check_command_order(commands)
        for task in persisted_tasks(commands):
            old = self.etcd_tasks.get(task.task_id)
            assert old is None or task.epoch >= old.epoch, (old, task)
            if task.state.owned:
                owner = self.epoch_owner.setdefault((task.task_id, task.epoch), task.owner_node_id)
                assert owner == task.owner_node_id, f"two owners of {task.task_id}@{task.epoch}"
            self.etcd_tasks[task.task_id] = task
        for node in persisted_nodes(commands):
            self.etcd_nodes[node.node_id] = node
        for node_id, assign in sent(commands, Assign):
            record = self.etcd_tasks[assign.task_id]
            assert (record.epoch, record.owner_node_id) == (assign.epoch, node_id)
            if assign.reason is AssignReason.REATTACH:
                continue
            assert assign.epoch > self.assigned_epoch.get(assign.task_id, 0)
            self.assigned_epoch[assign.task_id] = assign.epoch
            view = self.h.core.node(node_id)
            assert view is not None
            assert view.record.state is NodeState.ALIVE, view.record.state
            assert not view.record.cordoned
            assert view.connected
        for reply in commands:
            if isinstance(reply, ReplyToRequest) and reply.created:
                self.accepted.add(reply.task_id)
        return commands

    # -- rules --------------------------------------------------------------------------

    @rule(
        node=NODES,
        new_incarnation=st.booleans(),
        slots=st.integers(1, 3),
        zone=st.sampled_from(["x", "y"]),
        held=st.lists(
            st.tuples(TASKS, st.integers(0, 4), st.sampled_from(list(HeldTaskStatus))), max_size=3
        ),
    )
    def hello(
        self,
        node: str,
        new_incarnation: bool,
        slots: int,
        zone: str,
        held: list[tuple[str, int, HeldTaskStatus]],
    ) -> None:
        tasks = [HeldTask(t, e, s) for t, e, s in held]
        labels = as_labels({"zone": zone})
        self.h.hello(node, new_incarnation=new_incarnation, slots=slots, labels=labels, held=tasks)

    @rule(
        node=NODES,
        progress=st.lists(st.tuples(TASKS, st.integers(0, 4)), max_size=3),
        own=st.booleans(),
    )
    def heartbeat(self, node: str, progress: list[tuple[str, int]], own: bool) -> None:
        if node not in self.h.sessions:
            return
        tasks = [TaskProgress(t, e) for t, e in progress]
        if own:  # what it really runs, most of the time
            tasks = [
                TaskProgress(t.task_id, t.epoch)
                for t in self.h.core.snapshot().tasks
                if t.owner_node_id == node
            ]
        self.h.heartbeat(node, tasks)

    @rule(node=NODES)
    def close_stream(self, node: str) -> None:
        if node in self.h.sessions:
            commands = self.h.close(node)
            view = self.h.core.node(node)
            assert view is not None
            assert not view.connected
            if notices_of(commands, n.NodeSuspected):
                assert view.record.state is NodeState.SUSPECT

    @rule(node=NODES)
    def goodbye(self, node: str) -> None:
        if node in self.h.sessions:
            self.h.step(GoodbyeReceived(self.h.sessions[node], node, self.h.now))

    @rule(dt=st.floats(0.05, 4.0), beating=st.sets(NODES))
    def advance(self, dt: float, beating: set[str]) -> None:
        alive = sorted(beating & set(self.h.sessions))
        self.h.run_until(self.h.now + dt, heartbeating=alive)

    @rule(i=st.integers(0, 7), zone=st.sampled_from(["", "x"]), slots=st.integers(0, 2))
    def submit(self, i: int, zone: str, slots: int) -> None:
        selector = as_labels({"zone": zone} if zone else {})
        self.h.submit(f"req-{i}", task_id=TASK_IDS[i], node_selector=selector, slots=slots)

    @rule(
        node=NODES,
        task_id=TASKS,
        change=st.sampled_from(["started", "checkpointed", "completed", "failed", "released"]),
        epoch_delta=st.integers(-2, 1),
    )
    def update(self, node: str, task_id: str, change: str, epoch_delta: int) -> None:
        if node not in self.h.sessions:
            return
        before = self.h.core.task(task_id)
        current = before.epoch if before is not None else 0
        epoch = max(0, current + epoch_delta)
        changes: dict[str, TaskChange] = {
            "started": Started(),
            "checkpointed": Checkpointed(
                CheckpointSummary(f"{task_id}@1", epoch, 1, replicated=True)
            ),
            "completed": Completed(TaskResult(b"r")),
            "failed": Failed(TaskError(TaskErrorCode.HANDLER_ERROR, "x", retryable=True)),
            "released": Released(),
        }
        view = self.h.core.node(node)
        on_session = view is not None and view.session_id == self.h.sessions[node]
        commands = self.h.update(node, task_id, epoch, changes[change])
        if before is not None and on_session and 1 <= epoch < before.epoch:
            # An older epoch never changes anything: STALE_EPOCH, then a Revoke.
            assert self.h.core.task(task_id) == before
            assert [t for t in persisted_tasks(commands) if t.task_id == task_id] == []
            acks = directives(commands, TaskUpdateAck)
            assert [a.outcome for a in acks] == [UpdateOutcome.STALE_EPOCH]
            assert [(r.task_id, r.epoch) for r in directives(commands, Revoke)] == [
                (task_id, epoch)
            ]

    @rule(task_id=TASKS)
    def cancel(self, task_id: str) -> None:
        self.h.step(CancelRequested(f"cancel-{task_id}", task_id, self.h.now))

    @rule(node=NODES, drain=st.booleans())
    def cordon(self, node: str, drain: bool) -> None:
        event = (
            DrainRequested(f"drain-{node}", node, self.h.now, release_timeout_s=1.0)
            if drain
            else UncordonRequested(f"uncordon-{node}", node, self.h.now)
        )
        self.h.step(event)

    @precondition(lambda self: self.term < 4)
    @rule()
    def new_leader(self) -> None:
        """The leader dies; the next one knows only what was persisted."""
        self.term += 1
        now = self.h.now
        self.h = Harness(self.settings, seed=self.term, now_s=now)
        self.h.after_step = self.apply
        self.h.lead(
            term=self.term,
            nodes=[self.etcd_nodes[k] for k in sorted(self.etcd_nodes)],
            tasks=[self.etcd_tasks[k] for k in sorted(self.etcd_tasks)],
        )

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def every_accepted_task_is_accounted_for(self) -> None:
        snapshot = self.h.core.snapshot()
        assert {t.task_id for t in snapshot.tasks} == self.accepted
        assert sum(snapshot.tasks_by_state().values()) == len(self.accepted)
        self.h.core.check_invariants()


TestCoreMachine = CoreMachine.TestCase
TestCoreMachine.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# -- the mass-failure guard ------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    total=st.integers(3, 9),
    data=st.data(),
    seed=st.integers(0, 2**16),
)
def test_the_guard_stops_redistribution_when_more_than_half_die_together(
    total: int, data: st.DataObject, seed: int
) -> None:
    killed_count = data.draw(st.integers(1, total), label="killed")
    rng = Random(seed)
    h = Harness(CoreSettings(self_check=True), seed=seed)
    h.lead()
    nodes = [f"n{i}" for i in range(total)]
    for node in nodes:
        h.hello(node, slots=total * 2)
    for i in range(total * 2):
        h.submit(f"r{i}", task_id=f"t{i:02d}")
    killed = set(rng.sample(nodes, killed_count))
    owned_before = {t.task_id: t for t in h.core.snapshot().tasks if t.owner_node_id in killed}
    # Everyone heartbeats (out of phase) until 5 s; the killed ones stop within 0.4 s of each other.
    stop = {node: 5.0 + rng.uniform(0.0, 0.4) if node in killed else 99.0 for node in nodes}
    next_hb = {node: rng.uniform(0.0, 0.5) for node in nodes}
    commands: list[Command] = []
    t = 0.0
    while t < 12.0:
        t = round(t + 0.1, 9)
        for node in nodes:
            while next_hb[node] <= t:
                if next_hb[node] < stop[node]:
                    h.at(max(h.now, next_hb[node]))
                    commands += h.heartbeat(node)
                next_hb[node] += 0.5
        h.at(t)
        commands += h.tick()
    dead = {d.node_id for d in notices_of(commands, n.NodeDead)}
    assert dead == killed
    tasks = {t.task_id: t for t in h.core.snapshot().tasks}
    guard_notices = notices_of(commands, n.MassFailureGuardChanged)
    if killed_count / total > 0.5:
        assert [g.active for g in guard_notices] == [True]
        assert h.core.guard_active
        # Nothing moved: every task of a dead node is still its own, at the same epoch.
        for task_id, before in owned_before.items():
            assert (tasks[task_id].owner_node_id, tasks[task_id].epoch) == (
                before.owner_node_id,
                before.epoch,
            )
        assert notices_of(commands, n.TaskReassigned) == []
        # They come back (paused by self-fencing): same epochs, and the guard lets go.
        back: list[Command] = []
        for node in sorted(killed):
            held = [
                HeldTask(tid, b.epoch, HeldTaskStatus.PAUSED)
                for tid, b in owned_before.items()
                if b.owner_node_id == node
            ]
            back += h.hello(node, held=held)
        back += h.at(12.1).tick()
        assert not h.core.guard_active
        assert {(a.task_id, a.reason) for a in directives(back, Assign)} == {
            (tid, AssignReason.REATTACH) for tid in owned_before
        }
    else:
        assert guard_notices == []
        for task_id in owned_before:
            assert tasks[task_id].owner_node_id not in killed
            assert tasks[task_id].epoch == owned_before[task_id].epoch + 1
