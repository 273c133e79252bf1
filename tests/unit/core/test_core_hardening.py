"""Unit tests of issue 16 in the pure core: intake limits, load screening, fork order, retention."""

from __future__ import annotations

from random import Random

from coordinator.core import (
    CoordinatorCore,
    CoreSettings,
    ForkSeeded,
    LeadershipAcquired,
    PersistTasks,
    ReplyToRequest,
    RetireRecords,
    SeedFork,
    SendDirective,
    SessionOpened,
    StatusCode,
    TaskSpec,
    TaskState,
    TaskSubmitted,
    Tick,
)
from coordinator.core.commands import CloseSession
from coordinator.core.limits import LIMITS, MAX_RECORD_BYTES, Refusal, screen
from coordinator.core.loadcheck import screen_loaded
from coordinator.core.records import NodeRecord, TaskRecord


def _leader(**settings: float) -> CoordinatorCore:
    core = CoordinatorCore(CoreSettings(self_check=True, **settings), rng=Random(1))
    core.step(LeadershipAcquired(term=1, now_s=0.0))
    return core


def test_limits_keep_a_full_task_record_inside_one_etcd_request() -> None:
    labels = 2 * LIMITS.labels_per_map * (LIMITS.label_key_bytes + LIMITS.label_value_bytes)
    total = (
        LIMITS.spec_payload_bytes
        + LIMITS.result_payload_bytes
        + labels
        + LIMITS.error_message_bytes
        + LIMITS.error_traceback_bytes
        + 32 * LIMITS.checkpoint_ref_bytes
    )
    assert total < MAX_RECORD_BYTES < 1_500_000


def test_an_oversized_label_closes_that_session_naming_the_field() -> None:
    core = _leader()
    hello = SessionOpened("s1", "n1", "i1", 1.0, labels=(("zone", "x" * 10_000),))
    assert isinstance(screen(hello), Refusal)
    commands = core.step(hello)
    assert commands == [
        CloseSession("n1", "s1", StatusCode.INVALID_ARGUMENT, commands[0].reason)  # type: ignore[union-attr]
    ]
    assert "hello.labels" in commands[0].reason  # type: ignore[union-attr]
    assert core.node("n1") is None


def test_an_oversized_submission_is_refused_and_nothing_is_persisted() -> None:
    core = _leader()
    spec = TaskSpec(kind="k", node_selector=tuple((f"k{i}", "v") for i in range(100)))
    commands = core.step(TaskSubmitted("r1", spec, 1.0))
    assert [type(c) for c in commands] == [ReplyToRequest]
    assert commands[0].status is StatusCode.INVALID_ARGUMENT  # type: ignore[union-attr]
    assert "spec.node_selector" in commands[0].message  # type: ignore[union-attr]


def test_load_screening_quarantines_what_would_break_the_core() -> None:
    good = TaskRecord(task_id="t1", request_id="r", spec=TaskSpec(kind="k"))
    screened = screen_loaded(
        {"n1": NodeRecord("n1", "i"), "n2": NodeRecord("nX", "i"), "n3": "DecodeError: bad"},
        {
            "t1": good,
            "t2": TaskRecord(task_id="t2", request_id="r", spec=TaskSpec(kind="k")),
            "t3": TaskRecord(task_id="", request_id="r3", spec=TaskSpec(kind="k")),
            "t4": TaskRecord(task_id="t4", request_id="r4", spec=TaskSpec(kind="k"), epoch=-1),
        },
    )
    assert [n.node_id for n in screened.nodes] == ["n1"]
    assert screened.tasks == (good,)
    assert sorted((q.collection, q.name) for q in screened.quarantined) == [
        ("nodes", "n2"),
        ("nodes", "n3"),
        ("tasks", "t2"),
        ("tasks", "t3"),
        ("tasks", "t4"),
    ]
    core = CoordinatorCore(CoreSettings(self_check=True), rng=Random(1))
    core.step(LeadershipAcquired(1, 0.0, screened.nodes, screened.tasks, screened.quarantined))


def test_a_fork_is_seeded_after_its_persist_and_placed_only_once_seeded() -> None:
    core = _leader()
    core.step(SessionOpened("s1", "n1", "i1", 0.5))
    fork = TaskSubmitted("r1", TaskSpec(kind="k"), 1.0, "f1", forked_from_ref="t@1", fork_seed=b"x")
    commands = core.step(fork)
    kinds = [type(c) for c in commands]
    assert kinds.index(PersistTasks) < kinds.index(SeedFork)
    assert not any(isinstance(c, SendDirective) and c.directive.task_id == "f1" for c in commands)  # type: ignore[attr-defined]
    assert core.task("f1").state is TaskState.PENDING  # type: ignore[union-attr]
    seeded = core.step(ForkSeeded("f1", 1.1, ok=True))
    assert any(isinstance(c, SendDirective) for c in seeded)
    assert core.task("f1").state is TaskState.ASSIGNED  # type: ignore[union-attr]


def test_a_refused_fork_asks_for_no_seed_and_a_failed_seed_fails_the_task() -> None:
    core = _leader()
    refused = core.step(
        TaskSubmitted("r1", TaskSpec(kind=""), 1.0, "f1", forked_from_ref="t@1", fork_seed=b"x")
    )
    assert not any(isinstance(c, SeedFork) for c in refused)
    core.step(
        TaskSubmitted("r2", TaskSpec(kind="k"), 1.0, "f2", forked_from_ref="t@1", fork_seed=b"x")
    )
    core.step(ForkSeeded("f2", 1.2, ok=False, reason="Redis down"))
    assert core.task("f2").state is TaskState.FAILED  # type: ignore[union-attr]


def test_terminal_tasks_are_retired_after_the_retention_period() -> None:
    core = _leader(retention_s=10.0)
    core.step(TaskSubmitted("r1", TaskSpec(kind="k"), 1.0, "t1"))
    from coordinator.core import CancelRequested

    core.step(CancelRequested("c1", "t1", 2.0))
    assert not any(isinstance(c, RetireRecords) for c in core.step(Tick(11.0)))
    commands = core.step(Tick(12.5))
    retired = [c for c in commands if isinstance(c, RetireRecords)]
    assert [t.task_id for t in retired[0].tasks] == ["t1"]
    assert core.task("t1") is None
