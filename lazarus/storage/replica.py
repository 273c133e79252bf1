"""The Redis layout of replicated checkpoints and journals, and its fenced client.

This is the one home of the task keys in Redis and of the Lua script that
writes them; the node agent's :class:`node_agent.replication.Replicator` ships
through :class:`RedisCheckpointReplica`, and the coordinator reads and seeds
through it (ForkTask, GetCheckpoint) without importing the node agent.

Layout
------
Every key of a task shares the hash tag ``{<task_id>}`` so Redis Cluster keeps
them in one slot (DESIGN.md §3)::

    <prefix>:{T}:head     hash: epoch (the fence), ckpt_seq, ckpt_epoch, covers,
                          journal_seq, node_id, updated_ms
    <prefix>:{T}:ckpt     string: the newest CheckpointRecord, serialized
    <prefix>:{T}:journal  sorted set: JournalEventRecord bytes scored by seq,
                          only events after head.covers
    <prefix>:{T}:jepoch   hash: seq -> epoch of the event stored at that seq

One Lua script (:data:`REPLICATE_LUA`, run with EVALSHA through redis-py's
``register_script``) makes each write atomic per task. The epoch is a fencing
token as in Kleppmann, "How to do distributed locking" (2016): a write whose
epoch is below ``head.epoch`` changes nothing and answers STALE. Writes are
idempotent per (epoch, seq), so a batch whose reply was lost can be sent again.
``claim`` raises the fence before a new owner reads the resume state, so an
old owner's later writes are refused (no race between read and first write).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis
import redis.asyncio
import redis.exceptions

from lazarus.storage.errors import CorruptedRecord, InvalidArgument
from lazarus.storage.keys import DEFAULT_PREFIX, generation_key, task_keys
from lazarus.v1 import records_pb2

__all__ = [
    "DEFAULT_PREFIX",
    "MAX_SAFE_INT",
    "REPLICATE_LUA",
    "RETRYABLE_ERRORS",
    "BlockingCheckpointReplica",
    "CheckpointReplica",
    "ClaimBatcher",
    "Outcome",
    "RedisCheckpointReplica",
    "RemoteState",
    "ReplicationItem",
    "ReplicationResult",
    "absorbs",
    "task_keys",
    "write_args",
]

_log = logging.getLogger("lazarus.replication")

MAX_SAFE_INT = 2**53 - 1
"""Largest epoch / seq accepted: Lua numbers and zset scores are doubles."""

_MAX_TASK_ID_BYTES = 256

RETRYABLE_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.NoScriptError,
    redis.exceptions.ReadOnlyError,
    ConnectionError,
    TimeoutError,
)
"""Errors after which a batch is kept and sent again (never a lost item)."""


# ---------------------------------------------------------------- Lua

REPLICATE_LUA = r"""
-- KEYS: 1 head (hash), 2 ckpt (string), 3 journal (zset seq -> record),
--       4 jepoch (hash seq -> epoch)
-- ARGV: op ('write' | 'claim_load'), epoch, node_id, now_ms, owner,
--       [write] n_events, n x (seq, epoch, record), has_ckpt ('0'|'1'),
--               [has_ckpt] ckpt_seq, ckpt_epoch, covers, record
-- Numbers arrive as canonical decimal strings and are stored as given (no
-- tostring of a double). Reply: {status, current_epoch} as strings; 'claim_load'
-- (not STALE) raises the fence and appends the state read after it, in the same
-- atomic call: HGETALL head (flat), GET ckpt (false when none), ZRANGE journal 0 -1.
-- 'write' (not STALE) appends '1' when the item's events start past a hole in
-- the stored journal that the item does not cover (Redis lost data), else '0'.
-- The fence is (epoch, owner): owner is the writing process's incarnation. A
-- lower epoch is STALE; so is an equal epoch from another owner once one is
-- recorded (DESIGN.md section 4: one process per epoch).
local head, ckpt, journal, jepoch = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local op, epoch_s, node_id, now_ms, owner = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local epoch = tonumber(epoch_s)
local head_epoch_s = redis.call('HGET', head, 'epoch')
local head_epoch = tonumber(head_epoch_s or '0')
if epoch < head_epoch then
  return {'STALE', head_epoch_s}
