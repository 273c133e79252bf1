"""Certificates, identities and TLS credentials for every Lazarus gRPC surface.

Theory of operation
-------------------
One cluster CA signs every certificate. A certificate names exactly one
identity in its URI SAN, in one scheme::

    spiffe://lazarus/<cluster>/node/<node_id>     a node agent (may open a Session as <node_id>)
    spiffe://lazarus/<cluster>/member/<member_id> a coordinator replica (server + member traffic)
    spiffe://lazarus/<cluster>/client/<name>      an orchestrator; its role is the Subject O

A client's role (``viewer``, ``operator``, ``admin``) is the certificate
subject's organization, as Kubernetes reads groups from O. Member
certificates are both server and client certificates (serverAuth +
clientAuth): a follower proxies writes to the leader with it.

:class:`ServerTls` builds the server's credentials with grpc's dynamic
certificate configuration: the fetcher runs before every TLS handshake, looks
at the files' ``stat`` and re-reads them only when they changed, so a rotated
certificate (or CA bundle) is served to the next connection without a restart
and without touching live connections. :class:`ClientTls` builds channel
credentials from files read when a channel is made; agents make a channel per
Session, so they pick up a rotated client certificate on their next Session.

``init_ca`` / ``issue`` / ``describe`` back ``lazarus certs``; they use the
``cryptography`` library and write PEM files (private keys mode 0600).
"""

from __future__ import annotations

import datetime
import enum
import functools
import ipaddress
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "ROLES",
    "CertificateError",
    "ClientTls",
    "Identity",
    "IdentityKind",
    "IssuedFiles",
    "ServerTls",
    "describe",
    "identity_from_pem",
    "init_ca",
    "issue",
    "parse_spiffe",
]

_log = logging.getLogger("lazarus.tls")

SPIFFE_TRUST_DOMAIN = "lazarus"
ROLES = ("viewer", "operator", "admin")
"""Client roles, weakest first; each includes what the ones before it may do."""

DEFAULT_VALID_DAYS = 365
CA_VALID_DAYS = 3650


class CertificateError(ValueError):
    """A certificate is unusable: unreadable, or it names no valid Lazarus identity."""


class IdentityKind(enum.Enum):
    """What a certificate's holder is."""

    NODE = "node"
    MEMBER = "member"
    CLIENT = "client"


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a peer is, from its certificate or bearer token.

    Attributes:
        kind: node, member or client.
        cluster: the cluster the identity belongs to.
        name: node id, member id or client name.
        role: a client's role (one of ``ROLES``); "" for nodes and members.
    """

    kind: IdentityKind
    cluster: str
    name: str
    role: str = ""

    @property
    def uri(self) -> str:
        """The identity's SPIFFE URI."""
        return f"spiffe://{SPIFFE_TRUST_DOMAIN}/{self.cluster}/{self.kind.value}/{self.name}"

    def __str__(self) -> str:
        return f"{self.uri} ({self.role})" if self.role else self.uri


def parse_spiffe(uri: str, role: str = "") -> Identity:
    """``spiffe://lazarus/<cluster>/<kind>/<name>`` → :class:`Identity`.

    Raises:
        CertificateError: not in the scheme.
    """
    prefix = f"spiffe://{SPIFFE_TRUST_DOMAIN}/"
    if not uri.startswith(prefix):
        raise CertificateError(f"{uri!r} is not a {prefix}<cluster>/<kind>/<name> URI")
    parts = uri[len(prefix) :].split("/")
    if len(parts) != 3 or not all(parts):
        raise CertificateError(f"{uri!r} is not a {prefix}<cluster>/<kind>/<name> URI")
    cluster, kind, name = parts
    try:
        identity_kind = IdentityKind(kind)
    except ValueError:
        raise CertificateError(f"{uri!r}: kind {kind!r} is not node, member or client") from None
    if identity_kind is IdentityKind.CLIENT:
        if role not in ROLES:
            raise CertificateError(f"{uri!r}: client role {role!r} is not one of {ROLES}")
    else:
        role = ""
    return Identity(identity_kind, cluster, name, role)


def _identity_of(cert: x509.Certificate) -> Identity:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise CertificateError("the certificate has no subject alternative name") from None
    uris = [u for u in san.get_values_for_type(x509.UniformResourceIdentifier)]
    spiffe = [u for u in uris if u.startswith("spiffe://")]
    if len(spiffe) != 1:
        raise CertificateError(f"the certificate names {len(spiffe)} spiffe URIs, not one")
    orgs = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    role = str(orgs[0].value) if orgs else ""
    return parse_spiffe(spiffe[0], role)


@functools.lru_cache(maxsize=1024)
def identity_from_pem(pem: bytes) -> Identity:
    """The identity a PEM certificate names (cached: peers reuse their certificate).

    Raises:
        CertificateError: it does not parse or names no valid identity.
    """
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError as exc:
        raise CertificateError(f"the certificate does not parse: {exc}") from exc
    return _identity_of(cert)


# ---------------------------------------------------------------- issuing


