"""Issue [task-path]: ownership checked where the handler runs, results never re-run.

* ``AgentCore.ownership()``: the fence as a snapshot a handler thread tests
  against its own clock (pure; driven by a fake clock here).
* ``TaskRunner``: a handler's result is committed as a terminal checkpoint
  before it is reported, and an assignment that finds one reports it instead
  of calling the handler; context calls past the fence deadline fail in the
  handler's thread. Real ``CheckpointStore``; Redis replaced by fakes that
  acknowledge at once (the Redis side is covered by tests/integration).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import taskpath_workers

from lazarus.storage.errors import StoreIOError
from lazarus.v1 import agent_pb2, records_pb2
from lazarus_dev.runner_fakes import AckingReplicator, RecordingReporter, assign, make_runner
from node_agent.checkpoint import Checkpoint, CheckpointStore, StaleEpoch
from node_agent.core import AgentCore, Ownership
from node_agent.core import records as rec
from node_agent.isolation import DEFAULT_WORKER_NICE, ProcessTaskContext
from node_agent.replication import Outcome, ReplicationItem, ReplicationResult
from node_agent.runner import (
    HANDOFF_HOLD_MARGIN_S,
    RESULT_LABEL,
    TaskRunner,
    _Handoff,
    coalesce_handoffs,
)
from node_agent.sdk import (
    Agent,
    DurabilityName,
    FencingToken,
    OwnershipLapsed,
    Restored,
    TaskCancelled,
    TaskContext,
)
from node_agent.spool import SpoolReader, SpoolWriter

# ------------------------------------------------------------------ the core


def _welcome() -> rec.Welcome:
    return rec.Welcome(term=1, leader_id="c1", heartbeat_interval_ms=500, fence_after_ms=2000)


def _ack(core: AgentCore, seq: int, now: float) -> None:
    core.on_message(rec.HeartbeatAck(seq=seq), now, 0)


def test_no_ownership_before_the_first_welcome() -> None:
    core = AgentCore("n1", "inc-1", fence_lead_s=0.5)
    own = core.ownership()
    assert own == Ownership(None)
    assert not own.valid_at(0.0)
    assert not own.may_start_at(0.0)


def test_ownership_runs_to_the_fence_deadline_and_acks_move_it_forward() -> None:
    core = AgentCore("n1", "inc-1", fence_lead_s=0.5)
    core.hello(0.0, 0)
    core.on_message(_welcome(), 0.0, 0)  # sends heartbeat 1 at 0.0
    own = core.ownership()
    assert own.deadline_s == pytest.approx(2.0)  # oldest unacked send + fence_after
    assert own.valid_at(1.99)
    assert not own.valid_at(2.0)
    _ack(core, 1, 0.1)
    assert core.ownership().deadline_s == pytest.approx(2.5)  # next one due at 0.5


def test_a_fence_keeps_its_deadline_for_results_but_forbids_new_effects() -> None:
    core = AgentCore("n1", "inc-1", fence_lead_s=0.5)
    core.hello(0.0, 0)
    core.on_message(_welcome(), 0.0, 0)
    _ack(core, 1, 0.1)
    core.tick(2.1, 0)  # no ack since: the fence begins at deadline - lead = 2.0
    assert core.fenced
    own = core.ownership()
    assert own.fenced
    assert own.deadline_s == pytest.approx(2.5)
    assert own.valid_at(2.2)  # a result committed now is still this owner's
    assert not own.may_start_at(2.2)  # but no new effect starts
    assert not own.valid_at(2.5)
    core.hello(3.0, 0)
    core.on_message(_welcome(), 3.0, 0)
    assert core.ownership().may_start_at(3.1)


# ---------------------------------------------------------------- the runner


def _runner(
    tmp_path: Path, app: Agent, store: CheckpointStore
) -> tuple[TaskRunner, RecordingReporter]:
    reporter = RecordingReporter()
    return make_runner(app, store, reporter), reporter


REPLICATED = records_pb2.CHECKPOINT_DURABILITY_REPLICATED


def _assign(
    task_id: str,
    kind: str,
    epoch: int = 1,
    durability: Any = records_pb2.CHECKPOINT_DURABILITY_UNSPECIFIED,
) -> agent_pb2.Assign:
    return assign(task_id, kind, epoch=epoch, durability=durability)


@pytest.mark.parametrize("sync", [True, False])
async def test_a_returned_handler_is_not_called_again_at_its_epoch(
    tmp_path: Path, sync: bool
) -> None:
    calls: list[int] = []
    app = Agent("t")
    if sync:

        @app.task("k")
        def handler(ctx: Any) -> dict[str, int]:
            calls.append(ctx.epoch)
            ctx.checkpoint({"step": 1})
            return {"answer": 42}

    else:

        @app.task("k")
        async def ahandler(ctx: TaskContext) -> dict[str, int]:
            calls.append(ctx.epoch)
            await ctx.checkpoint({"step": 1})
            return {"answer": 42}

    with CheckpointStore(tmp_path / "s", durability="group") as store:
        runner, reporter = _runner(tmp_path, app, store)
        runner.start(_assign("t1", "k"))
        await asyncio.wait_for(reporter.done.wait(), 5)
        first = reporter.results[0]["result"]
        latest = store.load_latest("t1")
        assert latest is not None
        assert latest.info.terminal
        assert latest.info.label == RESULT_LABEL
        assert json.loads(latest.payload) == {"answer": 42}
        await runner.stop("t1", 1, flush=False)
        # The completion was never acknowledged: the task is assigned again at its epoch
        # (a re-attach after a fence, or a restart). The stored result is reported.
        reporter.done.clear()
        runner.start(_assign("t1", "k"))
        await asyncio.wait_for(reporter.done.wait(), 5)
        assert calls == [1], "the handler ran once"
        again = reporter.results[1]
        assert again["result"] == first
        assert again["final_checkpoint"].terminal
        await runner.close()


def _checkpoint_then_block(durability: DurabilityName, go: threading.Event) -> Agent:
    """An app whose sync handler (kind "k") checkpoints once, then waits for ``go``."""
    app = Agent("t")

    @app.task("k", durability=durability)
    def handler(ctx: Any) -> None:
        ctx.checkpoint({"step": 1})
        go.wait(5)

    return app


async def _committed(store: CheckpointStore, task_id: str) -> None:
    """Wait until the task's first checkpoint is in the local store."""
    while store.load_latest(task_id) is None:
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("durability", ["local", "replicated"])
async def test_a_local_checkpoint_wakes_no_loop_and_waits_for_the_tick(
    tmp_path: Path, durability: DurabilityName
) -> None:
    """A sync handler's local-durability record joins the handoff queue; the
    agent's tick (drain_handoff) submits it. A replicated one wakes the loop now."""
    go = threading.Event()
    with CheckpointStore(tmp_path / "s", durability="group") as store:
        runner, _ = _runner(tmp_path, _checkpoint_then_block(durability, go), store)
        replicator = runner.replicator
        runner.start(_assign("t1", "k"))
        async with asyncio.timeout(5):
            await _committed(store, "t1")
            if durability == "replicated":
                while not replicator.items:  # type: ignore[attr-defined]
                    await asyncio.sleep(0.01)
            else:
                await asyncio.sleep(0.2)
                assert replicator.items == []  # type: ignore[attr-defined]
                runner.drain_handoff()  # the agent's tick
                while not replicator.items:  # type: ignore[attr-defined]
                    await asyncio.sleep(0.01)
        (shipped,) = replicator.items  # type: ignore[attr-defined]
        assert shipped.checkpoint is not None
        assert shipped.checkpoint.seq == 1
        go.set()
        await runner.close()


