"""``reconcile/`` stays pure: no IO, no clocks, no global randomness, no threads.

Same check as ``tests/unit/test_core_purity.py`` (every module parsed with
``ast``, never imported), applied to ``reconcile/`` on its own, plus ``uuid``
(``uuid4`` reads ``os.urandom``: the ``crdts`` types default to it, so every
clock we hand them carries a fixed uuid). ``from random import Random`` stays
allowed for an injected ``Random(seed)``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "reconcile"
FORBIDDEN = frozenset(
    {
        "asyncio",
        "socket",
        "time",
        "os",
        "threading",
        "multiprocessing",
        "subprocess",
        "datetime",
        "uuid",
        "grpc",
        "redis",
        "aetcd",
        "random",
        "secrets",
    }
)


def problems(source: str, filename: str) -> list[str]:
    """Each forbidden import or global-random use in ``source`` as ``file:line: what``."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FORBIDDEN:
                    found.append(f"{filename}:{line}: imports {alias.name}")
        elif isinstance(node, ast.ImportFrom) and not node.level:
            module = node.module or ""
            top = module.split(".")[0]
            if top == "random" and module == "random":
                bad = [a.name for a in node.names if a.name != "Random"]
                if bad:
                    found.append(f"{filename}:{line}: imports random.{bad[0]}")
            elif top in FORBIDDEN:
                found.append(f"{filename}:{line}: imports {module}")
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in {"random", "time", "os"}
        ):
            found.append(f"{filename}:{line}: uses {node.value.id}.{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"__import__", "open", "eval", "exec"}
        ):
            found.append(f"{filename}:{line}: calls {node.func.id}")
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_the_package_has_its_modules() -> None:
    names = {p.name for p in MODULES}
    assert {"vclock.py", "hlc.py", "versioned.py", "documents.py", "antientropy.py"} <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_module_is_pure(path: Path) -> None:
    found = problems(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())
    assert not found, "impure code:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "import asyncio",
        "import time",
        "from time import monotonic",
        "import os.path",
        "import socket",
        "import threading",
        "import random",
        "from random import randint",
        "from uuid import uuid4",
        "x = random.random()",
        "open('f')",
    ],
)
def test_the_checker_catches(source: str) -> None:
    assert problems(source, "m.py")


@pytest.mark.parametrize(
    "source",
    ["from random import Random", "import json, math, bisect", "from crdts import CounterSet"],
)
def test_the_checker_allows(source: str) -> None:
    assert problems(source, "m.py") == []
