"""Structured logging for coordinator processes: one JSON object per line on stderr."""

from __future__ import annotations

import json
import logging
import sys
import time

__all__ = ["JsonFormatter", "configure_logging"]


class JsonFormatter(logging.Formatter):
    """Format a record as one JSON line: ts (Unix s), level, logger, msg, fields, exc.

    ``fields`` holds the dict passed as ``extra={"lazarus": {...}}``: machine-
    readable facts (ids, seqs, wall times) that tests and drills parse.
    """

    def format(self, record: logging.LogRecord) -> str:
        """Return the JSON line of ``record``."""
        out: dict[str, object] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "lazarus", None)
        if isinstance(fields, dict):
            out["fields"] = fields
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure_logging(level: str = "INFO", fmt: str = "json") -> None:
    """Send every log record at ``level`` or above to stderr, as JSON lines or text.

    Raises:
        ValueError: an unknown level name.
    """
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"log level: unknown {level!r}")
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
        formatter.converter = time.gmtime
        handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    # Neither format shows threads, processes or call sites: do not compute them
    # for every record (the logging HOWTO's "Optimization" section). A recovery
    # logs thousands of lines within a second on a leader or a survivor.
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging._srcfile = None
