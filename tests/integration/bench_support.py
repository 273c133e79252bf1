"""Run a benchmark's ``--quick`` mode from a test, bounded, and keep its README untouched.

On a timeout the benchmark gets SIGTERM first, so it stops the processes it
started (etcd, Redis, coordinators, workers) by pid itself; SIGKILL follows
only if it does not exit.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


def run_quick(script: str, out: Path, bound_s: float, term_grace_s: float = 30.0) -> str:
    """Run ``bench/<script> --quick --out <out>``; return its stdout + stderr.

    Fails the test when it runs over ``bound_s`` seconds, exits non-zero, or
    rewrites ``bench/README.md`` (``--quick`` never records).
    """
    readme = BENCH_DIR / "README.md"
    before = readme.read_text() if readme.exists() else None
    proc = subprocess.Popen(
        [sys.executable, str(BENCH_DIR / script), "--quick", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=bound_s)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            stdout, stderr = proc.communicate(timeout=term_grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        pytest.fail(f"benchmark ran over {bound_s} s:\n{stdout}\n{stderr}")
    assert proc.returncode == 0, stdout + stderr
    assert (readme.read_text() if readme.exists() else None) == before, "--quick wrote README"
    return stdout + stderr
