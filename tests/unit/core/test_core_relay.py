"""``SessionRelay``: the follower's relay decisions for the Sessions it carries (issue 20).

The shell (``coordinator/forwarding.py``) only carries these out; the integration
tests (``tests/integration/test_fanin.py``) show the whole on real processes.
"""

from __future__ import annotations

import itertools
import random

import pytest

from coordinator.core.errors import UsageError
from coordinator.core.relay import (
    UNAVAILABLE,
    Carry,
    LinkChoice,
    LinkPolicy,
    RelaySettings,
    Route,
    SessionRelay,
    digest_eligible,
    leader_end_detaches,
    link_accepted,
    link_led,
    link_outdated,
    newest_leader,
)


def _relay(rate: float = 10.0, timeout: float = 5.0) -> SessionRelay[str]:
    return SessionRelay(RelaySettings(reattach_rate_per_s=rate, reattach_hello_timeout_s=timeout))


def test_an_attached_session_forwards_and_a_detached_one_drops() -> None:
    relay = _relay()
    relay.held("a")
    assert relay.route("a", hello=False, link_open=True, attached=True) is Route.FORWARD
    # Attached to a link that has not opened its forwarded Session: nothing to reach.
    assert relay.route("a", hello=False, link_open=True, attached=False) is Route.DROP
    relay.detach("a")
    assert relay.state("a") is Carry.DETACHED
    assert relay.route("a", hello=True, link_open=True, attached=True) is Route.DROP
    assert relay.pending


def test_after_a_reattach_only_the_hello_opens_a_session_on_the_new_link() -> None:
    relay = _relay()
    relay.held("a")
    relay.detach("a")
    assert relay.reattach(1.0) == ["a"]
    assert relay.state("a") is Carry.AWAITING_HELLO
    # Whatever the agent sent before its new Hello is dropped.
    assert relay.route("a", hello=False, link_open=True, attached=False) is Route.DROP
    assert relay.route("a", hello=True, link_open=True, attached=False) is Route.OPEN
    assert relay.state("a") is Carry.ATTACHED
    assert not relay.pending


def test_a_hello_after_the_new_link_broke_detaches_again() -> None:
    relay = _relay()
    relay.held("a")
    relay.detach("a")
    relay.reattach(1.0)
    assert relay.route("a", hello=True, link_open=False, attached=False) is Route.DETACH
    assert relay.state("a") is Carry.DETACHED
    assert relay.detached == 1


def test_reattaches_are_paced_at_the_rate_in_detach_order() -> None:
    relay = _relay(rate=10.0)  # one per 0.1 s
    for key in "abcde":
        relay.held(key)
        relay.detach(key)
    sent: list[tuple[float, str]] = []
    now = 0.0
    while relay.detached:
        sent += [(now, key) for key in relay.reattach(now)]
        now = round(now + 0.01, 6)
    assert [key for _, key in sent] == list("abcde")
    times = [t for t, _ in sent]
    assert all(b - a >= 0.1 - 1e-9 for a, b in itertools.pairwise(times))
    assert times[0] == 0.0
    assert times[-1] < 0.45  # four intervals, give or take a poll of the 10 ms loop


def test_the_agent_acked_longest_ago_is_reattached_first() -> None:
    relay = _relay(rate=1000.0)
    acked = {"a": 5.0, "b": 4.2, "c": None, "d": 4.8, "e": 4.2, "f": None}
    for key, at in acked.items():
        relay.held(key)
        relay.detach(key, at)
    order: list[str] = []
    now = 10.0
    while relay.detached:
        order += relay.reattach(now)
        now += 0.001
    # Earliest acked first (its fence is nearest), ties and never-acked in detach order.
    assert order == ["b", "e", "d", "a", "c", "f"]


def _deferring(rate: float = 10.0) -> SessionRelay[str]:
    # An agent runs 5 s after its acked heartbeat arrived; Reattach 2 s before.
    return SessionRelay(
        RelaySettings(reattach_rate_per_s=rate, fence_after_ack_s=5.0, reattach_lead_s=2.0)
    )


def test_a_session_whose_fence_an_interregnum_ack_moved_waits_behind_the_others() -> None:
    relay = _deferring(rate=10.0)  # one per 0.1 s
    for key, at, deferrable in [("x", 10.0, True), ("y", 10.0, True), ("a", 7.0, False)]:
        relay.held(key)
        relay.detach(key, at, deferrable=deferrable)
    relay.held("n")
    relay.detach("n")  # never acked
    sent: dict[str, float] = {}
    now = 8.0
    while relay.detached:
        for key in relay.reattach(now):
            sent[key] = now
        now = round(now + 0.01, 6)
    # The urgent and the never-acked at once (paced); the deferred by their
    # fence (15.0) less the lead (2 s) less the queue at the rate (2 x 0.1 s).
    assert sent["a"] == 8.0
    assert sent["n"] == pytest.approx(8.1)
    assert 12.8 - 1e-9 <= sent["x"] <= 12.81
    assert sent["y"] >= sent["x"] + 0.1 - 1e-9
    assert sent["y"] <= 15.0 - 2.0  # each still starts its lead before its fence


