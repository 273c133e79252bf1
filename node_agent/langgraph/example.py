"""Example app: a LangGraph tool-calling research agent as a Lazarus task kind.

Run it on a fleet with ``lazarus node-agent --app node_agent.langgraph.example:agent``
and submit tasks of kind ``research`` with a payload from ``make_payloads``.

The graph is a real LangGraph tool-calling agent::

    START -> agent -(tool calls)-> tools -> agent -> ... -(no tool call)-> summarize
          -> review (interrupt() when the payload asks for a human review) -> END

``agent`` asks a chat model what to do next; the model is a deterministic
fake from ``langchain-core`` (``FakeMessagesListChatModel``) whose reply
depends only on the conversation so far, so a resumed run asks it the same
question and gets the same answer. ``tools`` runs LangGraph's ``ToolNode``
over real tools (word counts and frequent words of the bundled novels), and
the conversation history grows with every round. ``summarize`` writes the
answer from the tool results.

Every node execution appends one line to the payload's ``effects_log`` (a
JSON-lines file): task, node, super-step, epoch, node id, pid — the side
effect from which a test checks that no super-step ran under two owners.
``direct_result(payload)`` runs the same graph in-process with LangGraph's
``InMemorySaver``: what the fleet's result must equal.
"""

from __future__ import annotations

import asyncio
import functools
import json
import operator
import os
import re
import time
from collections import Counter
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from langgraph.types import interrupt

from node_agent import demo_app
from node_agent.sdk import Agent

__all__ = [
    "KIND",
    "ResearchState",
    "ScriptedChatModel",
    "adirect_result",
    "agent",
    "build_graph",
    "direct_result",
    "make_payloads",
    "output",
]

KIND = "research"

_WORD = re.compile(r"[a-z']+")
_WORDS = (
    "love",
    "money",
    "marriage",
    "sister",
    "letter",
    "walk",
    "ball",
    "house",
    "family",
    "heart",
    "time",
    "pride",
)


