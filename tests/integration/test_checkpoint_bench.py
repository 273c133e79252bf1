"""The checkpoint benchmark runs end to end and writes complete results.

Timings are not asserted here (benchmarks measure, tests check behaviour); this
keeps ``bench/checkpoint_bench.py`` from rotting between benchmark runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "checkpoint_bench.py"


@pytest.mark.timeout(120)
def test_quick_benchmark_writes_every_cell_and_ratio(tmp_path: Path) -> None:
    out = tmp_path / "checkpoint.json"
    readme = BENCH.parent / "README.md"
    before = readme.read_text() if readme.exists() else None
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    cells = result["cells"]
    impls = {c["impl"] for c in cells}
    assert impls == {"lazarus", "lazarus-sync-api", "langgraph-sqlite"}
    assert len(cells) == 3 * 2 * 3 * 2  # impls x payloads x modes x concurrency
    assert all(c["saves"] > 0 and c["saves_per_s"] > 0 for c in cells)
    assert all(c["p50_ms"] <= c["p99_ms"] for c in cells)
    ratios = result["ratios"]
    assert len(ratios) == 12
    assert {(r["payload"], r["durability"], r["concurrency"]) for r in ratios} == {
        (p, m, n) for p in ("1KiB", "256KiB") for m in ("sync", "group", "none") for n in (1, 32)
    }
    # --quick never rewrites the recorded table
    assert (readme.read_text() if readme.exists() else None) == before
