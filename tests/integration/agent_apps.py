"""A node-agent app with misbehaving handlers, for the bad-input acceptance test.

Loaded by a real ``lazarus node-agent --app tests.integration.agent_apps:agent``.
"""

from __future__ import annotations

from typing import Any

from node_agent.sdk import Agent, TaskContext

agent = Agent("lazarus-test-misbehaving")


@agent.task("explode")
async def explode(ctx: TaskContext) -> dict[str, Any]:
    """Checkpoint once, then raise: the task must fail with this text, then be retried."""
    await ctx.checkpoint({"reached": "before the bug"}, reason="first")
    raise RuntimeError(f"boom in attempt {ctx.attempt}: the handler has a bug")


@agent.task("unserialisable")
async def unserialisable(ctx: TaskContext) -> Any:
    """Return a value JSON cannot encode."""
    return {"a set": {1, 2, 3}}


@agent.task("echo")
def echo(ctx: Any) -> Any:
    """A plain (sync) handler that returns its payload."""
    ctx.checkpoint({"echoed": True}, reason="done")
    return {"echo": ctx.payload}
