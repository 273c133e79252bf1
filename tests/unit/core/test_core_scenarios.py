"""Scenario tests in the etcd/raft style: a readable script, the full transcript compared.

Each scenario drives CoordinatorCore through a script and renders every event
with every command it produced; the text must equal the stored transcript in
``transcripts/<name>.txt``. Runs of steps whose only output is a HeartbeatAck
(or nothing, for ticks) are folded into one line so the story stays readable;
everything else is printed in full. After an intended change, regenerate with
``LAZARUS_UPDATE_TRANSCRIPTS=1 pytest tests/unit/core/test_core_scenarios.py``
and review the diff.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from core_harness import Harness, render

from coordinator.core import (
    Checkpointed,
    CheckpointSummary,
    Command,
    Completed,
    CoreSettings,
    Event,
    HeartbeatAck,
    HeartbeatReceived,
    HeldTask,
    HeldTaskStatus,
    NodeRecord,
    NodeState,
    SendDirective,
    SessionOpened,
    Started,
    TaskRecord,
    TaskResult,
    TaskSpec,
    TaskState,
    Tick,
)

TRANSCRIPTS = Path(__file__).parent / "transcripts"


def transcript(h: Harness, title: str) -> str:
    lines = [f"# {title}", ""]
    quiet: list[Event] = []

    def flush() -> None:
        if not quiet:
            return
        beats = sum(isinstance(e, HeartbeatReceived) for e in quiet)
        ticks = len(quiet) - beats
        lines.append(
            f"{quiet[0].now_s:7.3f} .. {quiet[-1].now_s:.3f}  "
            f"({beats} heartbeats acked, {ticks} ticks without commands)"
        )
        quiet.clear()

    for event, commands in h.log:
        only_acks = all(
            isinstance(c, SendDirective) and isinstance(c.directive, HeartbeatAck) for c in commands
        )
        if (isinstance(event, Tick) and not commands) or (
            isinstance(event, HeartbeatReceived) and only_acks
        ):
            quiet.append(event)
            continue
        flush()
        lines.append(f"{event.now_s:7.3f} > {render(event)}")
        lines.extend(f"        < {render(c)}" for c in commands)
    flush()
    return "\n".join(lines) + "\n"


def owner_goes_silent_and_comes_back_as_a_zombie() -> Harness:
    h = Harness(CoreSettings(self_check=True), seed=42)
    h.lead(term=5)
    h.at(0.1).hello("a", slots=2)
    h.at(0.2).hello("b", slots=2)
    h.run_until(3.2, heartbeating=["a", "b"])  # past the new-leader grace
    h.at(3.25).submit("req-1", task_id="build", kind="compile")
    owner = h.task("build").owner_node_id
    other = "b" if owner == "a" else "a"
    h.at(3.3).update(owner, "build", 1, Started())
    ckpt = CheckpointSummary("build@1", epoch=1, seq=1, covers_journal_seq=7, replicated=True)
    h.at(3.4).update(owner, "build", 1, Checkpointed(ckpt, journal_seq=9, replicated_journal_seq=9))
    # The owner falls silent (its stream stays open); the other keeps heartbeating.
    h.run_until(7.0, heartbeating=[other])
    # The zombie returns: Hello lists the task paused at epoch 1, then a stale checkpoint.
    h.at(7.05).hello(owner, held=[HeldTask("build", 1, HeldTaskStatus.PAUSED, checkpoint_seq=2)])
    stale = CheckpointSummary("build@2", epoch=1, seq=2, covers_journal_seq=12)
    h.at(7.1).update(owner, "build", 1, Checkpointed(stale, journal_seq=12))
    h.at(7.2).update(other, "build", 2, Started(resumed_from=ckpt))
    h.at(7.5).update(other, "build", 2, Completed(TaskResult(b"ok", size_bytes=2)))
    assert h.task("build").state is TaskState.COMPLETED
    return h


def new_leader_finishes_a_half_done_move() -> Harness:
    # What etcd holds after the previous leader declared "c" DEAD and crashed
    # before moving its task, and while "a" and "b" were still serving.
    nodes = [
        NodeRecord("a", "a#1", capacity_slots=2, written_term=3),
        NodeRecord("b", "b#1", capacity_slots=2, written_term=3),
        NodeRecord(
            "c", "c#1", NodeState.DEAD, capacity_slots=2, state_changed_at_s=90.0, written_term=3
        ),
    ]
    spec = TaskSpec(kind="index")
    tasks = [
        TaskRecord("t-on-a", "r1", spec, TaskState.RUNNING, epoch=1, owner_node_id="a"),
        TaskRecord("t-on-b", "r2", spec, TaskState.RUNNING, epoch=2, attempt=2, owner_node_id="b"),
        TaskRecord("t-on-c", "r3", spec, TaskState.RUNNING, epoch=1, owner_node_id="c"),
    ]
    h = Harness(CoreSettings(self_check=True), seed=7, now_s=100.0)
    h.lead(term=4, nodes=nodes, tasks=tasks)
    # "a" reconnects at once, still running its task; "b" never comes back.
    h.at(100.3).hello("a", slots=2, held=[HeldTask("t-on-a", 1, HeldTaskStatus.RUNNING)])
    h.run_until(103.4, heartbeating=["a"])
    return h


def _hello_as(
    h: Harness,
    session: str,
    incarnation: str,
    secret: bytes,
    store_id: str,
    previous: str = "",
    held: tuple[HeldTask, ...] = (),
) -> None:
    """A Hello of one agent process for node "w0" (its own session, secret and store)."""
    h.sessions["w0"] = session
    h.seq["w0"] = 0
    h.step(
        SessionOpened(
            session,
            "w0",
            incarnation,
            h.now,
            capacity_slots=2,
            held_tasks=held,
            incarnation_secret_sha256=secret,
            store_id=store_id,
            store_previous_incarnation=previous,
        )
    )


def second_process_under_one_node_id() -> Harness:
    # DESIGN.md section 4: the holder is live, so the second process is refused
    # and the holder keeps its task; the holder falls silent, is declared DEAD
    # (it fenced itself by then), and only then the second process gets the
    # task, at epoch + 1.
    h = Harness(CoreSettings(self_check=True), seed=3)
    h.lead(term=2)
    _hello_as(h.at(0.1), "p1/s1", "p1", b"secret-p1", "store-p1")
    h.run_until(3.2, heartbeating=["w0"])  # past the new-leader grace
    h.at(3.25).submit("req-1", task_id="crawl", kind="crawl")
    h.at(3.3).update("w0", "crawl", 1, Started())
    seq = h.seq["w0"]
    _hello_as(h.at(3.5), "p2/s1", "p2", b"secret-p2", "store-p2")  # refused
    h.sessions["w0"], h.seq["w0"] = "p1/s1", seq  # p1 goes on undisturbed
    h.run_until(4.0, heartbeating=["w0"])
    h.run_until(7.1)  # p1 silent: SUSPECT, then DEAD; its task waits
    _hello_as(h.at(7.2), "p2/s2", "p2", b"secret-p2", "store-p2")  # admitted
    assert h.task("crawl").epoch == 2
    return h


def restart_in_place_with_the_store_proof() -> Harness:
    # The holder is SIGKILLed and its container restarted on the same volume:
    # the new process holds the store's lock, which names p1 as its previous
    # holder. The task moves to it at once at epoch + 1, no DEAD verdict.
    h = Harness(CoreSettings(self_check=True), seed=4)
    h.lead(term=2)
    _hello_as(h.at(0.1), "p1/s1", "p1", b"secret-p1", "store-a")
    h.run_until(3.2, heartbeating=["w0"])
    h.at(3.25).submit("req-1", task_id="crawl", kind="crawl")
    h.at(3.3).update("w0", "crawl", 1, Started())
    held = (HeldTask("crawl", 1, HeldTaskStatus.PAUSED, checkpoint_seq=4),)
    _hello_as(h.at(3.6), "p2/s1", "p2", b"secret-p2", "store-a", previous="p1", held=held)
    assert h.task("crawl").epoch == 2
    return h


SCENARIOS: dict[str, tuple[str, Callable[[], Harness]]] = {
    "second_process_under_one_node_id": (
        "A second process claims a live node id and is refused; after the holder's DEAD "
        "verdict it is admitted and gets the task at epoch + 1.",
        second_process_under_one_node_id,
    ),
    "restart_in_place_with_the_store_proof": (
        "A restarted process proves the old one stopped (same store, lock's previous "
        "holder); the task moves to it at once at epoch + 1.",
        restart_in_place_with_the_store_proof,
    ),
    "owner_goes_silent_and_comes_back_as_a_zombie": (
        "Two nodes; the owner of a task goes silent, the task moves with its checkpoint, "
        "the zombie returns and is fenced.",
        owner_goes_silent_and_comes_back_as_a_zombie,
    ),
    "new_leader_finishes_a_half_done_move": (
        "A new leader loads etcd, gives every node dead_after_s, then moves what the old "
        "leader left behind.",
        new_leader_finishes_a_half_done_move,
    ),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_transcript(name: str) -> None:
    title, script = SCENARIOS[name]
    text = transcript(script(), title)
    path = TRANSCRIPTS / f"{name}.txt"
    if os.environ.get("LAZARUS_UPDATE_TRANSCRIPTS") == "1":
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"no transcript {path}; run with LAZARUS_UPDATE_TRANSCRIPTS=1"
    assert text == path.read_text(encoding="utf-8")


def test_transcripts_are_deterministic() -> None:
    for _, script in SCENARIOS.values():
        one: list[tuple[Event, list[Command]]] = script().log
        two: list[tuple[Event, list[Command]]] = script().log
        assert one == two
