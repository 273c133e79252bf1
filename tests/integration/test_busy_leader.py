"""Issue 16 item 3: the election lease survives a busy leader.

A leader whose event loop is blocked longer than the lease TTL (a saturated
loop: a long step, a flood of work) must keep its lease, because the
keepalive runs on its own thread; a loop that lags past the lag guard's bound
must give the leadership up cleanly (``LOOP_LAGGED``: the lease is revoked,
so the next campaigner leads at once rather than after the TTL).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import aetcd
import pytest

from coordinator.election import Election, KeepaliveThread, LossReason
from lazarus_dev.localservers import Endpoint, EtcdServer

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]

GRPC_OPTIONS = {"grpc.enable_http_proxy": 0}


def etcd_client_for(endpoint: Endpoint) -> aetcd.Client:
    return aetcd.Client(host=endpoint.host, port=endpoint.port, timeout=5.0, options=GRPC_OPTIONS)


TTL_S = 2
"""Lease TTL of these tests; every block below is longer than it."""


def _prefix() -> str:
    return f"/lazarus-test/busy-{uuid.uuid4().hex[:10]}/election"


async def _block_loop(seconds: float) -> None:
    """Block the running event loop, as a saturated loop does (no await inside)."""
    await asyncio.sleep(0)
    time.sleep(seconds)  # noqa: ASYNC251 - the point of the test
    await asyncio.sleep(0)


async def test_lease_outlives_a_blocked_loop(etcd: EtcdServer) -> None:
    client = etcd_client_for(etcd.endpoint)
    await client.connect()
    prefix = _prefix()
    election = Election(
        client,
        prefix,
        ttl_s=TTL_S,
        keepalive=KeepaliveThread(
            lambda: etcd_client_for(etcd.endpoint), resign_after_lag_s=TTL_S * 4.0
        ),
    )
    try:
        async with asyncio.timeout(30):
            leadership = await election.campaign("busy-leader")
            for _ in range(3):  # each block outlasts the TTL (and etcd's own expiry)
                await _block_loop(TTL_S + 1.5)
            await asyncio.sleep(0.3)  # let a deleted-key watch report
            assert not leadership.is_lost, leadership.reason
            keys = await client.get_prefix((prefix + "/").encode())
            assert [kv.key.decode() for kv in keys] == [leadership.key]
    finally:
        await election.close()
        await client.close()


async def test_loop_lag_past_the_bound_resigns(etcd: EtcdServer) -> None:
    client = etcd_client_for(etcd.endpoint)
    await client.connect()
    prefix = _prefix()
    election = Election(
        client,
        prefix,
        ttl_s=10,
        keepalive=KeepaliveThread(
            lambda: etcd_client_for(etcd.endpoint),
            degraded_after_lag_s=0.3,
            resign_after_lag_s=1.0,
        ),
    )
    try:
        async with asyncio.timeout(30):
            leadership = await election.campaign("stuck-leader")
            started = time.monotonic()
            await _block_loop(2.0)
            reason = await leadership.lost()
            assert reason in (LossReason.LOOP_LAGGED, LossReason.KEY_DELETED)
            # The lease was revoked: the key is gone long before its 10 s TTL.
            assert len(await client.get_prefix((prefix + "/").encode())) == 0
            assert time.monotonic() - started < 5.0
    finally:
        await election.close()
        await client.close()


async def test_keepalive_thread_without_a_client_gives_up_and_the_next_campaign_leads(
    etcd: EtcdServer,
) -> None:
    """A keepalive thread that cannot set up its client (unreadable TLS file,
    auth timing out) must end the leadership by the lease deadline; the next
    campaign then runs on a new lease, which a working thread keeps alive."""
    client = etcd_client_for(etcd.endpoint)
    await client.connect()
    prefix = _prefix()
    failing = True

    def factory() -> aetcd.Client:
        if failing:
            raise OSError("etcd CA file unreadable")
        return etcd_client_for(etcd.endpoint)

    election = Election(
        client, prefix, ttl_s=TTL_S, keepalive=KeepaliveThread(factory, resign_after_lag_s=5.0)
    )
    try:
        async with asyncio.timeout(30):
            first = await election.campaign("leader")
            won_at = time.monotonic()
            reason = await first.lost()
            lost_after_s = time.monotonic() - won_at
            assert reason is LossReason.LEASE_DEADLINE_PASSED
            assert lost_after_s < TTL_S, "given up before etcd can expire the lease"
            assert election.lease_id is None

            failing = False
            second = await election.campaign("leader")
            assert second.lease_id != first.lease_id, "a new lease, not the dead one"
            await asyncio.sleep(TTL_S * 2)  # the working thread keeps it alive
            assert not second.is_lost, second.reason
            keys = await client.get_prefix((prefix + "/").encode())
            assert [kv.key.decode() for kv in keys] == [second.key]
    finally:
        await election.close()
        await client.close()