def test_the_reattach_loop_is_told_when_a_deferred_session_is_due() -> None:
    relay = _deferring(rate=10.0)
    relay.held("x")
    relay.detach("x", 10.0, deferrable=True)
    assert relay.reattach(11.0) == []
    assert relay.next_reattach_s() == pytest.approx(15.0 - 2.0 - 0.1)
    assert relay.reattach(12.89) == []
    assert relay.reattach(12.9) == ["x"]


def test_an_ack_from_the_leader_makes_a_session_urgent_again() -> None:
    relay = _deferring()
    relay.held("x")
    relay.detach("x", 10.0, deferrable=True)
    assert relay.reattach(11.0) == []
    relay.detach("x", 10.5)  # detached again, by a leader's ack time: not deferrable
    assert relay.reattach(11.0) == ["x"]


def test_without_a_known_fence_nothing_is_deferred() -> None:
    relay = _relay(rate=10.0)
    relay.held("x")
    relay.detach("x", 10.0, deferrable=True)
    assert relay.reattach(10.0) == ["x"]


@pytest.mark.parametrize("seed", range(20))
def test_reattach_order_meets_every_fence_that_any_order_meets(seed: int) -> None:
    """Jackson's rule: if some order of the paced Reattaches reaches every agent
    before its fence, the relay's order does too (checked against all 5,040 orders)."""
    rng = random.Random(seed)
    rate, fence_s, start = 100.0, 0.3, 10.0
    acked = {f"n{i}": rng.uniform(9.75, 10.0) for i in range(7)}
    relay = _relay(rate=rate)
    for key, at in acked.items():
        relay.held(key)
        relay.detach(key, at)
    order: list[str] = []
    now = start
    while relay.detached:
        order += relay.reattach(now)
        now += 1.0 / rate
    lateness = [start + k / rate - (acked[key] + fence_s) for k, key in enumerate(order)]
    best = min(
        max(start + k / rate - (acked[key] + fence_s) for k, key in enumerate(perm))
        for perm in itertools.permutations(acked)
    )
    assert max(lateness) <= best + 1e-9


def test_a_session_detached_again_is_queued_by_its_new_ack_time() -> None:
    relay = _relay(rate=1000.0)
    for key, at in (("a", 1.0), ("b", 2.0)):
        relay.held(key)
        relay.detach(key, at)
    relay.held("a")  # attached again (a Hello opened it), then acked later and detached
    relay.detach("a", 3.0)
    relay.released("b")
    assert relay.reattach(10.0) == ["a"]
    assert relay.detached == 0


def test_an_idle_relay_does_not_save_up_a_burst() -> None:
    relay = _relay(rate=10.0)
    relay.held("a")
    relay.detach("a")
    assert relay.reattach(0.0) == ["a"]
    for key in "bcd":
        relay.held(key)
        relay.detach(key)
    # Long after the last Reattach: one now, the next only an interval later.
    assert relay.reattach(100.0) == ["b"]
    assert relay.reattach(100.05) == []
    assert relay.reattach(100.1) == ["c"]


def test_an_agent_silent_after_its_reattach_is_ended_after_the_timeout() -> None:
    relay = _relay(timeout=5.0)
    relay.held("a")
    relay.held("b")
    relay.detach("a")
    relay.detach("b")
    relay.reattach(0.0)
    relay.reattach(0.1)
    assert relay.expired(5.0) == []
    assert relay.expired(5.05) == ["a"]
    assert relay.state("a") is None
    assert relay.route("b", hello=True, link_open=True, attached=False) is Route.OPEN
    assert relay.expired(100.0) == []  # b answered in time


def test_a_released_or_unknown_session_is_never_detached_or_reattached() -> None:
    relay = _relay()
    relay.detach("ghost")
    relay.held("a")
    relay.released("a")
    relay.detach("a")
    assert relay.reattach(0.0) == []
    assert not relay.pending


def test_only_unavailable_from_the_leader_detaches() -> None:
    assert leader_end_detaches(UNAVAILABLE)
    for code in (0, 1, 3, 8, 9, 13, 16):  # OK, CANCELLED, INVALID_ARGUMENT, ...
        assert not leader_end_detaches(code)


