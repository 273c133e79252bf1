"""node_agent.shared: durability, replica ids across restarts, the Session side (no network)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from lazarus.v1 import agent_pb2
from node_agent.sdk import TaskCancelled
from node_agent.shared import (
    SharedDocuments,
    deltas_from_pb,
    deltas_to_pb,
    doc_states_from_pb,
    read_replicas,
)
from reconcile.documents import Increment, new_document
from reconcile.hub import DocDelta


async def test_operations_are_durable_and_the_replica_id_survives_a_restart(
    tmp_path: Path,
) -> None:
    docs = SharedDocuments(tmp_path, "node-a")
    await docs.start()
    rid = docs.replica_id
    counter = docs.handle("hits", "pn-counter")
    members = docs.handle("seen", "or-set")
    log = docs.handle("events", "rga-log")
    config = docs.handle("config", "lww-map")
    for _ in range(600):  # crosses the compaction threshold once
        await counter.increment(2)
    await counter.decrement(1)
    await members.add("x")
    await members.add("y")
    await members.remove("x")
    receipt = await log.append({"n": 1})
    put = await config.put("k", "v")
    assert receipt.replica_id == rid
    assert put.at is not None
    await docs.close()

    again = SharedDocuments(tmp_path, "node-a")
    await again.start()
    assert again.replica_id == rid  # same data dir: same replica id, seqs continue
    assert again.handle("hits", "pn-counter").value() == 1199
    assert again.handle("seen", "or-set").value() == {"y"}
    assert again.handle("events", "rga-log").value() == [{"n": 1}]
    assert again.handle("config", "lww-map").value() == {"k": "v"}
    nxt = await again.handle("hits", "pn-counter").increment(1)
    assert nxt.seq == 602
    await again.close()

    on_disk = read_replicas(tmp_path)
    assert on_disk["shared/hits"].value() == 1200

    wiped = tmp_path / "wiped"
    fresh = SharedDocuments(wiped, "node-a")
    await fresh.start()
    assert fresh.replica_id != rid  # a wiped data dir never reuses dots
    await fresh.close()


async def test_a_task_handle_refuses_operations_once_fenced(tmp_path: Path) -> None:
    docs = SharedDocuments(tmp_path, "node-a")
    await docs.start()
    fenced = False

    def check() -> None:
        if fenced:
            raise TaskCancelled("fenced")

    handle = docs.handle("hits", "g-counter", check=check)
    await handle.increment()
    fenced = True
    with pytest.raises(TaskCancelled):
        await handle.increment()
    assert handle.value() == 1
    with pytest.raises(ValueError, match="pn-counter"):
        docs.handle("hits", "pn-counter")
    await docs.close()


async def test_session_interest_batches_acks_and_remote_deltas(tmp_path: Path) -> None:
    docs = SharedDocuments(tmp_path, "node-a")
    await docs.start()
    sent: list[agent_pb2.AgentMessage] = []
    handle = docs.handle("hits", "g-counter")
    await handle.increment(5)
    docs.session_opened(sent.append)
    await asyncio.sleep(0.05)
    interest = [m for m in sent if m.HasField("document_interest")]
    assert interest
    states = doc_states_from_pb(interest[-1].document_interest.subscribe)
    assert [(s.doc_id, s.state_vector.total()) for s in states] == [("shared/hits", 1)]

    await handle.increment(1)
    await asyncio.sleep(0.2)  # the batch delay
    batches = [m for m in sent if m.HasField("delta_batch")]
    assert batches
    assert len(deltas_from_pb(batches[-1].delta_batch.deltas)) == 1

    remote = new_document("g-counter", "node-b~1")
    delta = remote.apply(Increment(7))
    msg = agent_pb2.CoordinatorMessage()
    msg.delta_batch.batch_id = 9
    deltas_to_pb([DocDelta("shared/hits", delta)], "coordinator", msg.delta_batch.deltas)
    docs.receive(msg)
    await asyncio.sleep(0.1)
    acks = [m for m in sent if m.HasField("delta_ack")]
    assert acks
    assert acks[-1].delta_ack.batch_id == 9
    assert handle.value() == 13
    await docs.close()
    assert read_replicas(tmp_path)["shared/hits"].value() == 13


# ---- the coordinator's shell (coordinator.documents), without Redis ----------------------


def _drain(channel: Any) -> list[agent_pb2.CoordinatorMessage]:
    out = []
    while not channel._queue.empty():
        item = channel._queue.get_nowait()
        if isinstance(item, agent_pb2.CoordinatorMessage):
            out.append(item)
    return out


async def test_document_service_merges_acks_fans_out_and_reconciles() -> None:
    from coordinator.core import EmitEvent
    from coordinator.core.notices import NodeRecovered
    from coordinator.core.records import NodeState
    from coordinator.documents import DocumentService, decode_record, encode_record
    from coordinator.runtime import Channel
    from reconcile.hub import PersistDocument

    svc = DocumentService("redis://127.0.0.1:1/0")  # nothing listens: loads nothing
    svc.leadership_changed(True, 7)
    await asyncio.sleep(0.2)
    a, b = Channel("sa"), Channel("sb")
    a.node_id, b.node_id = "a", "b"
    for channel in (a, b):
        msg = agent_pb2.AgentMessage()
        msg.document_interest.subscribe.add(doc_id="shared/hits", crdt_type=1)
        await svc.receive(channel, msg)
        answer = _drain(channel)  # interest is answered per document (here: empty)
        assert [m.WhichOneof("body") for m in answer] == ["delta_batch"]
    writer = new_document("g-counter", "a~1")
    up = agent_pb2.AgentMessage()
    up.delta_batch.batch_id = 1
    deltas_to_pb([DocDelta("shared/hits", writer.apply(Increment(3)))], "a", up.delta_batch.deltas)
    await svc.receive(a, up)
    to_a, to_b = _drain(a), _drain(b)
    assert [m.WhichOneof("body") for m in to_a] == ["delta_ack"]
    assert dict(to_a[0].delta_ack.merged[0].state_vector.counters) == {"a~1": 1}
    assert [m.WhichOneof("body") for m in to_b] == ["delta_batch"]
    svc.event_emitted(EmitEvent(7, 0.0, NodeRecovered("b", "i", NodeState.DEAD, 4.0)))
    request = _drain(b)
    assert [m.WhichOneof("body") for m in request] == ["reconcile_request"]
    assert request[0].reconcile_request.phase == agent_pb2.RECONCILE_PHASE_GATHER
    b.closed = True  # a replaced stream: its late messages are ignored
    await svc.receive(b, up)
    assert _drain(b) == []
    hub = svc.hub
    assert hub is not None
    doc = hub.document("shared/hits")
    assert doc is not None
    cmd = PersistDocument("shared/hits", "g-counter", doc.encode(), doc.state_vector(), 1)
    record = decode_record(encode_record(cmd, 1))
    assert record.doc_id == "shared/hits"
    corrupt = bytearray(encode_record(cmd, 1))
    corrupt[-1] ^= 0xFF
    with pytest.raises(ValueError, match="checksum"):
        decode_record(bytes(corrupt))
    svc.leadership_changed(False, 7)
    await svc.close()


# ---- many documents, forgotten task documents (agent <-> DocumentService, no network) -----


class FakeRedis:
    """The part of ``redis.asyncio.Redis`` DocumentService uses, in memory.

    ``down`` makes every call fail as an unreachable server would;
    ``sets`` counts the records written.
    """

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.versions: dict[str, int] = {}
        self.down = False
        self.sets = 0
        self.races: list[bytes] = []

    def _check(self) -> None:
        if self.down:
            from redis.exceptions import ConnectionError as RedisConnectionError

            raise RedisConnectionError("fake redis is down")

    async def get(self, key: str) -> bytes | None:
        self._check()
        return self.data.get(key)

    async def set(self, key: str, value: bytes) -> bool:
        self._check()
        self.put(key, value)
        return True

    def put(self, key: str, value: bytes) -> None:
        self.data[key] = value
        self.versions[key] = self.versions.get(key, 0) + 1
        self.sets += 1

    async def scan_iter(self, match: str = "*", count: int = 0) -> Any:
        import fnmatch

        self._check()
        for key in sorted(self.data):
            if fnmatch.fnmatchcase(key, match):
                yield key

    def pipeline(self, transaction: bool = True) -> FakePipeline:
        return FakePipeline(self)

    async def aclose(self) -> None:
        return None


class FakePipeline:
    """WATCH / GET / MULTI / SET / EXEC on a :class:`FakeRedis`."""

    def __init__(self, redis: FakeRedis) -> None:
        self.redis = redis
        self.watched: dict[str, int] = {}
        self.queued: list[tuple[str, bytes]] = []

    async def __aenter__(self) -> FakePipeline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.watched, self.queued = {}, []

    async def watch(self, key: str) -> None:
        self.redis._check()
        self.watched[key] = self.redis.versions.get(key, 0)
        if self.redis.races:  # another writer, between this WATCH and the EXEC
            self.redis.put(key, self.redis.races.pop(0))

    async def get(self, key: str) -> bytes | None:
        return await self.redis.get(key)

    def multi(self) -> None:
        self.queued = []

    def set(self, key: str, value: bytes) -> FakePipeline:
        self.queued.append((key, value))
        return self

    async def execute(self) -> list[bool]:
        from redis.exceptions import WatchError

        self.redis._check()
        if any(self.redis.versions.get(k, 0) != v for k, v in self.watched.items()):
            raise WatchError("watched key changed")
        for key, value in self.queued:
            self.redis.put(key, value)
        return [True] * len(self.queued)


async def _leader(redis: FakeRedis | None = None) -> Any:
    from coordinator.documents import DocumentService

    svc = DocumentService("redis://127.0.0.1:1/0")  # nothing listens: loads nothing
    if redis is not None:
        svc._redis = redis  # type: ignore[assignment]
    svc.leadership_changed(True, 7)
    await asyncio.sleep(0.2)
    return svc


async def _pump(svc: Any, channel: Any, docs: SharedDocuments, sent: list[Any]) -> None:
    """Carry messages both ways until both sides are quiet."""
    for _ in range(50):
        await asyncio.sleep(0.03)
        moved = False
        while sent:
            await svc.receive(channel, sent.pop(0))
            moved = True
        for msg in _drain(channel):
            docs.receive(msg)
            moved = True
        if not moved and docs._inbox.empty():
            return


async def _pump_until(
    svc: Any,
    channel: Any,
    docs: SharedDocuments,
    sent: list[Any],
    done: Any,
    timeout_s: float = 3.0,
) -> bool:
    """Carry messages both ways until ``done()`` holds (True) or ``timeout_s`` passed (False)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        await _pump(svc, channel, docs, sent)
        if done():
            return True
        await asyncio.sleep(0.05)
    return False


