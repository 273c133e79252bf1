"""Fakes of the gRPC channel a ``NodeAgent``'s TLS settings open (``settings.tls``).

``FakeTls(make_call)`` opens channels whose every RPC is a new call from
``make_call()``; ``calls`` lists them in order. The agent under test is the real
``NodeAgent``: only the wire is replaced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

C = TypeVar("C")


class FakeChannel(Generic[C]):
    """An ``async with``-able channel; each RPC method opens a call of ``tls``."""

    def __init__(self, tls: FakeTls[C]) -> None:
        self.tls = tls

    async def __aenter__(self) -> FakeChannel[C]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        def open_call(*a: Any, **k: Any) -> C:
            call = self.tls.make_call()
            self.tls.calls.append(call)
            return call

        return open_call

    def unary_unary(self, *args: Any, **kwargs: Any) -> Any:
        return self.stream_stream()

    unary_stream = stream_unary = unary_unary


class FakeTls(Generic[C]):
    """Stands in for ``AgentSettings.tls``: ``aio_channel`` returns a ``FakeChannel``."""

    def __init__(self, make_call: Callable[[], C]) -> None:
        self.make_call = make_call
        self.calls: list[C] = []

    def aio_channel(self, target: str, options: Any = None) -> FakeChannel[C]:
        return FakeChannel(self)
