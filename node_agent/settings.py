"""Settings of one node agent process (``lazarus node-agent``).

Every field is a flag and a ``LAZARUS_*`` environment variable (see
``lazarus node-agent --help``) and a Helm value. The session timings
(heartbeat interval, fence_after, dead_after) are not here: the leader sends
them in Welcome, so the agent and the leader can never disagree on them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from lazarus.tls import ClientTls
from node_agent.core.core import (
    DEFAULT_LOCAL_PROGRESS_REPORT_INTERVAL_S,
    DEFAULT_PROGRESS_REPORT_INTERVAL_S,
)
from node_agent.core.history import DEFAULT_KEEP_CHECKPOINTS
from node_agent.isolation import DEFAULT_WORKER_NICE
from node_agent.replication import DEFAULT_REPLICATION_LINGER_S
from node_agent.sdk import DurabilityName, IsolationName

__all__ = ["AgentSettings", "SettingsError", "parse_addresses", "parse_labels"]

_NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


class SettingsError(ValueError):
    """A setting is unusable; the message names the flag."""


def parse_addresses(value: str, flag: str = "--coordinators") -> tuple[str, ...]:
    """``"a:1,b:2"`` → ``("a:1", "b:2")``.

    Raises:
        SettingsError: empty, or an entry without a numeric port.
    """
    out = tuple(part.strip() for part in value.split(",") if part.strip())
    if not out:
        raise SettingsError(f"{flag}: give at least one host:port")
    for addr in out:
        host, sep, port = addr.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise SettingsError(f"{flag}: {addr!r} is not host:port")
    return out


def parse_labels(value: str) -> dict[str, str]:
    """``"zone=a,gpu=true"`` → ``{"zone": "a", "gpu": "true"}``.

    Raises:
        SettingsError: an entry without ``=`` or with an empty key.
    """
    labels: dict[str, str] = {}
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, val = part.partition("=")
        if not sep or not key.strip():
            raise SettingsError(f"--labels: {part!r} is not key=value")
        labels[key.strip()] = val.strip()
    return labels


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """One node agent's settings.

    Attributes:
        node_id: stable node name (the pod name in Kubernetes); [A-Za-z0-9._-], <= 253.
        coordinators: coordinator addresses host:port; the agent follows NotLeader.
        resolve_coordinators: dial every address each name of ``coordinators``
            resolves to (a Kubernetes headless Service lists every replica), re-
            resolved every ``RESOLVE_INTERVAL_S`` (``node_agent.agent``), instead
            of the name itself (one ClusterIP: kube-proxy picks the replica).
        data_dir: directory of the local checkpoint store (one agent per directory).
        redis_url: Redis for replicated checkpoints, ``redis://host:port/db``
            (``rediss://`` for TLS).
        redis_password: Redis AUTH password ("" = none, or the one in the URL).
        redis_ca_file: CA bundle that verifies a ``rediss://`` server ("" = system).
        app: ``module:attribute`` of the ``Agent`` whose handlers run here.
        slots: task slots this node offers (>= 1).
        labels: node labels for placement.
        advertise_kinds: list the app's kinds in Hello so placement only sends
            those; off by default so a task of an unknown kind reaches an agent
            and fails with a readable error instead of waiting forever.
        durability: default checkpoint durability of tasks that do not say.
        isolation: where plain ``def`` handlers run unless they say: "thread" or "process".
        worker_nice: ``nice`` increment of worker processes over the agent (0..19).
        max_payload_bytes: limit on a task's payload, checkpoint state, event and result.
        replication_backlog: replication queue bound, records (>= 16).
        replication_linger_s: how long a record of a task with ``local``
            durability may wait for others to share its Redis round trip,
            seconds (0..1, default 0.5; 0 ships each at once). ``replicated`` never waits.
        metrics_listen: Prometheus ``/metrics`` host:port ("" disables).
        fence_lead_s: the agent starts pausing its tasks this long before the
            fence deadline ``s + fence_after`` so the pause completes by then.
        progress_report_interval_s: least time between two reports of one task's
            newest checkpoint to the leader (written to etcd in the leader's batched
            progress flush), seconds (> 0);
            for ``replicated`` tasks, whose reports are the evidence that detects
            Redis losing acknowledged data.
        local_progress_report_interval_s: the same for ``local``-durability tasks.
        keep_checkpoints: about how many checkpoints the local store keeps of a task
            running here (>= 0; 0 = all): older ones are pruned once it holds a tenth
            more, but never the newest, a terminal one or one Redis may lack
            (``node_agent.core.history``).
        reconnect_max_backoff_s: cap of the jittered reconnect backoff.
        rpc_timeout_s: bound on connecting and on each unary call.
        tls: how to dial coordinators: the cluster CA, this node's certificate
            and key (its URI SAN names ``node_id``), the server name to verify;
            empty: plaintext, for coordinators run with ``--auth none``.
    """

    node_id: str
    coordinators: tuple[str, ...]
    data_dir: Path
    resolve_coordinators: bool = False
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_password: str = field(default="", repr=False)
    redis_ca_file: str = ""
    app: str = "node_agent.demo_app:agent"
    slots: int = 8
    labels: dict[str, str] = field(default_factory=dict)
    advertise_kinds: bool = False
    durability: DurabilityName = "local"
    isolation: IsolationName = "thread"
    worker_nice: int = DEFAULT_WORKER_NICE
    max_payload_bytes: int = 1 << 20
    replication_backlog: int = 10_000
    replication_linger_s: float = DEFAULT_REPLICATION_LINGER_S
    metrics_listen: str = ""
    fence_lead_s: float = 0.5
    progress_report_interval_s: float = DEFAULT_PROGRESS_REPORT_INTERVAL_S
    local_progress_report_interval_s: float = DEFAULT_LOCAL_PROGRESS_REPORT_INTERVAL_S
    keep_checkpoints: int = DEFAULT_KEEP_CHECKPOINTS
    reconnect_max_backoff_s: float = 2.0
    rpc_timeout_s: float = 5.0
    tls: ClientTls = field(default_factory=ClientTls)

    def __post_init__(self) -> None:
        if not _NODE_ID.match(self.node_id):
            raise SettingsError(
                f"--node-id: {self.node_id!r} must be 1..253 of [A-Za-z0-9._-], "
                "starting alphanumeric"
            )
        if not self.coordinators:
            raise SettingsError("--coordinators: give at least one host:port")
        if self.resolve_coordinators and self.tls.enabled and not self.tls.server_name:
            raise SettingsError(
                "--resolve-coordinators dials the coordinators' IP addresses, which their "
                "certificate does not name: set --tls-server-name (LAZARUS_TLS_SERVER_NAME) "
                "to a name it does (the Helm chart sets it)"
            )
        if ":" not in self.app:
            raise SettingsError(f"--app: {self.app!r} is not module:attribute")
        if self.slots < 1:
            raise SettingsError(f"--slots: must be >= 1, got {self.slots}")
        if self.isolation not in ("thread", "process"):
            raise SettingsError(f"--isolation: 'thread' or 'process', got {self.isolation!r}")
        if not 0 <= self.worker_nice <= 19:
            raise SettingsError(f"--worker-nice: must be 0..19, got {self.worker_nice}")
        if self.durability not in ("local", "replicated"):
            raise SettingsError(f"--durability: 'local' or 'replicated', got {self.durability!r}")
        if self.max_payload_bytes < 1024:
            raise SettingsError(
                f"--max-payload-bytes: must be >= 1024, got {self.max_payload_bytes}"
            )
        if self.replication_backlog < 16:
            raise SettingsError(
                f"--replication-backlog: must be >= 16, got {self.replication_backlog}"
            )
        if not 0 <= self.fence_lead_s < 5:
            raise SettingsError(f"--fence-lead-s: must be in [0, 5), got {self.fence_lead_s}")
        if not 0 <= self.replication_linger_s <= 1:
            raise SettingsError(
                f"--replication-linger-s: must be in [0, 1], got {self.replication_linger_s}"
            )
        for flag, value in (
            ("--progress-report-interval-s", self.progress_report_interval_s),
            ("--local-progress-report-interval-s", self.local_progress_report_interval_s),
        ):
            if not 0 < value <= 3600:
                raise SettingsError(f"{flag}: must be in (0, 3600], got {value}")
        if self.keep_checkpoints < 0:
            raise SettingsError(
                f"--keep-checkpoints: must be >= 0 (0 keeps all), got {self.keep_checkpoints}"
            )
        if not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise SettingsError(f"--redis-url: {self.redis_url!r} is not redis://host:port/db")