def test_the_agent_names_no_more_documents_per_message_than_the_coordinator_takes() -> None:
    from coordinator.core.limits import LIMITS
    from node_agent.shared import DOCUMENTS_PER_MESSAGE

    assert 0 < DOCUMENTS_PER_MESSAGE <= LIMITS.documents_per_message


async def test_a_welcome_interest_over_the_message_limit_is_split_and_accepted(
    tmp_path: Path,
) -> None:
    from coordinator.documents import _document_message_problem
    from coordinator.runtime import Channel

    docs = SharedDocuments(tmp_path, "node-a")
    await docs.start()
    for i in range(1100):  # what ctx.crdt_state opens, one per task
        docs.handle_doc(f"task/t{i:04d}", "g-counter")
    await docs.handle_doc("task/t0007", "g-counter").increment(2)
    svc = await _leader()
    channel = Channel("sa")
    channel.node_id = "node-a"
    sent: list[agent_pb2.AgentMessage] = []
    docs.session_opened(sent.append)
    await asyncio.sleep(0.1)
    interest = [m for m in sent if m.HasField("document_interest")]
    named = [s.doc_id for m in interest for s in m.document_interest.subscribe]
    assert sorted(named) == sorted(docs.endpoint.docs)
    for msg in interest:
        assert _document_message_problem(msg) == ""
    assert len(interest) == 2
    await _pump(svc, channel, docs, sent)
    assert not channel.closed  # the coordinator took every message
    hub = svc.hub
    assert hub is not None
    assert hub._nodes["node-a"].interest == set(docs.endpoint.docs)  # the messages add up
    doc = hub.document("task/t0007")
    assert doc is not None
    assert doc.value() == 2  # asked for and merged what the node held
    svc.leadership_changed(False, 7)
    await svc.close()
    await docs.close()


