"""Handlers run in worker processes by tests/unit/test_taskpath_core.py (importable by name)."""

from __future__ import annotations

import os
import time
from typing import Any


def steps(ctx: Any) -> dict[str, Any]:
    """Three checkpointed steps, then the worker's pid."""
    for i in range(3):
        ctx.ensure_owner()
        ctx.checkpoint({"i": i + 1})
    return {"pid": os.getpid(), "token": ctx.fencing_token.header_value()}


def report_pid_then_spin(ctx: Any) -> None:
    """Tell the test its pid (a checkpoint), then ignore cancellation forever."""
    ctx.checkpoint({"pid": os.getpid()})
    while True:
        time.sleep(0.01)


def many_steps(ctx: Any) -> dict[str, Any]:
    """``payload["steps"]`` checkpoints, a journal event after every ``record_every``-th."""
    steps, every = ctx.payload["steps"], ctx.payload["record_every"]
    for i in range(1, steps + 1):
        ctx.checkpoint({"step": i})
        if i % every == 0:
            ctx.record({"i": i})
    return {"steps": steps}
