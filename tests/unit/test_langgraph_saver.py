"""LazarusSaver: replay from the store, epoch fencing, and a graph resumed by a new owner."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph")

from langgraph.checkpoint.base import empty_checkpoint

from node_agent.checkpoint import CheckpointStore, StaleEpoch
from node_agent.langgraph import LazarusSaver, ThreadNotOwned, example
from node_agent.sdk import Restored, TaskCancelled, TaskContext


def _put(saver: LazarusSaver, thread: str, step: int, parent: Any = None) -> Any:
    conf: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    if parent:
        conf["configurable"]["checkpoint_id"] = parent
    ck = empty_checkpoint()
    ck["channel_values"] = {"n": step}
    ck["channel_versions"] = {"n": str(step)}
    return saver.put(conf, ck, {"step": step}, {"n": str(step)})


def test_a_reopened_store_gives_back_every_checkpoint_and_write(tmp_path: Path) -> None:
    with LazarusSaver.local(tmp_path, durability="sync", compact_every_events=3) as saver:
        cfg = None
        for step in range(7):
            cfg = _put(saver, "t1", step, cfg["configurable"]["checkpoint_id"] if cfg else None)
        saver.put_writes(cfg, [("n", 99)], task_id="task-a")
        before = [(t.config, t.checkpoint, t.metadata, t.pending_writes) for t in saver.list(None)]
    with LazarusSaver.local(tmp_path, durability="sync") as again:
        after = [(t.config, t.checkpoint, t.metadata, t.pending_writes) for t in again.list(None)]
        assert after == before
        latest = again.get_tuple({"configurable": {"thread_id": "t1"}})
        assert latest is not None
        assert latest.checkpoint["channel_values"] == {"n": 6}
        assert latest.pending_writes == [("task-a", "n", 99)]


def test_a_saver_at_an_older_epoch_is_fenced(tmp_path: Path) -> None:
    with CheckpointStore(tmp_path, durability="none") as store:
        old = LazarusSaver(store, epoch=1)
        new = LazarusSaver(store, epoch=2)
        first = _put(old, "t", 0)
        _put(new, "t", 1, first["configurable"]["checkpoint_id"])
        with pytest.raises(StaleEpoch):
            _put(old, "t", 2, first["configurable"]["checkpoint_id"])


class _Host:
    """A task's journal in memory; ``fenced`` makes every write raise as the runner does."""

    def __init__(self, events: list[Any] | None = None) -> None:
        self.events: list[Any] = list(events or [])
        self.fenced = False
        self.checkpoints: list[Any] = []

    async def record(self, event: Any) -> int:
        if self.fenced:
            raise TaskCancelled("fenced")
        self.events.append(event)
        return len(self.events)

    async def checkpoint(self, state: Any, reason: str) -> int:
        if self.fenced:
            raise TaskCancelled("fenced")
        self.checkpoints.append(state)
        return len(self.checkpoints)

    def progress(self, ratio: float, message: str) -> None:
        pass

    @property
    def cancelled(self) -> bool:
        return self.fenced

    async def wait_cancelled(self) -> None:
        await asyncio.Event().wait()

    def shared(self, name: str, kind: str) -> Any:
        raise NotImplementedError

    async def crdt_state(self, kind: str, sync_timeout_s: float) -> Any:
        raise NotImplementedError


def _ctx(host: _Host, payload: Any, epoch: int, restored: Restored | None) -> TaskContext:
    return TaskContext(
        task_id="task-1",
        kind=example.KIND,
        epoch=epoch,
        attempt=epoch,
        payload=payload,
        restored=restored,
        node_id=f"node-{epoch}",
        host=host,
    )


async def test_a_graph_resumes_on_a_new_owner_and_the_old_owner_is_fenced() -> None:
    from node_agent.langgraph.task import run_graph

    payload = example.make_payloads(1, think_s=0.05)[0]
    expected = await example.adirect_result(payload)
    first = _Host()
    run = asyncio.create_task(
        run_graph(_ctx(first, payload, 1, None), example.build_graph, make_input=example.make_input)
    )
    while len(first.events) < 6:  # a few super-steps in
        await asyncio.sleep(0.01)
    first.fenced = True  # the task moved: every later write of this owner raises
    with pytest.raises(TaskCancelled):
        await run
    durable = list(first.events)
    second = _Host(durable)
    restored = Restored(state=None, checkpoint_seq=0, covers_journal_seq=0, events=durable)
    result = await run_graph(
        _ctx(second, payload, 2, restored),
        example.build_graph,
        make_input=example.make_input,
        make_output=example.output,
    )
    assert result == expected
    assert len(second.events) > len(durable)  # it continued the same journal


async def test_a_task_saver_refuses_another_thread() -> None:
    saver = LazarusSaver.for_task(_ctx(_Host(), {}, 1, None))
    ck = empty_checkpoint()
    with pytest.raises(ThreadNotOwned):
        await saver.aput({"configurable": {"thread_id": "other", "checkpoint_ns": ""}}, ck, {}, {})


async def test_an_interrupt_is_reported_and_a_fork_with_resume_answers_it() -> None:
    from node_agent.langgraph.task import run_graph

    payload = {**example.make_payloads(1)[0], "review": True}
    host = _Host()
    out = await run_graph(
        _ctx(host, payload, 1, None), example.build_graph, make_input=example.make_input
    )
    assert out["status"] == "interrupted"
    assert out["interrupts"][0]["value"]["question"] == "approve this answer?"
    state = host.checkpoints[-1]
    assert state["interrupted_at"] == out["checkpoint_id"]
    # What ForkTask hands the new task: the checkpoint's state with the edit applied.
    forked = Restored(
        state={**state, "resume": "approved by a human"}, checkpoint_seq=1, covers_journal_seq=0
    )
    result = await run_graph(
        _ctx(_Host(), payload, 1, forked),
        example.build_graph,
        make_input=example.make_input,
        make_output=example.output,
    )
    assert result["approved"] == "approved by a human"
    assert result["trail"][-1] == "review"


async def test_sync_calls_inside_a_task_hop_onto_the_agents_loop() -> None:
    host = _Host()
    saver = LazarusSaver.for_task(_ctx(host, {}, 1, None))
    cfg = await asyncio.to_thread(_put, saver, "task-1", 0)  # as graph.invoke in a thread
    assert len(host.events) == 1
    assert saver.get_tuple(cfg) is not None
    with pytest.raises(RuntimeError, match="async graph API"):
        _put(saver, "task-1", 1)  # on the loop itself it would deadlock: refused
