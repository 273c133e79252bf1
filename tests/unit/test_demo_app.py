"""The demo app against a fake host of the SDK: crash, resume, compare with a direct pass.

``FakeStore`` plays the checkpoint store (checkpoints cover a journal seq;
``restored()`` builds the ``Restored`` a new owner gets: the newest checkpoint
and the journal events after it). ``FakeHost`` is one assignment's ``_Host``: it
writes to the store and can crash (raise ``Crash`` before or after a write) or
turn cancelled after a number of ``checkpoint`` / ``record`` calls.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node_agent import demo_app
from node_agent.sdk import Restored, SyncTaskContext, TaskCancelled, TaskContext, TaskFailure

CrashMode = Literal["before_write", "after_write"]


class Crash(Exception):
    """The process died here (raised by the fake host)."""


@dataclass
class FakeStore:
    """Durable state across assignments: checkpoints (covering a journal seq) and a journal."""

    checkpoints: list[tuple[int, Any, str]] = field(default_factory=list)
    events: list[Any] = field(default_factory=list)

    def restored(self) -> Restored | None:
        if not self.checkpoints and not self.events:
            return None
        if self.checkpoints:
            covers, state, _ = self.checkpoints[-1]
            seq = len(self.checkpoints)
        else:
            covers, state, seq = 0, None, 0
        return Restored(
            state=copy.deepcopy(state),
            checkpoint_seq=seq,
            covers_journal_seq=covers,
            events=copy.deepcopy(self.events[covers:]),
            journal_seq=len(self.events),
        )


class FakeHost:
    """One assignment's host: writes through to ``store``; may crash or cancel after N calls."""

    def __init__(
        self,
        store: FakeStore,
        *,
        crash_at: int | None = None,
        crash_mode: CrashMode = "before_write",
        cancel_after: int | None = None,
    ) -> None:
        self.store = store
        self.crash_at = crash_at
        self.crash_mode = crash_mode
        self.cancel_after = cancel_after
        self.calls = 0
        self.records = 0
        self.progress_log: list[tuple[float, str]] = []

    def _write(self, apply: Any) -> None:
        if self.cancelled:
            raise TaskCancelled("fake host: cancelled")
        self.calls += 1
        if self.crash_at is not None and self.calls == self.crash_at:
            if self.crash_mode == "after_write":
                apply()
            raise Crash(f"crash at call {self.calls}")
        apply()

    async def checkpoint(self, state: Any, reason: str) -> int:
        snapshot = json.loads(json.dumps(state))  # encoded at call time, as the real codec does
        self._write(
            lambda: self.store.checkpoints.append((len(self.store.events), snapshot, reason))
        )
        return len(self.store.checkpoints)

    async def record(self, event: Any) -> int:
        snapshot = json.loads(json.dumps(event))

        def apply() -> None:
            self.store.events.append(snapshot)
            self.records += 1

        self._write(apply)
        return len(self.store.events)

    def progress(self, ratio: float, message: str) -> None:
        self.progress_log.append((ratio, message))

    @property
    def cancelled(self) -> bool:
        return self.cancel_after is not None and self.calls >= self.cancel_after

    async def wait_cancelled(self) -> None:
        while not self.cancelled:
            await asyncio.sleep(0.001)


def make_ctx(kind: str, payload: Any, host: FakeHost, attempt: int = 1) -> TaskContext:
    return TaskContext(
        task_id="t-1",
        kind=kind,
        epoch=attempt,
        attempt=attempt,
        payload=payload,
        restored=host.store.restored(),
        node_id="n-1",
        host=host,
    )