def test_a_heartbeat_joins_the_digest_only_when_it_cannot_reorder_its_session() -> None:
    assert digest_eligible(0, hello_stepped=True, closed=False)
    assert not digest_eligible(1, hello_stepped=True, closed=False)  # an older message waits
    assert not digest_eligible(0, hello_stepped=False, closed=False)  # its Hello is not stepped
    assert not digest_eligible(0, hello_stepped=True, closed=True)


def _choose(
    policy: LinkPolicy, leader: str, term: int = 3, *, now_s: float = 10.0, **kw: bool
) -> LinkChoice:
    flags = {"leading": False, "to_self": False} | kw
    return policy.choose(leader, term, "me:1", now_s=now_s, **flags)


def test_the_link_policy_dials_the_leader_the_election_names() -> None:
    policy = LinkPolicy()
    assert _choose(policy, "other:1") is LinkChoice.DIAL
    assert _choose(policy, "") is LinkChoice.NO_LEADER


def test_a_leader_whose_link_just_broke_is_not_redialled_until_the_hold_off_passes() -> None:
    policy = LinkPolicy(RelaySettings(failed_leader_hold_off_s=1.0))
    policy.failed("old:1", 3, now_s=10.0)
    assert _choose(policy, "old:1", 3, now_s=10.0) is LinkChoice.HOLD_OFF
    assert _choose(policy, "old:1", 3, now_s=10.99) is LinkChoice.HOLD_OFF
    assert _choose(policy, "old:1", 3, now_s=11.0) is LinkChoice.DIAL
    # The election moved on (a new term, or another leader): dial at once.
    assert _choose(policy, "old:1", 4, now_s=10.1) is LinkChoice.DIAL
    assert _choose(policy, "new:1", 3, now_s=10.1) is LinkChoice.DIAL


def test_a_leader_that_never_accepted_the_link_is_asked_again_soon() -> None:
    policy = LinkPolicy(RelaySettings(failed_leader_hold_off_s=1.0, refused_retry_s=0.2))
    # Named by the election, still taking over: it refused the stream.
    policy.failed("new:1", 4, now_s=10.0, accepted=False)
    assert _choose(policy, "new:1", 4, now_s=10.1) is LinkChoice.RETRY_SOON
    assert _choose(policy, "new:1", 4, now_s=10.2) is LinkChoice.DIAL
    # It led, then its link broke: the full hold-off.
    policy.failed("new:1", 4, now_s=20.0, accepted=True)
    assert _choose(policy, "new:1", 4, now_s=20.5) is LinkChoice.HOLD_OFF
    assert _choose(policy, "new:1", 4, now_s=21.0) is LinkChoice.DIAL


def test_a_leader_that_led_and_then_does_not_answer_a_redial_is_held_off_in_full() -> None:
    policy = LinkPolicy(RelaySettings(failed_leader_hold_off_s=1.0, refused_retry_s=0.2))
    policy.failed("old:1", 3, now_s=10.0, accepted=True)  # it led; its link broke
    # After the hold-off, the redial does not connect: crashed, its key outlives it.
    policy.failed("old:1", 3, now_s=11.5, accepted=False)
    assert _choose(policy, "old:1", 3, now_s=11.8) is LinkChoice.HOLD_OFF  # not RETRY_SOON
    assert _choose(policy, "old:1", 3, now_s=12.49) is LinkChoice.HOLD_OFF
    assert _choose(policy, "old:1", 3, now_s=12.5) is LinkChoice.DIAL
    policy.failed("old:1", 3, now_s=13.0, accepted=False)  # and again: still in full
    assert _choose(policy, "old:1", 3, now_s=13.5) is LinkChoice.HOLD_OFF
    # The next leader, still taking over, is asked again soon; the election moved on.
    policy.failed("new:1", 4, now_s=14.0, accepted=False)
    assert _choose(policy, "new:1", 4, now_s=14.2) is LinkChoice.DIAL
    # The same address in a new term never led in that term: soon.
    policy.failed("old:1", 5, now_s=20.0, accepted=False)
    assert _choose(policy, "old:1", 5, now_s=20.2) is LinkChoice.DIAL


def test_only_a_leader_that_led_on_the_last_failed_link_counts_as_gone() -> None:
    policy = LinkPolicy()
    assert not policy.went("old:1", 3)  # nothing failed yet
    policy.failed("old:1", 3, now_s=10.0, accepted=True)
    assert policy.went("old:1", 3)
    assert policy.went("old:1", 3)  # whatever the time: until another failure
    assert not policy.went("old:1", 4)
    assert not policy.went("new:1", 3)
    policy.failed("new:1", 4, now_s=11.0, accepted=False)  # refused: taking over
    assert not policy.went("new:1", 4)


