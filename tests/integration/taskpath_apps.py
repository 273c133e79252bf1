"""Handlers for the task-path tests (issue [task-path]): side effects logged outside Lazarus.

Loaded by a real ``lazarus node-agent --app tests.integration.taskpath_apps:agent``.
Each handler appends JSON lines to ``payload["effects"]`` (a file shared by every
agent of the test): which node ran which step of which task at which epoch —
the external record a safety check reads.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

from node_agent.sdk import Agent

agent = Agent("lazarus-test-taskpath")


def _effect(ctx: Any, event: str, **fields: Any) -> None:
    line = {
        "task": ctx.task_id,
        "epoch": ctx.epoch,
        "node": ctx.node_id,
        "pid": os.getpid(),
        "event": event,
        "t": time.time(),
        **fields,
    }
    with open(ctx.payload["effects"], "a") as f:
        f.write(json.dumps(line) + "\n")


@agent.task("finish-at-fence")
def finish_at_fence(ctx: Any) -> dict[str, Any]:
    """Run until this agent begins to fence, then return at once (before the deadline).

    The handler's completion side effect runs once per call; the test checks
    that the call is not repeated at the same epoch however the fence ends.
    """
    _effect(ctx, "start")
    ctx.checkpoint({"step": 1}, reason="before the wait")
    waited = 0.0
    while not ctx.cancelled and waited < 30.0:
        time.sleep(0.005)
        waited += 0.005
    _effect(ctx, "completion")
    return {"done": True, "node": ctx.node_id}


@agent.task("steps")
def steps(ctx: Any) -> dict[str, Any]:
    """CPU-bound steps of a side effect, each right after ``ctx.ensure_owner()``.

    A checkpoint every 50 steps; ``payload["steps"]`` steps in all (resumed from
    the checkpoint after a move). The step holds the GIL (hashing, ~2 ms), as a
    CPU-bound handler does: after a SIGSTOP/SIGCONT this thread runs before the
    agent's event loop gets the interpreter back.
    """
    start = ctx.restored.state["i"] if ctx.restored and ctx.restored.state else 0
    for i in range(start, ctx.payload["steps"]):
        ctx.ensure_owner()
        _effect(ctx, "step", i=i)
        if i % 50 == 49:
            ctx.checkpoint({"i": i + 1}, reason="every 50 steps")
        _spin(0.002)
    return {"steps": ctx.payload["steps"]}


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    digest = b"x"
    while time.perf_counter() < end:
        for _ in range(50):
            digest = hashlib.sha256(digest).digest()


@agent.task("proc-steps", isolation="process")
def proc_steps(ctx: Any) -> dict[str, Any]:
    """Checkpointed steps in a worker process; logs its pid; runs until ``payload["steps"]``.

    With ``payload["ignore_cancel"]`` it goes on stepping (without context calls)
    after it is told to stop, as a handler stuck in C code would.
    """
    start = ctx.restored.state["i"] if ctx.restored and ctx.restored.state else 0
    for i in range(start, ctx.payload["steps"]):
        if not ctx.payload.get("ignore_cancel"):
            ctx.ensure_owner()
        _effect(ctx, "step", i=i)
        if not ctx.payload.get("ignore_cancel") or i == start:
            ctx.checkpoint({"i": i + 1})
        time.sleep(0.05)
    return {"steps": ctx.payload["steps"], "pid": os.getpid()}
