"""A restore's lineage copy (``<task>~lineage-e<epoch>``) is reported as a fork, then forgotten.

When a task starts at a newer epoch and Redis holds a newer lineage, the
runner adopts it and the store moves this node's divergent local rows to a
lineage copy (``CheckpointStore.adopt``). Before the fix nothing ever read a
copy again: its rows were reported to nobody (no ForkRecord, no
LineageReport) and stayed in the store for good. When the node's own fork of
that epoch raced the adopt, or was never due (a PAUSED task assigned again at a
newer epoch), the copy is the only record of that work (DESIGN.md §7: kept as a
fork and reported, never silently dropped).

The rule (``node_agent/core/core.py``, **Forgetting a lineage copy**): every
copy is reported through the fork path (ForkRecord and records in Redis,
LineageReport) and forgotten only once the fork is in Redis and the leader
acknowledged it; a copy left by an earlier process is reported at the start.

Real ``CheckpointStore``, agent shell, core and runner; Redis replaced by fakes.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from test_agent_core import Driver

from lazarus.storage.keys import fork_key, fork_records_key
from lazarus.storage.replica import RemoteState
from lazarus.v1 import agent_pb2, records_pb2
from lazarus_dev.runner_fakes import assign, make_runner
from node_agent import convert
from node_agent.agent import NodeAgent
from node_agent.checkpoint import AdoptedCheckpoint, AdoptedEvent, Checkpoint, CheckpointStore
from node_agent.checkpoint.model import make_ref
from node_agent.checkpoint.store import lineage_copy_of
from node_agent.core import ForgetTask, Send
from node_agent.core import records as rec
from node_agent.core.core import ReportLineageCopy
from node_agent.replication import Outcome, ReplicationResult
from node_agent.sdk import Agent
from node_agent.settings import AgentSettings

COPY = "t~lineage-e1"

# ------------------------------------------------------------------- the core


def _fork(fork_id: str, epoch: int = 1) -> rec.LineageReport:
    return rec.LineageReport(fork_id, "t", epoch, b"")


def test_a_copy_is_reported_once_and_forgotten_only_after_the_ack() -> None:
    d = Driver()
    d.ack_all(d.connect())
    out = d.core.lineage_copy_kept("t", COPY)
    assert [c for c in out if isinstance(c, ReportLineageCopy)] == [ReportLineageCopy("t", COPY, 1)]
    assert d.core.lineage_copy_kept("t", COPY) == [], "a copy being reported is reported once"
    out = d.core.lineage_ready(_fork("f1"), copy_task_id=COPY)
    assert [type(c) for c in out] == [Send]
    assert not [c for c in out if isinstance(c, ForgetTask)], "forgotten before the ack"
    out = d.msg(rec.LineageAck("f1", "t", 1))
    assert [c for c in out if isinstance(c, ForgetTask)] == [ForgetTask(COPY)]
    # Settled: a copy of that name made later is a new one, with a new fork id.
    (report,) = [c for c in d.core.lineage_copy_kept("t", COPY) if isinstance(c, ReportLineageCopy)]
    assert report.report_seq == 2


def test_a_copy_whose_fork_is_not_in_redis_is_kept() -> None:
    d = Driver()
    d.ack_all(d.connect())
    d.core.lineage_copy_kept("t", COPY)
    d.core.lineage_ready(_fork("f1"), stored=False, copy_task_id=COPY)
    out = d.msg(rec.LineageAck("f1", "t", 1))
    assert not [c for c in out if isinstance(c, ForgetTask)], "its only full copy was deleted"
    assert d.core.lineage_copy_kept("t", COPY) == [], "reported again only after a restart"


def test_an_empty_copy_is_forgotten_at_once() -> None:
    d = Driver()
    d.core.lineage_copy_kept("t", COPY)
    assert d.core.lineage_copy_empty(COPY) == [ForgetTask(COPY)]
    assert d.core.lineage_copy_empty(COPY) == []


def test_lineage_copy_of_names_the_task() -> None:
    assert lineage_copy_of("t~lineage-e1") == "t"
    assert lineage_copy_of("a~b~lineage-e12-3") == "a~b"
    assert lineage_copy_of("t") == ""
    assert lineage_copy_of("t~lineage-e") == ""
    assert lineage_copy_of("t~e3~n1~abcd1234") == ""


# ------------------------------------------------- the shell, end to end


class _Pipeline:
    def __init__(self, redis: _Redis) -> None:
        self._redis = redis
        self._ops: list[tuple[str, tuple[Any, ...]]] = []

    async def __aenter__(self) -> _Pipeline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    def hset(self, key: str, field: str, value: bytes) -> None:
        self._ops.append(("hset", (key, field, value)))

    def set(self, key: str, value: bytes) -> None:
        self._ops.append(("set", (key, value)))

    async def execute(self) -> None:
        if self._redis.down:
            raise ConnectionError("redis down")
        for op, args in self._ops:
            if op == "hset":
                key, field, value = args
                self._redis.hashes.setdefault(key, {})[field] = value
            else:
                self._redis.strings[args[0]] = args[1]


class _Redis:
    """The slice of redis.asyncio a fork write uses: a MULTI pipeline of HSET and SET."""

    def __init__(self) -> None:
        self.hashes: dict[str, dict[str, bytes]] = {}
        self.strings: dict[str, bytes] = {}
        self.down = False

    def pipeline(self, transaction: bool = True) -> _Pipeline:
        return _Pipeline(self)


def _remote_events() -> list[tuple[int, bytes]]:
    return [(2, b'{"ev": "new-2"}'), (3, b'{"ev": "new-3"}')]


class _Claims:
    """Redis holds epoch 2's lineage of ``t``: checkpoint seq 2 (covers 1), events 2 and 3."""

    async def claim_load(self, task_id: str, epoch: int, node_id: str) -> Any:
        ck = records_pb2.CheckpointRecord(
            task_id=task_id, epoch=2, seq=2, covers_journal_seq=1, payload=b'{"step": "new"}'
        )
        events = tuple(
            records_pb2.JournalEventRecord(task_id=task_id, epoch=2, seq=seq, payload=payload)
            for seq, payload in _remote_events()
        )
        remote = RemoteState(task_id, epoch, 2, 2, 1, 3, "n2", 0, ck, events)
        return ReplicationResult(Outcome.OK, epoch), remote