end
local head_owner = redis.call('HGET', head, 'owner') or ''
if epoch == head_epoch and head_owner ~= '' and owner ~= head_owner then
  return {'STALE', head_epoch_s}
end
if owner ~= '' and (epoch > head_epoch or head_owner == '') then
  redis.call('HSET', head, 'owner', owner)
elseif epoch > head_epoch then
  redis.call('HDEL', head, 'owner')
end
local raised = epoch > head_epoch

if op == 'claim_load' then
  local status = 'DUPLICATE'
  if raised then
    -- Remember where the new epoch's lineage starts: a fenced owner's records
    -- after this point are divergent (kept as a fork, DESIGN.md section 7).
    local base = (redis.call('HGET', head, 'journal_seq') or '0') .. ',' ..
                 (redis.call('HGET', head, 'ckpt_seq') or '0')
    redis.call('HSET', head, 'epoch', epoch_s, 'node_id', node_id, 'updated_ms', now_ms,
               'base:' .. epoch_s, base)
    status = 'OK'
  end
  return {status, epoch_s, redis.call('HGETALL', head), redis.call('GET', ckpt),
          redis.call('ZRANGE', journal, 0, -1)}
end
if op ~= 'write' then
  return redis.error_reply('unknown op ' .. tostring(op))
end

local covers = tonumber(redis.call('HGET', head, 'covers') or '0')
local journal_seq_s = redis.call('HGET', head, 'journal_seq') or '0'
local journal_seq = tonumber(journal_seq_s)
local changed = false
local n = tonumber(ARGV[6])
-- A gap: the item's first event is past the journal head + 1 and no checkpoint
-- in the item covers the hole. Items of a task are written in order, so Redis
-- lost what came before (a restart without persistence, a lagging replica's
-- failover); the writer re-ships its local state (node_agent/core/redisloss.py).
-- Reported by the first write past the hole only (the events are stored, so
-- the head moves on); the re-ship is kept and retried until Redis takes it.
local gap = '0'
if n > 0 then
  local hole_end = tonumber(ARGV[7]) - 1
  local c_at = 7 + 3 * n
  local covered = ARGV[c_at] == '1' and tonumber(ARGV[c_at + 3]) >= hole_end
  if hole_end > journal_seq and not covered then
    gap = '1'
  end
end
local i = 7
for _ = 1, n do
  local seq_s, ev_epoch_s, rec = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  i = i + 3
  local seq, ev_epoch = tonumber(seq_s), tonumber(ev_epoch_s)
  if seq > covers then
    local stored = redis.call('HGET', jepoch, seq_s)
    if (not stored) or tonumber(stored) < ev_epoch then
      if stored then
        redis.call('ZREMRANGEBYSCORE', journal, seq_s, seq_s)
      end
      redis.call('ZADD', journal, seq_s, rec)
      redis.call('HSET', jepoch, seq_s, ev_epoch_s)
      if seq > journal_seq then
        journal_seq, journal_seq_s = seq, seq_s
      end
      changed = true
    end
  end
end

if ARGV[i] == '1' then
  local c_seq_s, c_epoch_s, c_covers_s, c_rec = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  local c_seq, c_epoch, c_covers = tonumber(c_seq_s), tonumber(c_epoch_s), tonumber(c_covers_s)
  local s_seq = tonumber(redis.call('HGET', head, 'ckpt_seq') or '0')
  local s_epoch = tonumber(redis.call('HGET', head, 'ckpt_epoch') or '0')
  if c_epoch > s_epoch or (c_epoch == s_epoch and c_seq > s_seq) then
    redis.call('SET', ckpt, c_rec)
    redis.call('ZREMRANGEBYSCORE', journal, '-inf', c_covers_s)
    local fields = redis.call('HKEYS', jepoch)
    for _, f in ipairs(fields) do
      if tonumber(f) <= c_covers then
        redis.call('HDEL', jepoch, f)
      end
    end
    redis.call('HSET', head, 'ckpt_seq', c_seq_s, 'ckpt_epoch', c_epoch_s, 'covers', c_covers_s)
    if c_covers > journal_seq then
      journal_seq, journal_seq_s = c_covers, c_covers_s
    end
    changed = true
  end
end

if changed or raised then
  redis.call('HSET', head, 'epoch', epoch_s, 'journal_seq', journal_seq_s,
             'node_id', node_id, 'updated_ms', now_ms)
