"""Fixtures for tests against real etcd and Redis servers.

By default every server is a local process started by ``lazarus_dev.localservers`` on
free 127.0.0.1 ports in a temporary directory, and stopped by pid (SIGTERM, then
SIGKILL) when its fixture ends — also when the test failed. With
``LAZARUS_TEST_DOCKER=1`` the session servers come from pytest-docker and
``tests/integration/docker-compose.yml`` instead; the fault-injection factories
need local processes and skip their tests there.

Servers (session scope: shared; use unique keys, do not kill them):

- ``etcd``: one etcd member. ``.host``, ``.port``, ``.endpoint``, ``.endpoints``,
  ``.client_url`` (+ ``.pid``, ``.data_dir`` … when local: an ``EtcdServer``).
- ``etcd_cluster``: three etcd members. ``.host``, ``.endpoints``, ``.ports``,
  ``.client_urls`` (+ ``.members``, ``.stop_member(i)`` … when local: an
  ``EtcdCluster``).
- ``redis_server``: one redis-server. ``.host``, ``.port``, ``.endpoint``, ``.url``
  (+ ``.pid`` … when local: a ``RedisServer``).

Clients (function scope, closed at teardown):

- ``etcd_client``: ``aetcd.Client`` on ``etcd``.
- ``redis_client``: ``redis.asyncio.Redis`` on ``redis_server``.
- ``make_etcd_client(endpoint, timeout_s=...)``: awaitable factory of more aetcd clients.

Servers of your own, for fault injection (function scope, stopped at teardown;
keyword arguments go to the constructor; skipped under Docker):

- ``make_etcd(**kw) -> EtcdServer``
- ``make_etcd_cluster(size=3, **kw) -> EtcdCluster``
- ``make_redis_server(**kw) -> RedisServer``

Every test in this directory gets the ``integration`` marker.
"""

from __future__ import annotations

import contextlib
import os
import signal
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aetcd
import pytest
import redis.asyncio

from lazarus_dev.localservers import (
    Endpoint,
    EtcdCluster,
    EtcdServer,
    RedisServer,
    etcd_is_healthy,
    redis_answers_ping,
)

USE_DOCKER = os.environ.get("LAZARUS_TEST_DOCKER") == "1"
"""Take the session servers from docker compose instead of local processes."""

ETCD_CLIENT_TIMEOUT_S = 5.0
"""Deadline of every aetcd call made through the client fixtures."""

REDIS_CLIENT_TIMEOUT_S = 5.0
"""Connect and read timeout of the redis client fixture."""

# gRPC honours http_proxy / grpc_proxy from the environment; loopback only here.
GRPC_OPTIONS: dict[str, Any] = {"grpc.enable_http_proxy": 0}

COMPOSE_FILE = Path(__file__).with_name("docker-compose.yml")
COMPOSE_READY_TIMEOUT_S = 60.0

_HERE = Path(__file__).resolve().parent


def _sigterm_as_interrupt(signum: int, frame: types.FrameType | None) -> None:
    raise KeyboardInterrupt(f"received signal {signum}")


_previous_sigterm_handler: Any = None


def pytest_configure(config: pytest.Config) -> None:
    """Make SIGTERM (CI timeouts, ``kill``) tear fixtures down like Ctrl-C does.

    Python's default SIGTERM action exits without finalizers or ``atexit``, which
    would leave the server processes (in their own sessions) running.
    """
    global _previous_sigterm_handler
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        _previous_sigterm_handler = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Put back the SIGTERM handler found at start."""
    if _previous_sigterm_handler is not None:
        signal.signal(signal.SIGTERM, _previous_sigterm_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test under tests/integration as ``integration``."""
    for item in items:
        if _HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.integration)


# ---------------------------------------------------------------- Docker mode


@dataclass(frozen=True)
class ComposeServer:
    """A single server published by docker compose on the Docker host."""

    endpoint: Endpoint

    @property
    def host(self) -> str:
        return self.endpoint.host

    @property
    def port(self) -> int:
        return self.endpoint.port

    @property
    def endpoints(self) -> list[Endpoint]:
        return [self.endpoint]

    @property
    def client_url(self) -> str:
        return f"http://{self.endpoint}"

    @property
    def client_urls(self) -> list[str]:
        return [self.client_url]

    @property
    def url(self) -> str:
        return f"redis://{self.endpoint}/0"


@dataclass(frozen=True)
class ComposeCluster:
    """An etcd cluster published by docker compose, one endpoint per member."""

    endpoints: list[Endpoint]

    @property
    def host(self) -> str:
        return self.endpoints[0].host

    @property
    def ports(self) -> list[int]:
        return [e.port for e in self.endpoints]

    @property
    def client_urls(self) -> list[str]:
        return [f"http://{e}" for e in self.endpoints]


@pytest.fixture(scope="session")
def docker_compose_file() -> str:
    """pytest-docker: our compose file lives next to this conftest."""
    return str(COMPOSE_FILE)


