"""What one message round trip on a gRPC stream costs a grpc-python asyncio server.

Why: the fan-in benchmarks (``fanin_bench.py``) show a cost per Forward batch on
the leader, and a cost per heartbeat on the followers, that no change to
Lazarus's own code moved. This isolates the library: a ``grpc.aio`` server
with one bidirectional stream (no Lazarus code at all) reads a message and
writes one back, as a leader does per Forward batch and a replica does per
agent heartbeat; a client process paces the requests at a fixed rate. The
server's CPU time over the hold (user + system of all its threads, read by
the server itself with ``time.process_time``, nanosecond resolution, and
passed over a pipe: /proc's clock ticks of 10 ms could read 0 for a quick
run's 40 round trips), divided by the round trips, is the figure; with no
call open it idles at about 0.05 % of a core, so nearly all of it is per
message.

Messages are ``ForwardBatch`` es of ``--entries`` heartbeat acks (a fan-in
batch's shape); serialising them is a microsecond or two of that.

Run: ``.venv/bin/python bench/grpc_roundtrip_bench.py`` (about 1 minute).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import statistics
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import RESULTS_DIR, measured_commit, publish, today

from lazarus.v1 import replica_pb2

RESULTS = RESULTS_DIR / "grpc-roundtrip.json"
RATES = (10, 40, 200, 1000)
"""Round trips per second: 40 is about a fan-in leader's Forward batches per
follower and direction at 600 nodes; 1000 a follower's agent heartbeats."""


def _batch(entries: int) -> replica_pb2.ForwardBatch:
    batch = replica_pb2.ForwardBatch()
    for i in range(entries):
        entry = batch.entries.add()
        entry.session_id = f"{i:032x}"
        ack = entry.heartbeat_ack
        ack.seq, ack.term, ack.node_state = 5, 3, 1
        ack.sent_at_unix_ms, ack.received_at_unix_ms = 1_764_190_000_000, 1_764_190_000_001
    return batch


def _serve(port: int, entries: int, cpu: Connection) -> None:
    import grpc

    def answer_cpu() -> None:  # each request on the pipe: this process's CPU seconds
        while True:
            try:
                cpu.recv()
            except EOFError:
                return
            cpu.send(time.process_time())

    threading.Thread(target=answer_cpu, name="cpu", daemon=True).start()

    async def main() -> None:
        reply = _batch(entries)

        async def stream(requests: Any, context: Any) -> None:
            async for _ in requests:
                await context.write(reply)

        handler = grpc.stream_stream_rpc_method_handler(
            stream,
            request_deserializer=replica_pb2.ForwardBatch.FromString,
            response_serializer=replica_pb2.ForwardBatch.SerializeToString,
        )
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("bench.RoundTrip", {"Stream": handler}),)
        )
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


async def _drive(port: int, entries: int, rate: float, seconds: float, cpu: Connection) -> float:
    """Round trips at ``rate`` for ``seconds``; the server's CPU µs per round trip."""
    import grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(
            "/bench.RoundTrip/Stream",
            request_serializer=replica_pb2.ForwardBatch.SerializeToString,
            response_deserializer=replica_pb2.ForwardBatch.FromString,
        )()
        request = _batch(entries)
        loop = asyncio.get_running_loop()

        async def trips(count: int) -> None:
            slot = loop.time()
            for _ in range(count):
                await call.write(request)
                await call.read()
                slot += 1.0 / rate
                await asyncio.sleep(max(0.0, slot - loop.time()))

        await trips(max(5, int(rate)))  # warm up: the stream, the server's first calls
        count = max(10, int(rate * seconds))
        before = _server_cpu_s(cpu)
        await trips(count)
        after = _server_cpu_s(cpu)
        await call.done_writing()
    return 1e6 * (after - before) / count


def _server_cpu_s(cpu: Connection) -> float:
    """The server process's CPU seconds so far, as it reads them itself."""
    cpu.send(None)
    if not cpu.poll(10.0):
        raise RuntimeError("the bench server did not report its CPU time within 10 s")
    return float(cpu.recv())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bench(args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    for entries in args.entries:
        port = _free_port()
        cpu, server_end = multiprocessing.Pipe()
        server = multiprocessing.get_context("spawn").Process(
            target=_serve, args=(port, entries, server_end), daemon=True
        )
        server.start()
        try:
            time.sleep(1.0)
            for rate in args.rates:
                samples = [
                    asyncio.run(_drive(port, entries, rate, args.hold_s, cpu))
                    for _ in range(args.rounds)
                ]
                row = {
                    "entries": entries,
                    "rate_per_s": rate,
                    "server_cpu_us_per_round_trip": statistics.median(samples),
                    "rounds": samples,
                }
                print(
                    f"{entries:3d} entries at {rate:5.0f}/s: "
                    f"{row['server_cpu_us_per_round_trip']:.0f} µs per round trip",
                    flush=True,
                )
                rows.append(row)
        finally:
            server.kill()
            server.join(5)
    import grpc

    return {
        "commit": measured_commit(),
        "date": today(),
        "grpcio": grpc.__version__,
        "config": {"rounds": args.rounds, "hold_s": args.hold_s},
        "rows": rows,
    }


def readme(result: dict[str, Any]) -> str:
    table = "\n".join(
        f"| {r['entries']} | {r['rate_per_s']:,} | **{r['server_cpu_us_per_round_trip']:.0f}** |"
        for r in result["rows"]
    )
    cfg = result["config"]
    return f"""## gRPC stream round trip, server CPU (`grpc_roundtrip_bench.py`)

Commit `{result["commit"]}` measured {result["date"]} on 2 cores, grpcio
{result["grpcio"]}: a `grpc.aio` server (no Lazarus code) reads one message on
a bidirectional stream and writes one back, paced by a client process;
the server's CPU per round trip, median of {cfg["rounds"]} rounds of {cfg["hold_s"]:.0f} s.
`.venv/bin/python bench/grpc_roundtrip_bench.py`; raw figures in
`bench/results/grpc-roundtrip.json`.

| entries per message | round trips/s | server CPU µs per round trip |
|---:|---:|---:|
{table}

Reading it: a message's size hardly matters; what costs is each message
crossing grpc-python's completion queue thread and the event loop, and
more so at low rates, where every message wakes both. A fan-in leader pays
this per Forward batch (about 37 batches/s each way at 600 nodes, see
`fanin_bench.py`), a replica per agent heartbeat: it is most of a
follower's ~500-600 µs per heartbeat and a floor under the leader's cost.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rates",
        type=lambda text: [float(x) for x in text.split(",")],
        default=list(RATES),
        help="round trips per second, comma-separated (default 10,40,200,1000)",
    )
    parser.add_argument(
        "--entries",
        type=lambda text: [int(x) for x in text.split(",")],
        default=[1, 17],
        help="heartbeat acks per message, comma-separated (default 1,17)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds per row (default 3)")
    parser.add_argument("--hold-s", type=float, default=5.0, help="seconds per round")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results path")
    parser.add_argument("--no-readme", action="store_true", help="do not rewrite bench/README.md")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="40/s, 1 entry, 1 round of 1 s, no README (a smoke run)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rates, args.entries, args.rounds, args.hold_s = [40.0], [1], 1, 1.0
        args.no_readme = True
    result = bench(args)
    publish(args.out, result, "grpc-roundtrip", readme(result), not args.no_readme)
    return 0


if __name__ == "__main__":
    sys.exit(main())