@pytest.mark.parametrize("sync", [True, False])
async def test_a_local_tasks_result_ships_at_once_and_never_lingers(
    tmp_path: Path, sync: bool
) -> None:
    """A result is the terminal checkpoint a new owner completes from without
    calling the handler: it must reach Redis now, not after the tick and the
    linger, even when the task's other records may wait (durability local)."""
    app = Agent("t")
    if sync:

        @app.task("k", durability="local")
        def handler(ctx: Any) -> dict[str, int]:
            ctx.checkpoint({"step": 1})
            return {"answer": 42}

    else:

        @app.task("k", durability="local")
        async def ahandler(ctx: TaskContext) -> dict[str, int]:
            await ctx.checkpoint({"step": 1})
            return {"answer": 42}

    with CheckpointStore(tmp_path / "s", durability="group") as store:
        runner, reporter = _runner(tmp_path, app, store)
        replicator = runner.replicator
        runner.start(_assign("t1", "k"))
        # No drain_handoff() here: the agent's tick never runs in this test.
        async with asyncio.timeout(5):
            while not any(
                i.checkpoint is not None and i.checkpoint.terminal
                for i in replicator.items  # type: ignore[attr-defined]
            ):
                await asyncio.sleep(0.01)
        seqs = [i.checkpoint.seq for i in replicator.items]  # type: ignore[attr-defined]
        terminal = [i.checkpoint.terminal for i in replicator.items]  # type: ignore[attr-defined]
        assert seqs == [1, 2], "the step's record went first, in order, with the result"
        assert terminal == [False, True]
        assert replicator.lingered == [True, False]  # type: ignore[attr-defined]
        await asyncio.wait_for(reporter.done.wait(), 5)
        await runner.close()


