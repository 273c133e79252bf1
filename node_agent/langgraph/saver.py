"""LazarusSaver: a LangGraph checkpointer on Lazarus checkpoints and journal events.

Theory of operation
-------------------
LangGraph hands a checkpointer three kinds of writes for a thread: ``put`` (a
new checkpoint: id, parent, metadata and the channel values whose versions
changed), ``put_writes`` (the pending writes of one task of the next
super-step) and ``delete_thread``. ``LazarusSaver`` turns each into one
*journal event* of the thread's Lazarus task (a JSON value, the serialized
LangGraph values base64-encoded), appends it, and only when the append has
returned — durable on local disk (fsync), and acknowledged by Redis when the
task's durability is "replicated" — applies it to an in-memory index
(LangGraph's own ``InMemorySaver``, fed with the already-serialized values),
which answers every read: ``get_tuple``, ``list``, the delta-channel history.

Every ``compact_every_events`` events the saver folds the index into a
*Lazarus checkpoint* (the same events, as a snapshot): a resume reads the
newest checkpoint and replays only the events after it.

Two backends:

* **In a Lazarus task** (``LazarusSaver.for_task(ctx)``): the thread is the
  task (``thread_id`` = task id). Events go through ``ctx.record`` and
  snapshots through ``ctx.checkpoint``, so they carry the task's epoch: once
  the task moved to another owner, a put raises ``TaskCancelled`` (a zombie
  cannot advance the thread), and the new owner rebuilds the index from
  ``ctx.restored`` (local store or Redis, whichever is newer).
* **Standalone** (``LazarusSaver.local(path)``, or over an open
  ``CheckpointStore``): each thread is a task of the store; its writes carry
  the saver's ``epoch``, so a saver opened with an older epoch than the
  thread's newest raises ``StaleEpoch``. Threads are loaded lazily.

Writes to one thread are serialised (append then apply, under a lock), so the
replayed order is the order the index saw. The sync methods may be called
from worker threads (``graph.invoke``); inside a task they hop onto the
agent's event loop and block until the event is durable.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.base import SerializerProtocol

from node_agent.checkpoint import Checkpoint as LzCheckpoint
from node_agent.checkpoint import CheckpointStore, make_ref

if TYPE_CHECKING:
    from node_agent.sdk import TaskContext

__all__ = ["FOREIGN_THREAD", "LazarusSaver", "ThreadNotOwned"]

_logger = logging.getLogger("lazarus.langgraph")

FOREIGN_THREAD = "thread_id must be the task id inside a Lazarus task"

EVENT_FORMAT = 1
"""Version of the journal event / snapshot layout (``"v"`` in each)."""

DEFAULT_COMPACT_EVERY_EVENTS = 64


class ThreadNotOwned(ValueError):
    """A write names a thread other than the task the saver serves (INVALID_ARGUMENT)."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }


