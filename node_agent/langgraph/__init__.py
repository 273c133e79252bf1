"""LangGraph on Lazarus: a checkpointer and a graph-as-task runner.

``LazarusSaver`` is a LangGraph checkpointer whose writes are journal events
of a Lazarus task (durable, replicated, epoch-fenced) or of a local store;
``langgraph_task`` registers a compiled graph as a task kind whose thread is
the task. Needs the ``lazarus[langgraph]`` extra. See ``docs/langgraph.md``.
"""

from node_agent.langgraph.saver import LazarusSaver, ThreadNotOwned
from node_agent.langgraph.task import GraphFactory, jsonable, langgraph_task, resume, run_graph

__all__ = [
    "GraphFactory",
    "LazarusSaver",
    "ThreadNotOwned",
    "jsonable",
    "langgraph_task",
    "resume",
    "run_graph",
]