async def test_a_tasks_lingering_checkpoints_coalesce_into_one_submit(tmp_path: Path) -> None:
    """Checkpoints of a local task committed between two drains reach the loop's
    work (submit, progress, tracking) as one: the newest, which covers them.
    Every earlier checkpoint's handoff still resolves, with the newest's answer."""
    go = threading.Event()
    app = Agent("t")

    @app.task("k", durability="local")
    def handler(ctx: Any) -> None:
        for i in range(5):
            ctx.checkpoint({"step": i})
        go.wait(5)

    with CheckpointStore(tmp_path / "s", durability="group") as store:
        runner, reporter = _runner(tmp_path, app, store)
        replicator = runner.replicator
        runner.start(_assign("t1", "k"))
        async with asyncio.timeout(5):
            while (latest := store.load_latest("t1")) is None or latest.info.seq < 5:
                await asyncio.sleep(0.01)
            run = runner._runs["t1"]
            assert len(run.shipping) == 5  # committed, waiting for the tick
            runner.drain_handoff()
            while run.shipping:
                await asyncio.sleep(0.01)
        assert [i.checkpoint.seq for i in replicator.items if i.checkpoint] == [5]  # type: ignore[attr-defined]
        assert [c["checkpoint"].seq for c in reporter.progressed if "checkpoint" in c] == [5]
        go.set()
        await runner.close()


def _handoff(run: Any, seq: int = 0, events: tuple[int, ...] = (), linger: bool = True) -> _Handoff:
    """A handoff of task "t" at epoch 1: journal ``events`` then, with ``seq``, a
    checkpoint covering them all."""
    evs = tuple(records_pb2.JournalEventRecord(task_id="t", epoch=1, seq=e) for e in events)
    covers = max(events, default=0)
    ckpt = (
        records_pb2.CheckpointRecord(task_id="t", epoch=1, seq=seq, covers_journal_seq=covers)
        if seq
        else None
    )
    item = ReplicationItem("t", 1, "n", events=evs, checkpoint=ckpt)
    return _Handoff(run, item, seq, covers, None, 0.0, concurrent.futures.Future(), linger)


def test_coalescing_keeps_every_event_no_checkpoint_covers_and_every_urgent_record() -> None:
    """A handoff merges into the next one of its run only when both may linger
    and the later checkpoint covers the earlier's events; other runs' handoffs
    in between change nothing and keep their order."""
    a, b = object(), object()
    a1, b1, a2 = _handoff(a, seq=1), _handoff(b, seq=1), _handoff(a, seq=2)
    a3 = _handoff(a, events=(1,))  # an event the next checkpoint does not cover...
    a4 = _handoff(a, seq=3)  # ...covers_journal_seq 0 < 1: a3 stays
    a5 = _handoff(a, seq=4, events=(2,), linger=False)  # a result: never merged
    a6 = _handoff(a, seq=5)
    kept = coalesce_handoffs([a1, b1, a2, a3, a4, a5, a6])
    assert kept == [b1, a2, a3, a4, a5, a6]
    assert a2.absorbed == [a1.out]
    assert a4.absorbed == a6.absorbed == []
    a7, a8, a9 = _handoff(a, seq=6), _handoff(a, seq=7), _handoff(a, seq=8, events=(3,))
    assert coalesce_handoffs([a7, a8, a9]) == [a9]
    assert a9.absorbed == [a7.out, a8.out]


