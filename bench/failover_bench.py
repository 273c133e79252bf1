"""Coordinator failover time: SIGKILL and SIGTERM of the leader, 3 replicas on a 3-member etcd.

Starts a 3-member etcd cluster (``lazarus_dev.localservers.EtcdCluster``) and three
``lazarus coordinator`` processes, each talking to a different etcd member, all
on 127.0.0.1. A probe is a node agent Session on a raw AgentService stub: Hello
answered by Welcome means "serves Sessions" (the leader), NotLeader means
follower. Each probe is bounded (``PROBE_TIMEOUT_S``); probes repeat every
``POLL_S``.

Per trial: find the one leader, send it the signal (the clock starts just
before ``os.kill``), probe the two other replicas until one answers Welcome —
the time at which that reply arrived is the sample — then start the killed
replica again and wait for steady state (all three answer, exactly one leader,
the restarted one a follower) plus a short settle. ``--trials`` times with
SIGKILL (the lease must expire: limit lease TTL + 1 s), then ``--trials`` times
with SIGTERM (the leader resigns at once: limit 1 s). Once, after the first
SIGKILL failover, ``etcdctl elect --listen`` (ETCDCTL_API=3) is run on the
election prefix and must show the new leader's address.

Results: ``bench/results/failover.json`` and the table between the markers in
``bench/README.md``. Every process started here is stopped by pid at the end,
also on Ctrl-C, SIGTERM or an error.

Run: ``.venv/bin/python bench/failover_bench.py [--trials N] [--ttl S] [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import types
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from coordinator.etcd_store import election_prefix
from lazarus.v1 import agent_pb2, records_pb2
from lazarus_dev.localservers import EtcdCluster, free_loopback_ports

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import RESULTS_DIR, today, write_json, write_section

RESULTS = RESULTS_DIR / "failover.json"
LAZARUS = Path(sys.executable).parent / "lazarus"

POLL_S = 0.02
"""Pause between two rounds of probes."""
PROBE_TIMEOUT_S = 0.5
"""Bound on one probe (Hello written, first reply read)."""
STARTUP_S = 60.0
"""Bound on a replica starting to answer probes."""
SETTLE_S = 1.0
"""Pause after steady state, so a restarted replica's start-up work is over."""
SIGTERM_LIMIT_S = 1.0
STOP_GRACE_S = 5.0
"""At cleanup: SIGTERM, this long to exit, then SIGKILL."""
ETCDCTL_BOUND_S = 5.0

# gRPC honours http_proxy / grpc_proxy from the environment; loopback only here.
GRPC_OPTIONS = [("grpc.enable_http_proxy", 0)]


STEADY_ROUNDS = [0, 0]
"""Probe rounds over all three replicas: [at most one leader, more than one leader]."""


class BenchError(Exception):
    """The fleet did not reach the state a trial needs."""


@dataclass
class Replica:
    member_id: str
    address: str
    process: subprocess.Popen[bytes]


