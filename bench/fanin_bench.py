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
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import RESULTS_DIR, measured_commit, today, write_json, write_section
from heartbeat_bench import (
    DEAD_AFTER_S,
    FENCE_AFTER_S,
    HEARTBEAT_INTERVAL_S,
    SETTLE_S,
    WorkerProcess,
    _cpu_s,
    _percentile,
)

from lazarus_dev.devcluster import LocalCluster

RESULTS = RESULTS_DIR / "fanin.json"
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


async def _round(
    cluster: LocalCluster,
    leader: int,
    placement: str,
    nodes: int,
    hold_s: float,
    idle_cpu: float,
) -> dict[str, Any]:
    """Attach ``nodes`` simulated nodes by ``placement``, hold, measure, detach."""
    followers = [i for i in range(len(cluster.coordinators)) if i != leader]
    targets = [leader, leader] if placement == "leader" else followers
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
        cpu_before = [_cpu_s(p) for p in pids]
        started = time.monotonic()
        await asyncio.sleep(hold_s)
        cpu_after = [_cpu_s(p) for p in pids]
        seconds = time.monotonic() - started
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
    }


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
            for r in range(args.rounds):
                order = PLACEMENTS if r % 2 == 0 else PLACEMENTS[::-1]
                for placement in order:
                    result = await _round(
                        cluster, leader, placement, args.nodes, args.hold_s, idle_cpu
                    )
                    now_leading, _ = await cluster.leader()
                    if now_leading != leader:
                        raise RuntimeError("the leader changed during the bench; run again")
                    print(
                        f"round {r + 1} {placement:9s}: {result['acks_per_s']:.0f} acks/s, "
                        f"leader {result['leader_cpu_us_per_heartbeat']:.0f} us/hb "
                        f"({result['leader_marginal_us_per_heartbeat']:.0f} less idle), "
                        f"followers {result['follower_cpu_us_per_heartbeat']:.0f} us/hb, "
                        f"p50 {result['p50_ms']:.1f} ms p99 {result['p99_ms']:.1f} ms, "
                        f"{result['streams_ended']} streams ended",
                        flush=True,
                    )
                    rounds.append(result)
        finally:
            await asyncio.to_thread(cluster.stop)
    summary = {}
    for placement in PLACEMENTS:
        mine = [x for x in rounds if x["placement"] == placement]
        summary[placement] = {
            key: statistics.median(x[key] for x in mine)
            for key in (
                "acks_per_s",
                "leader_cpu_us_per_heartbeat",
                "leader_marginal_us_per_heartbeat",
                "follower_cpu_us_per_heartbeat",
                "p50_ms",
                "p99_ms",
            )
        }
        summary[placement]["streams_ended"] = sum(x["streams_ended"] for x in mine)
    base = summary["leader"]["leader_cpu_us_per_heartbeat"]
    ratio = summary["followers"]["leader_cpu_us_per_heartbeat"] / base if base else float("nan")
    base_marginal = summary["leader"]["leader_marginal_us_per_heartbeat"]
    marginal_ratio = (
        summary["followers"]["leader_marginal_us_per_heartbeat"] / base_marginal
        if base_marginal
        else float("nan")
    )
    return {
        "commit": measured_commit(),
        "date": today(),
        "config": {"nodes": args.nodes, "rounds": args.rounds, "hold_s": args.hold_s},
        "leader_idle_cpu_pct": 100.0 * idle_cpu,
        "rounds": rounds,
        "summary": summary,
        "leader_cpu_ratio": ratio,
        "leader_marginal_cpu_ratio": marginal_ratio,
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
can change. What is left on the leader is per batch (a gRPC read and write)
and per entry (conversion, the core's heartbeat rule, the ack); the
followers pay for terminating the agents' streams, which is what adding
replicas on other machines spreads.
"""


def _sigterm_as_interrupt(signum: int, frame: types.FrameType | None) -> None:
    raise KeyboardInterrupt(f"received signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=600, help="simulated nodes per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per placement")
    parser.add_argument("--hold-s", type=float, default=15.0, help="seconds measured per round")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results path")
    parser.add_argument("--no-readme", action="store_true", help="do not rewrite bench/README.md")
    parser.add_argument(
        "--quick", action="store_true", help="40 nodes, 1 round of 3 s, no README (a smoke run)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.rounds, args.hold_s, args.no_readme = 40, 1, 3.0, True
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)  # stop the cluster on SIGTERM too
    result = asyncio.run(bench(args))
    write_json(args.out, result)
    if not args.no_readme:
        write_section("fanin", readme(result))
    print(readme(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
