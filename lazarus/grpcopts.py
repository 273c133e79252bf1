"""gRPC keepalive options for every channel and server Lazarus makes: the rates in one place.

Theory of operation
-------------------
A peer that goes silent without a FIN or a RST (a blackholed host, a dropped
route, a paused VM) leaves a TCP connection ESTABLISHED until the kernel's
retransmissions give up, about 15 minutes; a stream on it neither errors nor
delivers. HTTP/2 PING keepalives bound that: a side that has heard nothing for
``keepalive_time_ms`` sends a PING and closes the connection when no ack comes
within ``ping_timeout_ms``; every call on it then fails UNAVAILABLE ("ping
timeout"), which the callers already treat as "go elsewhere". So a silent peer
is noticed within **keepalive time + ping timeout** of its last byte:

- agents, followers, API proxies and clients -> a coordinator
  (``KEEPALIVE_*``): ping after 5 s, ack within 5 s: **10 s**;
- a coordinator -> its callers (``SERVER_KEEPALIVE_*``): 10 s + 5 s: **15 s**;
- a coordinator -> etcd (``ETCD_KEEPALIVE_*``): 10 s + 5 s: **15 s**.

The server side's pings end calls whose peer stopped answering, so a writer
stuck on HTTP/2 flow control towards a vanished peer (the leader writing a
Forward stream, a coordinator writing an agent's Session) is cancelled rather
than waiting forever.

Servers police pings (``too_many_pings``): a gRPC server counts a ping that
comes sooner than it allows as a strike and, after two, sends GOAWAY
ENHANCE_YOUR_CALM, which drops every call on the connection and makes the
client double its keepalive time. So:

- our servers allow a ping every ``SERVER_MIN_PING_INTERVAL_MS`` (half the
  clients' ``KEEPALIVE_TIME_MS``, a margin for timer jitter), with or without
  calls in flight;
- etcd allows one every ``--grpc-keepalive-min-time`` (default 5 s) and only
  while a call is in flight (its PermitWithoutStream is false, not
  configurable): our etcd channels ping every 10 s, twice that, and never
  without a call (``keepalive_permit_without_calls`` 0). An etcd started with
  a ``--grpc-keepalive-min-time`` above 10 s would answer GOAWAY.

Three grpc-core details these options carry (grpcio 1.85, measured with a
blackholing relay in ``tests/unit/test_keepalive.py``):

- the wait for a PING's ack is ``grpc.http2.ping_timeout_ms`` (default one
  minute once keepalive is on); ``grpc.keepalive_timeout_ms`` alone did not
  close a blackholed connection in 10 s. Both are set, to the same value.
- a client stops pinging after ``grpc.http2.max_pings_without_data`` pings
  (default 2) without sending data itself, which a watch or a quiet stream
  never does: it is set to 0 (no limit), so the bound holds on idle streams.
- the server's setting is ``grpc.http2.min_ping_interval_without_data_ms``
  (``GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS`` in C); the
  ``min_recv`` spelling is silently ignored.

A client does not ping faster than once a second whatever it is told, so
keepalive times below 1000 ms act as 1000 ms.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ETCD_KEEPALIVE_TIMEOUT_MS",
    "ETCD_KEEPALIVE_TIME_MS",
    "KEEPALIVE_TIMEOUT_MS",
    "KEEPALIVE_TIME_MS",
    "SERVER_KEEPALIVE_TIMEOUT_MS",
    "SERVER_KEEPALIVE_TIME_MS",
    "SERVER_MIN_PING_INTERVAL_MS",
    "Options",
    "channel_options",
    "detection_bound_s",
    "etcd_channel_options",
    "server_options",
]

Options = tuple[tuple[str, Any], ...]
"""gRPC channel or server arguments, as ``(name, value)`` pairs."""

KEEPALIVE_TIME_MS = 5_000
"""Silence after which a channel to a coordinator pings it, ms."""
KEEPALIVE_TIMEOUT_MS = 5_000
"""How long a channel to a coordinator waits for a ping's ack before closing, ms."""

SERVER_KEEPALIVE_TIME_MS = 10_000
"""Silence after which a coordinator pings a caller, ms."""
SERVER_KEEPALIVE_TIMEOUT_MS = 5_000
"""How long a coordinator waits for a caller's ack before ending its calls, ms."""
SERVER_MIN_PING_INTERVAL_MS = KEEPALIVE_TIME_MS // 2
"""The shortest spacing of a caller's pings a coordinator accepts (sooner is a strike), ms."""

