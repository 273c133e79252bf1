"""Handlers run in worker processes by tests/integration/test_worker_replication.py.

Each one reads Redis itself, from the handler, right after ``ctx.checkpoint``
returned: what Redis holds at that moment is the promise of a ``replicated``
checkpoint, observed from outside Lazarus's bookkeeping.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import redis


def _redis_ckpt_seq(ctx: Any) -> int:
    p = ctx.payload
    client = redis.Redis.from_url(p["redis_url"], socket_timeout=5)
    try:
        value = client.hget(f"{p['prefix']}:{{{ctx.task_id}}}:head", "ckpt_seq")
    finally:
        client.close()
    return int(value or 0)


def checkpoint_and_read_redis(ctx: Any) -> list[list[int]]:
    """``steps`` checkpoints; after each, (the seq returned, the seq Redis holds)."""
    seen = []
    for i in range(ctx.payload["steps"]):
        seq = ctx.checkpoint({"i": i + 1})
        seen.append([seq, _redis_ckpt_seq(ctx)])
    return seen


def checkpoint_wait_checkpoint(ctx: Any) -> str:
    """Checkpoint, wait until the test's ``go`` file exists, checkpoint again.

    Writes to ``outcome`` whether the second checkpoint returned or what it raised.
    """
    ctx.checkpoint({"i": 1})
    go = Path(ctx.payload["go"])
    while not go.exists():
        time.sleep(0.01)
    try:
        ctx.checkpoint({"i": 2})
    except Exception as exc:
        Path(ctx.payload["outcome"]).write_text(json.dumps(["raised", type(exc).__name__]))
        raise
    Path(ctx.payload["outcome"]).write_text(json.dumps(["returned", ""]))
    return "done"


def burst_then_long_step(ctx: Any) -> str:
    """Five quick checkpoints, then a long step (no checkpoint) announced in ``marker``."""
    for i in range(5):
        ctx.checkpoint({"i": i + 1})
    Path(ctx.payload["marker"]).write_text(str(time.time()))
    time.sleep(ctx.payload["long_s"])
    return "done"


def checkpoint_slowly(ctx: Any) -> str:
    """``steps`` checkpoints, ``every_s`` apart (longer than the worker's write interval)."""
    for i in range(ctx.payload["steps"]):
        ctx.checkpoint({"i": i + 1})
        time.sleep(ctx.payload["every_s"])
    return "done"
