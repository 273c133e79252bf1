"""Network namespaces for real partitions on one machine (root only).

``Namespace("lzdrill")`` creates namespace ``lzdrill`` joined to the host by a
veth pair on a /30 in 198.18.0.0/15 (RFC 2544 benchmarking space: never routed
anywhere). Processes started with ``wrapper()`` as a command prefix live inside
it and reach the host side's address; ``cut()`` sets the host end down (no
packet crosses, in either direction: a real partition, not a closed socket),
``heal()`` sets it up again. ``close()`` deletes both by name.

Raises ``NamespaceError`` with the ``ip`` command's message when the machine
refuses (not root, no iproute2).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import subprocess
import zlib

__all__ = ["Namespace", "NamespaceError", "namespaces_available"]


class NamespaceError(RuntimeError):
    """An ``ip`` command failed; the message says which and why."""


def namespaces_available() -> tuple[bool, str]:
    """(True, "") when this process can create namespaces, else (False, the reason)."""
    if os.geteuid() != 0:
        return False, "network namespaces need root"
    if shutil.which("ip") is None:
        return False, "the ip command (Debian package iproute2) is missing"
    return True, ""


def _ip(*args: str) -> None:
    try:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=10)
    except subprocess.CalledProcessError as exc:
        raise NamespaceError(f"ip {' '.join(args)}: {exc.stderr.strip()}") from exc


class Namespace:
    """A namespace and its veth pair.

    Args:
        name: the namespace name (also names the veth ends).
        subnet_index: which /30 of 198.18.0.0/15 to use (0 .. 32767).
    """

    def __init__(self, name: str, subnet_index: int = 0) -> None:
        if not 0 <= subnet_index < 32768:
            raise ValueError(f"subnet_index: must be in [0, 32768), got {subnet_index}")
        base = int(ipaddress.IPv4Address("198.18.0.0")) + 4 * subnet_index
        self.name = name
        self.host_ip = str(ipaddress.IPv4Address(base + 1))
        self.ns_ip = str(ipaddress.IPv4Address(base + 2))
        tag = f"{zlib.crc32(name.encode()) % 100000}"
        self.host_if = f"lzh{tag}"
        self.ns_if = f"lzn{tag}"
        self.created = False

    def create(self) -> Namespace:
        """Create the namespace and the veth pair, addresses up.

        Raises:
            NamespaceError: an ``ip`` command failed (everything made is removed).
        """
        self.close()
        try:
            _ip("netns", "add", self.name)
            self.created = True
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            _ip("link", "set", self.ns_if, "netns", self.name)
            _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            _ip("-n", self.name, "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
            _ip("-n", self.name, "link", "set", self.ns_if, "up")
            _ip("-n", self.name, "link", "set", "lo", "up")
        except NamespaceError:
            self.close()
            raise
        return self

    def wrapper(self) -> list[str]:
        """The command prefix that runs a program inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def cut(self) -> None:
        """Partition: nothing crosses the veth until ``heal``."""
        _ip("link", "set", self.host_if, "down")

    def heal(self) -> None:
        """End the partition."""
        _ip("link", "set", self.host_if, "up")

    def close(self) -> None:
        """Delete the veth pair and the namespace (by name; idempotent)."""
        with contextlib.suppress(NamespaceError):
            _ip("link", "del", self.host_if)
        with contextlib.suppress(NamespaceError):
            _ip("netns", "del", self.name)
        self.created = False

    def __enter__(self) -> Namespace:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.close()
