"""How fast two replicas converge after a partition, and merge throughput per document type.

Pure and in-process (``reconcile`` does no IO): no servers, no network.

1. **Partition heal, through the hub.** Two replicas ``a`` and ``b`` of one
   document are cut off from each other and each writes: ``a`` keys
   ``[0, 0.6 N)``, ``b`` keys ``[0.4 N, N)``, so ``N`` keys differ between
   them, ``0.2 N`` of them written on both sides (LWW conflicts, decided by
   HLC). The HLCs run on a synthetic physical clock (1 ms per write, ``b``
   3 ms skewed). ``a`` stayed attached to the leader, so the canonical replica
   equals it; ``b`` returns. Timed: what production runs on a heal, the
   leader's :class:`reconcile.hub.DocumentHub` and both agents'
   :class:`reconcile.endpoint.ReplicaEndpoint` exchanging DocumentInterest,
   DeltaRequest, DeltaBatch and DeltaAck through the protobuf wire codec of
   ``lazarus/storage/codecs.py``, until no message is in flight. Done for
   ``lww-map`` (one ``crdts.LWWRegister`` per key) and ``or-set`` (``a`` adds
   its keys, ``b`` adds its keys and removes a tenth of the shared ones it saw
   before the partition). The writes themselves are not timed. The canonical
   replica and both sides are checked equal afterwards.
2. **Merge throughput.** For every document type, one replica performs ``M``
   local operations; a fresh replica merges the ``M`` operation deltas one by
   one. Reported: merged operations per second.
3. **The crdts types we do not use**, measured the same way, for the record:
   ``crdts.LWWMap.update`` and ``crdts.RGArray.append`` (see
   ``reconcile/documents.py`` for why they are not used).

Each figure is the median of ``--rounds`` (3) runs. Results:
``bench/results/reconcile.json`` and the "reconcile" section of
``bench/README.md``.

Run: ``.venv/bin/python bench/reconcile_bench.py [--sizes 1000,10000,100000] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lazarus.storage.codecs import deltas_from_pb, deltas_to_pb
from lazarus.v1 import agent_pb2
from reconcile import (
    Add,
    Append,
    Decrement,
    Delete,
    Document,
    HybridLogicalClock,
    Increment,
    LWWMap,
    Operation,
    ORSet,
    Put,
    Remove,
    new_document,
)
from reconcile.endpoint import ReplicaEndpoint
from reconcile.hub import (
    AckReceived,
    DeltasReceived,
    DocDelta,
    DocumentHub,
    DocumentLoaded,
    InterestReceived,
    SendAck,
    SendDeltaRequest,
    SendDeltas,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _report import RESULTS_DIR, machine, measured_commit, today, write_json, write_section

# ---- 1. partition heal ---------------------------------------------------------------


def _split(n: int) -> tuple[range, range]:
    return range(0, int(n * 0.6)), range(int(n * 0.4), n)


def _lww_sides(n: int) -> dict[str, dict[str, Document]]:
    a, b = LWWMap("a"), LWWMap("b")
    a_keys, b_keys = _split(n)
    hlc_a, hlc_b = HybridLogicalClock("a"), HybridLogicalClock("b")
    now = 1_700_000_000_000
    for i in a_keys:
        a.apply(Put(f"key-{i:07d}", {"v": i, "by": "a"}, hlc_a.send(now + i)))
    for i in b_keys:
        b.apply(Put(f"key-{i:07d}", {"v": i, "by": "b"}, hlc_b.send(now + 3 + i)))
    return {"a": {"doc": a}, "b": {"doc": b}}


def _orset_sides(n: int) -> dict[str, dict[str, Document]]:
    a, b = ORSet("a"), ORSet("b")
    a_keys, b_keys = _split(n)
    shared = range(int(n * 0.4), int(n * 0.6))
    for i in shared:  # before the partition: both sides saw these adds
        a.apply(Add(f"key-{i:07d}"))
    b.merge(a)
    for i in a_keys:
        if i not in shared:
            a.apply(Add(f"key-{i:07d}"))
    for i in b_keys:
        if i not in shared:
            b.apply(Add(f"key-{i:07d}"))
    for i in shared[::10]:
        b.apply(Remove(f"key-{i:07d}"))
    return {"a": {"doc": a}, "b": {"doc": b}}


def _wire(deltas: tuple[DocDelta, ...], origin: str) -> tuple[tuple[DocDelta, ...], int]:
    """A DeltaBatch through protobuf bytes, as the Session carries it."""
    batch = agent_pb2.DeltaBatch()
    deltas_to_pb(deltas, origin, batch.deltas)
    blob = batch.SerializeToString()
    return deltas_from_pb(agent_pb2.DeltaBatch.FromString(blob).deltas), len(blob)


def heal(replicas: dict[str, dict[str, Document]]) -> dict[str, float]:
    """Heal through the hub the leader runs; returns timings (s) and counters.

    Side ``a`` stayed attached (the canonical replica equals it); side ``b``
    returns: both send their DocumentInterest, and every command of
    :class:`reconcile.hub.DocumentHub` is carried to the agents'
    :class:`reconcile.endpoint.ReplicaEndpoint` (and their answers back) through
    the shared-document wire codec, until no message is left in flight.
    """
    hub = DocumentHub()
    endpoints = {}
    for node, docs in replicas.items():
        endpoint = ReplicaEndpoint(node)
        for doc_id, doc in docs.items():
            endpoint.adopt(doc_id, doc)
        endpoints[node] = endpoint
    for doc_id, doc in replicas["a"].items():
        canonical = new_document(doc.kind, "coordinator")
        canonical.merge_delta(doc.delta_since(canonical.state_vector()))
        hub.step(DocumentLoaded(doc_id, canonical))
    hub_s = endpoint_s = codec_s = 0.0
    messages = wire_bytes = 0
    start = time.perf_counter()
    inbox: list[Any] = [InterestReceived(node, endpoints[node].interest()) for node in ("a", "b")]
    while inbox:
        event = inbox.pop(0)
        t0 = time.perf_counter()
        commands = hub.step(event)
        hub_s += time.perf_counter() - t0
        for cmd in commands:
            messages += 1
            endpoint = endpoints.get(getattr(cmd, "node_id", ""))
            if endpoint is None:
                continue
            if isinstance(cmd, SendDeltas):
                t1 = time.perf_counter()
                deltas, size = _wire(cmd.deltas, "coordinator")
                t2 = time.perf_counter()
                _, acked = endpoint.merge(deltas)
                t3 = time.perf_counter()
                codec_s, endpoint_s, wire_bytes = (
                    codec_s + t2 - t1,
                    endpoint_s + t3 - t2,
                    wire_bytes + size,
                )
                inbox.append(AckReceived(cmd.node_id, cmd.batch_id, acked))
            elif isinstance(cmd, SendDeltaRequest):
                t1 = time.perf_counter()
                batch = endpoint.answer_request(cmd.session_id, cmd.have)
                t2 = time.perf_counter()
                deltas, size = _wire(batch.deltas, cmd.node_id)
                t3 = time.perf_counter()
                endpoint_s, codec_s, wire_bytes = (
                    endpoint_s + t2 - t1,
                    codec_s + t3 - t2,
                    wire_bytes + size,
                )
                inbox.append(DeltasReceived(cmd.node_id, batch.batch_id, deltas, batch.session_id))
            elif isinstance(cmd, SendAck):
                again = endpoint.on_ack(cmd.batch_id, cmd.merged)
                if again is not None:
                    deltas, size = _wire(again.deltas, cmd.node_id)
                    wire_bytes += size
                    inbox.append(DeltasReceived(cmd.node_id, again.batch_id, deltas))
        if messages > 10_000:
            raise RuntimeError("the hub did not go quiet after 10,000 messages")
    total_s = time.perf_counter() - start
    for doc_id, doc in replicas["b"].items():
        canonical = hub.document(doc_id)
        assert canonical is not None
        if canonical.value() != doc.value() or endpoints["a"].docs[doc_id].value() != doc.value():
            raise RuntimeError(
                f"{doc_id}: the canonical replica and the sides differ after the heal"
            )
    return {
        "total_s": total_s,
        "hub_step_s": hub_s,
        "endpoint_s": endpoint_s,
        "wire_codec_s": codec_s,
        "messages": messages,
        "wire_bytes": wire_bytes,
    }


def bench_heal(kind: str, n: int, rounds: int) -> dict[str, Any]:
    build = _lww_sides if kind == "lww-map" else _orset_sides
    runs: list[dict[str, float]] = []
    setup_s: list[float] = []
    for _ in range(rounds):
        gc.collect()
        t0 = time.perf_counter()
        replicas = build(n)
        setup_s.append(time.perf_counter() - t0)
        gc.disable()
        try:
            runs.append(heal(replicas))
        finally:
            gc.enable()
        a, b = replicas["a"]["doc"], replicas["b"]["doc"]
        if a.value() != b.value() or a.state_vector() != b.state_vector():
            raise RuntimeError(f"{kind} n={n}: replicas differ after converging")
        del replicas, a, b
    med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    print(
        f"heal {kind:8s} n={n:>7,}: {med['total_s']:.3f} s "
        f"(hub {med['hub_step_s']:.3f}, agents {med['endpoint_s']:.3f}, "
        f"wire codec {med['wire_codec_s']:.3f}), {med['wire_bytes'] / 1e6:.1f} MB",
        flush=True,
    )
    return {
        "kind": kind,
        "divergent_keys": n,
        "median": med,
        "runs": runs,
        "setup_writes_s_median": statistics.median(setup_s),
    }


# ---- 2. merge throughput per type ---------------------------------------------------


def _ops(kind: str, m: int) -> list[Operation]:
    hlc = HybridLogicalClock("src")
    ops: list[Operation] = []
    for i in range(m):
        if kind == "g-counter":
            ops.append(Increment(1 + i % 3))
        elif kind == "pn-counter":
            ops.append(Increment(2) if i % 3 else Decrement(1))
        elif kind == "or-set":
            ops.append(Remove(f"m{i - 1}") if i % 4 == 3 else Add(f"m{i}"))
        elif kind == "lww-map":
            at = hlc.send(1_700_000_000_000 + i)
            ops.append(Delete(f"k{i - 1}", at) if i % 5 == 4 else Put(f"k{i % 2000}", i, at))
        elif kind == "mv-map":
            ops.append(Delete(f"k{i - 1}") if i % 5 == 4 else Put(f"k{i % 2000}", i))
        elif kind == "rga-log":
            ops.append(Append({"role": "user" if i % 2 else "assistant", "text": f"msg {i}"}))
    return ops


def bench_merge(kind: str, m: int, rounds: int) -> dict[str, Any]:
    source = new_document(kind, "src")
    deltas = [source.apply(op) for op in _ops(kind, m)]
    warm = new_document(kind, "warm")  # first use of the crdts protocol checks is slower
    for delta in deltas[:200]:
        warm.merge_delta(delta)
    rates: list[float] = []
    for _ in range(rounds):
        target = new_document(kind, "dst")
        gc.collect()
        t0 = time.perf_counter()
        for delta in deltas:
            target.merge_delta(delta)
        elapsed = time.perf_counter() - t0
        if target.value() != source.value():
            raise RuntimeError(f"{kind}: merged replica differs from its source")
        rates.append(m / elapsed)
    med = statistics.median(rates)
    print(f"merge {kind:10s} {m:>6,} op deltas: {med:,.0f} merges/s", flush=True)
    return {"kind": kind, "ops": m, "merges_per_s_median": med, "runs": rates}


# ---- 3. crdts types we do not use -------------------------------------------------------


def _time_it(fn: Callable[[], None], rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def bench_crdts_baselines(rounds: int) -> list[dict[str, Any]]:
    from crdts import LWWMap as CrdtsLWWMap
    from crdts import ORSet as CrdtsORSet
    from crdts import RGArray, ScalarClock

    out = []
    for m in (1_000, 4_000):

        def lww_updates(m: int = m) -> None:
            source = CrdtsLWWMap(clock=ScalarClock(uuid=b"bench-lww-map-01"))
            updates = [source.set(f"k{i}", i, "src") for i in range(m)]
            target = CrdtsLWWMap(clock=ScalarClock(uuid=b"bench-lww-map-01"))
            for update in updates:
                target.update(update)

        def rga_appends(m: int = m) -> None:
            clock = ScalarClock(uuid=b"bench-rgarray-01")
            log = RGArray(items=CrdtsORSet(clock=clock), clock=clock)
            for i in range(m):
                log.append(("src", i, f"msg {i}"), "src")

        cases = (("crdts.LWWMap set+merge", lww_updates), ("crdts.RGArray append", rga_appends))
        for name, fn in cases:
            seconds = _time_it(fn, rounds)
            rate = m / seconds
            print(f"baseline {name:24s} m={m:>5,}: {rate:,.0f} ops/s", flush=True)
            out.append({"what": name, "ops": m, "seconds_median": seconds, "ops_per_s": rate})
    return out


# ---- report ---------------------------------------------------------------------------------


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        "## Reconciliation (`reconcile_bench.py`)",
        "",
        "Pure, in-process. **Partition heal**: replicas `a` and `b` each write during a partition",
        "so that N keys differ (`a` keys [0, 0.6N), `b` keys [0.4N, N): 0.2N written on both",
        "sides). `a` stayed attached (the canonical replica equals it), `b` returns; timed: the",
        "path production runs, the leader's `DocumentHub` and both agents' `ReplicaEndpoint`s",
        "exchanging DocumentInterest, DeltaRequest, DeltaBatch and DeltaAck through the",
        "protobuf wire codec (`lazarus/storage/codecs.py`) until no message is in flight.",
        "**Merge throughput**: a fresh replica merges M operation deltas one at a time.",
        "",
        f"Measured {result['date']} at commit `{result.get('commit', 'unknown')}` "
        f"on {m['cpus']} cores, Python {m['python']}; "
        f"median of {result['rounds']} runs.",
        "`.venv/bin/python bench/reconcile_bench.py`; raw figures in "
        "`bench/results/reconcile.json`.",
        "",
        "| document | divergent keys | converge s (median) | hub s | agents s | wire codec s "
        "| messages | bytes shipped |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["heal"]:
        med = row["median"]
        lines.append(
            f"| {row['kind']} | {row['divergent_keys']:,} | **{med['total_s']:.3f}** "
            f"| {med['hub_step_s']:.3f} | {med['endpoint_s']:.3f} | {med['wire_codec_s']:.3f} "
            f"| {int(med['messages'])} | {med['wire_bytes'] / 1e6:.1f} MB |"
        )
    lines += [
        "",
        "| document | built on | op deltas merged | merges/s (median) |",
        "|---|---|---:|---:|",
    ]
    built_on = {
        "g-counter": "crdts.CounterSet",
        "pn-counter": "crdts.CounterSet",
        "or-set": "ours (add-wins, dots)",
        "lww-map": "crdts.LWWRegister per key",
        "mv-map": "ours (dotted version vectors)",
        "rga-log": "ours (append-only RGA)",
    }
    for row in result["merge"]:
        lines.append(
            f"| {row['kind']} | {built_on[row['kind']]} | {row['ops']:,} "
            f"| {row['merges_per_s_median']:,.0f} |"
        )
    lines += [
        "",
        "The `crdts` types we replaced, measured the same way for the record (see",
        "`reconcile/documents.py` for the correctness reasons; `crdts.RGArray` also slows down",
        "as the log grows, O(n) per append):",
        "",
        "| crdts type | ops | ops/s (median) |",
        "|---|---:|---:|",
    ]
    for row in result["crdts_baselines"]:
        lines.append(f"| {row['what']} | {row['ops']:,} | {row['ops_per_s']:,.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--merge-ops", type=int, default=5000)
    parser.add_argument("--dry-run", action="store_true", help="print only; write no files")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    started = time.perf_counter()
    heal_rows = [bench_heal(kind, n, args.rounds) for kind in ("lww-map", "or-set") for n in sizes]
    kinds = ["g-counter", "pn-counter", "or-set", "lww-map", "mv-map", "rga-log"]
    merge_rows = [bench_merge(kind, args.merge_ops, args.rounds) for kind in kinds]
    baselines = bench_crdts_baselines(args.rounds)
    commit = measured_commit()
    result = {
        "date": today(),
        "commit": commit or "unknown",
        "rounds": args.rounds,
        "heal": heal_rows,
        "merge": merge_rows,
        "crdts_baselines": baselines,
        "bench_wall_s": time.perf_counter() - started,
    }
    if not args.dry_run:
        write_json(RESULTS_DIR / "reconcile.json", result)
        write_section("reconcile", markdown({**result, "machine": machine()}))
    print(f"done in {result['bench_wall_s']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
