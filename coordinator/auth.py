"""The gRPC server side of authentication and authorization: one interceptor.

Theory of operation: :class:`AuthInterceptor` wraps every method handler of
the coordinator's server. Before a call runs it reads the peer's identity —
the URI SAN of its verified client certificate (``auth_context``), else a
bearer token from the ``authorization`` metadata checked against
:class:`TokenFile` — and asks the pure policy (:mod:`coordinator.authz`).
A refusal aborts the call with UNAUTHENTICATED or PERMISSION_DENIED, is
logged as a security event and counted (``lazarus_auth_denied_total``).
``ALLOW_REDACTED`` answers run the call and clear payload and result bytes
from the tasks in the response. For ``AgentService.Session`` the first
message (the Hello) is read here and its node id checked against the
certificate before the servicer sees the stream.

With ``--auth none`` the interceptor is not installed, and
:func:`warn_auth_none` logs a warning at start and every minute.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import inspect
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import DecodeError
from prometheus_client import CollectorRegistry, Counter

from coordinator.authz import Decision, Verdict, authorize, may_claim_node
from lazarus.tls import ROLES, CertificateError, Identity, IdentityKind, identity_from_pem
from lazarus.v1 import agent_pb2

__all__ = ["AuthInterceptor", "TokenFile", "warn_auth_none"]

_log = logging.getLogger("lazarus.coordinator.auth")

SESSION_METHOD = "/lazarus.v1.AgentService/Session"

HELLO_WAIT_S = 30.0
"""How long a Session may take to send its first message (the Hello)."""

AUTH_NONE_WARNING_PERIOD_S = 60.0

_CODES = {
    Verdict.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Verdict.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
}


@dataclass(slots=True)
class TokenFile:
    """Hashed bearer tokens, one a line, re-read when the file changes.

    Each line is ``sha256:<hex digest of the token> <client name> <role>``;
    ``#`` starts a comment. ``lazarus certs token`` makes a token and its line.

    Attributes:
        path: the file (a mounted Secret in Kubernetes).
        cluster: the identities' cluster.
    """

    path: str
    cluster: str
    _stamp: tuple[int, int, int] = (0, 0, 0)
    _tokens: dict[bytes, Identity] = field(default_factory=dict)

    def lookup(self, token: str) -> Identity | None:
        """The client identity of ``token``, or None (unknown token, unreadable file)."""
        self._reload()
        digest = hashlib.sha256(token.encode()).digest()
        for known, identity in self._tokens.items():
            if hmac.compare_digest(known, digest):
                return identity
        return None

    def _reload(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError:
            self._tokens = {}
            return
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if stamp == self._stamp:
            return
        tokens: dict[bytes, Identity] = {}
        with open(self.path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                words = line.split("#", 1)[0].split()
                if not words:
                    continue
                if len(words) != 3 or not words[0].startswith("sha256:") or words[2] not in ROLES:
                    _log.warning("%s:%d: not 'sha256:<hex> name role'; ignored", self.path, number)
                    continue
                try:
                    digest = bytes.fromhex(words[0].removeprefix("sha256:"))
                except ValueError:
                    _log.warning("%s:%d: the digest is not hex; ignored", self.path, number)
                    continue
                tokens[digest] = Identity(IdentityKind.CLIENT, self.cluster, words[1], words[2])
        self._tokens, self._stamp = tokens, stamp
        _log.info("bearer tokens loaded from %s: %d", self.path, len(tokens))


def peer_identity(context: Any, tokens: TokenFile | None) -> Identity | None:
    """The caller's identity: its certificate's, else its bearer token's, else None."""
    auth = context.auth_context() or {}
    pems = auth.get("x509_pem_cert")
    if pems:
        try:
            return identity_from_pem(bytes(pems[0]))
        except CertificateError as exc:
            _log.info("peer %s: %s", context.peer(), exc)
            return None
    if tokens is not None:
        for key, value in context.invocation_metadata() or ():
            if key == "authorization" and isinstance(value, str):
                scheme, _, token = value.partition(" ")
                if scheme.lower() == "bearer" and token:
                    return tokens.lookup(token.strip())
    return None


