"""The demo app shipped with Lazarus: word statistics over public-domain novels.

Run it with ``lazarus node-agent --app node_agent.demo_app:agent`` (the default).

Theory of operation
-------------------
The demo proves that recovery is *exact*: a task that was killed, moved or
revoked any number of times ends with the same result as one uninterrupted
pass, and that result can be checked against a direct computation.

Kind ``textstats`` reads a slice ``[start_line, end_line)`` of one bundled text
(``node_agent/corpus/``, four Jane Austen novels from Project Gutenberg). One
*item* is one line. Per item the handler:

1. calls ``ctx.raise_if_cancelled()`` and does the item's *work*: an
   ``asyncio.sleep(work_ms / 1000)`` standing in for a slow model or tool call;
2. folds the line into its state: the words (``[a-z']+`` over the lowercased
   line) are counted, n-grams are counted over the slice's word stream (they
   span line breaks), and the hash chain advances:
   ``chain_i = sha256(chain_{i-1} || line_i.encode("utf-8"))`` with
   ``chain_{start-1} = 32 zero bytes`` (the line without its newline);
3. journals ``{"i": line index, "c": first 16 hex digits of chain_i}`` with
   ``await ctx.record(...)`` — the item's work is never lost once this returns;
4. every ``every`` items saves the whole state with ``await ctx.checkpoint``.

On start it resumes from ``ctx.restored``: the checkpoint's state, then each
journal event after it re-folded from the text (one hash and a word split, no
work), checking the event's chain prefix. Only the item in flight at a crash —
worked but not yet journalled — is worked again: redone work per resume is at
most one item, far below ``every``.

``direct_result(payload)`` computes the same result in a single plain loop with
``collections.Counter`` and no SDK — an independent implementation, so a drill
compares a recovered task's result with it field by field.

State bound: a slice is at most ``MAX_SPAN_LINES`` lines and n-grams at most
``MAX_NGRAM`` words, so a checkpoint holds at most one count per distinct word
and per distinct n-gram of 2,000 lines (about 20,000 words): under 512 KiB of
JSON for every slice of the bundled corpus, below the agent's default
``max_payload_bytes`` (1 MiB). Results are under 4 KiB (``MAX_TOP`` entries per
list).

Kind ``drill`` is ``textstats`` that also appends its side effects (every
step start, acknowledged checkpoint and executed completion, with pid, node
and epoch) to files the drill owns, and optionally writes shared documents;
``lazarus drill`` judges its invariants from them (``lazarus_dev.drill_invariants``).

Two smaller kinds help drills: ``sleep`` (async; sleeps in steps, checkpointing
a step counter) and ``hashchain-sync`` (a plain ``def`` handler run with a
``SyncTaskContext``; a short hash chain journalled and checkpointed).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import math
import os
import random
import re
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, ClassVar

from node_agent.sdk import Agent, SyncTaskContext, TaskContext, TaskFailure

__all__ = [
    "DRILL_SHARED_DOCS",
    "MAX_NGRAM",
    "MAX_SPAN_LINES",
    "MAX_TOP",
    "DrillJob",
    "HashChainJob",
    "SleepJob",
    "TextStatsJob",
    "agent",
    "corpus_texts",
    "direct_hashchain",
    "direct_result",
    "drill_stats_payload",
    "make_payloads",
    "parse_drill_payload",
    "parse_hashchain_payload",
    "parse_sleep_payload",
    "parse_textstats_payload",
    "read_text",
]

MAX_SPAN_LINES = 2000
"""Most lines one ``textstats`` task may cover (bounds its checkpoint state)."""

MAX_NGRAM = 3
"""Longest n-gram ``textstats`` counts."""

MAX_TOP = 25
"""Most entries in each top list of a ``textstats`` result (keeps it under 4 KiB)."""

MAX_WORK_MS = 60_000.0
"""Most simulated work per item, in milliseconds."""

MAX_SLEEP_S = 86_400.0
"""Longest ``sleep`` task, in seconds."""

MAX_SLEEP_CHECKPOINTS = 10_000
"""Most steps (checkpoints) of a ``sleep`` task."""

MAX_HASHCHAIN_ITEMS = 1_000_000
"""Most items of a ``hashchain-sync`` task."""

_STATE_VERSION = 1
_WORD = re.compile(r"[a-z']+")
_ZERO_CHAIN = bytes(32).hex()
_CORPUS_PACKAGE = "node_agent"
_CORPUS_DIR = "corpus"

agent = Agent("lazarus-demo")


# --------------------------------------------------------------------- corpus


@functools.cache
def _corpus_names() -> tuple[str, ...]:
    root = resources.files(_CORPUS_PACKAGE).joinpath(_CORPUS_DIR)
    return tuple(sorted(p.name for p in root.iterdir() if p.name.endswith(".txt")))


def corpus_texts() -> list[str]:
    """Names of the bundled texts (``*.txt`` under ``node_agent/corpus/``), sorted.

    Returns:
        File names such as ``"emma.txt"`` (a fresh list on every call).
    """
    return list(_corpus_names())


def _lines(name: str) -> tuple[str, ...]:
    if not isinstance(name, str) or name not in _corpus_names():
        raise ValueError(f"text: unknown corpus text {name!r}; one of {corpus_texts()}")
    return _load(name)


@functools.cache
def _load(name: str) -> tuple[str, ...]:
    data = resources.files(_CORPUS_PACKAGE).joinpath(_CORPUS_DIR, name).read_bytes()
    text = data.decode("utf-8")
    parts = text.split("\n")
    if parts and parts[-1] == "":
        parts.pop()
    return tuple(parts)


def read_text(name: str) -> list[str]:
    """The lines of bundled text ``name``, without their newlines.

    The file is read once and cached; each call returns a fresh list.

    Args:
        name: one of ``corpus_texts()``.

    Returns:
        Line ``k`` (0-based) of the text at index ``k``.

    Raises:
        ValueError: ``name`` is not a bundled text (the message names field ``text``).
    """
    return list(_lines(name))


# ------------------------------------------------------------------ validation


def _fail(field_name: str, problem: str) -> TaskFailure:
    return TaskFailure(f"payload.{field_name}: {problem}", retryable=False)


def _as_object(payload: Any, known: frozenset[str]) -> Mapping[str, Any]:
    if isinstance(payload, bytes | bytearray):
        try:
            payload = json.loads(payload)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TaskFailure(f"payload: is not JSON: {exc}", retryable=False) from exc
    if not isinstance(payload, Mapping):
        raise TaskFailure(
            f"payload: must be a JSON object, got {type(payload).__name__}", retryable=False
        )
    unknown = sorted(set(payload) - known)
    if unknown:
        raise _fail(str(unknown[0]), f"unknown field; known fields are {sorted(known)}")
    return payload


def _int(obj: Mapping[str, Any], name: str, default: int | None, lo: int, hi: int) -> int:
    if name not in obj:
        if default is None:
            raise _fail(name, "is required")
        return default
    value = obj[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(name, f"must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise _fail(name, f"must be in [{lo}, {hi}], got {value}")
    return value


def _float(obj: Mapping[str, Any], name: str, default: float | None, hi: float) -> float:
    if name not in obj:
        if default is None:
            raise _fail(name, "is required")
        return default
    value = obj[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(name, f"must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or not 0.0 <= number <= hi:
        raise _fail(name, f"must be in [0, {hi:g}], got {value!r}")
    return number


@dataclass(frozen=True, slots=True)
class TextStatsJob:
    """A validated ``textstats`` payload (see ``parse_textstats_payload``)."""

    text: str
    start_line: int
    end_line: int
    every: int = 50
    ngram: int = 2
    top: int = 10
    work_ms: float = 0.0

    @property
    def lines(self) -> int:
        """Number of items (lines) in the slice."""
        return self.end_line - self.start_line


_TEXTSTATS_FIELDS = frozenset(
    {"text", "start_line", "end_line", "every", "ngram", "top", "work_ms"}
)


def parse_textstats_payload(payload: Any) -> TextStatsJob:
    """Validate a ``textstats`` payload.

    Args:
        payload: a JSON object (or its UTF-8 bytes) with fields
            ``text`` (str, one of ``corpus_texts()``, required),
            ``start_line`` (int >= 0, required), ``end_line`` (int, required;
            ``start_line < end_line <= lines in the text`` and at most
            ``MAX_SPAN_LINES`` more than ``start_line``), ``every`` (int >= 0,
            items between checkpoints, 0 = journal only; default 50),
            ``ngram`` (int 1..``MAX_NGRAM``, default 2), ``top`` (int
            0..``MAX_TOP``, default 10), ``work_ms`` (number of milliseconds
            0..``MAX_WORK_MS`` of simulated work per item, default 0).

    Returns:
        The job.

    Raises:
        TaskFailure: (``retryable=False``) a missing, unknown, mistyped or
            out-of-range field; the message starts with ``payload.<field>:``.
    """
    obj = _as_object(payload, _TEXTSTATS_FIELDS)
    if "text" not in obj:
        raise _fail("text", "is required")
    text = obj["text"]
    if not isinstance(text, str) or text not in _corpus_names():
        raise _fail("text", f"unknown corpus text {text!r}; one of {corpus_texts()}")
    n_lines = len(_lines(text))
    start = _int(obj, "start_line", None, 0, n_lines - 1)
    end = _int(obj, "end_line", None, 0, n_lines)
    if start >= end:
        raise _fail("end_line", f"must be greater than start_line ({start}), got {end}")
    if end - start > MAX_SPAN_LINES:
        raise _fail("end_line", f"slice of {end - start} lines is over {MAX_SPAN_LINES}")
    return TextStatsJob(
        text=text,
        start_line=start,
        end_line=end,
        every=_int(obj, "every", 50, 0, 1_000_000),
        ngram=_int(obj, "ngram", 2, 1, MAX_NGRAM),
        top=_int(obj, "top", 10, 0, MAX_TOP),
        work_ms=_float(obj, "work_ms", 0.0, MAX_WORK_MS),
    )


# ------------------------------------------------------------------ textstats


def _top(counts: Mapping[str, int], n: int) -> list[list[Any]]:
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [[key, count] for key, count in ranked[:n]]


def _summary(
    job: TextStatsJob,
    *,
    words: int,
    counts: Mapping[str, int],
    ngrams: Mapping[str, int],
    chain: str,
) -> dict[str, Any]:
    return {
        "lines": job.lines,
        "words": words,
        "distinct_words": len(counts),
        "top_words": _top(counts, job.top),
        "top_ngrams": _top(ngrams, job.top),
        "chain": chain,
        "text": job.text,
        "start_line": job.start_line,
        "end_line": job.end_line,
    }


def direct_result(payload: Any) -> dict[str, Any]:
    """Compute a ``textstats`` result in one plain pass, without the SDK.

    This is the ground truth a recovered task's result must equal. It shares no
    fold code with the handler: words and n-grams are counted with
    ``collections.Counter`` over the slice's whole word stream.

    Args:
        payload: a ``textstats`` payload (see ``parse_textstats_payload``).

    Returns:
        ``{"lines": int, "words": int, "distinct_words": int,
        "top_words": [[word, count], ...], "top_ngrams": [["w1 w2", count], ...],
        "chain": 64 hex digits, "text": str, "start_line": int, "end_line": int}``;
        top lists hold at most ``top`` entries, by count descending then key.

    Raises:
        TaskFailure: a bad payload, as ``parse_textstats_payload``.
    """
    job = parse_textstats_payload(payload)
    lines = _lines(job.text)[job.start_line : job.end_line]
    chain = bytes(32)
    stream: list[str] = []
    for line in lines:
        chain = hashlib.sha256(chain + line.encode("utf-8")).digest()
        stream.extend(_WORD.findall(line.lower()))
    n = job.ngram
    grams = Counter(" ".join(stream[k : k + n]) for k in range(len(stream) - n + 1))
    return _summary(job, words=len(stream), counts=Counter(stream), ngrams=grams, chain=chain.hex())


def _initial_state(job: TextStatsJob) -> dict[str, Any]:
    return {
        "v": _STATE_VERSION,
        "text": job.text,
        "start_line": job.start_line,
        "end_line": job.end_line,
        "ngram": job.ngram,
        "next": job.start_line,
        "words": 0,
        "counts": {},
        "ngrams": {},
        "tail": [],
        "chain": _ZERO_CHAIN,
    }


def _check_state(job: TextStatsJob, state: Any) -> dict[str, Any]:
    """Check a restored checkpoint state belongs to this job; raise TaskFailure if not."""
    if not isinstance(state, dict) or state.get("v") != _STATE_VERSION:
        raise TaskFailure(f"restored: not a textstats v{_STATE_VERSION} state", retryable=False)
    for key in ("text", "start_line", "end_line", "ngram"):
        if state.get(key) != getattr(job, key):
            raise TaskFailure(
                f"restored: checkpoint {key}={state.get(key)!r} does not match "
                f"payload {key}={getattr(job, key)!r}",
                retryable=False,
            )
    nxt = state.get("next")
    if not isinstance(nxt, int) or not job.start_line <= nxt <= job.end_line:
        raise TaskFailure(
            f"restored: checkpoint next={nxt!r} is outside the slice", retryable=False
        )
    return state


def _fold(state: dict[str, Any], line: str, n: int) -> None:
    """Fold one line into ``state`` in place (words, n-grams, hash chain, next)."""
    words = _WORD.findall(line.lower())
    counts: dict[str, int] = state["counts"]
    for word in words:
        counts[word] = counts.get(word, 0) + 1
    if words:
        window: list[str] = state["tail"] + words
        grams: dict[str, int] = state["ngrams"]
        for k in range(len(window) - n + 1):
            gram = " ".join(window[k : k + n])
            grams[gram] = grams.get(gram, 0) + 1
        state["tail"] = window[len(window) - (n - 1) :] if n > 1 else []
    state["words"] += len(words)
    chain = bytes.fromhex(state["chain"])
    state["chain"] = hashlib.sha256(chain + line.encode("utf-8")).hexdigest()
    state["next"] += 1


def _replay(job: TextStatsJob, state: dict[str, Any], events: list[Any]) -> int:
    """Re-fold journal events after the checkpoint; return how many were applied."""
    lines = _lines(job.text)
    applied = 0
    for event in events:
        if not isinstance(event, dict) or not isinstance(event.get("i"), int):
            raise TaskFailure(f"restored: malformed journal event {event!r}", retryable=False)
        index = event["i"]
        if index < state["next"]:
            continue  # already folded (a duplicate); folding is by index, so skip it
        if index != state["next"] or index >= job.end_line:
            raise TaskFailure(
                f"restored: journal event i={index} but the state expects i={state['next']}",
                retryable=False,
            )
        _fold(state, lines[index], job.ngram)
        if event.get("c") != state["chain"][:16]:
            raise TaskFailure(
                f"restored: chain mismatch at line {index} (text changed?)", retryable=False
            )
        applied += 1
    return applied


async def _simulate_work(work_ms: float) -> None:
    """The item's slow work (a model or tool call in a real agent)."""
    if work_ms > 0:
        await asyncio.sleep(work_ms / 1000.0)


