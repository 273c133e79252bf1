"""The task SDK: what an agent developer writes.

Quick use::

    from node_agent.sdk import Agent, TaskContext

    agent = Agent("summarizer")

    @agent.task("summarize", durability="replicated")
    async def summarize(ctx: TaskContext) -> dict:
        state = ctx.restored.state if ctx.restored else {"done": 0}
        for event in ctx.restored.events if ctx.restored else []:
            state["done"] = event["done"]          # fold the journal after the checkpoint
        for i in range(state["done"], len(ctx.payload["items"])):
            ...                                    # the real work
            await ctx.record({"done": i + 1})      # journal: durable before it returns
            if (i + 1) % 100 == 0:
                await ctx.checkpoint({"done": i + 1}, reason="every 100 items")
            ctx.progress((i + 1) / len(ctx.payload["items"]))
        return {"items": len(ctx.payload["items"])}

Run it with ``lazarus node-agent --app mymodule:agent``.

Theory of operation: a handler is called once per assignment (a task id at an
epoch). It reads its input from ``ctx.payload`` and, after a crash or a move,
the state to resume from in ``ctx.restored``: the newest checkpoint's state
plus the journal events recorded after it, decoded, from the local store when
it holds the newest checkpoint and from Redis otherwise. Checkpoint state,
journal events, payloads and results are JSON values (``JsonCodec``).

Every effect goes through the context and is fenced by the task's epoch: once
the task is revoked, released or the agent self-fences (DESIGN.md §6), every
``checkpoint`` / ``record`` call raises ``TaskCancelled`` and an ``async``
handler is cancelled at its next ``await``; whatever it returns after that is
dropped. A call that returned has committed locally (fsync) and, with
``durability="replicated"``, has also been acknowledged by Redis; nothing
acknowledged is lost by a crash, a pause or a move.

A handler may be ``async def`` (runs on the agent's event loop: it must not
block) or a plain ``def`` (runs in a thread pool and gets a ``SyncTaskContext``
whose methods block instead of being awaited). An exception raised by the
handler makes the task FAILED with the exception's text; the coordinator
retries it while attempts remain (``TaskSpec.max_attempts``) unless it is a
``TaskFailure(retryable=False)``.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

if TYPE_CHECKING:
    from node_agent.shared import SharedDocument, SyncSharedDocument

__all__ = [
    "Agent",
    "DurabilityName",
    "FencingToken",
    "HandlerSpec",
    "IsolationName",
    "OwnershipLapsed",
    "Restored",
    "ServiceContext",
    "ServiceSpec",
    "SyncTaskContext",
    "TaskCancelled",
    "TaskContext",
    "TaskFailure",
]

IsolationName = Literal["thread", "process"]
"""Where a plain ``def`` handler runs: a thread of the agent, or a worker process."""

DurabilityName = Literal["local", "replicated"]
"""When ``checkpoint`` / ``record`` return: after the local fsync, or after Redis acked too."""

_KIND = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")

H = TypeVar("H", bound=Callable[..., Any])


class TaskCancelled(Exception):
    """The task was revoked, released, cancelled or fenced; stop working.

    Raised by ``TaskContext.checkpoint`` / ``record`` / ``raise_if_cancelled``
    once the agent no longer owns the task at this epoch. Handlers need not
    catch it; the agent expects it.
    """


class OwnershipLapsed(TaskCancelled):
    """This assignment's ownership ran out where the handler runs (its fence deadline passed).

    Raised by ``ensure_owner`` and by every context call made, or acknowledged,
    after the fence deadline: the agent may have been paused (SIGSTOP, a long
    GC, a cut-off network) long enough for the task to be given to another
    node at a newer epoch. A ``TaskCancelled``: handlers need not catch it.
    """


@dataclass(frozen=True, slots=True)
class FencingToken:
    """What identifies one assignment to a system outside Lazarus that can check it.

    Order: ``epoch`` grows on every assignment of ``task_id``; an external
    system that remembers the highest epoch it has seen per task and refuses
    a lower one (or an equal one from another ``incarnation``) fences a stale
    owner out, whatever its clock or pause. See the SDK guide
    (docs/sdk.md, "Fencing tokens") for a Redis Lua check and an HTTP header.

    Attributes:
        task_id: the task.
        epoch: the assignment's epoch (>= 1).
        incarnation: the agent process that holds it.
    """

    task_id: str
    epoch: int
    incarnation: str

    HEADER = "Lazarus-Fencing-Token"
    """The HTTP header ``header_value`` is sent in."""

    def header_value(self) -> str:
        """``<epoch>;<incarnation>;<task_id>`` (the epoch first: compare it as an integer)."""
        return f"{self.epoch};{self.incarnation};{self.task_id}"


class TaskFailure(Exception):
    """Raise from a handler to fail the task with a chosen message.

    Args:
        message: the readable error stored in the task record (``TaskError.message``).
        retryable: False makes the task FAILED at once; True (the default) lets the
            coordinator retry it while attempts remain.
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True, slots=True)
class Restored:
    """What an assignment resumes from.

    Attributes:
        state: the newest checkpoint's state (a JSON value), or None when the task
            has journal events but no checkpoint yet.
        checkpoint_seq: that checkpoint's per-task seq (0 = none).
        covers_journal_seq: the newest journal seq folded into ``state`` (0 = none).
        events: the journal events after ``covers_journal_seq``, in order, decoded.
        journal_seq: the newest journal seq restored (``covers_journal_seq`` + len(events)).
        source: "local" (this node's store) or "redis" (another node's replicated state).
    """

    state: Any
    checkpoint_seq: int
    covers_journal_seq: int
    events: list[Any] = field(default_factory=list)
    journal_seq: int = 0
    source: Literal["local", "redis"] = "local"


