"""Load validation: which records a new leader loads, and which it quarantines.

Theory of operation: a new leader reads every node and task record from etcd
and feeds them to the core in ``LeadershipAcquired``. One record that does
not parse used to be dropped silently (its task lost), and one that parses
but breaks a rule of the core (an empty id, two tasks with one request id)
raised inside the leader's loop while its lease stayed held — for every
leader in turn. :func:`screen_loaded` decides, purely, which records are
fit; the shell moves the others under ``/lazarus/<cluster>/quarantine/``,
counts and reports them (``RecordQuarantined`` events, GetClusterStatus), and
the leader goes on leading with the rest.

Rules, in order (the first that applies names the reason):

- the value does not parse (the shell passes the parse error as a string);
- an empty id, or a record stored under a name that is not its id;
- a node record whose cordon disagrees with its state (DRAINING iff cordoned,
  for live nodes);
- a task that breaks ``check_task_shape`` (owner / epoch / attempt rules);
- a task whose request id an earlier task (by id order) already uses.

Records are visited in name order, so the choice of which duplicate survives
never depends on hash order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from coordinator.core.errors import InvariantViolation
from coordinator.core.records import NodeRecord, NodeState, TaskRecord
from coordinator.core.tasks import check_task_shape

__all__ = ["NODES", "TASKS", "Quarantine", "Screened", "screen_loaded"]

NODES = "nodes"
TASKS = "tasks"


@dataclass(frozen=True, slots=True)
class Quarantine:
    """One record to move aside.

    Attributes:
        collection: ``"nodes"`` or ``"tasks"``.
        name: the record's name in its collection (the etcd key's last part).
        reason: the rule it breaks.
    """

    collection: str
    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class Screened:
    """What a new leader loads and what it quarantines.

    Attributes:
        nodes: the fit node records, by id.
        tasks: the fit task records, by id.
        quarantined: the others, nodes first, each in name order.
    """

    nodes: tuple[NodeRecord, ...]
    tasks: tuple[TaskRecord, ...]
    quarantined: tuple[Quarantine, ...]


_LIVE = frozenset({NodeState.ALIVE, NodeState.SUSPECT, NodeState.DRAINING})


def _node_problem(name: str, record: NodeRecord) -> str:
    if not record.node_id:
        return "empty node_id"
    if record.node_id != name:
        return f"stored under {name!r} but its node_id is {record.node_id!r}"
    if not record.incarnation and record.state is not NodeState.DEAD:
        return "empty incarnation"
    if record.state in (NodeState.ALIVE, NodeState.DRAINING) and (
        (record.state is NodeState.DRAINING) != record.cordoned
    ):
        return f"state {record.state.name} disagrees with cordoned={record.cordoned}"
    return ""


def _task_problem(name: str, record: TaskRecord) -> str:
    if not record.task_id:
        return "empty task_id"
    if record.task_id != name:
        return f"stored under {name!r} but its task_id is {record.task_id!r}"
    try:
        check_task_shape(record)
    except InvariantViolation as exc:
        return str(exc)
    return ""


def screen_loaded(
    nodes: Mapping[str, NodeRecord | str], tasks: Mapping[str, TaskRecord | str]
) -> Screened:
    """Split loaded records into the fit ones and the ones to quarantine.

    Args:
        nodes: node records by etcd name; a ``str`` value is the reason the
            shell could not parse that value.
        tasks: task records by etcd name, likewise.

    Returns:
        The fit records (feed them in ``LeadershipAcquired``; the core never
        raises on them) and the quarantined ones with reasons.
    """
    quarantined: list[Quarantine] = []
    fit_nodes: list[NodeRecord] = []
    seen_nodes: set[str] = set()
    for name in sorted(nodes):
        value = nodes[name]
        if isinstance(value, str):
            problem = f"does not parse: {value}"
        else:
            problem = _node_problem(name, value)
            if not problem and value.node_id in seen_nodes:
                problem = f"duplicate node {value.node_id!r}"
        if problem:
            quarantined.append(Quarantine(NODES, name, problem))
            continue
        node = cast(NodeRecord, value)
        seen_nodes.add(node.node_id)
        fit_nodes.append(node)
    fit_tasks: list[TaskRecord] = []
    seen_ids: set[str] = set()
    requests: dict[str, str] = {}
    for name in sorted(tasks):
        task = tasks[name]
        if isinstance(task, str):
            problem = f"does not parse: {task}"
        else:
            problem = _task_problem(name, task)
            if not problem and task.task_id in seen_ids:
                problem = f"duplicate task {task.task_id!r}"
            if not problem and task.request_id in requests:
                problem = (
                    f"duplicate request id {task.request_id!r} "
                    f"(task {requests[task.request_id]!r} has it)"
                )
        if problem:
            quarantined.append(Quarantine(TASKS, name, problem))
            continue
        record = cast(TaskRecord, task)
        seen_ids.add(record.task_id)
        requests[record.request_id] = record.task_id
        fit_tasks.append(record)
    return Screened(tuple(fit_nodes), tuple(fit_tasks), tuple(quarantined))