async def test_the_tick_holds_lingering_records_until_they_nearly_lingered_out(
    tmp_path: Path,
) -> None:
    """The tick leaves a local record in the handoff queue until it is
    ``linger_s - HANDOFF_HOLD_MARGIN_S`` old, then submits it with its age, so
    the replicator's linger counts from the commit (Redis is not reached later)."""
    go = threading.Event()
    with CheckpointStore(tmp_path / "s", durability="group") as store:
        runner, _ = _runner(tmp_path, _checkpoint_then_block("local", go), store)
        replicator = runner.replicator
        runner.start(_assign("t1", "k"))
        async with asyncio.timeout(5):
            await _committed(store, "t1")
            runner.drain_handoff(hold=True)
            await asyncio.sleep(0.1)
            assert replicator.items == []  # type: ignore[attr-defined]
            hold_s = replicator.linger_s - HANDOFF_HOLD_MARGIN_S  # type: ignore[attr-defined]
            await asyncio.sleep(hold_s)
            runner.drain_handoff(hold=True)
            while not replicator.items:  # type: ignore[attr-defined]
                await asyncio.sleep(0.01)
        assert replicator.lingered == [True]  # type: ignore[attr-defined]
        (age,) = replicator.ages  # type: ignore[attr-defined]
        assert hold_s <= age < replicator.linger_s + 1  # type: ignore[attr-defined]
        go.set()
        await runner.close()


async def test_a_stop_without_flush_still_ships_what_lingers_at_once(tmp_path: Path) -> None:
    """A fenced (or revoked) owner's lingering local records head for Redis at
    the stop, not a tick and a linger later: sooner there, before a new owner's
    claim refuses them. The stop does not wait for them (no ``flush``)."""
    go = threading.Event()
    with CheckpointStore(tmp_path / "s", durability="group") as store:
        runner, _ = _runner(tmp_path, _checkpoint_then_block("local", go), store)
        replicator = runner.replicator
        runner.start(_assign("t1", "k"))
        await asyncio.wait_for(_committed(store, "t1"), 5)
        assert replicator.items == []  # type: ignore[attr-defined]  # waits for the tick
        await asyncio.wait_for(runner.stop("t1", 1, flush=False), 5)  # the handler ignores it
        (shipped,) = replicator.items  # type: ignore[attr-defined]
        assert shipped.checkpoint is not None
        assert shipped.checkpoint.seq == 1
        assert getattr(replicator, "flushes", 0) >= 1
        go.set()
        await runner.close()


async def test_context_calls_after_the_fence_deadline_fail_in_the_handler_thread(
    tmp_path: Path,
) -> None:
    """No hop to the event loop: the loop is blocked while the handler checks."""
    seen: list[str] = []
    go = threading.Event()
    app = Agent("t")

    @app.task("k")
    def handler(ctx: Any) -> None:
        ctx.ensure_owner()
        seen.append("owner")
        go.wait(5)
        for call in (ctx.ensure_owner, lambda: ctx.checkpoint({"x": 1}), lambda: ctx.record(1)):
            try:
                call()
                seen.append("passed")
            except OwnershipLapsed:
                seen.append("lapsed")
        assert ctx.cancelled

    with CheckpointStore(tmp_path / "s", durability="group") as store:
        runner, _ = _runner(tmp_path, app, store)
        runner.start(_assign("t1", "k"))
        while not seen:
            await asyncio.sleep(0.01)
        runner.ownership = Ownership(time.monotonic() + 0.05)
        time.sleep(0.1)  # noqa: ASYNC251 -- the deadline passes while the loop is blocked
        go.set()
        time.sleep(0.3)  # noqa: ASYNC251 -- the thread checks without the loop
        assert seen == ["owner", "lapsed", "lapsed", "lapsed"]
        assert store.load_latest("t1") is None
        await runner.close()


def _one_checkpoint_app(out: list[str]) -> Agent:
    """An app whose sync ``k`` handler checkpoints once and appends "saved" or "lapsed"."""
    app = Agent("t")

    @app.task("k")
    def handler(ctx: Any) -> None:
        try:
            ctx.checkpoint({"x": 1})
            out.append("saved")
        except OwnershipLapsed:
            out.append("lapsed")

    return app


