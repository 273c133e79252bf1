"""The ``lazarus coordinator`` process: run one replica until SIGTERM / SIGINT.

Theory of operation: build a :class:`~coordinator.server.CoordinatorServer`,
start the metrics endpoint, start the server, then wait for a signal. On
SIGTERM or SIGINT the replica resigns at once (so another replica leads
without waiting for the lease to expire) and exits 0. A failure to start
(etcd unreachable, port taken) exits 1 with the reason logged.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal

from coordinator.core import CoreSettings
from coordinator.metrics import Metrics
from coordinator.server import CoordinatorServer, ServerSettings

__all__ = ["run_coordinator"]

_log = logging.getLogger("lazarus.coordinator")


def run_coordinator(
    settings: ServerSettings,
    core_settings: CoreSettings,
    *,
    metrics_listen: str = "",
    seed: int | None = None,
) -> int:
    """Run a replica until SIGTERM or SIGINT.

    Args:
        settings: process settings.
        core_settings: the core's settings.
        metrics_listen: host:port of /metrics; empty: no metrics endpoint.
        seed: the core's random seed.

    Returns:
        The exit status: 0 after a signal, 1 when the replica could not start.
    """
    return asyncio.run(_main(settings, core_settings, metrics_listen, seed))


async def _main(
    settings: ServerSettings, core_settings: CoreSettings, metrics_listen: str, seed: int | None
) -> int:
    metrics = Metrics()
    if metrics_listen:
        host, _, port = metrics_listen.rpartition(":")
        try:
            metrics.serve(host or "127.0.0.1", int(port))
        except (OSError, ValueError) as exc:
            _log.error("cannot serve metrics on %s: %s", metrics_listen, exc)
            return 1
    if metrics_listen and not settings.metrics_address:
        settings = dataclasses.replace(settings, metrics_address=metrics_listen)
    server = CoordinatorServer(settings, core_settings, observer=metrics, seed=seed)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await server.start()
    except Exception as exc:
        _log.error("cannot start: %s", exc)
        await server.stop()
        return 1
    await stop.wait()
    _log.info("signal received: resigning and stopping")
    await server.stop()
    return 0