async def test_a_forgotten_task_document_goes_from_memory_disk_and_leader_once_durable(
    tmp_path: Path,
) -> None:
    from coordinator.runtime import Channel

    docs = SharedDocuments(tmp_path, "node-a")
    await docs.start()
    docs.forget_grace_s = 0.1
    state = await docs.task_state("t1", "g-counter", None, 0.0)
    await state.increment(3)
    kept = docs.handle("hits", "g-counter")
    await kept.increment(1)
    docs.forget_task("t1")  # no Session: nothing confirmed, so it stays
    docs.forget_task("never-had-crdt-state")  # ignored
    await asyncio.sleep(0.3)
    assert docs.holds("task/t1")
    assert docs.forgetting() == ("task/t1",)
    await docs.close()
    assert "task/t1" in read_replicas(tmp_path)

    again = SharedDocuments(tmp_path, "node-a")  # the intent survives a restart
    await again.start()
    again.forget_grace_s = 0.1
    assert again.forgetting() == ("task/t1",)
    redis = FakeRedis()
    svc = await _leader(redis)
    channel = Channel("sa")
    channel.node_id = "node-a"
    sent: list[agent_pb2.AgentMessage] = []
    again.session_opened(sent.append)
    # Merged, written to Redis, told, the grace: dropped.
    assert await _pump_until(svc, channel, again, sent, lambda: not again.holds("task/t1"))
    await again.durable()
    hub = svc.hub
    assert hub is not None
    shipped = hub.document("task/t1")
    assert shipped is not None
    assert shipped.value() == 3  # the leader holds every operation first
    assert not again.holds("task/t1")
    assert again.forgetting() == ()
    assert "task/t1" not in again._synced
    assert "task/t1" not in again._log_rows
    assert "task/t1" not in hub._nodes["node-a"].interest  # unsubscribed
    assert _stored(redis, "task/t1").value() == 3  # durable where the next leader reads
    assert again.holds("shared/hits")
    await again.close()
    on_disk = read_replicas(tmp_path)
    assert "task/t1" not in on_disk
    assert on_disk["shared/hits"].value() == 1
    last = SharedDocuments(tmp_path, "node-a")
    await last.start()
    assert not last.holds("task/t1")
    assert last.forgetting() == ()
    await last.close()
    svc.leadership_changed(False, 7)
    await svc.close()