async def test_a_checkpoint_acknowledged_after_the_deadline_does_not_return_success(
    tmp_path: Path,
) -> None:
    out: list[str] = []
    app = _one_checkpoint_app(out)

    with CheckpointStore(tmp_path / "s", durability="group") as store:
        runner, _ = _runner(tmp_path, app, store)
        real_save = store.save

        def slow_save(cp: Any) -> Any:
            outcome = real_save(cp)
            runner.ownership = Ownership(time.monotonic() - 0.001)  # the deadline passed
            return outcome

        store.save = slow_save  # type: ignore[method-assign]
        runner.start(_assign("t1", "k"))
        for _ in range(200):
            if out:
                break
            await asyncio.sleep(0.01)
        assert out == ["lapsed"]
        await runner.close()


class _SilentReplicator(AckingReplicator):
    """Never acknowledges (Redis down): every submit's future stays pending."""

    async def submit(
        self, item: ReplicationItem, *, linger: bool = False, age_s: float = 0.0
    ) -> asyncio.Future[ReplicationResult]:
        self.items.append(item)
        self.pending = asyncio.get_running_loop().create_future()
        return self.pending


async def test_a_handler_waiting_for_a_redis_ack_that_never_comes_ends_at_its_fence(
    tmp_path: Path,
) -> None:
    """A sync handler's replicated checkpoint waits for Redis; Redis never answers
    and the fence deadline passes: the call raises OwnershipLapsed and the
    handler thread ends, instead of blocking forever (a thread that also held
    the interpreter's exit, seen as a CI run that never ended)."""
    out: list[str] = []
    app = _one_checkpoint_app(out)

    with CheckpointStore(tmp_path / "s", durability="group") as store:
        runner, _ = _runner(tmp_path, app, store)
        replicator = _SilentReplicator()
        runner.replicator = replicator  # type: ignore[assignment]
        runner.start(_assign("t1", "k", durability=REPLICATED))
        for _ in range(500):
            if replicator.items:
                break
            await asyncio.sleep(0.01)
        assert replicator.items, "the checkpoint never reached the replicator"
        runner.ownership = Ownership(time.monotonic() - 0.001)  # the deadline passed
        try:
            for _ in range(500):
                if out:
                    break
                await asyncio.sleep(0.01)
            assert out == ["lapsed"], "the handler still waits for Redis past its fence"
        finally:
            if not replicator.pending.done():  # let a stuck thread go (mechanism off)
                replicator.pending.set_result(ReplicationResult(Outcome.OK, 1))
            await runner.close()


# ------------------------------------------------------------------- the SDK


class _Host:
    cancelled = False
    incarnation = "inc-9"


def test_fencing_token_names_task_epoch_and_incarnation() -> None:
    ctx = TaskContext(
        task_id="t-1",
        kind="k",
        epoch=7,
        attempt=1,
        payload=None,
        restored=Restored(state=None, checkpoint_seq=0, covers_journal_seq=0),
        node_id="n",
        host=_Host(),  # type: ignore[arg-type]
    )
    token = ctx.fencing_token
    assert token == FencingToken("t-1", 7, "inc-9")
    assert token.header_value() == "7;inc-9;t-1"
    ctx.ensure_owner()  # a host without ensure_owner: the cancelled flag decides
    _Host.cancelled = True
    with pytest.raises(TaskCancelled):
        ctx.ensure_owner()
    _Host.cancelled = False


# ------------------------------------------------------- process isolation


def _pid_alive(pid: int) -> bool:
    """True while ``pid`` runs: a killed child not yet reaped (state Z) runs nothing."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return False
    return state not in ("Z", "X")


async def _checkpointed_pid(runner: TaskRunner, store: CheckpointStore, task_id: str) -> int:
    """The pid the task's handler checkpointed (its worker spools it; the agent's
    tick, ``ingest_spools``, moves it into the store)."""
    for _ in range(500):
        runner.ingest_spools()
        latest = store.load_latest(task_id)
        if latest is not None:
            return int(json.loads(latest.payload)["pid"])
        await asyncio.sleep(0.02)
    raise AssertionError("the handler never checkpointed")


def _process_app() -> Agent:
    app = Agent("p")
    app.task("steps", isolation="process")(taskpath_workers.steps)
    app.task("spin", isolation="process")(taskpath_workers.report_pid_then_spin)
    return app


async def test_process_isolation_runs_the_handler_in_a_worker_and_commits_its_result(
    tmp_path: Path,
) -> None:
    with CheckpointStore(tmp_path / "s", durability="group") as store:
        runner, reporter = _runner(tmp_path, _process_app(), store)
        runner.start(_assign("t1", "steps"))
        await asyncio.wait_for(reporter.done.wait(), 30)
        result = json.loads(reporter.results[0]["result"].payload)
        assert result["pid"] != os.getpid()
        assert result["token"] == "1;inc-1;t1"
        infos = store.list("t1")
        assert [i.seq for i in infos] == [1, 2, 3, 4]
        assert infos[-1].label == RESULT_LABEL
        await runner.close()


async def test_workers_run_at_a_lower_cpu_priority_than_the_agent(tmp_path: Path) -> None:
    """A CPU-bound handler must not take a core from the agent's heartbeats and relay."""
    with CheckpointStore(tmp_path / "s", durability="group") as store:
        runner, reporter = _runner(tmp_path, _process_app(), store)
        runner.start(_assign("t1", "steps"))
        await asyncio.wait_for(reporter.done.wait(), 30)
        pid = json.loads(reporter.results[0]["result"].payload)["pid"]
        agent_nice = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, agent_nice + DEFAULT_WORKER_NICE)
        await runner.close()


