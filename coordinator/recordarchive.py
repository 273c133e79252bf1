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
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio

from lazarus.storage.keys import archived_node_key, archived_task_key

__all__ = ["DEFAULT_TTL_S", "RecordArchive"]

DEFAULT_TTL_S = 0
"""Archived records never expire unless a TTL is given."""


class RecordArchive:
    """Archived task and node records of one cluster in Redis.

    Args:
        client: a ``redis.asyncio.Redis`` (bytes responses).
        cluster: the cluster name.
        ttl_s: seconds Redis keeps an archived record (0: forever).
    """

    def __init__(self, client: redis.asyncio.Redis, cluster: str, ttl_s: int = DEFAULT_TTL_S):
        self._client = client
        self._cluster = cluster
        self._ttl_s = ttl_s

    async def put(
        self, tasks: Sequence[tuple[str, bytes]], nodes: Sequence[tuple[str, bytes]] = ()
    ) -> None:
        """Store records (id, serialised record), in one pipelined round trip.

        Raises:
            redis.exceptions.RedisError, OSError: Redis refused or is unreachable.
        """
        pipe = self._client.pipeline(transaction=False)
        ttl = self._ttl_s or None
        for task_id, data in tasks:
            pipe.set(archived_task_key(self._cluster, task_id), data, ex=ttl)
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
