"""The ``lazarus`` command line.

Commands are thin: they parse options and call into the package. Heavy imports
happen inside the commands, so ``lazarus --help`` and ``lazarus version`` stay fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

app = typer.Typer(
    name="lazarus",
    help="Lazarus: recovery layer for fleets of long-running agent tasks.",
    no_args_is_help=True,
    add_completion=False,
)
demo_app = typer.Typer(
    help="Demonstrations that run on this machine, with real processes and signals.",
    no_args_is_help=True,
)
app.add_typer(demo_app, name="demo")

DurabilityChoice = Literal["sync", "group", "none"]


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


@demo_app.command("checkpoint")
def demo_checkpoint(
    data_dir: Annotated[
        Path | None,
        typer.Option(help="Empty directory for the checkpoint store (default: a fresh temp dir)."),
    ] = None,
    tasks: Annotated[int, typer.Option(min=1, help="Tasks N run side by side.")] = 3,
    items: Annotated[int, typer.Option(min=1, help="Items M per task.")] = 4000,
    every: Annotated[int, typer.Option(min=1, help="Items between checkpoints K.")] = 250,
    durability: Annotated[
        DurabilityChoice, typer.Option(help="Checkpoint store durability mode.")
    ] = "group",
    kills: Annotated[
        int, typer.Option(min=0, help="SIGKILLs of the worker before it finishes.")
    ] = 2,
    seed: Annotated[
        int | None, typer.Option(help="Seed of the kill moments (default: random, printed).")
    ] = None,
    work_ms: Annotated[
        float, typer.Option(min=0.0, help="Simulated work per item, milliseconds.")
    ] = 1.0,
) -> None:
    """Write, SIGKILL, recover, repeat: the checkpoint store under real crashes.

    A worker process runs N tasks, each a SHA-256 hash chain over M items: every
    item is appended to the task's journal, every K items a checkpoint is saved.
    The demo SIGKILLs the worker at seeded random moments, reopens the store,
    prints what each task recovered (newest checkpoint + journal replay), restarts
    the worker, and at the end checks each task's result against a direct
    computation. Exit status 1 when any check fails.

    Example: lazarus demo checkpoint --tasks 3 --items 4000 --every 250 --kills 2 --seed 7
    """
    from lazarus.demo import run_checkpoint_demo

    code = run_checkpoint_demo(data_dir, tasks, items, every, durability, kills, seed, work_ms)
    if code:
        raise typer.Exit(code)