async def test_sigkill_of_a_worker_fails_only_its_task_readably_and_retryably(
    tmp_path: Path,
) -> None:
    with CheckpointStore(tmp_path / "s", durability="group") as store:
        runner, reporter = _runner(tmp_path, _process_app(), store)
        runner.start(_assign("victim", "spin"))
        pid = await _checkpointed_pid(runner, store, "victim")
        os.kill(pid, signal.SIGKILL)
        await asyncio.wait_for(reporter.done.wait(), 10)
        error = reporter.results[0]["error"]
        assert error.retryable
        assert f"pid {pid}" in error.message
        assert "killed by SIGKILL" in error.message
        reporter.done.clear()
        runner.start(_assign("other", "steps"))  # the runner (the agent) goes on
        await asyncio.wait_for(reporter.done.wait(), 30)
        assert reporter.results[1]["result"] is not None
        await runner.close()


async def test_a_worker_killed_while_its_checkpoint_is_answered_fails_readably(
    tmp_path: Path,
) -> None:
    """The worker dies between its checkpoint request and the agent's answer: the
    answer meets a broken pipe, which is the worker's death (seen in CI as a
    task failed with "BrokenPipeError"), reported with its pid and signal."""
    with CheckpointStore(tmp_path / "s", durability="group") as store:
        runner, reporter = _runner(tmp_path, _process_app(), store)
        original = runner._checkpoint_sync
        killed: list[int] = []

        def checkpoint_then_kill(run: Any, state: Any, reason: str, **kw: Any) -> int:
            seq = original(run, state, reason, **kw)
            if not killed and run.worker is not None:
                pid = run.worker.pid
                os.kill(pid, signal.SIGKILL)
                for _ in range(200):  # until its end of the channel is closed
                    if not _pid_alive(pid):
                        break
                    time.sleep(0.01)
                killed.append(pid)
            return seq

        runner._checkpoint_sync = checkpoint_then_kill  # type: ignore[method-assign]
        # replicated: its checkpoints go to the agent (a local task's are spooled)
        runner.start(_assign("victim", "steps", durability=REPLICATED))
        await asyncio.wait_for(reporter.done.wait(), 30)
        error = reporter.results[0]["error"]
        assert killed
        assert error is not None
        assert error.retryable
        assert f"pid {killed[0]}" in error.message, error.message
        assert "killed by SIGKILL" in error.message
        await runner.close()


async def test_a_stopped_handler_process_that_ignores_cancellation_is_killed(
    tmp_path: Path,
) -> None:
    with CheckpointStore(tmp_path / "s", durability="group") as store:
        runner, reporter = _runner(tmp_path, _process_app(), store)
        runner.start(_assign("zombie", "spin"))
        pid = await _checkpointed_pid(runner, store, "zombie")
        await runner.stop("zombie", 1, flush=False)  # as at a fence or a revoke
        assert not _pid_alive(pid), "the handler process outlived its stop"
        assert not reporter.results
        await runner.close()


# ------------------------------------------------------- the checkpoint spool


def _sample(runner: TaskRunner, name: str, labels: dict[str, str]) -> float:
    return runner.metrics.registry.get_sample_value(name, labels) or 0.0


def _spooled(runner: TaskRunner, outcome: str) -> float:
    return _sample(runner, "lazarus_agent_spooled_checkpoints_total", {"outcome": outcome})