class _Epoch2Claims:
    """Redis holds epoch 2's checkpoint ``seq`` (covering ``covers``); epoch 2 resumed
    from journal seq 1, checkpoint seq 1, and this node's claim found ``claimed``
    (journal seq, checkpoint seq)."""

    def __init__(self, seq: int, covers: int, payload: bytes, claimed: tuple[int, int]) -> None:
        self.seq, self.covers, self.payload, self.claimed = seq, covers, payload, claimed

    async def claim_load(self, task_id: str, epoch: int, node_id: str) -> Any:
        ck = records_pb2.CheckpointRecord(
            task_id=task_id,
            epoch=2,
            seq=self.seq,
            covers_journal_seq=self.covers,
            payload=self.payload,
        )
        remote = RemoteState(
            task_id,
            epoch,
            self.seq,
            2,
            self.covers,
            self.covers,
            "n2",
            0,
            ck,
            (),
            bases={2: (1, 1), epoch: self.claimed},
        )
        return ReplicationResult(Outcome.OK, epoch), remote


def _claims_past_the_zombie() -> _Epoch2Claims:
    """Epoch 2 went on to seq 3 (covers 3) before this node claimed epoch 3."""
    return _Epoch2Claims(3, 3, b'{"step": 3}', (3, 3))


def _claims_of_a_shorter_newer_lineage() -> _Epoch2Claims:
    """Epoch 2 wrote only seq 2 (covers 1); this node's epoch-1 branch went on to
    seq 4 without reaching Redis."""
    return _Epoch2Claims(2, 1, b'{"step": "e2"}', (1, 2))


def _app() -> Agent:
    app = Agent("t")

    @app.task("k", durability="local")
    def handler(ctx: Any) -> dict[str, int]:
        return {"ok": 1}

    return app


def _zombie_rows(store: CheckpointStore) -> None:
    """What this node did at epoch 1: event 1 and checkpoint 1 reached Redis, the
    rest (event 2, checkpoint 2) never did."""
    store.append("t", b'{"ev": 1}', epoch=1)
    store.save(Checkpoint("t", 1, b'{"step": 1}', 1))
    store.append("t", b'{"ev": "zombie-2"}', epoch=1)
    store.save(Checkpoint("t", 1, b'{"step": "zombie"}', 2))


def _agent(tmp_path: Path, app: Agent, store: CheckpointStore) -> tuple[NodeAgent, _Redis]:
    settings = AgentSettings(node_id="n1", coordinators=("c1:1",), data_dir=tmp_path / "s")
    agent = NodeAgent(settings, app=app)
    runner = make_runner(app, store, agent, claims=_Claims(), incarnation=agent.incarnation)
    redis = _Redis()
    agent._store, agent._runner, agent._redis = store, runner, redis  # type: ignore[assignment]
    return agent, redis


async def _step(agent: NodeAgent, commands: list[Any]) -> None:
    async with agent._lock:
        await agent._execute(commands)


