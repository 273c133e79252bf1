"""The one way a coordinator process opens Redis: URL, AUTH password, TLS CA, timeouts."""

from __future__ import annotations

from typing import Any

import redis.asyncio

__all__ = ["redis_client"]


def redis_client(
    url: str, *, password: str = "", ca_file: str = "", timeout_s: float = 5.0
) -> redis.asyncio.Redis:
    """A ``redis.asyncio.Redis`` for ``url`` (bytes replies); connects lazily.

    Args:
        url: ``redis://`` or ``rediss://`` URL.
        password: AUTH password ("" = none, or the one in the URL).
        ca_file: PEM CA bundle verifying a ``rediss://`` server ("" = system roots).
        timeout_s: connect and read timeout of every call, seconds.
    """
    kwargs: dict[str, Any] = {"socket_connect_timeout": timeout_s, "socket_timeout": timeout_s}
    if password:
        kwargs["password"] = password
    if ca_file:
        kwargs["ssl_ca_certs"] = ca_file
    return redis.asyncio.Redis.from_url(url, **kwargs)
