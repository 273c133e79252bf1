"""A compiled LangGraph graph as a Lazarus task kind.

Theory of operation: ``langgraph_task(agent, "research", graph_factory)``
registers an ``async`` handler of kind ``research``. Each assignment builds a
``LazarusSaver`` on the task (``thread_id`` = task id), asks
``graph_factory(saver)`` for the compiled graph, and runs it:

* **fresh** (the thread has no checkpoint): ``ainvoke(make_input(payload))``;
* **after a move or restart** (the saver restored the thread from what the
  previous owner made durable): ``ainvoke(None)`` — LangGraph's own resume:
  the newest checkpoint's next super-step runs again, except the tasks whose
  pending writes were saved, which are not re-run;
* **resumed by a human** (a fork carrying ``resume``, see below):
  ``ainvoke(Command(resume=value))``.

Nodes see who runs them in ``config["configurable"]``: ``lazarus_task_id``,
``lazarus_epoch``, ``lazarus_node_id`` (also copied into each checkpoint's
metadata by LangGraph) and ``lazarus_ctx``, the ``TaskContext``: a node
calls ``lazarus_ctx.raise_if_cancelled()`` before an external side effect, so
an owner that lost the task stops before it, not only at its next ``put``.

**Human in the loop.** When the run stops at an ``interrupt(value)``, the
helper folds the thread into a Lazarus checkpoint that also names the
interrupted checkpoint (``interrupted_at``) and the interrupts, reports
progress ``"interrupted: ..."``, and completes the task with the result
``{"status": "interrupted", "checkpoint_ref", "interrupts": [{"id", "value"}], ...}``. The
orchestrator answers with ``resume(client, task_id, value)``: a ForkTask of
that checkpoint with the edit ``resume = value``. The fork is a new task that
carries the whole thread; it resumes the interrupted node with ``value``
(only if the thread still stands at ``interrupted_at``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from langchain_core.load import dumpd
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.types import Command

from node_agent.langgraph.saver import DEFAULT_COMPACT_EVERY_EVENTS, LazarusSaver

if TYPE_CHECKING:
    from lazarus.client import Client
    from node_agent.sdk import Agent, DurabilityName, TaskContext

__all__ = ["GraphFactory", "jsonable", "langgraph_task", "resume", "run_graph"]

GraphFactory = Callable[[BaseCheckpointSaver[Any]], Any]
"""Builds the compiled graph (``builder.compile(checkpointer=saver)``) for a saver."""

DEFAULT_RECURSION_LIMIT = 100


def jsonable(value: Any) -> Any:
    """``value`` as JSON (LangChain objects such as messages via ``langchain_core.load.dumpd``)."""
    return dumpd(value)


def _config(ctx: TaskContext, recursion_limit: int) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": ctx.task_id,
            "lazarus_task_id": ctx.task_id,
            "lazarus_epoch": ctx.epoch,
            "lazarus_node_id": ctx.node_id,
            "lazarus_ctx": ctx,
        },
        "recursion_limit": recursion_limit,
    }


async def run_graph(
    ctx: TaskContext,
    graph_factory: GraphFactory,
    *,
    make_input: Callable[[Any], Any] | None = None,
    make_output: Callable[[Any], Any] | None = None,
    recursion_limit: int = DEFAULT_RECURSION_LIMIT,
    compact_every_events: int = DEFAULT_COMPACT_EVERY_EVENTS,
) -> Any:
    """Run (or resume) the task's thread of the graph to its end or to an interrupt.

    Args:
        ctx: the task's context.
        graph_factory: builds the compiled graph for a checkpointer.
        make_input: payload -> graph input (default: the payload as is).
        make_output: final state values -> JSON result (default: ``jsonable``).
        recursion_limit: LangGraph's super-step limit.
        compact_every_events: as ``LazarusSaver``.

    Returns:
        ``make_output(values)``, or ``{"status": "interrupted", ...}`` at an interrupt.

    Raises:
        TaskCancelled: the task moved away (a put was fenced).
    """
    saver = LazarusSaver.for_task(ctx, compact_every_events=compact_every_events)
    graph = graph_factory(saver)
    config = _config(ctx, recursion_limit)
    latest = await saver.aget_tuple(config)
    restored = ctx.restored.state if ctx.restored is not None else None
    graph_input: Any
    if latest is None:
        graph_input = make_input(ctx.payload) if make_input is not None else ctx.payload
    elif (
        isinstance(restored, dict)
        and "resume" in restored
        and restored.get("interrupted_at") == latest.checkpoint["id"]
    ):
        graph_input = Command(resume=restored["resume"])
    else:
        graph_input = None
    await graph.ainvoke(graph_input, config, durability="sync")
    snapshot = await graph.aget_state(config)
    if snapshot.interrupts:
        interrupts = [{"id": i.id, "value": jsonable(i.value)} for i in snapshot.interrupts]
        checkpoint_id = snapshot.config["configurable"]["checkpoint_id"]
        ref, fold = await saver.compact_state(
            ctx.task_id, extra={"interrupted_at": checkpoint_id, "interrupts": interrupts}
        )
        ctx.progress(0.5, f"interrupted: waiting for input at {checkpoint_id}")
        # The result carries the thread's fold too: a finished task's newest
        # checkpoint is its result ([task-path]), and that is what a fork reads.
        return {
            **fold,
            "status": "interrupted",
            "thread_id": ctx.task_id,
            "checkpoint_id": checkpoint_id,
            "checkpoint_ref": ref,
            "interrupts": interrupts,
        }
    ctx.progress(1.0, "done")
    return make_output(snapshot.values) if make_output is not None else jsonable(snapshot.values)


def langgraph_task(
    agent: Agent,
    kind: str,
    graph_factory: GraphFactory,
    *,
    durability: DurabilityName = "replicated",
    make_input: Callable[[Any], Any] | None = None,
    make_output: Callable[[Any], Any] | None = None,
    recursion_limit: int = DEFAULT_RECURSION_LIMIT,
    compact_every_events: int = DEFAULT_COMPACT_EVERY_EVENTS,
) -> Callable[[TaskContext], Any]:
    """Register ``graph_factory``'s graph as the handler of task kind ``kind``.

    Args:
        agent: the app's ``Agent``.
        kind: the task kind.
        graph_factory: ``saver -> builder.compile(checkpointer=saver)``.
        durability: "replicated" (default: every super-step is in Redis before
            the next starts, so any node can resume it) or "local".
        make_input, make_output, recursion_limit, compact_every_events: as ``run_graph``.

    Returns:
        The registered handler.

    Raises:
        ValueError: as ``Agent.task``.
    """

    async def handler(ctx: TaskContext) -> Any:
        return await run_graph(
            ctx,
            graph_factory,
            make_input=make_input,
            make_output=make_output,
            recursion_limit=recursion_limit,
            compact_every_events=compact_every_events,
        )

    handler.__name__ = f"langgraph_{kind}"
    return agent.task(kind, durability=durability)(handler)


async def resume(client: Client, task_id: str, value: Any, *, new_task_id: str = "") -> str:
    """Answer an interrupted graph task: fork its thread with ``resume = value``.

    Args:
        client: an orchestrator client.
        task_id: the task whose result is ``{"status": "interrupted", ...}``.
        value: the answer (a JSON value) ``interrupt()`` returns in the resumed node.
        new_task_id: the new task's id (default: generated by the leader).

    Returns:
        The id of the new task, which continues the thread.

    Raises:
        ValueError: the task's result is not ``{"status": "interrupted", ...}``.
        grpc errors of GetTask / ForkTask (NOT_FOUND, ...).
    """
    task = (await client.get(task_id)).task
    try:
        interrupted = json.loads(task.result.payload).get("status") == "interrupted"
    except (ValueError, AttributeError):
        interrupted = False
    if not interrupted:
        raise ValueError(f"task {task_id!r} is not an interrupted graph (no checkpoint_ref)")
    # Its newest checkpoint is the result, which carries the thread's fold.
    newest = await client.checkpoint(task_id, omit_payload=True)
    ref = newest.checkpoint.checkpoint_ref
    fork = await client.fork(ref, edits={"resume": value}, new_task_id=new_task_id)
    return str(fork.task_id)
