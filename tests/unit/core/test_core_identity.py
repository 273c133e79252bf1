"""Incarnation-bound ownership (DESIGN.md §4): who may speak for a node id.

The rules table of ``coordinator.core.identity`` first, then the core's
answers to a second process under one node id: refused while the holder is
live, admitted with epoch + 1 once the holder is proven stopped (its DEAD
verdict, or the store proof of a restart in place), never re-attached at the
holder's epoch.
"""

from __future__ import annotations

import hashlib

import pytest
from core_harness import Harness, directives, notices_of, of_type, persisted_nodes, persisted_tasks

from coordinator.core import (
    Assign,
    CloseSession,
    CoreSettings,
    HeldTask,
    HeldTaskStatus,
    NodeRecord,
    NodeState,
    Revoke,
    SessionOpened,
    StatusCode,
    TaskRecord,
    TaskState,
    Welcome,
)
from coordinator.core import notices as n
from coordinator.core.identity import Claim, ClaimKind, judge_claim

SECRET_1 = hashlib.sha256(b"secret-1").digest()
SECRET_2 = hashlib.sha256(b"secret-2").digest()
STORE = "store-a"


# -- the rules table --------------------------------------------------------------------------


def _record(state: NodeState = NodeState.ALIVE) -> NodeRecord:
    return NodeRecord(
        node_id="w0",
        incarnation="i1",
        state=state,
        incarnation_secret_sha256=SECRET_1,
        store_id=STORE,
    )


@pytest.mark.parametrize(
    ("record", "claim", "connected", "heard_s", "kind"),
    [
        (None, Claim("i2"), False, None, ClaimKind.NEW_NODE),
        (_record(), Claim("i1", SECRET_1), True, 9.9, ClaimKind.SAME_INCARNATION),
        (_record(), Claim("i1", SECRET_2), True, 9.9, ClaimKind.IMPOSTOR),
        (_record(), Claim("i1"), False, 0.0, ClaimKind.IMPOSTOR),
        (_record(NodeState.DEAD), Claim("i1", SECRET_2), False, 9.0, ClaimKind.HOLDER_GONE),
        (_record(), Claim("i2", SECRET_2), True, 9.9, ClaimKind.CONFLICT),
        (_record(NodeState.SUSPECT), Claim("i2", SECRET_2), False, 7.5, ClaimKind.CONFLICT),
        (_record(NodeState.SUSPECT), Claim("i2", SECRET_2), False, None, ClaimKind.CONFLICT),
        (_record(NodeState.DEAD), Claim("i2", SECRET_2), False, 0.0, ClaimKind.HOLDER_GONE),
        (_record(NodeState.LEFT), Claim("i2", SECRET_2), False, 0.0, ClaimKind.HOLDER_GONE),
        (
            _record(),
            Claim("i2", SECRET_2, STORE, "i1"),
            True,
            9.9,
            ClaimKind.RESTART_PROVEN,
        ),
        # The proof must name the holder and the holder's store.
        (_record(), Claim("i2", SECRET_2, STORE, "i0"), True, 9.9, ClaimKind.CONFLICT),
        (_record(), Claim("i2", SECRET_2, "store-b", "i1"), True, 9.9, ClaimKind.CONFLICT),
        (_record(), Claim("i2", SECRET_2, "", ""), True, 9.9, ClaimKind.CONFLICT),
    ],
)
def test_claim_rules(
    record: NodeRecord | None,
    claim: Claim,
    connected: bool,
    heard_s: float | None,
    kind: ClaimKind,
) -> None:
    verdict = judge_claim(
        record, claim, connected=connected, last_heard_s=heard_s, now_s=10.0, dead_after_s=3.0
    )
    assert verdict.kind is kind
    assert verdict.kind.admitted == (kind not in (ClaimKind.CONFLICT, ClaimKind.IMPOSTOR))
    if kind is ClaimKind.CONFLICT:
        assert "w0" in verdict.message
        assert "i1" in verdict.message
        assert "is --node-id unique?" in verdict.message


def test_a_record_without_a_secret_accepts_its_incarnation_once() -> None:
    legacy = NodeRecord(node_id="w0", incarnation="i1")
    verdict = judge_claim(
        legacy,
        Claim("i1", SECRET_1),
        connected=False,
        last_heard_s=0.0,
        now_s=1.0,
        dead_after_s=3.0,
    )
    assert verdict.kind is ClaimKind.SAME_INCARNATION


# -- the core ---------------------------------------------------------------------------------


class Process:
    """One agent process: a fixed incarnation and secret, a new session per Hello."""

    counter = 0

    def __init__(self, node_id: str, incarnation: str, secret: bytes, store_id: str = "") -> None:
        self.node_id = node_id
        self.incarnation = incarnation
        self.secret = secret
        self.store_id = store_id
        self.previous = ""
        self.session = ""

    def hello(self, h: Harness, held: tuple[HeldTask, ...] = ()) -> list:
        Process.counter += 1
        self.session = f"{self.incarnation}/s{Process.counter}"
        h.sessions[self.node_id] = self.session
        h.seq[self.node_id] = 0
        return h.step(
            SessionOpened(
                self.session,
                self.node_id,
                self.incarnation,
                h.now,
                capacity_slots=4,
                held_tasks=held,
                incarnation_secret_sha256=self.secret,
                store_id=self.store_id,
                store_previous_incarnation=self.previous,
            )
        )