@agent.task("textstats", durability="replicated")
async def textstats(ctx: TaskContext) -> dict[str, Any]:
    """Word, n-gram and hash-chain statistics over a slice of a bundled text.

    Payload and result: see ``parse_textstats_payload`` and ``direct_result``.
    Journal events: ``{"i": line index, "c": 16 hex digits of the chain}``.
    Checkpoint state: ``{"v", "text", "start_line", "end_line", "ngram", "next",
    "words", "counts", "ngrams", "tail", "chain"}`` (at most ``MAX_SPAN_LINES``
    lines' worth of counts).

    Raises:
        TaskFailure: a bad payload, or a restored state that does not match it
            (``retryable=False``).
        TaskCancelled: the task must stop.
    """
    return await _textstats(ctx, parse_textstats_payload(ctx.payload), None)


async def _textstats(
    ctx: TaskContext, job: TextStatsJob, effects: _Effects | None
) -> dict[str, Any]:
    """The textstats loop; ``effects`` (the ``drill`` kind) logs each side effect first."""
    restored = ctx.restored
    if restored is not None and restored.state is not None:
        state = _check_state(job, restored.state)
    else:
        state = _initial_state(job)
    # Journal events past the checkpoint count towards the next one, so the
    # journal tail a resume replays stays under ``every`` events.
    done_since_checkpoint = 0
    if restored is not None:
        done_since_checkpoint = _replay(job, state, list(restored.events))
        if job.every and done_since_checkpoint >= job.every and state["next"] < job.end_line:
            # A crash fell between an item's journal event and its checkpoint:
            # take that checkpoint now, or the tail would outgrow ``every``.
            await ctx.checkpoint(state, reason=f"every {job.every} items (after replay)")
            done_since_checkpoint = 0
            if effects is not None:
                effects.log(ctx, "ckpt", state["next"])
    lines = _lines(job.text)
    if effects is not None:
        effects.log(ctx, "start", state["next"])
    while state["next"] < job.end_line:
        ctx.raise_if_cancelled()
        index = state["next"]
        if effects is not None:
            # The owner check right before the side effect, in this thread: after
            # a pause the handler may run before the agent has fenced itself.
            ctx.ensure_owner()
            effects.log(ctx, "step", index)
            await effects.shared_op(ctx, index)
        await _simulate_work(job.work_ms)
        _fold(state, lines[index], job.ngram)
        await ctx.record({"i": index, "c": state["chain"][:16]})
        done_since_checkpoint += 1
        if job.every and done_since_checkpoint >= job.every and state["next"] < job.end_line:
            await ctx.checkpoint(state, reason=f"every {job.every} items (line {index + 1})")
            done_since_checkpoint = 0
            if effects is not None:
                effects.log(ctx, "ckpt", state["next"])
        ctx.progress(
            (state["next"] - job.start_line) / job.lines,
            f"{job.text} line {state['next']}/{job.end_line}",
        )
    if effects is not None:
        ctx.ensure_owner()
        effects.log(ctx, "done", state["next"])
    return _summary(
        job,
        words=state["words"],
        counts=state["counts"],
        ngrams=state["ngrams"],
        chain=state["chain"],
    )


