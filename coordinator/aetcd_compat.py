"""Workarounds for aetcd 1.0.0, shared by the election and the etcd store.

aetcd waits for a watch's creation with ``asyncio.wait_for``, which in Python
3.11 drops a cancellation that arrives just as the creation completes; the
cancelled task would then wait on the new watch for good. ``open_watch``
re-raises such a cancellation, ``cancel_watch`` never raises, and ``stop_task``
cancels again until a task that swallowed a cancellation is really done.

aetcd authenticates once and never renews its token, which etcd expires after
``--auth-token-ttl`` of disuse (lease keep-alives do not count) or on restart:
:class:`RenewingClient` re-authenticates periodically. aetcd's
``Client.connect`` only opens insecure channels; :class:`TlsClient` is the
renewing client over ``grpc.aio.secure_channel`` (etcd with ``--cert-file`` /
``--client-cert-auth``), and :func:`tls_credentials` reads the PEM files for it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aetcd
import aetcd.exceptions
import aetcd.rpc
import aetcd.watcher
import grpc
import grpc.aio

_log = logging.getLogger("lazarus.etcd")

CLEANUP_TIMEOUT_S = 2.0
"""Longest a clean-up step (cancelling a watch, waiting for a task) may take, seconds."""


async def open_watch(client: aetcd.Client, key: bytes, **kwargs: Any) -> Any:
    """Create an aetcd watch, honouring a cancellation that aetcd swallowed meanwhile.

    aetcd waits for the watch's creation with ``asyncio.wait_for``, which in
    Python 3.11 drops a cancellation that arrives as the creation completes;
    the caller would then wait on the new watch for good. A cancellation still
    pending on the current task is re-raised here.
    """
    watch = await client.watch(key, **kwargs)
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        await cancel_watch(watch)
        raise asyncio.CancelledError
    return watch


async def cancel_watch(watch: Any) -> None:
    """Cancel an aetcd watch, never raising (its stream may be gone already)."""
    try:
        async with asyncio.timeout(CLEANUP_TIMEOUT_S):
            await watch.cancel()
    except Exception as exc:
        _log.debug("cancelling watch %r failed: %r", watch, exc)


async def stop_task(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait for its end, cancelling again should it swallow one."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=CLEANUP_TIMEOUT_S)
    if not task.cancelled() and task.exception() is not None:
        _log.warning("task %s ended with %r", task.get_name(), task.exception())


def tls_credentials(
    ca_file: str = "", cert_file: str = "", key_file: str = ""
) -> grpc.ChannelCredentials:
    """Channel credentials from PEM files.

    Args:
        ca_file: CA bundle that verifies the server ("": the system roots).
        cert_file: client certificate for mutual TLS ("": none).
        key_file: private key of ``cert_file`` ("": none).

    Returns:
        ``grpc.ssl_channel_credentials`` over the files' bytes.

    Raises:
        OSError: a file cannot be read.
    """

    def read(path: str) -> bytes | None:
        if not path:
            return None
        with open(path, "rb") as f:
            return f.read()

    return grpc.ssl_channel_credentials(
        root_certificates=read(ca_file),
        private_key=read(key_file),
        certificate_chain=read(cert_file),
    )


TOKEN_RENEWAL_S = 60.0
"""Default period of re-authentication, seconds: well below etcd's 300 s token TTL."""

TOKEN_RETRY_S = 1.0
"""Wait before retrying a failed re-authentication, seconds."""


