"""The whole ``lazarus`` application: every audience's commands on one Typer app.

The console script's ``lazarus.cli:app`` resolves here (``lazarus.cli.__getattr__``).
Development tools (``demo``, ``drill``, ``dev``) come from ``lazarus_dev.cli`` when
that package is installed; the servers' and operators' commands never need it.
"""

from __future__ import annotations

import importlib
import importlib.util

from lazarus.certs_cli import certs_app
from lazarus.cli import operator, servers
from lazarus.cli._app import app
from lazarus.cli.operator import make_operator_client

app.add_typer(certs_app, name="certs", rich_help_panel="Operator")
if importlib.util.find_spec("lazarus_dev") is not None:
    importlib.import_module("lazarus_dev.cli")  # registers demo, drill and dev

__all__ = ["app", "make_operator_client", "operator", "servers"]
