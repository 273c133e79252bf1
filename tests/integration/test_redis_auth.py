"""Coordinator Redis clients against a real redis-server with a password (--requirepass)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redis.exceptions

from coordinator.documents import DocumentService
from coordinator.redisconn import redis_client
from lazarus_dev.localservers import RedisServer

pytestmark = pytest.mark.integration

PASSWORD = "s3cret-for-tests"


async def test_the_shared_documents_hub_authenticates_with_the_configured_password(
    make_redis_server: Callable[..., RedisServer],
) -> None:
    server = make_redis_server(extra_args=["--requirepass", PASSWORD])
    async with asyncio.timeout(10):
        anonymous = redis_client(server.url)
        with pytest.raises(redis.exceptions.AuthenticationError):
            await anonymous.ping()
        await anonymous.aclose()
        service = DocumentService(server.url, redis_password=PASSWORD)
        try:
            client = service._client()
            assert await client.ping()
            await client.set("lazarus:probe", b"1")
            assert await client.get("lazarus:probe") == b"1"
        finally:
            await service.close()
