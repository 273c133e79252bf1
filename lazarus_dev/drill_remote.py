"""Drills against a cluster given by address (Kubernetes: faults injected with kubectl).

Theory of operation: the workload, the waiting and the verdict are those of
``lazarus_dev.drill``; what differs is where the facts come from and how faults
are made. Facts: a WatchEvents stream opened on any replica before the
workload is submitted (it resumes on another replica when one goes away),
turned into the same (time, type, fields) rows the local drills read from
logs; ``*_ms`` fields are also given in seconds (``*_s``). Faults: ``kubectl
delete pod --grace-period=0 --force`` — the node agent's pod for kill-node
(its StatefulSet brings it back under the same name, hence the same node id
and volume), the leading coordinator's pod for kill-leader (pod names are
member ids in the chart). Scenarios that need a network or a store fault
injector (partition-heal, etcd-member-loss, redis-restart, redis-loss) are reported as
skipped, never as passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import time
from collections.abc import Sequence

import grpc
import grpc.aio
from google.protobuf.json_format import MessageToDict
from rich.console import Console

from lazarus.tls import ClientTls
from lazarus.v1 import coordinator_pb2, coordinator_pb2_grpc, records_pb2
from lazarus_dev.devcluster import ClusterApi
from lazarus_dev.drill import SETTLE_TIMEOUT_S, DrillResult, _Drill

__all__ = ["REMOTE_SCENARIOS", "KubectlInjector", "RemoteCluster", "run_remote_drills"]

REMOTE_SCENARIOS = ("kill-node", "kill-leader")
"""Scenarios a remote drill can inject with kubectl."""

_CAMEL = re.compile(r"_([a-z])")


class KubectlInjector:
    """Deletes pods with kubectl (the pod's controller re-creates it).

    Args:
        namespace: the release's namespace.
        context: a kubeconfig context ("" = the current one).
        kubectl: the kubectl binary.
    """

    def __init__(self, namespace: str, context: str = "", kubectl: str = "kubectl") -> None:
        self.namespace = namespace
        self.context = context
        self.kubectl = kubectl

    def command(self, pod: str) -> list[str]:
        """The command that kills ``pod`` at once (SIGKILL, no grace)."""
        argv = [self.kubectl, "-n", self.namespace]
        if self.context:
            argv += ["--context", self.context]
        return [*argv, "delete", "pod", pod, "--grace-period=0", "--force", "--wait=false"]

    def kill_pod(self, pod: str) -> None:
        """Delete ``pod`` now.

        Raises:
            RuntimeError: kubectl failed (its message says why).
        """
        proc = subprocess.run(self.command(pod), capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise RuntimeError(f"kubectl could not delete pod {pod}: {proc.stderr.strip()}")


class RemoteCluster(ClusterApi):
    """A cluster reached through its coordinator addresses (the API a drill needs)."""

    def __init__(self, addresses: Sequence[str]) -> None:
        if not addresses:
            raise ValueError("--coordinators: give at least one host:port")
        self.addresses = list(addresses)
        self.client_tls = ClientTls.from_env()  # LAZARUS_TLS_* as for every operator command
        self.events: list[tuple[float, str, dict[str, str]]] = []
        self._watch: asyncio.Task[None] | None = None

    def api_addresses(self) -> list[str]:
        return self.addresses

    async def ready(self, timeout_s: float = 30.0) -> None:
        """Wait until a leader answers and at least two nodes are ALIVE."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(grpc.aio.AioRpcError):
                nodes = await self.list_nodes()
                if sum(1 for n in nodes if n.state == records_pb2.NODE_STATE_ALIVE) >= 2:
                    return
            await asyncio.sleep(0.5)
        raise TimeoutError(f"no leader with two ALIVE nodes at {self.addresses} in {timeout_s} s")

    async def leader(self) -> tuple[int, str]:
        """(-1, leader member id) as the cluster reports it."""
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            with contextlib.suppress(grpc.aio.AioRpcError):
                status = await self.call(
                    "GetClusterStatus", coordinator_pb2.GetClusterStatusRequest()
                )
                if status.leader_id:
                    return -1, status.leader_id
            await asyncio.sleep(0.2)
        raise RuntimeError(f"no replica at {self.addresses} names a leader")

    # -- the event stream ---------------------------------------------------

    def start_watch(self) -> None:
        """Collect every event from now on (resuming across replicas)."""
        if self._watch is None:
            self._watch = asyncio.create_task(self._watch_loop())

    async def stop_watch(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch
            self._watch = None

    async def _watch_loop(self) -> None:
        revision = 0
        while True:
            for address in self.addresses:
                try:
                    async with self.client_tls.aio_channel(address) as channel:
                        stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)  # type: ignore[no-untyped-call]
                        request = coordinator_pb2.WatchEventsRequest(
                            from_revision=revision + 1 if revision else 0
                        )
                        async for reply in stub.WatchEvents(request):
                            for event in reply.events:
                                revision = max(revision, event.revision)
                                self.events.append(event_row(event))
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.2)


