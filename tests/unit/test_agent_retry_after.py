"""Issue 16 items 2 and 9: a NotLeader's ``retry_after_ms`` reaches the agent's shell.

"No leader yet, retry in 200 ms" (a follower during the leaderless gap) and
"busy, come back in 1.5 s" (a leader deferring Hellos) close the Session with
that pause, which the session loop sleeps instead of growing its backoff.
"""

from __future__ import annotations

from test_agent_core import Driver

from node_agent.core import CloseSession
from node_agent.core import records as rec


def test_not_leader_without_a_leader_carries_the_retry_delay() -> None:
    d = Driver()
    d.hello()
    nl = rec.NotLeader(leader_address="", retry_after_ms=200)
    out = d.msg(nl)
    assert out == [CloseSession(out[0].reason, "", retry_after_s=0.2)]


def test_a_deferred_hello_names_the_same_leader_and_the_delay() -> None:
    d = Driver()
    d.hello()
    nl = rec.NotLeader(leader_id="c1", leader_address="10.0.0.1:7000", retry_after_ms=1500)
    out = d.msg(nl)
    assert len(out) == 1
    assert isinstance(out[0], CloseSession)
    assert (out[0].redirect, out[0].retry_after_s) == ("10.0.0.1:7000", 1.5)
