"""``merge_steps``: several steps' commands as one Ready-style batch the shell runs as is.

The runtime used to merge the persists of a batch itself; the rule now lives in
the core (``coordinator/core/commands.py``) and these tests hold it: every
retire, then every persist (each record once, its newest value, at most
MAX_TXN_OPS per transaction), then every other command in step order.
"""

from __future__ import annotations

from core_harness import Harness, of_type, persisted_tasks

from coordinator.core.commands import (
    MAX_TXN_OPS,
    Command,
    PersistNodes,
    PersistTasks,
    ReplyToRequest,
    RetireRecords,
    StepDown,
    merge_steps,
)

PERSISTS = (RetireRecords, PersistNodes, PersistTasks)


def _steps(h: Harness, count: int) -> list[list[Command]]:
    h.lead()
    h.hello("n1", slots=count + 10)
    return [h.submit(f"r{i}", f"t{i}") for i in range(count)]


def test_a_single_step_is_returned_as_it_is() -> None:
    h = Harness()
    (step,) = _steps(h, 1)
    assert merge_steps([step]) == step


def test_every_persist_precedes_every_other_command_and_replies_keep_step_order() -> None:
    h = Harness()
    steps = _steps(h, 5)
    merged = merge_steps(steps)
    kinds = [isinstance(c, PERSISTS) for c in merged]
    first_other = kinds.index(False)
    assert all(kinds[:first_other])
    assert not any(kinds[first_other:])
    replies = [c.request_id for c in of_type(merged, ReplyToRequest)]
    assert replies == [c.request_id for s in steps for c in of_type(s, ReplyToRequest)]
    # Same non-persist commands as running the steps one by one, same order.
    assert [c for c in merged if not isinstance(c, PERSISTS)] == [
        c for s in steps for c in s if not isinstance(c, PERSISTS)
    ]


def test_each_record_is_written_once_with_its_newest_value() -> None:
    h = Harness()
    steps = _steps(h, 3)
    steps.append(h.tick())  # may re-persist tasks the submits wrote (assignments)
    merged = merge_steps(steps)
    written = persisted_tasks(merged)
    assert len({t.task_id for t in written}) == len(written)
    newest = {t.task_id: t for s in steps for t in persisted_tasks(s)}
    assert {t.task_id: t for t in written} == newest


def test_persists_are_split_at_the_transaction_limit() -> None:
    h = Harness()
    steps = _steps(h, MAX_TXN_OPS + 7)
    merged = merge_steps(steps)
    sizes = [len(c.records) for c in merged if isinstance(c, PersistTasks)]
    assert sum(sizes) == MAX_TXN_OPS + 7
    assert all(0 < n <= MAX_TXN_OPS for n in sizes)


def test_retirements_come_first_and_a_step_down_ends_the_batch() -> None:
    retire = RetireRecords(term=1)
    step_down = StepDown("persist failed")
    h = Harness()
    steps = _steps(h, 2)
    merged = merge_steps([steps[0], [retire], [step_down], steps[1]])
    assert merged[0] == retire
    assert merged[-1] == step_down
    assert persisted_tasks(merged) == persisted_tasks(steps[0])  # nothing after the step-down