ETCD_KEEPALIVE_TIME_MS = 10_000
"""Silence after which an etcd channel pings etcd, ms (etcd's minimum is 5 s by default)."""
ETCD_KEEPALIVE_TIMEOUT_MS = 5_000
"""How long an etcd channel waits for a ping's ack before closing, ms."""


def _pinging(time_ms: int, timeout_ms: int, without_calls: bool) -> Options:
    if time_ms <= 0 or timeout_ms <= 0:
        raise ValueError(f"keepalive: time and timeout must be > 0 ms, got {time_ms}, {timeout_ms}")
    return (
        ("grpc.keepalive_time_ms", time_ms),
        ("grpc.keepalive_timeout_ms", timeout_ms),
        ("grpc.http2.ping_timeout_ms", timeout_ms),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", int(without_calls)),
    )


def channel_options(
    keepalive_time_ms: int = KEEPALIVE_TIME_MS, keepalive_timeout_ms: int = KEEPALIVE_TIMEOUT_MS
) -> Options:
    """Keepalive options of a channel to a coordinator (agent, follower, proxy, client).

    Pings only while a call is open. Pair with :func:`server_options` on the
    other side with ``keepalive_time_ms`` >= its ``min_ping_interval_ms``.

    Args:
        keepalive_time_ms: silence before a ping, ms (> 0; under 1000 acts as 1000).
        keepalive_timeout_ms: wait for the ack, ms (> 0).

    Returns:
        gRPC channel arguments, as ``(name, value)`` pairs.

    Raises:
        ValueError: a value <= 0.
    """
    return _pinging(keepalive_time_ms, keepalive_timeout_ms, without_calls=False)


def server_options(
    keepalive_time_ms: int = SERVER_KEEPALIVE_TIME_MS,
    keepalive_timeout_ms: int = SERVER_KEEPALIVE_TIMEOUT_MS,
    min_ping_interval_ms: int = SERVER_MIN_PING_INTERVAL_MS,
) -> Options:
    """Keepalive options of a coordinator's gRPC server: its pings, and the pings it permits.

    Args:
        keepalive_time_ms: silence before the server pings a caller, ms (> 0).
        keepalive_timeout_ms: wait for the caller's ack before its calls end, ms (> 0).
        min_ping_interval_ms: a caller's pings spaced closer than this are
            strikes (two strikes: GOAWAY too_many_pings), ms (>= 0).

    Returns:
        gRPC server options, as ``(name, value)`` pairs.

    Raises:
        ValueError: a keepalive value <= 0, or a negative interval.
    """
    if min_ping_interval_ms < 0:
        raise ValueError(f"min_ping_interval_ms: must be >= 0, got {min_ping_interval_ms}")
    return (
        *_pinging(keepalive_time_ms, keepalive_timeout_ms, without_calls=True),
        ("grpc.http2.min_ping_interval_without_data_ms", min_ping_interval_ms),
    )


def etcd_channel_options(
    keepalive_time_ms: int = ETCD_KEEPALIVE_TIME_MS,
    keepalive_timeout_ms: int = ETCD_KEEPALIVE_TIMEOUT_MS,
) -> dict[str, Any]:
    """Keepalive options of an etcd channel, as the dict ``aetcd.Client(options=...)`` takes.

    Pings only while a call is open (etcd strikes pings on an idle
    connection); the default time is twice etcd's default minimum.

    Args:
        keepalive_time_ms: silence before a ping, ms (> 0; keep it >= etcd's
            ``--grpc-keepalive-min-time``).
        keepalive_timeout_ms: wait for the ack, ms (> 0).

    Raises:
        ValueError: a value <= 0.
    """
    return dict(_pinging(keepalive_time_ms, keepalive_timeout_ms, without_calls=False))


def detection_bound_s(options: Options | dict[str, Any]) -> float:
    """How soon after its peer's last byte a connection with ``options`` closes, seconds.

    Raises:
        KeyError: ``options`` set no keepalive.
    """
    values = dict(options)
    time_ms = max(1000, int(values["grpc.keepalive_time_ms"]))
    return (time_ms + int(values["grpc.http2.ping_timeout_ms"])) / 1000.0
