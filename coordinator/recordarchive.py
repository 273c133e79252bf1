"""The Redis archive of records retired from etcd (retention).

Theory of operation: etcd holds live state only. A terminal task (COMPLETED,
FAILED, CANCELLED) or a DEAD or LEFT node older than ``CoreSettings.retention_s`` is
retired by the core (``RetireRecords``); the runtime writes each record here
first and deletes it from etcd only once Redis has it, in a leader-fenced
transaction. GetTask (and so ``lazarus task``) falls back to this archive for
a task etcd no longer holds. When Redis cannot be written the records stay in
etcd (the next leader retires them again); nothing is lost either way.

Keys: ``lazarus:{<task_id>}:record:<cluster>`` (hash-tagged with the task, so
Redis Cluster keeps a task's record beside its checkpoints) and
``lazarus:archive:<cluster>:node:<node_id>``; values are the ``TaskRecord`` /
``NodeRecord`` bytes. ``ttl_s`` bounds how long Redis keeps them (0: forever).

A retired task's replicated keys (``head``, ``ckpt``, ``journal``, ``jepoch``,
its fork records: ``lazarus.storage.keys``) are given the same TTL when it is
archived: nothing resumes a terminal task, and what a reader may still want of
it (its record with the result, its forks) then leaves Redis together, so
Redis's size is bounded by the tasks finished in one TTL rather than growing
with every task the fleet ever ran.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio

from lazarus.storage.keys import (
    archived_node_key,
    archived_task_key,
    fork_key,
    fork_records_key,
    task_keys,
)

__all__ = ["DEFAULT_TTL_S", "RecordArchive"]

DEFAULT_TTL_S = 7 * 24 * 3600
"""Seconds Redis keeps an archived record and a retired task's keys: 7 days
(``--archive-ttl-s``; 0 keeps them forever)."""


class RecordArchive:
    """Archived task and node records of one cluster in Redis.

    Args:
        client: a ``redis.asyncio.Redis`` (bytes responses).
        cluster: the cluster name.
        ttl_s: seconds Redis keeps an archived record, and a retired task's
            replicated keys, counted from its retirement (0: forever).

    Raises:
        ValueError: a negative ``ttl_s``.
    """

    def __init__(self, client: redis.asyncio.Redis, cluster: str, ttl_s: int = DEFAULT_TTL_S):
        if ttl_s < 0:
            raise ValueError(f"archive TTL must be >= 0 seconds (0: forever), got {ttl_s}")
        self._client = client
        self._cluster = cluster
        self._ttl_s = int(ttl_s)

    async def put(
        self, tasks: Sequence[tuple[str, bytes]], nodes: Sequence[tuple[str, bytes]] = ()
    ) -> None:
        """Store records (id, serialised record) and start the TTL of the tasks' keys.

        One pipelined round trip, two with a TTL and tasks (the first reads each
        task's fork ids, whose record keys expire with it).

        Raises:
            redis.exceptions.RedisError, OSError: Redis refused or is unreachable.
        """
        ttl = self._ttl_s or None
        forks: list[list[bytes | str]] = [[] for _ in tasks]
        if ttl and tasks:
            pipe = self._client.pipeline(transaction=False)
            for task_id, _ in tasks:
                pipe.hkeys(fork_key(task_id))
            forks = list(await pipe.execute())
        pipe = self._client.pipeline(transaction=False)
        for (task_id, data), fork_ids in zip(tasks, forks, strict=True):
            pipe.set(archived_task_key(self._cluster, task_id), data, ex=ttl)
            if ttl:
                for key in (*task_keys(task_id), fork_key(task_id)):
                    pipe.expire(key, ttl)
                for fork_id in fork_ids:
                    pipe.expire(fork_records_key(task_id, _as_str(fork_id)), ttl)
        for node_id, data in nodes:
            pipe.set(archived_node_key(self._cluster, node_id), data, ex=ttl)
        await pipe.execute()

    async def task(self, task_id: str) -> bytes | None:
        """The archived record of a task, or None.

        Raises:
            redis.exceptions.RedisError, OSError: Redis unreachable.
        """
        value = await self._client.get(archived_task_key(self._cluster, task_id))
        return None if value is None else _as_bytes(value)

    async def node(self, node_id: str) -> bytes | None:
        """The archived record of a node, or None.

        Raises:
            redis.exceptions.RedisError, OSError: Redis unreachable.
        """
        value = await self._client.get(archived_node_key(self._cluster, node_id))
        return None if value is None else _as_bytes(value)


def _as_bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _as_str(value: bytes | str) -> str:
    return value if isinstance(value, str) else bytes(value).decode()