async def test_a_forgotten_document_stays_until_the_leader_says_redis_holds_it(
    tmp_path: Path,
) -> None:
    docs = SharedDocuments(tmp_path, "node-a")
    await docs.start()
    docs.forget_grace_s = 0.1
    sent: list[agent_pb2.AgentMessage] = []
    docs.session_opened(sent.append)
    await asyncio.sleep(0.05)
    state = docs.handle_doc("task/t1", "g-counter")
    await state.increment(3)
    await asyncio.sleep(0.2)  # the batch delay: the delta is sent, not acknowledged
    batches = [m for m in sent if m.HasField("delta_batch")]
    assert batches
    docs.forget_task("t1")
    await asyncio.sleep(0.3)
    assert docs.holds("task/t1")  # unshipped: kept past the grace

    ack = agent_pb2.CoordinatorMessage()  # the leader merged less than the node sent
    ack.delta_ack.batch_id = batches[-1].delta_batch.batch_id
    ack.delta_ack.merged.add(doc_id="task/t1", crdt_type=1)
    docs.receive(ack)
    await asyncio.sleep(0.3)
    assert docs.holds("task/t1")

    rid = docs.replica_id
    ack = agent_pb2.CoordinatorMessage()  # now it holds everything, in memory
    ack.delta_ack.batch_id = 999
    covered = ack.delta_ack.merged.add(doc_id="task/t1", crdt_type=1)
    covered.state_vector.counters[rid] = 1
    docs.receive(ack)
    await asyncio.sleep(0.3)
    assert docs.endpoint.shipped("task/t1")
    assert docs.holds("task/t1")  # merged, not durable in Redis: kept past the grace

    stored = agent_pb2.CoordinatorMessage()  # the leader's store holds less
    stored.documents_persisted.documents.add(doc_id="task/t1", crdt_type=1)
    docs.receive(stored)
    await asyncio.sleep(0.3)
    assert docs.holds("task/t1")

    stored = agent_pb2.CoordinatorMessage()  # ... now all of it
    held = stored.documents_persisted.documents.add(doc_id="task/t1", crdt_type=1)
    held.state_vector.counters[rid] = 1
    docs.receive(stored)
    await asyncio.sleep(0.02)
    docs.session_closed()  # ... but the Session ended within the grace: void
    await asyncio.sleep(0.3)
    assert docs.holds("task/t1")

    sent.clear()
    docs.session_opened(sent.append)
    await asyncio.sleep(0.05)
    docs.receive(stored)  # the next leader says so
    await asyncio.sleep(0.3)
    assert not docs.holds("task/t1")
    unsubscribe = [
        list(m.document_interest.unsubscribe_doc_ids)
        for m in sent
        if m.HasField("document_interest") and m.document_interest.unsubscribe_doc_ids
    ]
    assert unsubscribe == [["task/t1"]]
    await docs.close()
    assert "task/t1" not in read_replicas(tmp_path)


