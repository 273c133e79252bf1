"""The drill report's parsers read what the processes really write."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lazarus_dev.drill import (
    _RECONCILED,
    DrillResult,
    expected_documents,
    parse_reconcile_seconds,
)

REPO = Path(__file__).resolve().parents[2]


def _coordinator_reconcile_format() -> str:
    """The format string coordinator/documents.py logs a finished reconcile session with."""
    source = (REPO / "coordinator" / "documents.py").read_text()
    m = re.search(r'"(reconcile %s completed:[^"]*)"', source)
    assert m, "coordinator/documents.py no longer logs 'reconcile %s completed: ...'"
    return m.group(1)


def test_the_reconcile_column_parses_the_coordinators_real_log_line() -> None:
    line = _coordinator_reconcile_format() % ("rs-7", True, 4, 12, 0, 0.4321)
    m = _RECONCILED.search(line)
    assert m is not None, line
    sessions = [(100.0, m.group(1), m.group(2) == "True", float(m.group(3)))]
    assert parse_reconcile_seconds(sessions, heal_at=99.0) == 0.432
    assert parse_reconcile_seconds(sessions, heal_at=101.0) is None  # before the heal


def test_partition_heal_fails_when_reconcile_s_is_n_a() -> None:
    r = DrillResult(scenario="partition-heal", fault="cut", tasks=4)
    r.effects_checked, r.effect_records, r.shared_ops = True, 10, 40
    assert not r.held  # reconcile s is n/a: the drill must fail
    r.reconcile_convergence_s = 0.2
    assert r.held


def test_a_side_effect_violation_or_an_empty_log_fails_the_drill() -> None:
    r = DrillResult(scenario="kill-node", fault="kill", tasks=4, effects_checked=True)
    assert not r.held  # nothing logged: nothing proven
    r.effect_records = 100
    assert r.held
    r.dup_exec = 1
    assert not r.held
    r.dup_exec, r.stale_steps = 0, 1
    assert not r.held


def test_duplicate_identity_not_refused_fails() -> None:
    r = DrillResult(scenario="duplicate-identity", fault="dup", tasks=4)
    r.identity_refused = False
    assert not r.held


def test_expected_documents_from_acknowledged_operations() -> None:
    acked = [
        {"doc": "shared/c", "kind": "pn-counter", "arg": 2, "replica": "a~1", "seq": 1},
        {"doc": "shared/c", "kind": "pn-counter", "arg": 3, "replica": "b~1", "seq": 1},
        {"doc": "shared/s", "kind": "or-set", "arg": "x", "replica": "a~1", "seq": 2},
        {
            "doc": "shared/m",
            "kind": "lww-map",
            "arg": ["k", "old"],
            "at": [5, 0],
            "replica": "a~1",
            "seq": 3,
        },
        {
            "doc": "shared/m",
            "kind": "lww-map",
            "arg": ["k", "new"],
            "at": [6, 0],
            "replica": "b~1",
            "seq": 2,
        },
        {"doc": "shared/l", "kind": "rga-log", "arg": "b", "replica": "b~1", "seq": 3},
        {"doc": "shared/l", "kind": "rga-log", "arg": "a", "replica": "a~1", "seq": 4},
    ]
    assert expected_documents(acked) == {
        "shared/c": 5,
        "shared/l": ["a", "b"],
        "shared/m": {"k": "new"},
        "shared/s": ["x"],
    }


def test_the_self_fence_hook_is_off_unless_set_to_exactly_1(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from node_agent.agent import UNSAFE_DISABLE_SELF_FENCE_ENV, _unsafe_disable_self_fence

    monkeypatch.delenv(UNSAFE_DISABLE_SELF_FENCE_ENV, raising=False)
    assert _unsafe_disable_self_fence() is False
    monkeypatch.setenv(UNSAFE_DISABLE_SELF_FENCE_ENV, "true")
    with pytest.raises(ValueError, match="refused"):
        _unsafe_disable_self_fence()
    monkeypatch.setenv(UNSAFE_DISABLE_SELF_FENCE_ENV, "1")
    assert _unsafe_disable_self_fence() is True
