"""Exceptions of the pure coordinator core.

Theory of operation: the core splits errors the way h11 does. A *peer* that
sends garbage (a node agent with a heartbeat seq going backwards, an
orchestrator with an empty task kind) never raises: the core answers with a
command (``CloseSession`` or ``ReplyToRequest`` with a status) and keeps
serving everyone else. Exceptions are for the two cases where continuing
would be wrong:

- ``UsageError``: the shell misused the core (time went backwards, an event
  fed while not leading, settings that break the fencing arithmetic). A bug in
  the caller; fix the caller.
- ``InvariantViolation``: the core's own state broke one of its rules (two
  owners at one epoch, an epoch that went down, a directive ordered before the
  write it depends on). A bug in the core; the leader must stop deciding.

Both derive from ``CoreError``. They are ordinary exceptions, not ``assert``,
so ``python -O`` does not strip the checks.
"""

from __future__ import annotations

__all__ = ["CoreError", "InvariantViolation", "UsageError"]


class CoreError(Exception):
    """Base class of every exception the coordinator core raises."""


class UsageError(CoreError):
    """The caller misused the core (maps to gRPC INTERNAL if it ever escapes a handler)."""


class InvariantViolation(CoreError):
    """A rule of the core's state was broken; the leader must stop deciding (INTERNAL)."""
