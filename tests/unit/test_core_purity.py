"""The pure packages stay pure: no IO, no clocks, no global randomness, no wire stubs.

One checker for every sans-IO package (DESIGN.md §2): ``coordinator/core/``,
``node_agent/core/`` and ``reconcile/`` (and ``lazarus_dev/fleetsim.py``, from
``test_fleetsim.py``). Every module is parsed with ``ast`` (never imported)
and refused when it imports asyncio, grpc, aetcd, redis, time, socket,
threading, multiprocessing, subprocess, os, datetime, uuid or secrets (or a
submodule), anything from ``lazarus.v1``, the ``random`` module itself; when
it uses ``random.<x>``, ``time.<x>`` or ``os.<x>``; or calls ``__import__``,
``open``, ``eval`` or ``exec``. ``uuid`` is out because ``uuid4`` reads
``os.urandom`` (the ``crdts`` types default to it, so every clock the
reconcile package hands them carries a fixed uuid). ``from random import
Random`` stays allowed: an injected ``Random(seed)`` instance, or the type of
one. Failures name the file and the line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE_PACKAGES = ("coordinator/core", "node_agent/core", "reconcile")
FORBIDDEN_MODULES = frozenset(
    {
        "asyncio",
        "grpc",
        "aetcd",
        "redis",
        "time",
        "socket",
        "threading",
        "subprocess",
        "multiprocessing",
        "os",
        "datetime",
        "uuid",
        "secrets",
    }
)
FORBIDDEN_ATTRIBUTES = frozenset({"random", "time", "os"})
"""Modules whose attributes a pure module may not use even when reached without an import."""
FORBIDDEN_CALLS = frozenset({"__import__", "open", "eval", "exec"})


def _is_forbidden(module: str) -> str | None:
    top = module.split(".")[0]
    if top in FORBIDDEN_MODULES:
        return f"imports {module}"
    if module == "lazarus.v1" or module.startswith("lazarus.v1."):
        return f"imports the wire stubs ({module}); convert in an adapter"
    if top == "random":
        return "imports the random module (use an injected random.Random instance)"
    return None


def violations(source: str, filename: str) -> list[str]:
    """Every purity violation in ``source``, as ``"<filename>:<line>: <what>"``."""
    tree = ast.parse(source, filename=filename)
    found: list[str] = []

    def report(node: ast.AST, what: str) -> None:
        found.append(f"{filename}:{getattr(node, 'lineno', 0)}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                problem = _is_forbidden(alias.name)
                if problem:
                    report(node, problem)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative imports stay inside the package
                continue
            if module == "random":
                for alias in node.names:
                    if alias.name != "Random":
                        report(node, f"imports random.{alias.name} (only Random is allowed)")
                continue
            if module == "lazarus" and any(a.name == "v1" for a in node.names):
                report(node, "imports the wire stubs (lazarus.v1); convert in an adapter")
                continue
            problem = _is_forbidden(module)
            if problem:
                report(node, problem)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in FORBIDDEN_ATTRIBUTES
        ):
            what = "global randomness" if node.value.id == "random" else "IO or a clock"
            report(node, f"uses {node.value.id}.{node.attr} ({what})")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in FORBIDDEN_CALLS
        ):
            report(node, f"calls {node.func.id}")
    return found


def pure_modules() -> list[Path]:
    files: list[Path] = []
    for package in PURE_PACKAGES:
        files += sorted((ROOT / package).rglob("*.py"))
    return files


def test_the_pure_packages_exist_and_have_modules() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in pure_modules()}
    assert {
        "coordinator/core/core.py",
        "node_agent/core/core.py",
        "node_agent/core/records.py",
        "node_agent/core/redisloss.py",
        "node_agent/core/restore.py",
        "node_agent/core/lineage.py",
        "reconcile/__init__.py",
        "reconcile/vclock.py",
        "reconcile/hlc.py",
        "reconcile/versioned.py",
        "reconcile/documents.py",
        "reconcile/antientropy.py",
    } <= names


@pytest.mark.parametrize("path", pure_modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_module_is_pure(path: Path) -> None:
    problems = violations(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())
    assert not problems, "impure code:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import time", "m.py:1: imports time"),
        ("import os.path", "m.py:1: imports os.path"),
        ("from datetime import datetime", "m.py:1: imports datetime"),
        ("\nimport asyncio as aio", "m.py:2: imports asyncio"),
        ("from grpc import aio", "m.py:1: imports grpc"),
        ("import aetcd", "m.py:1: imports aetcd"),
        ("from redis.asyncio import Redis", "m.py:1: imports redis.asyncio"),
        ("import socket, threading", "m.py:1: imports socket"),
        ("import subprocess", "m.py:1: imports subprocess"),
        ("import random", "m.py:1: imports the random module"),
        ("from random import choice", "m.py:1: imports random.choice"),
        ("from lazarus.v1 import records_pb2", "m.py:1: imports the wire stubs"),
        ("import lazarus.v1.agent_pb2", "m.py:1: imports the wire stubs"),
        ("from lazarus import v1", "m.py:1: imports the wire stubs"),
        ("x = 1\ny = random.random()", "m.py:2: uses random.random"),
        ("m = __import__('time')", "m.py:1: calls __import__"),
        ("import multiprocessing", "m.py:1: imports multiprocessing"),
        ("from uuid import uuid4", "m.py:1: imports uuid"),
        ("import secrets", "m.py:1: imports secrets"),
        ("from time import monotonic", "m.py:1: imports time"),
        ("t = time.monotonic()", "m.py:1: uses time.monotonic"),
        ("p = os.getpid()", "m.py:1: uses os.getpid"),
        ("f = open('x')", "m.py:1: calls open"),
        ("eval('1')", "m.py:1: calls eval"),
    ],
)
def test_the_checker_catches(source: str, expected: str) -> None:
    found = violations(source, "m.py")
    assert any(v.startswith(expected) for v in found), found


@pytest.mark.parametrize(
    "source",
    [
        "from random import Random",
        "def f(rng: Random) -> float:\n    return rng.random()",
        "from coordinator.core import records",
        "from . import records",
        "import math, enum, dataclasses, heapq",
        "from lazarus import settings",
        "import json, math, bisect",
        "from crdts import CounterSet",
    ],
)
def test_the_checker_allows(source: str) -> None:
    assert violations(source, "m.py") == []
