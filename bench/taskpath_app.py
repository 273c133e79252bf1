"""Handlers of ``taskpath_bench.py``: S steps of work, a checkpoint after each.

Loaded by the bench's node agents (``--app taskpath_app:agent`` with ``bench/`` on
``PYTHONPATH``). Each task appends one JSON line to ``payload["out"]``: its
start and end (monotonic and wall), the work it did, the duration of every
checkpoint call as the handler saw it, and every step's wall time (the work
and its checkpoint).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

from node_agent.sdk import Agent

agent = Agent("lazarus-taskpath-bench")


def _spin(seconds: float) -> None:
    """CPU-bound Python (hashing) for ``seconds`` of this thread's CPU time."""
    end = time.thread_time() + seconds
    digest = b"x"
    while time.thread_time() < end:
        for _ in range(100):
            digest = hashlib.sha256(digest).digest()


def _run(ctx: Any, cpu: bool) -> dict[str, Any]:
    p = ctx.payload
    steps, step_s, checkpoint = p["steps"], p["step_s"], p.get("checkpoint", True)
    start = ctx.restored.state["i"] if ctx.restored and ctx.restored.state else 0
    t0, w0 = time.monotonic(), time.time()
    ckpt_s: list[float] = []
    step_walls: list[float] = []
    for i in range(start, steps):
        s0 = time.perf_counter()
        if cpu:
            _spin(step_s)
        else:
            time.sleep(step_s)
        if checkpoint:
            c0 = time.perf_counter()
            ctx.checkpoint({"i": i + 1, "pad": "x" * 64})
            ckpt_s.append(time.perf_counter() - c0)
        step_walls.append(time.perf_counter() - s0)
    t1 = time.monotonic()
    line = {
        "task": ctx.task_id,
        "node": ctx.node_id,
        "pid": os.getpid(),
        "steps": steps - start,
        "work_s": (steps - start) * step_s,
        "task_s": t1 - t0,
        "start_wall": w0,
        "end_wall": time.time(),
        "ckpt_s": ckpt_s,
        "step_walls": step_walls,
    }
    with open(p["out"], "a") as f:
        f.write(json.dumps(line) + "\n")
    return {"steps": steps}


@agent.task("tp-io")
def io_steps(ctx: Any) -> dict[str, Any]:
    """I/O-bound steps (sleep)."""
    return _run(ctx, cpu=False)


@agent.task("tp-cpu")
def cpu_steps(ctx: Any) -> dict[str, Any]:
    """CPU-bound steps (hashing, measured in thread CPU time)."""
    return _run(ctx, cpu=True)


@agent.task("tp-io-process", isolation="process")
def io_steps_process(ctx: Any) -> dict[str, Any]:
    """I/O-bound steps in a worker process."""
    return _run(ctx, cpu=False)


@agent.task("tp-cpu-process", isolation="process")
def cpu_steps_process(ctx: Any) -> dict[str, Any]:
    """CPU-bound steps in a worker process."""
    return _run(ctx, cpu=True)