@functools.cache
def _counts(book: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for line in demo_app.read_text(book):
        counts.update(_WORD.findall(line.lower()))
    return counts


@tool
def count_word(book: str, word: str) -> int:
    """How many times ``word`` occurs in the novel ``book`` (case-insensitive)."""
    return _counts(book)[word.lower()]


@tool
def top_words(book: str, n: int) -> list[list[Any]]:
    """The ``n`` most frequent words of ``book`` longer than four letters, with counts."""
    ranked = sorted(((w, c) for w, c in _counts(book).items() if len(w) > 4), key=_rank)
    return [[w, c] for w, c in ranked[:n]]


def _rank(item: tuple[str, int]) -> tuple[int, str]:
    return (-item[1], item[0])


TOOLS = [count_word, top_words]


class ScriptedChatModel(FakeMessagesListChatModel):
    """langchain-core's fake chat model, replying by turn: the n-th AI turn gets ``responses[n]``.

    The turn is counted from the conversation it is given (AI messages so
    far), not from calls made to this object, so the reply is a function of
    the history: a run resumed on another node gets the same reply.
    """

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        turn = sum(1 for m in messages if isinstance(m, AIMessage))
        response = self.responses[min(turn, len(self.responses) - 1)]
        return ChatResult(generations=[ChatGeneration(message=response)])


def _script(book: str, words: Sequence[str]) -> list[BaseMessage]:
    """The model's replies: two tool calls per pair of words, then top words, then done."""
    replies: list[BaseMessage] = []
    pairs = [list(words[i : i + 2]) for i in range(0, len(words), 2)]
    for turn, pair in enumerate(pairs):
        calls = [
            {"name": "count_word", "args": {"book": book, "word": w}, "id": f"call-{turn}-{j}"}
            for j, w in enumerate(pair)
        ]
        replies.append(AIMessage(content=f"Counting {', '.join(pair)}.", tool_calls=calls))
    turn = len(pairs)
    replies.append(
        AIMessage(
            content="Now the most frequent words.",
            tool_calls=[
                {"name": "top_words", "args": {"book": book, "n": 5}, "id": f"call-{turn}-0"}
            ],
        )
    )
    replies.append(AIMessage(content="I have what I need."))
    return replies


class ResearchState(TypedDict, total=False):
    """The graph's state: the conversation grows; ``trail`` lists the nodes run."""

    messages: Annotated[list[AnyMessage], add_messages]
    book: str
    words: list[str]
    think_s: float
    effects_log: str
    review: bool
    answer: str
    approved: Any
    trail: Annotated[list[str], operator.add]


def _effect(state: ResearchState, config: RunnableConfig, node: str) -> None:
    """Append this node execution to the effects log (one O_APPEND write)."""
    path = state.get("effects_log") or ""
    if not path:
        return
    conf = config.get("configurable", {})
    meta = config.get("metadata", {})
    ctx = conf.get("lazarus_ctx")
    if ctx is not None:
        ctx.raise_if_cancelled()  # an owner that lost the task does no more side effects
    line = {
        "task": conf.get("lazarus_task_id") or conf.get("thread_id"),
        "node": node,
        "step": meta.get("langgraph_step"),
        "epoch": conf.get("lazarus_epoch", 0),
        "node_id": conf.get("lazarus_node_id", ""),
        "pid": os.getpid(),
        "t": time.time(),
    }
    data = (json.dumps(line, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


async def _think(state: ResearchState) -> None:
    delay = float(state.get("think_s") or 0.0)
    if delay > 0:
        await asyncio.sleep(delay)


async def agent_node(state: ResearchState, config: RunnableConfig) -> dict[str, Any]:
    """Ask the (fake) chat model for the next step, given the whole history."""
    await _think(state)
    model = ScriptedChatModel(responses=_script(state["book"], state["words"]))
    reply = await model.ainvoke(state["messages"])
    _effect(state, config, "agent")
    return {"messages": [reply], "trail": ["agent"]}


_tool_node = ToolNode(TOOLS)


async def tools_node(state: ResearchState, config: RunnableConfig) -> dict[str, Any]:
    """Run the tool calls of the last AI message (LangGraph's ToolNode)."""
    await _think(state)
    out = await _tool_node.ainvoke(state, config)
    _effect(state, config, "tools")
    return {"messages": out["messages"], "trail": ["tools"]}


async def summarize_node(state: ResearchState, config: RunnableConfig) -> dict[str, Any]:
    """Write the answer from the tool results in the history."""
    await _think(state)
    counts = []
    top = ""
    for m in state["messages"]:
        if isinstance(m, ToolMessage):
            if m.name == "count_word":
                counts.append(str(m.content))
            elif m.name == "top_words":
                top = str(m.content)
    words = state["words"]
    found = ", ".join(f"{w}={c}" for w, c in zip(words, counts, strict=False))
    answer = f"In {state['book']}: {found}; most frequent: {top}"
    _effect(state, config, "summarize")
    return {"answer": answer, "trail": ["summarize"]}


async def review_node(state: ResearchState, config: RunnableConfig) -> dict[str, Any]:
    """Ask a human to approve the answer when the payload says ``review``."""
    approved: Any = "not asked"
    if state.get("review"):
        approved = interrupt({"question": "approve this answer?", "answer": state["answer"]})
    _effect(state, config, "review")
    return {"approved": approved, "trail": ["review"]}


def _route(state: ResearchState) -> str:
    last = state["messages"][-1]
    if isinstance(last, AIMessage) and last.tool_calls:
        return "tools"
    return "summarize"


def build_graph(checkpointer: BaseCheckpointSaver[Any] | None) -> Any:
    """The compiled research graph with ``checkpointer``."""
    builder = StateGraph(ResearchState)
    builder.add_node("agent", agent_node)
    builder.add_node("tools", tools_node)
    builder.add_node("summarize", summarize_node)
    builder.add_node("review", review_node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", _route, ["tools", "summarize"])
    builder.add_edge("tools", "agent")
    builder.add_edge("summarize", "review")
    builder.add_edge("review", END)
    return builder.compile(checkpointer=checkpointer)


def make_input(payload: Any) -> dict[str, Any]:
    """The graph input for a task payload."""
    words = list(payload["words"])
    question = f"How often do {', '.join(words)} occur in {payload['book']}?"
    return {
        "messages": [{"role": "user", "content": question}],
        "book": payload["book"],
        "words": words,
        "think_s": float(payload.get("think_s", 0.0)),
        "effects_log": str(payload.get("effects_log", "")),
        "review": bool(payload.get("review", False)),
        "trail": [],
    }


def output(values: Any) -> dict[str, Any]:
    """The task's result: the answer, the node trail and the conversation (without random ids)."""
    messages = []
    for m in values.get("messages", []):
        row: dict[str, Any] = {"type": m.type, "content": m.content}
        if isinstance(m, AIMessage) and m.tool_calls:
            row["tool_calls"] = [[c["name"], c["args"], c["id"]] for c in m.tool_calls]
        if isinstance(m, ToolMessage):
            row["tool_call_id"] = m.tool_call_id
        messages.append(row)
    return {
        "answer": values.get("answer", ""),
        "approved": values.get("approved"),
        "trail": list(values.get("trail", [])),
        "messages": messages,
    }


def make_payloads(
    n: int, *, words_per_task: int = 4, think_s: float = 0.0, effects_log: str = ""
) -> list[dict[str, Any]]:
    """``n`` deterministic research payloads over the bundled novels."""
    books = demo_app.corpus_texts()
    out = []
    for i in range(n):
        words = [_WORDS[(i * 5 + k) % len(_WORDS)] for k in range(words_per_task)]
        payload: dict[str, Any] = {"book": books[i % len(books)], "words": words}
        if think_s:
            payload["think_s"] = think_s
        if effects_log:
            payload["effects_log"] = effects_log
        out.append(payload)
    return out


async def adirect_result(payload: Any, thread_id: str = "direct") -> dict[str, Any]:
    """The result of a fault-free run in this process (InMemorySaver, no think time, no log)."""
    plain = {k: v for k, v in payload.items() if k not in ("think_s", "effects_log")}
    graph = build_graph(InMemorySaver())
    config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    return output(await graph.ainvoke(make_input(plain), config))


def direct_result(payload: Any, thread_id: str = "direct") -> dict[str, Any]:
    """As ``adirect_result``, from code without a running event loop."""
    return asyncio.run(adirect_result(payload, thread_id))


agent = Agent("lazarus-langgraph-example")
agent.langgraph_task(KIND, build_graph, make_input=make_input, make_output=output)