class _Host(Protocol):
    """What the runtime provides behind a context (``node_agent.runner``)."""

    async def checkpoint(self, state: Any, reason: str) -> int: ...

    async def record(self, event: Any) -> int: ...

    def progress(self, ratio: float, message: str) -> None: ...

    @property
    def cancelled(self) -> bool: ...

    async def wait_cancelled(self) -> None: ...

    def shared(self, name: str, kind: str) -> SharedDocument: ...

    async def crdt_state(self, kind: str, sync_timeout_s: float) -> SharedDocument: ...


class TaskContext:
    """One assignment's view of its task, handed to an ``async`` handler.

    Attributes:
        task_id: the task's id.
        kind: the handler kind it was submitted with.
        epoch: the fencing token of this assignment (grows on every assignment).
        attempt: 1-based attempt number (grows when a previous owner died or failed).
        payload: the submitted input: a JSON value when it was submitted as JSON,
            else the raw bytes.
        restored: what to resume from, or None on a fresh start.
        node_id: the node running it.
    """

    def __init__(
        self,
        *,
        task_id: str,
        kind: str,
        epoch: int,
        attempt: int,
        payload: Any,
        restored: Restored | None,
        node_id: str,
        host: _Host,
    ) -> None:
        self.task_id = task_id
        self.kind = kind
        self.epoch = epoch
        self.attempt = attempt
        self.payload = payload
        self.restored = restored
        self.node_id = node_id
        self._host = host

    async def checkpoint(self, state: Any, *, reason: str = "") -> int:
        """Save ``state`` (a JSON value) as the task's newest checkpoint.

        It folds every journal event recorded so far: a resume starts from this
        state and replays only the events recorded after this call.

        Returns:
            The checkpoint's per-task seq (1, 2, ...; continues across owners).

        Raises:
            TaskCancelled: the task is no longer owned here at this epoch.
            TypeError: ``state`` is not JSON-serialisable.
            ValueError: the encoded state is over the agent's payload limit.
        """
        return await self._host.checkpoint(state, reason)

    async def record(self, event: Any) -> int:
        """Append ``event`` (a JSON value) to the task's journal.

        Returns:
            The event's per-task journal seq.

        Raises:
            TaskCancelled, TypeError, ValueError: as ``checkpoint``.
        """
        return await self._host.record(event)

    def progress(self, ratio: float, message: str = "") -> None:
        """Report progress (0.0..1.0, clamped) shown by ``lazarus tasks``; never blocks."""
        self._host.progress(ratio, message)

    @property
    def cancelled(self) -> bool:
        """True once the task must stop (revoked, released, cancelled or fenced)."""
        return self._host.cancelled

    def raise_if_cancelled(self) -> None:
        """Raise ``TaskCancelled`` when the task must stop; call it in long loops."""
        if self._host.cancelled:
            raise TaskCancelled(f"task {self.task_id!r} at epoch {self.epoch} must stop")

    def ensure_owner(self) -> None:
        """Raise unless this assignment still owns the task now; call it right before a side effect.

        Checked in the calling thread against the monotonic clock and the
        agent's fence deadline (no hop to the agent's event loop), so a
        handler resumed after a pause cannot act past its fence before the
        agent has noticed. Passing proves ownership at the instant of the
        call only: an effect that takes long, or one in a system that may see
        it late, needs ``fencing_token`` checked by that system.

        Raises:
            OwnershipLapsed: the fence deadline passed (the agent may have been
                paused or cut off; another node may own the task now).
            TaskCancelled: the task was revoked, released, cancelled or is being fenced.
        """
        check = getattr(self._host, "ensure_owner", None)
        if check is not None:
            check()
        else:
            self.raise_if_cancelled()

    @property
    def fencing_token(self) -> FencingToken:
        """(task id, epoch, incarnation) of this assignment, for systems that check it."""
        incarnation = str(getattr(self._host, "incarnation", ""))
        return FencingToken(self.task_id, self.epoch, incarnation)

    async def wait_cancelled(self) -> None:
        """Return when the task must stop (for handlers that race work against it)."""
        await self._host.wait_cancelled()

    def shared(self, name: str, *, kind: str) -> SharedDocument:
        """A handle on the fleet-shared CRDT document ``name`` (``node_agent.shared``).

        Args:
            name: the document's name (its id is ``shared/<name>``), the same on every node.
            kind: "g-counter", "pn-counter", "or-set", "lww-map", "mv-map" or "rga-log".

        Returns:
            A ``SharedDocument``: ``await doc.add(x)``, ``await doc.increment(n)``,
            ``await doc.put(k, v)``, ``await doc.append(item)``, ``doc.value()``.
            An operation returns once durable on this node; it reaches the
            other nodes through the leader, also across a partition once healed.
            Operations raise ``TaskCancelled`` once this task must stop.

        Raises:
            ValueError: unknown kind, or the document exists with another kind.
        """
        return self._host.shared(name, kind)

    async def crdt_state(self, kind: str, *, sync_timeout_s: float = 2.0) -> SharedDocument:
        """Declare this task's state a CRDT document and return it (``task/<task_id>``).

        The document follows the task across owners: a new owner gets what
        earlier owners wrote (this call waits up to ``sync_timeout_s`` for the
        leader's copy; cut off from the leader it returns the local replica).
        Operations a fenced old owner (a zombie) acknowledged before it
        stopped are not a lost fork: they merge into the current owner's
        state when the partition heals. Operations raise ``TaskCancelled``
        once this assignment must stop.

        Args:
            kind: a CRDT kind, as for ``shared``.
            sync_timeout_s: longest wait for the leader's copy, seconds.

        Raises:
            ValueError: unknown kind, or the task's state has another kind.
        """
        return await self._host.crdt_state(kind, sync_timeout_s)


