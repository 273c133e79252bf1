"""The authorization policy, as a table; identities from certificates; token files."""

from __future__ import annotations

import datetime
import hashlib
from pathlib import Path

import pytest

from coordinator.auth import TokenFile
from coordinator.authz import Verdict, authorize, grants, may_claim_node
from lazarus.tls import (
    CertificateError,
    ClientTls,
    Identity,
    IdentityKind,
    ServerTls,
    describe,
    identity_from_pem,
    init_ca,
    issue,
    parse_spiffe,
)

C = "prod"
NODE_W0 = Identity(IdentityKind.NODE, C, "w0")
MEMBER = Identity(IdentityKind.MEMBER, C, "c0")
VIEWER = Identity(IdentityKind.CLIENT, C, "dash", "viewer")
OPERATOR = Identity(IdentityKind.CLIENT, C, "ops", "operator")
ADMIN = Identity(IdentityKind.CLIENT, C, "root", "admin")
OTHER_CLUSTER = Identity(IdentityKind.CLIENT, "staging", "root", "admin")

A, R, U, D = (
    Verdict.ALLOW,
    Verdict.ALLOW_REDACTED,
    Verdict.UNAUTHENTICATED,
    Verdict.PERMISSION_DENIED,
)
CS = "/lazarus.v1.CoordinatorService/"
SESSION = "/lazarus.v1.AgentService/Session"
FORWARD = "/lazarus.v1.ReplicaService/Forward"
HEALTH = "/grpc.health.v1.Health/Check"
REFLECT = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"

#  method                      none  node  member viewer operator admin  other-cluster
TABLE = [
    (HEALTH,                    A,    A,    A,     A,     A,       A,     A),
    (REFLECT,                   A,    A,    A,     A,     A,       A,     A),
    (SESSION,                   U,    A,    D,     D,     D,       D,     D),
    (FORWARD,                   U,    D,    A,     D,     D,       D,     D),
    (CS + "GetTask",            U,    D,    A,     R,     A,       A,     D),
    (CS + "ListTasks",          U,    D,    A,     R,     A,       A,     D),
    (CS + "ListNodes",          U,    D,    A,     A,     A,       A,     D),
    (CS + "GetClusterStatus",   U,    D,    A,     A,     A,       A,     D),
    (CS + "WatchEvents",        U,    D,    A,     A,     A,       A,     D),
    (CS + "SubmitTask",         U,    D,    A,     D,     A,       A,     D),
    (CS + "CancelTask",         U,    D,    A,     D,     A,       A,     D),
    (CS + "DrainNode",          U,    D,    A,     D,     A,       A,     D),
    (CS + "UncordonNode",       U,    D,    A,     D,     A,       A,     D),
    (CS + "MigrateTask",        U,    D,    A,     D,     A,       A,     D),
    (CS + "ForkTask",           U,    D,    A,     D,     A,       A,     D),
    (CS + "GetCheckpoint",      U,    D,    A,     D,     A,       A,     D),
    (CS + "SomeFutureAdminRpc", U,    D,    A,     D,     D,       A,     D),
    ("/evil.Service/Do",        U,    D,    D,     D,     D,       D,     D),
]  # fmt: skip
WHO = [None, NODE_W0, MEMBER, VIEWER, OPERATOR, ADMIN, OTHER_CLUSTER]


@pytest.mark.parametrize(("method", "verdicts"), [(row[0], row[1:]) for row in TABLE])
def test_policy_table(method: str, verdicts: tuple[Verdict, ...]) -> None:
    got = tuple(authorize(who, method, cluster=C).verdict for who in WHO)
    assert got == verdicts, method


def test_reflection_can_be_switched_off_health_cannot() -> None:
    assert authorize(ADMIN, REFLECT, cluster=C, reflection=False).verdict is D
    assert authorize(None, HEALTH, cluster=C, reflection=False).verdict is A


def test_a_node_may_claim_only_its_own_id() -> None:
    assert may_claim_node(NODE_W0, "w0").allowed
    refused = may_claim_node(Identity(IdentityKind.NODE, C, "w1"), "w0")
    assert refused.verdict is D
    assert "w0" in refused.reason
    assert not may_claim_node(ADMIN, "w0").allowed
    assert not may_claim_node(None, "w0").allowed