async def _open(agent: NodeAgent) -> asyncio.Queue[agent_pb2.AgentMessage]:
    """A Session with the leader: Hello, Welcome; returns the outbound queue."""
    outbound: asyncio.Queue[agent_pb2.AgentMessage] = asyncio.Queue()
    agent._outbound = outbound
    now = time.monotonic()
    hello = agent.core.hello(now, 0)
    welcome = rec.Welcome(term=1, fence_after_ms=3_600_000, hello_seq=hello.hello_seq)
    await _step(agent, agent.core.on_message(welcome, now, 0))
    return outbound


async def _settle(agent: NodeAgent) -> None:
    while agent._tasks:
        await asyncio.gather(*list(agent._tasks), return_exceptions=True)


async def _assign_back(agent: NodeAgent, runner: Any) -> float:
    """The leader gives ``t`` back to this node at epoch 3; waits until its run and
    every report it spawned ended. Returns the time the Assign was stepped."""
    now = time.monotonic()
    message = agent_pb2.CoordinatorMessage(assign=assign("t", "k", epoch=3))
    await _step(agent, agent.core.on_message(convert.coordinator_message_from_pb(message), now, 0))
    await runner._runs["t"].task
    await _settle(agent)
    return now


def _the_zombies_fork(redis: _Redis, missing: str) -> tuple[str, agent_pb2.LineageReport]:
    """The one fork in Redis: ``_zombie_rows``' epoch-1 seq 2 and event 2, in ``t~lineage-e1``."""
    forks = redis.hashes.get(fork_key("t"), {})
    assert len(forks) == 1, missing
    ((fork_id, raw),) = forks.items()
    record = records_pb2.ForkRecord.FromString(raw)
    assert (record.lineage_task_id, record.stale_epoch) == (COPY, 1)
    assert (record.divergent_checkpoints, record.head_checkpoint.seq) == (1, 2)
    assert (record.divergent_journal_events, record.first_divergent_journal_seq) == (1, 2)
    full = agent_pb2.LineageReport.FromString(redis.strings[fork_records_key("t", fork_id)])
    assert [c.payload for c in full.checkpoints] == [b'{"step": "zombie"}']
    assert [e.payload for e in full.journal_events] == [b'{"ev": "zombie-2"}']
    return fork_id, full


def _lineage_reports(outbound: asyncio.Queue[agent_pb2.AgentMessage]) -> list[Any]:
    out = []
    while not outbound.empty():
        msg = outbound.get_nowait()
        if msg.HasField("lineage_report"):
            out.append(msg.lineage_report)
    return out


async def test_an_adopts_lineage_copy_is_reported_as_a_fork_then_forgotten(
    tmp_path: Path,
) -> None:
    """The old owner gets ``t`` back at epoch 3; Redis holds epoch 2's seq 2, so
    the restore adopts it and moves this node's epoch-1 seq 2 to ``t~lineage-e1``.
    Before the fix nothing reported that row and the copy stayed for good."""
    app = _app()
    with CheckpointStore(tmp_path / "s", durability="group") as store:
        _zombie_rows(store)
        agent, redis = _agent(tmp_path, app, store)
        runner = agent._runner
        assert runner is not None
        outbound = await _open(agent)
        now = await _assign_back(agent, runner)

        assert COPY in {h.task_id for h in store.task_heads()}
        fork_id, full = _the_zombies_fork(redis, "the copy's rows were reported to nobody")
        assert [c.parent_ref for c in full.checkpoints] == [make_ref("t", 2)]
        (wire,) = _lineage_reports(outbound)
        assert (wire.fork_id, wire.task_id, wire.epoch) == (fork_id, "t", 1)

        # Kept until the leader acknowledges the fork, then forgotten.
        await _step(agent, agent.core.on_message(rec.LineageAck(fork_id, "t", 1), now, 0))
        assert COPY not in {h.task_id for h in store.task_heads()}
        assert store.list(COPY) == []
        assert (2, 2) in {(i.seq, i.epoch) for i in store.list("t")}, "the task's rows are kept"
        await runner.close()


async def test_an_old_owners_row_below_the_adopted_seq_is_reported_as_a_fork(
    tmp_path: Path,
) -> None:
    """As above, but epoch 2 went on to seq 3 before this node got ``t`` back: the
    zombie's seq 2 is below the adopted checkpoint. Before the fix the adopt
    left it in ``t``'s history between seq 1 and epoch 2's seq 3, and no fork
    reported it; now the claims' bases (epoch 2 resumed from seq 1) move it to
    the copy, which is reported."""
    app = _app()
    with CheckpointStore(tmp_path / "s", durability="group") as store:
        _zombie_rows(store)
        agent, redis = _agent(tmp_path, app, store)
        runner = agent._runner
        assert runner is not None
        runner._claims = _claims_past_the_zombie()  # type: ignore[assignment]
        outbound = await _open(agent)
        await _assign_back(agent, runner)

        assert sorted((i.seq, i.epoch) for i in store.list("t"))[:2] == [(1, 1), (3, 2)]
        fork_id, _ = _the_zombies_fork(redis, "the zombie's seq 2 was reported to nobody")
        (wire,) = _lineage_reports(outbound)
        assert wire.fork_id == fork_id
        await runner.close()