end
if changed then
  return {'OK', epoch_s, gap}
end
return {'DUPLICATE', epoch_s, gap}
"""


# ---------------------------------------------------------------- values


class Outcome(enum.Enum):
    """What a fenced write (or claim) did.

    OK: something new was stored (or the fence was raised by ``claim``).
    DUPLICATE: every part was already stored at that (epoch, seq); nothing changed
        but possibly the fence.
    STALE: the writer's epoch is below the stored fence; nothing was written.
    """

    OK = "OK"
    DUPLICATE = "DUPLICATE"
    STALE = "STALE"


@dataclass(frozen=True, slots=True)
class ReplicationResult:
    """Reply of one write or claim.

    Attributes:
        outcome: see :class:`Outcome`.
        current_epoch: the task's fence after the call (the higher stored epoch on STALE).
        gap: a write whose first journal event came after a hole in Redis's
            journal that it did not cover: Redis lost records acknowledged
            before (restart without persistence, failover to a lagging
            replica); the writer should re-ship its local state.
    """

    outcome: Outcome
    current_epoch: int
    gap: bool = False


def _check_id(name: str, value: str) -> None:
    if not value:
        raise InvalidArgument(name, "must not be empty")
    if len(value.encode("utf-8")) > _MAX_TASK_ID_BYTES:
        raise InvalidArgument(name, f"longer than {_MAX_TASK_ID_BYTES} UTF-8 bytes")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        raise InvalidArgument(name, "contains a control character")


def _check_int(name: str, value: int, low: int) -> None:
    if not low <= value <= MAX_SAFE_INT:
        raise InvalidArgument(name, f"{value} is outside {low}..{MAX_SAFE_INT}")


@dataclass(frozen=True, slots=True)
class ReplicationItem:
    """One unit of replication for one task: journal events, then maybe a checkpoint.

    Validated on construction; the records are not copied, do not mutate them
    after submitting.

    Attributes:
        task_id: the task; 1..256 UTF-8 bytes, no control characters.
        epoch: the writer's epoch (fencing token), 1..2**53-1.
        node_id: the writing node agent; non-empty.
        events: journal events in strictly increasing ``seq`` (>= 1), each with
            ``task_id`` equal to this item's and ``1 <= epoch <= self.epoch``.
        checkpoint: the checkpoint covering journal events up to its
            ``covers_journal_seq``, or None; same constraints on task_id/epoch,
            ``seq >= 1``.

    Raises:
        InvalidArgument: (a ValueError) naming the offending field, e.g.
            ``"events[2].seq"``; also when both events and checkpoint are empty.
    """

    task_id: str
    epoch: int
    node_id: str
    events: tuple[records_pb2.JournalEventRecord, ...] = ()
    checkpoint: records_pb2.CheckpointRecord | None = None

    def __post_init__(self) -> None:
        _check_id("task_id", self.task_id)
        _check_id("node_id", self.node_id)
        _check_int("epoch", self.epoch, 1)
        if not self.events and self.checkpoint is None:
            raise InvalidArgument("events", "nothing to replicate (no events, no checkpoint)")
        previous = 0
        for k, ev in enumerate(self.events):
            name = f"events[{k}]"
            if ev.task_id != self.task_id:
                raise InvalidArgument(f"{name}.task_id", f"{ev.task_id!r} != {self.task_id!r}")
            _check_int(f"{name}.seq", ev.seq, 1)
            _check_int(f"{name}.epoch", ev.epoch, 1)
            if ev.epoch > self.epoch:
                raise InvalidArgument(f"{name}.epoch", f"{ev.epoch} > writer epoch {self.epoch}")
            if ev.seq <= previous:
                raise InvalidArgument(f"{name}.seq", f"{ev.seq} is not after {previous}")
            previous = ev.seq
        c = self.checkpoint
        if c is not None:
            if c.task_id != self.task_id:
                raise InvalidArgument("checkpoint.task_id", f"{c.task_id!r} != {self.task_id!r}")
            _check_int("checkpoint.seq", c.seq, 1)
            _check_int("checkpoint.epoch", c.epoch, 1)
            _check_int("checkpoint.covers_journal_seq", c.covers_journal_seq, 0)
            if c.epoch > self.epoch:
                raise InvalidArgument("checkpoint.epoch", f"{c.epoch} > writer epoch {self.epoch}")

    @property
    def records(self) -> int:
        """Number of records carried: events plus one for a checkpoint."""
        return len(self.events) + (1 if self.checkpoint is not None else 0)


@dataclass(frozen=True, slots=True)
class RemoteState:
    """What Redis holds of a task (read atomically with MULTI/EXEC).

    Attributes:
        task_id: the task.
        epoch: the fence: highest epoch that claimed or wrote the task.
        ckpt_seq: seq of the newest checkpoint, 0 when none.
        ckpt_epoch: epoch of the newest checkpoint, 0 when none.
        covers_journal_seq: newest checkpoint's covers_journal_seq, 0 when none.
        journal_seq: highest journal seq replicated (stored or covered), 0 when none.
        node_id: last writer (or claimer).
        updated_unix_ms: time of the last change, writer's wall clock, Unix ms.
        checkpoint: the newest checkpoint, or None.
        events: journal events after ``covers_journal_seq``, in seq order. An
            event's epoch may be lower than a preceding one's when a new owner
            overwrote only part of a fenced owner's tail.
        bases: epoch -> (journal seq, checkpoint seq): where each epoch that
            claimed the task started (``RedisCheckpointReplica.lineage_bases``),
            read with the rest; empty when none is recorded.
    """

    task_id: str
    epoch: int
    ckpt_seq: int
    ckpt_epoch: int
    covers_journal_seq: int
    journal_seq: int
    node_id: str
    updated_unix_ms: int
    checkpoint: records_pb2.CheckpointRecord | None
    events: tuple[records_pb2.JournalEventRecord, ...] = field(default=())
    bases: Mapping[int, tuple[int, int]] = field(default_factory=dict, compare=False)


# ---------------------------------------------------------------- adapter


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _parse_reply(reply: Any) -> ReplicationResult:
    if not isinstance(reply, list) or len(reply) not in (2, 3):
        raise redis.exceptions.ResponseError(f"unexpected replication script reply {reply!r}")
    gap = len(reply) == 3 and _text(reply[2]) == "1"
    return ReplicationResult(Outcome(_text(reply[0])), int(_text(reply[1])), gap)


def write_args(item: ReplicationItem, *, owner: str, now_ms: int) -> list[str | bytes]:
    """ARGV of :data:`REPLICATE_LUA`'s ``write`` for ``item`` (events, then the checkpoint).

    Args:
        item: what to write (validated at construction).
        owner: the writing process's incarnation, part of the fence ("" for none).
        now_ms: the writer's wall clock for ``head.updated_ms``, Unix ms.
    """
    args: list[str | bytes] = [
        "write",
        str(item.epoch),
        item.node_id,
        str(now_ms),
        owner,
        str(len(item.events)),
    ]
    for ev in item.events:
        args += [str(ev.seq), str(ev.epoch), ev.SerializeToString(deterministic=True)]
    c = item.checkpoint
    if c is None:
        args.append("0")
    else:
        args += [
            "1",
            str(c.seq),
            str(c.epoch),
            str(c.covers_journal_seq),
            c.SerializeToString(deterministic=True),
        ]
    return args


class CheckpointReplica(Protocol):
    """What :class:`Replicator` needs of a replica (tests pass a fake)."""

    async def write_many(
        self, items: Sequence[ReplicationItem]
    ) -> list[ReplicationResult | Exception]:
        """Write items in order in one round trip; see :meth:`RedisCheckpointReplica.write_many`."""
        ...


class RedisCheckpointReplica:
    """Fenced, idempotent writes of task checkpoints and journal events to Redis.

    Atomicity per call comes from Redis running a Lua script (EVALSHA) as one
    command; fencing follows Kleppmann's fencing tokens with the task's epoch.
    A NOSCRIPT reply (script cache emptied by a restart) is handled by
    redis-py's script object, which loads the script and retries.

    Args:
        client: a ``redis.asyncio.Redis`` (bytes replies, ``decode_responses=False``).
        prefix: key prefix, default ``"lazarus"``.
        now_ms: wall clock for ``head.updated_ms``, Unix ms.
        owner: the writing process's incarnation, part of the fence: at an
            equal epoch, writes and claims of another owner are STALE. "" for
            tools that only read or seed a task no process owns yet.
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        *,
        prefix: str = DEFAULT_PREFIX,
        now_ms: Callable[[], int] = _wall_ms,
        owner: str = "",
    ) -> None:
        if not prefix:
            raise InvalidArgument("prefix", "must not be empty")
        self._owner = owner
        self._client = client
        self._prefix = prefix
        self._now_ms = now_ms
        self._script = client.register_script(REPLICATE_LUA)

    @property
    def prefix(self) -> str:
        """The key prefix."""
        return self._prefix

    def keys(self, task_id: str) -> tuple[str, str, str, str]:
        """``(head, ckpt, journal, jepoch)`` key names of a task."""
        return task_keys(task_id, self._prefix)

    def _write_args(self, item: ReplicationItem) -> list[str | bytes]:
        return write_args(item, owner=self._owner, now_ms=self._now_ms())

    async def _evalsha_many(
        self, calls: Sequence[tuple[Sequence[str], Sequence[str | bytes]]]
    ) -> list[Any]:
        """Run the script once per ``(keys, args)`` call in one pipelined round trip.

        The calls go as bare ``EVALSHA`` commands. A pipeline that runs a
        registered ``Script`` makes redis-py send ``SCRIPT EXISTS`` first, a
        second round trip on every batch; here the server's answer decides
        instead: the calls that got ``NOSCRIPT`` (Redis restarted, or ran
        ``SCRIPT FLUSH``) are sent once more, in order, after one
        ``SCRIPT LOAD``. The script is idempotent per record (a record already
        stored is skipped), so a call sent again is harmless.

        Returns:
            One reply per call, in order, or the ``ResponseError`` it got.

        Raises:
            redis.exceptions.ConnectionError, redis.exceptions.TimeoutError:
                the round trip as a whole failed; any prefix of it may have applied.
        """
        sha = self._script.sha
        replies = await self._pipeline(sha, calls)
        missing = [
            i for i, r in enumerate(replies) if isinstance(r, redis.exceptions.NoScriptError)
        ]
        if missing:
            await self._client.script_load(REPLICATE_LUA)
            again = await self._pipeline(sha, [calls[i] for i in missing])
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        return replies

    async def _pipeline(
        self, sha: str, calls: Sequence[tuple[Sequence[str], Sequence[str | bytes]]]
    ) -> list[Any]:
        async with self._client.pipeline(transaction=False) as pipe:
            for keys, args in calls:
                pipe.evalsha(sha, len(keys), *keys, *args)
            return list(await pipe.execute(raise_on_error=False))

    async def write(self, item: ReplicationItem) -> ReplicationResult:
        """Write one item atomically (events first, then the checkpoint).

        Lua semantics: epoch below the fence → nothing written, STALE. An event
        already stored at its seq with the same (or a newer) epoch is skipped;
        one stored at an older epoch is overwritten; one at or below the stored
        covers is skipped. A checkpoint not newer by (epoch, seq) than the stored
        one is skipped; a newer one replaces it and deletes events <= its covers.

        Returns:
            OK when something new was stored, DUPLICATE otherwise, or STALE.

        Raises:
            redis.exceptions.ConnectionError, redis.exceptions.TimeoutError:
                Redis unreachable; the write may or may not have happened (safe to repeat).
            redis.exceptions.ResponseError: the script failed.
        """
        reply = await self._script(keys=self.keys(item.task_id), args=self._write_args(item))
        return _parse_reply(reply)

    async def write_many(
        self, items: Sequence[ReplicationItem]
    ) -> list[ReplicationResult | Exception]:
        """Write items in one pipelined round trip (not a transaction; one EVALSHA each).

        A server that lacks the script (after a restart) answers NOSCRIPT; it
        is loaded and those items are sent again (see :meth:`_evalsha_many`).
        Commands run in order on one connection, so items of one task apply in
        the given order.

        Returns:
            One entry per item: its result, or the ``ResponseError`` it got
            (e.g. ``NoScriptError`` if the cache was flushed mid-batch).

        Raises:
            redis.exceptions.ConnectionError, redis.exceptions.TimeoutError:
                the batch as a whole failed; any prefix of it may have been applied.
        """
        if not items:
            return []
        replies = await self._evalsha_many(
            [(self.keys(item.task_id), self._write_args(item)) for item in items]
        )
        out: list[ReplicationResult | Exception] = []
        for reply in replies:
            if isinstance(reply, Exception):
                out.append(reply)
            else:
                try:
                    out.append(_parse_reply(reply))
                except (ValueError, redis.exceptions.ResponseError) as e:
                    out.append(e)
        return out

    async def generation(self) -> str:
        """The marker of the Redis dataset, set to a fresh random id when absent.

        One ``SET <prefix>:generation <uuid4> NX`` and a ``GET`` in a MULTI: the
        first caller after Redis started empty creates the marker, every later
        caller reads the same one. A change between two reads means the data
        Redis held before is gone (see :func:`node_agent.core.redisloss.generation_reset`).

        Returns:
            The marker (32 hex digits).

        Raises:
            redis.exceptions.RedisError: Redis unreachable or failing.
        """
        key = generation_key(self._prefix)
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.set(key, uuid.uuid4().hex, nx=True)
            pipe.get(key)
            _set, value = await pipe.execute()
        return _text(value)

    async def claim(self, task_id: str, epoch: int, node_id: str = "") -> ReplicationResult:
        """Raise a task's fence to ``epoch`` before reading its resume state.

        Args:
            task_id: the task.
            epoch: the new owner's epoch, >= 1.
            node_id: the claiming node, recorded as head.node_id when the fence rises.

        Returns:
            OK when the fence rose, DUPLICATE when it already was ``epoch``,
            STALE (with the higher fence) when ``epoch`` is lower.

        Raises:
            InvalidArgument: empty task_id, epoch < 1.
            CorruptedRecord: a stored record of the task does not parse.
            redis.exceptions.RedisError: as for :meth:`write`.
        """
        (reply,) = await self.claim_load_many([(task_id, epoch, node_id)])
        if isinstance(reply, Exception):
            raise reply
        return reply[0]

    async def claim_load_many(
        self, requests: Sequence[tuple[str, int, str]]
    ) -> list[tuple[ReplicationResult, RemoteState | None] | Exception]:
        """:meth:`claim` then :meth:`load` for many tasks, in one round trip.

        Each task's claim and read are one script call, so atomic (nothing can
        land between them); the calls go in one non-transactional pipeline, so
        Redis Cluster splits them by slot like the replicator's writes.

        Args:
            requests: ``(task_id, epoch, node_id)`` per task, validated as in :meth:`claim`.

        Returns:
            Per request, in order: the claim's result and the state read after
            it (None when Redis holds nothing of the task, or on STALE), or the
            exception of that task alone (e.g. :class:`CorruptedRecord`).

        Raises:
            InvalidArgument: a malformed request (nothing is sent).
            redis.exceptions.RedisError: Redis unreachable or failing as a whole.
        """
        for task_id, epoch, _node in requests:
            _check_id("task_id", task_id)
            _check_int("epoch", epoch, 1)
        now = str(self._now_ms())
        replies = await self._evalsha_many(
            [
                (self.keys(task_id), ["claim_load", str(epoch), node_id, now, self._owner])
                for task_id, epoch, node_id in requests
            ]
        )
        out: list[tuple[ReplicationResult, RemoteState | None] | Exception] = []
        for (task_id, _epoch, _node), reply in zip(requests, replies, strict=True):
            if isinstance(reply, Exception):
                out.append(reply)
                continue
            try:
                result = _parse_reply(reply[:2] if isinstance(reply, list) else reply)
                state = None
                if result.outcome is not Outcome.STALE:
                    if len(reply) != 5:
                        raise redis.exceptions.ResponseError(
                            f"unexpected claim_load reply of {len(reply)} parts"
                        )
                    head_flat = reply[2]
                    head_raw = dict(zip(head_flat[0::2], head_flat[1::2], strict=True))
                    state = _remote_state(task_id, head_raw, reply[3], reply[4])
                out.append((result, state))
            except (ValueError, redis.exceptions.ResponseError, CorruptedRecord) as exc:
                out.append(exc)
        return out

    async def lineage_bases(self, task_id: str) -> dict[int, tuple[int, int]]:
        """Where each claimed epoch's lineage started: epoch -> (journal seq, checkpoint seq).

        ``claim`` records Redis's journal and checkpoint heads at the moment an
        epoch takes the task over. A fenced owner at an older epoch made
        divergent progress exactly where its local records go beyond the base
        of the next epoch that claimed the task.

        Raises:
            redis.exceptions.RedisError: Redis unreachable or failing.
        """
        _check_id("task_id", task_id)
        raw = await self._client.hgetall(self.keys(task_id)[0])
        return _bases({_text(k): _text(v) for k, v in raw.items()})

    async def load(self, task_id: str) -> RemoteState | None:
        """Read the newest checkpoint and the journal events after it, atomically.

        Returns:
            The state, or None when Redis holds nothing of the task.

        Raises:
            InvalidArgument: empty task_id.
            CorruptedRecord: a stored record does not parse (maps to DATA_LOSS).
            redis.exceptions.RedisError: Redis unreachable or failed.
        """
        _check_id("task_id", task_id)
        head_key, ckpt_key, journal_key, _ = self.keys(task_id)
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.hgetall(head_key)
            pipe.get(ckpt_key)
            pipe.zrange(journal_key, 0, -1)
            head_raw, ckpt_raw, journal_raw = await pipe.execute()
        return _remote_state(task_id, head_raw, ckpt_raw, journal_raw)


