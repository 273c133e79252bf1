"""A node-agent app whose tasks log their own side effects, for the identity tests.

Loaded by ``lazarus node-agent --app tests.integration.identity_apps:agent``.
Every step start and every completion is appended, before the step's work, to
a Redis list the test owns (``payload["log_key"]`` on ``payload["redis_url"]``)
as JSON ``{t, task, step, pid, epoch, what}``: the test reads which process ran
which step at which epoch from there, never from the coordinator.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import redis.asyncio as aioredis

from node_agent.sdk import Agent, TaskContext

agent = Agent("lazarus-test-identity")
_clients: dict[str, aioredis.Redis] = {}


def _client(url: str) -> aioredis.Redis:
    if url not in _clients:
        _clients[url] = aioredis.from_url(url)
    return _clients[url]


async def _log(ctx: TaskContext, what: str, step: int) -> None:
    payload = ctx.payload
    ensure = getattr(ctx, "ensure_owner", None)
    if ensure is not None:
        ensure()  # the owner check right before the side effect (SDK, [task-path])
    elif ctx.cancelled:
        raise asyncio.CancelledError
    entry = {
        "t": time.time(),
        "task": ctx.task_id,
        "step": step,
        "pid": os.getpid(),
        "epoch": ctx.epoch,
        "what": what,
    }
    await _client(payload["redis_url"]).rpush(payload["log_key"], json.dumps(entry))


@agent.task("steplog")
async def steplog(ctx: TaskContext) -> dict[str, Any]:
    """``payload``: steps, step_ms, log_key, redis_url. Checkpoints after every step."""
    payload = ctx.payload
    start = 0
    if ctx.restored is not None and ctx.restored.state is not None:
        start = int(ctx.restored.state["next"])
    for step in range(start, int(payload["steps"])):
        await _log(ctx, "step", step)
        await asyncio.sleep(float(payload["step_ms"]) / 1000.0)
        await ctx.checkpoint({"next": step + 1}, reason=f"step {step}")
    await _log(ctx, "completed", int(payload["steps"]))
    return {"steps": int(payload["steps"])}
