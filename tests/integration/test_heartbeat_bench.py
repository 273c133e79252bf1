"""The heartbeat benchmark runs end to end (``--quick``) and writes complete results.

Timings are not asserted here (benchmarks measure, tests check behaviour); this
keeps ``bench/heartbeat_bench.py`` from rotting between benchmark runs. It
starts its own etcd and coordinator processes and stops them by pid.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "heartbeat_bench.py"


@pytest.mark.timeout(120)
def test_quick_benchmark_writes_its_steps(tmp_path: Path) -> None:
    out = tmp_path / "heartbeat.json"
    readme = BENCH.parent / "README.md"
    before = readme.read_text() if readme.exists() else None
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["machine"]["cpus"] > 0
    assert result["config"]["heartbeat_interval_s"] == 1.0
    assert result["config"]["dead_after_s"] > result["config"]["heartbeat_interval_s"]
    steps = result["steps"]
    assert len(steps) == 1
    step = steps[0]
    assert step["nodes"] > 0
    assert step["heartbeats_sent"] > 0
    assert step["acks"] > 0
    assert 0 < step["p50_ms"] <= step["p99_ms"] <= step["max_ms"]
    for key in ("suspect_or_dead_nodes", "dead_verdicts", "streams_ended", "ok"):
        assert key in step
    assert isinstance(result["sustained_nodes"], int)
    # --quick never rewrites the recorded section
    assert (readme.read_text() if readme.exists() else None) == before
