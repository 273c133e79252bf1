"""Remote drills (``lazarus drill --coordinators ... --kubectl-namespace ...``) on real processes.

There is no Kubernetes here, so the test plays its two parts: a stand-in
``kubectl`` (a script that SIGKILLs the process named like the pod, from a
pid map) and a stand-in StatefulSet/Deployment controller (a loop that
restarts a killed process under the same name). Everything else is the real
remote path: the workload through the API, facts from WatchEvents, faults
through the kubectl command line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from rich.console import Console

from lazarus.v1 import records_pb2
from lazarus_dev.devcluster import LocalCluster
from lazarus_dev.drill_remote import KubectlInjector, RemoteCluster, event_row, run_remote_drills

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

RESTART_AFTER_S = 4.5
"""The stand-in controller re-creates a killed pod after this long (> dead_after)."""

FAKE_KUBECTL = """#!/bin/sh
# args: -n NS delete pod POD --grace-period=0 --force --wait=false
pod="$5"
pid=$(python3 -c "import json,sys; print(json.load(open('{pids}')).get(sys.argv[1], ''))" "$pod")
[ -n "$pid" ] || {{ echo "Error from server (NotFound): pods \\"$pod\\" not found" >&2; exit 1; }}
kill -9 "$pid"
"""


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    c = LocalCluster(
        tmp_path / "run", coordinators=3, agents=3, cluster=f"rd-{uuid.uuid4().hex[:6]}"
    )
    c.start()
    yield c
    await asyncio.to_thread(c.stop)


async def _controller(cluster: LocalCluster, pids: Path) -> None:
    """Restart what kubectl killed, like a StatefulSet / Deployment, and keep the pid map."""
    while True:
        children = [*cluster.coordinators, *cluster.agents]
        for child in children:
            if not child.alive:
                await asyncio.sleep(RESTART_AFTER_S)
                child.start()
        text = json.dumps({c.name: c.pid for c in children if c.pid})
        # Atomically (write, then rename): the fake kubectl may read it at any moment.
        scratch = pids.with_suffix(".tmp")
        await asyncio.to_thread(scratch.write_text, text)
        await asyncio.to_thread(os.replace, scratch, pids)
        await asyncio.sleep(0.2)


async def test_remote_kill_node_and_kill_leader_hold_through_kubectl(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    pids = tmp_path / "pids.json"
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(FAKE_KUBECTL.format(pids=pids))
    kubectl.chmod(kubectl.stat().st_mode | stat.S_IEXEC)
    await cluster.ready(40)
    controller = asyncio.create_task(_controller(cluster, pids))
    try:
        await asyncio.sleep(0.5)
        remote = RemoteCluster(cluster.coordinator_addresses)
        remote.client_tls = cluster.client_tls  # the local cluster runs mTLS
        results = await run_remote_drills(
            remote,
            KubectlInjector("lazarus", kubectl=str(kubectl)),
            ["kill-node", "kill-leader", "partition-heal"],
            console=Console(quiet=True),
            tasks=16,
        )
    finally:
        controller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await controller
    by = {r.scenario: r for r in results}
    kill_node, kill_leader, partition = by["kill-node"], by["kill-leader"], by["partition-heal"]
    assert kill_node.held
    assert kill_leader.held
    assert kill_node.detection_s is not None
    assert kill_node.recovery_s is not None
    assert kill_node.tasks_moved >= 1
    assert kill_leader.leader_failover_s is not None
    assert partition.fault.startswith("skipped")
    assert partition.tasks == 0


def test_event_rows_from_the_wire_match_the_log_rows() -> None:
    event = records_pb2.Event(revision=9, occurred_at_unix_ms=1_500, term=3)
    event.recovery_completed.node_id = "agent-1"
    event.recovery_completed.recovery_ms = 250
    ts, kind, fields = event_row(event)
    assert (ts, kind) == (1.5, "RecoveryCompleted")
    assert fields["node_id"] == "agent-1"
    assert float(fields["recovery_s"]) == 0.25
    resumed = records_pb2.Event()
    resumed.task_resumed.location = records_pb2.CHECKPOINT_LOCATION_REDIS
    assert event_row(resumed)[2]["from_redis"] == "True"


def test_kubectl_command_line() -> None:
    injector = KubectlInjector("prod", context="eu-1")
    assert injector.command("agent-3") == [
        "kubectl",
        "-n",
        "prod",
        "--context",
        "eu-1",
        "delete",
        "pod",
        "agent-3",
        "--grace-period=0",
        "--force",
        "--wait=false",
    ]
