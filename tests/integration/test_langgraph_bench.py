"""The LangGraph checkpointer benchmark runs end to end and writes complete results.

Timings are not asserted (benchmarks measure, tests check behaviour); this
keeps ``bench/langgraph_bench.py`` from rotting between benchmark runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "langgraph_bench.py"


@pytest.mark.timeout(120)
def test_quick_langgraph_benchmark_writes_every_cell(tmp_path: Path) -> None:
    out = tmp_path / "langgraph.json"
    readme = BENCH.parent / "README.md"
    before = readme.read_text()
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    cells = json.loads(out.read_text())["cells"]
    assert {c["impl"] for c in cells} == {
        "lazarus-saver",
        "lazarus-saver-async",
        "langgraph-sqlite",
    }
    assert len(cells) == 3 * 3 * 2  # impls x durability modes x concurrency
    assert all(c["puts"] > 0 and c["p50_ms"] <= c["p99_ms"] for c in cells)
    assert readme.read_text() == before  # --quick never rewrites the recorded table
