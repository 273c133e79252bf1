"""The election's keepalive thread: however it stops renewing the lease, the session is lost.

Fake etcd clients only (the thread's ``client_factory`` and the election's own
client): what is checked is the session's reaction, once, by the lease
deadline, and that the next campaign's session is a new lease.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

import coordinator.election as election_module
from coordinator.election import Election, KeepaliveThread, LossReason, _Session

LEASE_S = 0.6
"""Time from a session's start to its lease deadline in these tests."""


@dataclass
class _Reply:
    TTL: int


class _ThreadClient:
    """The keepalive thread's client: connects, answers every keepalive with ``ttl_s``."""

    def __init__(self, ttl_s: int = 1) -> None:
        self.ttl_s = ttl_s
        self.refreshes = 0

    async def connect(self) -> None:
        return None

    async def refresh_lease(self, lease_id: int) -> Any:
        self.refreshes += 1
        return _Reply(self.ttl_s)

    async def revoke_lease(self, lease_id: int) -> None:
        return None

    async def close(self) -> None:
        return None


def _failing_factory() -> Any:
    raise OSError("etcd CA file unreadable")


class _Losses:
    def __init__(self) -> None:
        self.reasons: list[LossReason] = []
        self.at_s: list[float] = []

    def __call__(self, reason: LossReason) -> None:
        self.reasons.append(reason)
        self.at_s.append(time.monotonic())


async def _session(factory: Callable[[], Any], losses: _Losses) -> tuple[_Session, float]:
    deadline_s = time.monotonic() + LEASE_S
    session = _Session(
        object(),  # type: ignore[arg-type]  # the thread uses its own client only
        0x1234,
        1,
        deadline_s,
        losses,
        KeepaliveThread(factory),
    )
    return session, deadline_s


async def test_a_client_setup_that_keeps_failing_loses_the_session_at_its_deadline() -> None:
    losses = _Losses()
    session, deadline_s = await _session(_failing_factory, losses)
    try:
        async with asyncio.timeout(LEASE_S + 2.0):
            await session.lost_event.wait()
        await asyncio.sleep(0.5)  # no second report
        assert losses.reasons == [LossReason.LEASE_DEADLINE_PASSED]
        assert session.lost_reason is LossReason.LEASE_DEADLINE_PASSED
        assert not session.alive
        assert losses.at_s[0] >= deadline_s - 0.05, "retried until the deadline"
        assert losses.at_s[0] <= deadline_s + 0.3, "reported at the deadline"
    finally:
        await session.close(revoke=False)


async def test_a_transient_client_setup_failure_is_retried_within_the_lease() -> None:
    calls = itertools.count()
    client = _ThreadClient(ttl_s=1)

    def factory() -> Any:
        if next(calls) < 2:
            raise OSError("auth timed out")
        return client

    losses = _Losses()
    session, deadline_s = await _session(factory, losses)
    try:
        await asyncio.sleep(deadline_s - time.monotonic() + 1.5)  # well past the first deadline
        assert losses.reasons == []
        assert session.alive
        assert client.refreshes >= 5
    finally:
        await session.close(revoke=False)


async def test_a_keepalive_loop_that_keeps_raising_loses_the_session_at_its_deadline() -> None:
    class _Garbled(_ThreadClient):
        async def refresh_lease(self, lease_id: int) -> Any:
            return object()  # no TTL: the loop itself raises

    made = itertools.count()

    def factory() -> Any:
        next(made)
        return _Garbled()

    losses = _Losses()
    session, _ = await _session(factory, losses)
    try:
        async with asyncio.timeout(LEASE_S + 2.0):
            await session.lost_event.wait()
        await asyncio.sleep(0.3)
        assert losses.reasons == [LossReason.LEASE_DEADLINE_PASSED]
        assert next(made) >= 2, "a failed loop gets a fresh client while the lease lasts"
    finally:
        await session.close(revoke=False)


async def test_a_keepalive_thread_that_dies_is_reported_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def crash(self: Any) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(election_module._KeepaliveThreadRun, "_main", crash)
    losses = _Losses()
    session, deadline_s = await _session(lambda: _ThreadClient(), losses)
    try:
        async with asyncio.timeout(LEASE_S):
            await session.lost_event.wait()
        await asyncio.sleep(0.2)
        assert losses.reasons == [LossReason.KEEPALIVE_STOPPED]
        assert losses.at_s[0] < deadline_s
        assert not session.alive
    finally:
        await session.close(revoke=False)


async def test_a_keepalive_thread_stuck_in_setup_still_loses_the_session_at_its_deadline() -> None:
    release = threading.Event()

    def factory() -> Any:
        release.wait(10.0)  # a hung TLS file read, say
        raise OSError("gave up")

    losses = _Losses()
    session, deadline_s = await _session(factory, losses)
    try:
        async with asyncio.timeout(LEASE_S + 1.0):
            await session.lost_event.wait()
        assert losses.reasons == [LossReason.LEASE_DEADLINE_PASSED]
        assert losses.at_s[0] <= deadline_s + 0.2
    finally:
        release.set()
        await session.close(revoke=False)


class _ElectionClient:
    """The election's own client: grants leases with increasing ids."""

    def __init__(self) -> None:
        self._ids = itertools.count(0x100)
        self.revoked: list[int] = []

    async def lease(self, ttl_s: int) -> Any:
        @dataclass
        class _Lease:
            id: int
            ttl: int

        return _Lease(next(self._ids), ttl_s)

    async def revoke_lease(self, lease_id: int) -> None:
        self.revoked.append(lease_id)


async def test_after_the_keepalive_thread_failed_the_next_campaign_gets_a_new_lease() -> None:
    election = Election(
        _ElectionClient(),  # type: ignore[arg-type]
        "/e",
        ttl_s=1,
        keepalive=KeepaliveThread(_failing_factory),
    )
    try:
        first = await election._live_session()
        assert election.lease_id == first.lease_id
        async with asyncio.timeout(3.0):
            await first.lost_event.wait()
        assert first.lost_reason is LossReason.LEASE_DEADLINE_PASSED
        assert election.lease_id is None, "a lost lease is nobody's (MemberRegistry reads this)"
        second = await election._live_session()  # what campaign() does first
        assert second is not first
        assert second.lease_id != first.lease_id
        assert second.alive
    finally:
        await election.close()
