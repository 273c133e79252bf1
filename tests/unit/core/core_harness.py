"""A hand-driven harness around CoordinatorCore on a simulated clock, and a transcript renderer.

Tests call ``Harness`` methods (``hello``, ``heartbeat``, ``run_until``...) in
place of a real shell; every step is checked with ``check_invariants`` (the
settings enable ``self_check``). ``render`` prints events and commands
compactly (non-default fields only) for the stored scenario transcripts.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable, Sequence
from random import Random
from typing import Any, TypeVar

from coordinator.core import (
    CloseSession,
    Command,
    CoordinatorCore,
    CoreSettings,
    EmitEvent,
    Event,
    HeartbeatReceived,
    HeldTask,
    LeadershipAcquired,
    NodeRecord,
    PersistNodes,
    PersistTasks,
    SendDirective,
    SessionClosed,
    SessionOpened,
    StatusCode,
    TaskChange,
    TaskProgress,
    TaskRecord,
    TaskSpec,
    TaskSubmitted,
    TaskUpdateReceived,
    Tick,
)
from coordinator.core.records import Labels

T = TypeVar("T")


class Harness:
    """Drive one CoordinatorCore by hand; the clock only moves when told to."""

    def __init__(
        self, settings: CoreSettings | None = None, *, seed: int = 0, now_s: float = 0.0
    ) -> None:
        self.settings = settings if settings is not None else CoreSettings(self_check=True)
        self.core = CoordinatorCore(self.settings, rng=Random(seed))
        self.now = now_s
        self.sessions: dict[str, str] = {}
        self.incarnations: dict[str, int] = {}
        self.seq: dict[str, int] = {}
        self.update_seq = 0
        self.log: list[tuple[Event, list[Command]]] = []
        self.after_step: Callable[[list[Command]], object] | None = None  # checks, per step
        self._session_counter = 0

    # -- raw ---------------------------------------------------------------

    def step(self, event: Event) -> list[Command]:
        commands = self.core.step(event)
        self.log.append((event, commands))
        if self.after_step is not None:
            self.after_step(commands)
        return commands

    def at(self, now_s: float) -> Harness:
        assert now_s >= self.now
        self.now = now_s
        return self

    # -- leadership ----------------------------------------------------------

    def lead(
        self,
        term: int = 1,
        nodes: Sequence[NodeRecord] = (),
        tasks: Sequence[TaskRecord] = (),
    ) -> list[Command]:
        return self.step(LeadershipAcquired(term, self.now, tuple(nodes), tuple(tasks)))

    # -- node agents ---------------------------------------------------------

    def hello(
        self,
        node_id: str,
        *,
        new_incarnation: bool = False,
        slots: int = 4,
        labels: Labels = (),
        kinds: tuple[str, ...] = (),
        held: Sequence[HeldTask] = (),
        hello_seq: int = 0,
    ) -> list[Command]:
        before = (
            self.incarnations.get(node_id),
            self.sessions.get(node_id),
            self.seq.get(node_id),
        )
        if new_incarnation or node_id not in self.incarnations:
            self.incarnations[node_id] = self.incarnations.get(node_id, 0) + 1
        self._session_counter += 1
        session = f"{node_id}/s{self._session_counter}"
        self.sessions[node_id] = session
        self.seq[node_id] = 0
        incarnation = f"{node_id}#{self.incarnations[node_id]}"
        commands = self.step(
            SessionOpened(
                session,
                node_id,
                incarnation,
                self.now,
                capacity_slots=slots,
                labels=labels,
                kinds=kinds,
                held_tasks=tuple(held),
                hello_seq=hello_seq,
            )
        )
        refused = any(
            isinstance(c, CloseSession)
            and c.session_id == session
            and c.code is StatusCode.FAILED_PRECONDITION
            for c in commands
        )
        if refused and before[1] is not None:
            # Another live process holds the node id (DESIGN.md §4): the refused
            # process changes nothing; the holder's Session goes on.
            incarnation_no, old_session, old_seq = before
            self.incarnations[node_id] = incarnation_no or 0
            self.sessions[node_id] = old_session
            self.seq[node_id] = old_seq or 0
        return commands

    def heartbeat(
        self, node_id: str, tasks: Sequence[TaskProgress] = (), *, seq: int | None = None
    ) -> list[Command]:
        self.seq[node_id] = self.seq[node_id] + 1 if seq is None else seq
        return self.step(
            HeartbeatReceived(
                self.sessions[node_id], node_id, self.seq[node_id], self.now, tasks=tuple(tasks)
            )
        )

    def close(self, node_id: str) -> list[Command]:
        return self.step(SessionClosed(self.sessions[node_id], node_id, self.now))

    def update(self, node_id: str, task_id: str, epoch: int, change: TaskChange) -> list[Command]:
        self.update_seq += 1
        return self.step(
            TaskUpdateReceived(
                self.sessions[node_id], node_id, self.update_seq, task_id, epoch, change, self.now
            )
        )

    def tick(self) -> list[Command]:
        return self.step(Tick(self.now))

    def run_until(
        self,
        until_s: float,
        *,
        heartbeating: Iterable[str] = (),
        cadence_s: float | None = None,
    ) -> list[Command]:
        """Tick every ``cadence_s`` up to ``until_s``; the listed nodes heartbeat every interval."""
        cadence = cadence_s if cadence_s is not None else self.settings.tick_interval_s
        interval = self.settings.heartbeat_interval_s
        nodes = sorted(heartbeating)
        out: list[Command] = []
        next_hb = self.now + interval
        t = self.now
        while t + cadence <= until_s + 1e-9:
            t = round(t + cadence, 9)
            while nodes and next_hb <= t + 1e-9:
                self.at(max(self.now, next_hb))
                for node in nodes:
                    out += self.heartbeat(node)
                next_hb = round(next_hb + interval, 9)
            self.at(t)
            out += self.tick()
        return out

    # -- orchestrator ----------------------------------------------------------

    def submit(self, request_id: str, task_id: str = "", **spec: Any) -> list[Command]:
        spec.setdefault("kind", "work")
        return self.step(TaskSubmitted(request_id, TaskSpec(**spec), self.now, task_id=task_id))

    def task(self, task_id: str) -> TaskRecord:
        task = self.core.task(task_id)
        assert task is not None, task_id
        return task


# -- filters ----------------------------------------------------------------------


def of_type(items: Iterable[object], kind: type[T]) -> list[T]:
    return [x for x in items if isinstance(x, kind)]


def directives(commands: Iterable[Command], kind: type[T]) -> list[T]:
    return [
        c.directive
        for c in commands
        if isinstance(c, SendDirective) and isinstance(c.directive, kind)
    ]  # type: ignore[misc]


def sent(commands: Iterable[Command], kind: type[T]) -> list[tuple[str, T]]:
    return [
        (c.node_id, c.directive)  # type: ignore[misc]
        for c in commands
        if isinstance(c, SendDirective) and isinstance(c.directive, kind)
    ]


def notices_of(commands: Iterable[Command], kind: type[T]) -> list[T]:
    return [c.body for c in commands if isinstance(c, EmitEvent) and isinstance(c.body, kind)]  # type: ignore[misc]


def persisted_tasks(commands: Iterable[Command]) -> list[TaskRecord]:
    return [r for c in commands if isinstance(c, PersistTasks) for r in c.records]


def persisted_nodes(commands: Iterable[Command]) -> list[NodeRecord]:
    return [r for c in commands if isinstance(c, PersistNodes) for r in c.records]


# -- rendering ----------------------------------------------------------------------


def render(value: object) -> str:
    """A compact, stable text form: dataclasses with non-default fields only."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        parts = []
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if f.default is not dataclasses.MISSING and v == f.default:
                continue
            if f.default_factory is not dataclasses.MISSING and v == f.default_factory():
                continue
            parts.append(f"{f.name}={render(v)}")
        return f"{type(value).__name__}({', '.join(parts)})"
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, tuple | list):
        inner = ", ".join(render(v) for v in value)
        if isinstance(value, list):
            return f"[{inner}]"
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return repr(value)