class _Log:
    """Where one thread's events and snapshots go (a task context or a local store)."""

    def append(self, thread_id: str, event: dict[str, Any]) -> int:
        raise NotImplementedError

    async def aappend(self, thread_id: str, event: dict[str, Any]) -> int:
        raise NotImplementedError

    def snapshot(self, thread_id: str, state: dict[str, Any], seq: int) -> None:
        raise NotImplementedError

    async def asnapshot(self, thread_id: str, state: dict[str, Any], seq: int) -> int:
        """Save ``state`` as the thread's checkpoint covering journal seq ``seq``; its seq."""
        raise NotImplementedError

    def load(self, thread_id: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        raise NotImplementedError

    def threads(self) -> list[str]:
        raise NotImplementedError

    def forget(self, thread_id: str) -> None:
        raise NotImplementedError

    async def aforget(self, thread_id: str) -> None:
        raise NotImplementedError


def _encode(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


class _StoreLog(_Log):
    def __init__(self, store: CheckpointStore, epoch: int) -> None:
        self.store = store
        self.epoch = epoch

    def append(self, thread_id: str, event: dict[str, Any]) -> int:
        return self.store.append(thread_id, _encode(event), epoch=self.epoch)

    async def aappend(self, thread_id: str, event: dict[str, Any]) -> int:
        return await self.store.aio.append(thread_id, _encode(event), epoch=self.epoch)

    def _ckpt(self, thread_id: str, state: dict[str, Any], seq: int) -> LzCheckpoint:
        return LzCheckpoint(
            thread_id, self.epoch, _encode(state), covers_journal_seq=seq, label="langgraph"
        )

    def snapshot(self, thread_id: str, state: dict[str, Any], seq: int) -> None:
        self.store.save(self._ckpt(thread_id, state, seq))

    async def asnapshot(self, thread_id: str, state: dict[str, Any], seq: int) -> int:
        if not seq:  # "everything appended so far"
            heads = await asyncio.to_thread(self.store.task_heads)
            seq = next((h.last_journal_seq for h in heads if h.task_id == thread_id), 0)
        return (await self.store.aio.save(self._ckpt(thread_id, state, seq))).seq

    def load(self, thread_id: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        rec = self.store.recover(thread_id)
        state = json.loads(rec.checkpoint.payload) if rec.checkpoint is not None else None
        return state, [json.loads(e.payload) for e in rec.events]

    def threads(self) -> list[str]:
        return [h.task_id for h in self.store.task_heads()]

    def forget(self, thread_id: str) -> None:
        self.store.forget(thread_id)

    async def aforget(self, thread_id: str) -> None:
        await asyncio.to_thread(self.store.forget, thread_id)


class _TaskLog(_Log):
    def __init__(self, ctx: TaskContext, loop: asyncio.AbstractEventLoop) -> None:
        self.ctx = ctx
        self.loop = loop

    def _check(self, thread_id: str) -> None:
        if thread_id != self.ctx.task_id:
            raise ThreadNotOwned(
                f"{FOREIGN_THREAD}: got {thread_id!r}, this task is {self.ctx.task_id!r}"
            )

    def _blocking(self, coro: Any) -> Any:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            coro.close()
            raise RuntimeError(
                "LazarusSaver: sync checkpointer call on the agent's event loop; "
                "use the async graph API (ainvoke / astream) in an async handler"
            )
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def append(self, thread_id: str, event: dict[str, Any]) -> int:
        self._check(thread_id)
        return int(self._blocking(self.ctx.record(event)))

    async def aappend(self, thread_id: str, event: dict[str, Any]) -> int:
        self._check(thread_id)
        return await self.ctx.record(event)

    def snapshot(self, thread_id: str, state: dict[str, Any], seq: int) -> None:
        self._blocking(self.ctx.checkpoint(state, reason="langgraph"))

    async def asnapshot(self, thread_id: str, state: dict[str, Any], seq: int) -> int:
        return await self.ctx.checkpoint(state, reason="langgraph")

    def load(self, thread_id: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        restored = self.ctx.restored
        if thread_id != self.ctx.task_id or restored is None:
            return None, []
        state = restored.state if isinstance(restored.state, dict) else None
        return state, [e for e in restored.events if isinstance(e, dict)]

    def threads(self) -> list[str]:
        return [self.ctx.task_id]

    def forget(self, thread_id: str) -> None:
        self.append(thread_id, {"v": EVENT_FORMAT, "op": "delete"})

    async def aforget(self, thread_id: str) -> None:
        await self.aappend(thread_id, {"v": EVENT_FORMAT, "op": "delete"})


class _Thread:
    """One thread's lock and the count of events since its last snapshot."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.alock: asyncio.Lock | None = None
        self.since_snapshot = 0
        self.snapshot_events = 0


class LazarusSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer whose writes are Lazarus journal events.

    Build one with ``LazarusSaver.for_task(ctx)`` inside a Lazarus task, or
    ``LazarusSaver.local(path)`` / ``LazarusSaver(store=...)`` anywhere else.

    Args:
        store: an open local ``CheckpointStore`` (standalone use); the saver
            does not close it unless it opened it.
        epoch: the fencing epoch of standalone writes (>= 1).
        serde: LangGraph serializer (default: LangGraph's JsonPlusSerializer).
        compact_every_events: fold the thread into a Lazarus checkpoint after
            this many events (0: never).

    Raises:
        ValueError: neither or both of a store and a task context.
    """

    def __init__(
        self,
        store: CheckpointStore | None = None,
        *,
        epoch: int = 1,
        serde: SerializerProtocol | None = None,
        compact_every_events: int = DEFAULT_COMPACT_EVERY_EVENTS,
        _log: _Log | None = None,
        _owns_store: bool = False,
    ) -> None:
        super().__init__(serde=serde)
        if (store is None) == (_log is None):
            raise ValueError("LazarusSaver: give a store (or use for_task / local)")
        if compact_every_events < 0:
            raise ValueError(f"compact_every_events: must be >= 0, got {compact_every_events}")
        self._log: _Log = _log if _log is not None else _StoreLog(store, epoch)  # type: ignore[arg-type]
        self._store = store
        self._owns_store = _owns_store
        self.compact_every_events = compact_every_events
        self._index = InMemorySaver(serde=self.serde)
        self._loaded: set[str] = set()
        self._threads: dict[str, _Thread] = {}
        self._mutex = threading.RLock()
        self._all_loaded = False

    # ------------------------------------------------------------ builders

    @classmethod
    def for_task(
        cls,
        ctx: TaskContext,
        *,
        serde: SerializerProtocol | None = None,
        compact_every_events: int = DEFAULT_COMPACT_EVERY_EVENTS,
    ) -> LazarusSaver:
        """A saver for the thread of the running task ``ctx`` (thread_id = ``ctx.task_id``).

        Call it inside the handler's event loop. Its index starts from
        ``ctx.restored``: what the previous owner made durable.

        Raises:
            RuntimeError: no running event loop.
        """
        loop = asyncio.get_running_loop()
        return cls(
            serde=serde,
            compact_every_events=compact_every_events,
            _log=_TaskLog(ctx, loop),
        )

    @classmethod
    def local(
        cls,
        path: str | Path,
        *,
        durability: str = "group",
        epoch: int = 1,
        serde: SerializerProtocol | None = None,
        compact_every_events: int = DEFAULT_COMPACT_EVERY_EVENTS,
    ) -> LazarusSaver:
        """A standalone saver on a local store in directory ``path`` (created); close it after.

        Args:
            path: the store's directory (one process at a time: ``StoreLocked``).
            durability: "sync", "group" (fsync, shared among concurrent writes) or "none".
            epoch: fencing epoch of this saver's writes.
        """
        store = CheckpointStore(path, durability=durability)
        return cls(
            store,
            epoch=epoch,
            serde=serde,
            compact_every_events=compact_every_events,
            _owns_store=True,
        )

    def close(self) -> None:
        """Close the store when this saver opened it (``local``)."""
        if self._owns_store and self._store is not None:
            self._store.close()

    def __enter__(self) -> LazarusSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ the index

    def _thread(self, thread_id: str) -> _Thread:
        with self._mutex:
            t = self._threads.get(thread_id)
            if t is None:
                t = self._threads[thread_id] = _Thread()
            return t

    def _ensure(self, thread_id: str) -> None:
        if thread_id in self._loaded:
            return
        state, events = self._log.load(thread_id)
        with self._mutex:
            if thread_id in self._loaded:
                return
            if state is not None:
                for ev in state.get("events", []):
                    self._apply(thread_id, ev)
            for ev in events:
                self._apply(thread_id, ev)
            self._loaded.add(thread_id)

    def _ensure_all(self) -> None:
        if self._all_loaded:
            return
        for thread_id in self._log.threads():
            self._ensure(thread_id)
        self._all_loaded = isinstance(self._log, _StoreLog)

    def _apply(self, thread_id: str, ev: Mapping[str, Any]) -> None:
        """Apply one event to the index (the mutex is held)."""
        op = ev.get("op")
        idx = self._index
        if op == "put":
            ns = ev["ns"]
            for ch, ver, typ, data in ev["blobs"]:
                idx.blobs[(thread_id, ns, ch, ver)] = (typ, _unb64(data))
            idx.storage[thread_id][ns][ev["id"]] = (
                (ev["ck"][0], _unb64(ev["ck"][1])),
                (ev["md"][0], _unb64(ev["md"][1])),
                ev["parent"],
            )
        elif op == "blob":
            idx.blobs[(thread_id, ev["ns"], ev["ch"], ev["ver"])] = (ev["t"], _unb64(ev["d"]))
        elif op == "writes":
            outer = (thread_id, ev["ns"], ev["id"])
            existing = idx.writes.get(outer)
            for ch, i, typ, data in ev["w"]:
                inner = (ev["task"], i)
                if i >= 0 and existing and inner in existing:
                    continue
                idx.writes[outer][inner] = (ev["task"], ch, (typ, _unb64(data)), ev["path"])
                existing = idx.writes[outer]
        elif op == "delete":
            idx.delete_thread(thread_id)

    def _due_snapshot(self, thread_id: str, t: _Thread) -> dict[str, Any] | None:
        """The snapshot to write now, if one is due (the mutex is held).

        Due after ``compact_every_events`` events, and not before the journal
        tail is as long as the previous snapshot: a long thread's snapshots
        then cost O(1) per event, amortized, and a resume replays at most
        about twice the thread's size.
        """
        t.since_snapshot += 1
        every = self.compact_every_events
        if not every or t.since_snapshot < max(every, t.snapshot_events):
            return None
        state = self._snapshot_state(thread_id)
        t.since_snapshot = 0
        t.snapshot_events = len(state["events"])
        return state

    def _snapshot_state(self, thread_id: str) -> dict[str, Any]:
        """The thread's index as replayable events (the mutex is held)."""
        idx = self._index
        events: list[dict[str, Any]] = []
        for (tid, ns, ch, ver), (typ, data) in idx.blobs.items():
            if tid == thread_id:
                events.append(
                    {"op": "blob", "ns": ns, "ch": ch, "ver": ver, "t": typ, "d": _b64(data)}
                )
        for ns, by_id in idx.storage.get(thread_id, {}).items():
            for cid, (ck, md, parent) in by_id.items():
                events.append(
                    {
                        "op": "put",
                        "ns": ns,
                        "id": cid,
                        "parent": parent,
                        "ck": [ck[0], _b64(ck[1])],
                        "md": [md[0], _b64(md[1])],
                        "blobs": [],
                    }
                )
        for (tid, ns, cid), inner in idx.writes.items():
            if tid != thread_id:
                continue
            for (task, i), (_, ch, (typ, data), path) in inner.items():
                events.append(
                    {
                        "op": "writes",
                        "ns": ns,
                        "id": cid,
                        "task": task,
                        "path": path,
                        "w": [[ch, i, typ, _b64(data)]],
                    }
                )
        return {"v": EVENT_FORMAT, "thread_id": thread_id, "events": events}

    # ------------------------------------------------------------ events

    def _put_event(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> tuple[str, dict[str, Any], RunnableConfig]:
        thread_id = str(config["configurable"]["thread_id"])
        ns = config["configurable"].get("checkpoint_ns", "")
        c: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = c.pop("channel_values", {})
        blobs = []
        for ch, ver in new_versions.items():
            typ, data = self.serde.dumps_typed(values[ch]) if ch in values else ("empty", b"")
            blobs.append([ch, ver, typ, _b64(data)])
        ck_t, ck_d = self.serde.dumps_typed(c)
        md_t, md_d = self.serde.dumps_typed(get_checkpoint_metadata(config, metadata))
        event = {
            "v": EVENT_FORMAT,
            "op": "put",
            "ns": ns,
            "id": checkpoint["id"],
            "parent": config["configurable"].get("checkpoint_id"),
            "ck": [ck_t, _b64(ck_d)],
            "md": [md_t, _b64(md_d)],
            "blobs": blobs,
        }
        return thread_id, event, _config(thread_id, ns, checkpoint["id"])

    def _writes_event(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> tuple[str, dict[str, Any]]:
        thread_id = str(config["configurable"]["thread_id"])
        w = []
        for i, (ch, value) in enumerate(writes):
            typ, data = self.serde.dumps_typed(value)
            w.append([ch, WRITES_IDX_MAP.get(ch, i), typ, _b64(data)])
        event = {
            "v": EVENT_FORMAT,
            "op": "writes",
            "ns": config["configurable"].get("checkpoint_ns", ""),
            "id": config["configurable"]["checkpoint_id"],
            "task": task_id,
            "path": task_path,
            "w": w,
        }
        return thread_id, event

    def _write(self, thread_id: str, event: dict[str, Any]) -> None:
        self._ensure(thread_id)
        t = self._thread(thread_id)
        with t.lock:
            seq = self._log.append(thread_id, event)
            with self._mutex:
                self._apply(thread_id, event)
                state = self._due_snapshot(thread_id, t)
            if state is not None:
                try:
                    self._log.snapshot(thread_id, state, seq)
                except ValueError as exc:  # over the payload limit: keep the journal
                    _logger.warning("thread %s: no compaction checkpoint: %s", thread_id, exc)

    async def _awrite(self, thread_id: str, event: dict[str, Any]) -> None:
        await self._aensure(thread_id)
        t = self._thread(thread_id)
        if t.alock is None:
            t.alock = asyncio.Lock()
        async with t.alock:
            seq = await self._log.aappend(thread_id, event)
            with self._mutex:
                self._apply(thread_id, event)
                state = self._due_snapshot(thread_id, t)
            if state is not None:
                try:
                    await self._log.asnapshot(thread_id, state, seq)
                except ValueError as exc:  # over the payload limit: keep the journal
                    _logger.warning("thread %s: no compaction checkpoint: %s", thread_id, exc)

    async def _aensure(self, thread_id: str) -> None:
        if thread_id not in self._loaded:
            if isinstance(self._log, _StoreLog):
                await asyncio.to_thread(self._ensure, thread_id)
            else:
                self._ensure(thread_id)

    async def _aensure_all(self) -> None:
        if not self._all_loaded:
            if isinstance(self._log, _StoreLog):
                await asyncio.to_thread(self._ensure_all)
            else:
                self._ensure_all()

    async def compact(self, thread_id: str, *, extra: Mapping[str, Any] | None = None) -> str:
        """``compact_state``, returning the ref only."""
        ref, _state = await self.compact_state(thread_id, extra=extra)
        return ref

    async def compact_state(
        self, thread_id: str, *, extra: Mapping[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Fold the thread into a Lazarus checkpoint now (e.g. before waiting for input).

        Args:
            thread_id: the thread.
            extra: more top-level keys for the checkpoint's JSON state (kept out
                of the thread; ``langgraph_task`` notes interrupts there).

        Returns:
            The Lazarus checkpoint's ref (``"<thread>@<seq>"``, what ForkTask takes)
            and its JSON state (the thread's fold plus ``extra``).

        Raises:
            TaskCancelled: inside a task that no longer runs here.
            StaleEpoch: standalone, a newer epoch wrote the thread.
        """
        await self._aensure(thread_id)
        t = self._thread(thread_id)
        if t.alock is None:
            t.alock = asyncio.Lock()
        async with t.alock:
            with self._mutex:
                state = {**(extra or {}), **self._snapshot_state(thread_id)}
            seq = await self._log.asnapshot(thread_id, state, 0)
            t.since_snapshot = 0
            t.snapshot_events = len(state["events"])
        return make_ref(thread_id, seq), state

    # ------------------------------------------------------------ sync API

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (or the thread's newest), with its pending writes.

        Returns:
            A ``CheckpointTuple``, or None when the thread / checkpoint is unknown.
        """
        self._ensure(str(config["configurable"]["thread_id"]))
        with self._mutex:
            return self._index.get_tuple(self._norm(config))

    @staticmethod
    def _norm(config: RunnableConfig) -> RunnableConfig:
        conf = dict(config.get("configurable", {}))
        conf["thread_id"] = str(conf["thread_id"])
        return {**config, "configurable": conf}

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first, by thread / namespace / metadata filter / before / limit."""
        if config is not None:
            self._ensure(str(config["configurable"]["thread_id"]))
            config = self._norm(config)
        else:
            self._ensure_all()
        with self._mutex:
            items = list(self._index.list(config, filter=filter, before=before, limit=limit))
        yield from items

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint; returns once its journal event is durable.

        Returns:
            The config naming the stored checkpoint.

        Raises:
            TaskCancelled: inside a task that no longer owns the thread (fenced).
            StaleEpoch: standalone, the thread has a newer epoch (FAILED_PRECONDITION).
            ThreadNotOwned: inside a task, another thread (INVALID_ARGUMENT).
        """
        thread_id, event, out = self._put_event(config, checkpoint, metadata, new_versions)
        self._write(thread_id, event)
        return out

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store one task's pending writes for the checkpoint ``config`` names (as ``put``)."""
        thread_id, event = self._writes_event(config, writes, task_id, task_path)
        self._write(thread_id, event)

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint and write of the thread (durable when it returns)."""
        tid = str(thread_id)
        self._ensure(tid)
        t = self._thread(tid)
        with t.lock:
            self._log.forget(tid)
            with self._mutex:
                self._index.delete_thread(tid)

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """As ``InMemorySaver.get_delta_channel_history`` (walks the parent chain once)."""
        self._ensure(str(config["configurable"]["thread_id"]))
        with self._mutex:
            return self._index.get_delta_channel_history(
                config=self._norm(config), channels=channels
            )

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Monotonic string versions, as ``InMemorySaver``."""
        return self._index.get_next_version(current, channel)

    # ------------------------------------------------------------ async API

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """As ``get_tuple``."""
        await self._aensure(str(config["configurable"]["thread_id"]))
        with self._mutex:
            return self._index.get_tuple(self._norm(config))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """As ``list``."""
        if config is not None:
            await self._aensure(str(config["configurable"]["thread_id"]))
            config = self._norm(config)
        else:
            await self._aensure_all()
        with self._mutex:
            items = list(self._index.list(config, filter=filter, before=before, limit=limit))
        for item in items:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """As ``put``."""
        thread_id, event, out = self._put_event(config, checkpoint, metadata, new_versions)
        await self._awrite(thread_id, event)
        return out

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """As ``put_writes``."""
        thread_id, event = self._writes_event(config, writes, task_id, task_path)
        await self._awrite(thread_id, event)

    async def adelete_thread(self, thread_id: str) -> None:
        """As ``delete_thread``."""
        tid = str(thread_id)
        await self._aensure(tid)
        t = self._thread(tid)
        if t.alock is None:
            t.alock = asyncio.Lock()
        async with t.alock:
            await self._log.aforget(tid)
            with self._mutex:
                self._index.delete_thread(tid)

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """As ``get_delta_channel_history``."""
        await self._aensure(str(config["configurable"]["thread_id"]))
        with self._mutex:
            return self._index.get_delta_channel_history(
                config=self._norm(config), channels=channels
            )
