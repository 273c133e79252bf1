"""A real workload for ``lazarus demo checkpoint``: hash chains that survive SIGKILL.

Theory of operation
-------------------
Demo task ``demo-k`` walks items 1..M of a deterministic input. Item ``i`` is the
text ``item-i``; the task's state after item ``i`` is::

    digest_0 = sha256(task_id)
    digest_i = sha256(digest_{i-1} || b"item-i")
    total_i  = total_{i-1} + digest_i[0]          (a running sum of first bytes)

so ``direct_state(task_id, M)`` recomputes a task's final state in a plain loop,
with no store, and a run can be checked against it.

Per item the worker first does the item's *work* — a short sleep standing in for
the slow call a real agent makes (a model, a tool) whose result must not be
lost — then appends a journal event ``{"i": i, "digest": hex}``, and only after
``append`` returned reports the item on stdout. Every K items it saves a
checkpoint whose JSON state covers that item's journal seq; the task's last
item gets a terminal checkpoint.

After a crash, ``resume`` takes ``store.recover(task_id)`` — the newest valid
checkpoint and the journal events after it — starts from the checkpoint's state,
re-applies each event (checking its digest against a recomputation: one hash,
not the item's work) and continues with the next item. Only the item in flight
at the crash, whose event was never appended, is worked again.

Each start of the worker is a new incarnation: per task it writes with the
stored epoch + 1, as a new owner would, so a zombie of the previous incarnation
could not write any more (``StaleEpoch``).

Output protocol
---------------
``python -m node_agent.demo_worker worker ...`` prints one flushed line per fact,
``<kind> key=value ...``, which ``lazarus demo checkpoint`` parses:

* ``ready pid=P tasks=N items=M every=K durability=D``
* ``resume task=T epoch=E checkpoint=REF|- covers=S replayed=R at=I`` — restored
  to item I (R journal events re-applied after checkpoint REF covering seq S)
* ``begin task=T i=I`` — the item's work starts
* ``item task=T i=I seq=S`` — its journal event S is durable (acknowledged)
* ``checkpoint task=T ref=REF covers=S i=I terminal=0|1`` — saved (acknowledged)
* ``done task=T items=M digest=HEX total=N``
* ``finished``; on an error ``error task=T message=...`` and exit status 1.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node_agent.checkpoint import (
    Checkpoint,
    CheckpointStore,
    Durability,
    JsonCodec,
    Recovery,
)

DEFAULT_TASKS = 3
DEFAULT_ITEMS = 4000
DEFAULT_EVERY = 250
DEFAULT_WORK_MS = 1.0

Report = Callable[[str, dict[str, object]], None]
"""Where the worker reports facts: ``report(kind, fields)``."""


class ReplayMismatch(Exception):
    """A journal event or checkpoint disagrees with the recomputed hash chain.

    Attributes:
        task_id: the task whose recovery failed.
        problem: what disagreed, with the item index.
    """

    def __init__(self, task_id: str, problem: str) -> None:
        self.task_id = task_id
        self.problem = problem
        super().__init__(f"{task_id}: {problem}")


def task_ids(tasks: int) -> list[str]:
    """Return the demo's task ids, ``["demo-1", ..., "demo-<tasks>"]``."""
    return [f"demo-{k}" for k in range(1, tasks + 1)]


