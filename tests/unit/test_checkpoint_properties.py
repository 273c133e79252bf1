"""Hypothesis properties of the checkpoint store against a plain in-memory model.

The state machine drives save / append / prune / fork / reopen with arbitrary
epochs and covered seqs, and after every step checks that ``list``,
``load_latest``, ``load_at_or_before`` and ``recover`` agree with the model:
ordering by (covers_journal_seq, seq), epoch fencing, the future-seq rule,
prune's terminal preservation and journal compaction.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from node_agent.checkpoint import (
    Checkpoint,
    CheckpointStore,
    CheckpointStoreError,
    FutureJournalSeq,
    InvalidArgument,
    PrunePolicy,
    StaleEpoch,
    UnknownCheckpoint,
)

TASKS = st.sampled_from(["a", "b", "c/x@1"])
PAYLOADS = st.binary(max_size=64)


@dataclass
class ModelCheckpoint:
    seq: int
    epoch: int
    covers: int
    terminal: bool
    payload: bytes


@dataclass
class ModelTask:
    epoch: int = 0
    last_journal: int = 0
    last_checkpoint: int = 0
    events: dict[int, bytes] = field(default_factory=dict)
    checkpoints: dict[int, ModelCheckpoint] = field(default_factory=dict)

    def ordered(self) -> list[ModelCheckpoint]:
        return sorted(self.checkpoints.values(), key=lambda c: (c.covers, c.seq))


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="lazarus-prop-"))
        self.model: dict[str, ModelTask] = {}
        self.mode = "sync"
        self.store: CheckpointStore | None = None

    @initialize(mode=st.sampled_from(["sync", "group", "none"]))
    def open_store(self, mode: str) -> None:
        self.mode = mode
        self.store = CheckpointStore(self.dir, durability=mode, compression="zstd")

    @property
    def s(self) -> CheckpointStore:
        assert self.store is not None
        return self.store

    def task(self, task_id: str) -> ModelTask:
        return self.model.setdefault(task_id, ModelTask())

    def _epoch(self, t: ModelTask, delta: int) -> int:
        return max(0, t.epoch + delta)

    @rule(task_id=TASKS, delta=st.integers(-1, 1), payload=PAYLOADS)
    def append(self, task_id: str, delta: int, payload: bytes) -> None:
        t = self.task(task_id)
        epoch = self._epoch(t, delta)
        if epoch < t.epoch:
            try:
                self.s.append(task_id, payload, epoch=epoch)
            except StaleEpoch:
                return
            raise AssertionError("stale append accepted")
        seq = self.s.append(task_id, payload, epoch=epoch)
        t.last_journal += 1
        assert seq == t.last_journal
        t.events[seq] = payload
        t.epoch = epoch

    @rule(task_id=TASKS, payloads=st.lists(PAYLOADS, min_size=2, max_size=6))
    def append_many(self, task_id: str, payloads: list[bytes]) -> None:
        for payload in payloads:
            self.append(task_id, 0, payload)

    @rule(
        task_id=TASKS,
        delta=st.integers(-1, 1),
        back=st.integers(-1, 6),
        terminal=st.booleans(),
        payload=PAYLOADS,
    )
    def save(self, task_id: str, delta: int, back: int, terminal: bool, payload: bytes) -> None:
        t = self.task(task_id)
        epoch = self._epoch(t, delta)
        covers = max(0, t.last_journal - back)  # back = -1 → one past the journal's end
        cp = Checkpoint(task_id, epoch, payload, covers, terminal)
        if epoch < t.epoch:
            try:
                self.s.save(cp)
            except StaleEpoch:
                return
            raise AssertionError("stale save accepted")
        if covers > t.last_journal:
            try:
                self.s.save(cp)
            except FutureJournalSeq:
                return
            raise AssertionError("future covers accepted")
        out = self.s.save(cp)
        t.last_checkpoint += 1
        assert (out.seq, out.covers_journal_seq, out.terminal) == (
            t.last_checkpoint,
            covers,
            terminal,
        )
        t.checkpoints[out.seq] = ModelCheckpoint(out.seq, epoch, covers, terminal, payload)
        t.epoch = epoch

    @rule(
        task_id=TASKS,
        cutoff=st.integers(0, 12),
        preserve=st.booleans(),
        compact=st.booleans(),
        seq_cutoff=st.integers(0, 12),
    )
    def prune(
        self, task_id: str, cutoff: int, preserve: bool, compact: bool, seq_cutoff: int
    ) -> None:
        t = self.task(task_id)
        report = self.s.prune(task_id, PrunePolicy(cutoff, preserve, compact, seq_cutoff))
        keep = None
        if preserve:
            terminals = [c for c in t.ordered() if c.terminal]
            keep = terminals[-1].seq if terminals else None
        before = len(t.checkpoints)
        t.checkpoints = {
            s: c
            for s, c in t.checkpoints.items()
            if (c.covers, s) >= (cutoff, seq_cutoff) or s == keep
        }
        assert report.pruned_count == before - len(t.checkpoints)
        assert report.retained_count == len(t.checkpoints)
        assert report.preserved_terminal_ref == (None if keep is None else f"{task_id}@{keep}")
        if compact and t.checkpoints:
            floor = min(c.covers for c in t.checkpoints.values())
            gone = [s for s in t.events if s <= floor]
            assert report.compacted_events == len(gone)
            for s in gone:
                del t.events[s]

    @precondition(lambda self: any(t.checkpoints for t in self.model.values()))
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        task_id = data.draw(
            st.sampled_from(sorted(k for k, t in self.model.items() if t.checkpoints))
        )
        t = self.model[task_id]
        seq = data.draw(st.sampled_from(sorted(t.checkpoints)))
        new_id = self.s.fork(f"{task_id}@{seq}")
        src = t.checkpoints[seq]
        forked = self.s.load_latest(new_id)
        assert forked is not None
        assert (forked.payload, forked.epoch, forked.info.parent_ref) == (
            src.payload,
            src.epoch,
            f"{task_id}@{seq}",
        )

    @rule(task_id=TASKS, seq=st.integers(1, 40))
    def load_by_ref(self, task_id: str, seq: int) -> None:
        t = self.task(task_id)
        if seq in t.checkpoints:
            assert self.s.load(f"{task_id}@{seq}").payload == t.checkpoints[seq].payload
        else:
            try:
                self.s.load(f"{task_id}@{seq}")
            except UnknownCheckpoint:
                return
            raise AssertionError("unknown ref returned a checkpoint")

    @rule()
    def reopen(self) -> None:
        self.s.close()
        self.store = CheckpointStore(self.dir, durability=self.mode, compression="zstd")

    @rule(task_id=TASKS, at=st.integers(0, 15))
    def at_or_before(self, task_id: str, at: int) -> None:
        t = self.task(task_id)
        want = [c for c in t.ordered() if c.covers <= at]
        got = self.s.load_at_or_before(task_id, at)
        if not want:
            assert got is None
        else:
            assert got is not None
            assert (got.seq, got.payload) == (want[-1].seq, want[-1].payload)

    @invariant()
    def matches_model(self) -> None:
        if self.store is None:
            return
        for task_id, t in self.model.items():
            listed = self.s.list(task_id)
            assert [(i.seq, i.covers_journal_seq, i.epoch, i.terminal) for i in listed] == [
                (c.seq, c.covers, c.epoch, c.terminal) for c in t.ordered()
            ]
            rec = self.s.recover(task_id)
            ordered = t.ordered()
            if ordered:
                assert rec.checkpoint is not None
                assert (rec.checkpoint.seq, rec.checkpoint.payload) == (
                    ordered[-1].seq,
                    ordered[-1].payload,
                )
                after = ordered[-1].covers
            else:
                assert rec.checkpoint is None
                after = 0
            assert [(e.seq, e.payload) for e in rec.events] == sorted(
                (s, p) for s, p in t.events.items() if s > after
            )

    def teardown(self) -> None:
        if self.store is not None:
            self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CheckpointStore]:
    s = CheckpointStore(tmp_path_factory.mktemp("fuzz"), durability="none")
    yield s
    s.close()


GARBAGE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=300),
    st.binary(max_size=32),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    op=st.sampled_from(["save", "append", "load", "latest", "at", "replay", "fork", "prune"]),
    a=GARBAGE,
    b=GARBAGE,
    c=GARBAGE,
)
def test_garbage_input_gets_a_typed_error_never_a_crash(
    shared_store: CheckpointStore, op: str, a: Any, b: Any, c: Any
) -> None:
    s = shared_store
    calls = {
        "save": lambda: s.save(Checkpoint(a, b, c)),
        "append": lambda: s.append(a, b, epoch=c),
        "load": lambda: s.load(a),
        "latest": lambda: s.load_latest(a),
        "at": lambda: s.load_at_or_before(a, b),
        "replay": lambda: s.replay(a, b),
        "fork": lambda: s.fork(a, b, new_task_id=c),
        "prune": lambda: s.prune(a, PrunePolicy(b, c)),
    }
    error: CheckpointStoreError | None = None
    try:
        calls[op]()
    except CheckpointStoreError as err:  # typed: bad field, unknown ref, stale epoch...
        error = err
    if isinstance(error, InvalidArgument):
        assert error.field
        assert str(error).startswith(error.field)
    # the store is still usable afterwards
    assert s.save(Checkpoint("canary", 10**6, b"ok")).seq >= 1
