"""``lazarus coordinator --fan-in``: the fan-in timing profile and its settings check.

``run_coordinator`` is replaced by a recorder: these tests read what the CLI
would run with, not a running replica (``tests/integration/test_fanin.py``
runs real ones).
"""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

import coordinator.main
from lazarus.cli import app


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def record(settings: Any, core_settings: Any, **kwargs: Any) -> int:
        seen["settings"] = settings
        seen["core"] = core_settings
        return 0

    monkeypatch.setattr(coordinator.main, "run_coordinator", record)
    return seen


def _run(*args: str) -> Any:
    return CliRunner().invoke(app, ["coordinator", "--auth", "none", *args], env={})


def test_fan_in_moves_fence_and_dead_defaults_to_its_profile(ran: dict[str, Any]) -> None:
    result = _run("--fan-in")
    assert result.exit_code == 0, result.output
    assert ran["settings"].fan_in
    assert (ran["core"].fence_after_s, ran["core"].dead_after_s) == (5.0, 6.0)


def test_without_fan_in_the_design_defaults_stay(ran: dict[str, Any]) -> None:
    result = _run()
    assert result.exit_code == 0, result.output
    assert not ran["settings"].fan_in
    assert (ran["core"].fence_after_s, ran["core"].dead_after_s) == (2.0, 3.0)


def test_fan_in_keeps_timings_given_explicitly(ran: dict[str, Any]) -> None:
    result = _run("--fan-in", "--fence-after-s", "3.5", "--dead-after-s", "4.5")
    assert result.exit_code == 0, result.output
    assert (ran["core"].fence_after_s, ran["core"].dead_after_s) == (3.5, 4.5)


def test_fan_in_refuses_timings_that_break_its_safety_inequality(ran: dict[str, Any]) -> None:
    # h + f = 4.5 against D = 4.55: CoreSettings accepts it, but with 1 % clock
    # drift a follower's ack could outlive a verdict (I1 in docs/fan-in.md).
    result = _run("--fan-in", "--fence-after-s", "4", "--dead-after-s", "4.55")
    assert result.exit_code == 2
    assert "I1" in result.output
    assert "settings" not in ran
