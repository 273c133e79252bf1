"""Fan-in (issue 20): what forwarding Sessions through followers costs the leader.

Three real ``lazarus coordinator --fan-in`` replicas (``--auth none``; 1 s
heartbeats with ``--dead-after-s 6 --fence-after-s 4``, as ``heartbeat_bench.py``)
on one local etcd. The simulated nodes of ``heartbeat_bench.py`` (raw
``AgentService.Session`` streams: Hello, then one heartbeat per second each,
random phase) are attached in two placements, alternately, on the same
cluster, each for ``--rounds`` rounds of ``--hold-s`` seconds:

- ``leader``: every node dials the leader (today's path, the baseline);
- ``followers``: every node dials a follower (half each), which holds the
  Session and forwards it over its one Forward stream to the leader.

Per placement it reports the median over rounds of: heartbeats acked per
second (client side), the leader's CPU per acked heartbeat (µs, user +
system of its process over the hold), the same less the leader's idle CPU
(measured first, with no node attached: its election keepalive, ticks and
metrics), the followers' CPU per heartbeat they forwarded, and the ack round
trip p50 / p99 (client side: send -> ack read, so through a follower it
includes both hops). The ratio leader-CPU (followers) / leader-CPU (leader)
is what issue 20's item 4 asks to fall by an order of magnitude: followers
forward heartbeats as liveness digests, in batches that linger 50 ms, and
the leader steps each batch's as one core event.

Results: ``bench/results/fanin.json`` and the "fan-in" section of
``bench/README.md``. Every process started here is stopped at the end.

Run: ``.venv/bin/python bench/fanin_bench.py [--nodes N] [--rounds R] [--hold-s S]``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import sys
import tempfile
import time
import types
import urllib.request
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import RESULTS_DIR, measured_commit, publish, today
from heartbeat_bench import (
    DEAD_AFTER_S,
    FENCE_AFTER_S,
    HEARTBEAT_INTERVAL_S,
    SETTLE_S,
    WorkerProcess,
    _cpu_s,
    _percentile,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from lazarus_dev.devcluster import LocalCluster

RESULTS = RESULTS_DIR / "fanin.json"
SWEEP_RESULTS = RESULTS_DIR / "fanin-sweep.json"
SWEEP_HEADER = (
    "| nodes | acks/s (nodes dial leader / followers) | leader µs/hb, nodes dial the leader | "
    "nodes dial followers | ratio | less idle: dial the leader | dial followers | ratio | "
    "batches/s into the leader | ack p99 ms (leader / followers) | streams ended |\n"
    "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"
)
HEADER = (
    "| nodes dial | acks/s | leader CPU µs per heartbeat | less idle | "
    "followers' CPU µs per heartbeat | ack p50 / p99 ms | streams ended |\n"
    "|---|---:|---:|---:|---:|---|---:|"
)
PLACEMENTS = ("leader", "followers")


async def _idle_cpu_s_per_s(cluster: LocalCluster, leader: int, hold_s: float) -> float:
    """The leader's CPU seconds per second with no node attached."""
    pid = cluster.coordinators[leader].pid or 0
    before, started = _cpu_s(pid), time.monotonic()
    await asyncio.sleep(hold_s)
    return (_cpu_s(pid) - before) / (time.monotonic() - started)


def _families(url: str) -> list[Metric]:
    """The replica's /metrics, parsed."""
    with urllib.request.urlopen(url, timeout=5) as reply:
        return list(text_string_to_metric_families(reply.read().decode()))


def _unsettled_nodes(url: str) -> int:
    """Nodes the replica shows ALIVE or SUSPECT (``lazarus_nodes{state}``), from its /metrics."""
    for family in _families(url):
        if family.name == "lazarus_nodes":
            live = ("ALIVE", "SUSPECT")
            return int(sum(s.value for s in family.samples if s.labels.get("state") in live))
    return 0


