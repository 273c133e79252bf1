"""Member records: every coordinator replica says who it is, under its election lease.

Theory of operation: each replica keeps ``/lazarus/<cluster>/members/<member_id>``
holding a ``MemberRecord`` (member id, gRPC and metrics addresses, lease id,
version, start time), put under the lease of its election session. The
record therefore lives exactly as long as the replica's candidacy: a crashed
replica's record goes with its lease, at most the lease TTL later (DESIGN.md
§5), and nobody has to clean up after it.

:class:`MemberRegistry` is the shell task that keeps the record current: every
``interval_s`` it puts the record when its lease changed (first run, new
election session) or the stored record is gone; a put lost to an etcd blip
is retried on the next round. It decides nothing about the cluster, so it
needs no fence: each replica writes only its own key.

:func:`list_members` reads them all for ``GetClusterStatus`` and fills in what
the election alone knows: each record's candidacy revision (the create
revision of its election key) and role; leader first, then by candidacy
revision (etcd's election recipe: the lowest create revision leads). A
record whose lease no longer backs a key of the election prefix (a candidacy
withdrawn, the lease kept) is left out.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aetcd
from google.protobuf.message import DecodeError

from coordinator.election import Election
from coordinator.etcd_store import cluster_prefix
from lazarus.v1 import records_pb2

__all__ = ["MEMBERS_SEGMENT", "MemberRegistry", "list_members", "members_prefix"]

_log = logging.getLogger("lazarus.coordinator.members")

MEMBERS_SEGMENT = "members"
"""Path segment of member records after ``/lazarus/<cluster>/``."""

REFRESH_INTERVAL_S = 1.0
"""How often a replica checks its member record (and its role) by default."""


def members_prefix(cluster: str) -> bytes:
    """``/lazarus/<cluster>/members/``; ValueError for a bad cluster name."""
    return cluster_prefix(cluster) + f"{MEMBERS_SEGMENT}/".encode()


class MemberRegistry:
    """Keeps this replica's ``MemberRecord`` in etcd while it campaigns.

    Args:
        client: the connected etcd client.
        cluster: the cluster name.
        election: this replica's election (its lease and key prefix).
        member_id: this replica's id.
        address: its advertised gRPC address.
        metrics_address: its /metrics host:port, "" when none.
        version: the software version.
        interval_s: seconds between two checks, > 0.
    """

    def __init__(
        self,
        client: aetcd.Client,
        cluster: str,
        election: Election,
        *,
        member_id: str,
        address: str,
        metrics_address: str = "",
        version: str = "",
        interval_s: float = REFRESH_INTERVAL_S,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self._client = client
        self._key = members_prefix(cluster) + member_id.encode()
        self._election = election
        self._member_id = member_id
        self._address = address
        self._metrics_address = metrics_address
        self._version = version
        self._interval_s = interval_s
        self._started_ms = time.time_ns() // 1_000_000
        self._written: bytes | None = None

    async def run(self) -> None:
        """Keep the record current until cancelled; etcd errors are logged and retried."""
        while True:
            try:
                await self.refresh()
            except (aetcd.ClientError, OSError) as exc:
                _log.warning("member record of %s not written: %s; retrying", self._member_id, exc)
                self._written = None
            await asyncio.sleep(self._interval_s)

    async def refresh(self) -> bool:
        """Put the record if its lease changed or it vanished; True when a put was sent.

        Raises:
            aetcd.ClientError: etcd refused or did not answer.
        """
        lease_id = self._election.lease_id
        if lease_id is None:
            return False  # not campaigning yet: nothing to hang the record on
        value = records_pb2.MemberRecord(
            member_id=self._member_id,
            address=self._address,
            metrics_address=self._metrics_address,
            lease_id=lease_id,
            version=self._version,
            started_at_unix_ms=self._started_ms,
        ).SerializeToString()
        if value == self._written:
            stored = await self._client.get(self._key)
            if stored is not None and bytes(stored.value) == value:
                return False
        await self._client.put(self._key, value, lease=lease_id)
        _log.info("member record of %s written under lease %x", self._member_id, lease_id)
        self._written = value
        return True

    async def withdraw(self) -> None:
        """Delete the record at once (a clean stop); best effort."""
        try:
            await self._client.delete(self._key)
        except (aetcd.ClientError, OSError) as exc:
            _log.warning("member record of %s not deleted: %s", self._member_id, exc)


async def list_members(
    client: aetcd.Client, cluster: str, election_prefix: str
) -> list[records_pb2.MemberRecord]:
    """Every replica that campaigns, leader first, then by candidacy revision.

    The leader is the record whose lease backs the election key with the
    lowest create revision (etcd's recipe). Role and candidacy revision are
    filled from the election at this read, never stale.

    Raises:
        aetcd.ClientError: etcd refused or did not answer (UNAVAILABLE).
    """
    candidates = {}
    for kv in await client.get_prefix(
        (election_prefix + "/").encode(), sort_order="ascend", sort_target="create"
    ):
        candidates[int(kv.lease)] = int(kv.create_revision)
    leader_lease = min(candidates, key=lambda lease: candidates[lease], default=None)
    out: list[records_pb2.MemberRecord] = []
    for kv in await client.get_prefix(members_prefix(cluster)):
        try:
            record = records_pb2.MemberRecord.FromString(bytes(kv.value))
        except DecodeError as exc:
            _log.error("member record %r unreadable: %s", bytes(kv.key), exc)
            continue
        if record.lease_id not in candidates:
            continue  # its candidacy is gone (resigned and not campaigning again yet)
        record.candidacy_revision = candidates[record.lease_id]
        record.role = (
            records_pb2.MEMBER_ROLE_LEADER
            if record.lease_id == leader_lease
            else records_pb2.MEMBER_ROLE_FOLLOWER
        )
        out.append(record)
    out.sort(key=lambda r: (r.role != records_pb2.MEMBER_ROLE_LEADER, r.candidacy_revision))
    return out