def _stored(redis: FakeRedis, doc_id: str) -> Any:
    from coordinator.documents import decode_record
    from lazarus.storage.keys import document_key
    from reconcile.documents import decode_document

    return decode_document(bytes(decode_record(redis.data[document_key(doc_id)]).state))


def _record(doc_id: str, doc: Any) -> bytes:
    from coordinator.documents import encode_record
    from reconcile.hub import PersistDocument

    sv = doc.state_vector()
    return encode_record(PersistDocument(doc_id, doc.kind, doc.encode(), sv, sv.total()), 1)


async def test_a_forgotten_document_outlives_a_leader_whose_redis_writes_fail(
    tmp_path: Path,
) -> None:
    from coordinator.runtime import Channel

    docs = SharedDocuments(tmp_path, "node-a")
    await docs.start()
    docs.forget_grace_s = 0.1
    await docs.handle_doc("task/t1", "g-counter").increment(3)
    docs.forget_task("t1")
    redis = FakeRedis()
    redis.down = True  # the leader's Redis fails for the whole leadership
    first = await _leader(redis)
    channel = Channel("s1")
    channel.node_id = "node-a"
    sent: list[agent_pb2.AgentMessage] = []
    docs.session_opened(sent.append)
    merged = await _pump_until(
        first, channel, docs, sent, lambda: docs.endpoint.shipped("task/t1"), 2.0
    )
    assert merged  # the leader holds every operation, in memory
    await _pump_until(first, channel, docs, sent, lambda: False, 1.0)  # ten graces
    assert docs.holds("task/t1")  # not durable anywhere but here: kept
    assert redis.sets == 0
    first.leadership_changed(False, 7)  # ... and the leader dies
    await first.close()
    docs.session_closed()

    redis.down = False
    second = await _leader(redis)
    channel = Channel("s2")
    channel.node_id = "node-a"
    sent.clear()
    docs.session_opened(sent.append)
    assert await _pump_until(second, channel, docs, sent, lambda: not docs.holds("task/t1"))
    second.leadership_changed(False, 7)  # dies right after the drop
    await second.close()
    third = await _leader(redis)  # loads the canonical replicas from Redis
    hub = third.hub
    assert hub is not None
    doc = hub.document("task/t1")
    assert doc is not None
    assert doc.value() == 3  # nothing the node dropped is lost
    third.leadership_changed(False, 7)
    await third.close()
    await docs.close()