def _redact(response: Any) -> Any:
    """Clear payload and result bytes of the task(s) in a GetTask / ListTasks answer."""
    tasks = []
    if response.DESCRIPTOR.fields_by_name.get("task") is not None and response.HasField("task"):
        tasks.append(response.task)
    if response.DESCRIPTOR.fields_by_name.get("tasks") is not None:
        tasks.extend(response.tasks)
    for task in tasks:
        task.spec.ClearField("payload")
        if task.HasField("result"):
            task.result.ClearField("payload")
    return response


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Authenticate and authorize every call; see the module docstring.

    Args:
        cluster: this coordinator's cluster.
        tokens: bearer tokens (None: certificates only).
        reflection: whether server reflection is open.
        registry: where ``lazarus_auth_denied_total`` is registered (None: not counted).
    """

    def __init__(
        self,
        cluster: str,
        *,
        tokens: TokenFile | None = None,
        reflection: bool = True,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.cluster = cluster
        self.tokens = tokens
        self.reflection = reflection
        self.denied: Counter | None = None
        if registry is not None:
            self.denied = Counter(
                "lazarus_auth_denied",
                "Calls refused by authentication or authorization.",
                ["code", "method"],
                registry=registry,
            )

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        if authorize(None, method, cluster=self.cluster, reflection=self.reflection).allowed:
            return handler  # open to anyone (health, reflection): nothing to check
        if method == SESSION_METHOD:
            return handler._replace(stream_stream=self._session(method, handler.stream_stream))
        kind = {
            (False, False): "unary_unary",
            (False, True): "unary_stream",
            (True, False): "stream_unary",
            (True, True): "stream_stream",
        }[(handler.request_streaming, handler.response_streaming)]
        behavior = getattr(handler, kind)
        if inspect.isasyncgenfunction(behavior):
            return handler._replace(**{kind: self._guard_stream(method, behavior)})
        return handler._replace(**{kind: self._guard(method, behavior)})

    async def _check(self, method: str, context: Any) -> tuple[Identity | None, Decision]:
        identity = peer_identity(context, self.tokens)
        decision = authorize(identity, method, cluster=self.cluster, reflection=self.reflection)
        if not decision.allowed:
            await self._refuse(method, context, identity, decision)
        return identity, decision

    async def _refuse(
        self, method: str, context: Any, identity: Identity | None, decision: Decision
    ) -> None:
        code = _CODES[decision.verdict]
        _log.warning(
            "security event: %s refused %s for %s from %s: %s",
            code.name,
            method,
            identity.uri if identity is not None else "no identity",
            context.peer(),
            decision.reason,
        )
        if self.denied is not None:
            self.denied.labels(code.name, method.rpartition("/")[2]).inc()
        await context.abort(code, decision.reason)

    def _guard(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        """Wrap a servicer coroutine (unary answers are redacted here when the policy says)."""

        async def guarded(request: Any, context: Any) -> Any:
            _, decision = await self._check(method, context)
            response = behavior(request, context)
            if inspect.isawaitable(response):
                response = await response
            if decision.verdict is Verdict.ALLOW_REDACTED and response is not None:
                response = _redact(response)  # unary answers only (GetTask, ListTasks)
            return response

        return guarded

    def _guard_stream(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        """Wrap a servicer that is an async generator (its responses pass through here)."""

        async def guarded(request: Any, context: Any) -> AsyncIterator[Any]:
            _, decision = await self._check(method, context)
            async for response in behavior(request, context):
                if decision.verdict is Verdict.ALLOW_REDACTED:
                    response = _redact(response)
                yield response

        return guarded

    def _session(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def guarded(request_iterator: AsyncIterator[Any], context: Any) -> Any:
            identity, _ = await self._check(method, context)
            if identity is None or identity.kind is not IdentityKind.NODE:
                return await _run(behavior, request_iterator, context)  # health & co.
            incoming = aiter(request_iterator)
            try:
                async with asyncio.timeout(HELLO_WAIT_S):
                    first = await anext(incoming)
            except (StopAsyncIteration, TimeoutError):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no Hello on the Session")
            raw = first if isinstance(first, bytes) else first.SerializeToString()
            try:
                message = agent_pb2.AgentMessage.FromString(raw)
            except DecodeError:
                message = None  # the servicer refuses it with its own words
            if message is not None and message.WhichOneof("body") == "hello":
                claim = may_claim_node(identity, message.hello.node_id)
                if not claim.allowed:
                    await self._refuse(method, context, identity, claim)

            async def replay() -> AsyncIterator[Any]:
                yield first
                async for item in incoming:
                    yield item

            return await _run(behavior, replay(), context)

        return guarded


async def _run(behavior: Callable[..., Any], requests: Any, context: Any) -> Any:
    result = behavior(requests, context)
    if inspect.isawaitable(result):
        return await result
    return result


async def warn_auth_none(period_s: float = AUTH_NONE_WARNING_PERIOD_S) -> None:
    """Log that authentication is off, now and every ``period_s`` until cancelled."""
    while True:
        _log.warning(
            "--auth none: this coordinator serves PLAINTEXT gRPC with NO authentication; "
            "anyone who reaches it can act as any node or operator. For local experiments only."
        )
        await asyncio.sleep(period_s)