class RenewingClient(aetcd.Client):  # type: ignore[misc]
    """``aetcd.Client`` that renews its etcd auth token in the background.

    aetcd authenticates once, in ``connect``. etcd's simple tokens expire after
    ``--auth-token-ttl`` (300 s) unless used, and lease keep-alives do not use
    them: an idle leader's next write, or its resignation, would fail with
    "invalid auth token". Any token dies with an etcd restart too. While
    connected with a username this client authenticates again every
    ``token_renewal_s`` and swaps the token in for every later call (watch
    streams opened later included).

    Args:
        token_renewal_s: seconds between two authentications; keep it below
            etcd's ``--auth-token-ttl``.
        **kwargs: ``aetcd.Client``'s (host, port, username, password, timeout,
            options, connect_wait_timeout).
    """

    def __init__(self, *, token_renewal_s: float = TOKEN_RENEWAL_S, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.token_renewal_s = token_renewal_s
        self._renewal: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        """Connect as aetcd does, then keep the token fresh (when a username is set).

        Raises:
            aetcd.exceptions.ClientError: etcd refused or did not answer (as aetcd maps it).
        """
        await self._connect_channel()
        if self._username is not None and (self._renewal is None or self._renewal.done()):
            self._renewal = asyncio.create_task(self._renew_token(), name="etcd-token-renewal")

    async def _connect_channel(self) -> None:
        await super().connect()

    async def close(self) -> None:
        """Stop the renewal, then close as aetcd does."""
        renewal, self._renewal = self._renewal, None
        if renewal is not None:
            await stop_task(renewal)
        await super().close()

    async def _renew_token(self) -> None:
        delay_s = self.token_renewal_s
        while True:
            await asyncio.sleep(delay_s)
            if self.auth_stub is None:
                return
            try:
                resp = await self.auth_stub.Authenticate(
                    aetcd.rpc.AuthenticateRequest(name=self._username, password=self._password),
                    timeout=self._timeout,
                )
            except Exception as exc:  # etcd away: retry soon, the old token may still work
                _log.warning("etcd re-authentication failed: %r", exc)
                delay_s = min(TOKEN_RETRY_S, self.token_renewal_s)
                continue
            self.metadata = (("token", resp.token),)
            if self._watcher is not None:
                self._watcher._metadata = self.metadata
            delay_s = self.token_renewal_s


class TlsClient(RenewingClient):
    """``aetcd.Client`` over a TLS channel; everything but the channel is aetcd's.

    Args:
        credentials: the channel's credentials (see :func:`tls_credentials`).
        **kwargs: :class:`RenewingClient`'s (token_renewal_s) and
            ``aetcd.Client``'s (host, port, username, password, timeout,
            options, connect_wait_timeout).
    """

    _is_connecting: bool

    def __init__(self, *, credentials: grpc.ChannelCredentials, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._credentials = credentials

    async def _connect_channel(self) -> None:
        """aetcd 1.0.0's ``Client.connect`` with a secure channel in place of the insecure one."""
        try:
            await self._connect_secure()
        except aetcd.rpc.AioRpcError as exc:
            aetcd.exceptions._handle_exception(exc)

    async def _connect_secure(self) -> None:
        if self._connected.is_set():
            return
        if self._is_connecting:
            # Another task is establishing a connection, just wait
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        try:
            self._is_connecting = True
            target = f"{self._host}:{self._port}"
            self.channel = grpc.aio.secure_channel(
                target, self._credentials, options=list(self._options.items())
            )
            if self._username is not None and self._password is not None:
                self.auth_stub = aetcd.rpc.AuthStub(self.channel)
                auth_request = aetcd.rpc.AuthenticateRequest(
                    name=self._username, password=self._password
                )
                resp = await self.auth_stub.Authenticate(auth_request, timeout=self._timeout)
                self.metadata = (("token", resp.token),)
            self.kvstub = aetcd.rpc.KVStub(self.channel)
            self.clusterstub = aetcd.rpc.ClusterStub(self.channel)
            self.leasestub = aetcd.rpc.LeaseStub(self.channel)
            self.maintenancestub = aetcd.rpc.MaintenanceStub(self.channel)
            self._watcher = aetcd.watcher.Watcher(
                aetcd.rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
            )
            self._connected.set()
        finally:
            self._is_connecting = False