class BlockingCheckpointReplica:
    """The ``write`` of :class:`RedisCheckpointReplica` for a blocking caller.

    A worker process (``isolation="process"``, ``node_agent.isolation``) writes
    a ``replicated`` task's checkpoint to Redis itself through this, with the
    same script, keys and fence (the agent's incarnation as ``owner``), instead
    of asking the agent to. It does not retry: a caller that gets an error
    hands the write to the agent's :class:`node_agent.replication.Replicator`,
    which retries with backoff and keeps order.

    Args:
        client: a ``redis.Redis`` (bytes replies); its timeouts bound ``write``.
        prefix: key prefix, default ``"lazarus"``.
        owner: the writing process's incarnation (see :class:`RedisCheckpointReplica`).
        now_ms: wall clock for ``head.updated_ms``, Unix ms.
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        prefix: str = DEFAULT_PREFIX,
        owner: str = "",
        now_ms: Callable[[], int] = _wall_ms,
    ) -> None:
        if not prefix:
            raise InvalidArgument("prefix", "must not be empty")
        self._client = client
        self._prefix = prefix
        self._owner = owner
        self._now_ms = now_ms
        self._script = client.register_script(REPLICATE_LUA)

    def write(self, item: ReplicationItem) -> ReplicationResult:
        """Write one item atomically; see :meth:`RedisCheckpointReplica.write`.

        A NOSCRIPT reply loads the script and sends the call once more (redis-py's
        ``Script``; the script is idempotent per record).

        Raises:
            redis.exceptions.ConnectionError, redis.exceptions.TimeoutError:
                Redis unreachable; the write may or may not have happened.
            redis.exceptions.ResponseError: the script failed.
        """
        reply = self._script(
            keys=task_keys(item.task_id, self._prefix),
            args=write_args(item, owner=self._owner, now_ms=self._now_ms()),
        )
        return _parse_reply(reply)

    def close(self) -> None:
        """Close the client's connections."""
        self._client.close()