def event_row(event: records_pb2.Event) -> tuple[float, str, dict[str, str]]:
    """A records.proto Event -> (Unix s, CamelCase type, fields as strings; *_ms also as *_s)."""
    body = event.WhichOneof("body") or ""
    kind = _CAMEL.sub(lambda m: m.group(1).upper(), body)
    kind = kind[:1].upper() + kind[1:]
    fields: dict[str, str] = {}
    if body:
        raw = MessageToDict(
            getattr(event, body),
            preserving_proto_field_name=True,
            always_print_fields_with_no_presence=True,
        )
        for key, value in raw.items():
            fields[key] = str(value)
            if key.endswith("_ms"):
                with contextlib.suppress(ValueError):
                    fields[key[:-3] + "_s"] = str(int(value) / 1000.0)
        if "location" in raw:
            fields["from_redis"] = str(raw["location"] == "CHECKPOINT_LOCATION_REDIS")
        if kind == "TaskResumed":
            fields.setdefault("redone_checkpoints", "0")
    fields.setdefault("epoch", fields.get("current_epoch", ""))
    fields["term"] = str(event.term)
    return event.occurred_at_unix_ms / 1000.0, kind, fields


class _RemoteDrill(_Drill):
    """``_Drill`` with a WatchEvents event source and kubectl faults."""

    def __init__(
        self,
        cluster: RemoteCluster,
        injector: KubectlInjector,
        console: Console,
        tasks: int,
        lines: int,
        work_ms: float,
    ) -> None:
        super().__init__(cluster, None, "remote cluster", console, tasks, lines, work_ms)  # type: ignore[arg-type]
        self.remote = cluster
        self.injector = injector

    def _collect(self, since: float) -> list[tuple[float, str, dict[str, str]]]:
        return sorted((e for e in self.remote.events if e[0] >= since), key=lambda e: e[0])

    def _leaderships(self, since: float) -> list[tuple[float, str]]:
        return []

    async def _node_names(self) -> list[str]:
        return sorted(n.node_id for n in await self.remote.list_nodes())

    async def _busy_node(self) -> str:
        counts: dict[str, int] = {}
        for t in await self.remote.list_tasks():
            if t.state == records_pb2.TASK_STATE_RUNNING:
                counts[t.owner_node_id] = counts.get(t.owner_node_id, 0) + 1
        if not counts:
            raise RuntimeError("no node runs a task of the workload")
        return max(counts, key=lambda n: counts[n])

    async def _kill_node(self, r: DrillResult) -> None:
        victim = await self._busy_node()
        r.fault = f"kubectl delete pod {victim} --force (node agent)"
        at = time.time()
        r.inject_at_s = at
        await asyncio.to_thread(self.injector.kill_pod, victim)
        dead = await self._wait_for(lambda: self._node_dead(victim, at)[0], 30)
        if dead is not None:
            r.detection_s = dead - at
        r.recovery_s = await self._wait_for(lambda: self._recovery(victim, at), 30)
        r.heal_at_s = time.time()  # the StatefulSet re-creates the pod by itself

    async def _kill_leader(self, r: DrillResult) -> None:
        _, member = await self.remote.leader()
        r.fault = f"kubectl delete pod {member} --force (leading coordinator)"
        at = time.time()
        r.inject_at_s = at
        await asyncio.to_thread(self.injector.kill_pod, member)

        def elected() -> float | None:
            # The successor's first event is LeaderElected (WatchEvents resumes on it).
            for ts, kind, f in self._collect(at):
                if kind == "LeaderElected" and f.get("leader_id") != member:
                    return ts
            return None

        when = await self._wait_for(elected, 60)
        if when is not None:
            r.leader_failover_s = when - at
        r.heal_at_s = time.time()


async def run_remote_drills(
    cluster: RemoteCluster,
    injector: KubectlInjector,
    scenarios: list[str],
    *,
    console: Console,
    tasks: int = 24,
    lines: int = 400,
    work_ms: float = 8.0,
    settle_timeout_s: float = SETTLE_TIMEOUT_S,
) -> list[DrillResult]:
    """Run the remote-capable ``scenarios``; others come back as skipped results."""
    drill = _RemoteDrill(cluster, injector, console, tasks, lines, work_ms)
    drill.settle_timeout_s = settle_timeout_s
    cluster.start_watch()
    results = []
    try:
        for scenario in scenarios:
            if scenario not in REMOTE_SCENARIOS:
                skipped = DrillResult(
                    scenario=scenario,
                    fault="skipped: needs a network or store fault injector (run it locally)",
                    tasks=0,
                )
                skipped.notes.append("not run against a remote cluster")
                results.append(skipped)
                continue
            with console.status(f"drill {scenario}: workload, fault, heal, wait"):
                result = await drill.run(scenario)
            verdict = "[green]held[/]" if result.held else "[red]FAILED[/]"
            console.print(f"drill [bold]{scenario}[/]: {result.fault} — {verdict}")
            results.append(result)
    finally:
        await cluster.stop_watch()
    return results