@dataclass
class Fleet:
    """Three coordinator processes of one cluster, each on its own etcd member."""

    etcd: EtcdCluster
    cluster: str
    ttl_s: int
    log_dir: Path
    replicas: list[Replica] = field(default_factory=list)
    everything: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, index: int) -> Replica:
        address, metrics = (f"127.0.0.1:{port}" for port in free_loopback_ports(2))
        member_id = f"c{index}"
        with (self.log_dir / f"{member_id}.log").open("ab") as log:
            process = subprocess.Popen(
                [
                    str(LAZARUS),
                    "coordinator",
                    "--cluster",
                    self.cluster,
                    "--member-id",
                    member_id,
                    "--listen",
                    address,
                    "--etcd-endpoint",
                    str(self.etcd.endpoints[index % len(self.etcd.endpoints)]),
                    "--lease-ttl-s",
                    str(self.ttl_s),
                    "--metrics-listen",
                    metrics,
                    "--auth",  # plaintext: leader failover does not depend on TLS
                    "none",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a terminal's Ctrl-C is ours to handle
            )
        self.everything.append(process)
        replica = Replica(member_id, address, process)
        if index < len(self.replicas):
            self.replicas[index] = replica
        else:
            self.replicas.append(replica)
        return replica

    def stop_all(self) -> None:
        """SIGTERM every process still unreaped, wait, SIGKILL what is left; reap all."""
        for p in self.everything:
            if p.poll() is None:  # send_signal also checks: never a reaped (reusable) pid
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for p in self.everything:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


async def probe(address: str) -> tuple[str | None, float]:
    """('leader' | 'follower' | None, monotonic time the answer arrived)."""
    async with grpc.aio.insecure_channel(address, options=GRPC_OPTIONS) as channel:
        call: Any = channel.stream_stream(
            "/lazarus.v1.AgentService/Session",
            request_serializer=agent_pb2.AgentMessage.SerializeToString,
            response_deserializer=agent_pb2.CoordinatorMessage.FromString,
        )()
        # Read while writing: a follower answers NotLeader and ends the call
        # without waiting for Hello, so a write-then-read probe would race it.
        reader = asyncio.ensure_future(call.read())
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                    await call.write(
                        agent_pb2.AgentMessage(
                            hello=agent_pb2.Hello(
                                node_id=f"bench-probe-{uuid.uuid4().hex[:6]}",
                                incarnation="i",
                                capacity=records_pb2.NodeCapacity(slots=1),
                            )
                        )
                    )
                reply = await reader
        except (grpc.aio.AioRpcError, TimeoutError, asyncio.InvalidStateError):
            return None, time.monotonic()
        finally:
            reader.cancel()
            call.cancel()
        at = time.monotonic()
        if reply is grpc.aio.EOF:
            return None, at
        body = reply.WhichOneof("body")
        return {"welcome": "leader", "not_leader": "follower"}.get(body or ""), at


async def roles(replicas: list[Replica]) -> list[str | None]:
    return [role for role, _ in await asyncio.gather(*(probe(r.address) for r in replicas))]


async def steady(fleet: Fleet, bound_s: float, follower: int | None = None) -> Replica:
    """Wait until every replica answers, exactly one leads (``follower`` does not); the leader.

    A replica's last answer counts when a round brings none from it (a probe can
    fail while a replica starts); the leader must have answered Welcome this round.
    """
    deadline = time.monotonic() + bound_s
    known: list[str | None] = [None] * len(fleet.replicas)
    seen: list[str | None] = []
    while time.monotonic() < deadline:
        for r in fleet.replicas:
            if r.process.poll() is not None:
                raise BenchError(f"{r.member_id} exited with {r.process.returncode}")
        seen = await roles(fleet.replicas)
        STEADY_ROUNDS[seen.count("leader") > 1] += 1
        known = [now or before for now, before in zip(seen, known, strict=True)]
        if (
            None not in known
            and known.count("leader") == 1
            and seen.count("leader") == 1
            and (follower is None or known[follower] == "follower")
        ):
            return fleet.replicas[seen.index("leader")]
        await asyncio.sleep(0.05)
    raise BenchError(f"no steady state within {bound_s} s: roles {seen}, last known {known}")


async def measure(fleet: Fleet, sig: signal.Signals, bound_s: float) -> dict[str, Any]:
    """One trial: signal the leader, time the first Welcome from another, restart it."""
    leader = await steady(fleet, STARTUP_S)
    index = fleet.replicas.index(leader)
    rest = [r for r in fleet.replicas if r is not leader]
    t0 = time.monotonic()
    os.kill(leader.process.pid, sig)  # unreaped: steady() just saw it running
    new = await _time_first_welcome(rest, t0, bound_s)
    trial: dict[str, Any] = {"old_leader": leader.member_id}
    if new is None:
        trial.update(seconds=None, new_leader=None)
    else:
        replica, at = new
        trial.update(seconds=round(at - t0, 4), new_leader=replica.member_id)
    exit_code = await asyncio.to_thread(leader.process.wait, 15)
    trial["old_leader_exit_code"] = exit_code
    trial["new_leader_address"] = new[0].address if new else None
    fleet.start(index)
    await steady(fleet, STARTUP_S, follower=index)
    await asyncio.sleep(SETTLE_S)
    return trial


async def _time_first_welcome(
    candidates: list[Replica], t0: float, bound_s: float
) -> tuple[Replica, float] | None:
    """Probe every POLL_S until one of ``candidates`` answers Welcome: (it, arrival time)."""
    while time.monotonic() - t0 < bound_s:
        answers = await asyncio.gather(*(probe(r.address) for r in candidates))
        leaders = [
            (at, r) for r, (role, at) in zip(candidates, answers, strict=True) if role == "leader"
        ]
        if leaders:
            at, r = min(leaders, key=lambda x: x[0])
            return r, at
        await asyncio.sleep(POLL_S)
    return None


def _etcdctl_version(etcdctl: str) -> str:
    return subprocess.run(
        [etcdctl, "version"],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
        env={**os.environ, "ETCDCTL_API": "3"},
    ).stdout.split("\n")[0]


async def elect_listen(etcd: EtcdCluster, cluster: str, expected: str) -> dict[str, Any]:
    """Run ``etcdctl elect --listen`` on the election prefix; did it show ``expected``?"""
    argv = [
        shutil.which("etcdctl") or "etcdctl",
        f"--endpoints={','.join(etcd.client_urls)}",
        "elect",
        "--listen",
        election_prefix(cluster),
    ]
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "ETCDCTL_API": "3"},
        start_new_session=True,
    )
    lines: list[str] = []
    try:
        assert process.stdout is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(ETCDCTL_BOUND_S):
                while True:
                    line = (await process.stdout.readline()).decode().strip()
                    if not line:
                        break
                    lines.append(line)
                    if line == expected:
                        break
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
        await process.wait()
    version = await asyncio.to_thread(_etcdctl_version, argv[0])
    return {
        "command": "ETCDCTL_API=3 etcdctl --endpoints=<3 members> elect --listen "
        + election_prefix(cluster),
        "etcdctl": version,
        "expected_new_leader_address": expected,
        "lines": lines,
        "shows_new_leader": expected in lines,
    }


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    idx = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[idx]