class SyncTaskContext:
    """The blocking twin of ``TaskContext``, handed to a plain ``def`` handler.

    Same attributes; ``checkpoint`` and ``record`` block the handler's thread
    until the write is as durable as the task asks, and raise the same errors.
    """

    def __init__(self, ctx: TaskContext, call: Callable[[Awaitable[Any]], Any]) -> None:
        self._ctx = ctx
        self._call = call
        self.task_id = ctx.task_id
        self.kind = ctx.kind
        self.epoch = ctx.epoch
        self.attempt = ctx.attempt
        self.payload = ctx.payload
        self.restored = ctx.restored
        self.node_id = ctx.node_id

    def checkpoint(self, state: Any, *, reason: str = "") -> int:
        """As ``TaskContext.checkpoint``, blocking.

        Commits from the calling thread straight to the store's writer (the
        short path); the event loop only ships the record to Redis afterwards
        (and, with ``durability="replicated"``, hands back Redis's ack).
        """
        direct = getattr(self._ctx._host, "checkpoint_sync", None)
        if direct is not None:
            return int(direct(state, reason))
        self._ctx.raise_if_cancelled()
        return int(self._call(self._ctx.checkpoint(state, reason=reason)))

    def record(self, event: Any) -> int:
        """As ``TaskContext.record``, blocking (the same short path as ``checkpoint``)."""
        direct = getattr(self._ctx._host, "record_sync", None)
        if direct is not None:
            return int(direct(event))
        self._ctx.raise_if_cancelled()
        return int(self._call(self._ctx.record(event)))

    def ensure_owner(self) -> None:
        """As ``TaskContext.ensure_owner`` (checked in this thread)."""
        self._ctx.ensure_owner()

    @property
    def fencing_token(self) -> FencingToken:
        """As ``TaskContext.fencing_token``."""
        return self._ctx.fencing_token

    def progress(self, ratio: float, message: str = "") -> None:
        """As ``TaskContext.progress``."""
        self._ctx.progress(ratio, message)

    @property
    def cancelled(self) -> bool:
        """As ``TaskContext.cancelled``."""
        return self._ctx.cancelled

    def raise_if_cancelled(self) -> None:
        """As ``TaskContext.raise_if_cancelled``."""
        self._ctx.raise_if_cancelled()

    def shared(self, name: str, *, kind: str) -> SyncSharedDocument:
        """As ``TaskContext.shared``; the handle's operations block."""
        from node_agent.shared import SyncSharedDocument

        return SyncSharedDocument(self._ctx.shared(name, kind=kind), self._call)

    def crdt_state(self, kind: str, *, sync_timeout_s: float = 2.0) -> SyncSharedDocument:
        """As ``TaskContext.crdt_state``; the handle's operations block."""
        from node_agent.shared import SyncSharedDocument

        doc = self._call(self._ctx.crdt_state(kind, sync_timeout_s=sync_timeout_s))
        return SyncSharedDocument(doc, self._call)


