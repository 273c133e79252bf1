"""A superseded owner's fork: which records it holds (``node_agent/core/lineage.py``) and
how ``AgentCore`` reports it until the leader acknowledges it."""

from __future__ import annotations

from test_agent_core import Driver, hb_ack_msg

from node_agent.core import Send
from node_agent.core import records as rec
from node_agent.core.lineage import (
    MAX_REPORT_CHECKPOINTS,
    MAX_REPORT_EVENTS,
    Resolution,
    adopted_cut,
    fork_base,
    fork_id,
    select_divergent,
)


def test_the_base_is_the_first_newer_epochs_claim() -> None:
    bases = {2: (10, 3), 5: (20, 7), 4: (15, 5)}
    assert fork_base(3, bases, (1, 1)) == (15, 5)  # epoch 4, the first above 3
    assert fork_base(1, bases, (1, 1)) == (10, 3)


def test_without_a_newer_claim_the_base_is_what_this_process_saw_acknowledged() -> None:
    assert fork_base(3, {1: (9, 9), 3: (9, 9)}, (4, 2)) == (4, 2)
    assert fork_base(3, None, (4, 2)) == (4, 2)  # Redis could not be read


def test_an_adopt_cuts_the_held_lineage_at_the_first_newer_claims_base() -> None:
    bases = {2: (10, 3), 5: (20, 7), 4: (15, 5)}
    assert adopted_cut(3, bases) == (15, 5)  # held at 3: epoch 4 left it at its base
    assert adopted_cut(1, bases) == (10, 3)
    assert adopted_cut(5, bases) is None  # re-attach at the held epoch: nothing known above
    assert adopted_cut(3, {}) is None
    assert adopted_cut(3, None) is None


def test_divergent_records_are_above_the_base_and_not_of_a_later_epoch() -> None:
    fork = select_divergent(
        3,
        (5, 2),
        checkpoints=[(1, 1), (2, 2), (3, 3), (4, 4)],
        events=[(5, 2), (6, 3), (7, 3), (8, 4)],
    )
    assert fork.checkpoints == ((3, 3),)
    assert fork.events == ((6, 3), (7, 3))
    assert fork.resolution is Resolution.KEPT
    assert not fork.empty


def test_nothing_beyond_the_base_is_no_fork() -> None:
    assert select_divergent(3, (9, 9), [(1, 3)], [(2, 3)]).empty


def test_a_report_carries_only_the_newest_records_and_counts_them_all() -> None:
    ckpts = [(s, 1) for s in range(1, MAX_REPORT_CHECKPOINTS + 11)]
    events = [(s, 1) for s in range(1, MAX_REPORT_EVENTS + 6)]
    fork = select_divergent(1, (0, 0), ckpts, events, crdt=True)
    assert len(fork.checkpoints) == MAX_REPORT_CHECKPOINTS + 10
    assert fork.reported_checkpoints == tuple(ckpts[-MAX_REPORT_CHECKPOINTS:])
    assert fork.reported_events == tuple(events[-MAX_REPORT_EVENTS:])
    assert fork.resolution is Resolution.MERGED


def test_fork_ids_name_task_epoch_node_and_incarnation() -> None:
    assert fork_id("t1", 3, "node-a", "0123456789abcdef") == "t1~e3~node-a~01234567"


def _report(fid: str = "t1~e1~n~i") -> rec.LineageReport:
    return rec.LineageReport(fid, "t1", 1, wire=b"\x0a\x01x")


def test_a_fork_is_sent_at_once_and_again_after_every_welcome_until_acked() -> None:
    d = Driver()
    d.ack_all(d.connect())
    report = _report()
    assert d.core.lineage_ready(report) == [Send(report)]
    d.core.on_session_closed(0.1, "EOF")
    out = d.msg(hb_ack_msg(1))  # nothing on a closed Session
    assert out == []
    out = d.at(0.2).connect()
    assert [c.message for c in out if isinstance(c, Send)].count(report) == 1
    out = d.msg(rec.LineageAck(report.fork_id, "t1", 1))
    assert [n.kind for n in out] == ["fork_recorded"]
    assert d.core.pending_forks == []
    out = d.at(0.3).connect()
    assert report not in [c.message for c in out if isinstance(c, Send)]
    assert d.msg(rec.LineageAck(report.fork_id, "t1", 1)) == []  # a duplicate ack: nothing


def test_a_fork_kept_while_no_session_is_open_waits_for_the_welcome() -> None:
    d = Driver()
    report = _report("t9~e2~n~i")
    assert d.core.lineage_ready(report) == []
    assert d.core.pending_forks == [report.fork_id]
    out = d.connect()
    assert report in [c.message for c in out if isinstance(c, Send)]
