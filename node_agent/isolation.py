"""Process isolation: a sync handler runs in a worker process, as Celery's prefork does.

Theory of operation: a ``WorkerPool`` holds up to ``size`` (the node's slots)
worker processes, started with the ``spawn`` method (a fork of the agent,
with its gRPC and event-loop threads, would not be safe). A task run takes a
worker, sends it the handler (pickled by reference: a module-level function)
and the assignment's fields, and serves the worker's context calls from a
relay thread in the agent:

    worker                              agent (relay thread)
    ctx.checkpoint(state) ──("checkpoint", state, reason)──▶ runner's short path
                          ◀──("ok", seq) | ("err", kind, text)──
    return value          ──("return", value)──▶ result committed, reported

A ``local`` task's checkpoint makes no round trip: the worker commits it into
its own spool file (``node_agent.spool``) and the agent ingests the spool
later, in batches (before the run's next message on the channel at the latest).
Its ownership checks then also ask whether the agent process is still its
parent: a worker orphaned by an agent's crash stops at its next context call.

A ``local`` task's newest checkpoint, too, goes from the worker to Redis, at
most every ``direct_every_s`` (the agent's linger minus a margin) and without
waiting on a failure: the agent no longer ships those rows itself, only a
newest row no worker write covered within that time.

A ``replicated`` task's checkpoint (when the agent gave its workers Redis,
``WorkerRedis``) makes no round trip to the agent either: the worker spools
it, then writes it to Redis itself, through the agent's script and fence (the
agent's incarnation as owner, the run's epoch;
``lazarus.storage.replica.BlockingCheckpointReplica``), and returns after
Redis's answer. It tells the agent through the shared array which seq Redis
holds (the agent reports it as replicated when it ingests the row). Any other
answer (Redis unreachable, a STALE fence, a hole in Redis's journal) sends the
worker back to the agent: ``("replicate", seq)`` makes the agent ingest the
spool and ship that checkpoint through its ``Replicator`` (retries with
backoff, the run lost on STALE, a re-ship on a hole), and the worker waits
for that answer, as before. After a failure the worker uses that path for
``DIRECT_BACKOFF_S`` before it tries Redis again.

The channel is a ``multiprocessing.Pipe`` (a local socket pair). Ownership
is checked in the worker itself, with no round trip: each worker shares a
small array with the agent — the fence deadline (monotonic seconds; the
clock is system-wide), whether the agent is fencing, and whether this run
was stopped — which the agent rewrites after every step of its core. A
worker's ``ctx.ensure_owner()`` and every context call compare it with
``time.monotonic()`` before and after the call.

Workers run at a lower CPU priority than the agent: ``nice`` +10 by default
(``--worker-nice``). The agent's own threads (heartbeats, the checkpoint
relay, the store's writer) then get a core ahead of CPU-bound handlers when
they wake, so checkpoints are answered sooner (``bench/taskpath_bench.py``:
p50 of a checkpoint call of a CPU-bound handler 2.6 ms instead of 3.2 ms, 4
workers on 2 cores); when nothing else wants the CPU, a niced worker runs at
full speed.

A worker that dies (SIGKILL, OOM kill, a crash in C code) ends its relay
with ``WorkerDied``: the runner fails that task (retryable) with a readable
error; the agent and the other tasks go on, and the pool starts a new worker
for the next task. At revoke, fence or shutdown the runner stops the run and,
if the handler has not returned within the stop grace, SIGKILLs its worker:
a zombie handler cannot go on past the fence.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import multiprocessing
import multiprocessing.connection
import os
import signal
import sqlite3
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from lazarus.storage.keys import DEFAULT_PREFIX
from lazarus.storage.replica import (
    BlockingCheckpointReplica,
    Outcome,
    ReplicationItem,
)
from node_agent.metrics import CHECKPOINT_BUCKETS_S
from node_agent.sdk import (
    FencingToken,
    OwnershipLapsed,
    Restored,
    TaskCancelled,
    TaskFailure,
)
from node_agent.spool import SpoolReader, SpoolWriter, checkpoint_record, encode_json

__all__ = [
    "DIRECT_BACKOFF_S",
    "ProcessTaskContext",
    "Worker",
    "WorkerDied",
    "WorkerPool",
    "WorkerRedis",
    "replicated_through",
    "spooled_through",
]

_DEADLINE, _FENCED, _STOPPED, _REPLICATED, _SPOOLED, _SPOOLED_MS = 0, 1, 2, 3, 4, 5
_STATS = 6
"""Where the worker's checkpoint-duration counts start in its shared array: per
durability (local, then replicated) one count per bucket of
``CHECKPOINT_BUCKETS_S`` and +Inf, then the sum of seconds."""
_STAT_WIDTH = len(CHECKPOINT_BUCKETS_S) + 2
_DURABILITIES = ("local", "replicated")
_SHARED_SIZE = _STATS + _STAT_WIDTH * len(_DURABILITIES)

DIRECT_BACKOFF_S = 5.0
"""After a failed write of its own to Redis, how long a worker leaves writes to the agent, s."""


@dataclass(frozen=True, slots=True)
class WorkerRedis:
    """Where a worker process writes ``replicated`` checkpoints itself (the agent's Redis).

    Attributes:
        url: ``redis://`` or ``rediss://`` URL.
        password: AUTH password ("" = none, or the one in the URL).
        ca_file: PEM CA bundle verifying a ``rediss://`` server ("" = system roots).
        prefix: the key prefix (``lazarus.storage.keys``).
        timeout_s: connect and read timeout of a write, seconds; a write that
            times out goes to the agent instead.
    """

    url: str
    password: str = ""
    ca_file: str = ""
    prefix: str = DEFAULT_PREFIX
    timeout_s: float = 2.0

    def __repr__(self) -> str:  # no password in logs
        return f"WorkerRedis(url={self.url!r}, prefix={self.prefix!r})"

    def connect(self, owner: str) -> BlockingCheckpointReplica:
        """A blocking replica writing as ``owner`` (connects lazily)."""
        kwargs: dict[str, Any] = {
            "socket_timeout": self.timeout_s,
            "socket_connect_timeout": self.timeout_s,
            "retry": Retry(NoBackoff(), 0),  # no retry here: the agent's path retries
        }
        if self.password:
            kwargs["password"] = self.password
        if self.ca_file:
            kwargs["ssl_ca_certs"] = self.ca_file
        client = redis.Redis.from_url(self.url, **kwargs)
        return BlockingCheckpointReplica(client, prefix=self.prefix, owner=owner)


DEFAULT_WORKER_NICE = 10
"""How much lower than the agent's a worker's CPU priority is (``nice`` increment, 0..19)."""


class WorkerDied(Exception):
    """The worker process running a task's handler exited (killed, OOM, crashed)."""


class Worker:
    """One worker process and the agent's end of its channel.

    With ``spool_path``, the worker commits ``local`` checkpoints into that
    spool file itself (``node_agent.spool``); ``spool`` is the agent's reader
    of it, used under ``spool_lock``. With ``redis`` too, it also spools
    ``replicated`` checkpoints and writes them to Redis itself (``replicates``).
    """

    def __init__(
        self,
        mp: Any,
        nice: int = DEFAULT_WORKER_NICE,
        spool_path: Path | None = None,
        redis: WorkerRedis | None = None,
    ) -> None:
        self.conn, child = mp.Pipe(duplex=True)
        self.shared = mp.Array("d", _SHARED_SIZE, lock=False)
        self.shared[_DEADLINE] = math.nan
        self.spool = SpoolReader(spool_path) if spool_path is not None else None
        self.spool_lock = threading.Lock()
        self.replicates = redis is not None and spool_path is not None
        self.process: multiprocessing.process.BaseProcess = mp.Process(
            target=_worker_main,
            args=(child, self.shared, nice, spool_path, os.getpid(), redis),
            name="lazarus-worker",
            daemon=True,
        )
        self.process.start()
        child.close()
        self._pid: int | None = self.process.pid
        self._kill_lock = threading.Lock()
        # Set by ``kill`` once the process is reaped and its handle closed
        # (``process`` may no longer be asked anything then).
        self._exitcode: int | None = None
        self._released = False

    @property
    def pid(self) -> int | None:
        """The process id."""
        return self._pid

    def alive(self) -> bool:
        """True while the process runs."""
        if self._released:
            return False
        try:
            return self.process.is_alive()
        except ValueError:  # closed by a ``kill`` in another thread meanwhile
            return False

    def kill(self) -> None:
        """SIGKILL the process, reap it (bounded), and release its pipe and process handle.

        Idempotent and thread-safe (a stop and the worker's relay may both kill
        it). A process not reaped within 5 s keeps its handle (a later ``kill``
        tries again). The spool reader is left to ``release_spool``.
        """
        with self._kill_lock:
            if self._released:
                return
            pid = self._pid
            if pid is not None and self.process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.process.join(timeout=5)
            with contextlib.suppress(OSError):
                self.conn.close()
            code = self.process.exitcode
            if code is None:
                return
            self._exitcode = code  # before the close: ``death`` reads it after
            self._released = True
            self.process.close()  # its sentinel fd; the Process leaves multiprocessing's children

    def release_spool(self) -> None:
        """Close the agent's reader of a dead worker's spool; delete the file if it holds no row.

        A row still in it was not ingested yet (an ingestion failed, or the
        run's relay ingests it after the kill): the file then stays, for that
        relay (which calls this again) or for the next agent start
        (``TaskRunner.ingest_leftover_spools``). No-op while the process runs.
        """
        if self.spool is None or self.alive():
            return
        with self.spool_lock:
            try:
                empty = not self.spool.read(limit=1)
            except sqlite3.Error:
                empty = False  # unreadable now: keep it for the next start
            if empty:
                self.spool.remove()
            else:
                self.spool.close()

    def death(self) -> str:
        """How the process ended, in words (for the task's error)."""
        try:
            self.process.join(timeout=1)
            code = self.process.exitcode
        except ValueError:  # closed by ``kill``, which kept its exit code
            code = self._exitcode
        if code is None:
            return "its channel closed"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"killed by {name}"
        return f"exited with status {code}"


def _add_counts(
    into: dict[str, tuple[list[float], float]], more: dict[str, tuple[list[float], float]]
) -> None:
    for durability, (counts, total_s) in more.items():
        have, have_s = into.get(durability, ([0.0] * len(counts), 0.0))
        into[durability] = ([a + b for a, b in zip(have, counts, strict=True)], have_s + total_s)


class WorkerPool:
    """Up to ``size`` idle worker processes; ``acquire`` starts one when none is idle.

    Args:
        size: most idle workers kept (the node's slots).
        nice: each worker's ``nice`` increment over the agent's (0..19).
        spool_dir: where workers keep their checkpoint spools (None: no spool;
            every checkpoint goes to the agent).
        redis: where workers write ``replicated`` checkpoints themselves (None:
            those go to the agent; needs ``spool_dir``).
    """

    def __init__(
        self,
        size: int,
        nice: int = DEFAULT_WORKER_NICE,
        spool_dir: Path | None = None,
        redis: WorkerRedis | None = None,
    ) -> None:
        self.size = size
        self.nice = nice
        self.spool_dir = spool_dir
        self.redis = redis
        self._mp = multiprocessing.get_context("spawn")
        self._idle: list[Worker] = []
        self._busy: set[Worker] = set()
        # Every worker started and not yet retired (``_retire``): the idle, the
        # busy, and the few that died and were not yet found dead. A retired
        # worker's counts are folded into ``_retired`` (they outlive its process).
        self._started: list[Worker] = []
        self._retired: dict[str, tuple[list[float], float]] = {}
        self._lock = threading.Lock()
        self._deadline = math.nan
        self._fenced = 0.0
        self._closed = False

    def prestart(self, count: int) -> None:
        """Start ``count`` idle workers now (blocking; call from a thread)."""
        for _ in range(count):
            worker = Worker(self._mp, self.nice, self._spool_path(), self.redis)
            self._publish_to(worker)
            with self._lock:
                self._started.append(worker)
                keep = not self._closed and len(self._idle) < self.size
                if keep:
                    self._idle.append(worker)
            if not keep:
                self._retire(worker)
                return

    def _spool_path(self) -> Path | None:
        if self.spool_dir is None:
            return None
        return self.spool_dir / f"worker-{os.getpid()}-{uuid.uuid4().hex[:12]}.db"

    def acquire(self) -> Worker:
        """An idle live worker, or a new one (blocking: a start takes ~0.2 s)."""
        dead: list[Worker] = []
        try:
            with self._lock:
                if self._closed:
                    raise WorkerDied("the worker pool is closed")
                while self._idle:
                    worker = self._idle.pop()
                    if worker.alive():
                        self._busy.add(worker)
                        worker.shared[_STOPPED] = 0.0
                        worker.shared[_REPLICATED] = 0.0  # seqs of the new run start over
                        worker.shared[_SPOOLED] = 0.0
                        return worker
                    dead.append(worker)
        finally:
            for gone in dead:  # idle workers that died meanwhile
                self._retire(gone)
        worker = Worker(self._mp, self.nice, self._spool_path(), self.redis)
        self._publish_to(worker)
        with self._lock:
            self._started.append(worker)
            self._busy.add(worker)
        return worker

    def release(self, worker: Worker) -> None:
        """Give a worker back after its handler ended (killed ones are dropped)."""
        with self._lock:
            self._busy.discard(worker)
            if not self._closed and worker.alive() and len(self._idle) < self.size:
                self._idle.append(worker)
                return
        self._retire(worker)

    def discard(self, worker: Worker) -> None:
        """SIGKILL a worker (its run was stopped and did not return in time)."""
        with self._lock:
            self._busy.discard(worker)
        self._retire(worker)

    def _retire(self, worker: Worker) -> None:
        """Kill ``worker`` and forget it (call without ``_lock``; idempotent).

        Each worker dropped from the pool (killed at a stop, dead, or in
        excess) comes here at once, not at the next metrics scrape: its
        process handle and pipe are closed (``Worker.kill``), its checkpoint
        counts move into ``_retired`` (after the kill: a dead process counts
        no more), and its spool reader is closed, the file deleted when it
        holds no row (``Worker.release_spool``: an un-ingested row keeps it).
        """
        worker.kill()
        with self._lock:
            if any(w is worker for w in self._started):
                self._started = [w for w in self._started if w is not worker]
                _add_counts(self._retired, checkpoint_counts(worker.shared))
        worker.release_spool()

    def checkpoint_stats(self) -> dict[str, tuple[list[float], float]]:
        """The checkpoint durations every worker of this pool counted (an
        ``AgentMetrics.add_checkpoint_source``): durability -> (count per bucket
        of ``CHECKPOINT_BUCKETS_S`` then +Inf, sum of seconds)."""
        with self._lock:
            total: dict[str, tuple[list[float], float]] = {
                d: (list(c), s) for d, (c, s) in self._retired.items()
            }
            for worker in self._started:
                _add_counts(total, checkpoint_counts(worker.shared))
        return total

    def publish(self, deadline_s: float | None, fenced: bool) -> None:
        """Share the agent's fence with every worker (called after each core step)."""
        self._deadline = math.nan if deadline_s is None else deadline_s
        self._fenced = 1.0 if fenced else 0.0
        with self._lock:
            workers = [*self._idle, *self._busy]
        for worker in workers:
            self._publish_to(worker)

    def _publish_to(self, worker: Worker) -> None:
        worker.shared[_DEADLINE] = self._deadline
        worker.shared[_FENCED] = self._fenced

    def close(self) -> None:
        """Kill every worker."""
        with self._lock:
            self._closed = True
            workers = [*self._idle, *self._busy]
            self._idle.clear()
            self._busy.clear()
        for worker in workers:
            self._retire(worker)


def stop_run(worker: Worker) -> None:
    """Mark the worker's run stopped: its next context call or ownership check raises."""
    worker.shared[_STOPPED] = 1.0


def checkpoint_counts(shared: Any) -> dict[str, tuple[list[float], float]]:
    """The checkpoint durations a worker counted: durability -> (per-bucket counts, sum s)."""
    out = {}
    for i, durability in enumerate(_DURABILITIES):
        base = _STATS + i * _STAT_WIDTH
        counts = list(shared[base : base + _STAT_WIDTH - 1])
        if any(counts):
            out[durability] = (counts, float(shared[base + _STAT_WIDTH - 1]))
    return out


def spooled_through(worker: Worker) -> tuple[int, int]:
    """The newest seq the worker's current run spooled (0: none) and its commit
    time, Unix ms. Read before the spool: every row up to that seq is in it."""
    return int(worker.shared[_SPOOLED]), int(worker.shared[_SPOOLED_MS])


def replicated_through(worker: Worker) -> int:
    """The highest seq of the worker's current run that it wrote to Redis itself (0: none).

    Read after the spool rows it qualifies: the worker sets it after Redis's
    answer, so a row read earlier and at or below it is in Redis.
    """
    return int(worker.shared[_REPLICATED])


# ----------------------------------------------------------------- the worker


class ProcessTaskContext:
    """The ``SyncTaskContext`` of a handler running in a worker process.

    Same attributes and blocking methods. ``checkpoint`` of a ``local`` task
    commits into this worker's spool (``node_agent.spool``), with no message to
    the agent; one of a ``replicated`` task too, then writes it to Redis (the
    agent's ``direct`` replica) and only on a failure asks the agent to ship
    it. ``record`` goes over the local channel to the agent, which commits it
    by its short path; so do checkpoints the agent did not number for the
    worker (no spool). ``shared`` and ``crdt_state`` are not available in a
    worker process.
    """

    def __init__(
        self,
        fields: dict[str, Any],
        conn: Any,
        shared: Any,
        spool: SpoolWriter | None = None,
        agent_pid: int | None = None,
        direct: _Direct | None = None,
    ) -> None:
        self.task_id: str = fields["task_id"]
        self.kind: str = fields["kind"]
        self.epoch: int = fields["epoch"]
        self.attempt: int = fields["attempt"]
        self.payload: Any = fields["payload"]
        self.restored: Restored | None = fields["restored"]
        self.node_id: str = fields["node_id"]
        self._incarnation: str = fields["incarnation"]
        self._conn = conn
        self._shared = shared
        self._agent_pid = agent_pid
        # The spool is used when the agent numbered this run's checkpoints for us:
        # it passes the task's head seq (only this worker writes the task meanwhile).
        self._spool = spool if fields.get("spool_from_seq") is not None else None
        self._seq: int = fields.get("spool_from_seq") or 0
        self._journal_seq: int = fields.get("journal_seq", 0)
        self._max_payload_bytes: int = fields.get("max_payload_bytes", 0)
        # A replicated run's spooled checkpoints go to Redis from here, each
        # before ``checkpoint`` returns; a local run's newest at most every
        # ``direct_every_s`` (the agent ships what this leaves behind).
        self._replicated: bool = bool(fields.get("replicate"))
        self._direct_every: float | None = fields.get("direct_every_s")
        wants = self._replicated or self._direct_every is not None
        self._direct = direct if self._spool is not None and wants else None
        self._direct_at = -math.inf

    def _owner(self, *, new_effect: bool = True) -> None:
        deadline = self._shared[_DEADLINE]
        if (
            math.isnan(deadline)
            or time.monotonic() >= deadline
            or (self._agent_pid is not None and os.getppid() != self._agent_pid)
        ):
            raise OwnershipLapsed(
                f"task {self.task_id!r} at epoch {self.epoch}: this agent's ownership lapsed "
                "(fence deadline passed, or the agent process is gone)"
            )
        if self._shared[_STOPPED] or (new_effect and self._shared[_FENCED]):
            raise TaskCancelled(f"task {self.task_id!r} at epoch {self.epoch} no longer runs here")

    def _call(self, *msg: Any) -> Any:
        self._owner()
        self._conn.send(msg)
        reply = self._conn.recv()
        if reply[0] == "ok":
            self._owner(new_effect=False)
            return reply[1]
        _, kind, text = reply
        raise _ERRORS.get(kind, RuntimeError)(text)

    def checkpoint(self, state: Any, *, reason: str = "") -> int:
        """As ``TaskContext.checkpoint``, blocking.

        A ``local`` task's checkpoint is committed here, into the spool (fsync
        included), between two ownership checks: no round trip to the agent.
        """
        if self._spool is None:
            return int(self._call("checkpoint", state, reason))
        t0 = time.monotonic()
        self._owner()
        payload = encode_json(state, "checkpoint state")
        if len(payload) > self._max_payload_bytes:
            raise ValueError(
                f"checkpoint state is {len(payload)} bytes, over the limit of "
                f"{self._max_payload_bytes}"
            )
        seq = self._seq + 1
        label = reason[:128]
        created = self._spool.append(
            self.task_id, self.epoch, seq, self._journal_seq, label, payload
        )
        self._seq = seq
        self._shared[_SPOOLED_MS] = float(created)
        self._shared[_SPOOLED] = float(seq)  # after the commit: a reader finds the row
        if self._direct is not None:
            if self._replicated:
                if not self._replicate(seq, label, payload, created):
                    # Redis did not take it from us: the agent ships it (retries,
                    # STALE, holes) and answers once Redis holds it.
                    shipped = int(self._call("replicate", seq))
                    self._observe(time.monotonic() - t0)
                    return shipped
            elif self._direct_every is not None:
                now = time.monotonic()
                if now - self._direct_at >= self._direct_every:
                    self._direct_at = now
                    self._replicate(seq, label, payload, created)  # best effort
        self._owner(new_effect=False)
        self._observe(time.monotonic() - t0)
        return seq

    def _observe(self, elapsed_s: float) -> None:
        """Count a spooled checkpoint's duration where the agent's metrics read it."""
        base = _STATS + (_STAT_WIDTH if self._replicated else 0)
        shared = self._shared
        shared[base + bisect.bisect_left(CHECKPOINT_BUCKETS_S, elapsed_s)] += 1.0
        shared[base + _STAT_WIDTH - 1] += elapsed_s

    def _replicate(self, seq: int, label: str, payload: bytes, created_ms: int) -> bool:
        """Write the spooled checkpoint ``seq`` to Redis; True when Redis holds it."""
        assert self._direct is not None
        replica = self._direct.replica(self._incarnation)
        if replica is None:
            return False
        record = checkpoint_record(
            self.task_id,
            self.epoch,
            seq,
            self._journal_seq,
            payload,
            label=label,
            terminal=False,
            created_ms=created_ms,
            node_id=self.node_id,
            incarnation=self._incarnation,
        )
        try:
            result = replica.write(
                ReplicationItem(self.task_id, self.epoch, self.node_id, checkpoint=record)
            )
        except Exception:  # unreachable, timed out, script error: the agent's path
            self._direct.failed()
            return False
        if result.outcome is Outcome.STALE or result.gap:
            return False  # the agent decides: the run is lost, or Redis lost data
        self._shared[_REPLICATED] = float(seq)
        return True

    def record(self, event: Any) -> int:
        """As ``TaskContext.record``, blocking."""
        seq = int(self._call("record", event))
        self._journal_seq = max(self._journal_seq, seq)
        return seq

    def progress(self, ratio: float, message: str = "") -> None:
        """As ``TaskContext.progress``."""
        self._conn.send(("progress", ratio, message))

    @property
    def cancelled(self) -> bool:
        """As ``TaskContext.cancelled``."""
        try:
            self._owner()
        except TaskCancelled:
            return True
        return False

    def raise_if_cancelled(self) -> None:
        """As ``TaskContext.raise_if_cancelled``."""
        self._owner()

    def ensure_owner(self) -> None:
        """As ``TaskContext.ensure_owner``: checked in this process, no round trip."""
        self._owner()

    @property
    def fencing_token(self) -> FencingToken:
        """As ``TaskContext.fencing_token``."""
        return FencingToken(self.task_id, self.epoch, self._incarnation)

    def shared(self, name: str, *, kind: str) -> Any:
        """Not available with ``isolation="process"``."""
        raise NotImplementedError("ctx.shared is not available with isolation='process'")

    def crdt_state(self, kind: str, *, sync_timeout_s: float = 2.0) -> Any:
        """Not available with ``isolation="process"``."""
        raise NotImplementedError("ctx.crdt_state is not available with isolation='process'")


_ERRORS: dict[str, type[BaseException]] = {
    "OwnershipLapsed": OwnershipLapsed,
    "TaskCancelled": TaskCancelled,
    "ValueError": ValueError,
    "TypeError": TypeError,
}


class _Direct:
    """A worker's own Redis client (made at its first ``replicated`` checkpoint)."""

    def __init__(self, target: WorkerRedis) -> None:
        self._target = target
        self._replica: BlockingCheckpointReplica | None = None
        self._off_until = 0.0

    def replica(self, owner: str) -> BlockingCheckpointReplica | None:
        """The replica, or None while backing off after a failure."""
        if time.monotonic() < self._off_until:
            return None
        if self._replica is None:
            self._replica = self._target.connect(owner)
        return self._replica

    def failed(self) -> None:
        """A write failed: leave writes to the agent for ``DIRECT_BACKOFF_S``."""
        self._off_until = time.monotonic() + DIRECT_BACKOFF_S
        if self._replica is not None:
            with contextlib.suppress(Exception):
                self._replica.close()
            self._replica = None


def _worker_main(  # pragma: no cover - in the worker
    conn: Any,
    shared: Any,
    nice: int,
    spool_path: Path | None = None,
    agent_pid: int | None = None,
    redis_target: WorkerRedis | None = None,
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the agent decides when a worker ends
    if nice > 0:
        os.nice(nice)  # lowering one's own priority needs no privilege
    spool = SpoolWriter(spool_path) if spool_path is not None else None
    direct = _Direct(redis_target) if redis_target is not None else None
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] != "run":
            continue
        fn: Callable[[Any], Any] = msg[1]
        ctx = ProcessTaskContext(msg[2], conn, shared, spool, agent_pid, direct)
        try:
            value = fn(ctx)
        except BaseException as exc:  # reported to the agent, which decides
            retryable = exc.retryable if isinstance(exc, TaskFailure) else True
            text = "".join(traceback.format_exception(exc))[-4000:]
            conn.send(("raise", type(exc).__name__, str(exc), retryable, text))
            continue
        try:
            conn.send(("return", value))
        except Exception as exc:  # not picklable: let the agent say so
            conn.send(("raise", "TypeError", f"result is not picklable: {exc}", False, ""))