@dataclass(frozen=True, slots=True)
class IssuedFiles:
    """Where ``issue`` / ``init_ca`` wrote a certificate and its key."""

    cert_file: Path
    key_file: Path


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)  # readers (the reload fetcher) never see half a file


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def init_ca(
    directory: Path,
    cluster: str,
    *,
    valid_days: int = CA_VALID_DAYS,
    now: datetime.datetime | None = None,
) -> IssuedFiles:
    """Create a cluster CA: ``ca.crt`` and ``ca.key`` (0600) in ``directory``.

    Raises:
        FileExistsError: ``ca.key`` exists (never overwrite a CA by accident).
    """
    cert_file, key_file = directory / "ca.crt", directory / "ca.key"
    if key_file.exists():
        raise FileExistsError(f"{key_file} exists; remove it to create a new CA")
    now = now or datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "lazarus"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"lazarus {cluster} CA"),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(key_file, _key_pem(key), private=True)
    _write(cert_file, cert.public_bytes(serialization.Encoding.PEM))
    return IssuedFiles(cert_file, key_file)


def issue(
    ca_dir: Path,
    out_dir: Path,
    identity: Identity,
    *,
    hosts: Sequence[str] = (),
    valid_days: int = DEFAULT_VALID_DAYS,
    now: datetime.datetime | None = None,
    basename: str = "",
) -> IssuedFiles:
    """Issue a certificate for ``identity``, signed by the CA in ``ca_dir``.

    Args:
        ca_dir: holds ``ca.crt`` and ``ca.key`` (see :func:`init_ca`).
        out_dir: where ``<basename>.crt`` and ``<basename>.key`` go.
        identity: what the certificate names (URI SAN; a client's role as O).
        hosts: DNS names and IP addresses the holder serves under (members).
        valid_days: validity from ``now``; negative issues an already expired one.
        now: the issue time (default: the wall clock).
        basename: file name stem (default ``<kind>-<name>``).

    Returns:
        The written files.

    Raises:
        FileNotFoundError: the CA files are missing.
    """
    ca_cert = x509.load_pem_x509_certificate((ca_dir / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise CertificateError("the CA key is not an EC key made by `lazarus certs init`")
    now = now or datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, identity.name)]
    if identity.role:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, identity.role))
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(identity.uri)]
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if identity.kind is IdentityKind.MEMBER:
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
    start = now - datetime.timedelta(minutes=5)
    end = now + datetime.timedelta(days=valid_days)
    if end <= start:
        start = end - datetime.timedelta(days=1)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attrs))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    stem = basename or f"{identity.kind.value}-{identity.name}"
    files = IssuedFiles(out_dir / f"{stem}.crt", out_dir / f"{stem}.key")
    _write(files.key_file, _key_pem(key), private=True)
    _write(files.cert_file, cert.public_bytes(serialization.Encoding.PEM))
    return files


