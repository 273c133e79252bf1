"""Test app for shared CRDT documents (``--app tests.integration.shared_apps:agent``).

Four shared documents are written from two places on every node agent:

* the ``producer`` service (``Agent.service``): agent-level, not tied to any
  task, so it keeps writing while the node is cut off from the coordinator
  (self-fencing pauses tasks, not services);
* ``shared-writer`` tasks (``ctx.shared`` in a handler): they write until the
  task is fenced, moved or told to stop.

Every operation whose call returned (durable in ``shared.sqlite3``: the
acknowledged point) is appended as one JSON line to
``<data_dir>/acked.jsonl`` — the ground truth the test recomputes the
documents' values from. The ``status`` service writes the node's state
vectors to ``<data_dir>/shared-status.json`` every 100 ms (a debug read for
measuring convergence). Writers stop when ``<data_dir>/../stop-writers``
exists.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from node_agent.sdk import Agent, ServiceContext, TaskContext
from node_agent.shared import OpReceipt, SharedDocument

agent = Agent("shared-docs-test")

DOCS = {
    "counter": "pn-counter",
    "members": "or-set",
    "config": "lww-map",
    "events": "rga-log",
}
"""Document name -> kind."""

OP_INTERVAL_S = 0.02
"""Pause between two operations of one writer."""


class _Ground:
    """Appends acknowledged operations to ``acked.jsonl`` (one writer per process)."""

    def __init__(self, data_dir: str) -> None:
        self.path = Path(data_dir) / "acked.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, doc: str, op: str, arg: Any, receipt: OpReceipt, **extra: Any) -> None:
        entry = {
            "doc": doc,
            "op": op,
            "arg": arg,
            "replica": receipt.replica_id,
            "seq": receipt.seq,
            **extra,
        }
        if receipt.at is not None:
            entry["at"] = [receipt.at.wall_ms, receipt.at.logical]
        self._file.write(json.dumps(entry, sort_keys=True) + "\n")
        self._file.flush()


_GROUND: dict[str, _Ground] = {}


def _ground(data_dir: str) -> _Ground:
    if data_dir not in _GROUND:
        _GROUND[data_dir] = _Ground(data_dir)
    return _GROUND[data_dir]


def _stop_file(data_dir: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(data_dir)), "stop-writers")


def _stopped(stop: str) -> bool:
    return os.path.exists(stop)


async def _write_loop(
    docs: dict[str, SharedDocument],
    ground: _Ground,
    stop: str,
    tag: str,
    limit: int,
    check: Any = None,
) -> int:
    """Round-robin operations over the four documents until ``stop`` exists or ``limit``.

    Each operation and its ground-truth line run shielded: a handler cancelled
    while its operation commits still records the acknowledgement (the
    operation completes either way).
    """
    mine: list[str] = []
    n = 0
    while n < limit and not _stopped(stop):
        if check is not None:
            check()
        n += 1
        await asyncio.shield(_one_op(docs, ground, tag, n, mine))
        await asyncio.sleep(OP_INTERVAL_S)
    return n


async def _one_op(
    docs: dict[str, SharedDocument], ground: _Ground, tag: str, n: int, mine: list[str]
) -> None:
    which = n % 4
    if which == 0:
        amount = 1 + n % 3
        if n % 5 == 0:
            ground.log("counter", "decrement", amount, await docs["counter"].decrement(amount))
        else:
            ground.log("counter", "increment", amount, await docs["counter"].increment(amount))
    elif which == 1:
        if mine and n % 7 == 1:
            member = mine.pop(0)
            ground.log("members", "remove", member, await docs["members"].remove(member))
        else:
            member = f"{tag}:{n}"
            ground.log("members", "add", member, await docs["members"].add(member))
            mine.append(member)
    elif which == 2:
        key, value = f"k{n % 5}", f"{tag}:{n}"
        ground.log("config", "put", [key, value], await docs["config"].put(key, value))
    else:
        item = f"{tag}:{n}"
        ground.log("events", "append", item, await docs["events"].append(item))


@agent.service("producer")
async def producer(ctx: ServiceContext) -> None:
    """Agent-level writer: runs from agent start until the stop file appears."""
    docs = {name: ctx.shared(name, kind=kind) for name, kind in DOCS.items()}
    await asyncio.sleep(0.5)
    await _write_loop(
        docs, _ground(ctx.data_dir), _stop_file(ctx.data_dir), f"{ctx.node_id}:p", 10**9
    )


@agent.service("status")
async def status(ctx: ServiceContext) -> None:
    """Writes this node's state vectors to ``shared-status.json`` every 100 ms."""
    docs = {name: ctx.shared(name, kind=kind) for name, kind in DOCS.items()}
    path = Path(ctx.data_dir) / "shared-status.json"
    tmp = path.with_suffix(".tmp")
    while True:
        body = {f"shared/{name}": doc.state_vector() for name, doc in docs.items()}
        tmp.write_text(json.dumps(body, sort_keys=True))
        os.replace(tmp, path)
        await asyncio.sleep(0.1)


@agent.task("shared-writer")
async def shared_writer(ctx: TaskContext) -> dict[str, int]:
    """Writes the four documents from a task until fenced, moved or stopped.

    Payload: ``{"run_dir": str, "ops": int}``; the node's data dir is
    ``<run_dir>/<node_id>`` (``LocalCluster``'s layout).
    """
    payload = ctx.payload if isinstance(ctx.payload, dict) else {}
    docs = {name: ctx.shared(name, kind=kind) for name, kind in DOCS.items()}
    root = Path(payload["run_dir"]) / ctx.node_id
    tag = f"{ctx.node_id}:{ctx.task_id}:e{ctx.epoch}"
    n = await _write_loop(
        docs,
        _ground(str(root)),
        _stop_file(str(root)),
        tag,
        int(payload.get("ops", 10**9)),
        ctx.raise_if_cancelled,
    )
    return {"ops": n}


@agent.task("crdt-counter")
async def crdt_counter(ctx: TaskContext) -> dict[str, Any]:
    """A task whose state is a CRDT document (``ctx.crdt_state``): a pn-counter it bumps.

    Every acknowledged increment is logged with the epoch it was made at, so
    the test can check that a zombie's increments (made at the stale epoch
    before it self-fenced) end up in the current owner's state.
    """
    payload = ctx.payload if isinstance(ctx.payload, dict) else {}
    state = await ctx.crdt_state("pn-counter")
    root = str(Path(payload["run_dir"]) / ctx.node_id)
    ground, stop = _ground(root), _stop_file(root)
    while not _stopped(stop):
        ctx.raise_if_cancelled()
        await asyncio.shield(_bump(state, ground, ctx.epoch))
        await asyncio.sleep(OP_INTERVAL_S)
    return {"value": state.value()}


async def _bump(state: SharedDocument, ground: _Ground, epoch: int) -> None:
    receipt = await state.increment(1)
    ground.log(state.doc_id, "increment", 1, receipt, epoch=epoch, wall_ms=time.time_ns() // 10**6)
