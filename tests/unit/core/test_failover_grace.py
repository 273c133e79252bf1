"""Issue 16 item 9: a leader change produces no false DEAD verdict.

A new leader gives every node it loaded ``failover_reconnect_s`` beyond
``dead_after_s`` to find it: an agent may have waited out a whole RPC
timeout on a frozen old leader, then its reconnect backoff. Only a node still
silent after that is DEAD.
"""

from __future__ import annotations

from core_harness import Harness, notices_of

from coordinator.core import CoreSettings, NodeRecord
from coordinator.core import notices as n


def test_nodes_get_a_fair_chance_to_find_a_new_leader() -> None:
    settings = CoreSettings(self_check=True, failover_reconnect_s=7.0)
    nodes = [NodeRecord(name, f"{name}#1") for name in ("gone", "quick", "slow")]
    h = Harness(settings, now_s=100.0)
    h.lead(term=2, nodes=nodes)
    h.hello("quick")
    # "slow" hung 5 s on the frozen old leader, then backed off: back 6.5 s later.
    early = h.run_until(106.5, heartbeating=["quick"])
    assert notices_of(early, n.NodeDead) == []
    h.hello("slow")
    before = h.run_until(109.8, heartbeating=["quick", "slow"])
    assert notices_of(before, n.NodeDead) == []
    # Silent for failover_reconnect_s + dead_after_s: only now is "gone" DEAD.
    after = h.run_until(110.5, heartbeating=["quick", "slow"])
    assert [d.node_id for d in notices_of(after, n.NodeDead)] == ["gone"]
