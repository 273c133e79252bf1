"""``json_log_entries``: the drill's and the benches' reader of the children's JSON logs."""

from __future__ import annotations

import json
from pathlib import Path

from lazarus_dev.devcluster import json_log_entries


def _line(ts: object, msg: str) -> str:
    return json.dumps({"ts": ts, "level": "INFO", "msg": msg})


def test_entries_in_the_window_that_carry_the_needle_and_nothing_that_does_not_parse(
    tmp_path: Path,
) -> None:
    a, b = tmp_path / "coordinator-0.log", tmp_path / "coordinator-1.log"
    a.write_text(
        "\n".join(
            [
                _line(10.0, "leading: term=2"),
                "Traceback (most recent call last):",
                _line(20.5, "leading: term=3"),
                _line("21", "leading: term=4"),  # ts not a number
                '{"ts": 22.0, "msg": "leading: term=5"',  # half-written last line
            ]
        )
    )
    b.write_text(_line(30, "leading: term=6") + "\n" + _line(31.0, "forwarding Sessions") + "\n")
    missing = tmp_path / "never-started.log"

    got = list(json_log_entries([a, missing, b], since=20.0, until=30.0, needle="leading"))

    assert [(ts, entry["msg"], path.name) for ts, entry, path in got] == [
        (20.5, "leading: term=3", "coordinator-0.log"),
        (30.0, "leading: term=6", "coordinator-1.log"),
    ]
    assert all(isinstance(ts, float) for ts, _, _ in got)
    assert len(list(json_log_entries([a, b]))) == 4  # no window, no needle
