"""DocumentHub + ReplicaEndpoint driven by a seeded simulator (a small VOPR).

One ``random.Random(seed)`` drives everything: which node writes which
operation, when batches leave, which message is delivered next (in any
order), which is duplicated, which node is partitioned (every message to or
from it dropped) and when it heals. Safety phase: faults as above. Liveness
phase: every node healed, messages delivered until none is left. Checker:
every replica (each node's and the canonical) has the same state vector and
the same value, and that value equals a ground-truth model built from the
acknowledged operations alone — nothing lost, nothing doubled. A failure
prints the seed. The store (Redis) is modelled too: each PersistDocument
succeeds (``DocumentPersisted``) or fails (``PersistFailed``) by a second
seeded generator; every stored state vector the hub tells a node
(``SendPersisted``) must be one the store holds, and after the liveness
phase every node hears that the store holds all of its replicas.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from reconcile.documents import Add, Append, Decrement, Increment, Put, Remove
from reconcile.endpoint import Batch, ReplicaEndpoint
from reconcile.hlc import HLCTimestamp
from reconcile.hub import (
    AckReceived,
    DeltasReceived,
    DocDelta,
    DocState,
    DocumentHub,
    DocumentPersisted,
    HubSettings,
    InterestReceived,
    NodeDetached,
    NodeGone,
    PersistDocument,
    PersistFailed,
    ReconcileCompletedNotice,
    ReconcilePhase,
    ReconcileStartedNotice,
    ReconcileTrigger,
    ReconcileWanted,
    SendAck,
    SendDeltaRequest,
    SendDeltas,
    SendPersisted,
    SendReconcileDone,
    SendReconcileRequest,
    StateVectorsReported,
    Tick,
)
from reconcile.vclock import VectorClock

DOCS = {
    "shared/counter": "pn-counter",
    "shared/set": "or-set",
    "shared/map": "lww-map",
    "shared/log": "rga-log",
    "shared/mv": "mv-map",
}


@dataclass
class Model:
    """Ground truth from acknowledged operations only."""

    counter: int = 0
    added: set[str] = field(default_factory=set)
    removed: set[str] = field(default_factory=set)
    puts: dict[str, tuple[tuple[int, int, str, int], Any]] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)


@dataclass
class Sim:
    rng: random.Random
    hub: DocumentHub
    nodes: dict[str, ReplicaEndpoint]
    up: dict[str, bool]
    model: Model = field(default_factory=Model)
    to_hub: list[tuple[str, Any]] = field(default_factory=list)
    to_node: list[tuple[str, Any]] = field(default_factory=list)
    now: float = 0.0
    clock: int = 0
    dup_rate: float = 0.05
    started: int = 0
    done: list[SendReconcileDone] = field(default_factory=list)
    completed: list[ReconcileCompletedNotice] = field(default_factory=list)
    persisted: dict[str, PersistDocument] = field(default_factory=dict)
    store_rng: random.Random = field(default_factory=random.Random)
    write_fail_rate: float = 0.3
    writes: list[PersistDocument] = field(default_factory=list)  # issued, not done
    store: dict[str, VectorClock] = field(default_factory=dict)  # what Redis holds

    # ---- plumbing ------------------------------------------------------------------

    def run_hub(self, event: Any) -> None:
        for cmd in self.hub.step(event):
            if isinstance(cmd, SendDeltas | SendAck | SendDeltaRequest | SendReconcileRequest):
                self.send_node(cmd.node_id, cmd)
            elif isinstance(cmd, SendPersisted):
                for ds in cmd.persisted:  # only what the store holds is ever told
                    held = self.store.get(ds.doc_id, VectorClock())
                    assert held.descends(ds.state_vector), f"told {ds} beyond the store"
                self.send_node(cmd.node_id, cmd)
            elif isinstance(cmd, SendReconcileDone):
                self.done.append(cmd)
            elif isinstance(cmd, ReconcileStartedNotice):
                self.started += 1
            elif isinstance(cmd, ReconcileCompletedNotice):
                self.completed.append(cmd)
            elif isinstance(cmd, PersistDocument):
                self.persisted[cmd.doc_id] = cmd
                self.writes.append(cmd)

    def send_node(self, node_id: str, msg: Any) -> None:
        if self.up[node_id]:
            self.to_node.append((node_id, msg))

    def send_hub(self, node_id: str, msg: Any) -> None:
        if self.up[node_id]:
            self.to_hub.append((node_id, msg))

    def send_batch(self, node_id: str, batch: Batch | None) -> None:
        if batch is not None:
            self.send_hub(node_id, batch)

    def deliver_one(self, *, faults: bool) -> bool:
        queues = [q for q in (self.to_hub, self.to_node) if q]
        if not queues:
            return False
        queue = self.rng.choice(queues)
        index = self.rng.randrange(len(queue)) if faults else 0
        node_id, msg = queue[index]
        if not (faults and self.rng.random() < self.dup_rate):
            queue.pop(index)
        if not self.up[node_id]:
            return True  # partitioned: dropped
        if queue is self.to_hub:
            self.hub_receive(node_id, msg)
        else:
            self.node_receive(node_id, msg)
        return True

    def hub_receive(self, node_id: str, msg: Any) -> None:
        if isinstance(msg, Batch):
            self.run_hub(
                DeltasReceived(node_id, msg.batch_id, msg.deltas, msg.session_id, self.now)
            )
        elif isinstance(msg, AckReceived | StateVectorsReported | InterestReceived):
            self.run_hub(msg)

    def node_receive(self, node_id: str, msg: Any) -> None:
        ep = self.nodes[node_id]
        if isinstance(msg, SendDeltas):
            _, states = ep.merge(msg.deltas)
            self.send_hub(node_id, AckReceived(node_id, msg.batch_id, states, self.now))
        elif isinstance(msg, SendAck):
            self.send_batch(node_id, ep.on_ack(msg.batch_id, msg.merged))
        elif isinstance(msg, SendPersisted):
            ep.on_persisted(msg.persisted)
        elif isinstance(msg, SendDeltaRequest):
            self.send_batch(node_id, ep.answer_request(msg.session_id, msg.have))
        elif isinstance(msg, SendReconcileRequest):
            report = StateVectorsReported(
                node_id, msg.session_id, msg.phase, ep.report(()), self.now
            )
            self.send_hub(node_id, report)

    # ---- actions ---------------------------------------------------------------------

    def local_op(self, node_id: str) -> None:
        ep = self.nodes[node_id]
        doc_id = self.rng.choice(sorted(DOCS))
        ep.open(doc_id, DOCS[doc_id])
        self.clock += 1
        kind = DOCS[doc_id]
        tag = f"{node_id}-{self.clock}"
        op: Any
        if kind == "pn-counter":
            amount = self.rng.randint(1, 5)
            if self.rng.random() < 0.3:
                op = Decrement(amount)
                self.model.counter -= amount
            else:
                op = Increment(amount)
                self.model.counter += amount
        elif kind == "or-set":
            mine = sorted(m for m in ep.docs[doc_id].value() if str(m).startswith(f"{node_id}-"))
            if mine and self.rng.random() < 0.3:
                member = self.rng.choice(mine)
                op = Remove(member)
                self.model.removed.add(member)
            else:
                op = Add(tag)
                self.model.added.add(tag)
        elif kind == "lww-map":
            key = f"k{self.rng.randrange(4)}"
            at = HLCTimestamp(self.rng.randrange(50), self.rng.randrange(3))
            op = Put(key, tag, at)
        elif kind == "mv-map":
            op = Put(f"k{self.rng.randrange(3)}", tag)
        else:
            op = Append(tag)
            self.model.log.append(tag)
        delta = ep.apply(doc_id, op)
        if kind == "lww-map":
            seq = delta.state_vector.get(ep.replica_id)
            stamp = (op.at.wall_ms, op.at.logical, ep.replica_id, seq)
            if op.key not in self.model.puts or self.model.puts[op.key][0] < stamp:
                self.model.puts[op.key] = (stamp, tag)
        ep.enqueue(doc_id, delta)
        if ep.queued >= ep.max_ops or self.rng.random() < 0.3:
            self.send_batch(node_id, ep.take_batch())

    def cut(self, node_id: str) -> None:
        self.up[node_id] = False
        roll = self.rng.random()
        if roll < 0.25:  # judged DEAD or LEFT, then its stream's end is seen: forgotten
            self.run_hub(NodeGone(node_id, self.now))
            self.run_hub(NodeDetached(node_id, self.now))
        elif roll < 0.5:
            self.run_hub(NodeDetached(node_id, self.now))
        elif roll < 0.6:  # judged gone; its stream's end not seen before it is back
            self.run_hub(NodeGone(node_id, self.now))
        # else a silent partition: the hub learns nothing

    def heal(self, node_id: str) -> None:
        # A new stream: what was in flight on the old one is gone; the leader
        # hears the Hello (NodeRecovered) before the agent's DocumentInterest.
        self.to_hub = [m for m in self.to_hub if m[0] != node_id]
        self.to_node = [m for m in self.to_node if m[0] != node_id]
        self.run_hub(ReconcileWanted((node_id,), ReconcileTrigger.NODE_RECONNECTED, self.now))
        self.up[node_id] = True
        ep = self.nodes[node_id]
        self.hub_receive(node_id, InterestReceived(node_id, ep.interest(), (), self.now))

    def tick(self, dt: float = 0.1) -> None:
        self.now += dt
        self.run_hub(Tick(self.now))
        writes, self.writes = self.writes, []
        for cmd in writes:  # the shell's writer: each write succeeds or fails
            if self.store_rng.random() < self.write_fail_rate:
                self.run_hub(PersistFailed(cmd.doc_id, self.now))
                continue
            held = self.store.get(cmd.doc_id, VectorClock())
            self.store[cmd.doc_id] = held.merge(cmd.state_vector)  # merged on write
            self.run_hub(DocumentPersisted(cmd.doc_id, self.store[cmd.doc_id], self.now))


def make_sim(seed: int, n_nodes: int = 4) -> Sim:
    rng = random.Random(seed)
    hub = DocumentHub(HubSettings(persist_debounce_s=0.2, retry_s=0.5, session_timeout_s=1e9))
    nodes = {f"n{i}": ReplicaEndpoint(f"n{i}~r", max_ops=8) for i in range(n_nodes)}
    sim = Sim(rng, hub, nodes, {n: True for n in nodes}, store_rng=random.Random(-seed - 1))
    for node_id in nodes:
        sim.heal(node_id)
    return sim


def run(seed: int, steps: int = 600) -> Sim:
    sim = make_sim(seed)
    rng = sim.rng
    ids = sorted(sim.nodes)
    for _ in range(steps):  # safety phase: faults
        roll = rng.random()
        node_id = rng.choice(ids)
        if roll < 0.40:
            sim.local_op(node_id)
        elif roll < 0.80:
            sim.deliver_one(faults=True)
        elif roll < 0.85:
            sim.send_batch(node_id, sim.nodes[node_id].take_batch())
        elif roll < 0.88 and sim.up[node_id] and sum(sim.up.values()) > 1:
            sim.cut(node_id)
        elif roll < 0.93 and not sim.up[node_id]:
            sim.heal(node_id)
        else:
            sim.tick()
    sim.write_fail_rate = 0.0
    for node_id in ids:  # liveness phase: heal, flush, deliver everything
        if not sim.up[node_id]:
            sim.heal(node_id)
    for _ in range(200):
        for node_id in ids:
            sim.send_batch(node_id, sim.nodes[node_id].take_batch())
        while sim.deliver_one(faults=False):
            pass
        sim.tick(0.6)
        if not sim.to_hub and not sim.to_node and not sim.hub.stats().sessions_open:
            break
    sim.tick(1.0)
    for _ in range(2):  # the last write, then the Tick that tells it
        while sim.deliver_one(faults=False):
            pass
        sim.tick(1.0)
    while sim.deliver_one(faults=False):
        pass
    return sim


def check(sim: Sim, seed: int) -> None:
    hub = sim.hub
    for doc_id in sorted(DOCS):
        canonical = hub.document(doc_id)
        if canonical is None:
            continue
        for node_id, ep in sorted(sim.nodes.items()):
            doc = ep.docs.get(doc_id)
            assert doc is not None, f"seed={seed}: {node_id} never got {doc_id}"
            assert doc.state_vector() == canonical.state_vector(), (
                f"seed={seed}: {node_id} {doc_id} {doc.state_vector()} != "
                f"{canonical.state_vector()}"
            )
            assert doc.value() == canonical.value(), f"seed={seed}: {node_id} {doc_id}"
        value = canonical.value()
        kind = DOCS[doc_id]
        if kind == "pn-counter":
            assert value == sim.model.counter, f"seed={seed}"
        elif kind == "or-set":
            assert set(value) == sim.model.added - sim.model.removed, f"seed={seed}"
        elif kind == "lww-map":
            assert value == {k: v for k, (_, v) in sim.model.puts.items()}, f"seed={seed}"
        elif kind == "rga-log":
            assert sorted(value) == sorted(sim.model.log), f"seed={seed}: lost or doubled"
            for node_id in sim.nodes:  # each writer's own entries keep their order
                mine = [x for x in value if x.startswith(f"{node_id}-")]
                assert mine == [x for x in sim.model.log if x.startswith(f"{node_id}-")]
        persisted = sim.persisted.get(doc_id)
        assert persisted is not None, f"seed={seed}: {doc_id} never persisted"
        assert persisted.state_vector == canonical.state_vector(), f"seed={seed}: {doc_id}"


@pytest.mark.parametrize("seed", range(60))
def test_random_ops_partitions_and_heals_converge_to_the_ground_truth(seed: int) -> None:
    sim = run(seed)
    check(sim, seed)
    for node_id, ep in sorted(sim.nodes.items()):  # every node heard the store holds it all
        for doc_id in sorted(ep.docs):
            assert ep.persisted(doc_id), f"seed={seed}: {node_id} {doc_id} not told persisted"
    assert all(c.converged for c in sim.completed[-len(sim.nodes) :] if c.trigger)


def test_duplicated_and_reordered_batches_are_harmless() -> None:
    sim = make_sim(1234, n_nodes=2)
    sim.dup_rate = 0.5
    for _ in range(300):
        sim.local_op(sim.rng.choice(sorted(sim.nodes)))
        sim.deliver_one(faults=True)
    for _ in range(50):
        for node_id in sorted(sim.nodes):
            sim.send_batch(node_id, sim.nodes[node_id].take_batch())
        while sim.deliver_one(faults=False):
            pass
        sim.tick(0.6)
    check(sim, 1234)


def test_a_healed_node_gets_a_reconcile_session_that_verifies() -> None:
    sim = make_sim(7, n_nodes=2)
    sim.cut("n1")
    for _ in range(20):
        sim.local_op("n0")
        sim.local_op("n1")
    sim.send_batch("n0", sim.nodes["n0"].take_batch())
    while sim.deliver_one(faults=False):
        pass
    sim.heal("n1")
    for _ in range(20):
        for node_id in sorted(sim.nodes):
            sim.send_batch(node_id, sim.nodes[node_id].take_batch())
        while sim.deliver_one(faults=False):
            pass
        sim.tick(0.3)
    done = [c for c in sim.completed if c.node_ids == ("n1",)]
    assert done
    assert done[-1].converged
    assert done[-1].trigger is ReconcileTrigger.NODE_RECONNECTED
    assert done[-1].documents >= 1
    assert done[-1].deltas >= 1
    check(sim, 7)


def test_concurrent_lww_writes_of_one_key_are_counted_as_conflicts() -> None:
    hub = DocumentHub()
    a, b = ReplicaEndpoint("a~1"), ReplicaEndpoint("b~1")
    hub.step(InterestReceived("a", ()))
    hub.step(InterestReceived("b", ()))
    for ep, wall in ((a, 10), (b, 20)):
        ep.open("shared/map", "lww-map")
        ep.enqueue(
            "shared/map", ep.apply("shared/map", Put("k", ep.replica_id, HLCTimestamp(wall, 0)))
        )
    hub.step(ReconcileWanted(("b",), ReconcileTrigger.NODE_RECONNECTED, 0.0))
    batch_a, batch_b = a.take_batch(), b.take_batch()
    assert batch_a is not None
    assert batch_b is not None
    hub.step(DeltasReceived("a", batch_a.batch_id, batch_a.deltas))
    out = hub.step(DeltasReceived("b", batch_b.batch_id, batch_b.deltas))
    assert hub.stats().conflicts_total == 1
    doc = hub.document("shared/map")
    assert doc is not None
    assert doc.value() == {"k": "b~1"}
    out = hub.step(StateVectorsReported("b", "rc-0-1", ReconcilePhase.GATHER, b.report(()), 0.1))
    for cmd in out:
        if isinstance(cmd, SendDeltas) and cmd.node_id == "b":
            _, states = b.merge(cmd.deltas)
            out += hub.step(AckReceived("b", cmd.batch_id, states, 0.2))
    out += hub.step(Tick(2.0))
    verify = [c for c in out if isinstance(c, SendReconcileRequest)]
    assert verify
    assert verify[-1].phase is ReconcilePhase.VERIFY
    out = hub.step(StateVectorsReported("b", "rc-0-1", ReconcilePhase.VERIFY, b.report(()), 2.1))
    done = [c for c in out if isinstance(c, ReconcileCompletedNotice)]
    assert done
    assert done[0].converged
    assert done[0].conflict_count == 1
    assert done[0].conflicts[0].key == "k"
    assert done[0].conflicts[0].winner == "b~1"


def test_divergence_counts_operations_attached_nodes_lack() -> None:
    hub = DocumentHub()
    sv = VectorClock({"x~1": 3})
    hub.step(InterestReceived("n", (DocState("shared/c", "g-counter", VectorClock()),)))
    src = ReplicaEndpoint("x~1")
    src.open("shared/c", "g-counter")
    deltas = [DocDelta("shared/c", src.apply("shared/c", Increment(1))) for _ in range(3)]
    hub.step(DeltasReceived("x", 1, tuple(deltas)))
    assert hub.document("shared/c") is not None
    assert hub.document("shared/c").state_vector() == sv  # type: ignore[union-attr]
    assert hub.stats().divergence_ops == 3  # shipped to n, not acknowledged yet
    hub.step(AckReceived("n", 1, (DocState("shared/c", "g-counter", sv),)))
    assert hub.stats().divergence_ops == 0


def _interest(node_id: str, sv: VectorClock) -> InterestReceived:
    return InterestReceived(node_id, (DocState("shared/c", "g-counter", sv),))


def test_a_gone_node_is_forgotten_once_its_session_ends() -> None:
    hub = DocumentHub()
    sv = VectorClock({"n~1": 1})
    for i in range(50):  # a DaemonSet rollout: each pod once, under a new name
        hub.step(_interest(f"pod-{i}", sv))
        hub.step(NodeGone(f"pod-{i}"))  # NodeLeft (Goodbye) while its stream is open
        assert hub.node_state_vector(f"pod-{i}", "shared/c") == sv  # still attached
        hub.step(NodeDetached(f"pod-{i}"))
        assert hub.node_state_vector(f"pod-{i}", "shared/c") == VectorClock()
    hub.step(_interest("dead", sv))
    hub.step(NodeDetached("dead"))
    assert hub.stats().nodes == 1
    hub.step(NodeGone("dead"))  # DEAD (or retired) after its stream ended: at once
    assert hub.stats().nodes == 0
    hub.step(NodeGone("never-seen"))
    assert hub.stats().nodes == 0


def test_a_forgotten_node_that_comes_back_gets_what_it_missed() -> None:
    hub = DocumentHub()
    writer, back = ReplicaEndpoint("w~1"), ReplicaEndpoint("b~1")
    for ep in (writer, back):
        ep.open("shared/c", "g-counter")
    before = DocDelta("shared/c", writer.apply("shared/c", Increment(2)))
    hub.step(InterestReceived("w", writer.interest()))
    hub.step(InterestReceived("b", back.interest()))
    for cmd in hub.step(DeltasReceived("w", 1, (before,))):
        if isinstance(cmd, SendDeltas) and cmd.node_id == "b":
            back.merge(cmd.deltas)  # b had the first write; its ack is lost
    hub.step(NodeGone("b"))
    hub.step(NodeDetached("b"))
    assert hub.stats().nodes == 1
    missed = DocDelta("shared/c", writer.apply("shared/c", Increment(5)))
    hub.step(DeltasReceived("w", 2, (missed,)))
    # Back (same replica): its new Session opens with its state vectors.
    out = hub.step(InterestReceived("b", back.interest()))
    shipped = [c for c in out if isinstance(c, SendDeltas) and c.node_id == "b"]
    assert shipped
    for cmd in shipped:
        back.merge(cmd.deltas)
    doc = hub.document("shared/c")
    assert doc is not None
    assert back.docs["shared/c"].state_vector() == doc.state_vector()
    assert back.docs["shared/c"].value() == 7
    # The re-attached node is fanned out to again.
    later = DocDelta("shared/c", writer.apply("shared/c", Increment(1)))
    out = hub.step(DeltasReceived("w", 3, (later,)))
    assert [c.node_id for c in out if isinstance(c, SendDeltas)] == ["b"]


def test_a_gone_node_that_opens_a_new_session_before_the_old_one_ends_is_kept() -> None:
    hub = DocumentHub()
    sv = VectorClock({"n~1": 1})
    hub.step(_interest("n", sv))
    hub.step(NodeGone("n"))
    hub.step(_interest("n", sv))  # a new Session's interest: back before the end was seen
    hub.step(NodeDetached("n"))  # that Session ended: a plain detach, nothing forgotten
    assert hub.stats().nodes == 1
    assert hub.node_state_vector("n", "shared/c") == sv
