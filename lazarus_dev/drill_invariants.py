"""The drills' safety invariants, judged from the tasks' own side effects (pure).

The drill workload (``node_agent.demo_app``, kind ``drill``) appends one JSON
line per side effect to a sink the drill owns (one file per process), before
the step's work and outside Lazarus's own bookkeeping:

``{"t": wall s, "pid": int, "node": str, "task": str, "epoch": int, "ev": EV, "step": int}``

where ``ev`` is ``start`` (the handler began; ``step`` is where it resumes),
``step`` (about to do item ``step``), ``ckpt`` (a replicated checkpoint
covering every item below ``step`` was acknowledged) or ``done`` (the
handler is about to return its result: a completion executed).

:func:`check` reads those records and reports every violation of:

* **one owner** — no task has ``step`` records from two processes at one epoch;
* **epochs rise** — per task, the epochs of ``start`` records never go down in time;
* **no stale step** — no ``step`` of an older epoch after the first ``step``
  of a newer one;
* **one execution** — each task's completion is executed once (``dup exec``);
* **acknowledged progress kept** — every ``start`` resumes at or after the
  newest checkpoint acknowledged before it (at any earlier or equal epoch).

No IO, no clock: the caller reads the files (``read_sink``) and passes records.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

__all__ = [
    "EffectRecord",
    "InvariantReport",
    "Pause",
    "Violation",
    "ViolationKind",
    "check",
    "parse_records",
    "pauses",
    "read_sink",
]


class ViolationKind(Enum):
    """Which invariant a violation breaks."""

    TWO_OWNERS = "two processes ran one task at one epoch"
    EPOCH_REGRESSED = "a task started at a lower epoch after a higher one"
    STALE_STEP = "a step of an older epoch after the first step of a newer one"
    DUPLICATE_EXECUTION = "a completion executed more than once"
    PROGRESS_LOST = "a task resumed before its newest acknowledged checkpoint"


@dataclass(frozen=True, slots=True)
class EffectRecord:
    """One side-effect line (see the module docstring)."""

    t: float
    pid: int
    node: str
    task: str
    epoch: int
    ev: str
    step: int

    @property
    def process(self) -> tuple[str, int]:
        """(node id, pid): one OS process of one agent."""
        return (self.node, self.pid)


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant: which, on which task, and the evidence."""

    kind: ViolationKind
    task: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind.name} {self.task}: {self.detail}"


@dataclass(frozen=True, slots=True)
class InvariantReport:
    """What :func:`check` found.

    Attributes:
        tasks: tasks with at least one record.
        records: records read.
        executions: completions executed per task (``done`` records).
        dup_exec: completions executed beyond the first, summed over tasks.
        violations: every broken invariant (empty: all held).
    """

    tasks: int
    records: int
    executions: Mapping[str, int] = field(default_factory=dict)
    dup_exec: int = 0
    violations: tuple[Violation, ...] = ()

    @property
    def held(self) -> bool:
        """True when no invariant was broken."""
        return not self.violations

    def counts(self) -> dict[str, int]:
        """Violations per ``ViolationKind`` name (every kind present, 0 when none)."""
        out = {k.name: 0 for k in ViolationKind}
        for v in self.violations:
            out[v.kind.name] += 1
        return out


_EVENTS = frozenset({"start", "step", "ckpt", "done"})


def parse_records(lines: Iterable[str]) -> list[EffectRecord]:
    """Records of JSON lines; blank, torn (a process killed mid-write) or foreign lines skipped.

    Args:
        lines: the sink's lines.

    Returns:
        The well-formed records, in input order.
    """
    out = []
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            raw = json.loads(line)
            rec = EffectRecord(
                t=float(raw["t"]),
                pid=int(raw["pid"]),
                node=str(raw["node"]),
                task=str(raw["task"]),
                epoch=int(raw["epoch"]),
                ev=str(raw["ev"]),
                step=int(raw.get("step", 0)),
            )
        except (ValueError, KeyError, TypeError):
            continue
        if rec.ev in _EVENTS:
            out.append(rec)
    return out


