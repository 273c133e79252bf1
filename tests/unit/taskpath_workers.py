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
