"""A fork's LineageReport fits a Session message however large its checkpoints.

Chaos seed 20 found the leader ending every Session of one agent with
RESOURCE_EXHAUSTED (5.5 MB against gRPC's 4 MiB): the agent sent the fork's
payloads on the wire and re-sent them after every Welcome, so it never held a
Session again and its tasks stalled.
"""

from __future__ import annotations

from coordinator import convert
from lazarus.v1 import agent_pb2
from node_agent.agent import lineage_wire_report

GRPC_DEFAULT_MAX_RECEIVE_BYTES = 4 * 1024 * 1024


def _full_report(checkpoints: int, checkpoint_bytes: int, events: int) -> agent_pb2.LineageReport:
    report = agent_pb2.LineageReport(
        fork_id="t~e3~agent-1~abcd1234", task_id="t", epoch=3, chunk_index=0, last=True
    )
    for seq in range(1, checkpoints + 1):
        report.checkpoints.add(
            task_id="t",
            epoch=3,
            seq=seq,
            checkpoint_ref=f"t/{seq}",
            payload=b"x" * checkpoint_bytes,
        )
    for seq in range(1, events + 1):
        report.journal_events.add(task_id="t", epoch=3, seq=100 + seq, payload=b"e" * 1024)
    return report


def test_the_wire_report_stays_under_the_grpc_limit() -> None:
    full = _full_report(64, 128 * 1024, 4096)
    assert full.ByteSize() > GRPC_DEFAULT_MAX_RECEIVE_BYTES  # what used to be sent
    wire = lineage_wire_report(full)
    assert wire.ByteSize() < GRPC_DEFAULT_MAX_RECEIVE_BYTES // 4
    # The full report (for Redis) is left as it was.
    assert full.checkpoints[0].payload == b"x" * 128 * 1024


def test_the_coordinator_reads_the_same_conflict_from_both() -> None:
    full = _full_report(10, 1024, 50)
    from_full = convert.lineage_report_to_event("s", "agent-1", full, 0.0)
    from_wire = convert.lineage_report_to_event("s", "agent-1", lineage_wire_report(full), 0.0)
    assert from_wire == from_full
    assert from_wire.divergent_checkpoints == 10
    assert (from_wire.first_journal_seq, from_wire.last_journal_seq) == (101, 150)
