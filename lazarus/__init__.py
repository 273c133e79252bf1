"""Lazarus: the recovery layer for fleets of long-running agent tasks.

The shared shell lives here: generated wire stubs (``lazarus.v1``), the CLI,
the orchestrator client, settings and logging.
"""

__version__ = "0.1.0"
