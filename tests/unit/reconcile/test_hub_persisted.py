"""DocumentHub: the stored state vectors it tells nodes (DocumentsPersisted)."""

from __future__ import annotations

from reconcile.documents import Increment, new_document
from reconcile.endpoint import ReplicaEndpoint
from reconcile.hub import (
    DeltasReceived,
    DocDelta,
    DocState,
    DocumentHub,
    DocumentLoaded,
    DocumentPersisted,
    HubCommand,
    InterestReceived,
    NodeDetached,
    PersistDocument,
    PersistFailed,
    SendPersisted,
    Tick,
)
from reconcile.vclock import VectorClock


def _told(out: list[HubCommand]) -> dict[str, dict[str, VectorClock]]:
    """node -> doc -> stored state vector, from the SendPersisted commands of ``out``."""
    told: dict[str, dict[str, VectorClock]] = {}
    for cmd in out:
        if isinstance(cmd, SendPersisted):
            for ds in cmd.persisted:
                told.setdefault(cmd.node_id, {})[ds.doc_id] = ds.state_vector
    return told


def _written(hub: DocumentHub) -> tuple[DocumentHub, list[HubCommand]]:
    """A hub where writer "w" merged one delta into task/t1 and reader "r" subscribed."""
    writer = ReplicaEndpoint("w~1")
    writer.open("task/t1", "g-counter")
    delta = DocDelta("task/t1", writer.apply("task/t1", Increment(3)))
    hub.step(InterestReceived("r", (DocState("task/t1", "g-counter", VectorClock()),)))
    hub.step(InterestReceived("w", writer.interest()))
    out = hub.step(DeltasReceived("w", 1, (delta,), now_s=0.0))
    return hub, out


def test_the_stored_state_vector_is_told_only_after_a_successful_write() -> None:
    hub, _ = _written(DocumentHub())
    sv = VectorClock({"w~1": 1})
    out = hub.step(Tick(1.0))
    writes = [c for c in out if isinstance(c, PersistDocument)]
    assert [w.state_vector for w in writes] == [sv]
    assert _told(out) == {}  # merged in memory only: not told

    assert hub.step(PersistFailed("task/t1", 1.1)) == []
    out = hub.step(Tick(1.15))  # within the debounce: no write, and still not told
    assert _told(out) == {}
    out = hub.step(Tick(1.5))
    assert [c.state_vector for c in out if isinstance(c, PersistDocument)] == [sv]  # again
    assert _told(out) == {}

    assert hub.step(DocumentPersisted("task/t1", sv, 1.6)) == []  # told on the Tick
    out = hub.step(Tick(1.7))
    assert _told(out) == {"r": {"task/t1": sv}, "w": {"task/t1": sv}}
    assert _told(hub.step(Tick(2.0))) == {}  # each stored vector once per Session
    assert _told(hub.step(DocumentPersisted("task/t1", sv, 2.1)) + hub.step(Tick(2.2))) == {}


def test_a_new_session_is_told_again_and_an_unsubscribed_node_is_not() -> None:
    hub, _ = _written(DocumentHub())
    sv = VectorClock({"w~1": 1})
    hub.step(Tick(1.0))
    hub.step(DocumentPersisted("task/t1", sv, 1.1))
    hub.step(Tick(1.2))
    hub.step(NodeDetached("w", 1.3))
    hub.step(InterestReceived("w", (DocState("task/t1", "g-counter", sv),), (), 1.4))
    hub.step(InterestReceived("r", (), ("task/t1",), 1.4))  # r dropped its replica
    assert _told(hub.step(Tick(1.5))) == {"w": {"task/t1": sv}}


def test_a_stored_vector_below_what_the_node_holds_is_not_told() -> None:
    hub = DocumentHub()
    stored = new_document("g-counter", "canonical")
    stored.merge_delta(new_document("g-counter", "x~1").apply(Increment(1)))
    hub.step(DocumentLoaded("task/t1", stored, 0.0))  # read from the store: it holds that
    ahead = VectorClock({"x~1": 1, "n~1": 2})  # the node holds operations not stored yet
    out = hub.step(InterestReceived("n", (DocState("task/t1", "g-counter", ahead),), (), 0.1))
    hub.step(InterestReceived("m", (DocState("task/t1", "g-counter", VectorClock()),), (), 0.1))
    assert _told(out + hub.step(Tick(0.2))) == {"m": {"task/t1": VectorClock({"x~1": 1})}}
    hub.step(DocumentPersisted("task/t1", ahead, 0.3))
    assert _told(hub.step(Tick(0.4))) == {"n": {"task/t1": ahead}, "m": {"task/t1": ahead}}


def test_persisted_notices_are_split_per_message_limit() -> None:
    from reconcile.hub import HubSettings

    hub = DocumentHub(HubSettings(documents_per_message=2))
    states = []
    for i in range(5):
        doc = new_document("g-counter", "canonical")
        doc.merge_delta(new_document("g-counter", f"x{i}~1").apply(Increment(1)))
        hub.step(DocumentLoaded(f"task/t{i}", doc, 0.0))
        states.append(DocState(f"task/t{i}", "g-counter", doc.state_vector()))
    hub.step(InterestReceived("n", tuple(states), (), 0.1))
    out = [c for c in hub.step(Tick(0.2)) if isinstance(c, SendPersisted)]
    assert [len(c.persisted) for c in out] == [2, 2, 1]
