"""gRPC channels to the leader, by address: the two used last are kept, older ones closed.

Theory of operation: a follower dials the leader at the address the election
names (in Kubernetes, the leader pod's IP), to forward agents' Sessions
(``coordinator.forwarding``) and to proxy orchestrator writes and watches
(``coordinator.api``). Each leader change may bring a new address; a cache
closed only at shutdown kept one channel (with its connection and reconnect
attempts) per leader the replica ever saw. :class:`LeaderChannels` keeps the
channel of the address asked for last and of the one before it (a read of
the election that raced a change may still name the previous leader, and a
call to it may be in flight), and closes any older one with a grace of
:data:`CLOSE_GRACE_S`: calls still in flight on it may finish, and those that
do not are cancelled (:meth:`LeaderChannels.retired` tells a caller that its
call ended because of that, so it can answer UNAVAILABLE: ask the leader).

Every channel is dialled with :func:`lazarus.grpcopts.channel_options`
(keepalive): a leader that goes silent without closing the connection (an
asymmetric partition, a blackholed route) fails the calls on it within that
module's bound (10 s by default), so a follower's forward link breaks and its
Sessions are carried to the next leader, and proxied calls and watches end
UNAVAILABLE, instead of waiting for TCP to give up (~15 min).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Callable

import grpc.aio

from lazarus.grpcopts import Options, channel_options

__all__ = ["CLOSE_GRACE_S", "KEEP_CHANNELS", "LeaderChannels"]

KEEP_CHANNELS = 2
"""Channels kept open: the leader's and the previous leader's."""

CLOSE_GRACE_S = 30.0
"""How long calls in flight on a channel closed by a leader change may still run, seconds."""


class LeaderChannels:
    """Channels by leader address; at most ``keep`` open (see the module docstring).

    Args:
        dial: makes the channel to an address with the given channel options
            (``ClientTls.aio_channel``, ``grpc.aio.insecure_channel``).
        keep: channels kept, the ones asked for last (at least 1).
        grace_s: how long an evicted channel's calls in flight may still run.
        options: channel options every channel gets (keepalive by default).
    """

    def __init__(
        self,
        dial: Callable[[str, Options], grpc.aio.Channel],
        keep: int = KEEP_CHANNELS,
        grace_s: float = CLOSE_GRACE_S,
        options: Options | None = None,
    ) -> None:
        self._dial = dial
        self.options: Options = channel_options() if options is None else options
        self._keep = max(1, keep)
        self._grace_s = grace_s
        self._channels: dict[str, grpc.aio.Channel] = {}  # oldest use first
        self._retired: weakref.WeakSet[grpc.aio.Channel] = weakref.WeakSet()
        self._closing: dict[asyncio.Task[None], grpc.aio.Channel] = {}  # in their grace

    def __len__(self) -> int:
        return len(self._channels)

    def __contains__(self, address: object) -> bool:
        return address in self._channels

    def get(self, address: str) -> grpc.aio.Channel:
        """The channel to ``address`` (dialled if new); closes the least recently used
        one beyond ``keep``, after the grace. Call on the event loop."""
        channel = self._channels.pop(address, None)
        if channel is None:
            channel = self._dial(address, self.options)
        self._channels[address] = channel
        while len(self._channels) > self._keep:
            oldest = next(iter(self._channels))
            self._retire(self._channels.pop(oldest))
        return channel

    def retired(self, channel: grpc.aio.Channel) -> bool:
        """Whether ``channel`` was closed because other leaders' channels replaced it."""
        return channel in self._retired

    def _retire(self, channel: grpc.aio.Channel) -> None:
        self._retired.add(channel)
        task = asyncio.get_running_loop().create_task(
            self._close(channel, self._grace_s), name="leader-channel-close"
        )
        self._closing[task] = channel
        task.add_done_callback(self._closed)

    def _closed(self, task: asyncio.Task[None]) -> None:
        self._closing.pop(task, None)

    @staticmethod
    async def _close(channel: grpc.aio.Channel, grace_s: float | None) -> None:
        with contextlib.suppress(Exception):
            await channel.close(grace_s)

    async def close(self) -> None:
        """Close every channel now, those in their grace too (calls in flight are cancelled)."""
        channels = list(self._channels.values())
        self._channels = {}
        closing, self._closing = self._closing, {}
        for task, channel in closing.items():
            task.cancel()
            channels.append(channel)
        for task in closing:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for channel in channels:
            await self._close(channel, None)