def _compose_endpoint(
    request: pytest.FixtureRequest,
    service: str,
    container_port: int,
    probe: Callable[[str, int, float], bool],
) -> Endpoint:
    services = request.getfixturevalue("docker_services")
    host = request.getfixturevalue("docker_ip")
    endpoint = Endpoint(host, services.port_for(service, container_port))
    services.wait_until_responsive(
        check=lambda: probe(endpoint.host, endpoint.port, 1.0),
        timeout=COMPOSE_READY_TIMEOUT_S,
        pause=0.2,
    )
    return endpoint


# ---------------------------------------------------------------- session servers


@pytest.fixture(scope="session")
def etcd(request: pytest.FixtureRequest) -> Iterator[EtcdServer | ComposeServer]:
    """One etcd member (heartbeat 50 ms, election 500 ms: 1 s leases are 1 s)."""
    if USE_DOCKER:
        yield ComposeServer(_compose_endpoint(request, "etcd", 2379, etcd_is_healthy))
        return
    with EtcdServer() as server:
        yield server


@pytest.fixture(scope="session")
def etcd_cluster(request: pytest.FixtureRequest) -> Iterator[EtcdCluster | ComposeCluster]:
    """A 3-member etcd cluster (heartbeat 100 ms, election 1000 ms)."""
    if USE_DOCKER:
        yield ComposeCluster(
            [_compose_endpoint(request, f"etcd-{i}", 2379, etcd_is_healthy) for i in range(3)]
        )
        return
    with EtcdCluster(3) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def redis_server(request: pytest.FixtureRequest) -> Iterator[RedisServer | ComposeServer]:
    """One redis-server without persistence."""
    if USE_DOCKER:
        yield ComposeServer(_compose_endpoint(request, "redis", 6379, redis_answers_ping))
        return
    with RedisServer() as server:
        yield server


# ---------------------------------------------------------------- clients


def etcd_client_for(endpoint: Endpoint, timeout_s: float = ETCD_CLIENT_TIMEOUT_S) -> aetcd.Client:
    """An aetcd client (not yet connected) for one member, every call bounded."""
    return aetcd.Client(
        host=endpoint.host, port=endpoint.port, timeout=timeout_s, options=GRPC_OPTIONS
    )


@pytest.fixture
async def etcd_client(etcd: EtcdServer | ComposeServer) -> AsyncIterator[aetcd.Client]:
    """An aetcd client on the session ``etcd``, closed at teardown."""
    async with etcd_client_for(etcd.endpoint) as client:
        yield client


@pytest.fixture
async def make_etcd_client() -> AsyncIterator[Callable[..., Awaitable[aetcd.Client]]]:
    """Factory: ``await make_etcd_client(endpoint, timeout_s=5.0)`` -> connected client."""
    clients: list[aetcd.Client] = []

    async def make(endpoint: Endpoint, timeout_s: float = ETCD_CLIENT_TIMEOUT_S) -> aetcd.Client:
        client = etcd_client_for(endpoint, timeout_s)
        clients.append(client)
        await client.connect()
        return client

    yield make
    for client in reversed(clients):
        await client.close()


@pytest.fixture
async def redis_client(
    redis_server: RedisServer | ComposeServer,
) -> AsyncIterator[redis.asyncio.Redis]:
    """A redis.asyncio client on the session ``redis_server``, closed at teardown."""
    client = redis.asyncio.Redis(
        host=redis_server.host,
        port=redis_server.port,
        socket_timeout=REDIS_CLIENT_TIMEOUT_S,
        socket_connect_timeout=REDIS_CLIENT_TIMEOUT_S,
    )
    try:
        yield client
    finally:
        await client.aclose()


# ---------------------------------------------------------------- own servers


def _local_factory(factory: Callable[..., Any]) -> Iterator[Callable[..., Any]]:
    if USE_DOCKER:
        pytest.skip("needs local server processes (LAZARUS_TEST_DOCKER=1 is set)")
    with contextlib.ExitStack() as stack:

        def make(*args: Any, **kwargs: Any) -> Any:
            server = factory(*args, **kwargs)
            stack.callback(server.stop)  # registered first: a failed start is cleaned too
            return server.start()

        yield make


@pytest.fixture
def make_etcd() -> Iterator[Callable[..., EtcdServer]]:
    """Factory of private single etcd servers, stopped at teardown."""
    yield from _local_factory(EtcdServer)


@pytest.fixture
def make_etcd_cluster() -> Iterator[Callable[..., EtcdCluster]]:
    """Factory of private etcd clusters (``size=3``), stopped at teardown."""
    yield from _local_factory(EtcdCluster)


@pytest.fixture
def make_redis_server() -> Iterator[Callable[..., RedisServer]]:
    """Factory of private redis-servers, stopped at teardown."""
    yield from _local_factory(RedisServer)