async def _settle_previous_round(url: str) -> None:
    """Wait until the previous round's nodes, gone without a Goodbye, are DEAD.

    Their SUSPECT -> DEAD verdicts (and the leader's per-tick judging of
    suspects until then) would otherwise fall into this round's hold and be
    counted as its heartbeats' cost. Bounded by ``DEAD_AFTER_S`` plus 10 s.
    """
    deadline = time.monotonic() + DEAD_AFTER_S + 10.0
    while time.monotonic() < deadline:
        if await asyncio.to_thread(_unsettled_nodes, url) == 0:
            return
        await asyncio.sleep(0.5)
    print("warning: the previous round's nodes are not all DEAD yet", flush=True)


def _forward_counters(url: str) -> dict[str, float]:
    """The replica's Forward counters (``lazarus_forward_batches_total`` and
    ``lazarus_forward_entries_total`` by direction), from its /metrics."""
    found: dict[str, float] = {}
    for family in _families(url):
        if family.name in ("lazarus_forward_batches", "lazarus_forward_entries"):
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    found[f"{family.name}:{sample.labels['direction']}"] = sample.value
    return found


async def _spy(
    prefix: Path | None, pid: int, hold_s: float, role: str = ""
) -> asyncio.subprocess.Process | None:
    """Start ``py-spy record`` on ``pid`` for the hold, or None without a prefix.

    Writes collapsed stacks (``-f raw``, 200 samples/s, non-blocking, only
    the thread holding the GIL: CPU, not waits) to the first free
    ``<prefix><role>-<n>.txt``.
    """
    if prefix is None:
        return None
    n = 1
    while prefix.with_name(f"{prefix.name}{role}-{n}.txt").exists():
        n += 1
    out = prefix.with_name(f"{prefix.name}{role}-{n}.txt")
    return await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("py-spy")),
        "record",
        "-p",
        str(pid),
        "-d",
        str(max(1, int(hold_s) - 1)),
        "-f",
        "raw",
        "-o",
        str(out),
        "-r",
        "200",
        "--nonblocking",
        "--gil",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )


async def _round(
    cluster: LocalCluster,
    leader: int,
    placement: str,
    nodes: int,
    hold_s: float,
    idle_cpu: float,
    py_spy: Path | None = None,
) -> dict[str, Any]:
    """Attach ``nodes`` simulated nodes by ``placement``, hold, measure, detach.

    With ``py_spy`` (a path prefix), the leader and the first follower are
    sampled by ``py-spy record`` over the hold of a ``followers`` round, into
    ``<prefix>-<n>.txt`` and ``<prefix>-follower-<n>.txt`` (collapsed stacks,
    one round each): where each side's per-heartbeat CPU goes.
    """
    followers = [i for i in range(len(cluster.coordinators)) if i != leader]
    targets = [leader, leader] if placement == "leader" else followers
    await _settle_previous_round(cluster.coordinator_metrics[leader])
    prefix = f"{placement[0]}{uuid.uuid4().hex[:6]}"
    workers = [
        await WorkerProcess.spawn(cluster.coordinator_addresses[i], f"{prefix}-{k}")
        for k, i in enumerate(targets)
    ]
    try:
        added = await asyncio.gather(*(w.ask("add", count=nodes // len(workers)) for w in workers))
        attached = sum(int(a["nodes"]) for a in added)
        await asyncio.sleep(SETTLE_S)
        for w in workers:
            await w.ask("take")
        pids = [c.pid or 0 for c in cluster.coordinators]
        url = cluster.coordinator_metrics[leader]
        counters_before = await asyncio.to_thread(_forward_counters, url)
        cpu_before = [_cpu_s(p) for p in pids]
        started = time.monotonic()
        spying = py_spy if placement == "followers" else None
        spies = [
            await _spy(spying, pids[leader], hold_s),
            await _spy(spying, pids[followers[0]], hold_s, "-follower"),
        ]
        await asyncio.sleep(hold_s)
        for spy in spies:
            if spy is not None:
                await asyncio.wait_for(spy.wait(), timeout=30)
        cpu_after = [_cpu_s(p) for p in pids]
        seconds = time.monotonic() - started
        counters_after = await asyncio.to_thread(_forward_counters, url)
        taken = [await w.ask("take") for w in workers]
    finally:
        for w in workers:
            await w.stop()
    latencies = sorted(x for t in taken for x in t["latencies_ms"])
    ends = sum(len(t["ends"]) for t in taken)
    acks = len(latencies)
    cpu = [after - before for before, after in zip(cpu_before, cpu_after, strict=True)]
    follower_cpu = sum(cpu[i] for i in followers)
    return {
        "placement": placement,
        "nodes": attached,
        "seconds": seconds,
        "acks_per_s": acks / seconds,
        "leader_cpu_pct": 100.0 * cpu[leader] / seconds,
        "leader_cpu_us_per_heartbeat": 1e6 * cpu[leader] / acks if acks else float("nan"),
        "leader_marginal_us_per_heartbeat": (
            1e6 * (cpu[leader] - idle_cpu * seconds) / acks if acks else float("nan")
        ),
        "followers_cpu_pct": 100.0 * follower_cpu / seconds,
        "follower_cpu_us_per_heartbeat": (
            1e6 * follower_cpu / acks if acks and placement == "followers" else 0.0
        ),
        "p50_ms": _percentile(latencies, 0.5),
        "p99_ms": _percentile(latencies, 0.99),
        "streams_ended": ends,
        # The leader's Forward streams over the hold (0 when nodes dial the leader).
        "leader_batches_received_per_s": _rate(
            counters_before, counters_after, "lazarus_forward_batches:received", seconds
        ),
        "leader_batches_sent_per_s": _rate(
            counters_before, counters_after, "lazarus_forward_batches:sent", seconds
        ),
        "leader_entries_received_per_s": _rate(
            counters_before, counters_after, "lazarus_forward_entries:received", seconds
        ),
    }


def _rate(before: dict[str, float], after: dict[str, float], key: str, seconds: float) -> float:
    return (after.get(key, 0.0) - before.get(key, 0.0)) / seconds


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fanin-bench-") as tmp:
        cluster = LocalCluster(
            Path(tmp),
            coordinators=3,
            agents=0,
            cluster=f"fibench-{uuid.uuid4().hex[:6]}",
            tls=False,
            durable_redis=False,
            coordinator_args=[
                "--fan-in",
                "--heartbeat-interval-s",
                str(HEARTBEAT_INTERVAL_S),
                "--dead-after-s",
                str(DEAD_AFTER_S),
                "--fence-after-s",
                str(FENCE_AFTER_S),
            ],
        )
        cluster.start()
        try:
            await cluster.ready(40)
            leader, _ = await cluster.leader()
            idle_cpu = await _idle_cpu_s_per_s(cluster, leader, args.hold_s)
            print(f"leader idle: {100 * idle_cpu:.1f} % of a core", flush=True)
            rounds: list[dict[str, Any]] = []
            for nodes in args.sweep or [args.nodes]:
                rounds += await _rounds(cluster, leader, nodes, idle_cpu, args)
        finally:
            await asyncio.to_thread(cluster.stop)
    measured: dict[str, Any] = {
        "commit": measured_commit(),
        "date": today(),
        "config": {"rounds": args.rounds, "hold_s": args.hold_s},
        "leader_idle_cpu_pct": 100.0 * idle_cpu,
        "rounds": rounds,
    }
    if args.sweep:
        measured["config"]["sweep"] = args.sweep
        measured["sweep"] = [
            {"nodes": n, **_summary([x for x in rounds if x["nodes_asked"] == n])}
            for n in args.sweep
        ]
        return measured
    measured["config"]["nodes"] = args.nodes
    summary = _summary(rounds)
    return {
        **measured,
        "summary": summary["placements"],
        "leader_cpu_ratio": summary["leader_cpu_ratio"],
        "leader_marginal_cpu_ratio": summary["leader_marginal_cpu_ratio"],
    }


async def _rounds(
    cluster: LocalCluster, leader: int, nodes: int, idle_cpu: float, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """``args.rounds`` rounds of each placement at ``nodes``, alternating which goes first."""
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = PLACEMENTS if r % 2 == 0 else PLACEMENTS[::-1]
        for placement in order:
            result = await _round(
                cluster, leader, placement, nodes, args.hold_s, idle_cpu, args.py_spy
            )
            result["nodes_asked"] = nodes
            now_leading, _ = await cluster.leader()
            if now_leading != leader:
                raise RuntimeError("the leader changed during the bench; run again")
            print(
                f"{nodes} nodes, round {r + 1} {placement:9s}: "
                f"{result['acks_per_s']:.0f} acks/s, "
                f"leader {result['leader_cpu_us_per_heartbeat']:.0f} us/hb "
                f"({result['leader_marginal_us_per_heartbeat']:.0f} less idle), "
                f"followers {result['follower_cpu_us_per_heartbeat']:.0f} us/hb, "
                f"p50 {result['p50_ms']:.1f} ms p99 {result['p99_ms']:.1f} ms, "
                f"{result['streams_ended']} streams ended; leader batches/s "
                f"in {result['leader_batches_received_per_s']:.0f} "
                f"out {result['leader_batches_sent_per_s']:.0f}",
                flush=True,
            )
            rounds.append(result)
    return rounds


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per placement over ``rounds``, and the followers / leader ratios."""
    placements: dict[str, dict[str, float]] = {}
    for placement in PLACEMENTS:
        mine = [x for x in rounds if x["placement"] == placement]
        placements[placement] = {
            key: statistics.median(x[key] for x in mine)
            for key in (
                "acks_per_s",
                "leader_cpu_us_per_heartbeat",
                "leader_marginal_us_per_heartbeat",
                "follower_cpu_us_per_heartbeat",
                "p50_ms",
                "p99_ms",
                "leader_batches_received_per_s",
            )
        }
        placements[placement]["streams_ended"] = sum(x["streams_ended"] for x in mine)
    base = placements["leader"]["leader_cpu_us_per_heartbeat"]
    base_marginal = placements["leader"]["leader_marginal_us_per_heartbeat"]
    followers = placements["followers"]
    return {
        "placements": placements,
        "leader_cpu_ratio": (
            followers["leader_cpu_us_per_heartbeat"] / base if base else float("nan")
        ),
        "leader_marginal_cpu_ratio": (
            followers["leader_marginal_us_per_heartbeat"] / base_marginal
            if base_marginal
            else float("nan")
        ),
    }


def readme(result: dict[str, Any]) -> str:
    cfg = result["config"]
    rows = []
    for placement in PLACEMENTS:
        s = result["summary"][placement]
        rows.append(
            f"| {placement} | {s['acks_per_s']:,.0f} | "
            f"**{s['leader_cpu_us_per_heartbeat']:.0f}** | "
            f"{s['leader_marginal_us_per_heartbeat']:.0f} | "
            f"{s['follower_cpu_us_per_heartbeat']:.0f} | {s['p50_ms']:.1f} / {s['p99_ms']:.1f} | "
            f"{s['streams_ended']} |"
        )
    table = "\n".join(rows)
    return f"""## Fan-in: leader cost of Sessions held by followers (`fanin_bench.py`)

Commit `{result["commit"]}` measured {result["date"]} on 2 cores. Three `lazarus
coordinator --fan-in` replicas (1 s heartbeats), {cfg["nodes"]:,} simulated nodes
(`heartbeat_bench.py`'s) attached either all to the leader or half to each
follower, alternately, {cfg["rounds"]} round(s) of {cfg["hold_s"]:.0f} s each; medians over
rounds. Everything (3 replicas, etcd, 2 load generators) shares the 2 cores.
`.venv/bin/python bench/fanin_bench.py`; raw figures in `bench/results/fanin.json`.

{HEADER}
{table}

Leader CPU per heartbeat, followers / leader placement: **{result["leader_cpu_ratio"]:.2f}x**
(**{result["leader_marginal_cpu_ratio"]:.2f}x** less the leader's idle
{result["leader_idle_cpu_pct"]:.1f} % of a core, measured first with no node attached).
Followers forward heartbeats as liveness digests in batches that linger
50 ms; the leader steps each batch's heartbeats as one core event and answers
each with a small ack entry, and its tick judges nodes only once a verdict
can change. What is left on the leader is per batch (a gRPC read and
write: about 0.7 ms of CPU per round trip at this rate in grpc-python alone,
`grpc_roundtrip_bench.py`, at about 37 batches/s) and per entry (conversion,
the core's heartbeat rule, the ack, metrics); the followers pay for
terminating the agents' streams (the same gRPC cost per heartbeat), which is
what adding replicas on other machines spreads. The sweep below shows the
leader's share falling as batches fill.
"""


def readme_sweep(result: dict[str, Any]) -> str:
    cfg = result["config"]
    rows = []
    for point in result["sweep"]:
        leader, followers = point["placements"]["leader"], point["placements"]["followers"]
        rows.append(
            f"| {point['nodes']:,} | "
            f"{leader['acks_per_s']:,.0f} / {followers['acks_per_s']:,.0f} | "
            f"{leader['leader_cpu_us_per_heartbeat']:.0f} | "
            f"{followers['leader_cpu_us_per_heartbeat']:.0f} | "
            f"**{point['leader_cpu_ratio']:.2f}x** | "
            f"{leader['leader_marginal_us_per_heartbeat']:.0f} | "
            f"{followers['leader_marginal_us_per_heartbeat']:.0f} | "
            f"**{point['leader_marginal_cpu_ratio']:.2f}x** | "
            f"{followers['leader_batches_received_per_s']:.0f} | "
            f"{leader['p99_ms']:.0f} / {followers['p99_ms']:.0f} | "
            f"{leader['streams_ended'] + followers['streams_ended']} |"
        )
    table = "\n".join(rows)
    return f"""## Fan-in: the leader's cost against load (`fanin_bench.py --sweep`)

Commit `{result["commit"]}` measured {result["date"]} on 2 cores: the setup of the
section above, at each node count (1 heartbeat per second each), both placements,
{cfg["rounds"]} round(s) of {cfg["hold_s"]:.0f} s each, medians.
`.venv/bin/python bench/fanin_bench.py --sweep {",".join(str(n) for n in cfg["sweep"])}`;
raw figures in `bench/results/fanin-sweep.json`. Leader idle:
{result["leader_idle_cpu_pct"]:.1f} % of a core.

{SWEEP_HEADER}
{table}

A forwarded batch costs the leader a gRPC read and a write whatever it
carries; at a fixed 50 ms linger the number of batches is fixed (about 20
per follower per second), so the more heartbeats a batch carries, the less
the leader pays per heartbeat.
"""


def _sigterm_as_interrupt(signum: int, frame: types.FrameType | None) -> None:
    raise KeyboardInterrupt(f"received signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=600, help="simulated nodes per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per placement")
    parser.add_argument("--hold-s", type=float, default=15.0, help="seconds measured per round")
    parser.add_argument("--out", type=Path, default=None, help="JSON results path")
    parser.add_argument("--no-readme", action="store_true", help="do not rewrite bench/README.md")
    parser.add_argument(
        "--quick", action="store_true", help="40 nodes, 1 round of 3 s, no README (a smoke run)"
    )
    parser.add_argument(
        "--sweep",
        type=lambda text: [int(n) for n in text.split(",")],
        default=None,
        metavar="N,N,...",
        help="measure both placements at each node count instead of --nodes (results in "
        "bench/results/fanin-sweep.json unless --out, README section 'fanin-sweep')",
    )
    parser.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        metavar="PREFIX",
        help="sample the leader and the first follower with py-spy over each followers "
        "round (collapsed stacks in PREFIX-<n>.txt and PREFIX-follower-<n>.txt; adds the "
        "sampler's CPU to the machine, not to the replicas)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.rounds, args.hold_s, args.no_readme = 40, 1, 3.0, True
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)  # stop the cluster on SIGTERM too
    result = asyncio.run(bench(args))
    if args.sweep:
        path, section, text = args.out or SWEEP_RESULTS, "fanin-sweep", readme_sweep(result)
    else:
        path, section, text = args.out or RESULTS, "fanin", readme(result)
    publish(path, result, section, text, not args.no_readme)
    return 0


if __name__ == "__main__":
    sys.exit(main())
