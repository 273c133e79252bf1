"""Pure helpers of the election and the fenced store: key naming, batching, errors."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.election import (
    Fence,
    Leader,
    LeadershipLost,
    LossReason,
    NotLeader,
    election_key,
)
from coordinator.etcd_store import (
    MAX_TXN_BYTES,
    MAX_TXN_OPS,
    Collection,
    FencedWriteRejected,
    cluster_prefix,
    election_prefix,
    parse_record_key,
    plan_batches,
    record_key,
)

# ---------------------------------------------------------------- election keys


def test_election_key_is_prefix_slash_lowercase_hex_of_the_lease() -> None:
    # What Go's fmt.Sprintf("%s/%x", "/lazarus/c/election", 0x694D8A1B2C3D4E5F) prints.
    assert election_key("/lazarus/c/election", 0x694D8A1B2C3D4E5F) == (
        "/lazarus/c/election/694d8a1b2c3d4e5f"
    )
    assert election_key("e", 255) == "e/ff"
    assert election_key("e", -255) == "e/-ff"  # Go's %x of a negative int64


@given(st.integers(min_value=1, max_value=2**63 - 1))
def test_election_key_round_trips_the_lease_id(lease_id: int) -> None:
    key = election_key("/p", lease_id)
    assert key.startswith("/p/")
    assert int(key.rsplit("/", 1)[1], 16) == lease_id
    assert key == key.lower()


def test_election_prefix_sits_under_the_cluster_prefix() -> None:
    assert election_prefix("prod") == "/lazarus/prod/election"
    assert election_prefix("prod").encode().startswith(cluster_prefix("prod"))


def test_leader_from_kv_decodes_the_stored_fields() -> None:
    class KV:
        key = b"/e/1a"
        value = b"10.0.0.1:7000"
        create_revision = 42
        lease = 26

    assert Leader.from_kv(KV()) == Leader("/e/1a", "10.0.0.1:7000", 42, 26)


def test_errors_name_their_grpc_status() -> None:
    lost = LeadershipLost("/e/1a", 7, LossReason.KEY_DELETED, "gone")
    assert lost.grpc_code == "UNAVAILABLE"
    assert "term 7" in str(lost)
    assert "key_deleted" in str(lost)
    assert NotLeader.grpc_code == "FAILED_PRECONDITION"

    rejected = FencedWriteRejected(Fence(b"/e/1a", 7), committed_ops=128, current_create_revision=9)
    assert isinstance(rejected, LeadershipLost)
    assert rejected.reason is LossReason.FENCE_REJECTED
    assert rejected.grpc_code == "UNAVAILABLE"
    assert "create revision 9" in str(rejected)
    assert "128 operations" in str(rejected)


# ---------------------------------------------------------------- record keys


def test_record_keys_follow_the_layout() -> None:
    assert record_key("prod", Collection.NODES, "node-1") == b"/lazarus/prod/nodes/node-1"
    assert record_key("prod", Collection.TASKS, "t-9") == b"/lazarus/prod/tasks/t-9"
    assert record_key("prod", Collection.FORKS, "t-9/f-1") == b"/lazarus/prod/forks/t-9/f-1"


@pytest.mark.parametrize("cluster", ["", "a/b"])
def test_bad_cluster_names_are_refused(cluster: str) -> None:
    with pytest.raises(ValueError, match="cluster name"):
        cluster_prefix(cluster)


def test_empty_record_name_is_refused() -> None:
    with pytest.raises(ValueError, match="non-empty name"):
        record_key("prod", Collection.TASKS, "")


def test_parse_record_key_inverts_record_key_and_ignores_other_keys() -> None:
    prefix = cluster_prefix("prod")
    for collection in Collection:
        key = record_key("prod", collection, "x/y")
        assert parse_record_key(prefix, key) == (collection, "x/y")
    assert parse_record_key(prefix, b"/lazarus/prod/election/1a") is None
    assert parse_record_key(prefix, b"/lazarus/prod/tasks/") is None
    assert parse_record_key(prefix, b"/lazarus/prod/tasks") is None
    assert parse_record_key(prefix, b"/lazarus/prodx/tasks/t") is None
    assert parse_record_key(prefix, b"/other/tasks/t") is None


# ---------------------------------------------------------------- batching


def test_batches_split_at_max_txn_ops() -> None:
    assert MAX_TXN_OPS == 128
    batches = plan_batches([10] * 300)
    assert [len(b) for b in batches] == [128, 128, 44]
    assert [i for b in batches for i in b] == list(range(300))


def test_exactly_max_ops_is_one_transaction_and_nothing_is_no_transaction() -> None:
    assert plan_batches([1] * 128) == [range(0, 128)]
    assert plan_batches([1] * 129) == [range(0, 128), range(128, 129)]
    assert plan_batches([]) == []


def test_batches_split_on_bytes_and_an_oversized_op_travels_alone() -> None:
    big = MAX_TXN_BYTES // 2 + 1
    assert plan_batches([big, big, big]) == [range(0, 1), range(1, 2), range(2, 3)]
    assert plan_batches([5, MAX_TXN_BYTES + 1, 5]) == [range(0, 1), range(1, 2), range(2, 3)]
    assert plan_batches([4, 4, 4], max_bytes=8) == [range(0, 2), range(2, 3)]


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        plan_batches([1], max_ops=0)
    with pytest.raises(ValueError, match="positive"):
        plan_batches([1], max_bytes=0)


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=300), max_size=600),
    max_ops=st.integers(min_value=1, max_value=200),
    max_bytes=st.integers(min_value=1, max_value=5_000),
)
def test_batches_cover_every_op_in_order_within_limits(
    sizes: list[int], max_ops: int, max_bytes: int
) -> None:
    batches = plan_batches(sizes, max_ops=max_ops, max_bytes=max_bytes)
    assert [i for b in batches for i in b] == list(range(len(sizes)))
    for batch in batches:
        assert 1 <= len(batch) <= max_ops
        total = sum(sizes[i] for i in batch)
        assert total <= max_bytes or len(batch) == 1
    # Greedy: no batch could have taken the next batch's first op.
    for before, after in itertools.pairwise(batches):
        total = sum(sizes[i] for i in before) + sizes[after[0]]
        assert len(before) == max_ops or total > max_bytes
