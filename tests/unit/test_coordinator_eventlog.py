"""coordinator.eventlog: revisions, the bounded buffer, replay, filters and backpressure."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from coordinator.eventlog import (
    COUNTER_BITS,
    EventFilter,
    EventLog,
    RevisionSpaceExhausted,
    Watcher,
    event_type,
    make_revision,
)
from lazarus.v1 import records_pb2 as r


def code_of(watcher: Watcher) -> grpc.StatusCode | None:
    return None if watcher.closed is None else watcher.closed[0]


def submitted(task_id: str) -> r.Event:
    return r.Event(task_submitted=r.TaskSubmitted(task_id=task_id))


def assigned(task_id: str, node_id: str) -> r.Event:
    return r.Event(task_assigned=r.TaskAssigned(task_id=task_id, node_id=node_id))


def test_revisions_put_the_term_in_the_high_bits_and_grow_across_terms() -> None:
    assert make_revision(7, 3) == (7 << COUNTER_BITS) | 3
    assert make_revision(8, 1) > make_revision(7, (1 << COUNTER_BITS) - 1)
    with pytest.raises(RevisionSpaceExhausted):
        make_revision(1, 1 << COUNTER_BITS)
    log = EventLog(capacity=10)
    log.begin_term(7)
    first = log.append(submitted("a"))
    second = log.append(submitted("b"))
    assert (first.revision, second.revision) == (make_revision(7, 1), make_revision(7, 2))
    assert first.term == 7
    log.begin_term(9)
    assert not log.events
    assert log.append(submitted("c")).revision > second.revision


def test_the_buffer_is_bounded_and_replay_reports_a_gap() -> None:
    log = EventLog(capacity=3)
    log.begin_term(1)
    revs = [log.append(submitted(str(i))).revision for i in range(5)]
    assert [e.revision for e in log.events] == revs[2:]
    whole = log.subscribe(revs[3], EventFilter())
    assert not whole.gap
    assert [e.revision for e in whole.take(10)[0]] == revs[3:]
    old = log.subscribe(revs[0], EventFilter())
    assert old.gap
    assert old.first_revision == revs[2]
    assert [e.revision for e in old.take(10)[0]] == revs[2:]
    live = log.subscribe(0, EventFilter())
    assert live.take(10) == ([], revs[-1])
    nxt = log.append(submitted("x"))
    assert live.take(10) == ([nxt], nxt.revision)


def test_filters_combine_and_the_cursor_passes_filtered_events() -> None:
    log = EventLog()
    log.begin_term(2)
    watcher = log.subscribe(
        0,
        EventFilter(types=frozenset({r.EVENT_TYPE_TASK_ASSIGNED}), task_id="t1", node_id="n1"),
    )
    log.append(submitted("t1"))
    log.append(assigned("t1", "n2"))
    hit = log.append(assigned("t1", "n1"))
    last = log.append(assigned("t2", "n1"))
    assert event_type(hit) == r.EVENT_TYPE_TASK_ASSIGNED
    events, revision = watcher.take(10)
    assert events == [hit]
    assert revision == last.revision == watcher.cursor


async def test_a_full_watcher_is_ended_without_blocking_the_log() -> None:
    log = EventLog(queue_limit=2)
    log.begin_term(3)
    slow = log.subscribe(0, EventFilter())
    fast = log.subscribe(0, EventFilter(task_id="keep"))
    for i in range(5):
        log.append(submitted(str(i)))
    assert code_of(slow) is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert code_of(fast) is None
    assert log.watchers == 1
    assert await slow.wait(0.01)  # wakes at once: it is closed
    assert not await fast.wait(0.01)
    log.append(submitted("keep"))
    assert await fast.wait(1.0)
    log.close_all("leader changed")
    assert code_of(fast) is grpc.StatusCode.UNAVAILABLE
    assert log.watchers == 0
    await asyncio.sleep(0)