# ---------------------------------------------------------------------- drill

DRILL_SHARED_DOCS = {
    "counter": "pn-counter",
    "set": "or-set",
    "map": "lww-map",
    "log": "rga-log",
}
"""Shared documents a ``drill`` task writes (``<prefix>-<name>`` -> kind), one op per item."""


@dataclass(frozen=True, slots=True)
class DrillJob:
    """A validated ``drill`` payload: a textstats job plus where its side effects go."""

    stats: TextStatsJob
    sink: str
    shared: str = ""


def parse_drill_payload(payload: Any) -> DrillJob:
    """Validate a ``drill`` payload.

    Args:
        payload: a ``textstats`` payload plus ``sink`` (str, required: an
            absolute directory the drill owns) and ``shared`` (str, default
            "": a document-name prefix; when set each item also writes one of
            the ``DRILL_SHARED_DOCS`` documents ``<prefix>-<name>``).

    Returns:
        The job.

    Raises:
        TaskFailure: (``retryable=False``) a bad field, as ``parse_textstats_payload``.
    """
    obj = dict(_as_object(payload, _TEXTSTATS_FIELDS | {"sink", "shared"}))
    sink = obj.pop("sink", None)
    shared = obj.pop("shared", "")
    if not isinstance(sink, str) or not sink.startswith("/"):
        raise _fail("sink", f"must be an absolute directory, got {sink!r}")
    if not isinstance(shared, str) or len(shared) > 64:
        raise _fail("shared", f"must be a document-name prefix (str), got {shared!r}")
    return DrillJob(parse_textstats_payload(obj), sink, shared)