def summarize(trials: list[dict[str, Any]], limit_s: float) -> dict[str, Any]:
    for t in trials:
        t["within_limit"] = t["seconds"] is not None and t["seconds"] <= limit_s
    samples = [t["seconds"] for t in trials if t["seconds"] is not None]
    ordered = sorted(samples)
    return {
        "limit_s": limit_s,
        "samples_s": [t["seconds"] for t in trials],
        "median_s": round(statistics.median(ordered), 4) if ordered else None,
        "p90_s": _percentile(ordered, 0.9) if ordered else None,
        "max_s": ordered[-1] if ordered else None,
        "min_s": ordered[0] if ordered else None,
        "within_limit_count": sum(t["within_limit"] for t in trials),
        "trials": trials,
    }


async def bench(etcd: EtcdCluster, fleet: Fleet, trials: int) -> dict[str, Any]:
    for i in range(3):
        fleet.start(i)
    leader = await steady(fleet, STARTUP_S)
    initial = await roles(fleet.replicas)
    print(f"initial roles {initial}, leader {leader.member_id}", flush=True)
    modes: dict[str, Any] = {}
    elect: dict[str, Any] = {}
    plan = [
        ("sigkill", signal.SIGKILL, fleet.ttl_s + 1.0, fleet.ttl_s + 10.0),
        ("sigterm", signal.SIGTERM, SIGTERM_LIMIT_S, 10.0),
    ]
    for name, sig, limit_s, bound_s in plan:
        done: list[dict[str, Any]] = []
        for n in range(trials):
            trial = await measure(fleet, sig, bound_s)
            done.append(trial)
            print(
                f"{name} trial {n + 1}/{trials}: {trial['old_leader']} -> "
                f"{trial['new_leader']} in {trial['seconds']} s",
                flush=True,
            )
            if name == "sigkill" and not elect and trial["new_leader_address"]:
                elect = await elect_listen(etcd, fleet.cluster, trial["new_leader_address"])
                print(f"etcdctl elect --listen shows new leader: {elect['shows_new_leader']}")
        modes[name] = summarize(done, limit_s)
    return {
        "initial_roles": initial,
        "modes": modes,
        "etcdctl_elect_listen": elect,
        "all_replica_probe_rounds": STEADY_ROUNDS[0] + STEADY_ROUNDS[1],
        "all_replica_probe_rounds_with_two_leaders": STEADY_ROUNDS[1],
    }