async def test_a_local_tasks_checkpoints_commit_in_its_worker_not_in_the_agent(
    tmp_path: Path,
) -> None:
    """No checkpoint of a local process task reaches the agent's commit path: the
    worker spools it, and the agent ingests the spool, in order, before the result."""
    with CheckpointStore(tmp_path / "s", durability="group") as store:
        runner, reporter = _runner(tmp_path, _process_app(), store)
        committed: list[bool] = []  # the ``result`` flag of every commit the agent made
        original = runner._checkpoint_sync

        def counting(run: Any, state: Any, reason: str, **kw: Any) -> int:
            committed.append(kw.get("result", False))
            return original(run, state, reason, **kw)

        runner._checkpoint_sync = counting  # type: ignore[method-assign]
        runner.start(_assign("t1", "steps"))
        await asyncio.wait_for(reporter.done.wait(), 30)
        assert committed == [True], "the agent committed only the result"
        infos = store.list("t1")
        assert [(i.seq, i.label) for i in infos][-1] == (4, RESULT_LABEL)
        assert [json.loads(store.load(i.ref).payload) for i in infos[:3]] == [
            {"i": 1},
            {"i": 2},
            {"i": 3},
        ]
        assert _spooled(runner, "ingested") == 3
        shipped = [i.checkpoint.seq for i in runner.replicator.items if i.checkpoint]  # type: ignore[attr-defined]
        assert shipped == [3, 4], "the newest spooled checkpoint, then the result"
        await runner.close()


def _checkpoint_count(runner: TaskRunner, durability: str) -> float:
    return _sample(runner, "lazarus_agent_checkpoint_seconds_count", {"durability": durability})


async def test_a_workers_checkpoint_calls_are_in_the_agents_checkpoint_histogram(
    tmp_path: Path,
) -> None:
    """``lazarus_agent_checkpoint_seconds`` counts a process task's spooled
    checkpoints (timed in its worker) beside the agent's own commits (the
    result), and keeps a worker's counts after that worker is SIGKILLed."""
    with CheckpointStore(tmp_path / "s", durability="group") as store:
        runner, reporter = _runner(tmp_path, _process_app(), store)
        runner.start(_assign("t1", "steps"))
        await asyncio.wait_for(reporter.done.wait(), 30)
        # three spooled in the worker, the result committed by the agent
        assert _checkpoint_count(runner, "local") == 4
        seconds = _sample(runner, "lazarus_agent_checkpoint_seconds_sum", {"durability": "local"})
        assert 0 < seconds < 30
        reporter.done.clear()
        runner.start(_assign("victim", "spin"))  # one spooled checkpoint, then spins
        pid = await _checkpointed_pid(runner, store, "victim")
        os.kill(pid, signal.SIGKILL)
        await asyncio.wait_for(reporter.done.wait(), 10)
        assert not _pid_alive(pid)
        assert _checkpoint_count(runner, "local") == 5, "the dead worker's count was lost"
        await runner.close()
        assert _checkpoint_count(runner, "local") == 5


async def test_what_a_killed_worker_spooled_is_ingested_not_lost(tmp_path: Path) -> None:
    """A checkpoint that returned to its handler is durable: the worker's death
    (SIGKILL before any ingestion) does not lose it; the agent ingests it."""
    with CheckpointStore(tmp_path / "s", durability="group") as store:
        runner, reporter = _runner(tmp_path, _process_app(), store)
        runner.start(_assign("victim", "spin"))
        spool_dir = tmp_path / "s" / "spool"
        async with asyncio.timeout(30):
            while True:  # read the spool as a bystander: the agent has not ingested it
                rows = [r for p in spool_dir.glob("*.db") for r in SpoolReader(p).read()]
                if rows:
                    break
                await asyncio.sleep(0.02)
        assert store.load_latest("victim") is None
        (row,) = rows
        pid = json.loads(row.payload)["pid"]
        os.kill(pid, signal.SIGKILL)
        await asyncio.wait_for(reporter.done.wait(), 10)
        latest = store.load_latest("victim")
        assert latest is not None, "the acknowledged checkpoint was lost with its worker"
        assert json.loads(latest.payload) == {"pid": pid}
        assert latest.info.seq == 1
        assert list(spool_dir.glob("*.db")) == [], "the dead worker's spool was removed"
        await runner.close()