def item_digest(prev_hex: str, i: int) -> str:
    """Return ``sha256(digest_{i-1} || b"item-i")`` as hex (``prev_hex`` is digest_{i-1})."""
    return hashlib.sha256(bytes.fromhex(prev_hex) + f"item-{i}".encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class TaskState:
    """A demo task's state after ``done`` items.

    Attributes:
        task_id: the task.
        done: items folded in (the next item is ``done + 1``).
        digest: hex digest_done of the hash chain.
        total: running sum of the first byte of every digest so far.
        journal_seq: journal seq of the newest event folded in (0 = none).
    """

    task_id: str
    done: int
    digest: str
    total: int
    journal_seq: int

    @classmethod
    def initial(cls, task_id: str) -> TaskState:
        """Return the state before item 1."""
        return cls(task_id, 0, hashlib.sha256(task_id.encode()).hexdigest(), 0, 0)

    def apply(self, i: int, digest: str, journal_seq: int) -> TaskState:
        """Return the state after item ``i`` whose digest is ``digest``.

        Raises:
            ReplayMismatch: ``i`` is not the next item, or ``digest`` is not the
                chain's digest of item ``i``.
        """
        if i != self.done + 1:
            raise ReplayMismatch(self.task_id, f"item {i} follows item {self.done}")
        expected = item_digest(self.digest, i)
        if digest != expected:
            raise ReplayMismatch(
                self.task_id, f"item {i}: journal digest {digest[:16]}, recomputed {expected[:16]}"
            )
        return TaskState(self.task_id, i, digest, self.total + int(digest[:2], 16), journal_seq)

    def to_payload(self) -> bytes:
        """Return the state as canonical JSON bytes (``JsonCodec``)."""
        return JsonCodec.encode(
            {
                "task_id": self.task_id,
                "done": self.done,
                "digest": self.digest,
                "total": self.total,
                "journal_seq": self.journal_seq,
            }
        )

    @classmethod
    def from_payload(cls, payload: bytes) -> TaskState:
        """Return the state encoded by ``to_payload``.

        Raises:
            InvalidArgument: ``payload`` is not JSON (from ``JsonCodec``).
            KeyError, TypeError: not a demo state.
        """
        doc: dict[str, Any] = JsonCodec.decode(payload)
        return cls(
            str(doc["task_id"]),
            int(doc["done"]),
            str(doc["digest"]),
            int(doc["total"]),
            int(doc["journal_seq"]),
        )


def direct_state(task_id: str, items: int) -> TaskState:
    """Return a task's state after ``items`` items, computed in a plain loop (no store).

    ``journal_seq`` is ``items``: in a run that journals every item exactly once,
    item i is journal seq i.
    """
    digest = hashlib.sha256(task_id.encode()).digest()
    total = 0
    for i in range(1, items + 1):
        digest = hashlib.sha256(digest + f"item-{i}".encode()).digest()
        total += digest[0]
    return TaskState(task_id, items, digest.hex(), total, items)


@dataclass(frozen=True, slots=True)
class Restored:
    """A task's state rebuilt from ``store.recover``.

    Attributes:
        state: the checkpoint's state with every later journal event re-applied.
        checkpoint_ref: the newest valid checkpoint's ref, or "" when there is none.
        covers_journal_seq: the journal seq that checkpoint covers (0 = none).
        checkpoint_done: items folded into the checkpoint's state.
        replayed: journal events re-applied after the checkpoint.
        terminal: the checkpoint is terminal and covers every event (the task is done).
    """

    state: TaskState
    checkpoint_ref: str
    covers_journal_seq: int
    checkpoint_done: int
    replayed: int
    terminal: bool


def restore(task_id: str, recovery: Recovery) -> Restored:
    """Rebuild a task's state: the checkpoint's state, then the journal events after it.

    Args:
        task_id: the task.
        recovery: ``store.recover(task_id)``.

    Returns:
        The rebuilt state and where it came from.

    Raises:
        ReplayMismatch: the checkpoint belongs to another task or its covered seq
            disagrees with its state, or a replayed event's digest disagrees with
            the recomputed chain.
    """
    cp = recovery.checkpoint
    state = TaskState.initial(task_id) if cp is None else TaskState.from_payload(cp.payload)
    if state.task_id != task_id:
        raise ReplayMismatch(task_id, f"checkpoint holds the state of {state.task_id!r}")
    if cp is not None and state.journal_seq != cp.covers_journal_seq:
        raise ReplayMismatch(
            task_id,
            f"checkpoint {cp.ref} covers seq {cp.covers_journal_seq}, "
            f"its state seq {state.journal_seq}",
        )
    start = state
    for event in recovery.events:
        doc = JsonCodec.decode(event.payload)
        state = state.apply(int(doc["i"]), str(doc["digest"]), event.seq)
    return Restored(
        state=state,
        checkpoint_ref="" if cp is None else cp.ref,
        covers_journal_seq=0 if cp is None else cp.covers_journal_seq,
        checkpoint_done=start.done,
        replayed=len(recovery.events),
        terminal=cp is not None and cp.info.terminal and not recovery.events,
    )


def resume(
    store: CheckpointStore,
    task_id: str,
    *,
    items: int = DEFAULT_ITEMS,
    every: int = DEFAULT_EVERY,
    epoch: int = 1,
    work_ms: float = DEFAULT_WORK_MS,
    report: Report | None = None,
) -> TaskState:
    """Recover a task from the store and run it to its last item.

    Takes ``store.recover(task_id)``, rebuilds the state (``restore``), then per
    remaining item: work, ``append`` its event, and every ``every`` items ``save``
    a checkpoint covering it; the last item's checkpoint is terminal.

    Args:
        store: the worker's open checkpoint store.
        task_id: the task.
        items: the task's item count M.
        every: items between checkpoints K (>= 1).
        epoch: the epoch this incarnation writes with.
        work_ms: the simulated work per item, milliseconds.
        report: where to report each fact (see the module's output protocol).

    Returns:
        The task's final state.

    Raises:
        ReplayMismatch: recovery found a chain that does not recompute.
        CheckpointStoreError: from the store (e.g. ``StaleEpoch`` when a newer
            incarnation owns the task).
    """
    emit: Report = report or (lambda kind, fields: None)
    restored = restore(task_id, store.recover(task_id))
    state = restored.state
    emit(
        "resume",
        {
            "task": task_id,
            "epoch": epoch,
            "checkpoint": restored.checkpoint_ref or "-",
            "covers": restored.covers_journal_seq,
            "replayed": restored.replayed,
            "at": state.done,
        },
    )
    terminal_saved = restored.terminal
    for i in range(state.done + 1, items + 1):
        emit("begin", {"task": task_id, "i": i})
        if work_ms > 0:
            time.sleep(work_ms / 1000.0)
        digest = item_digest(state.digest, i)
        event = JsonCodec.encode({"i": i, "digest": digest})
        seq = store.append(task_id, event, epoch=epoch)
        state = state.apply(i, digest, seq)
        emit("item", {"task": task_id, "i": i, "seq": seq})
        if i % every == 0 or i == items:
            terminal_saved = _save(store, state, epoch, i == items, emit)
    if not terminal_saved:  # the crash fell after the last item's append, before its save
        _save(store, state, epoch, True, emit)
    emit(
        "done", {"task": task_id, "items": state.done, "digest": state.digest, "total": state.total}
    )
    return state


def _save(
    store: CheckpointStore, state: TaskState, epoch: int, terminal: bool, emit: Report
) -> bool:
    label = f"item {state.done}" + (" (final)" if terminal else "")
    out = store.save(
        Checkpoint(
            state.task_id,
            epoch,
            state.to_payload(),
            covers_journal_seq=state.journal_seq,
            terminal=terminal,
            label=label,
        )
    )
    emit(
        "checkpoint",
        {
            "task": state.task_id,
            "ref": out.ref,
            "covers": out.covers_journal_seq,
            "i": state.done,
            "terminal": int(terminal),
        },
    )
    return terminal


class _LineReporter:
    """Writes protocol lines to stdout, one flushed write per line, from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __call__(self, kind: str, fields: dict[str, object]) -> None:
        text = " ".join([kind, *(f"{k}={v}" for k, v in fields.items())]) + "\n"
        with self._lock:
            sys.stdout.write(text)
            sys.stdout.flush()


def run_worker(
    data_dir: Path,
    *,
    tasks: int = DEFAULT_TASKS,
    items: int = DEFAULT_ITEMS,
    every: int = DEFAULT_EVERY,
    durability: Durability = Durability.GROUP,
    work_ms: float = DEFAULT_WORK_MS,
    report: Report | None = None,
) -> int:
    """Run every demo task to its end, one thread per task, resuming what the store holds.

    Returns:
        0 when every task finished, 1 when one failed (reported as ``error``).
    """
    emit: Report = report or _LineReporter()
    errors: list[BaseException] = []
    with CheckpointStore(data_dir, durability=durability) as store:
        heads = {h.task_id: h for h in store.task_heads()}
        emit(
            "ready",
            {
                "pid": os.getpid(),
                "tasks": tasks,
                "items": items,
                "every": every,
                "durability": durability.value,
            },
        )

        def work(task_id: str) -> None:
            head = heads.get(task_id)
            epoch = 1 if head is None else head.epoch + 1
            try:
                resume(
                    store,
                    task_id,
                    items=items,
                    every=every,
                    epoch=epoch,
                    work_ms=work_ms,
                    report=emit,
                )
            except Exception as exc:
                errors.append(exc)
                emit("error", {"task": task_id, "message": repr(exc)})

        threads = [
            threading.Thread(target=work, args=(t,), name=f"demo:{t}") for t in task_ids(tasks)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if errors:
        return 1
    emit("finished", {})
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``python -m node_agent.demo_worker worker --data-dir D ...``."""
    parser = argparse.ArgumentParser(
        prog="python -m node_agent.demo_worker",
        description="Demo workload of `lazarus demo checkpoint`: hash chains that "
        "journal every item and checkpoint every K items.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser(
        "worker",
        help="run (or resume) the demo tasks in a data directory",
        description="Example: python -m node_agent.demo_worker worker --data-dir /tmp/d",
    )
    w.add_argument("--data-dir", type=Path, required=True, help="checkpoint store directory")
    w.add_argument("--tasks", type=int, default=DEFAULT_TASKS, help="number of tasks N")
    w.add_argument("--items", type=int, default=DEFAULT_ITEMS, help="items per task M")
    w.add_argument("--every", type=int, default=DEFAULT_EVERY, help="items between checkpoints K")
    w.add_argument(
        "--durability",
        choices=[d.value for d in Durability],
        default=Durability.GROUP.value,
        help="checkpoint store durability mode",
    )
    w.add_argument(
        "--work-ms", type=float, default=DEFAULT_WORK_MS, help="simulated work per item, ms"
    )
    args = parser.parse_args(argv)
    if args.tasks < 1 or args.items < 1 or args.every < 1 or args.work_ms < 0:
        parser.error("--tasks, --items and --every must be >= 1, --work-ms >= 0")
    return run_worker(
        args.data_dir,
        tasks=args.tasks,
        items=args.items,
        every=args.every,
        durability=Durability(args.durability),
        work_ms=args.work_ms,
    )


if __name__ == "__main__":
    sys.exit(main())
