"""Real etcd and redis-server processes on loopback ports, for tests and ``lazarus dev``.

Theory of operation
-------------------
Each server is one child process of the binary found on ``PATH`` (Debian's
``etcd-server`` / ``redis-server`` packages). ``start()`` picks free ports on
127.0.0.1, creates a temporary directory (unless one is given), launches the
binary in its own session (so it is its own process group and a terminal's
Ctrl-C does not reach it), sends its stdout and stderr to a log file in that
directory, and polls a readiness probe (etcd: ``GET /health``; Redis:
``PING``) until it answers or a bounded timeout passes. A failure raises
:class:`ServerStartError` carrying the tail of the log.

Processes are addressed by pid only, never by name. The pid is signalled only
while it is still unreaped (running or a zombie), so a recycled pid can never be
hit. ``stop()`` sends SIGTERM (plus SIGCONT, so a paused process can act on it),
waits a bounded time, then SIGKILLs the whole process group, reaps the process
and removes the directory it created. ``kill()`` / ``pause()`` / ``resume()``
are SIGKILL / SIGSTOP / SIGCONT for fault injection; ``kill()`` keeps the data
directory so the server can be started again on the same data. An ``atexit``
hook SIGKILLs whatever is still running when the interpreter exits.

Ports are picked once, on the first ``start()``, and kept across restarts so
clients and cluster peers find the server where it was. If a picked port was
taken by someone else between picking and binding ("address already in use"),
``start()`` picks new ports and tries again, a bounded number of times.

Nothing here listens on or connects to anything but 127.0.0.1.
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = [
    "LOOPBACK_HOST",
    "Endpoint",
    "EtcdCluster",
    "EtcdServer",
    "LocalServer",
    "LocalServerError",
    "RedisServer",
    "ServerBinaryNotFoundError",
    "ServerStartError",
    "etcd_is_healthy",
    "free_loopback_ports",
    "redis_answers_ping",
]

LOOPBACK_HOST = "127.0.0.1"
"""The only address these servers bind to and are probed on."""

_PROBE_INTERVAL_S = 0.05
_LOG_TAIL_LINES = 40
_PORT_PICK_ATTEMPTS = 3
_ADDRESS_IN_USE = "address already in use"


class LocalServerError(Exception):
    """A local server could not be found, started, or addressed."""


class ServerBinaryNotFoundError(LocalServerError):
    """The server binary is not on ``PATH``; the message names the Debian package."""


class ServerStartError(LocalServerError):
    """The server exited or did not become ready in time; the message carries the log tail."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A TCP address a client connects to.

    Attributes:
        host: IP address, always 127.0.0.1 for local servers.
        port: TCP port.
    """

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def _ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux; else its default)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


# Ports picked outside the ephemeral range: an outgoing connection (any
# process's) never takes one between our pick and the server's bind. A pick
# from the kernel (bind to port 0) came from that range, and a CI run once lost
# a coordinator's token port that way ("Address already in use").
_PICK_LOW = 15000


def free_loopback_ports(count: int) -> list[int]:
    """Pick distinct TCP ports that are free on 127.0.0.1 right now.

    Ports are drawn at random below the kernel's ephemeral range (from
    ``ip_local_port_range``), where no outgoing connection takes one before
    the caller binds it; if that range is too small, the kernel picks. All
    sockets are held open until every port is picked, so the ports are
    distinct; they are closed before returning, so another server may still
    bind one first (``start()`` retries on that).

    Args:
        count: how many ports, >= 1.

    Returns:
        ``count`` distinct port numbers.
    """
    low, _ = _ephemeral_port_range()
    rng = random.SystemRandom()
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            for _ in range(64 if low - _PICK_LOW >= 1024 else 0):
                port = rng.randrange(_PICK_LOW, low)
                if port in ports:
                    continue
                try:
                    sock.bind((LOOPBACK_HOST, port))
                except OSError:
                    continue
                break
            else:
                sock.bind((LOOPBACK_HOST, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def _find_binary(binary: str, package: str) -> str:
    path = shutil.which(binary)
    if path is None:
        raise ServerBinaryNotFoundError(
            f"{binary!r} is not on PATH. It comes from the Debian package {package!r}: "
            f"run `sudo apt-get install -y {package}` (or `make setup`)."
        )
    return path


def _tail(path: Path, lines: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read()
    except OSError as e:
        return f"<no log at {path}: {e}>"
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


# ---------------------------------------------------------------- processes

_live_lock = threading.Lock()
_live: set[_Process] = set()


def _kill_leftovers() -> None:
    with _live_lock:
        leftovers = list(_live)
    for proc in leftovers:
        proc.kill()


atexit.register(_kill_leftovers)


class _Process:
    """One child process in its own session, signalled by pid only while unreaped."""

    def __init__(self, argv: Sequence[str], log_path: Path, cwd: Path, env: dict[str, str]) -> None:
        with log_path.open("ab") as log:
            log.write(f"\n=== lazarus_dev.localservers: {' '.join(argv)}\n".encode())
            log.flush()
            self._popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=env,
                start_new_session=True,
            )
        self.pid: int = self._popen.pid
        with _live_lock:
            _live.add(self)

    def exit_status(self) -> int | None:
        """The exit status (negative: killed by that signal) once exited, else None.

        Never reaps: an exited process stays a zombie until :meth:`terminate`
        or :meth:`kill`, so its pid cannot be recycled under us.
        """
        if self._popen.returncode is not None:
            return self._popen.returncode
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped by someone else
            return self._popen.poll()
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def _wait_exit(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the process to exit, without reaping it."""
        deadline = time.monotonic() + timeout_s
        while self.exit_status() is None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def signal_group(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the process group, only while the leader is unreaped."""
        if self._popen.returncode is not None:
            return
        # Unreaped (alive or zombie): its pid, and so its group id, cannot be reused.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def _reap(self) -> None:
        # The leader has exited: clear any stragglers left in its group, then reap.
        self.signal_group(signal.SIGKILL)
        self._popen.wait()
        with _live_lock:
            _live.discard(self)

    def terminate(self, timeout_s: float) -> None:
        """SIGTERM (and SIGCONT), wait up to ``timeout_s``, then SIGKILL; always reaps."""
        if self.exit_status() is None:
            self.signal_group(signal.SIGTERM)
            self.signal_group(signal.SIGCONT)
            if not self._wait_exit(timeout_s):
                self.signal_group(signal.SIGKILL)
        self._reap()

    def kill(self) -> None:
        """SIGKILL the process group and reap the process."""
        self.signal_group(signal.SIGKILL)
        self._reap()


# ---------------------------------------------------------------- base class


class LocalServer(abc.ABC):
    """A server binary run as a child process on 127.0.0.1; see the module docstring.

    Subclasses say which binary to run with which arguments, how many ports it
    needs, and how to probe readiness.
    """

    _binary_default: str
    _package: str
    _log_name: str
    _dir_prefix: str

    def __init__(
        self,
        *,
        ports: Sequence[int] | None,
        data_dir: str | os.PathLike[str] | None,
        base_dir: str | os.PathLike[str] | None,
        binary: str | None,
        startup_timeout_s: float,
        stop_timeout_s: float,
    ) -> None:
        self._ports: list[int] | None = list(ports) if ports is not None else None
        self._base_dir = Path(base_dir) if base_dir is not None else None
        self._binary = binary or self._binary_default
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._dir: Path | None = Path(data_dir) if data_dir is not None else None
        self._owns_dir = False
        self._proc: _Process | None = None

    # -- what subclasses provide

    @abc.abstractmethod
    def _port_count(self) -> int: ...

    @abc.abstractmethod
    def _argv(self, binary_path: str, data_dir: Path, ports: list[int]) -> list[str]: ...

    @abc.abstractmethod
    def _is_ready(self, probe_timeout_s: float) -> bool: ...

    def _env(self) -> dict[str, str]:
        return dict(os.environ)

    # -- properties

    @property
    def host(self) -> str:
        """The address the server listens on: always 127.0.0.1."""
        return LOOPBACK_HOST

    @property
    def port(self) -> int:
        """The client port.

        Raises:
            LocalServerError: no port has been picked yet (never started).
        """
        return self._require_ports()[0]

    @property
    def endpoint(self) -> Endpoint:
        """The client ``Endpoint(host, port)``."""
        return Endpoint(self.host, self.port)

    @property
    def endpoints(self) -> list[Endpoint]:
        """The client endpoints: one for a single server."""
        return [self.endpoint]

    @property
    def pid(self) -> int:
        """The process id of the running server.

        Raises:
            LocalServerError: the server is not running.
        """
        if self._proc is None:
            raise LocalServerError(f"{self!r} is not running")
        return self._proc.pid

    @property
    def running(self) -> bool:
        """True while a started process has not exited."""
        return self._proc is not None and self._proc.exit_status() is None

    @property
    def launched(self) -> bool:
        """True from a launch until ``stop()`` / ``kill()``, even if the process has died."""
        return self._proc is not None

    @property
    def data_dir(self) -> Path | None:
        """The directory holding the server's data and log, once there is one."""
        return self._dir

    @property
    def log_path(self) -> Path | None:
        """The server's log file (stdout and stderr), once there is a data dir."""
        return self._dir / self._log_name if self._dir is not None else None

    def __repr__(self) -> str:
        ports = self._ports or "-"
        pid = self._proc.pid if self._proc is not None else "-"
        return f"<{type(self).__name__} ports={ports} pid={pid} dir={self._dir}>"

    # -- lifecycle

    def start(self, *, wait: bool = True) -> Self:
        """Launch the server and, by default, wait until it is ready.

        Args:
            wait: when False, return right after launching; call
                :meth:`wait_ready` later.

        Returns:
            ``self``, so ``with EtcdServer().start() as s`` and ``s = X().start()`` work.

        Raises:
            ServerBinaryNotFoundError: the binary is not on ``PATH``.
            ServerStartError: the process exited or was not ready within
                ``startup_timeout_s``; the message holds the log tail.
            LocalServerError: the server is already running.
        """
        if self._proc is not None:
            raise LocalServerError(f"{self!r} is already running")
        binary_path = _find_binary(self._binary, self._package)
        for attempt in range(1, _PORT_PICK_ATTEMPTS + 1):
            fresh_dir = self._dir is None
            fresh_ports = self._ports is None
            try:
                self._launch(binary_path)
                if wait:
                    self.wait_ready()
            except BaseException as e:
                self._abandon(remove_dir=fresh_dir)
                retry = (
                    isinstance(e, ServerStartError)
                    and fresh_ports
                    and attempt < _PORT_PICK_ATTEMPTS
                    and _ADDRESS_IN_USE in str(e).lower()
                )
                if not retry:
                    raise
                self._ports = None
                continue
            return self
        raise LocalServerError("unreachable: start() loop ended")  # pragma: no cover

    def _launch(self, binary_path: str) -> None:
        if self._dir is None:
            parent = self._base_dir
            if parent is not None:
                parent.mkdir(parents=True, exist_ok=True)
            self._dir = Path(tempfile.mkdtemp(prefix=self._dir_prefix, dir=parent))
            self._owns_dir = True
        else:
            self._dir.mkdir(parents=True, exist_ok=True)
        if self._ports is None:
            self._ports = free_loopback_ports(self._port_count())
        argv = self._argv(binary_path, self._dir, self._ports)
        self._proc = _Process(argv, self._dir / self._log_name, self._dir, self._env())

    def _abandon(self, *, remove_dir: bool) -> None:
        """After a failed start: SIGKILL and reap; drop the directory if just made."""
        if self._proc is not None:
            self._proc.kill()
            self._proc = None
        if remove_dir and self._owns_dir and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
            self._owns_dir = False

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Block until the readiness probe answers.

        Args:
            timeout_s: bound on the wait; defaults to ``startup_timeout_s``.

        Raises:
            ServerStartError: the process exited, or the bound passed; the
                process is left as it is (``stop()`` still cleans up).
            LocalServerError: the server was never launched.
        """
        if self._proc is None:
            raise LocalServerError(f"{self!r} was not started")
        bound_s = self.startup_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + bound_s
        while True:
            code = self._proc.exit_status()
            if code is not None:
                raise ServerStartError(
                    f"{self._binary} exited with status {code} during start-up "
                    f"({self!r}); log tail:\n{self.log_tail()}"
                )
            if self._is_ready(probe_timeout_s=max(0.1, min(1.0, deadline - time.monotonic()))):
                return
            if time.monotonic() >= deadline:
                raise ServerStartError(
                    f"{self._binary} was not ready within {bound_s:.1f} s "
                    f"({self!r}); log tail:\n{self.log_tail()}"
                )
            time.sleep(_PROBE_INTERVAL_S)

    def stop(self, *, timeout_s: float | None = None) -> None:
        """Stop the server: SIGTERM, then SIGKILL after a bound; reap; clean up.

        Removes the data directory if this object created it; a directory
        passed in is kept. Safe to call more than once and on a server that
        was never started.

        Args:
            timeout_s: how long to wait after SIGTERM before SIGKILL; defaults
                to ``stop_timeout_s``.
        """
        if self._proc is not None:
            self._proc.terminate(self.stop_timeout_s if timeout_s is None else timeout_s)
            self._proc = None
        if self._owns_dir and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
            self._owns_dir = False

    def kill(self) -> None:
        """SIGKILL the server and reap it, keeping its data directory and ports.

        A later :meth:`start` runs it again on the same data and ports.
        """
        if self._proc is not None:
            self._proc.kill()
            self._proc = None

    def pause(self) -> None:
        """Freeze the server with SIGSTOP; it keeps its sockets but answers nothing.

        Raises:
            LocalServerError: the server is not running.
        """
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Thaw a paused server with SIGCONT.

        Raises:
            LocalServerError: the server is not running.
        """
        self._signal(signal.SIGCONT)

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last lines of the server's log.

        Args:
            lines: how many lines at most.

        Returns:
            The lines joined by newlines, or a note when there is no log.
        """
        path = self.log_path
        return _tail(path, lines) if path is not None else "<no log yet>"

    def _signal(self, sig: signal.Signals) -> None:
        if self._proc is None:
            raise LocalServerError(f"{self!r} is not running")
        self._proc.signal_group(sig)

    def _require_ports(self) -> list[int]:
        if self._ports is None:
            raise LocalServerError(f"{self!r} has no ports yet; call start() first")
        return self._ports

    def __enter__(self) -> Self:
        if self._proc is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# ---------------------------------------------------------------- etcd


def etcd_is_healthy(host: str, port: int, timeout_s: float) -> bool:
    """Probe an etcd member's ``GET /health`` once.

    Healthy means the member has a leader, no alarm, and served a quorum read.

    Args:
        host: IP address of the member's client URL.
        port: its client port.
        timeout_s: bound on connecting and on the answer.

    Returns:
        True when the answer is ``{"health": "true"}``; False on any error.
    """
    # http.client, not urllib: urllib would honour http_proxy and leave loopback.
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", "/health")
        resp = conn.getresponse()
        body = resp.read()
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()
    if resp.status != 200:
        return False
    try:
        return bool(json.loads(body).get("health") == "true")
    except (ValueError, AttributeError):
        return False


class EtcdServer(LocalServer):
    """One etcd member on 127.0.0.1: a single-member cluster by default.

    Args:
        name: member name (``--name``).
        data_dir: directory for the data (``<dir>/data``) and log
            (``<dir>/etcd.log``); created if missing and kept by ``stop()``.
            Default: a fresh temporary directory, removed by ``stop()``.
        base_dir: where to create that temporary directory (default: the
            system temp dir).
        client_port: client port; default: a free one, picked at first start.
        peer_port: peer port; default: a free one. Give both ports or neither.
        heartbeat_interval_ms: raft heartbeat (``--heartbeat-interval``).
        election_timeout_ms: raft election timeout (``--election-timeout``).
            etcd's smallest lease TTL is 1.5 election timeouts rounded up to
            whole seconds: 500 ms gives true 1 s leases, 1000 ms makes them 2 s.
        initial_cluster: ``--initial-cluster``; default: this member alone.
        initial_cluster_state: "new" or "existing"; "existing" is used
            regardless when the data dir already holds a member.
        cluster_token: ``--initial-cluster-token``; default: a random one, so
            stray members of other test clusters can never join.
        binary: executable name or path; default ``etcd``.
        startup_timeout_s: bound on waiting for ``/health``.
        stop_timeout_s: bound on waiting after SIGTERM before SIGKILL.
        extra_args: appended to the command line.

    Raises:
        ValueError: only one of ``client_port`` / ``peer_port`` is given.
    """

    _binary_default = "etcd"
    _package = "etcd-server"
    _log_name = "etcd.log"
    _dir_prefix = "lazarus-etcd-"

    def __init__(
        self,
        *,
        name: str = "lazarus-etcd",
        data_dir: str | os.PathLike[str] | None = None,
        base_dir: str | os.PathLike[str] | None = None,
        client_port: int | None = None,
        peer_port: int | None = None,
        heartbeat_interval_ms: int = 50,
        election_timeout_ms: int = 500,
        initial_cluster: str | None = None,
        initial_cluster_state: str = "new",
        cluster_token: str | None = None,
        binary: str | None = None,
        startup_timeout_s: float = 20.0,
        stop_timeout_s: float = 10.0,
        extra_args: Sequence[str] = (),
    ) -> None:
        if (client_port is None) != (peer_port is None):
            raise ValueError("give both client_port and peer_port, or neither")
        ports = (
            [client_port, peer_port] if client_port is not None and peer_port is not None else None
        )
        super().__init__(
            ports=ports,
            data_dir=data_dir,
            base_dir=base_dir,
            binary=binary,
            startup_timeout_s=startup_timeout_s,
            stop_timeout_s=stop_timeout_s,
        )
        self.name = name
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.election_timeout_ms = election_timeout_ms
        self.initial_cluster = initial_cluster
        self.initial_cluster_state = initial_cluster_state
        self.cluster_token = cluster_token or f"lazarus-{uuid.uuid4().hex[:12]}"
        self.extra_args = list(extra_args)

    @property
    def peer_port(self) -> int:
        """The raft peer port.

        Raises:
            LocalServerError: no port has been picked yet.
        """
        return self._require_ports()[1]

    @property
    def client_url(self) -> str:
        """``http://127.0.0.1:<port>``, as etcdctl ``--endpoints`` wants it."""
        return f"http://{self.host}:{self.port}"

    @property
    def client_urls(self) -> list[str]:
        """The client URLs: one for a single server."""
        return [self.client_url]

    @property
    def peer_url(self) -> str:
        """``http://127.0.0.1:<peer_port>``."""
        return f"http://{self.host}:{self.peer_port}"

    def _port_count(self) -> int:
        return 2

    def _env(self) -> dict[str, str]:
        # etcd reads ETCD_* variables as flags; keep the caller's out.
        return {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}

    def _argv(self, binary_path: str, data_dir: Path, ports: list[int]) -> list[str]:
        client_url = f"http://{LOOPBACK_HOST}:{ports[0]}"
        peer_url = f"http://{LOOPBACK_HOST}:{ports[1]}"
        etcd_data = data_dir / "data"
        state = "existing" if (etcd_data / "member").exists() else self.initial_cluster_state
        return [
            binary_path,
            f"--name={self.name}",
            f"--data-dir={etcd_data}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster={self.initial_cluster or f'{self.name}={peer_url}'}",
            f"--initial-cluster-state={state}",
            f"--initial-cluster-token={self.cluster_token}",
            f"--heartbeat-interval={self.heartbeat_interval_ms}",
            f"--election-timeout={self.election_timeout_ms}",
            "--logger=zap",
            "--log-outputs=stderr",
            *self.extra_args,
        ]

    def _is_ready(self, probe_timeout_s: float) -> bool:
        ports = self._require_ports()
        return etcd_is_healthy(LOOPBACK_HOST, ports[0], probe_timeout_s)


class EtcdCluster:
    """An n-member etcd cluster on 127.0.0.1, each member its own process.

    Args:
        size: number of members (3 by default; odd sizes make sense).
        data_dir: root directory; member ``i`` lives in ``<root>/member-<i>``.
            Default: a fresh temporary directory, removed by ``stop()``.
        base_dir: where to create that temporary directory.
        heartbeat_interval_ms: raft heartbeat of every member.
        election_timeout_ms: raft election timeout of every member; the
            default 1000 ms tolerates a loaded 2-core machine without
            spurious elections (leases shorter than 2 s are rounded up to 2 s).
        binary: executable name or path; default ``etcd``.
        startup_timeout_s: bound on waiting for every member's ``/health``.
        stop_timeout_s: bound on waiting after SIGTERM before SIGKILL in
            :meth:`stop_member`.
        shutdown_grace_s: the same bound per member in :meth:`stop`, short on
            purpose: a leader stopped just after a peer may spend 5 s + two
            election timeouts handing leadership to that departed peer, and
            when the whole cluster goes a SIGKILL loses nothing (etcd fsyncs
            its WAL before it acknowledges a write).
        name_prefix: member ``i`` is named ``<name_prefix><i>``.
        extra_args: appended to every member's command line.

    Raises:
        ValueError: ``size`` < 1.
    """

    def __init__(
        self,
        size: int = 3,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        base_dir: str | os.PathLike[str] | None = None,
        heartbeat_interval_ms: int = 100,
        election_timeout_ms: int = 1000,
        binary: str | None = None,
        startup_timeout_s: float = 30.0,
        stop_timeout_s: float = 10.0,
        shutdown_grace_s: float = 1.0,
        name_prefix: str = "lazarus-etcd-",
        extra_args: Sequence[str] = (),
    ) -> None:
        if size < 1:
            raise ValueError(f"a cluster needs at least one member, not {size}")
        self.size = size
        self._base_dir = Path(base_dir) if base_dir is not None else None
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.election_timeout_ms = election_timeout_ms
        self._binary = binary
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.shutdown_grace_s = shutdown_grace_s
        self.name_prefix = name_prefix
        self.extra_args = list(extra_args)
        self._dir: Path | None = Path(data_dir) if data_dir is not None else None
        self._owns_dir = False
        self._members: list[EtcdServer] = []

    # -- properties

    @property
    def members(self) -> list[EtcdServer]:
        """The member servers, index i ↔ member named ``<name_prefix><i>``.

        Raises:
            LocalServerError: the cluster was never started.
        """
        if not self._members:
            raise LocalServerError(f"{self!r} was not started")
        return list(self._members)

    @property
    def host(self) -> str:
        """The address every member listens on: always 127.0.0.1."""
        return LOOPBACK_HOST

    @property
    def ports(self) -> list[int]:
        """The client port of each member."""
        return [m.port for m in self.members]

    @property
    def endpoints(self) -> list[Endpoint]:
        """The client ``Endpoint(host, port)`` of each member."""
        return [m.endpoint for m in self.members]

    @property
    def client_urls(self) -> list[str]:
        """The client URL of each member."""
        return [m.client_url for m in self.members]

    @property
    def pids(self) -> list[int | None]:
        """The pid of each member, None for a member that is not running."""
        return [m.pid if m.running else None for m in self.members]

    @property
    def data_dir(self) -> Path | None:
        """The root directory holding every member's data and log."""
        return self._dir

    def member_index(self, name: str) -> int:
        """The index of the member called ``name`` (as etcd's member list reports it).

        Raises:
            KeyError: no member has that name.
        """
        for i, m in enumerate(self.members):
            if m.name == name:
                return i
        raise KeyError(name)

    def __repr__(self) -> str:
        return f"<EtcdCluster size={self.size} dir={self._dir} members={self._members}>"

    # -- lifecycle

    def start(self) -> Self:
        """Launch every member and wait until each one reports healthy.

        Returns:
            ``self``.

        Raises:
            ServerBinaryNotFoundError: etcd is not on ``PATH``.
            ServerStartError: a member exited or the cluster was not healthy
                within ``startup_timeout_s``; the message holds the log tails.
            LocalServerError: already started.
        """
        if self._members:
            raise LocalServerError(f"{self!r} is already started")
        if self._dir is None:
            if self._base_dir is not None:
                self._base_dir.mkdir(parents=True, exist_ok=True)
            self._dir = Path(tempfile.mkdtemp(prefix="lazarus-etcd-cluster-", dir=self._base_dir))
            self._owns_dir = True
        for attempt in range(1, _PORT_PICK_ATTEMPTS + 1):
            self._members = self._make_members()
            try:
                for m in self._members:
                    m.start(wait=False)
                self.wait_ready()
            except ServerStartError as e:
                for m in self._members:
                    m.kill()
                if attempt < _PORT_PICK_ATTEMPTS and _ADDRESS_IN_USE in str(e).lower():
                    for i in range(self.size):
                        shutil.rmtree(self._member_dir(i), ignore_errors=True)
                    continue
                self.stop()
                raise
            except BaseException:
                self.stop()
                raise
            return self
        raise AssertionError("unreachable")  # pragma: no cover

    def _member_dir(self, i: int) -> Path:
        if self._dir is None:
            raise LocalServerError(f"{self!r} has no data directory")
        return self._dir / f"member-{i}"

    def _make_members(self) -> list[EtcdServer]:
        ports = free_loopback_ports(2 * self.size)
        names = [f"{self.name_prefix}{i}" for i in range(self.size)]
        initial_cluster = ",".join(
            f"{names[i]}=http://{LOOPBACK_HOST}:{ports[2 * i + 1]}" for i in range(self.size)
        )
        token = f"lazarus-{uuid.uuid4().hex[:12]}"
        return [
            EtcdServer(
                name=names[i],
                data_dir=self._member_dir(i),
                client_port=ports[2 * i],
                peer_port=ports[2 * i + 1],
                heartbeat_interval_ms=self.heartbeat_interval_ms,
                election_timeout_ms=self.election_timeout_ms,
                initial_cluster=initial_cluster,
                initial_cluster_state="new",
                cluster_token=token,
                binary=self._binary,
                startup_timeout_s=self.startup_timeout_s,
                stop_timeout_s=self.stop_timeout_s,
                extra_args=self.extra_args,
            )
            for i in range(self.size)
        ]

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Block until every running member reports healthy.

        Args:
            timeout_s: bound on the whole wait; defaults to ``startup_timeout_s``.

        Raises:
            ServerStartError: a member exited or the bound passed; the message
                holds the log tail of each member that is not healthy.
        """
        bound_s = self.startup_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + bound_s
        for m in self.members:
            if not m.launched:
                continue
            try:
                m.wait_ready(timeout_s=max(0.0, deadline - time.monotonic()))
            except ServerStartError as e:
                others = "\n".join(
                    f"--- {o.name} log tail:\n{o.log_tail(15)}" for o in self.members if o is not m
                )
                raise ServerStartError(
                    f"etcd cluster not healthy within {bound_s:.1f} s: {e}\n{others}"
                ) from e

    def stop(self) -> None:
        """Stop every member (SIGTERM, then SIGKILL after ``shutdown_grace_s``) and clean up.

        Removes the root directory if this object created it. Safe to call
        more than once.
        """
        for m in self._members:
            m.stop(timeout_s=self.shutdown_grace_s)
        self._members = []
        if self._owns_dir and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
            self._owns_dir = False

    def kill(self) -> None:
        """SIGKILL every member, keeping the data; :meth:`start_member` revives them."""
        for m in self._members:
            m.kill()

    def pause(self) -> None:
        """SIGSTOP every running member."""
        for m in self._members:
            if m.running:
                m.pause()

    def resume(self) -> None:
        """SIGCONT every running member."""
        for m in self._members:
            if m.running:
                m.resume()

    # -- per member

    def stop_member(self, i: int) -> None:
        """Stop member ``i`` gracefully (SIGTERM, bounded, then SIGKILL), keeping its data.

        Args:
            i: member index, 0-based.
        """
        self.members[i].stop()

    def kill_member(self, i: int) -> None:
        """SIGKILL member ``i``, keeping its data.

        Args:
            i: member index, 0-based.
        """
        self.members[i].kill()

    def start_member(self, i: int, *, wait: bool = True) -> None:
        """Restart member ``i`` on its data dir and ports with ``--initial-cluster-state existing``.

        Args:
            i: member index, 0-based.
            wait: wait until the member reports healthy, which needs a quorum
                of running members.

        Raises:
            ServerStartError: it exited or was not healthy within ``startup_timeout_s``.
            LocalServerError: it is already running.
        """
        member = self.members[i]
        member.initial_cluster_state = "existing"
        member.start(wait=wait)

    def pause_member(self, i: int) -> None:
        """SIGSTOP member ``i``.

        Args:
            i: member index, 0-based.
        """
        self.members[i].pause()

    def resume_member(self, i: int) -> None:
        """SIGCONT member ``i``.

        Args:
            i: member index, 0-based.
        """
        self.members[i].resume()

    def __enter__(self) -> Self:
        if not self._members:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __iter__(self) -> Iterator[EtcdServer]:
        return iter(self.members)

    def __len__(self) -> int:
        return self.size


# ---------------------------------------------------------------- redis


def redis_answers_ping(host: str, port: int, timeout_s: float) -> bool:
    """Send one ``PING`` to a Redis server on a fresh connection.

    Args:
        host: IP address.
        port: TCP port.
        timeout_s: bound on connecting and on each read.

    Returns:
        True when it answers ``+PONG``, or ``-NOAUTH`` (serving, with a password
        set); False on any error or other answer.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            reply = b""
            while not reply.endswith(b"\r\n"):
                chunk = sock.recv(64)
                if not chunk:
                    return False
                reply += chunk
    except OSError:
        return False
    return reply == b"+PONG\r\n" or reply.startswith(b"-NOAUTH")


class RedisServer(LocalServer):
    """One redis-server on 127.0.0.1 with persistence off.

    Args:
        data_dir: working directory (``--dir``) holding ``redis.log``; created
            if missing and kept by ``stop()``. Default: a fresh temporary
            directory, removed by ``stop()``.
        base_dir: where to create that temporary directory.
        port: client port; default: a free one, picked at first start.
        binary: executable name or path; default ``redis-server``.
        startup_timeout_s: bound on waiting for ``PING``.
        stop_timeout_s: bound on waiting after SIGTERM before SIGKILL.
        extra_args: appended to the command line (``--maxmemory``, ...).
    """

    _binary_default = "redis-server"
    _package = "redis-server"
    _log_name = "redis.log"
    _dir_prefix = "lazarus-redis-"

    def __init__(
        self,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        base_dir: str | os.PathLike[str] | None = None,
        port: int | None = None,
        binary: str | None = None,
        startup_timeout_s: float = 10.0,
        stop_timeout_s: float = 10.0,
        extra_args: Sequence[str] = (),
    ) -> None:
        super().__init__(
            ports=[port] if port is not None else None,
            data_dir=data_dir,
            base_dir=base_dir,
            binary=binary,
            startup_timeout_s=startup_timeout_s,
            stop_timeout_s=stop_timeout_s,
        )
        self.extra_args = list(extra_args)

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``, for ``redis.asyncio.from_url``."""
        return f"redis://{self.host}:{self.port}/0"

    def _port_count(self) -> int:
        return 1

    def _argv(self, binary_path: str, data_dir: Path, ports: list[int]) -> list[str]:
        return [
            binary_path,
            "--port",
            str(ports[0]),
            "--bind",
            LOOPBACK_HOST,
            "--dir",
            str(data_dir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--logfile",
            "",
            *self.extra_args,
        ]

    def _is_ready(self, probe_timeout_s: float) -> bool:
        return redis_answers_ping(LOOPBACK_HOST, self._require_ports()[0], probe_timeout_s)