def read_sink(sink_dir: Path, tasks: Iterable[str] | None = None) -> list[EffectRecord]:
    """Every record in ``<sink_dir>/*.jsonl`` (the one IO helper; the checker stays pure).

    Args:
        sink_dir: the drill's sink directory.
        tasks: keep only these task ids (None: all).

    Returns:
        The records of every file, unsorted.
    """
    keep = set(tasks) if tasks is not None else None
    out: list[EffectRecord] = []
    for path in sorted(Path(sink_dir).glob("*.jsonl")):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        out.extend(r for r in parse_records(text.splitlines()) if keep is None or r.task in keep)
    return out


def _order(r: EffectRecord) -> tuple[float, int]:
    # Within one process, equal timestamps keep the order of the events' meaning.
    return (r.t, ("start", "step", "ckpt", "done").index(r.ev))


def check(records: Iterable[EffectRecord], *, max_violations_per_kind: int = 50) -> InvariantReport:
    """Judge every invariant of the module docstring over ``records``.

    Args:
        records: side-effect records of any number of tasks, in any order.
        max_violations_per_kind: keep at most this many violations of each kind
            per task (the evidence stays readable; the verdict is unchanged).

    Returns:
        The report; ``held`` is False when any invariant broke.
    """
    by_task: dict[str, list[EffectRecord]] = {}
    n = 0
    for r in records:
        by_task.setdefault(r.task, []).append(r)
        n += 1
    violations: list[Violation] = []
    executions: dict[str, int] = {}
    for task, recs in sorted(by_task.items()):
        recs.sort(key=_order)
        found: list[Violation] = []
        found += _one_owner(task, recs)
        found += _epochs_rise(task, recs)
        found += _no_stale_step(task, recs)
        found += _progress_kept(task, recs)
        done = sum(1 for r in recs if r.ev == "done")
        executions[task] = done
        if done > 1:
            who = sorted({f"{r.node}/pid {r.pid} epoch {r.epoch}" for r in recs if r.ev == "done"})
            found.append(
                Violation(
                    ViolationKind.DUPLICATE_EXECUTION,
                    task,
                    f"{done} completions by {', '.join(who)}",
                )
            )
        per_kind: dict[ViolationKind, int] = {}
        for v in found:
            per_kind[v.kind] = per_kind.get(v.kind, 0) + 1
            if per_kind[v.kind] <= max_violations_per_kind:
                violations.append(v)
    return InvariantReport(
        tasks=len(by_task),
        records=n,
        executions=executions,
        dup_exec=sum(max(0, c - 1) for c in executions.values()),
        violations=tuple(violations),
    )


PAUSE_SLACK_S = 1.0
"""A gap between two steps of a task over its median step plus this is a pause."""


@dataclass(frozen=True, slots=True)
class Pause:
    """A task stood still between two of its steps (issue 20's measure of a paused task).

    Attributes:
        task: the task.
        at: wall time of the last step before the gap.
        gap_s: seconds until its next step (in any process, at any epoch).
        step_s: the task's median step-to-step time, for scale.
    """

    task: str
    at: float
    gap_s: float
    step_s: float


