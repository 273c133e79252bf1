"""The ``lazarus`` command line."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="lazarus",
    help="Lazarus: recovery layer for fleets of long-running agent tasks.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def main() -> None:
    """Lazarus: recovery layer for fleets of long-running agent tasks."""


@app.command()
def version() -> None:
    """Print the Lazarus version.

    Example: lazarus version
    """
    from lazarus import __version__

    typer.echo(__version__)
