"""A whole Lazarus cluster on this machine: etcd, Redis, coordinators, node agents.

Theory of operation: every part is a real process on 127.0.0.1 — etcd and
redis-server from ``lazarus_dev.localservers``, and ``lazarus coordinator`` /
``lazarus node-agent`` children of this interpreter's ``lazarus`` script.
Each child runs in its own session (a terminal's Ctrl-C reaches only us, and
we stop them in order), writes its log to ``<run_dir>/<name>.log``, and is
addressed by pid only. ``stop()`` sends SIGTERM (and SIGCONT, so a paused
child can act on it), waits a bounded time, then SIGKILLs; an ``atexit`` hook
kills whatever is left. Fault injection: ``kill`` (SIGKILL), ``terminate``
(SIGTERM), ``pause`` / ``resume`` (SIGSTOP / SIGCONT), ``restart``.

Security is on by default (``tls=True``): the cluster gets a CA and
certificates under ``<run_dir>/tls`` (:class:`DevCertificates`), coordinators
run with mutual TLS and the authorization policy, each agent holds the node
certificate of its node id, and the harness calls the API as an ``admin``
client. ``tls=False`` runs everything with ``--auth none``.

Used by the integration tests, ``lazarus dev`` and ``lazarus drill``.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from lazarus.tls import ClientTls, Identity, IdentityKind, init_ca, issue
from lazarus.v1 import coordinator_pb2, coordinator_pb2_grpc, records_pb2
from lazarus_dev.localservers import EtcdCluster, EtcdServer, RedisServer, free_loopback_ports
from node_agent.core.dial import spread_start

__all__ = ["ChildProcess", "ClusterApi", "DevCertificates", "LocalCluster", "json_log_entries"]

LAZARUS_BIN = str(Path(sys.executable).parent / "lazarus")
"""The ``lazarus`` script next to this interpreter."""

_LIVE: set[ChildProcess] = set()


def _kill_leftovers() -> None:
    for child in list(_LIVE):
        child.kill()


atexit.register(_kill_leftovers)


def json_log_entries(
    paths: Iterable[Path],
    *,
    since: float = -math.inf,
    until: float = math.inf,
    needle: str = "",
) -> Iterator[tuple[float, dict[str, Any], Path]]:
    """The JSON log lines of the cluster's children (``ChildProcess.log_path``), file by file.

    Yields ``(ts, entry, path)`` for each line that contains ``needle`` (checked
    on the raw line, before parsing), parses as a JSON object and has a numeric
    ``ts`` (unix seconds) with ``since <= ts <= until``. A file that cannot be
    read, and any other line (a traceback, a half-written last line), is
    skipped.
    """
    for path in paths:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if needle not in line or not line.startswith("{"):
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            ts = entry.get("ts") if isinstance(entry, dict) else None
            if isinstance(ts, (int, float)) and since <= ts <= until:
                yield float(ts), entry, path


@dataclass(eq=False)
class ChildProcess:
    """One ``lazarus`` child process, restartable with the same arguments.

    Attributes:
        name: e.g. ``coordinator-0``, ``agent-2``; its log is ``<log_dir>/<name>.log``.
        argv: the command line.
        log_path: where stdout and stderr go (appended across restarts).
        env: extra environment variables.
    """

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def pid(self) -> int | None:
        """The running child's pid, or None."""
        return self.popen.pid if self.alive and self.popen is not None else None

    @property
    def alive(self) -> bool:
        """True while the child has not exited."""
        return self.popen is not None and self.popen.poll() is None

    def start(self) -> ChildProcess:
        """Launch (again). Raises RuntimeError when it is already running."""
        if self.alive:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        env = {**os.environ, **self.env}
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        self.starts += 1
        _LIVE.add(self)
        return self

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the child (only while it is unreaped)."""
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, sig)

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.popen is None:
            return
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)
        _LIVE.discard(self)

    def pause(self) -> None:
        """SIGSTOP."""
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT."""
        self.signal(signal.SIGCONT)

    def terminate(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM (+SIGCONT), wait up to ``timeout_s``, then SIGKILL; return the exit status."""
        if self.popen is None:
            return None
        self.signal(signal.SIGTERM)
        self.signal(signal.SIGCONT)
        try:
            code = self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.popen.returncode
        _LIVE.discard(self)
        return code

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of its log."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


@dataclass
class DevCertificates:
    """A cluster CA and certificates made on demand, for local clusters and tests.

    Attributes:
        directory: holds ``ca.crt``, ``ca.key`` and ``<kind>-<name>.crt/.key``.
        cluster: the identities' cluster.
    """

    directory: Path
    cluster: str

    def __post_init__(self) -> None:
        if not (self.directory / "ca.key").exists():
            init_ca(self.directory, self.cluster)

    @property
    def ca_file(self) -> str:
        """The CA bundle every party verifies with."""
        return str(self.directory / "ca.crt")

    def member(self, member_id: str, hosts: Sequence[str]) -> tuple[str, str]:
        """(cert file, key file) of a coordinator replica serving under ``hosts``."""
        files = issue(
            self.directory,
            self.directory,
            Identity(IdentityKind.MEMBER, self.cluster, member_id),
            hosts=["127.0.0.1", "localhost", *hosts],
        )
        return str(files.cert_file), str(files.key_file)

    def client_tls(
        self, kind: IdentityKind, name: str, role: str = "", **issue_kw: Any
    ) -> ClientTls:
        """Issue a certificate for (kind, name, role) and return how to dial with it."""
        stem = f"{kind.value}-{name}" + (f"-{role}" if role else "")
        files = issue(
            self.directory,
            self.directory,
            Identity(kind, self.cluster, name, role),
            basename=stem,
            **issue_kw,
        )
        return ClientTls(self.ca_file, str(files.cert_file), str(files.key_file))

    def node_args(self, node_id: str) -> list[str]:
        """``lazarus node-agent`` flags for the node certificate of ``node_id``."""
        tls = self.client_tls(IdentityKind.NODE, node_id)
        return [
            "--tls-ca-file",
            tls.ca_file,
            "--tls-cert-file",
            tls.cert_file,
            "--tls-key-file",
            tls.key_file,
        ]


class ClusterApi:
    """The CoordinatorService calls a harness needs, over whichever replicas answer.

    Subclasses say where the replicas are (``api_addresses``) and, with TLS,
    how to dial them (``client_tls``).
    """

    client_tls: ClientTls = ClientTls()

    def api_addresses(self) -> list[str]:
        """host:port of the replicas to try, in order."""
        raise NotImplementedError

    async def call(self, method: str, request: Any, *, timeout_s: float = 5.0) -> Any:
        """Call a CoordinatorService RPC on the first replica that answers.

        UNAVAILABLE and DEADLINE_EXCEEDED move on to the next replica.

        Raises:
            grpc.aio.AioRpcError: every replica failed; the last error.
            RuntimeError: there is no replica to try.
        """
        last: grpc.aio.AioRpcError | None = None
        for address in self.api_addresses():
            async with self.client_tls.aio_channel(address) as channel:
                stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)  # type: ignore[no-untyped-call]
                try:
                    return await getattr(stub, method)(request, timeout=timeout_s)
                except grpc.aio.AioRpcError as exc:
                    last = exc
                    if exc.code() not in (
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                    ):
                        raise
        if last is not None:
            raise last
        raise RuntimeError("no coordinator is running")

    async def list_nodes(self) -> list[records_pb2.NodeRecord]:
        """Every node record (one page of up to 1,000)."""
        reply = await self.call("ListNodes", coordinator_pb2.ListNodesRequest(page_size=1000))
        return [info.record for info in reply.nodes]

    async def list_tasks(self) -> list[records_pb2.TaskRecord]:
        """Every task record, all pages."""
        tasks: list[records_pb2.TaskRecord] = []
        token = ""
        while True:
            reply = await self.call(
                "ListTasks", coordinator_pb2.ListTasksRequest(page_size=1000, page_token=token)
            )
            tasks.extend(reply.tasks)
            token = reply.next_page_token
            if not token:
                return tasks

    async def submit(
        self, request_id: str, kind: str, payload: bytes, **spec: Any
    ) -> records_pb2.TaskRecord:
        """Submit a task (idempotent on ``request_id``); returns its record."""
        reply = await self.call(
            "SubmitTask",
            coordinator_pb2.SubmitTaskRequest(
                request_id=request_id,
                spec=records_pb2.TaskSpec(
                    kind=kind, payload=payload, content_type="application/json", **spec
                ),
            ),
        )
        return reply.task  # type: ignore[no-any-return]


class LocalCluster(ClusterApi):
    """etcd + Redis + ``coordinators`` coordinators + ``agents`` node agents on loopback.

    Args:
        run_dir: directory for every log, store and data dir (created).
        coordinators: coordinator replicas (>= 1).
        agents: node agents (>= 0).
        etcd_members: 1 or 3 etcd members.
        cluster: cluster name.
        agent_args: extra ``lazarus node-agent`` arguments for every agent.
        coordinator_args: extra ``lazarus coordinator`` arguments.
        env: extra environment for the children.
        listen_host: address the coordinators bind (127.0.0.1, or a test
            namespace's host-side address in 198.18.0.0/15).
        redis_bind: addresses redis-server binds (127.0.0.1 always first).
        durable_redis: run Redis with an fsync'd append-only file, so a Redis
            restart keeps what it acknowledged (as a production Redis must).
        tls: mutual TLS and authorization on (default; certificates in
            ``<run_dir>/tls``); False: every coordinator runs ``--auth none``.
        etcd_args: extra arguments for every etcd member (for example
            ``--auto-compaction-mode=revision``, as the chart sets it).
        spread_agents: agent i first dials replica i mod n (its list is
            rotated to offset the agent's own ``spread_start``), so with
            ``--fan-in`` each replica holds a third of the Sessions exactly;
            default: the list in order, each agent starting where its node id
            puts it (``node_agent.core.dial.spread_start``).
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        coordinators: int = 3,
        agents: int = 3,
        etcd_members: int = 1,
        cluster: str = "dev",
        agent_args: Sequence[str] = (),
        coordinator_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        listen_host: str = "127.0.0.1",
        redis_bind: Sequence[str] = (),
        durable_redis: bool = True,
        tls: bool = True,
        etcd_args: Sequence[str] = (),
        spread_agents: bool = False,
    ) -> None:
        if coordinators < 1:
            raise ValueError(f"coordinators: must be >= 1, got {coordinators}")
        if agents < 0:
            raise ValueError(f"agents: must be >= 0, got {agents}")
        if etcd_members not in (1, 3):
            raise ValueError(f"etcd_members: must be 1 or 3, got {etcd_members}")
        self.run_dir = Path(run_dir).resolve()  # children chdir; relative paths would break
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.cluster = cluster
        self.n_coordinators = coordinators
        self.n_agents = agents
        self.etcd_members = etcd_members
        self.etcd_args = list(etcd_args)
        self.agent_args = list(agent_args)
        self.coordinator_args = list(coordinator_args)
        self.env = {"PYTHONUNBUFFERED": "1", **(env or {})}
        self.listen_host = listen_host
        self.redis_bind = list(redis_bind)
        self.durable_redis = durable_redis
        self.spread_agents = spread_agents
        self.etcd: EtcdServer | EtcdCluster | None = None
        self.redis: RedisServer | None = None
        self.coordinators: list[ChildProcess] = []
        self.agents: list[ChildProcess] = []
        self.coordinator_addresses: list[str] = []
        self.coordinator_metrics: list[str] = []
        self.agent_metrics: list[str] = []
        self.certs: DevCertificates | None = None
        if tls:
            self.certs = DevCertificates(self.run_dir / "tls", cluster)
            self.client_tls = self.certs.client_tls(IdentityKind.CLIENT, "harness", "admin")

    @property
    def mtls(self) -> bool:
        """True when the cluster runs with mutual TLS."""
        return self.certs is not None

    def client_env(self) -> dict[str, str]:
        """Environment for a ``lazarus`` operator command run as the harness (admin)."""
        return self.client_tls.env() if self.certs is not None else {}

    def _security_args(self, member_id: str, host: str) -> list[str]:
        if self.certs is None:
            return ["--auth", "none"]
        cert, key = self.certs.member(member_id, [host])
        return [
            "--tls-cert-file",
            cert,
            "--tls-key-file",
            key,
            "--tls-client-ca-file",
            self.certs.ca_file,
        ]

    # ---------------------------------------------------------------- parts

    @property
    def etcd_endpoints(self) -> list[str]:
        """host:port of each etcd member."""
        if isinstance(self.etcd, EtcdCluster):
            return [str(e) for e in self.etcd.endpoints]
        if isinstance(self.etcd, EtcdServer):
            return [str(self.etcd.endpoint)]
        return []

    @property
    def redis_url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        if self.redis is None:
            raise RuntimeError("redis is not started")
        return f"redis://{self.redis.endpoint}/0"

    def start_stores(self) -> None:
        """Start etcd and Redis (idempotent)."""
        if self.etcd is None:
            if self.etcd_members == 3:
                self.etcd = EtcdCluster(3, base_dir=self.run_dir, extra_args=self.etcd_args)
            else:
                self.etcd = EtcdServer(data_dir=self.run_dir / "etcd", extra_args=self.etcd_args)
            self.etcd.start()
        if self.redis is None:
            args: list[str] = []
            if self.redis_bind:
                # The extra addresses are test namespaces' veths in 198.18.0.0/15;
                # protected mode would refuse them without a password.
                args = ["--bind", " ".join(["127.0.0.1", *self.redis_bind])]
                args += ["--protected-mode", "no"]
            if self.durable_redis:
                args += ["--appendonly", "yes", "--appendfsync", "always"]
            self.redis = RedisServer(data_dir=self.run_dir / "redis", extra_args=args).start()

    def add_coordinator(self) -> ChildProcess:
        """Create and start one more coordinator replica."""
        index = len(self.coordinators)
        port, metrics_port = free_loopback_ports(2)
        address = f"{self.listen_host}:{port}"
        metrics = f"127.0.0.1:{metrics_port}"
        endpoints = self.etcd_endpoints
        child = ChildProcess(
            f"coordinator-{index}",
            [
                LAZARUS_BIN,
                "coordinator",
                "--cluster",
                self.cluster,
                "--member-id",
                f"coordinator-{index}",
                "--listen",
                address,
                "--etcd-endpoint",
                endpoints[index % len(endpoints)],
                "--etcd-endpoints",  # every member, this replica's own first
                ",".join(endpoints[index % len(endpoints) :] + endpoints[: index % len(endpoints)]),
                "--metrics-listen",
                metrics,
                "--redis-url",
                self.redis_url,
                *self._security_args(f"coordinator-{index}", self.listen_host),
                *self.coordinator_args,
            ],
            self.run_dir / f"coordinator-{index}.log",
            dict(self.env),
        )
        self.coordinators.append(child)
        self.coordinator_addresses.append(address)
        self.coordinator_metrics.append(f"http://{metrics}/metrics")
        return child.start()

    def add_agent(
        self, *extra: str, wrapper: Sequence[str] = (), redis_host: str = ""
    ) -> ChildProcess:
        """Create and start one more node agent ``agent-<i>`` (data dir ``<run_dir>/agent-<i>``).

        Args:
            extra: more ``lazarus node-agent`` arguments.
            wrapper: a command prefix, e.g. ``["ip", "netns", "exec", "ns1"]``.
            redis_host: the address the agent dials Redis at (default 127.0.0.1).
        """
        index = len(self.agents)
        (metrics_port,) = free_loopback_ports(1)
        addresses = list(self.coordinator_addresses)
        args = [*self.agent_args, *extra]  # a later --node-id wins: its certificate too
        node_id = next(
            (args[i + 1] for i in range(len(args) - 2, -1, -1) if args[i] == "--node-id"),
            f"agent-{index}",
        )
        if self.spread_agents and addresses:
            # The agent starts at spread_start(node id) of its list: rotate the
            # list so that place is replica index mod n.
            n = len(addresses)
            first = (index - spread_start(node_id, n)) % n
            addresses = addresses[first:] + addresses[:first]
        child = ChildProcess(
            f"agent-{index}",
            [
                *wrapper,
                LAZARUS_BIN,
                "node-agent",
                "--node-id",
                f"agent-{index}",
                "--coordinators",
                ",".join(addresses),
                "--data-dir",
                str(self.run_dir / f"agent-{index}"),
                "--redis-url",
                self.redis_url.replace("127.0.0.1", redis_host) if redis_host else self.redis_url,
                "--metrics-listen",
                f"127.0.0.1:{metrics_port}",
                *(self.certs.node_args(node_id) if self.certs is not None else []),
                *self.agent_args,
                *extra,
            ],
            self.run_dir / f"agent-{index}.log",
            dict(self.env),
        )
        self.agents.append(child)
        self.agent_metrics.append(f"http://127.0.0.1:{metrics_port}/metrics")
        return child.start()

    def start(self) -> LocalCluster:
        """Start the stores, the coordinators and the agents (does not wait; see ``ready``)."""
        self.start_stores()
        for _ in range(self.n_coordinators):
            self.add_coordinator()
        for _ in range(self.n_agents):
            self.add_agent()
        return self

    def stop(self) -> None:
        """Stop agents, then coordinators (SIGTERM, bounded), then Redis and etcd."""
        for child in [*self.agents, *self.coordinators]:
            child.signal(signal.SIGCONT)
        for child in self.agents:
            child.terminate(10.0)
        for child in self.coordinators:
            child.terminate(10.0)
        if self.redis is not None:
            self.redis.stop()
        if self.etcd is not None:
            self.etcd.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ API helpers

    def channel(self, index: int | None = None) -> grpc.aio.Channel:
        """A channel to a coordinator as the harness's admin client (any replica serves the API)."""
        address = self.coordinator_addresses[index or 0]
        return self.client_tls.aio_channel(address)

    def api_addresses(self) -> list[str]:
        """Addresses of the coordinators running now."""
        return [
            address
            for address, child in zip(self.coordinator_addresses, self.coordinators, strict=True)
            if child.alive
        ]

    async def ready(self, timeout_s: float = 30.0) -> None:
        """Wait until a leader serves and every running agent is ALIVE.

        Raises:
            TimeoutError: not ready in time (the message says what was missing).
        """
        want = {c.name for c in self.agents if c.alive}
        deadline = time.monotonic() + timeout_s
        missing: set[str] = set(want)
        while time.monotonic() < deadline:
            try:
                nodes = await self.list_nodes()
            except (grpc.aio.AioRpcError, RuntimeError):
                await asyncio.sleep(0.2)
                continue
            alive = {n.node_id for n in nodes if n.state == records_pb2.NODE_STATE_ALIVE}
            missing = want - alive
            if not missing:
                return
            await asyncio.sleep(0.2)
        raise TimeoutError(f"cluster not ready after {timeout_s} s: agents not ALIVE: {missing}")

    async def leader(self) -> tuple[int, str]:
        """(index in ``coordinators``, member id) of the current leader.

        Raises:
            RuntimeError: no replica names a leader it knows.
        """
        deadline = time.monotonic() + 10.0
        leader_id = ""
        while time.monotonic() < deadline:
            for index, child in enumerate(self.coordinators):
                if not child.alive:
                    continue
                # Ask each live replica: a follower may not have seen the leader yet.
                with contextlib.suppress(grpc.aio.AioRpcError):
                    async with self.channel(index) as channel:
                        stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)  # type: ignore[no-untyped-call]
                        status = await stub.GetClusterStatus(
                            coordinator_pb2.GetClusterStatusRequest(), timeout=2.0
                        )
                    leader_id = status.leader_id
                    for i, c in enumerate(self.coordinators):
                        if c.name == leader_id and c.alive:
                            return i, leader_id
            await asyncio.sleep(0.1)  # between leaders
        raise RuntimeError(f"no live replica leads (last answer: leader {leader_id!r})")
