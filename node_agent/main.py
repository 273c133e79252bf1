"""Process entry of ``lazarus node-agent`` (work in progress)."""

from __future__ import annotations

from node_agent.settings import AgentSettings


def run_node_agent(settings: AgentSettings) -> int:
    """Run the agent until SIGTERM / SIGINT; return the exit status."""
    raise NotImplementedError("node agent runtime lands with issue [node-agent]")
