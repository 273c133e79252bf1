"""One coordinator replica assembled: etcd client, election, store, cache, runtime, gRPC.

Theory of operation: :class:`CoordinatorServer` wires the pieces and owns
their lifetimes; it decides nothing. ``start`` connects to etcd, binds the gRPC
port (AgentService + CoordinatorService), starts the read cache, the leader
loop and, when asked, the metrics HTTP endpoint. ``stop`` writes the task
progress the leader held back (``ResignRequested``, bounded by 1 s), resigns
(another replica can lead right away), then stops the loop, the server, the
cache and the client, in that order.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from dataclasses import dataclass, field
from typing import Any

import aetcd
import grpc.aio
import redis.asyncio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection as _reflection

from coordinator.aetcd_compat import TOKEN_RENEWAL_S, RenewingClient, TlsClient, tls_credentials
from coordinator.api import REDIS_TIMEOUT_S, CoordinatorApi, add_coordinator_service
from coordinator.auth import AuthInterceptor, TokenFile, warn_auth_none
from coordinator.core import CoreSettings
from coordinator.core.admission import AdmissionSettings, ConcurrencyCap
from coordinator.documents import DocumentObserver, DocumentService, TeeObserver
from coordinator.election import Election, KeepaliveThread
from coordinator.etcd_store import EtcdStore, ReadCache, election_prefix
from coordinator.eventarchive import EventArchive
from coordinator.forwarding import SessionForwarder, add_replica_service, interregnum_settings
from coordinator.members import MemberRegistry
from coordinator.metrics import Metrics
from coordinator.recordarchive import DEFAULT_TTL_S as ARCHIVE_TTL_S
from coordinator.recordarchive import RecordArchive
from coordinator.redisconn import redis_client
from coordinator.runtime import CoordinatorRuntime, Observer, RuntimeSettings
from coordinator.session import add_agent_service
from lazarus import __version__
from lazarus.grpcopts import etcd_channel_options, server_options
from lazarus.tls import ClientTls, ServerTls

__all__ = ["CoordinatorServer", "ServerSettings", "make_etcd_client"]

_log = logging.getLogger("lazarus.coordinator.server")

ETCD_GRPC_OPTIONS = {
    "grpc.enable_http_proxy": 0,
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 500,
    # A member that goes silent without a RST (blackholed) is dropped within
    # lazarus.grpcopts' etcd bound, not after TCP's ~15 min: its calls (the
    # shared watch stream among them) fail UNAVAILABLE and go to another member.
    **etcd_channel_options(),
}


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """Process-level settings of one replica.

    Attributes:
        cluster: cluster name (etcd prefix ``/lazarus/<cluster>/``).
        member_id: this replica's id.
        listen: host:port the gRPC server binds (port 0: any free port).
        advertise_address: host:port others dial ("": the bound listen address,
            with a wildcard host replaced by this host's name).
        etcd_endpoint: host:port of one etcd member.
        etcd_endpoints: host:port of every etcd member (overrides
            ``etcd_endpoint`` when given): the client spreads its calls over
            those that answer and moves off a member that fails, keeping the
            lease and the leadership. Host names are resolved once, at start.
        loop_lag_resign_s: the election keepalive runs on its own thread; a
            leader whose event loop lags this long revokes its lease (resigns).
        admission: Hello rate, Session and orchestrator-RPC caps, outbound
            queue bound.
        lease_ttl_s: election lease TTL, whole seconds.
        etcd_timeout_s: bound on each etcd request.
        shutdown_grace_s: time open RPCs get to finish on stop.
        etcd_username: etcd user when etcd has auth enabled ("": no auth).
        etcd_password: that user's password (both or neither).
        etcd_ca_file: PEM CA bundle verifying etcd's certificate; any of
            the three file settings turns TLS on ("" with TLS on: the
            system roots).
        etcd_cert_file: PEM client certificate for mutual TLS ("": none).
        etcd_key_file: PEM private key of ``etcd_cert_file``.
        etcd_token_renewal_s: with a username, re-authenticate this often
            (below etcd's ``--auth-token-ttl``, 300 s by default).
        redis_url: the Redis holding replicated checkpoints (GetCheckpoint).
        redis_password: its AUTH password ("" = none or the one in the URL).
        redis_ca_file: CA bundle verifying a ``rediss://`` server ("" = system).
        archive_ttl_s: seconds Redis keeps a retired record and the retired
            task's checkpoint keys (``coordinator.recordarchive``); 0 = forever.
        metrics_address: host:port of this replica's /metrics, published in its
            member record ("" = none).
        auth: ``mtls`` (default: TLS, client certificates or bearer tokens,
            the policy of :mod:`coordinator.authz`) or ``none`` (plaintext,
            no checks, a warning every minute; local experiments only).
        tls_cert_file: PEM certificate of this replica (a member certificate:
            it serves with it and proxies to the leader with it).
        tls_key_file: its private key.
        tls_client_ca_file: PEM bundle of the CA(s) that sign peers' certificates.
        tls_server_name: name verified in the leader's certificate when
            proxying ("" = the dialled host).
        auth_token_file: hashed bearer tokens (see :class:`TokenFile`; "" = none).
        token_listen: a second host:port, TLS without client certificates,
            for bearer-token clients ("" = none).
        reflection: serve gRPC server reflection (off: grpcurl needs the protos).
        health_listen: a plaintext host:port serving only ``grpc.health.v1``,
            for probes that cannot speak TLS (Kubernetes' gRPC probe); "" = none.
        fan_in: as a follower, hold agents' Sessions and forward them to the
            leader (``coordinator.forwarding``) instead of answering NotLeader.
        interregnum_acks: with ``fan_in``, ack held agents' heartbeats by rule
            (b) of ``docs/fan-in.md`` once the leader's election key is seen
            deleted (off: agents rely on the leader's acks alone and may
            fence when a leader crash outlasts their fence bound).

    Raises:
        ValueError: only one of username / password, or of cert / key file, given.
    """

    cluster: str
    member_id: str
    listen: str = "127.0.0.1:0"
    advertise_address: str = ""
    etcd_endpoint: str = "127.0.0.1:2379"
    etcd_endpoints: tuple[str, ...] = ()
    loop_lag_resign_s: float = 5.0
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    lease_ttl_s: int = 3
    etcd_timeout_s: float = 5.0
    shutdown_grace_s: float = 0.5
    etcd_username: str = ""
    etcd_password: str = field(default="", repr=False)
    etcd_ca_file: str = ""
    etcd_cert_file: str = ""
    etcd_key_file: str = ""
    etcd_token_renewal_s: float = TOKEN_RENEWAL_S
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_password: str = field(default="", repr=False)
    redis_ca_file: str = ""
    archive_ttl_s: int = ARCHIVE_TTL_S
    metrics_address: str = ""
    auth: str = "mtls"
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""
    tls_server_name: str = ""
    auth_token_file: str = ""
    token_listen: str = ""
    reflection: bool = True
    health_listen: str = ""
    fan_in: bool = False
    interregnum_acks: bool = True

    def __post_init__(self) -> None:
        if self.auth not in ("mtls", "none"):
            raise ValueError(f"auth: 'mtls' or 'none', got {self.auth!r}")
        tls_files = (self.tls_cert_file, self.tls_key_file, self.tls_client_ca_file)
        if self.auth == "mtls" and not all(tls_files):
            raise ValueError(
                "auth mtls needs --tls-cert-file, --tls-key-file and --tls-client-ca-file "
                "(`lazarus certs init` / `issue` make them); --auth none turns security off"
            )
        if self.auth == "none" and (any(tls_files) or self.auth_token_file or self.token_listen):
            raise ValueError("--auth none serves plaintext: drop the TLS and token settings")
        if bool(self.etcd_username) != bool(self.etcd_password):
            raise ValueError("give both etcd username and password, or neither")
        if bool(self.etcd_cert_file) != bool(self.etcd_key_file):
            raise ValueError("give both etcd cert file and key file, or neither")
        if self.loop_lag_resign_s <= 0.5:
            raise ValueError("the loop lag bound must be above 0.5 s")
        if self.etcd_token_renewal_s <= 0:
            raise ValueError("the etcd token renewal period must be positive")
        if self.archive_ttl_s < 0:
            raise ValueError("the archive TTL must be >= 0 seconds (0 keeps records forever)")

    @property
    def etcd_tls(self) -> bool:
        """True when the etcd client talks TLS (a CA, cert or key file is set)."""
        return bool(self.etcd_ca_file or self.etcd_cert_file or self.etcd_key_file)


class CoordinatorServer:
    """A running replica; see the module docstring.

    Args:
        settings: process settings.
        core_settings: the core's settings.
        observer: metrics observer (None: none).
        seed: the core's random seed (None: random).
    """

    def __init__(
        self,
        settings: ServerSettings,
        core_settings: CoreSettings,
        *,
        observer: Observer | None = None,
        seed: int | None = None,
    ) -> None:
        self.settings = settings
        self.core_settings = core_settings
        self._observer = observer
        self._seed = seed
        self._client: aetcd.Client | None = None
        self._server: grpc.aio.Server | None = None
        self._api: CoordinatorApi | None = None
        self.documents: DocumentService | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._members: MemberRegistry | None = None
        self._archive_redis: redis.asyncio.Redis | None = None
        self.runtime: CoordinatorRuntime | None = None
        self._health: health_aio.HealthServicer | None = None
        self._failure_task: asyncio.Task[None] | None = None
        self.address = ""
        self.server_tls: ServerTls | None = None
        self._probe_server: grpc.aio.Server | None = None
        self.forwarder: SessionForwarder | None = None

    async def start(self) -> None:
        """Connect, bind, serve, campaign.

        Raises:
            aetcd.ClientError: etcd unreachable.
            RuntimeError: the listen address cannot be bound.
        """
        s = self.settings
        client = make_etcd_client(s)
        await client.connect()
        self._client = client
        server, bound = self._bind()
        if bound == 0:
            raise RuntimeError(f"cannot bind {s.listen}")
        listen_host = s.listen.rpartition(":")[0]
        if listen_host in ("", "0.0.0.0", "[::]", "::"):  # a wildcard is not dialable
            listen_host = socket.gethostname()
        self.address = s.advertise_address or f"{listen_host}:{bound}"
        store = EtcdStore(client, s.cluster, timeout_s=s.etcd_timeout_s)
        cache = ReadCache(store)
        observer = self._observer
        documents = DocumentService(
            s.redis_url,
            redis_password=s.redis_password,
            redis_ca_file=s.redis_ca_file,
            metrics=observer if isinstance(observer, DocumentObserver) else None,
        )
        self.documents = documents
        runtime = CoordinatorRuntime(
            self.core_settings,
            RuntimeSettings(
                cluster=s.cluster,
                member_id=s.member_id,
                advertise_address=self.address,
                admission=s.admission,
            ),
            election=Election(
                client,
                election_prefix(s.cluster),
                ttl_s=s.lease_ttl_s,
                keepalive=KeepaliveThread(
                    lambda: make_etcd_client(s), resign_after_lag_s=s.loop_lag_resign_s
                ),
            ),
            store=store,
            seed=self._seed,
            observer=TeeObserver(observer, documents),
        )
        documents.attach(runtime)
        self.runtime = runtime
        forward_observer = observer if isinstance(observer, Metrics) else None
        if s.fan_in:
            self.forwarder = SessionForwarder(
                runtime,
                self.member_tls(),
                forward_observer,
                max_outbound=s.admission.max_outbound_messages,
                interregnum=interregnum_settings(
                    self.core_settings.heartbeat_interval_s,
                    self.core_settings.fence_after_s,
                    self.core_settings.dead_after_s,
                    float(s.lease_ttl_s),
                )
                if s.interregnum_acks
                else None,
            )
        sessions = add_agent_service(server, runtime, documents, self.forwarder)
        add_replica_service(server, runtime, sessions.Session, forward_observer)
        archive_redis = redis_client(
            s.redis_url,
            password=s.redis_password,
            ca_file=s.redis_ca_file,
            timeout_s=REDIS_TIMEOUT_S,
        )
        self._archive_redis = archive_redis
        archive = EventArchive(archive_redis, s.cluster)
        runtime.record_archive = RecordArchive(archive_redis, s.cluster, s.archive_ttl_s)
        runtime.event_log.sink = archive.offer
        if isinstance(observer, Metrics):
            observer.watch_archive(lambda: archive.backlog, lambda: archive.dropped)
        self._api = add_coordinator_service(
            server,
            runtime,
            cache,
            redis_url=s.redis_url,
            redis_password=s.redis_password,
            redis_ca_file=s.redis_ca_file,
            etcd_client=client,
            archive=archive,
            member_tls=self.member_tls(),
            records=runtime.record_archive,
        )
        self._health = await add_health_and_reflection(server, reflection=s.reflection)
        runtime.on_failure(self._leader_loop_failed)
        if s.health_listen:  # probes: health only, plaintext, nothing else on this port
            probe_server = grpc.aio.server(options=server_options())
            health_pb2_grpc.add_HealthServicer_to_server(self._health, probe_server)
            if probe_server.add_insecure_port(s.health_listen) == 0:
                raise RuntimeError(f"cannot bind {s.health_listen}")
            await probe_server.start()
            self._probe_server = probe_server
        await server.start()
        self._server = server
        self._members = MemberRegistry(
            client,
            s.cluster,
            runtime.election,
            member_id=s.member_id,
            address=self.address,
            metrics_address=s.metrics_address,
            version=__version__,
        )
        self._tasks = [
            asyncio.create_task(cache.run(), name="read-cache"),
            asyncio.create_task(runtime.run(), name="leader-loop"),
            asyncio.create_task(runtime.observe_leaders(), name="leader-observer"),
            asyncio.create_task(self._members.run(), name="member-record"),
            asyncio.create_task(archive.run(), name="event-archive"),
        ]
        if s.auth == "none":
            self._tasks.append(asyncio.create_task(warn_auth_none(), name="auth-none-warning"))
        _log.info(
            "serving: member=%s address=%s cluster=%s etcd=%s",
            s.member_id,
            self.address,
            s.cluster,
            ",".join(s.etcd_endpoints) or s.etcd_endpoint,
        )

    def _bind(self) -> tuple[grpc.aio.Server, int]:
        """The gRPC server, with the auth interceptor and TLS unless ``auth`` is none.

        Returns:
            The server and the port bound for ``listen``.

        Raises:
            RuntimeError: an address cannot be bound.
            OSError: a certificate file cannot be read.
        """
        s = self.settings
        cap = RpcCap(s.admission.max_concurrent_rpcs)  # orchestrator calls in flight
        if s.auth == "none":
            server = grpc.aio.server(interceptors=[cap], options=server_options())
            return server, server.add_insecure_port(s.listen)
        registry = getattr(self._observer, "registry", None)
        interceptor = AuthInterceptor(
            s.cluster,
            tokens=TokenFile(s.auth_token_file, s.cluster) if s.auth_token_file else None,
            reflection=s.reflection,
            registry=registry,
        )
        server = grpc.aio.server(interceptors=[interceptor, cap], options=server_options())
        self.server_tls = ServerTls(s.tls_cert_file, s.tls_key_file, s.tls_client_ca_file)
        bound = server.add_secure_port(s.listen, self.server_tls.credentials())
        if s.token_listen:
            token_tls = ServerTls(
                s.tls_cert_file, s.tls_key_file, s.tls_client_ca_file, require_client_cert=False
            )
            if server.add_secure_port(s.token_listen, token_tls.credentials()) == 0:
                raise RuntimeError(f"cannot bind {s.token_listen}")
        return server, bound

    def member_tls(self) -> ClientTls:
        """How this replica dials the leader: its own certificate, the cluster CA."""
        s = self.settings
        if s.auth == "none":
            return ClientTls()
        return ClientTls(s.tls_client_ca_file, s.tls_cert_file, s.tls_key_file, s.tls_server_name)

    def _leader_loop_failed(self, exc: BaseException) -> None:
        """The leader loop ended with an error (it resigned): health turns NOT_SERVING."""
        health = self._health
        if health is None:
            return

        async def not_serving() -> None:
            for name in ("", *SERVICE_NAMES):
                await health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

        _log.error("leader loop failed (%s): health is NOT_SERVING; restart this replica", exc)
        self._failure_task = asyncio.create_task(not_serving(), name="health-not-serving")

    async def stop(self) -> None:
        """Flush held-back progress, resign, then stop serving and close everything (idempotent)."""
        runtime = self.runtime
        if self._health is not None:  # probes and load balancers stop sending first
            await self._health.enter_graceful_shutdown()
        if runtime is not None:  # progress the core holds back goes to etcd first
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await runtime.flush_before_resign()
        for task in self._tasks:  # leader loop first: it must not campaign again
            if task.get_name() == "leader-loop":
                await _cancel(task)
        if runtime is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await runtime.resign()
            if self._members is not None:
                for task in self._tasks:
                    if task.get_name() == "member-record":
                        await _cancel(task)
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(1.0):
                        await self._members.withdraw()
            with contextlib.suppress(Exception):
                await runtime.election.close()
        for task in self._tasks:
            await _cancel(task)
        self._tasks = []
        if self.forwarder is not None:  # its agents reconnect to the next replica
            await self.forwarder.close()
        if self._server is not None:
            await self._server.stop(self.settings.shutdown_grace_s)
            self._server = None
        if self._probe_server is not None:
            await self._probe_server.stop(0)
            self._probe_server = None
        if self._api is not None:
            await self._api.close()
            self._api = None
        if self.documents is not None:
            await self.documents.close()
            self.documents = None
        if self._archive_redis is not None:
            with contextlib.suppress(Exception):
                await self._archive_redis.aclose()
            self._archive_redis = None
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.close()
            self._client = None
        _log.info("stopped: member=%s", self.settings.member_id)


def make_etcd_client(settings: ServerSettings) -> aetcd.Client:
    """The aetcd client ``settings`` ask for: auth when a user is set, TLS when a file is.

    Args:
        settings: the replica's settings (``etcd_*`` fields).

    Returns:
        An unconnected client: :class:`~coordinator.aetcd_compat.TlsClient`
        under TLS, :class:`~coordinator.aetcd_compat.RenewingClient` with a
        username, else aetcd's own.

    Raises:
        OSError: a CA, certificate or key file cannot be read.
    """
    options: dict[str, Any] = dict(ETCD_GRPC_OPTIONS)
    if len(settings.etcd_endpoints) > 1:
        host, port = etcd_target(settings.etcd_endpoints)
        # Every member a subchannel; calls go to those that answer (etcd's own
        # Go client balances the same way), so a dead member costs a retry.
        options["grpc.lb_policy_name"] = "round_robin"
    else:
        endpoint = settings.etcd_endpoints[0] if settings.etcd_endpoints else settings.etcd_endpoint
        host, _, port_text = endpoint.rpartition(":")
        port = int(port_text)
    common: dict[str, Any] = {
        "host": host,
        "port": port,
        "username": settings.etcd_username or None,
        "password": settings.etcd_password or None,
        "timeout": settings.etcd_timeout_s,
        "options": options,
    }
    if settings.etcd_tls:
        return TlsClient(
            **common,
            token_renewal_s=settings.etcd_token_renewal_s,
            credentials=tls_credentials(
                settings.etcd_ca_file, settings.etcd_cert_file, settings.etcd_key_file
            ),
        )
    if settings.etcd_username:
        return RenewingClient(**common, token_renewal_s=settings.etcd_token_renewal_s)
    return aetcd.Client(**common)


def etcd_target(endpoints: tuple[str, ...] | list[str]) -> tuple[str, int]:
    """The (host, port) pair aetcd joins into one gRPC target naming every member.

    aetcd dials ``f"{host}:{port}"``; gRPC's ``ipv4:`` / ``ipv6:`` schemes take
    a comma-separated address list, so the host part carries all members but
    the last one's port. Names are resolved here, once.

    Args:
        endpoints: ``host:port`` of each member (IPv6 hosts in brackets).

    Returns:
        The host and port to give ``aetcd.Client``.

    Raises:
        ValueError: an endpoint without a port, or mixing IPv4 and IPv6.
    """
    addresses: list[tuple[str, int]] = []
    for endpoint in endpoints:
        host, sep, port_text = endpoint.strip().rpartition(":")
        if not sep or not port_text.isdigit():
            raise ValueError(f"etcd endpoint {endpoint!r}: expected host:port")
        host = host.strip("[]")
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            info = socket.getaddrinfo(host, int(port_text), type=socket.SOCK_STREAM)
            ip = ipaddress.ip_address(info[0][4][0])
        addresses.append((str(ip), int(port_text)))
    families = {ipaddress.ip_address(ip).version for ip, _ in addresses}
    if len(families) != 1:
        raise ValueError("etcd endpoints mix IPv4 and IPv6 addresses")
    if families == {6}:
        joined = ",".join(f"[{ip}]:{port}" for ip, port in addresses)
        scheme = "ipv6"
    else:
        joined = ",".join(f"{ip}:{port}" for ip, port in addresses)
        scheme = "ipv4"
    head, _, last_port = joined.rpartition(":")
    return f"{scheme}:{head}", int(last_port)


class RpcCap(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Caps the orchestrator's unary RPCs served at once; the rest get RESOURCE_EXHAUSTED.

    Args:
        limit: most unary CoordinatorService calls in flight.
    """

    PREFIX = "/lazarus.v1.CoordinatorService/"

    def __init__(self, limit: int) -> None:
        self.cap = ConcurrencyCap(limit)

    async def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        handler = await continuation(handler_call_details)
        if (
            handler is None
            or handler.unary_unary is None
            or not handler_call_details.method.startswith(self.PREFIX)
        ):
            return handler
        inner = handler.unary_unary
        cap = self.cap

        async def capped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            if not cap.acquire():
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{cap.limit} orchestrator calls in flight; retry with backoff",
                )
            try:
                return await inner(request, context)
            finally:
                cap.release()

        return grpc.unary_unary_rpc_method_handler(
            capped,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


SERVICE_NAMES = (
    "lazarus.v1.CoordinatorService",
    "lazarus.v1.AgentService",
)
"""Fully qualified names of the Lazarus services every replica serves."""


async def add_health_and_reflection(
    server: grpc.aio.Server, *, reflection: bool = True
) -> health_aio.HealthServicer:
    """Serve ``grpc.health.v1.Health`` and server reflection beside our services.

    Health says SERVING for "" (the whole server, what Kubernetes' gRPC probe
    asks) and for each name in ``SERVICE_NAMES`` on leader and followers alike:
    a follower serves reads and proxies writes, and redirects node Sessions.
    It turns NOT_SERVING on shutdown. Reflection (``grpc.reflection.v1alpha``)
    lets generic clients (grpcurl, grpc_requests) discover the API; both stay
    open to unauthenticated peers, and ``reflection=False`` leaves it out.
    """
    servicer = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    for name in ("", *SERVICE_NAMES):
        await servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    if reflection:
        _reflection.enable_server_reflection(
            (*SERVICE_NAMES, health.SERVICE_NAME, _reflection.SERVICE_NAME), server
        )
    return servicer


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
