"""A short seeded chaos drill holds every invariant; the partition drill fails without the fence.

The second test is the drills' mutation check: with the agents' self-fence
turned off (``LAZARUS_UNSAFE_DISABLE_SELF_FENCE=1``, honoured by the agent only
with that exact value) the cut-off agent keeps running tasks the leader moved,
and the drill must see it in the side-effect log and fail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lazarus_dev.chaos import make_schedule, schedule_lines

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

LAZARUS = Path(sys.executable).parent / "lazarus"

CHAOS_SEED = 1
"""The fixed seed: its 30 s schedule cuts an agent off, kills agents, the leader and Redis."""

CHAOS_S = 30.0


SETTLE_S = 90.0
"""How long the drill waits for its tasks after the faults: short enough that a
task stuck for good is reported (its state and last error in the notes) well
inside the bound below, long enough for a loaded machine's recovery (a healthy
run's tasks finish about 25 s after the faults)."""

DRILL_BOUND_S = 230.0
"""The drill's own bound; then SIGTERM, which stops its cluster, within 60 s."""


def _drill(run_dir: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, Any, str]:
    cmd = [str(LAZARUS), "drill", *args, "--settle-timeout", str(SETTLE_S)]
    proc = subprocess.Popen(
        [*cmd, "--run-dir", str(run_dir), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        out, err = proc.communicate(timeout=DRILL_BOUND_S)
    except subprocess.TimeoutExpired:
        # SIGTERM ends a drill through its cleanup: its cluster's processes (each in
        # a session of its own) stop and its network namespace goes. SIGKILL would
        # leave them running into the next tests.
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(
            f"the drill overran {DRILL_BOUND_S:.0f} s\nstderr:\n{err[-6000:]}\n"
            f"stdout:\n{out[-3000:]}"
        )
    report = json.loads(out) if out.strip() else None
    return proc.returncode, report, err


def test_a_seeded_chaos_drill_holds_every_invariant_and_records_its_schedule(
    tmp_path: Path,
) -> None:
    code, report, err = _drill(
        tmp_path, "chaos", "--seed", str(CHAOS_SEED), "--duration", str(CHAOS_S), "--tasks", "8"
    )
    assert report is not None, err[-4000:]
    (chaos,) = report["drills"]
    netns = os.geteuid() == 0
    faults = make_schedule(CHAOS_SEED, CHAOS_S, agents=4, netns=netns)
    assert chaos["seed"] == CHAOS_SEED
    assert chaos["schedule"] == schedule_lines(CHAOS_SEED, faults)
    assert chaos["effects_checked"] is True
    assert chaos["effect_records"] > 0
    print("\n" + err[-3000:])
    assert chaos["violations"] == [], chaos["violations"][:10]
    assert (chaos["tasks_lost"], chaos["wrong_results"], chaos["dup_exec"]) == (0, 0, 0), chaos[
        "notes"
    ]
    assert code == 0
    assert chaos["held"] is True


def test_the_partition_drill_fails_with_the_self_fence_turned_off(tmp_path: Path) -> None:
    code, report, err = _drill(
        tmp_path,
        "partition-heal",
        "--tasks",
        "8",
        env={"LAZARUS_UNSAFE_DISABLE_SELF_FENCE": "1"},
    )
    assert report is not None, err[-4000:]
    (drill,) = report["drills"]
    print("\n" + "\n".join(drill["violations"][:5]))
    assert code == 1
    assert drill["held"] is False
    # The cut-off owner ran on after its tasks moved: steps of the old epoch after
    # the new owner's first step (and, when it finished first, a second completion).
    assert drill["stale_steps"] + drill["two_owners"] + drill["dup_exec"] > 0
