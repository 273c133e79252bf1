"""``lazarus coordinator`` against an etcd with auth enabled, and over TLS.

Each test owns an etcd (``make_etcd``), turns on what it tests (``etcdctl
user add root`` + ``auth enable``; TLS certificates made with ``openssl``),
starts a real coordinator process configured through the ``LAZARUS_ETCD_*``
variables the Helm chart sets, and waits until that replica leads: it has
then granted a lease, campaigned and written to etcd as that user / over TLS.
Processes are stopped by pid at teardown.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aetcd
import pytest

from coordinator.aetcd_compat import TlsClient, tls_credentials
from lazarus_dev.localservers import free_loopback_ports

LAZARUS = Path(sys.executable).parent / "lazarus"
LEADER_TIMEOUT_S = 30.0
PASSWORD = "s3cret-pw"

Spawn = Callable[[dict[str, str]], tuple[subprocess.Popen[bytes], int]]


def _etcdctl(endpoint: str, *args: str, user: str | None = None) -> str:
    argv = ["etcdctl", f"--endpoints={endpoint}"]
    if user is not None:
        argv.append(f"--user={user}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL_")}
    env["ETCDCTL_API"] = "3"
    done = subprocess.run(
        [*argv, *args], capture_output=True, text=True, timeout=20, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _enable_auth(endpoint: str) -> None:
    _etcdctl(endpoint, "user", "add", f"root:{PASSWORD}")
    _etcdctl(endpoint, "auth", "enable")


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """Factory: ``spawn(env)`` -> (a running coordinator process, its metrics port)."""
    if shutil.which("etcdctl") is None:
        pytest.skip("needs etcdctl")
    started: list[subprocess.Popen[bytes]] = []

    def start(env: dict[str, str]) -> tuple[subprocess.Popen[bytes], int]:
        grpc_port, metrics_port = free_loopback_ports(2)
        log = (tmp_path / f"coordinator-{len(started)}.log").open("wb")
        clean = {k: v for k, v in os.environ.items() if not k.startswith("LAZARUS_")}
        process = subprocess.Popen(
            [str(LAZARUS), "coordinator"],
            env={
                **clean,
                "LAZARUS_CLUSTER": f"auth-{len(started)}",
                "LAZARUS_MEMBER_ID": f"c{len(started)}",
                "LAZARUS_LISTEN": f"127.0.0.1:{grpc_port}",
                "LAZARUS_METRICS_LISTEN": f"127.0.0.1:{metrics_port}",
                "LAZARUS_LEASE_TTL_S": "3",
                "LAZARUS_AUTH": "none",  # etcd's credentials are the subject; mTLS: test_security
                **env,
            },
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        started.append(process)
        return process, metrics_port

    yield start
    for process in started:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def _is_leader(metrics_port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", metrics_port, timeout=1.0)
    try:
        conn.request("GET", "/metrics")
        body = conn.getresponse().read().decode()
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()
    return "lazarus_is_leader 1.0" in body


def _wait_for_leader(process: subprocess.Popen[bytes], metrics_port: int) -> None:
    deadline = time.monotonic() + LEADER_TIMEOUT_S
    while time.monotonic() < deadline:
        assert process.poll() is None, f"coordinator exited with {process.returncode}"
        if _is_leader(metrics_port):
            return
        time.sleep(0.2)
    raise AssertionError("coordinator did not become leader")


def _stop(process: subprocess.Popen[bytes]) -> int:
    process.send_signal(signal.SIGTERM)
    return process.wait(timeout=15)


def test_coordinator_leads_with_etcd_username_and_password(
    make_etcd: Callable[..., Any], spawn: Spawn
) -> None:
    etcd = make_etcd()
    _enable_auth(etcd.client_url)

    process, metrics_port = spawn(
        {
            "LAZARUS_ETCD_ENDPOINT": str(etcd.endpoint),
            "LAZARUS_ETCD_USERNAME": "root",
            "LAZARUS_ETCD_PASSWORD": PASSWORD,
        }
    )
    _wait_for_leader(process, metrics_port)
    # Its election key is there, read back as root.
    keys = _etcdctl(
        etcd.client_url, "get", "--prefix", "--keys-only", "/lazarus/", user=f"root:{PASSWORD}"
    )
    assert "/lazarus/auth-0/" in keys
    assert _stop(process) == 0


def test_coordinator_with_a_wrong_password_exits_1(
    make_etcd: Callable[..., Any], spawn: Spawn
) -> None:
    etcd = make_etcd()
    _enable_auth(etcd.client_url)

    process, _ = spawn(
        {
            "LAZARUS_ETCD_ENDPOINT": str(etcd.endpoint),
            "LAZARUS_ETCD_USERNAME": "root",
            "LAZARUS_ETCD_PASSWORD": "wrong",
        }
    )
    assert process.wait(timeout=30) == 1


def test_an_idle_leader_keeps_its_token_and_resigns_cleanly(
    make_etcd: Callable[..., Any], spawn: Spawn
) -> None:
    # Tokens die after 2 s without use; lease keep-alives do not use them. An
    # idle leader must renew its token, or its resignation (a lease revoke)
    # fails and its election key lingers until the lease runs out.
    etcd = make_etcd(extra_args=["--auth-token-ttl=2"])
    _enable_auth(etcd.client_url)

    process, metrics_port = spawn(
        {
            "LAZARUS_ETCD_ENDPOINT": str(etcd.endpoint),
            "LAZARUS_ETCD_USERNAME": "root",
            "LAZARUS_ETCD_PASSWORD": PASSWORD,
            "LAZARUS_ETCD_TOKEN_RENEWAL_S": "0.5",
        }
    )
    _wait_for_leader(process, metrics_port)
    time.sleep(5.0)  # idle, well past the token TTL
    assert _is_leader(metrics_port)
    assert _stop(process) == 0
    keys = _etcdctl(
        etcd.client_url, "get", "--prefix", "--keys-only", "/lazarus/", user=f"root:{PASSWORD}"
    )
    assert "/election/" not in keys  # revoked at once, not left to expire


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LAZARUS_ETCD_USERNAME": "root"}, "username and password"),
        ({"LAZARUS_ETCD_CERT_FILE": "/tmp/c.pem"}, "cert file and key file"),
    ],
)
def test_half_given_credentials_are_a_usage_error(env: dict[str, str], message: str) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LAZARUS_")}
    done = subprocess.run(
        [str(LAZARUS), "coordinator"],
        env={**clean, "LAZARUS_AUTH": "none", **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert message in done.stderr


# ------------------------------------------------------------------------- TLS


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr


def _make_certs(directory: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 / localhost and a client certificate."""
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-subj", "/CN=lazarus-test-ca", "-keyout", "ca.key", "-out", "ca.crt", cwd=directory,
    )  # fmt: skip
    (directory / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
    )
    (directory / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, cn in (("server", "127.0.0.1"), ("client", "root")):
        _openssl(
            "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=directory,
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt",
            cwd=directory,
        )  # fmt: skip


@pytest.fixture
def tls_etcd(make_etcd: Callable[..., Any], tmp_path: Path) -> tuple[str, Path]:
    """An etcd serving https on a port of its own (mutual TLS) beside its http one.

    Returns:
        (the https endpoint host:port, the directory with ca/client certs).
    """
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl")
    certs = tmp_path / "certs"
    certs.mkdir()
    _make_certs(certs)
    http_port, peer_port, https_port = free_loopback_ports(3)
    make_etcd(
        client_port=http_port,
        peer_port=peer_port,
        extra_args=[
            # The http URL stays for the fixture's /health probe; the https one is tested.
            f"--listen-client-urls=http://127.0.0.1:{http_port},https://127.0.0.1:{https_port}",
            f"--cert-file={certs / 'server.crt'}",
            f"--key-file={certs / 'server.key'}",
            f"--trusted-ca-file={certs / 'ca.crt'}",
            "--client-cert-auth",
        ],
    )
    return f"127.0.0.1:{https_port}", certs


async def test_tls_client_puts_and_gets_over_mutual_tls(tls_etcd: tuple[str, Path]) -> None:
    endpoint, certs = tls_etcd
    host, _, port = endpoint.rpartition(":")
    credentials = tls_credentials(
        str(certs / "ca.crt"), str(certs / "client.crt"), str(certs / "client.key")
    )
    client = TlsClient(host=host, port=int(port), timeout=5, credentials=credentials)
    try:
        await client.put(b"/lazarus-tls-test", b"v")
        got = await client.get(b"/lazarus-tls-test")
        assert got is not None
        assert got.value == b"v"
    finally:
        await client.close()
    # The plain client cannot talk to the https port.
    plain = aetcd.Client(host=host, port=int(port), timeout=2)
    with pytest.raises(aetcd.ClientError):
        await plain.get(b"/lazarus-tls-test")
    with contextlib.suppress(Exception):
        await plain.close()


def test_coordinator_leads_over_mutual_tls(tls_etcd: tuple[str, Path], spawn: Spawn) -> None:
    endpoint, certs = tls_etcd
    process, metrics_port = spawn(
        {
            "LAZARUS_ETCD_ENDPOINT": endpoint,
            "LAZARUS_ETCD_CA_FILE": str(certs / "ca.crt"),
            "LAZARUS_ETCD_CERT_FILE": str(certs / "client.crt"),
            "LAZARUS_ETCD_KEY_FILE": str(certs / "client.key"),
        }
    )
    _wait_for_leader(process, metrics_port)
    assert _stop(process) == 0
