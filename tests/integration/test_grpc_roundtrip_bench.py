"""The gRPC round-trip benchmark runs end to end (``--quick``) and writes complete results.

Timings are not asserted (benchmarks measure, tests check behaviour): a row per
rate and message size, each with the server's CPU per round trip measured
(positive: the server process did the work). It starts its own server process
and stops it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_support import run_quick


@pytest.mark.timeout(120)
def test_quick_grpc_roundtrip_benchmark_measures_the_server(tmp_path: Path) -> None:
    out = tmp_path / "grpc.json"
    run_quick("grpc_roundtrip_bench.py", out, bound_s=90)
    result = json.loads(out.read_text())
    assert result["grpcio"]
    assert [(r["entries"], r["rate_per_s"]) for r in result["rows"]] == [(1, 40.0)]
    row = result["rows"][0]
    assert len(row["rounds"]) == 1
    assert row["server_cpu_us_per_round_trip"] > 0
