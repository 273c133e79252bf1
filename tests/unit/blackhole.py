"""A TCP proxy on 127.0.0.1 that can turn into a blackhole: a peer that goes silent.

``Blackhole(upstream_port)`` listens on a free port and relays each accepted
connection to ``127.0.0.1:upstream_port``, both ways. ``swallow()`` makes it
stop relaying in both directions without closing either socket: whatever
either side sends from then on is read and dropped. Neither side sees a FIN
or a RST, nor any byte from its peer, as when a firewall starts dropping a
peer's packets or a host vanishes from the network: only a liveness check of
the protocol above TCP can tell. (On a real network the sender's TCP buffer
would also fill with unacked data; here TCP keeps accepting, so what is
tested is the HTTP/2 keepalive alone, not the kernel's retransmission limits.)
"""

from __future__ import annotations

import asyncio
import contextlib


class Blackhole:
    """A relay to ``127.0.0.1:upstream_port`` that ``swallow()`` silences.

    Args:
        upstream_port: the port of the server behind it.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._silent = asyncio.Event()
        self._pumps: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self.connections = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> Blackhole:
        self._server = await asyncio.start_server(self._accepted, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def swallow(self) -> None:
        """From now on relay nothing, either way; keep every socket open."""
        self._silent.set()

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers += [writer, up_writer]
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(source, sink))
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                if self._silent.is_set():
                    continue  # swallowed: dropped on the floor, the socket stays open
                sink.write(data)
                await sink.drain()
            if not self._silent.is_set():
                sink.close()  # a real close before the blackhole passes on
        except (ConnectionError, OSError):
            pass
        if self._silent.is_set():
            await asyncio.Event().wait()  # hold the sockets open until close()

    async def close(self) -> None:
        for task in list(self._pumps):
            task.cancel()
        for task in list(self._pumps):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
