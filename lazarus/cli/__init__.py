"""The ``lazarus`` command line, by audience.

- ``servers``: ``lazarus coordinator``, ``lazarus node-agent`` (what a deployment runs);
- ``operator``: ``status``, ``nodes``, ``tasks``, ``task``, ``submit``, ``cancel``,
  ``drain``, ``uncordon``, ``migrate``, ``watch``, ``version``, and ``certs``;
- development tools (``demo``, ``drill``, ``dev``) from ``lazarus_dev.cli``, listed
  when the development package is installed.

``app`` (the console script's entry point) is assembled in ``lazarus.cli.main``
on first use, so importing one audience's module never imports another's.
Commands are thin: they parse options and call into the package. Heavy imports
happen inside the commands, so ``lazarus --help`` and ``lazarus version`` stay fast.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["app", "make_operator_client", "operator", "servers"]


def __getattr__(name: str) -> Any:
    """``app`` and ``make_operator_client`` from ``main``; ``operator`` / ``servers`` modules."""
    if name in ("app", "make_operator_client"):
        return getattr(importlib.import_module("lazarus.cli.main"), name)
    if name in ("operator", "servers", "main"):
        return importlib.import_module(f"lazarus.cli.{name}")
    raise AttributeError(f"module 'lazarus.cli' has no attribute {name!r}")