def _running(h: Harness, p: Process, tasks: int = 2) -> list[str]:
    h.lead()
    p.hello(h)
    ids = [f"t{k}" for k in range(tasks)]
    for task_id in ids:
        h.submit(f"r-{task_id}", task_id=task_id)
    assert {h.task(t).owner_incarnation for t in ids} == {p.incarnation}
    return ids


def test_a_second_live_process_is_refused_and_the_holder_is_not_disturbed() -> None:
    h = Harness()
    first = Process("w0", "i1", SECRET_1, STORE)
    ids = _running(h, first)
    before = [h.task(t) for t in ids]
    second = Process("w0", "i2", SECRET_2, "store-other")
    h.at(0.2)
    commands = second.hello(h)
    closes = of_type(commands, CloseSession)
    assert [(c.session_id, c.code) for c in closes] == [
        (second.session, StatusCode.FAILED_PRECONDITION)
    ]
    assert "held by another live process" in closes[0].reason
    assert not directives(commands, Welcome)
    assert not directives(commands, Assign)
    (conflict,) = notices_of(commands, n.IdentityConflict)
    assert (conflict.holder_incarnation, conflict.claimant_incarnation) == ("i1", "i2")
    assert [h.task(t) for t in ids] == before
    view = h.core.node("w0")
    assert view is not None
    assert view.session_id == first.session
    assert view.connected


def test_a_cut_off_holder_keeps_its_tasks_until_its_dead_verdict_then_epoch_plus_one() -> None:
    h = Harness()
    first = Process("w0", "i1", SECRET_1, STORE)
    ids = _running(h, first)
    h.close("w0")  # stream gone: SUSPECT, but it may be running (half-open, frozen)
    second = Process("w0", "i2", SECRET_2, "store-other")
    h.at(2.5)
    refused = second.hello(h)
    assert [c.code for c in of_type(refused, CloseSession)] == [StatusCode.FAILED_PRECONDITION]
    assert all(h.task(t).epoch == 1 and h.task(t).owner_incarnation == "i1" for t in ids)
    h.run_until(3.5)  # DEAD: its fence has stopped it; its tasks wait (no live node)
    assert all(h.task(t).state is TaskState.PENDING for t in ids)
    admitted = second.hello(h)
    assert directives(admitted, Welcome)
    assigns = directives(admitted, Assign)
    assert sorted((a.task_id, a.epoch) for a in assigns) == [(t, 2) for t in ids]
    assert {h.task(t).owner_incarnation for t in ids} == {"i2"}


def test_a_restart_in_place_with_the_store_proof_moves_tasks_at_once_epoch_plus_one() -> None:
    h = Harness()
    first = Process("w0", "i1", SECRET_1, STORE)
    ids = _running(h, first)
    h.at(0.3)
    restarted = Process("w0", "i2", SECRET_2, STORE)
    restarted.previous = "i1"  # the lock's previous holder: i1 is gone
    held = tuple(HeldTask(t, 1, HeldTaskStatus.PAUSED) for t in ids)
    commands = restarted.hello(h, held)
    closes = of_type(commands, CloseSession)
    assert [(c.session_id, c.code) for c in closes] == [(first.session, StatusCode.ABORTED)]
    assert not directives(commands, Revoke)  # its local state is the resume point
    assigns = directives(commands, Assign)
    assert sorted((a.task_id, a.epoch, a.attempt) for a in assigns) == [(t, 2, 2) for t in ids]
    assert all(h.task(t).owner_incarnation == "i2" for t in ids)
    joined = notices_of(commands, n.NodeJoined)
    assert [(j.incarnation, j.previous_incarnation) for j in joined] == [("i2", "i1")]