def pauses(records: Iterable[EffectRecord], *, slack_s: float = PAUSE_SLACK_S) -> list[Pause]:
    """Every gap in a task's steps longer than its median step plus ``slack_s``.

    Only the stretch between a task's first and last ``step`` counts (waiting
    for a slot before it starts is not a pause); a gap spanning a move to
    another process counts, as the task stood still for it either way. This
    is not an invariant (a node SIGKILLed pauses its tasks until they move):
    a drill whose fault must not pause anything (a leader crash under fan-in)
    reports it.

    Returns:
        The pauses, longest first.
    """
    by_task: dict[str, list[float]] = {}
    for r in records:
        if r.ev == "step":
            by_task.setdefault(r.task, []).append(r.t)
    found: list[Pause] = []
    for task, times in by_task.items():
        times.sort()
        gaps = [b - a for a, b in itertools.pairwise(times)]
        if not gaps:
            continue
        step_s = sorted(gaps)[len(gaps) // 2]
        found += [
            Pause(task, times[i], gap, step_s)
            for i, gap in enumerate(gaps)
            if gap > step_s + slack_s
        ]
    return sorted(found, key=lambda p: -p.gap_s)


def _one_owner(task: str, recs: list[EffectRecord]) -> list[Violation]:
    spans: dict[int, dict[tuple[str, int], list[float]]] = {}
    for r in recs:
        if r.ev == "step":
            span = spans.setdefault(r.epoch, {}).setdefault(r.process, [r.t, r.t])
            span[1] = r.t
    out = []
    for epoch, procs in sorted(spans.items()):
        if len(procs) > 1:
            ordered = sorted(procs.items(), key=lambda kv: kv[1][0])
            overlap = any(b[1][0] <= a[1][1] for a, b in itertools.pairwise(ordered))
            who = ", ".join(
                f"{node}/pid {pid} t={first:.3f}..{last:.3f}"
                for (node, pid), (first, last) in ordered
            )
            when = "at the same time" if overlap else "one after the other"
            out.append(Violation(ViolationKind.TWO_OWNERS, task, f"epoch {epoch} ({when}): {who}"))
    return out


def _epochs_rise(task: str, recs: list[EffectRecord]) -> list[Violation]:
    out = []
    high: EffectRecord | None = None
    for r in recs:
        if r.ev != "start":
            continue
        if high is not None and r.epoch < high.epoch:
            out.append(
                Violation(
                    ViolationKind.EPOCH_REGRESSED,
                    task,
                    f"start at epoch {r.epoch} ({r.node}/pid {r.pid}, t={r.t:.3f}) after "
                    f"epoch {high.epoch} ({high.node}/pid {high.pid}, t={high.t:.3f})",
                )
            )
        if high is None or r.epoch > high.epoch:
            high = r
    return out


def _no_stale_step(task: str, recs: list[EffectRecord]) -> list[Violation]:
    first: dict[int, EffectRecord] = {}
    for r in recs:
        if r.ev == "step":
            first.setdefault(r.epoch, r)
    out = []
    for r in recs:
        if r.ev != "step":
            continue
        newer = [f for e, f in first.items() if e > r.epoch and f.t < r.t]
        if newer:
            f = min(newer, key=lambda x: x.t)
            out.append(
                Violation(
                    ViolationKind.STALE_STEP,
                    task,
                    f"step {r.step} at epoch {r.epoch} ({r.node}/pid {r.pid}, t={r.t:.3f}) after "
                    f"epoch {f.epoch} began ({f.node}/pid {f.pid}, t={f.t:.3f})",
                )
            )
    return out


def _progress_kept(task: str, recs: list[EffectRecord]) -> list[Violation]:
    out = []
    acked: EffectRecord | None = None
    for r in recs:
        if r.ev == "ckpt" and (acked is None or r.step > acked.step):
            acked = r
        elif r.ev == "start" and acked is not None and r.step < acked.step:
            out.append(
                Violation(
                    ViolationKind.PROGRESS_LOST,
                    task,
                    f"epoch {r.epoch} ({r.node}/pid {r.pid}) resumed at step {r.step}, but a "
                    f"checkpoint at step {acked.step} (epoch {acked.epoch}, {acked.node}) was "
                    f"acknowledged at t={acked.t:.3f}",
                )
            )
    return out


def effect_line(*, t: float, pid: int, node: str, task: str, epoch: int, ev: str, step: int) -> str:
    """One sink line (what the workload writes), newline included."""
    body: dict[str, Any] = {
        "t": round(t, 6),
        "pid": pid,
        "node": node,
        "task": task,
        "epoch": epoch,
        "ev": ev,
        "step": step,
    }
    return json.dumps(body, separators=(",", ":")) + "\n"