def drill_stats_payload(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The ``textstats`` part of a ``drill`` payload (for ``direct_result``)."""
    return {k: v for k, v in payload.items() if k not in ("sink", "shared")}


class _Effects:
    """Appends a task's side effects to ``<sink>/effects-<node>-<pid>.jsonl`` (O_APPEND).

    The line is written (one ``write``) before the step's work, so a process
    killed during the work has logged it; a torn line is skipped by the reader.
    Acknowledged shared-document operations go to ``acked-<node>-<pid>.jsonl``.
    """

    _files: ClassVar[dict[str, int]] = {}

    def __init__(self, job: DrillJob, node: str) -> None:
        self.job = job
        self.node = node
        os.makedirs(job.sink, exist_ok=True)

    def _fd(self, prefix: str) -> int:
        path = os.path.join(self.job.sink, f"{prefix}-{self.node}-{os.getpid()}.jsonl")
        fd = self._files.get(path)
        if fd is None:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._files[path] = fd
        return fd

    def log(self, ctx: TaskContext, ev: str, step: int) -> None:
        line = json.dumps(
            {
                "t": round(time.time(), 6),
                "pid": os.getpid(),
                "node": ctx.node_id,
                "task": ctx.task_id,
                "epoch": ctx.epoch,
                "ev": ev,
                "step": step,
            },
            separators=(",", ":"),
        )
        os.write(self._fd("effects"), (line + "\n").encode())

    async def shared_op(self, ctx: TaskContext, step: int) -> None:
        if not self.job.shared:
            return
        name = list(DRILL_SHARED_DOCS)[step % 4]
        doc = ctx.shared(f"{self.job.shared}-{name}", kind=DRILL_SHARED_DOCS[name])
        tag = f"{ctx.task_id}:e{ctx.epoch}:{step}"
        # Shielded: an operation that commits while the handler is cancelled is
        # still acknowledged, so its ground-truth line must be written.
        await asyncio.shield(self._op(doc, name, tag, step))

    async def _op(self, doc: Any, name: str, tag: str, step: int) -> None:
        kind = DRILL_SHARED_DOCS[name]
        arg: Any
        if kind == "pn-counter":
            arg = 1 + step % 3
            receipt = await doc.increment(arg)
        elif kind == "or-set":
            arg = tag
            receipt = await doc.add(arg)
        elif kind == "lww-map":
            arg = [f"k{step % 5}", tag]
            receipt = await doc.put(arg[0], arg[1])
        else:
            arg = tag
            receipt = await doc.append(arg)
        entry: dict[str, Any] = {
            "doc": f"shared/{self.job.shared}-{name}",
            "kind": kind,
            "arg": arg,
            "replica": receipt.replica_id,
            "seq": receipt.seq,
        }
        if receipt.at is not None:
            entry["at"] = [receipt.at.wall_ms, receipt.at.logical]
        line = json.dumps(entry, separators=(",", ":")) + "\n"
        os.write(self._fd("acked"), line.encode())


@agent.task("drill", durability="replicated")
async def drill_task(ctx: TaskContext) -> dict[str, Any]:
    """``textstats`` that logs its side effects for ``lazarus drill`` to judge.

    Before each item's work it appends ``step`` to the drill's sink; ``start``
    when the handler begins (the resume point), ``ckpt`` once a checkpoint is
    acknowledged (replicated), ``done`` just before it returns (a completion
    executed). With ``shared`` each item also makes one operation on the
    ``DRILL_SHARED_DOCS`` documents and logs it once acknowledged.
    See ``lazarus_dev.drill_invariants`` for the record format and the checks.

    Returns:
        As ``textstats`` (compare with ``direct_result(drill_stats_payload(p))``).

    Raises:
        TaskFailure: a bad payload (``retryable=False``).
        TaskCancelled: the task must stop.
    """
    job = parse_drill_payload(ctx.payload)
    return await _textstats(ctx, job.stats, _Effects(job, ctx.node_id))


def make_payloads(
    n_tasks: int,
    *,
    lines_per_task: int = 500,
    every: int = 50,
    work_ms: float = 0.0,
    ngram: int = 2,
    top: int = 10,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Slice the corpus into ``n_tasks`` ``textstats`` payloads, deterministically.

    Task ``k`` reads text ``corpus_texts()[k % T]``; the slices of one text start
    at a seeded offset and follow each other, wrapping round the text, so tasks
    overlap once ``n_tasks`` exceeds the corpus.

    Args:
        n_tasks: number of payloads (>= 0).
        lines_per_task: lines per slice, 1..``MAX_SPAN_LINES`` (cut to a text's length).
        every, work_ms, ngram, top: copied into every payload.
        seed: picks the starting offsets (same seed, same payloads).

    Returns:
        ``n_tasks`` payload dicts, each accepted by ``parse_textstats_payload``.

    Raises:
        ValueError: a negative ``n_tasks`` or ``lines_per_task`` out of range.
    """
    if n_tasks < 0:
        raise ValueError(f"n_tasks: must be >= 0, got {n_tasks}")
    if not 1 <= lines_per_task <= MAX_SPAN_LINES:
        raise ValueError(f"lines_per_task: must be in [1, {MAX_SPAN_LINES}], got {lines_per_task}")
    rng = random.Random(seed)
    texts = corpus_texts()
    offsets = {name: rng.randrange(len(_lines(name))) for name in texts}
    payloads: list[dict[str, Any]] = []
    for k in range(n_tasks):
        name = texts[k % len(texts)]
        total = len(_lines(name))
        span = min(lines_per_task, total)
        slots = total - span + 1  # possible start lines
        start = (offsets[name] + (k // len(texts)) * span) % slots
        payloads.append(
            {
                "text": name,
                "start_line": start,
                "end_line": start + span,
                "every": every,
                "ngram": ngram,
                "top": top,
                "work_ms": work_ms,
            }
        )
    return payloads


# ---------------------------------------------------------------------- sleep


@dataclass(frozen=True, slots=True)
class SleepJob:
    """A validated ``sleep`` payload: ``seconds`` in total, in ``checkpoints`` steps."""

    seconds: float
    checkpoints: int = 1


def parse_sleep_payload(payload: Any) -> SleepJob:
    """Validate a ``sleep`` payload.

    Args:
        payload: ``{"seconds": number 0..MAX_SLEEP_S (required),
            "checkpoints": int 1..MAX_SLEEP_CHECKPOINTS (default 1)}``.

    Raises:
        TaskFailure: (``retryable=False``) naming the bad field.
    """
    obj = _as_object(payload, frozenset({"seconds", "checkpoints"}))
    return SleepJob(
        seconds=_float(obj, "seconds", None, MAX_SLEEP_S),
        checkpoints=_int(obj, "checkpoints", 1, 1, MAX_SLEEP_CHECKPOINTS),
    )


@agent.task("sleep", durability="replicated")
async def sleep_task(ctx: TaskContext) -> dict[str, Any]:
    """Sleep ``seconds`` in ``checkpoints`` equal steps, checkpointing ``{"step": k}`` after each.

    A resumed task continues after its newest checkpointed step.

    Returns:
        ``{"steps": checkpoints, "seconds": seconds, "resumed_at_step": k}``
        (k = 0 on a fresh start).

    Raises:
        TaskFailure: a bad payload (``retryable=False``).
        TaskCancelled: the task must stop.
    """
    job = parse_sleep_payload(ctx.payload)
    step = 0
    restored = ctx.restored
    if restored is not None and isinstance(restored.state, dict):
        step = int(restored.state.get("step", 0))
    resumed_at = step
    step_s = job.seconds / job.checkpoints
    while step < job.checkpoints:
        ctx.raise_if_cancelled()
        await asyncio.sleep(step_s)
        step += 1
        await ctx.checkpoint({"step": step}, reason=f"step {step}/{job.checkpoints}")
        ctx.progress(step / job.checkpoints, f"step {step}/{job.checkpoints}")
    return {"steps": job.checkpoints, "seconds": job.seconds, "resumed_at_step": resumed_at}


# ------------------------------------------------------------- hashchain-sync


@dataclass(frozen=True, slots=True)
class HashChainJob:
    """A validated ``hashchain-sync`` payload."""

    items: int = 200
    every: int = 50


def parse_hashchain_payload(payload: Any) -> HashChainJob:
    """Validate a ``hashchain-sync`` payload.

    Args:
        payload: ``{"items": int 1..MAX_HASHCHAIN_ITEMS (default 200),
            "every": int >= 1, items between checkpoints (default 50)}``.

    Raises:
        TaskFailure: (``retryable=False``) naming the bad field.
    """
    obj = _as_object(payload, frozenset({"items", "every"}))
    return HashChainJob(
        items=_int(obj, "items", 200, 1, MAX_HASHCHAIN_ITEMS),
        every=_int(obj, "every", 50, 1, MAX_HASHCHAIN_ITEMS),
    )


def _chain_step(chain_hex: str, i: int) -> str:
    return hashlib.sha256(bytes.fromhex(chain_hex) + f"item-{i}".encode()).hexdigest()


def direct_hashchain(payload: Any) -> dict[str, Any]:
    """The ``hashchain-sync`` result in a plain loop: ``{"items": n, "chain": hex}``.

    ``chain_0`` is 32 zero bytes; ``chain_i = sha256(chain_{i-1} || b"item-i")``.

    Raises:
        TaskFailure: a bad payload, as ``parse_hashchain_payload``.
    """
    job = parse_hashchain_payload(payload)
    chain = _ZERO_CHAIN
    for i in range(1, job.items + 1):
        chain = _chain_step(chain, i)
    return {"items": job.items, "chain": chain}


@agent.task("hashchain-sync", durability="local")
def hashchain_sync(ctx: SyncTaskContext) -> dict[str, Any]:
    """A blocking handler: a hash chain over ``item-1..item-n``, journalled per item.

    Journal events ``{"i": i, "chain": hex}``; checkpoint ``{"i": i, "chain": hex}``
    every ``every`` items. Resumes from the checkpoint plus the newest event.

    Returns:
        As ``direct_hashchain``.

    Raises:
        TaskFailure: a bad payload (``retryable=False``).
        TaskCancelled: the task must stop.
    """
    job = parse_hashchain_payload(ctx.payload)
    i, chain = 0, _ZERO_CHAIN
    restored = ctx.restored
    if restored is not None:
        newest = [restored.state, *restored.events]
        for entry in newest:
            if isinstance(entry, dict) and isinstance(entry.get("i"), int) and entry["i"] >= i:
                i, chain = entry["i"], str(entry["chain"])
    while i < job.items:
        ctx.raise_if_cancelled()
        i += 1
        chain = _chain_step(chain, i)
        ctx.record({"i": i, "chain": chain})
        if i % job.every == 0 and i < job.items:
            ctx.checkpoint({"i": i, "chain": chain}, reason=f"every {job.every} items")
        ctx.progress(i / job.items, f"item {i}/{job.items}")
    return {"items": job.items, "chain": chain}