def test_a_restart_whose_node_record_reached_etcd_without_its_tasks_move_still_moves_them() -> None:
    """The leader admits a proven restart and writes the node record (i2), then loses its
    lease before the tasks' move is written (nodes and tasks are two etcd transactions).
    The next leader loads a node at i2 whose tasks i1 still owns: the Hello of i2 is its
    own incarnation's, and the tasks must move to it, not be fenced and left RUNNING
    under i1, a process that no longer exists (seen in the chaos drill, seed 1: the task
    stayed RUNNING until the drill gave up)."""
    h = Harness()
    etcd_nodes: dict[str, NodeRecord] = {}
    etcd_tasks: dict[str, TaskRecord] = {}

    def write(commands: list, *, tasks: bool = True) -> None:
        etcd_nodes.update((r.node_id, r) for r in persisted_nodes(commands))
        if tasks:
            etcd_tasks.update((r.task_id, r) for r in persisted_tasks(commands))

    h.after_step = write
    first = Process("w0", "i1", SECRET_1, STORE)
    ids = _running(h, first)
    h.after_step = None
    h.at(0.3)
    restarted = Process("w0", "i2", SECRET_2, STORE)
    restarted.previous = "i1"
    held = tuple(HeldTask(t, 1, HeldTaskStatus.PAUSED) for t in ids)
    lost_move = restarted.hello(h, held)
    assert {t.owner_incarnation for t in persisted_tasks(lost_move)} == {"i2"}
    write(lost_move, tasks=False)  # the node record committed; the leader's lease ran out
    assert etcd_nodes["w0"].incarnation == "i2"
    assert {etcd_tasks[t].owner_incarnation for t in ids} == {"i1"}

    nxt = Harness(now_s=5.0)
    nxt.lead(term=2, nodes=list(etcd_nodes.values()), tasks=list(etcd_tasks.values()))
    commands = restarted.hello(nxt, held)
    assert not notices_of(commands, n.ZombieFenced)
    assert not directives(commands, Revoke)
    assigns = directives(commands, Assign)
    assert sorted((a.task_id, a.epoch, a.attempt) for a in assigns) == [(t, 2, 2) for t in ids]
    assert all(nxt.task(t).owner_incarnation == "i2" for t in ids)
    # Its own tasks, at its own epoch, stay put on a later Hello of the same process.
    nxt.at(5.5)
    again = restarted.hello(nxt, tuple(HeldTask(t, 2, HeldTaskStatus.PAUSED) for t in ids))
    assert sorted((a.task_id, a.epoch) for a in directives(again, Assign)) == [(t, 2) for t in ids]
    assert all(nxt.task(t).epoch == 2 for t in ids)


def test_a_finished_task_listed_by_the_restarted_process_is_not_run_again() -> None:
    h = Harness()
    first = Process("w0", "i1", SECRET_1, STORE)
    ids = _running(h, first, tasks=2)
    restarted = Process("w0", "i2", SECRET_2, STORE)
    restarted.previous = "i1"
    held = (
        HeldTask(ids[0], 1, HeldTaskStatus.COMPLETED),
        HeldTask(ids[1], 1, HeldTaskStatus.PAUSED),
    )
    commands = restarted.hello(h, held)
    assert [(a.task_id, a.epoch) for a in directives(commands, Assign)] == [(ids[1], 2)]
    assert not directives(commands, Revoke)
    assert h.task(ids[0]).epoch == 1  # its unacked Completed follows the Welcome


def test_a_session_blip_of_the_same_process_reattaches_at_the_same_epoch() -> None:
    h = Harness()
    first = Process("w0", "i1", SECRET_1, STORE)
    ids = _running(h, first)
    old = first.session
    h.at(0.4)
    commands = first.hello(h, tuple(HeldTask(t, 1, HeldTaskStatus.PAUSED) for t in ids))
    assert [(c.session_id, c.code) for c in of_type(commands, CloseSession)] == [
        (old, StatusCode.ABORTED)
    ]
    assigns = directives(commands, Assign)
    assert sorted((a.task_id, a.epoch) for a in assigns) == [(t, 1) for t in ids]


def test_the_public_incarnation_id_without_its_secret_gets_nothing() -> None:
    h = Harness()
    first = Process("w0", "i1", SECRET_1, STORE)
    ids = _running(h, first)
    h.close("w0")
    impostor = Process("w0", "i1", SECRET_2, STORE)
    h.at(0.5)
    commands = impostor.hello(h, tuple(HeldTask(t, 1, HeldTaskStatus.PAUSED) for t in ids))
    assert [c.code for c in of_type(commands, CloseSession)] == [StatusCode.FAILED_PRECONDITION]
    assert not directives(commands, Assign)
    (conflict,) = notices_of(commands, n.IdentityConflict)
    assert conflict.reason == ClaimKind.IMPOSTOR.value


def test_a_dead_holder_under_the_mass_failure_guard_loses_its_tasks_only_at_epoch_plus_one() -> (
    None
):
    # The guard keeps a DEAD node's tasks (the leader may be the one cut off).
    # A new incarnation of that node must still not get them at the old epoch.
    settings = CoreSettings(self_check=True, mass_failure_min_nodes=2)
    h = Harness(settings)
    first = Process("w0", "i1", SECRET_1, STORE)
    ids = _running(h, first)
    other = Process("w1", "j1", SECRET_2, "store-w1")
    other.hello(h)
    h.run_until(3.5)  # both silent: both DEAD, the guard engages
    assert h.core.guard_active
    assert all(h.task(t).epoch == 1 and h.task(t).state.owned for t in ids)
    new = Process("w0", "i2", hashlib.sha256(b"3").digest(), "store-new")
    commands = new.hello(h, tuple(HeldTask(t, 1, HeldTaskStatus.PAUSED) for t in ids))
    assert directives(commands, Welcome)
    assert not [a for a in directives(commands, Assign) if a.epoch == 1]
    for t in ids:
        assert h.task(t).owner_incarnation != "i1"
