"""The ``lazarus node-agent`` process: run one node agent until SIGTERM / SIGINT.

On SIGTERM or SIGINT the agent pauses its tasks, flushes them to Redis, says
Goodbye (so the leader moves them at once) and exits 0. A failure to start
(the data directory locked by another agent, a bad ``--app``, metrics port
taken) exits 1 with the reason logged. So does an agent that stopped itself
because a part of it failed (a loop such as the heartbeat tick ended, or a
directive could not be applied: ``NodeAgent.failed``): its tasks are paused
and it exits 1, so Kubernetes restarts it; a process never runs tasks on with
a dead tick loop.
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
        The exit status: 0 after a signal, 1 when the agent could not start or
        stopped itself because a part of it failed.
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
    signalled = asyncio.ensure_future(stop.wait())
    failed = asyncio.ensure_future(agent.failed())
    await asyncio.wait({signalled, failed}, return_when=asyncio.FIRST_COMPLETED)
    if agent.failure is None:  # the signal (once stop() began, no failure is taken)
        failed.cancel()
        _log.info("signal received: pausing tasks, flushing to Redis, saying Goodbye")
        await agent.stop()
        return 0
    signalled.cancel()
    reason = await failed  # the agent's own stop has completed
    _log.error("node agent failed (%s): stopped, exiting 1", reason)
    return 1
