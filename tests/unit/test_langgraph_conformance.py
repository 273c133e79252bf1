"""LangGraph's own checkpointer conformance suite against LazarusSaver (local store)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.conformance import checkpointer_test, validate

from node_agent.langgraph import LazarusSaver


@pytest.mark.parametrize("compact_every_events", [0, 3])
async def test_lazarus_saver_passes_the_langgraph_conformance_suite(
    tmp_path: Path, compact_every_events: int
) -> None:
    n = 0

    @checkpointer_test(name="LazarusSaver")
    async def lazarus_saver() -> AsyncIterator[LazarusSaver]:
        nonlocal n
        n += 1
        saver = LazarusSaver.local(
            tmp_path / f"store-{n}", durability="none", compact_every_events=compact_every_events
        )
        try:
            yield saver
        finally:
            saver.close()

    report = await validate(lazarus_saver)
    report.print_report()
    assert report.passed_all_base()
