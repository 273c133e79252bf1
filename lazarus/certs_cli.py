"""``lazarus certs``: a cluster CA, certificates for every identity, and what one grants.

Thin over :mod:`lazarus.tls` (the ``cryptography`` library). Heavy imports
happen inside the commands so ``lazarus --help`` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

import typer

certs_app = typer.Typer(
    help="Make and inspect the cluster's TLS certificates (CA, members, nodes, clients).",
    no_args_is_help=True,
)

DirOption = Annotated[
    Path, typer.Option("--dir", envvar="LAZARUS_CERTS_DIR", help="Where ca.crt / ca.key live.")
]


@certs_app.command("init")
def certs_init(
    cluster: Annotated[str, typer.Option(envvar="LAZARUS_CLUSTER", help="Cluster name.")] = "dev",
    directory: DirOption = Path("./lazarus-certs"),
    valid_days: Annotated[int, typer.Option(min=1, help="CA validity, days.")] = 3650,
) -> None:
    """Create a cluster CA (ca.crt, and ca.key readable by you only). Keep ca.key offline."""
    from lazarus.tls import init_ca

    try:
        files = init_ca(directory, cluster, valid_days=valid_days)
    except FileExistsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"CA certificate {files.cert_file}\nCA key         {files.key_file}")


@certs_app.command("issue")
def certs_issue(
    kind: Annotated[
        Literal["member", "node", "client"],
        typer.Argument(help="member (coordinator replica), node (node agent) or client."),
    ],
    name: Annotated[str, typer.Argument(help="Member id, node id or client name.")],
    cluster: Annotated[str, typer.Option(envvar="LAZARUS_CLUSTER", help="Cluster name.")] = "dev",
    directory: DirOption = Path("./lazarus-certs"),
    out: Annotated[
        Path | None, typer.Option(help="Directory for <kind>-<name>.crt/.key (default: --dir).")
    ] = None,
    role: Annotated[
        Literal["viewer", "operator", "admin"] | None,
        typer.Option(help="A client's role (required for clients)."),
    ] = None,
    host: Annotated[
        list[str] | None,
        typer.Option(help="DNS name or IP the member serves under (repeat)."),
    ] = None,
    valid_days: Annotated[int, typer.Option(help="Validity, days (negative: expired).")] = 365,
) -> None:
    """Issue a certificate naming spiffe://lazarus/<cluster>/<kind>/<name>, signed by the CA."""
    from lazarus.tls import Identity, IdentityKind, issue

    if kind == "client" and role is None:
        raise typer.BadParameter("clients need --role viewer|operator|admin")
    if kind != "client" and role is not None:
        raise typer.BadParameter("only clients have a role")
    if kind == "member" and not host:
        typer.echo("warning: a member certificate without --host verifies for no address", err=True)
    identity = Identity(IdentityKind(kind), cluster, name, role or "")
    files = issue(directory, out or directory, identity, hosts=host or (), valid_days=valid_days)
    typer.echo(f"{identity}\ncertificate {files.cert_file}\nkey         {files.key_file}")


@certs_app.command("show")
def certs_show(
    cert_file: Annotated[Path, typer.Argument(help="A PEM certificate.")],
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show what a certificate grants: identity, role, permitted calls, hosts, validity."""
    from lazarus.tls import CertificateError, describe

    try:
        info = describe(cert_file.read_bytes())
    except (OSError, CertificateError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    if json_output:
        typer.echo(json.dumps(info, indent=2))
        return
    for key, value in info.items():
        shown = ", ".join(value) if isinstance(value, list) else value
        typer.echo(f"{key:<11} {shown}")


@certs_app.command("token")
def certs_token(
    name: Annotated[str, typer.Argument(help="Client name.")],
    role: Annotated[Literal["viewer", "operator", "admin"], typer.Option(help="Its role.")],
) -> None:
    """Make a bearer token: print it once, and the line for --auth-token-file."""
    import hashlib
    import secrets

    token = secrets.token_urlsafe(32)
    digest = hashlib.sha256(token.encode()).hexdigest()
    typer.echo(f"token (give it to the client, as LAZARUS_TOKEN): {token}")
    typer.echo(f"line for --auth-token-file: sha256:{digest} {name} {role}")
