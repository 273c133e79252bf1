"""ReplicaEndpoint: what the leader confirmed (shipped) and dropping a replica."""

from __future__ import annotations

from reconcile.documents import Increment, new_document
from reconcile.endpoint import ReplicaEndpoint
from reconcile.hub import DocDelta, DocState
from reconcile.vclock import VectorClock


def test_a_replica_is_shipped_once_the_leader_confirms_every_operation() -> None:
    ep = ReplicaEndpoint("a~1")
    ep.open("task/t1", "g-counter")
    assert ep.shipped("task/t1")  # nothing in it
    delta = ep.apply("task/t1", Increment(2))
    ep.enqueue("task/t1", delta)
    assert not ep.shipped("task/t1")
    batch = ep.take_batch()
    assert batch is not None
    assert ep.on_ack(batch.batch_id, [DocState("task/t1", "g-counter", VectorClock())])
    assert not ep.shipped("task/t1")  # the leader could not merge it yet
    ep.on_ack(999, [DocState("task/t1", "g-counter", delta.state_vector)])
    assert ep.shipped("task/t1")
    ep.apply("task/t1", Increment(1))
    assert not ep.shipped("task/t1")  # a newer local operation


def test_confirmations_are_per_session_and_come_from_deltas_and_requests() -> None:
    ep = ReplicaEndpoint("a~1")
    ep.open("d", "g-counter")
    delta = ep.apply("d", Increment(1))
    ep.answer_request("", [DocState("d", "g-counter", delta.state_vector)])
    assert ep.shipped("d")
    ep.interest()  # a Welcome: maybe another leader
    assert not ep.shipped("d")
    canonical = new_document("g-counter", "canonical")
    canonical.merge_delta(delta)
    remote = new_document("g-counter", "b~1").apply(Increment(5))
    canonical.merge_delta(remote)
    ep.merge([DocDelta("d", canonical.delta_since(delta.state_vector))])
    assert ep.shipped("d")
    ep.clear_confirmed()
    assert not ep.shipped("d")


def test_drop_forgets_the_replica_and_its_queued_deltas() -> None:
    ep = ReplicaEndpoint("a~1")
    ep.open("d", "g-counter")
    ep.open("e", "g-counter")
    ep.enqueue("d", ep.apply("d", Increment(1)))
    ep.enqueue("e", ep.apply("e", Increment(1)))
    ep.drop("d")
    assert "d" not in ep.docs
    assert ep.shipped("d")
    batch = ep.take_batch()
    assert batch is not None
    assert [dd.doc_id for dd in batch.deltas] == ["e"]
    assert [s.doc_id for s in ep.interest()] == ["e"]


def test_a_replica_is_persisted_only_once_the_store_holds_every_operation() -> None:
    ep = ReplicaEndpoint("a~1")
    ep.open("task/t1", "g-counter")
    assert ep.persisted("task/t1")  # nothing in it
    delta = ep.apply("task/t1", Increment(2))
    ep.on_ack(999, [DocState("task/t1", "g-counter", delta.state_vector)])
    assert ep.shipped("task/t1")
    assert not ep.persisted("task/t1")  # merged in the leader's memory only
    ep.on_persisted([DocState("task/t1", "g-counter", VectorClock())])
    assert not ep.persisted("task/t1")
    ep.on_persisted([DocState("task/t1", "g-counter", delta.state_vector)])
    assert ep.persisted("task/t1")
    ep.apply("task/t1", Increment(1))
    assert not ep.persisted("task/t1")  # a newer local operation
    ep.on_persisted([DocState("task/t1", "g-counter", VectorClock({"a~1": 2}))])
    assert ep.persisted("task/t1")
    ep.clear_confirmed()  # the Session ended: told again in the next one
    assert not ep.persisted("task/t1")
    ep.on_persisted([DocState("task/t1", "g-counter", VectorClock({"a~1": 2}))])
    ep.interest()
    assert not ep.persisted("task/t1")
    ep.on_persisted([DocState("nope", "g-counter", VectorClock({"a~1": 2}))])
    assert "nope" not in ep._persisted  # only held documents are remembered
