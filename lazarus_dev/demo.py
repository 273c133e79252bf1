"""``lazarus demo checkpoint``: the checkpoint store under real crashes.

Runs ``node_agent.demo_worker`` as a child process, SIGKILLs it mid-run,
reopens the store in this process to show what was recovered, restarts the
worker (a new incarnation, epoch + 1) and finally checks every task's result
against a direct computation.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from rich.console import Console

    from node_agent.demo_worker import Restored

DurabilityChoice = Literal["sync", "group", "none"]

WORKER_STALL_TIMEOUT_S = 60.0
"""Longest the worker may go without reporting anything before the demo fails, seconds."""


# --------------------------------------------------------------- the worker child


@dataclass
class _Reports:
    """What one worker process reported on stdout, per task (see demo_worker's protocol)."""

    pid: int = 0
    resumed_at: dict[str, int] = field(default_factory=dict)
    epoch: dict[str, int] = field(default_factory=dict)
    begun: dict[str, int] = field(default_factory=dict)
    acked_item: dict[str, int] = field(default_factory=dict)
    acked_checkpoint: dict[str, tuple[str, int]] = field(default_factory=dict)
    done: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    finished: bool = False

    def progress(self) -> int:
        """Items the worker holds as done, over every task (resumed + acknowledged)."""
        tasks = self.resumed_at.keys() | self.acked_item.keys()
        return sum(max(self.resumed_at.get(t, 0), self.acked_item.get(t, 0)) for t in tasks)


class _Worker:
    """A ``python -m node_agent.demo_worker worker`` child and threads reading its output."""

    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "node_agent.demo_worker", "worker", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.reports = _Reports(pid=self.proc.pid)
        self.stderr: list[str] = []
        self._changed = threading.Condition()
        self._eof = False
        assert self.proc.stdout is not None
        assert self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._read_stdout, args=(self.proc.stdout,), daemon=True),
            threading.Thread(target=self._read_stderr, args=(self.proc.stderr,), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read_stdout(self, stream: IO[str]) -> None:
        for line in stream:
            if not line.endswith("\n"):
                break  # a torn last line cannot happen with SIGKILL, but never trust it
            kind, *pairs = line.split()
            fields = dict(p.split("=", 1) for p in pairs if "=" in p)
            with self._changed:
                self._note(kind, fields)
                self._changed.notify_all()
        with self._changed:
            self._eof = True
            self._changed.notify_all()

    def _note(self, kind: str, f: dict[str, str]) -> None:
        r, task = self.reports, f.get("task", "")
        if kind == "resume":
            r.resumed_at[task] = int(f["at"])
            r.epoch[task] = int(f["epoch"])
        elif kind == "begin":
            r.begun[task] = int(f["i"])
        elif kind == "item":
            r.acked_item[task] = int(f["i"])
        elif kind == "checkpoint":
            r.acked_checkpoint[task] = (f["ref"], int(f["covers"]))
        elif kind == "done":
            r.done[task] = int(f["items"])
        elif kind == "error":
            r.errors.append(f"{task}: {f.get('message', '?')}")
        elif kind == "finished":
            r.finished = True

    def _read_stderr(self, stream: IO[str]) -> None:
        for line in stream:
            self.stderr.append(line.rstrip("\n"))

    def wait_until(self, reached: Callable[[_Reports], bool], timeout_s: float) -> bool:
        """Wait until ``reached(reports)``; False when the worker's output ended or time ran out."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not reached(self.reports):
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    return False
                self._changed.wait(left)
            return True

    def wait_for_progress(self, items: int, stall_timeout_s: float) -> bool:
        """Wait until the worker holds ``items`` items as done, over all tasks.

        Returns False when its output ended first, or it reported no progress for
        ``stall_timeout_s`` seconds.
        """
        with self._changed:
            last, deadline = -1, 0.0
            while (progress := self.reports.progress()) < items:
                if progress != last:
                    last, deadline = progress, time.monotonic() + stall_timeout_s
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    return False
                self._changed.wait(left)
            return True

    def sigkill(self) -> int:
        """SIGKILL the worker, read what it wrote before dying; return its exit status."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        return self.wait(10.0)

    def wait(self, timeout_s: float) -> int:
        """Wait for the worker to exit and its output to be read; return its exit status."""
        try:
            status = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            status = self.proc.wait()
        for reader in self._readers:
            reader.join(10.0)
        return status

    def stop(self) -> None:
        """Make sure the child is gone (on any exit path of the demo)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# --------------------------------------------------------------- the demo command


@dataclass
class _Verdict:
    """Failed checks of the demo, in the order met."""

    failures: list[str] = field(default_factory=list)

    def check(self, ok: bool, failure: str) -> bool:
        if not ok:
            self.failures.append(failure)
        return ok


def _fmt(n: int) -> str:
    return f"{n:,}"


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _start_worker(
    console: Console,
    worker_args: list[str],
    expected_at: dict[str, int],
    verdict: _Verdict,
    label: str,
) -> _Worker:
    """Start a worker and check it resumed every task where the parent's recovery said."""
    worker = _Worker(worker_args)
    tasks = sorted(expected_at)
    worker.wait_until(lambda r: len(r.resumed_at) == len(tasks), WORKER_STALL_TIMEOUT_S)
    got = dict(worker.reports.resumed_at)
    epochs = sorted(set(worker.reports.epoch.values()))
    console.print(
        f"{label}: worker pid [bold]{worker.proc.pid}[/] started "
        f"(epoch {', '.join(map(str, epochs)) or '?'}), resumed "
        + ", ".join(f"{t} at item {_fmt(got[t])}" if t in got else f"{t} ?" for t in tasks)
    )
    verdict.check(
        all(got.get(t) == expected_at[t] for t in tasks),
        f"{label}: worker resumed at {got}, the recovery said {expected_at}",
    )
    return worker


def _kill_report(
    console: Console, worker: _Worker, status: int, tasks: list[str], total: int
) -> None:
    """Print the kill and what the worker had reported (acknowledged) before it died."""
    from rich import box
    from rich.table import Table

    r = worker.reports
    console.print(
        f"  [bold red]SIGKILL[/] (signal {int(signal.SIGKILL)}) → pid {worker.proc.pid}, "
        f"exit status {status}, after {_fmt(r.progress())} of {_fmt(total)} items were "
        "acknowledged.\n"
    )
    table = Table(
        title="What the worker had reported when it was killed",
        box=box.SIMPLE_HEAD,
        title_justify="left",
    )
    table.add_column("task")
    table.add_column("acked item", justify="right")
    table.add_column("in flight", justify="right")
    table.add_column("acked checkpoint")
    table.add_column("covers seq", justify="right")
    for task in tasks:
        acked = r.acked_item.get(task, r.resumed_at.get(task, 0))
        begun = r.begun.get(task, 0)
        ref, covers = r.acked_checkpoint.get(task, ("-", 0))
        table.add_row(task, _fmt(acked), _fmt(begun) if begun > acked else "-", ref, _fmt(covers))
    console.print(table)


def _recovery_report(
    console: Console, data_dir: Path, tasks: list[str], worker: _Worker, verdict: _Verdict
) -> dict[str, int]:
    """Reopen the store after a kill, print what each task recovers to; return item per task."""
    from rich import box
    from rich.table import Table

    from node_agent.checkpoint import CheckpointStore, parse_ref
    from node_agent.demo_worker import ReplayMismatch, restore

    reports = worker.reports
    restored: dict[str, Restored] = {}
    with CheckpointStore(data_dir, durability="sync") as store:
        for task in tasks:
            try:
                restored[task] = restore(task, store.recover(task))
            except ReplayMismatch as exc:
                verdict.check(False, f"recovery of {task}: {exc}")
        report = store.verify()
    table = Table(
        title="Recovered: newest checkpoint + journal replay (store reopened here)",
        box=box.SIMPLE_HEAD,
        title_justify="left",
    )
    for name in ("task", "epoch", "checkpoint", "covers", "replayed", "at item", "acked"):
        table.add_column(name, justify="left" if name in ("task", "checkpoint") else "right")
    table.add_column("redone", justify="right")
    lost_total = replayed_total = redone_total = 0
    for task in tasks:
        r = restored.get(task)
        if r is None:
            table.add_row(task, "", "[red]unrecoverable[/]")
            continue
        acked = reports.acked_item.get(task, reports.resumed_at.get(task, 0))
        lost = max(0, acked - r.state.done)
        redone = max(0, reports.begun.get(task, 0) - r.state.done)
        lost_total += lost
        replayed_total += r.replayed
        redone_total += redone
        acked_cp = reports.acked_checkpoint.get(task)
        if acked_cp is not None:
            newest = parse_ref(r.checkpoint_ref)[1] if r.checkpoint_ref else 0
            verdict.check(
                newest >= parse_ref(acked_cp[0])[1],
                f"{task}: acknowledged checkpoint {acked_cp[0]} missing after the kill",
            )
        verdict.check(lost == 0, f"{task}: {lost} acknowledged items lost")
        table.add_row(
            task,
            str(reports.epoch.get(task, "?")),
            r.checkpoint_ref or "(none)",
            _fmt(r.covers_journal_seq),
            _fmt(r.replayed),
            _fmt(r.state.done),
            _fmt(acked),
            str(redone),
        )
    console.print(table)
    console.print(
        f"  The journal replay restored [bold]{_fmt(replayed_total)}[/] items done after the "
        f"newest checkpoints (each digest re-checked), so they are not worked again; "
        f"[bold]{redone_total}[/] redone (in flight at the kill, never acknowledged); "
        f"[bold]{lost_total}[/] acknowledged items lost."
    )
    corrupt = len(report.corrupt_refs) + len(report.corrupt_events)
    verdict.check(report.ok, f"verify(): {corrupt} corrupt records")
    console.print(
        f"  verify(): {_fmt(report.checkpoints)} checkpoints and {_fmt(report.events)} journal "
        f"events checked, [bold]{corrupt}[/] corrupt.\n"
    )
    return {t: r.state.done for t, r in restored.items()}


def _final_report(
    console: Console, data_dir: Path, tasks: list[str], items: int, verdict: _Verdict
) -> None:
    """Compare every task's final stored state with a direct computation; print the table."""
    from rich import box
    from rich.table import Table

    from node_agent.checkpoint import CheckpointStore, JsonCodec
    from node_agent.demo_worker import TaskState, direct_state

    table = Table(
        title=f"Final state of each task vs. a direct computation of {_fmt(items)} items",
        box=box.SIMPLE_HEAD,
        title_justify="left",
    )
    for name in ("task", "items", "digest", "direct", "sum", "direct", "journal", "result"):
        table.add_column(name, justify="right" if name in ("items", "sum", "direct") else "left")
    with CheckpointStore(data_dir, durability="sync") as store:
        for task in tasks:
            want = direct_state(task, items)
            latest = store.load_latest(task)
            got = None if latest is None else TaskState.from_payload(latest.payload)
            seen = [int(JsonCodec.decode(e.payload)["i"]) for e in store.replay(task)]
            once = seen == list(range(1, items + 1))
            ok = (
                got is not None
                and latest is not None
                and latest.info.terminal
                and got == want
                and once
            )
            verdict.check(ok, f"{task}: final state differs from the direct computation")
            table.add_row(
                task,
                _fmt(got.done) if got else "-",
                got.digest[:8] if got else "-",
                want.digest[:8],
                _fmt(got.total) if got else "-",
                _fmt(want.total),
                "once" if once else f"{_fmt(len(seen))} events",
                "[bold green]PASS[/]" if ok else "[bold red]FAIL[/]",
            )
    console.print(table)
    console.print(
        "  journal once: the task's journal holds items 1..M, each exactly once "
        "(none lost, none applied twice).\n"
    )


def run_checkpoint_demo(
    data_dir: Path | None,
    tasks: int,
    items: int,
    every: int,
    durability: DurabilityChoice,
    kills: int,
    seed: int | None,
    work_ms: float,
) -> int:
    """Run the demo, printing as it goes; see ``lazarus demo checkpoint --help``.

    Returns:
        The exit status: 0 when every check held, 1 when one failed, 2 when
        ``data_dir`` already holds a checkpoint store.
    """
    from rich.console import Console

    from node_agent.checkpoint import DB_FILENAME
    from node_agent.demo_worker import task_ids

    console = Console(highlight=False)
    if seed is None:
        seed = random.SystemRandom().randrange(1_000_000)
    rng = random.Random(seed)
    where = "given"
    if data_dir is None:
        data_dir = Path(tempfile.mkdtemp(prefix="lazarus-demo-"))
        where = "a fresh temp dir, kept for inspection"
    elif (data_dir / DB_FILENAME).exists():
        console.print(
            f"[red]{data_dir} already holds a checkpoint store; give an empty directory.",
            soft_wrap=True,
        )
        return 2
    data_dir.mkdir(parents=True, exist_ok=True)
    names = task_ids(tasks)
    total = tasks * items
    worker_args = [
        f"--data-dir={data_dir}",
        f"--tasks={tasks}",
        f"--items={items}",
        f"--every={every}",
        f"--durability={durability}",
        f"--work-ms={work_ms}",
    ]
    console.print(
        f"[bold]Lazarus checkpoint store demo[/]: {tasks} tasks × {_fmt(items)} items, "
        f"checkpoint every {every} items, durability {durability}, {_count(kills, 'SIGKILL')}, "
        f"seed {seed}\n  data dir: {data_dir} ({where})\n"
        f"  Each item: ~{work_ms} ms of work, a SHA-256 step, a journal append; "
        "the worker prints an item only after its append returned (acknowledged).\n"
    )
    started = time.monotonic()
    verdict = _Verdict()
    expected_at = dict.fromkeys(names, 0)
    kills_done = 0
    worker: _Worker | None = None
    try:
        for round_no in range(1, kills + 1):
            target = int(total * (round_no - 1 + rng.uniform(0.3, 0.9)) / (kills + 1))
            label = f"Run {round_no}"
            worker = _start_worker(console, worker_args, expected_at, verdict, label)
            console.print(
                f"  it will be killed once {_fmt(target)} of {_fmt(total)} items are acknowledged"
            )
            if not worker.wait_for_progress(target, WORKER_STALL_TIMEOUT_S):
                status = worker.wait(10.0)
                verdict.check(False, f"{label}: worker ended (status {status}) before the kill")
                console.print("[red]  the worker ended before the kill point:[/]")
                for line in worker.stderr[-20:]:
                    console.print(f"    {line}", markup=False)
                break
            status = worker.sigkill()
            kills_done += 1
            _kill_report(console, worker, status, names, total)
            expected_at = _recovery_report(console, data_dir, names, worker, verdict)
            worker = None
            if verdict.failures:
                break
        if not verdict.failures:
            worker = _start_worker(console, worker_args, expected_at, verdict, "Final run")
            worker.wait_for_progress(total, WORKER_STALL_TIMEOUT_S)
            status = worker.wait(WORKER_STALL_TIMEOUT_S)
            ok = verdict.check(
                status == 0 and worker.reports.finished,
                f"final run: worker exit status {status}; {'; '.join(worker.reports.errors)}",
            )
            if ok:
                console.print(f"  the worker finished every task, exit status {status}\n")
            else:
                for line in worker.stderr[-20:]:
                    console.print(f"    {line}", markup=False)
            worker = None
            _final_report(console, data_dir, names, items, verdict)
    finally:
        if worker is not None:
            worker.stop()
    elapsed_s = time.monotonic() - started
    if verdict.failures:
        console.print(f"[bold red]FAIL[/] after {elapsed_s:.1f} s (seed {seed}):")
        for failure in verdict.failures:
            console.print(f"  - {failure}", markup=False)
        return 1
    console.print(
        f"[bold green]PASS[/]: {_count(tasks, 'task')} survived "
        f"{_count(kills_done, 'SIGKILL')}; no acknowledged item lost; every final state "
        f"equals the direct computation. {elapsed_s:.1f} s."
    )
    return 0