def _bases(head: dict[str, str]) -> dict[int, tuple[int, int]]:
    """The ``base:<epoch>`` fields of a task's head hash: epoch -> (journal seq, checkpoint seq)."""
    out: dict[int, tuple[int, int]] = {}
    for name, text in head.items():
        if not name.startswith("base:"):
            continue
        journal, _, ckpt = text.partition(",")
        with contextlib.suppress(ValueError):
            out[int(name[5:])] = (int(journal), int(ckpt or 0))
    return out


def _remote_state(
    task_id: str, head_raw: dict[Any, Any], ckpt_raw: bytes | None, journal_raw: list[bytes]
) -> RemoteState | None:
    """Parse a task's head hash, checkpoint and journal as read from Redis."""
    if not head_raw and ckpt_raw is None and not journal_raw:
        return None
    head = {_text(k): _text(v) for k, v in head_raw.items()}

    def num(name: str) -> int:
        return int(head.get(name, "0") or "0")

    checkpoint: records_pb2.CheckpointRecord | None = None
    if ckpt_raw is not None:
        checkpoint = records_pb2.CheckpointRecord()
        try:
            checkpoint.ParseFromString(ckpt_raw)
        except Exception as e:
            raise CorruptedRecord(f"replicated checkpoint of {task_id!r}", str(e)) from e
    events: list[records_pb2.JournalEventRecord] = []
    for k, raw in enumerate(journal_raw):
        ev = records_pb2.JournalEventRecord()
        try:
            ev.ParseFromString(raw)
        except Exception as e:
            raise CorruptedRecord(f"replicated journal event {k} of {task_id!r}", str(e)) from e
        events.append(ev)
    return RemoteState(
        task_id=task_id,
        epoch=num("epoch"),
        ckpt_seq=num("ckpt_seq"),
        ckpt_epoch=num("ckpt_epoch"),
        covers_journal_seq=num("covers"),
        journal_seq=num("journal_seq"),
        node_id=head.get("node_id", ""),
        updated_unix_ms=num("updated_ms"),
        checkpoint=checkpoint,
        events=tuple(events),
        bases=_bases(head),
    )