class ServiceContext:
    """What an agent-level service (``Agent.service``) gets: the node, shared documents.

    A service runs from agent start to agent stop, independent of task
    ownership: it keeps running while the agent is cut off from the
    coordinator (self-fencing pauses tasks, not services), so its shared-document
    writes are how a partitioned node keeps contributing.

    Attributes:
        node_id: this node.
        data_dir: the agent's data directory (a str path).
    """

    def __init__(
        self,
        *,
        node_id: str,
        data_dir: str,
        open_shared: Callable[[str, str], SharedDocument],
    ) -> None:
        self.node_id = node_id
        self.data_dir = data_dir
        self._open_shared = open_shared

    def shared(self, name: str, *, kind: str) -> SharedDocument:
        """As ``TaskContext.shared``, not fenced by any task."""
        return self._open_shared(name, kind)


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """A registered agent-level service: ``async def fn(ctx: ServiceContext) -> None``."""

    name: str
    fn: Callable[[ServiceContext], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """A registered handler.

    Attributes:
        kind: the task kind it serves.
        fn: the handler (``async def fn(ctx: TaskContext)`` or ``def fn(ctx: SyncTaskContext)``).
        is_async: whether ``fn`` is a coroutine function.
        durability: default durability of its checkpoints; a task's
            ``TaskSpec.durability`` overrides it.
        isolation: "thread", "process", or None for the node's default (``--isolation``).
    """

    kind: str
    fn: Callable[..., Any]
    is_async: bool
    durability: DurabilityName
    isolation: IsolationName | None = None


class Agent:
    """A set of task handlers, by kind; ``lazarus node-agent --app module:attr`` loads one.

    Args:
        name: a label for logs.
    """

    def __init__(self, name: str = "lazarus-agent") -> None:
        self.name = name
        self._handlers: dict[str, HandlerSpec] = {}
        self._services: dict[str, ServiceSpec] = {}

    def task(
        self,
        kind: str,
        *,
        durability: DurabilityName = "local",
        isolation: IsolationName | None = None,
    ) -> Callable[[H], H]:
        """Register the decorated function as the handler of ``kind``.

        Args:
            kind: 1..128 characters of ``[A-Za-z0-9._:/-]``, starting alphanumeric.
            durability: "local" or "replicated" (see the module docstring).
            isolation: for a plain ``def`` handler: "thread" (a thread of the agent;
                for I/O-bound steps), "process" (a worker process from a pool sized
                by the node's slots; for CPU-bound Python, killed at revoke or fence;
                the handler must be a module-level function), or None: the node's
                ``--isolation``. An ``async def`` handler always runs on the loop.

        Raises:
            ValueError: a bad kind, durability or isolation, a kind registered
                twice, or ``isolation="process"`` for an ``async def`` handler.
        """
        if isolation not in (None, "thread", "process"):
            raise ValueError(f"isolation: must be 'thread' or 'process', got {isolation!r}")
        if not isinstance(kind, str) or not _KIND.match(kind):
            raise ValueError(f"kind: must match {_KIND.pattern}, got {kind!r}")
        if durability not in ("local", "replicated"):
            raise ValueError(f"durability: must be 'local' or 'replicated', got {durability!r}")
        if kind in self._handlers:
            raise ValueError(f"kind: {kind!r} is already registered")

        def register(fn: H) -> H:
            if not callable(fn):
                raise ValueError(f"handler of {kind!r} is not callable")
            is_async = inspect.iscoroutinefunction(fn)
            if is_async and isolation == "process":
                raise ValueError(f"handler of {kind!r}: isolation='process' needs a plain def")
            self._handlers[kind] = HandlerSpec(kind, fn, is_async, durability, isolation)
            return fn

        return register

    def langgraph_task(
        self, kind: str, graph_factory: Callable[[Any], Any], **options: Any
    ) -> Callable[..., Any]:
        """Register a compiled LangGraph graph as kind ``kind`` (thread_id = task id).

        ``graph_factory(checkpointer)`` returns ``builder.compile(checkpointer=...)``;
        options and behaviour as ``node_agent.langgraph.langgraph_task`` (needs
        the ``lazarus[langgraph]`` extra).
        """
        from node_agent.langgraph import langgraph_task

        return langgraph_task(self, kind, graph_factory, **options)

    def service(self, name: str) -> Callable[[H], H]:
        """Register the decorated ``async def fn(ctx: ServiceContext)`` as an agent-level service.

        It is started when the agent starts and cancelled when it stops; an
        exception it raises is logged and ends only that service.

        Raises:
            ValueError: a bad or repeated name, or a function that is not ``async def``.
        """
        if not isinstance(name, str) or not _KIND.match(name):
            raise ValueError(f"name: must match {_KIND.pattern}, got {name!r}")
        if name in self._services:
            raise ValueError(f"service {name!r} is already registered")

        def register(fn: H) -> H:
            if not inspect.iscoroutinefunction(fn):
                raise ValueError(f"service {name!r} must be an async def function")
            self._services[name] = ServiceSpec(name, fn)
            return fn

        return register

    @property
    def services(self) -> tuple[ServiceSpec, ...]:
        """Registered services, by name."""
        return tuple(self._services[n] for n in sorted(self._services))

    def handler(self, kind: str) -> HandlerSpec | None:
        """The handler of ``kind``, or None."""
        return self._handlers.get(kind)

    @property
    def kinds(self) -> tuple[str, ...]:
        """Registered kinds, sorted (sent in Hello so placement honours them)."""
        return tuple(sorted(self._handlers))
