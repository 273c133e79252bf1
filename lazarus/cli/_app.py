"""The ``lazarus`` Typer application every audience's module registers its commands on."""

from __future__ import annotations

from typing import Literal

import typer

app = typer.Typer(
    name="lazarus",
    help="Lazarus: recovery layer for fleets of long-running agent tasks.",
    no_args_is_help=True,
    add_completion=False,
)

DurabilityChoice = Literal["sync", "group", "none"]


@app.callback()
def main() -> None:
    """Lazarus: recovery layer for fleets of long-running agent tasks."""


@app.command(rich_help_panel="Operator")
def version() -> None:
    """Print the Lazarus version.

    Example: lazarus version
    """
    from lazarus import __version__

    typer.echo(__version__)