def describe(pem: bytes) -> dict[str, Any]:
    """What a certificate grants, for ``lazarus certs show``.

    Returns:
        ``identity``, ``kind``, ``cluster``, ``name``, ``role``, ``grants`` (words),
        ``hosts``, ``not_before``, ``not_after``, ``issuer``, ``serial``.

    Raises:
        CertificateError: it does not parse or names no valid identity.
    """
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError as exc:
        raise CertificateError(f"the certificate does not parse: {exc}") from exc
    out: dict[str, Any] = {
        "subject": cert.subject.rfc4514_string(),
        "issuer": cert.issuer.rfc4514_string(),
        "serial": format(cert.serial_number, "x"),
        "not_before": cert.not_valid_before_utc.isoformat(),
        "not_after": cert.not_valid_after_utc.isoformat(),
    }
    try:
        basic = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        if basic.ca:
            out["grants"] = "certificate authority: signs the cluster's certificates"
            return out
    except x509.ExtensionNotFound:
        pass
    identity = _identity_of(cert)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    hosts = [*san.get_values_for_type(x509.DNSName)]
    hosts += [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
    from coordinator.authz import grants  # the policy says what an identity may do

    out.update(
        identity=identity.uri,
        kind=identity.kind.value,
        cluster=identity.cluster,
        name=identity.name,
        role=identity.role,
        hosts=hosts,
        grants=grants(identity),
    )
    return out


# ---------------------------------------------------------------- credentials


def _read(path: str) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


def _stamp(paths: Sequence[str]) -> tuple[tuple[int, int, int], ...]:
    out = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append((0, 0, 0))
            continue
        out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def _check_pair(cert_pem: bytes, key_pem: bytes) -> None:
    """Raise CertificateError unless ``key_pem`` is the private key of ``cert_pem``'s first cert."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise CertificateError(f"the certificate or key does not parse: {exc}") from exc
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(*spki) != cert.public_key().public_bytes(*spki):
        raise CertificateError("the key file does not hold the certificate's private key")


@dataclass(slots=True)
class ServerTls:
    """A TLS server's certificate files, reloaded when they change on disk.

    Attributes:
        cert_file: PEM certificate chain the server presents.
        key_file: its private key.
        client_ca_file: PEM bundle of CAs that sign client certificates.
        require_client_cert: refuse a handshake without a client certificate
            (mutual TLS); False only for a bearer-token port.
    """

    cert_file: str
    key_file: str
    client_ca_file: str
    require_client_cert: bool = True
    reloads: int = 0
    _stamp: tuple[tuple[int, int, int], ...] = field(default=(), repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _files(self) -> tuple[str, str, str]:
        return self.cert_file, self.key_file, self.client_ca_file

    def _config(self) -> grpc.ServerCertificateConfiguration:
        cert, key, ca = (_read(p) for p in self._files())
        if cert is None or key is None:
            raise CertificateError("a TLS server needs a certificate file and a key file")
        _check_pair(cert, key)
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def credentials(self) -> grpc.ServerCredentials:
        """Server credentials whose certificates follow the files.

        Raises:
            OSError: a file cannot be read now.
        """
        with self._lock:
            self._stamp = _stamp(self._files())
            initial = self._config()
        return grpc.dynamic_ssl_server_credentials(
            initial, self._fetch, require_client_authentication=self.require_client_cert
        )

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """Called by gRPC before each handshake: a new configuration, or None (unchanged)."""
        try:
            with self._lock:
                stamp = _stamp(self._files())
                if stamp == self._stamp:
                    return None
                config = self._config()
                self._stamp = stamp
                self.reloads += 1
        except Exception as exc:  # a half-rotated pair: keep serving the old one
            _log.warning("reloading the TLS certificate failed (%s); the old one stays", exc)
            return None
        _log.info("TLS certificate reloaded from %s", self.cert_file)
        return config


ENV_CA_FILE = "LAZARUS_TLS_CA_FILE"
ENV_CERT_FILE = "LAZARUS_TLS_CERT_FILE"
ENV_KEY_FILE = "LAZARUS_TLS_KEY_FILE"
ENV_SERVER_NAME = "LAZARUS_TLS_SERVER_NAME"
ENV_TOKEN = "LAZARUS_TOKEN"


@dataclass(frozen=True, slots=True)
class ClientTls:
    """How a gRPC client (agent, orchestrator, follower) dials coordinators.

    Attributes:
        ca_file: PEM bundle verifying the coordinators' certificate; "" with
            every field empty: plaintext (a coordinator run with ``--auth none``).
        cert_file: this client's certificate (mutual TLS); "" = none.
        key_file: its private key.
        server_name: the name to verify in the coordinators' certificate
            instead of the dialled host (``ssl_target_name_override``), for
            addresses such as pod IPs that the certificate cannot list.
        token: a bearer token sent as ``authorization: Bearer <token>``.
    """

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""
    token: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("give both the TLS cert file and key file, or neither")

    @property
    def enabled(self) -> bool:
        """True when the channel speaks TLS."""
        return bool(self.ca_file or self.cert_file)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ClientTls:
        """From ``LAZARUS_TLS_CA_FILE``, ``..._CERT_FILE``, ``..._KEY_FILE``,
        ``..._SERVER_NAME`` and ``LAZARUS_TOKEN`` (unset: plaintext)."""
        env = os.environ if environ is None else environ
        return cls(
            env.get(ENV_CA_FILE, ""),
            env.get(ENV_CERT_FILE, ""),
            env.get(ENV_KEY_FILE, ""),
            env.get(ENV_SERVER_NAME, ""),
            env.get(ENV_TOKEN, ""),
        )

    def env(self) -> dict[str, str]:
        """The environment variables :meth:`from_env` reads back as this."""
        out = {
            ENV_CA_FILE: self.ca_file,
            ENV_CERT_FILE: self.cert_file,
            ENV_KEY_FILE: self.key_file,
            ENV_SERVER_NAME: self.server_name,
        }
        if self.token:
            out[ENV_TOKEN] = self.token
        return out

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Channel credentials from the files as they are now (+ the token, if any).

        Raises:
            OSError: a file cannot be read.
        """
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file),
            private_key=_read(self.key_file),
            certificate_chain=_read(self.cert_file),
        )
        if self.token:
            creds = grpc.composite_channel_credentials(
                creds, grpc.access_token_call_credentials(self.token)
            )
        return creds

    def options(self) -> tuple[tuple[str, Any], ...]:
        """Channel options this needs (the server-name override)."""
        if self.enabled and self.server_name:
            return (("grpc.ssl_target_name_override", self.server_name),)
        return ()

    def aio_channel(self, target: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
        """A grpc.aio channel to ``target``: secure when TLS is on, else insecure."""
        import grpc.aio

        opts = (*options, *self.options())
        if self.enabled:
            return grpc.aio.secure_channel(target, self.channel_credentials(), options=opts)
        return grpc.aio.insecure_channel(target, options=opts)

    def channel(self, target: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
        """A blocking channel to ``target``: secure when TLS is on, else insecure."""
        opts = (*options, *self.options())
        if self.enabled:
            return grpc.secure_channel(target, self.channel_credentials(), options=opts)
        return grpc.insecure_channel(target, options=opts)
