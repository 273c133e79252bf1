"""The ``lazarus node-agent`` process: run one node agent until SIGTERM / SIGINT.

On SIGTERM or SIGINT the agent pauses its tasks, flushes them to Redis, says
Goodbye (so the leader moves them at once) and exits 0. A failure to start
(the data directory locked by another agent, a bad ``--app``, metrics port
taken) exits 1 with the reason logged.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from node_agent.agent import NodeAgent
from node_agent.metrics import AgentMetrics
from node_agent.settings import AgentSettings

__all__ = ["run_node_agent"]

_log = logging.getLogger("lazarus.agent")


def run_node_agent(settings: AgentSettings) -> int:
    """Run the agent until SIGTERM or SIGINT.

    Returns:
        The exit status: 0 after a signal, 1 when the agent could not start.
    """
    return asyncio.run(_main(settings))


async def _main(settings: AgentSettings) -> int:
    metrics = AgentMetrics()
    if settings.metrics_listen:
        host, _, port = settings.metrics_listen.rpartition(":")
        try:
            metrics.serve(host or "127.0.0.1", int(port))
        except (OSError, ValueError) as exc:
            _log.error("cannot serve metrics on %s: %s", settings.metrics_listen, exc)
            return 1
    try:
        agent = NodeAgent(settings, metrics=metrics)
    except ValueError as exc:
        _log.error("cannot start: %s", exc)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await agent.start()
    except Exception as exc:
        _log.error("cannot start: %s", exc)
        await agent.stop(goodbye=False)
        return 1
    await stop.wait()
    _log.info("signal received: pausing tasks, flushing to Redis, saying Goodbye")
    await agent.stop()
    return 0