def test_spiffe_scheme() -> None:
    assert parse_spiffe("spiffe://lazarus/prod/node/w-0.a") == Identity(
        IdentityKind.NODE, "prod", "w-0.a"
    )
    assert parse_spiffe("spiffe://lazarus/prod/client/x", "operator").role == "operator"
    for bad, role in [
        ("spiffe://other/prod/node/w0", ""),
        ("spiffe://lazarus/prod/node", ""),
        ("spiffe://lazarus/prod/pod/w0", ""),
        ("spiffe://lazarus/prod/client/x", "root"),  # not a role
        ("spiffe://lazarus/prod/node/w0/extra", ""),
    ]:
        with pytest.raises(CertificateError):
            parse_spiffe(bad, role)


def test_issued_certificates_name_their_identity(tmp_path: Path) -> None:
    init_ca(tmp_path, C)
    with pytest.raises(FileExistsError):
        init_ca(tmp_path, C)
    for identity in (NODE_W0, MEMBER, VIEWER):
        files = issue(tmp_path, tmp_path, identity, hosts=["127.0.0.1", "c0.lazarus"])
        assert identity_from_pem(files.cert_file.read_bytes()) == identity
        assert oct(files.key_file.stat().st_mode & 0o777) == "0o600"
    shown = describe((tmp_path / "client-dash.crt").read_bytes())
    assert shown["role"] == "viewer"
    assert "without payload bytes" in shown["grants"]
    assert "127.0.0.1" in shown["hosts"]
    assert describe((tmp_path / "ca.crt").read_bytes())["grants"].startswith(
        "certificate authority"
    )
    expired = issue(tmp_path, tmp_path, VIEWER, valid_days=-1, basename="old")
    shown = describe(expired.cert_file.read_bytes())
    assert datetime.datetime.fromisoformat(shown["not_after"]) < datetime.datetime.now(datetime.UTC)
    assert grants(NODE_W0) == "AgentService.Session as node 'w0' only"


def test_server_tls_reloads_only_when_files_change(tmp_path: Path) -> None:
    init_ca(tmp_path, C)
    files = issue(tmp_path, tmp_path, MEMBER, hosts=["127.0.0.1"])
    tls = ServerTls(str(files.cert_file), str(files.key_file), str(tmp_path / "ca.crt"))
    tls.credentials()
    assert tls._fetch() is None  # unchanged: nothing re-read
    issue(tmp_path, tmp_path, MEMBER, hosts=["127.0.0.1"])  # rotated in place
    assert tls._fetch() is not None
    assert tls.reloads == 1
    assert tls._fetch() is None
    files.key_file.unlink()  # half a rotation: keep serving the old pair
    files.key_file.write_text("not a key")
    assert tls._fetch() is None


def test_token_file_is_hashed_and_reloaded(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    digest = hashlib.sha256(b"s3cret").hexdigest()
    path.write_text(f"sha256:{digest} dash viewer\nbroken line\n")
    tokens = TokenFile(str(path), C)
    assert tokens.lookup("s3cret") == Identity(IdentityKind.CLIENT, C, "dash", "viewer")
    assert tokens.lookup("guess") is None
    path.write_text(f"sha256:{digest} dash operator  # promoted\n")
    assert tokens.lookup("s3cret") == Identity(IdentityKind.CLIENT, C, "dash", "operator")
    path.unlink()
    assert tokens.lookup("s3cret") is None


def test_client_tls_from_env_round_trips() -> None:
    tls = ClientTls("ca.crt", "me.crt", "me.key", "coordinator.lazarus", "tok")
    assert ClientTls.from_env(tls.env()) == tls
    assert not ClientTls.from_env({}).enabled
    with pytest.raises(ValueError, match="both"):
        ClientTls("ca.crt", "me.crt")


def test_certs_cli_init_issue_show_token(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from lazarus.cli import app

    runner = CliRunner()
    certs = ["--dir", str(tmp_path), "--cluster", C]
    assert runner.invoke(app, ["certs", "init", *certs]).exit_code == 0
    again = runner.invoke(app, ["certs", "init", *certs])
    assert again.exit_code == 1
    assert "exists" in again.output
    no_role = runner.invoke(app, ["certs", "issue", "client", "ci", *certs])
    assert no_role.exit_code == 2
    issued = runner.invoke(app, ["certs", "issue", "client", "ci", "--role", "operator", *certs])
    assert issued.exit_code == 0, issued.output
    shown = runner.invoke(app, ["certs", "show", str(tmp_path / "client-ci.crt"), "--json"])
    assert shown.exit_code == 0, shown.output
    assert '"role": "operator"' in shown.output
    assert "with payload bytes" in shown.output
    token = runner.invoke(app, ["certs", "token", "dash", "--role", "viewer"])
    assert token.exit_code == 0
    assert " dash viewer" in token.output
