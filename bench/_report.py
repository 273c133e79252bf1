"""Shared output of the benchmarks: JSON results and a section of bench/README.md.

Each benchmark owns one section of ``bench/README.md`` between
``<!-- <name>-bench:start -->`` and ``<!-- <name>-bench:end -->`` and rewrites only
that; a section not there yet is appended.
"""

from __future__ import annotations

import json
import os
import platform
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
README = BENCH_DIR / "README.md"


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
    }


def today() -> str:
    """The UTC date, YYYY-MM-DD."""
    return time.strftime("%Y-%m-%d", time.gmtime())


def measured_commit() -> str:
    """The short commit measured (``git rev-parse --short HEAD``), "" outside a checkout."""
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
        cwd=BENCH_DIR,
    ).stdout.strip()


def write_json(path: Path, result: dict[str, Any]) -> None:
    """Write ``result`` (plus the machine it ran on) as indented JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine(), **result}, indent=2) + "\n")


def write_section(name: str, markdown: str) -> None:
    """Replace (or append) the ``name`` section of bench/README.md with ``markdown``."""
    start, end = f"<!-- {name}-bench:start -->", f"<!-- {name}-bench:end -->"
    text = README.read_text() if README.exists() else "# Benchmarks\n"
    block = f"{start}\n{markdown.strip()}\n{end}"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    README.write_text(text)


def publish(path: Path, result: dict[str, Any], section: str, markdown: str, readme: bool) -> None:
    """Write ``result`` to ``path``, rewrite README section ``section`` (when
    ``readme``), and print ``markdown``: the end of every benchmark's run."""
    write_json(path, result)
    if readme:
        write_section(section, markdown)
    print(markdown)