async def test_an_agent_ingests_the_spools_its_previous_process_left(tmp_path: Path) -> None:
    """Spool files found at start go into the store before anything reads it:
    rows in order, a row ingested before a crash dropped as a duplicate, a row
    that fails its checksum dropped and counted; then the files are deleted."""
    data_dir = tmp_path / "s"
    with CheckpointStore(data_dir, durability="group") as store:
        store.save(Checkpoint("t", 1, b'{"i":0}'))  # the task's head: seq 1
        spool = SpoolWriter(data_dir / "spool" / "worker-1.db")
        for i in (1, 2):
            spool.append("t", 1, 1 + i, 0, "", json.dumps({"i": i}).encode())
        spool.close()
        runner, _ = _runner(tmp_path, _process_app(), store)
        assert runner.ingest_leftover_spools() == 1
        assert [json.loads(store.load(i.ref).payload) for i in store.list("t")] == [
            {"i": 0},
            {"i": 1},
            {"i": 2},
        ]
        assert list((data_dir / "spool").glob("*")) == []
        await runner.close()
    # Duplicates and corruption, through the store's ingest directly:
    with CheckpointStore(data_dir, durability="group") as store:
        head = store.task_head("t")
        assert head is not None
        assert head.last_checkpoint_seq == 3
        (stored,) = store.ingest([(Checkpoint("t", 1, b'{"i":3}'), 4, 1000)])
        assert stored is not None
        assert stored.seq == 4
        again = store.ingest([(Checkpoint("t", 1, b'{"i":3}'), 4, 1000)])
        assert again == [None], "the same row twice is stored once"
        (stale,) = store.ingest([(Checkpoint("t", 0, b"{}"), 5, 1001)])
        assert isinstance(stale, StaleEpoch)
        (moved,) = store.ingest([(Checkpoint("t", 1, b'{"i":9}'), 4, 2000)])
        assert moved is not None
        assert moved.seq == 5, "a different row at a taken seq is renumbered"


async def test_a_corrupt_spool_row_is_dropped_and_counted(tmp_path: Path) -> None:
    data_dir = tmp_path / "s"
    with CheckpointStore(data_dir, durability="group") as store:
        path = data_dir / "spool" / "worker-1.db"
        spool = SpoolWriter(path)
        spool.append("t", 1, 1, 0, "", b'{"i":1}')
        spool.append("t", 1, 2, 0, "", b'{"i":2}')
        spool.close()
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE spool SET payload = ? WHERE seq = 1", (b'{"i":7}',))
        runner, _ = _runner(tmp_path, _process_app(), store)
        runner.ingest_leftover_spools()
        assert _spooled(runner, "corrupt") == 1
        assert [json.loads(store.load(i.ref).payload) for i in store.list("t")] == [{"i": 2}]
        await runner.close()


def test_a_worker_whose_agent_is_gone_lapses_at_its_next_context_call() -> None:
    """An orphaned worker (its agent SIGKILLed) commits nothing more: its
    parent changed, so every context call and ensure_owner raise."""
    shared = [time.monotonic() + 60, 0.0, 0.0]  # deadline far ahead, not fenced, not stopped
    fields = {
        "task_id": "t",
        "kind": "k",
        "epoch": 1,
        "attempt": 1,
        "payload": None,
        "restored": None,
        "node_id": "n",
        "incarnation": "i",
    }
    ProcessTaskContext(fields, None, shared, agent_pid=os.getppid()).ensure_owner()
    orphan = ProcessTaskContext(fields, None, shared, agent_pid=os.getppid() + 1_000_000)
    with pytest.raises(OwnershipLapsed, match="agent process is gone"):
        orphan.ensure_owner()


def test_a_spool_commit_that_fails_says_so_and_saves_nothing(tmp_path: Path) -> None:
    """A failed spooled checkpoint (a full disk, an I/O error) raises a
    StoreIOError naming the spool into the handler; nothing of it is stored."""
    spool = SpoolWriter(tmp_path / "w.db")
    spool._conn.execute("PRAGMA query_only=1")  # every write now fails, as on a full disk
    with pytest.raises(StoreIOError, match="nothing of it was saved"):
        spool.append("t", 1, 1, 0, "", b"{}")
    spool.close()
    assert SpoolReader(tmp_path / "w.db").read() == []