def test_a_new_session_waits_long_before_the_first_link_briefly_after_not_on_a_gone_one() -> None:
    settings = RelaySettings(new_session_wait_s=0.25, first_link_wait_s=2.5)
    policy = LinkPolicy(settings)
    # Start-up: the leader is alive, only this host may be slow; NotLeader would
    # send the agent on to the leader (CI at 02fd09a: 20 agents there, not 10).
    assert policy.session_wait_s(None) == 2.5
    assert policy.session_wait_s(("leader:1", 3)) == 2.5
    policy.linked()
    policy.failed("leader:1", 3, now_s=10.0, accepted=True)  # it led, then went
    assert policy.session_wait_s(("leader:1", 3)) == 0.0  # its redial: not waited for
    assert policy.session_wait_s(("next:1", 4)) == 0.25  # a leader change: briefly
    assert policy.session_wait_s(None) == 0.25
    # A link that broke was a link: a refusal was not.
    fresh = LinkPolicy(settings)
    fresh.failed("leader:1", 3, now_s=10.0, accepted=False)
    assert fresh.session_wait_s(("leader:1", 3)) == 2.5
    fresh.failed("leader:1", 3, now_s=10.0, accepted=True)
    assert fresh.session_wait_s(("next:1", 4)) == 0.25


def test_before_the_first_link_a_new_session_tries_again_while_the_leader_is_not_ready() -> None:
    settings = RelaySettings(refused_retry_s=0.2, first_link_wait_s=2.5)
    policy = LinkPolicy(settings)
    # Named, but refused or did not answer (taking over, a loaded host): again in 0.2 s.
    assert policy.retry_new_session_s(LinkChoice.RETRY_SOON, 0.0) == 0.2
    assert policy.retry_new_session_s(LinkChoice.RETRY_SOON, 2.29) == 0.2
    assert policy.retry_new_session_s(LinkChoice.RETRY_SOON, 2.31) is None  # past 2.5 s
    # Nobody named, or this replica: nothing to wait for.
    assert policy.retry_new_session_s(LinkChoice.NO_LEADER, 0.0) is None
    assert policy.retry_new_session_s(LinkChoice.OWN, 0.0) is None
    # Once linked, a leader change: the agent is sent away at once.
    policy.linked()
    assert policy.retry_new_session_s(LinkChoice.RETRY_SOON, 0.0) is None


def test_a_replica_links_to_itself_only_to_carry_its_sessions_while_it_leads() -> None:
    policy = LinkPolicy()
    assert _choose(policy, "me:1") is LinkChoice.OWN  # a new Session: served here directly
    assert _choose(policy, "me:1", to_self=True) is LinkChoice.OWN  # named, not leading yet
    assert _choose(policy, "me:1", leading=True) is LinkChoice.OWN
    assert _choose(policy, "me:1", leading=True, to_self=True) is LinkChoice.DIAL


def test_a_link_accepted_by_silence_led_only_if_the_leader_replied_on_it() -> None:
    assert link_led(True, replied=False)  # its word
    assert link_led(None, replied=True)  # an earlier release's leader that replied
    assert not link_led(None, replied=False)  # silent, then refused: still taking over
    assert not link_led(False, replied=False)


def test_a_late_election_read_gives_way_to_the_newer_leader_the_watch_showed() -> None:
    old, new = ("old:1", 3), ("new:1", 5)
    assert newest_leader(old, new) == new  # the read was sent before the old key went
    assert newest_leader(new, old) == new  # the watch lags the read
    assert newest_leader(new, None) == new  # no watch event yet
    assert newest_leader(None, old) is None  # nobody campaigns: the watch cannot contradict


def test_an_open_link_is_outdated_by_any_change_of_leader_address_or_term() -> None:
    assert not link_outdated("a:1", 3, "a:1", 3)
    assert link_outdated("a:1", 3, "a:1", 4)
    assert link_outdated("a:1", 3, "b:1", 3)
    assert link_outdated("a:1", 3, "", 3)  # the election shows no leader


@pytest.mark.parametrize(
    "field",
    [
        "reattach_rate_per_s",
        "reattach_hello_timeout_s",
        "failed_leader_hold_off_s",
        "refused_retry_s",
        "new_session_wait_s",
        "first_link_wait_s",
    ],
)
def test_settings_refuse_non_positive_values(field: str) -> None:
    with pytest.raises(UsageError, match=field):
        RelaySettings(**{field: 0.0})


def test_a_link_counts_as_accepted_on_the_leaders_word_or_when_it_stays_open() -> None:
    assert link_accepted(True, ended=False)
    assert not link_accepted(False, ended=True)  # metadata, then the refusal
    assert not link_accepted(None, ended=True)  # ended before any answer
    # An earlier release's leader: no word, the stream still open at the deadline.
    assert link_accepted(False, ended=False)
    assert link_accepted(None, ended=False)