async def test_a_write_merges_what_redis_holds_so_the_store_never_rolls_back(
    tmp_path: Path,
) -> None:
    from coordinator.runtime import Channel

    redis = FakeRedis()
    redis.down = True  # the load fails: the leader starts without Redis's replicas
    svc = await _leader(redis)
    redis.down = False
    older = new_document("g-counter", "canonical")  # what Redis holds: x wrote 5 ...
    older.merge_delta(new_document("g-counter", "x~1").apply(Increment(5)))
    from lazarus.storage.keys import document_key

    redis.put(document_key("shared/hits"), _record("shared/hits", older))
    late = new_document("g-counter", "canonical")  # ... and y wrote 7 under WATCH
    late.merge(older)
    late.merge_delta(new_document("g-counter", "y~1").apply(Increment(7)))
    redis.races.append(_record("shared/hits", late))

    docs = SharedDocuments(tmp_path, "node-a")
    await docs.start()
    await docs.handle("hits", "g-counter").increment(1)
    channel = Channel("s1")
    channel.node_id = "node-a"
    sent: list[agent_pb2.AgentMessage] = []
    docs.session_opened(sent.append)

    def stored_all() -> bool:
        key = document_key("shared/hits")
        return key in redis.data and _stored(redis, "shared/hits").value() == 13

    assert await _pump_until(svc, channel, docs, sent, stored_all)
    hub = svc.hub
    assert hub is not None
    doc = hub.document("shared/hits")
    assert doc is not None
    assert doc.value() == 13  # the hub took what only Redis held
    assert redis.races == []  # the write raced y's: it read again and merged
    told = await _pump_until(
        svc, channel, docs, sent, lambda: docs.endpoint.persisted("shared/hits")
    )
    assert told  # the stored replica covers the node's: the node hears it
    svc.leadership_changed(False, 7)
    await svc.close()
    await docs.close()


async def test_opening_a_forgotten_document_again_keeps_it(tmp_path: Path) -> None:
    docs = SharedDocuments(tmp_path, "node-a")
    await docs.start()
    await docs.handle_doc("task/t1", "g-counter").increment(1)
    docs.forget_task("t1")
    assert docs.forgetting() == ("task/t1",)
    docs.handle_doc("task/t1", "g-counter")  # the task came back to this node
    assert docs.forgetting() == ()
    await docs.close()
    again = SharedDocuments(tmp_path, "node-a")
    await again.start()
    assert again.forgetting() == ()
    assert again.holds("task/t1")
    await again.close()


async def test_document_service_forgets_dead_left_and_retired_nodes() -> None:
    from coordinator.core import EmitEvent
    from coordinator.core.notices import NodeDead, NodeLeft
    from coordinator.documents import DocumentService, TeeObserver
    from coordinator.metrics import Metrics
    from coordinator.runtime import Channel

    svc = DocumentService("redis://127.0.0.1:1/0")  # nothing listens: loads nothing
    metrics = Metrics()
    observer = TeeObserver(metrics, svc)
    observer.leadership_changed(True, 7)
    await asyncio.sleep(0.2)
    hub = svc.hub
    assert hub is not None

    async def attach(node_id: str) -> Channel:
        channel = Channel(f"s-{node_id}")
        channel.node_id = node_id
        msg = agent_pb2.AgentMessage()
        msg.document_interest.subscribe.add(doc_id="shared/hits", crdt_type=1)
        await svc.receive(channel, msg)
        return channel

    left, dead, stale = await attach("left"), await attach("dead"), await attach("stale")
    observer.event_emitted(EmitEvent(7, 0.0, NodeLeft("left", "i", "goodbye", 0)))
    assert hub.stats().nodes == 3  # its stream is still open
    svc.detached(left)
    svc.detached(dead)
    observer.event_emitted(EmitEvent(7, 0.0, NodeDead("dead", "i", 0.0, 3.0, 0)))
    assert hub.stats().nodes == 1
    svc.detached(stale)
    observer.nodes_retired(["stale"])  # RetireRecords carried out
    assert hub.stats().nodes == 0
    observer.leadership_changed(False, 7)
    await svc.close()