class WorkCounter:
    """Replaces ``demo_app._simulate_work``: counts the items whose work ran."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, work_ms: float) -> None:
        self.calls += 1


def run_textstats(payload: dict[str, Any], host: FakeHost) -> dict[str, Any]:
    return asyncio.run(demo_app.textstats(make_ctx("textstats", payload, host)))


# ------------------------------------------------------------------- corpus


def test_corpus_has_four_to_eight_complete_texts() -> None:
    texts = demo_app.corpus_texts()
    assert 4 <= len(texts) <= 8
    for name in texts:
        lines = demo_app.read_text(name)
        assert len(lines) > 5000
        joined = "\n".join(lines)
        assert "Gutenberg" not in joined
        assert "*** START OF" not in joined
    assert demo_app.read_text("pride_and_prejudice.txt")[-1].endswith("the means of uniting them.")


def test_read_text_returns_a_fresh_list_and_rejects_unknown_names() -> None:
    first = demo_app.read_text("emma.txt")
    first.clear()
    assert demo_app.read_text("emma.txt")[0] == "EMMA"
    with pytest.raises(ValueError, match="text"):
        demo_app.read_text("no-such-book.txt")


# ------------------------------------------------------------ textstats runs


PAYLOAD = {"text": "persuasion.txt", "start_line": 100, "end_line": 400, "every": 25}


def test_textstats_runs_to_the_direct_result() -> None:
    store = FakeStore()
    host = FakeHost(store)
    result = run_textstats(PAYLOAD, host)
    assert result == demo_app.direct_result(PAYLOAD)
    assert result["lines"] == 300
    assert result["words"] > 1000
    assert [e["i"] for e in store.events] == list(range(100, 400))
    # a checkpoint after every 25 items except the last (the result replaces it)
    assert [covers for covers, _, _ in store.checkpoints] == list(range(25, 300, 25))
    assert host.progress_log[-1][0] == pytest.approx(1.0)
    assert len(json.dumps(result)) < 4096


def test_direct_result_shape_and_tie_break() -> None:
    payload = {"text": "emma.txt", "start_line": 0, "end_line": 60, "ngram": 1, "top": 25}
    result = demo_app.direct_result(payload)
    assert set(result) == {
        "lines",
        "words",
        "distinct_words",
        "top_words",
        "top_ngrams",
        "chain",
        "text",
        "start_line",
        "end_line",
    }
    ranked = [(-c, w) for w, c in result["top_words"]]
    assert ranked == sorted(ranked)
    assert result["top_words"] == result["top_ngrams"]  # 1-grams are the words
    assert len(result["chain"]) == 64


def test_ngrams_span_line_breaks() -> None:
    lines = demo_app.read_text("emma.txt")
    a = next(i for i in range(100, 200) if lines[i].strip() and lines[i + 1].strip())
    job = demo_app.parse_textstats_payload({"text": "emma.txt", "start_line": a, "end_line": a + 2})
    state = demo_app._initial_state(job)
    demo_app._fold(state, lines[a], 2)
    demo_app._fold(state, lines[a + 1], 2)
    words_a = demo_app._WORD.findall(lines[a].lower())
    words_b = demo_app._WORD.findall(lines[a + 1].lower())
    assert sum(state["ngrams"].values()) == len(words_a) + len(words_b) - 1
    assert f"{words_a[-1]} {words_b[0]}" in state["ngrams"]


@settings(max_examples=40, deadline=None)
@given(
    every=st.integers(min_value=1, max_value=12),
    span=st.integers(min_value=1, max_value=60),
    ngram=st.integers(min_value=1, max_value=demo_app.MAX_NGRAM),
    crashes=st.lists(
        st.tuples(
            st.integers(min_value=1, max_value=80),
            st.sampled_from(["before_write", "after_write"]),
        ),
        max_size=4,
    ),
)
def test_textstats_survives_crashes_exactly(
    every: int, span: int, ngram: int, crashes: list[tuple[int, CrashMode]]
) -> None:
    payload = {
        "text": "sense_and_sensibility.txt",
        "start_line": 1000,
        "end_line": 1000 + span,
        "every": every,
        "ngram": ngram,
        "top": 8,
    }
    store = FakeStore()
    counter = WorkCounter()
    with mock.patch.object(demo_app, "_simulate_work", counter):
        for crash_at, mode in crashes:
            host = FakeHost(store, crash_at=crash_at, crash_mode=mode)
            worked_before = counter.calls
            try:
                result = run_textstats(payload, host)
            except Crash:
                redone = (counter.calls - worked_before) - host.records
                # Lost work is at most the item in flight (worked, not yet journalled):
                # one item, so below ``every`` whenever a checkpoint interval is >= 2.
                assert 0 <= redone <= 1
                assert redone < every or every == 1
                continue
            break
        else:
            result = run_textstats(payload, FakeHost(store))
    assert result == demo_app.direct_result(payload)
    indexes = [e["i"] for e in store.events]
    assert indexes == list(range(1000, 1000 + span))  # no journalled item was worked twice
    assert counter.calls - span <= len(crashes)
    restored = store.restored()
    assert restored is not None
    assert len(restored.events) <= every  # the journal tail a resume replays stays short


def test_textstats_stops_when_cancelled_and_resumes() -> None:
    store = FakeStore()
    with pytest.raises(TaskCancelled):
        run_textstats(PAYLOAD, FakeHost(store, cancel_after=37))
    assert len(store.events) == 37 - 1  # one checkpoint among the first 37 calls
    result = run_textstats(PAYLOAD, FakeHost(store))
    assert result == demo_app.direct_result(PAYLOAD)


def test_textstats_resumes_from_events_without_a_checkpoint() -> None:
    payload = {**PAYLOAD, "every": 0}
    store = FakeStore()
    with pytest.raises(Crash):
        run_textstats(payload, FakeHost(store, crash_at=120))
    assert not store.checkpoints
    restored = store.restored()
    assert restored is not None
    assert restored.state is None
    assert len(restored.events) == 119
    assert run_textstats(payload, FakeHost(store)) == demo_app.direct_result(payload)


def test_textstats_is_cancellable_during_simulated_work() -> None:
    payload = {**PAYLOAD, "work_ms": 50.0}

    async def main() -> None:
        host = FakeHost(FakeStore())
        task = asyncio.create_task(demo_app.textstats(make_ctx("textstats", payload, host)))
        await asyncio.sleep(0.12)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert 1 <= len(host.store.events) <= 4

    asyncio.run(main())


def test_replay_rejects_a_journal_that_does_not_match_the_text() -> None:
    store = FakeStore()
    with pytest.raises(Crash):
        run_textstats(PAYLOAD, FakeHost(store, crash_at=10))
    store.events[3]["c"] = "0" * 16
    with pytest.raises(TaskFailure, match="chain mismatch") as info:
        run_textstats(PAYLOAD, FakeHost(store))
    assert info.value.retryable is False


def test_restored_state_of_another_payload_is_rejected() -> None:
    store = FakeStore()
    with pytest.raises(Crash):
        run_textstats(PAYLOAD, FakeHost(store, crash_at=40))
    other = {**PAYLOAD, "end_line": 300}
    with pytest.raises(TaskFailure, match="end_line") as info:
        run_textstats(other, FakeHost(store))
    assert info.value.retryable is False


def test_state_of_a_full_span_stays_under_512_kib() -> None:
    payload = {"text": "emma.txt", "start_line": 0, "end_line": demo_app.MAX_SPAN_LINES}
    job = demo_app.parse_textstats_payload({**payload, "ngram": demo_app.MAX_NGRAM})
    state = demo_app._initial_state(job)
    lines = demo_app.read_text("emma.txt")
    for line in lines[: demo_app.MAX_SPAN_LINES]:
        demo_app._fold(state, line, job.ngram)
    assert len(json.dumps(state, separators=(",", ":"))) < 512 * 1024
    result = demo_app.direct_result({**payload, "ngram": 3, "top": demo_app.MAX_TOP})
    assert len(json.dumps(result)) < 4096


# ----------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("payload", "field_name"),
    [
        ({"start_line": 0, "end_line": 10}, "text"),
        ({"text": "nope.txt", "start_line": 0, "end_line": 10}, "text"),
        ({"text": 3, "start_line": 0, "end_line": 10}, "text"),
        ({"text": "emma.txt", "end_line": 10}, "start_line"),
        ({"text": "emma.txt", "start_line": 0}, "end_line"),
        ({"text": "emma.txt", "start_line": 10, "end_line": 10}, "end_line"),
        ({"text": "emma.txt", "start_line": 20, "end_line": 10}, "end_line"),
        ({"text": "emma.txt", "start_line": -1, "end_line": 10}, "start_line"),
        ({"text": "emma.txt", "start_line": True, "end_line": 10}, "start_line"),
        ({"text": "emma.txt", "start_line": 0, "end_line": 10**6}, "end_line"),
        ({"text": "emma.txt", "start_line": 0, "end_line": 5000}, "end_line"),
        ({"text": "emma.txt", "start_line": 0, "end_line": 10, "every": -1}, "every"),
        ({"text": "emma.txt", "start_line": 0, "end_line": 10, "every": 1.5}, "every"),
        ({"text": "emma.txt", "start_line": 0, "end_line": 10, "ngram": 0}, "ngram"),
        ({"text": "emma.txt", "start_line": 0, "end_line": 10, "ngram": 9}, "ngram"),
        ({"text": "emma.txt", "start_line": 0, "end_line": 10, "top": 1000}, "top"),
        ({"text": "emma.txt", "start_line": 0, "end_line": 10, "work_ms": -1}, "work_ms"),
        ({"text": "emma.txt", "start_line": 0, "end_line": 10, "work_ms": "1"}, "work_ms"),
        ({"text": "emma.txt", "start_line": 0, "end_line": 10, "work_ms": float("nan")}, "work_ms"),
        ({"text": "emma.txt", "start_line": 0, "end_line": 10, "evry": 5}, "evry"),
    ],
)
def test_bad_textstats_payloads_fail_naming_the_field(
    payload: dict[str, Any], field_name: str
) -> None:
    with pytest.raises(TaskFailure, match=rf"^payload\.{field_name}:") as info:
        demo_app.parse_textstats_payload(payload)
    assert info.value.retryable is False
    with pytest.raises(TaskFailure, match=rf"^payload\.{field_name}:"):
        run_textstats(payload, FakeHost(FakeStore()))


@pytest.mark.parametrize("payload", [None, [1, 2], "text", b"not json", b"[1]"])
def test_non_object_payloads_fail(payload: Any) -> None:
    with pytest.raises(TaskFailure, match=r"^payload") as info:
        demo_app.parse_textstats_payload(payload)
    assert info.value.retryable is False


def test_json_bytes_payload_is_accepted() -> None:
    job = demo_app.parse_textstats_payload(json.dumps(PAYLOAD).encode())
    assert job == demo_app.TextStatsJob("persuasion.txt", 100, 400, every=25)


# -------------------------------------------------------------- make_payloads


def test_make_payloads_is_deterministic_round_robin_and_valid() -> None:
    first = demo_app.make_payloads(10, lines_per_task=300, every=20, work_ms=1.5, seed=7)
    assert first == demo_app.make_payloads(10, lines_per_task=300, every=20, work_ms=1.5, seed=7)
    assert first != demo_app.make_payloads(10, lines_per_task=300, every=20, work_ms=1.5, seed=8)
    texts = demo_app.corpus_texts()
    assert [p["text"] for p in first] == [texts[k % len(texts)] for k in range(10)]
    for p in first:
        job = demo_app.parse_textstats_payload(p)
        assert job.lines == 300
        assert (job.every, job.work_ms) == (20, 1.5)


def test_make_payloads_overlaps_when_many_tasks() -> None:
    payloads = demo_app.make_payloads(64, lines_per_task=demo_app.MAX_SPAN_LINES)
    assert len(payloads) == 64
    for p in payloads:
        demo_app.parse_textstats_payload(p)
    persuasion = sorted(
        (p["start_line"], p["end_line"]) for p in payloads if p["text"] == "persuasion.txt"
    )
    assert len(persuasion) == 16  # 32,000 lines of slices over an 8,328-line text
    assert any(b_start < a_end for (_, a_end), (b_start, _) in itertools.pairwise(persuasion))
    assert demo_app.make_payloads(0) == []
    with pytest.raises(ValueError, match="n_tasks"):
        demo_app.make_payloads(-1)
    with pytest.raises(ValueError, match="lines_per_task"):
        demo_app.make_payloads(1, lines_per_task=0)


# --------------------------------------------------------------- other kinds


def test_agent_registers_the_four_kinds() -> None:
    assert demo_app.agent.kinds == ("drill", "hashchain-sync", "sleep", "textstats")
    textstats = demo_app.agent.handler("textstats")
    sync = demo_app.agent.handler("hashchain-sync")
    sleep = demo_app.agent.handler("sleep")
    assert textstats is not None
    assert textstats.is_async
    assert sleep is not None
    assert sleep.is_async
    assert sync is not None
    assert not sync.is_async


def test_sleep_checkpoints_each_step_and_resumes() -> None:
    payload = {"seconds": 0.05, "checkpoints": 5}
    store = FakeStore()
    with pytest.raises(Crash):
        asyncio.run(demo_app.sleep_task(make_ctx("sleep", payload, FakeHost(store, crash_at=4))))
    assert [s for _, s, _ in store.checkpoints] == [{"step": 1}, {"step": 2}, {"step": 3}]
    result = asyncio.run(demo_app.sleep_task(make_ctx("sleep", payload, FakeHost(store))))
    assert result == {"steps": 5, "seconds": 0.05, "resumed_at_step": 3}
    with pytest.raises(TaskFailure, match=r"^payload\.seconds:"):
        demo_app.parse_sleep_payload({"checkpoints": 2})
    with pytest.raises(TaskFailure, match=r"^payload\.checkpoints:"):
        demo_app.parse_sleep_payload({"seconds": 1, "checkpoints": 0})


async def _run_sync(payload: Any, host: FakeHost) -> dict[str, Any]:
    loop = asyncio.get_running_loop()

    def call(awaitable: Awaitable[Any]) -> Any:
        async def wrap() -> Any:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(wrap(), loop).result()

    sctx = SyncTaskContext(make_ctx("hashchain-sync", payload, host), call)
    result: dict[str, Any] = await loop.run_in_executor(None, demo_app.hashchain_sync, sctx)
    return result


def test_hashchain_sync_runs_through_a_blocking_adapter_and_resumes() -> None:
    payload = {"items": 120, "every": 25}
    expected = demo_app.direct_hashchain(payload)
    assert asyncio.run(_run_sync(payload, FakeHost(FakeStore()))) == expected

    store = FakeStore()
    with pytest.raises(Crash):
        asyncio.run(_run_sync(payload, FakeHost(store, crash_at=60, crash_mode="after_write")))
    assert store.checkpoints  # it resumes from a checkpoint plus events
    assert asyncio.run(_run_sync(payload, FakeHost(store))) == expected
    assert [e["i"] for e in store.events] == list(range(1, 121))

    with pytest.raises(TaskCancelled):
        asyncio.run(_run_sync(payload, FakeHost(FakeStore(), cancel_after=10)))
    with pytest.raises(TaskFailure, match=r"^payload\.items:"):
        demo_app.parse_hashchain_payload({"items": 0})


def test_drill_logs_each_side_effect_before_its_work_and_resumes_exactly(tmp_path: Path) -> None:
    """The drill kind: textstats plus start/step/ckpt/done lines the drill's checker reads."""
    from lazarus_dev.drill_invariants import check, read_sink

    stats = {**PAYLOAD, "every": 50}
    payload = {**stats, "sink": str(tmp_path)}
    store = FakeStore()
    with pytest.raises(Crash):
        asyncio.run(demo_app.drill_task(make_ctx("drill", payload, FakeHost(store, crash_at=120))))
    ctx = make_ctx("drill", payload, FakeHost(store), attempt=2)
    result = asyncio.run(demo_app.drill_task(ctx))
    assert result == demo_app.direct_result(demo_app.drill_stats_payload(payload))
    records = read_sink(tmp_path)
    starts = [r for r in records if r.ev == "start"]
    # Write 120 = the record of line 217 (117 records and 2 checkpoints before it).
    assert [(r.epoch, r.step) for r in starts] == [(1, 100), (2, 217)]
    steps = [r.step for r in records if r.ev == "step" and r.epoch == 1]
    assert steps == list(range(100, 218))  # logged before the work: the crashed item too
    assert [r.step for r in records if r.ev == "ckpt"] == [150, 200, 250, 300, 350]
    assert [r.ev for r in records].count("done") == 1
    report = check(records)
    assert report.held, report.violations  # one process per epoch in this test
    assert report.executions == {"t-1": 1}


@pytest.mark.parametrize(
    ("extra", "field"),
    [({}, "sink"), ({"sink": "relative/dir"}, "sink"), ({"sink": "/x", "shared": 3}, "shared")],
)
def test_bad_drill_payloads_fail_naming_the_field(extra: dict[str, Any], field: str) -> None:
    with pytest.raises(TaskFailure, match=f"payload.{field}:"):
        demo_app.parse_drill_payload({**PAYLOAD, **extra})