# ---------------------------------------------------------------- coalescing


def absorbs(newer: ReplicationItem, older: ReplicationItem) -> bool:
    """Whether ``newer`` (queued later) makes ``older`` redundant, so ``older`` can merge into it.

    True only when ``newer`` carries a checkpoint, both are of the same task
    and writer epoch, every event of ``older`` has ``seq <= covers_journal_seq``
    of that checkpoint (Redis would delete them when it lands anyway) and
    ``older``'s checkpoint, if any, is older by (epoch, seq). So merging never
    drops an event the checkpoint does not cover. The caller merges only a
    contiguous suffix of a task's queue, which keeps Redis a consistent prefix.
    """
    c = newer.checkpoint
    if c is None or older.task_id != newer.task_id or older.epoch != newer.epoch:
        return False
    if any(ev.seq > c.covers_journal_seq for ev in older.events):
        return False
    o = older.checkpoint
    return o is None or (o.epoch, o.seq) < (c.epoch, c.seq)


# ---------------------------------------------------------------- replicator


_Claimed = tuple[ReplicationResult, RemoteState | None]


class ClaimBatcher:
    """Coalesces the claims (claim + read) of restores that run together.

    A node that takes over hundreds of tasks at once restores them
    concurrently; each restore awaits :meth:`claim_load`, and the requests
    queued while one round trip is in flight go together in the next
    (:meth:`RedisCheckpointReplica.claim_load_many`, at most ``max_batch`` per
    round trip). Group commit, as the Replicator does for writes: one round
    trip and one pipeline instead of two per task.

    Args:
        replica: the Redis replica.
        max_batch: requests per round trip, >= 1.
    """

    def __init__(self, replica: RedisCheckpointReplica, max_batch: int = 128) -> None:
        if max_batch < 1:
            raise InvalidArgument("max_batch", f"{max_batch} < 1")
        self._replica = replica
        self._max_batch = max_batch
        self._queue: list[tuple[tuple[str, int, str], asyncio.Future[_Claimed]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def claim_load(
        self, task_id: str, epoch: int, node_id: str
    ) -> tuple[ReplicationResult, RemoteState | None]:
        """Claim ``task_id`` at ``epoch`` and read its state; see ``claim_load_many``.

        Raises:
            InvalidArgument: empty task_id, epoch < 1.
            CorruptedRecord: a stored record of this task does not parse.
            redis.exceptions.RedisError: Redis unreachable or failing.
        """
        _check_id("task_id", task_id)
        _check_int("epoch", epoch, 1)
        future: asyncio.Future[_Claimed] = asyncio.get_running_loop().create_future()
        self._queue.append(((task_id, epoch, node_id), future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="lazarus-claims")
        return await future

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # let the rest of this wave of restores queue up
        while self._queue:
            batch = self._queue[: self._max_batch]
            del self._queue[: self._max_batch]
            live = [(req, fut) for req, fut in batch if not fut.done()]
            if not live:
                continue
            try:
                replies = await self._replica.claim_load_many([req for req, _ in live])
            except Exception as exc:  # the whole round trip failed: each caller retries
                for _, fut in live:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            for (_, fut), reply in zip(live, replies, strict=True):
                if fut.done():
                    continue
                if isinstance(reply, Exception):
                    fut.set_exception(reply)
                else:
                    fut.set_result(reply)
