"""``free_loopback_ports``: distinct, bindable, and out of the way of outgoing connections."""

from __future__ import annotations

import socket

import pytest

from lazarus_dev import localservers
from lazarus_dev.localservers import LOOPBACK_HOST, free_loopback_ports


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    low, _ = localservers._ephemeral_port_range()
    ports = free_loopback_ports(20)
    assert len(set(ports)) == 20
    assert all(localservers._PICK_LOW <= p < low for p in ports), ports
    for port in ports:  # free right now: a server can bind each
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((LOOPBACK_HOST, port))


def test_a_port_in_use_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind((LOOPBACK_HOST, 0))
        taken = busy.getsockname()[1]
        # Make the random draw hit the busy port first, then any other.
        draws = iter([taken, taken])

        class _Rng:
            def randrange(self, a: int, b: int) -> int:
                return next(draws, a + 7)

        monkeypatch.setattr(localservers.random, "SystemRandom", _Rng)
        monkeypatch.setattr(localservers, "_ephemeral_port_range", lambda: (taken + 2000, 60999))
        monkeypatch.setattr(localservers, "_PICK_LOW", taken - 10)
        (port,) = free_loopback_ports(1)
        assert port != taken


def test_without_room_below_the_ephemeral_range_the_kernel_picks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(localservers, "_ephemeral_port_range", lambda: (15100, 60999))
    ports = free_loopback_ports(3)
    assert len(set(ports)) == 3
    assert all(p >= 1024 for p in ports)