def table(modes: dict[str, Any]) -> str:
    def s(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    rows = [
        "| signal to the leader | limit (s) | trials | median (s) | p90 (s) | max (s) "
        "| within limit |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    labels = {"sigkill": "SIGKILL (lease expires)", "sigterm": "SIGTERM (resigns)"}
    for name, m in modes.items():
        n = len(m["trials"])
        rows.append(
            f"| {labels[name]} | {m['limit_s']:g} | {n} | {s(m['median_s'])} | "
            f"{s(m['p90_s'])} | {s(m['max_s'])} | {m['within_limit_count']}/{n} |"
        )
    return "\n".join(rows)


def _sigterm_as_interrupt(signum: int, frame: types.FrameType | None) -> None:
    raise KeyboardInterrupt(f"received signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10, help="failovers per signal")
    parser.add_argument("--ttl", type=int, default=3, help="election lease TTL, seconds")
    parser.add_argument("--quick", action="store_true", help="2 trials per signal, no README")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results path")
    args = parser.parse_args(argv)
    trials = 2 if args.quick else args.trials
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if inherited as ignored

    started = time.time()
    load_before = os.getloadavg()
    workdir = Path(tempfile.mkdtemp(prefix="lazarus-failover-bench-"))
    ok = False
    etcd = EtcdCluster(3, base_dir=workdir)
    fleet = Fleet(etcd, f"bench-{uuid.uuid4().hex[:8]}", args.ttl, workdir)
    try:
        etcd.start()
        out = asyncio.run(bench(etcd, fleet, trials))
        ok = True
    finally:
        fleet.stop_all()
        etcd.stop()
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"coordinator logs kept in {workdir}", file=sys.stderr)
    result = {
        "benchmark": "coordinator_failover",
        "started_at_unix_s": round(started),
        "elapsed_s": round(time.time() - started, 1),
        "trials_per_signal": trials,
        "lease_ttl_s": args.ttl,
        "poll_interval_s": POLL_S,
        "probe_timeout_s": PROBE_TIMEOUT_S,
        "setup": "3 lazarus coordinator processes, each on its own member of a 3-member "
        "etcd cluster (raft heartbeat 100 ms, election timeout 1000 ms), all on 127.0.0.1; "
        "sample = signal sent -> first Welcome to a Session Hello from another replica",
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        **out,
    }
    write_json(args.out, result)
    print(f"\nwrote {args.out}")
    md = table(out["modes"])
    print(md)
    if not args.quick:
        elect = out["etcdctl_elect_listen"]
        write_section(
            "failover",
            f"Measured {today()} on {os.cpu_count()} cores (shared with other work; load "
            f"average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after), "
            f"Python {platform.python_version()}: 3 `lazarus coordinator` processes on a "
            f"3-member etcd, lease TTL {args.ttl} s, {trials} failovers per signal. A sample "
            "is the time from the signal to the leader until another replica answers a "
            f"Session Hello with Welcome (probes every {POLL_S * 1000:g} ms, each bounded "
            f"to {PROBE_TIMEOUT_S:g} s); the killed replica is restarted and the fleet "
            "settles between trials. `etcdctl elect --listen` showed the new leader's "
            f"address after a failover: {'yes' if elect.get('shows_new_leader') else 'no'}.\n"
            "`.venv/bin/python bench/failover_bench.py`; every sample in "
            "`bench/results/failover.json`.\n\n" + md,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
