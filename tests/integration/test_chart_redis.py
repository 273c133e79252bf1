"""The Helm chart's in-chart Redis command line, run by the real redis-server binary.

The chart's Redis container arguments are rendered (default values, with the
TLS Secrets every install needs), ``$(REDIS_PASSWORD)`` is replaced by the
password of the rendered Secret as the kubelet would, and redis-server is
started with exactly those arguments inside a network namespace of its own.
A client on the host side of a veth (a non-loopback address, as a coordinator
pod is to the Redis pod) must be served once it AUTHs, and refused without
the password. The chart's earlier command line (no password, no bind) is run
the same way to show what the change fixes: protected mode refuses such a
client. Needs root (network namespaces) and redis-server; skipped otherwise.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lazarus_dev.netns import Namespace, namespaces_available

pytestmark = pytest.mark.integration

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "lazarus"
VALUES = {"tls": {"existingSecrets": {"coordinator": "member-tls", "nodeAgent": "node-tls"}}}
OLD_ARGS = ["redis-server", "--dir", "/data", "--appendonly", "no", "--save", ""]
"""The chart's ``command:`` before the [security] issue."""


def _rendered_redis() -> tuple[list[str], str]:
    import helm_python as helm
    import yaml

    manifests = helm.Chart.load(CHART).render(
        values=VALUES, name="demo", namespace="lazarus", is_install=True
    )
    docs = [d for d in yaml.safe_load_all(manifests["lazarus/templates/redis.yaml"]) if d]
    (secret,) = [d for d in docs if d["kind"] == "Secret"]
    (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    assert "command" not in container, "command: would bypass the image's entrypoint"
    password = base64.b64decode(secret["data"]["password"]).decode()
    return list(container["args"]), password


@pytest.fixture
def namespace() -> Iterator[Namespace]:
    ok, why = namespaces_available()
    if not ok:
        pytest.skip(why)
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    ns = Namespace(f"lzsec{os.getpid() % 100000}", subnet_index=20000 + os.getpid() % 8000)
    ns.create()
    try:
        yield ns
    finally:
        ns.close()


@contextlib.contextmanager
def _redis_in(ns: Namespace, args: list[str], data_dir: Path) -> Iterator[subprocess.Popen[Any]]:
    argv = [str(data_dir) if a == "/data" else a for a in args]
    argv[0] = shutil.which("redis-server") or "redis-server"
    process = subprocess.Popen(
        [*ns.wrapper(), *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def _ping(host: str, password: str | None) -> str:
    """AUTH (when a password is given) and PING on a raw connection; the last reply line."""
    commands = [["AUTH", password]] if password is not None else []
    commands.append(["PING"])
    payload = b"".join(
        f"*{len(c)}\r\n".encode() + b"".join(f"${len(w)}\r\n{w}\r\n".encode() for w in c)
        for c in commands
    )
    deadline = time.monotonic() + 5
    while True:
        try:
            with socket.create_connection((host, 6379), timeout=2) as sock:
                sock.sendall(payload)
                reply = b""
                while reply.count(b"\r\n") < len(commands):
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    reply += chunk
                return reply.decode(errors="replace").strip().splitlines()[-1]
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # not listening yet


def test_the_chart_redis_accepts_an_authenticated_remote_client(
    namespace: Namespace, tmp_path: Path
) -> None:
    args, password = _rendered_redis()
    args = [password if a == "$(REDIS_PASSWORD)" else a for a in args]
    with _redis_in(namespace, args, tmp_path):
        assert _ping(namespace.ns_ip, password) == "+PONG"
        assert _ping(namespace.ns_ip, None).startswith("-NOAUTH")
        assert _ping(namespace.ns_ip, "guess").startswith("-NOAUTH")  # the AUTH failed


def test_the_old_chart_command_line_refused_remote_clients(
    namespace: Namespace, tmp_path: Path
) -> None:
    with _redis_in(namespace, OLD_ARGS, tmp_path):
        answer = _ping(namespace.ns_ip, None)
    assert "DENIED" in answer or "protected mode" in answer, answer
