"""Every Redis key Lazarus reads or writes, built in one module.

Keys of one task share the hash tag ``{<task_id>}`` (one Redis Cluster slot, so
a Lua script or MULTI may touch them together); keys of one cluster-wide stream
share ``{<cluster>}``. ``prefix`` is ``lazarus`` unless a deployment shares a
Redis between installations.

- ``<prefix>:{T}:head`` / ``:ckpt`` / ``:journal`` / ``:jepoch``: the replicated
  task (:mod:`lazarus.storage.replica`), written by agents through a fenced Lua script.
- ``<prefix>:{T}:forks``: hash fork id -> ForkRecord (agent).
- ``<prefix>:{T}:fork:<fork id>``: the fork's LineageReport with payloads (agent).
- ``<prefix>:doc:{D}``: a shared document's canonical DocumentRecord (coordinator).
- ``lazarus:{<cluster>}:events``: stream of event batches (coordinator).
- ``lazarus:{T}:record:<cluster>``: an archived TaskRecord (coordinator, retention).
- ``lazarus:archive:<cluster>:node:<node id>``: an archived NodeRecord (coordinator).
- ``<prefix>:generation``: a random id set once per Redis dataset (``SET NX``);
  agents that see it change re-ship their tasks (``node_agent/core/redisloss.py``).
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_PREFIX",
    "archived_node_key",
    "archived_task_key",
    "document_key",
    "events_stream_key",
    "fork_key",
    "fork_records_key",
    "generation_key",
    "task_keys",
]

DEFAULT_PREFIX = "lazarus"
"""Key prefix of every key."""


def task_keys(task_id: str, prefix: str = DEFAULT_PREFIX) -> tuple[str, str, str, str]:
    """The replicated keys of one task, all in the hash slot of ``{task_id}``.

    Returns:
        ``(head, ckpt, journal, jepoch)`` key names.
    """
    base = f"{prefix}:{{{task_id}}}"
    return f"{base}:head", f"{base}:ckpt", f"{base}:journal", f"{base}:jepoch"


def fork_key(task_id: str, prefix: str = DEFAULT_PREFIX) -> str:
    """Redis hash of a task's fork records (fork id -> ForkRecord bytes)."""
    return f"{prefix}:{{{task_id}}}:forks"


def fork_records_key(task_id: str, fork_id: str, prefix: str = DEFAULT_PREFIX) -> str:
    """Redis string holding a fork's divergent records (a LineageReport, serialized)."""
    return f"{prefix}:{{{task_id}}}:fork:{fork_id}"


def generation_key(prefix: str = DEFAULT_PREFIX) -> str:
    """Redis string holding the dataset's generation marker (a random id, set with NX)."""
    return f"{prefix}:generation"


def document_key(doc_id: str, prefix: str = DEFAULT_PREFIX) -> str:
    """Redis key of a shared document's canonical replica: ``lazarus:doc:{<doc_id>}``.

    ``document_key("*")`` is the SCAN pattern of every canonical replica.
    """
    return f"{prefix}:doc:{{{doc_id}}}"


def events_stream_key(cluster: str) -> str:
    """``lazarus:{<cluster>}:events`` (hash-tagged: one slot in Redis Cluster)."""
    return f"{DEFAULT_PREFIX}:{{{cluster}}}:events"


def archived_task_key(cluster: str, task_id: str) -> str:
    """The archive key of a retired task record (hash-tagged with the task)."""
    return f"{DEFAULT_PREFIX}:{{{task_id}}}:record:{cluster}"


def archived_node_key(cluster: str, node_id: str) -> str:
    """The archive key of a retired node record."""
    return f"{DEFAULT_PREFIX}:archive:{cluster}:node:{node_id}"
