"""The follower shell of rule (b) (``coordinator.forwarding._Interregnum``).

The decisions are ``FollowerCore``'s (``tests/unit/test_fanin_sim.py``); these
tests check what the shell does with them, with our own interfaces faked (no
runtime: the election answers are stepped by hand): which Sessions it feeds,
the ack it writes to the agent, and what it tells the relay. The whole on
real processes: ``tests/integration/test_fanin.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

import pytest

from coordinator.core.fanin import ElectionObserved, FanInSettings, ReadElection, Tick
from coordinator.forwarding import _Held, _Interregnum, _NullObserver, interregnum_settings
from lazarus.v1 import agent_pb2, records_pb2

SETTINGS = FanInSettings()  # the fan-in profile: heartbeat 0.5 s, fence 5 s, dead 6 s
FAST_READS = dataclasses.replace(SETTINGS, election_read_interval_s=0.001)


class _Counting(_NullObserver):
    def __init__(self) -> None:
        self.acks = 0

    def interregnum_acks(self, count: int) -> None:
        self.acks += count


def _interregnum() -> tuple[_Interregnum, _Counting, list[tuple[_Held, float]]]:
    observer = _Counting()
    extended: list[tuple[_Held, float]] = []
    runtime: Any = None  # never read: needed() is False, so no election read runs
    shell = _Interregnum(
        FAST_READS,
        runtime,
        observer,
        needed=lambda: False,
        extended=lambda held, at: extended.append((held, at)),
        leader_acked=lambda: None,
    )
    return shell, observer, extended


def _welcome(session_id: str = "s1", term: int = 5, fence_ms: int = 5000) -> agent_pb2.Welcome:
    return agent_pb2.Welcome(
        session_id=session_id,
        term=term,
        heartbeat_interval_ms=500,
        fence_after_ms=fence_ms,
        dead_after_ms=6000,
    )


def _beat(seq: int) -> agent_pb2.Heartbeat:
    return agent_pb2.Heartbeat(seq=seq, sent_at_unix_ms=1000 + seq, sent_at_monotonic_ms=2000 + seq)


async def _election(shell: _Interregnum, term: int | None, revision: int) -> None:
    """One read of the election, answered at once (what ``_read`` does with etcd's answer)."""
    await asyncio.sleep(0.002)  # the next read is due
    (read,) = [c for c in shell.core.step(Tick(time.monotonic())) if isinstance(c, ReadElection)]
    leader = "" if term is None else f"r{term}"
    answer = ElectionObserved(read.read_id, revision, term, leader, time.monotonic())
    shell._run(shell.core.step(answer))


def _inbox(held: _Held) -> list[agent_pb2.CoordinatorMessage]:
    out = []
    while not held.inbox.empty():
        item = held.inbox.get_nowait()
        assert isinstance(item, bytes)
        out.append(agent_pb2.CoordinatorMessage.FromString(item))
    return out


async def test_the_follower_acks_a_held_session_once_the_leaders_key_is_gone() -> None:
    shell, observer, extended = _interregnum()
    held = _Held()
    shell.welcomed(held, _welcome(term=5))
    await _election(shell, 5, revision=10)  # term 5 leads
    shell.heartbeat(held, _beat(1))  # no anchor yet: kept pending, no ack
    assert _inbox(held) == []
    # Term 5 is seen gone (no key): the read is an anchor, and the pending
    # heartbeat arrived before anchor + W.
    await _election(shell, None, revision=11)
    (message,) = _inbox(held)
    ack = message.heartbeat_ack
    assert (ack.seq, ack.sent_at_unix_ms, ack.sent_at_monotonic_ms) == (1, 1001, 2001)
    assert ack.term == 5  # the leader that Welcomed the Session
    assert ack.node_state == records_pb2.NODE_STATE_UNSPECIFIED  # a follower judges no node
    assert observer.acks == 1
    assert [h for h, _ in extended] == [held]  # the relay may defer its Reattach
    await shell.close()


async def test_a_session_welcomed_with_timings_the_window_does_not_cover_gets_no_ack(
    caplog: pytest.LogCaptureFixture,
) -> None:
    shell, observer, _ = _interregnum()
    caplog.set_level(logging.WARNING, logger="lazarus.coordinator.forwarding")
    one, two = _Held(), _Held()
    shell.welcomed(one, _welcome("s1", fence_ms=6000))  # fences later than W assumes
    shell.welcomed(two, _welcome("s2", fence_ms=6000))
    assert one.interregnum_key is None
    assert two.interregnum_key is None
    warnings = [r for r in caplog.records if "no interregnum acks" in r.getMessage()]
    assert len(warnings) == 1, warnings  # once per set of timings, not per agent
    shell.heartbeat(one, _beat(1))
    await _election(shell, None, revision=3)  # no leader: an anchor, but nobody to ack
    assert _inbox(one) == []
    assert observer.acks == 0
    await shell.close()


async def test_a_new_welcome_ends_the_old_session_for_the_rule() -> None:
    shell, _, _ = _interregnum()
    held = _Held()
    shell.welcomed(held, _welcome("s1", term=5))
    first = held.interregnum_key
    assert first is not None
    shell.heartbeat(held, _beat(1))
    shell.welcomed(held, _welcome("s2", term=7))  # after a Reattach: the next leader's
    assert held.interregnum_key != first
    assert held.term == 7
    assert held.sent_at == {}
    assert shell.core.acked_seq(*first) is None  # no ack can go to the old Session
    shell.ended(held)
    assert held.interregnum_key is None
    await shell.close()


def test_the_window_never_counts_the_failover_reconnect_grace() -> None:
    # A node that said Hello to a new leader gets dead_after_s from its election,
    # never dead_after_s + failover_reconnect_s: W is computed with g = 0.
    settings = interregnum_settings(0.5, 5.0, 6.0, 3.0)
    assert settings is not None
    assert settings.new_leader_floor_s == 0.0
    assert settings.interregnum_window_s == pytest.approx(SETTINGS.interregnum_window_s)
    assert interregnum_settings(0.5, 5.9, 6.0, 3.0) is None  # I1 broken: rule (b) off