async def test_a_copy_not_written_to_redis_is_kept_and_reported_after_a_restart(
    tmp_path: Path,
) -> None:
    """Redis is down when the copy is reported: the copy stays after the ack (its
    rows are in no fork in Redis). A restarted agent finds it in the store,
    reports it, and forgets it once acknowledged."""
    app = _app()
    with CheckpointStore(tmp_path / "s", durability="group") as store:
        _zombie_rows(store)
        store.adopt(
            "t",
            epoch=3,
            checkpoint=AdoptedCheckpoint(2, 2, 1, b'{"step": "new"}'),
            events=[AdoptedEvent(seq, 2, payload) for seq, payload in _remote_events()],
        )
        assert COPY in {h.task_id for h in store.task_heads()}
        agent, redis = _agent(tmp_path, app, store)
        redis.down = True
        await _open(agent)
        await agent._report_leftover_copies(set(store.metas()))
        await _settle(agent)
        assert redis.hashes == {}
        (fork_id,) = agent.core.pending_forks
        now = time.monotonic()
        await _step(agent, agent.core.on_message(rec.LineageAck(fork_id, "t", 1), now, 0))
        assert COPY in {h.task_id for h in store.task_heads()}, "its only full copy was deleted"
        await agent._runner.close()  # type: ignore[union-attr]

        restarted, redis = _agent(tmp_path, app, store)
        await restarted._report_leftover_copies(set(store.metas()))
        await _settle(restarted)
        (wire,) = _lineage_reports(await _open(restarted))  # sent with the first Welcome
        ((fork_id, raw),) = redis.hashes[fork_key("t")].items()
        assert records_pb2.ForkRecord.FromString(raw).lineage_task_id == COPY
        assert restarted.incarnation[:8] in fork_id
        assert wire.fork_id == fork_id
        await _step(restarted, restarted.core.on_message(rec.LineageAck(fork_id, "t", 1), now, 0))
        assert COPY not in {h.task_id for h in store.task_heads()}
        await restarted._runner.close()  # type: ignore[union-attr]


async def test_a_task_named_like_a_copy_is_left_alone(tmp_path: Path) -> None:
    """A task with a meta is the application's, whatever its name."""
    app = _app()
    with CheckpointStore(tmp_path / "s", durability="group") as store:
        store.save(Checkpoint(COPY, 1, b"{}"))
        store.put_meta(COPY, b"{}")
        agent, redis = _agent(tmp_path, app, store)
        await agent._report_leftover_copies(set(store.metas()))
        await _settle(agent)
        assert agent.core.pending_forks == []
        assert redis.hashes == {}
        await agent._runner.close()  # type: ignore[union-attr]


async def test_a_newer_owners_shorter_lineage_wins_over_this_nodes_longer_stale_branch(
    tmp_path: Path,
) -> None:
    """This node gets ``t`` back at epoch 3 holding epoch-1 checkpoints up to seq 4;
    epoch 2 (another node) resumed from seq 1 and wrote seq 2. Before, 4 > 2
    resumed this node's stale branch and dropped epoch 2's work without a
    word; now Redis's lineage is adopted and seqs 2-4 of epoch 1 are reported
    as a fork."""
    app = _app()
    with CheckpointStore(tmp_path / "s", durability="group") as store:
        store.append("t", b'{"ev": 1}', epoch=1)
        store.save(Checkpoint("t", 1, b'{"step": 1}', 1))
        for seq in (2, 3, 4):
            store.save(Checkpoint("t", 1, b'{"step": "stale-%d"}' % seq, 1))
        agent, redis = _agent(tmp_path, app, store)
        runner = agent._runner
        assert runner is not None
        runner._claims = _claims_of_a_shorter_newer_lineage()  # type: ignore[assignment]
        await _open(agent)
        await _assign_back(agent, runner)

        kept = sorted((i.seq, i.epoch) for i in store.list("t"))
        assert kept[:2] == [(1, 1), (2, 2)], "resumed from this node's stale branch"
        assert all(epoch != 1 or seq == 1 for seq, epoch in kept)
        forks = redis.hashes.get(fork_key("t"), {})
        assert len(forks) == 1
        ((fork_id, _),) = forks.items()
        full = agent_pb2.LineageReport.FromString(redis.strings[fork_records_key("t", fork_id)])
        assert [c.payload for c in full.checkpoints] == [
            b'{"step": "stale-2"}',
            b'{"step": "stale-3"}',
            b'{"step": "stale-4"}',
        ]
        await runner.close()
