"""Who may call what: the pure authorization policy of every coordinator RPC.

Theory of operation: :func:`authorize` takes an identity (or None: the peer
proved none) and a full gRPC method name and returns a :class:`Decision` —
allow, allow with payload bytes redacted, or refuse with the status to send.
:func:`may_claim_node` says whether a Session's Hello may name a node id. No
IO, no grpc: :mod:`coordinator.auth` is the interceptor that asks these and
carries the answer out. The whole policy is the table ``_METHOD_ROLE``:

=========================  ============================================
who                        may call
=========================  ============================================
anyone (no identity)       Health, reflection (probes, grpcurl)
node ``<id>``              AgentService.Session, saying Hello as ``<id>`` only
member (a replica)         CoordinatorService, all of it (it proxies calls it
                           has already authorized; it has no Session), and
                           ReplicaService (Forward: the Sessions a follower
                           holds, carried to the leader; fan-in, issue 20)
client ``viewer``          GetTask / ListTasks (payload and result bytes
                           removed), ListNodes, GetClusterStatus, WatchEvents
client ``operator``        viewer + SubmitTask, CancelTask, DrainNode,
                           UncordonNode, MigrateTask, ForkTask,
                           GetCheckpoint, and payload bytes
client ``admin``           everything a client may call
=========================  ============================================

Nodes cannot call CoordinatorService; clients and members cannot open a Session;
only members may call ReplicaService.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from lazarus.tls import ROLES, Identity, IdentityKind

__all__ = [
    "OPEN_SERVICES",
    "Decision",
    "Verdict",
    "authorize",
    "grants",
    "may_claim_node",
]

COORDINATOR_SERVICE = "lazarus.v1.CoordinatorService"
AGENT_SERVICE = "lazarus.v1.AgentService"
REPLICA_SERVICE = "lazarus.v1.ReplicaService"
OPEN_SERVICES = frozenset(
    {
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        "grpc.reflection.v1.ServerReflection",
    }
)
"""Services anyone may call (probes and discovery)."""

_METHOD_ROLE: dict[str, str] = {
    "GetTask": "viewer",
    "ListTasks": "viewer",
    "ListNodes": "viewer",
    "GetClusterStatus": "viewer",
    "WatchEvents": "viewer",
    "SubmitTask": "operator",
    "CancelTask": "operator",
    "DrainNode": "operator",
    "UncordonNode": "operator",
    "MigrateTask": "operator",
    "ForkTask": "operator",
    "GetCheckpoint": "operator",
}
"""The least role that may call each CoordinatorService method (unlisted: admin)."""

_PAYLOAD_ROLE = "operator"
"""The least role that sees payload and result bytes."""


class Verdict(enum.Enum):
    """What the interceptor does with a call."""

    ALLOW = "allow"
    ALLOW_REDACTED = "allow-redacted"  # answer, with payload and result bytes removed
    UNAUTHENTICATED = "unauthenticated"
    PERMISSION_DENIED = "permission-denied"


@dataclass(frozen=True, slots=True)
class Decision:
    """The policy's answer for one call.

    Attributes:
        verdict: allow, allow redacted, or which refusal.
        reason: why, for the refusal's status message and the log.
    """

    verdict: Verdict
    reason: str = ""

    @property
    def allowed(self) -> bool:
        """True when the call may proceed (redacted or not)."""
        return self.verdict in (Verdict.ALLOW, Verdict.ALLOW_REDACTED)


_ALLOW = Decision(Verdict.ALLOW)


def _rank(role: str) -> int:
    return ROLES.index(role) if role in ROLES else -1


def authorize(
    identity: Identity | None, method: str, *, cluster: str, reflection: bool = True
) -> Decision:
    """Decide one call.

    Args:
        identity: the peer's identity; None when it presented no valid one.
        method: the full method, ``/package.Service/Method``.
        cluster: this coordinator's cluster; identities of others are refused.
        reflection: whether server reflection is open (False: nobody may call it).

    Returns:
        The decision; refusals map to UNAUTHENTICATED or PERMISSION_DENIED.
    """
    service, _, name = method.lstrip("/").partition("/")
    if service in OPEN_SERVICES:
        if "Reflection" in service and not reflection:
            return Decision(Verdict.PERMISSION_DENIED, "server reflection is switched off")
        return _ALLOW
    if identity is None:
        return Decision(
            Verdict.UNAUTHENTICATED,
            "no identity: present a certificate signed by the cluster CA, or a bearer token",
        )
    if identity.cluster != cluster:
        return Decision(
            Verdict.PERMISSION_DENIED,
            f"{identity.uri} belongs to cluster {identity.cluster!r}, not {cluster!r}",
        )
    if service == AGENT_SERVICE:
        if identity.kind is IdentityKind.NODE:
            return _ALLOW  # which node it may claim: may_claim_node, on its Hello
        return Decision(
            Verdict.PERMISSION_DENIED, f"{identity.uri} is not a node; only nodes open Sessions"
        )
    if service == REPLICA_SERVICE:
        if identity.kind is IdentityKind.MEMBER:
            return _ALLOW
        return Decision(
            Verdict.PERMISSION_DENIED,
            f"{identity.uri} is not a coordinator replica; only members may call {service}",
        )
    if service == COORDINATOR_SERVICE:
        if identity.kind is IdentityKind.MEMBER:
            return _ALLOW
        if identity.kind is IdentityKind.NODE:
            return Decision(
                Verdict.PERMISSION_DENIED, f"{identity.uri} is a node; nodes cannot call {service}"
            )
        need = _METHOD_ROLE.get(name, "admin")
        if _rank(identity.role) < _rank(need):
            return Decision(
                Verdict.PERMISSION_DENIED,
                f"{name} needs role {need}; {identity.uri} has role {identity.role or 'none'}",
            )
        if name in ("GetTask", "ListTasks") and _rank(identity.role) < _rank(_PAYLOAD_ROLE):
            return Decision(Verdict.ALLOW_REDACTED, "payload and result bytes need role operator")
        return _ALLOW
    return Decision(Verdict.PERMISSION_DENIED, f"unknown service {service!r}")


def may_claim_node(identity: Identity | None, node_id: str) -> Decision:
    """May a Session whose peer is ``identity`` say Hello as ``node_id``?

    Returns:
        ALLOW only for the node identity naming ``node_id``; else PERMISSION_DENIED.
    """
    if identity is not None and identity.kind is IdentityKind.NODE and identity.name == node_id:
        return _ALLOW
    who = identity.uri if identity is not None else "an unauthenticated peer"
    return Decision(Verdict.PERMISSION_DENIED, f"{who} may not open a Session as node {node_id!r}")


def grants(identity: Identity) -> str:
    """What ``identity`` may do, in words (``lazarus certs show``)."""
    if identity.kind is IdentityKind.NODE:
        return f"AgentService.Session as node {identity.name!r} only"
    if identity.kind is IdentityKind.MEMBER:
        return (
            "serve as a coordinator replica; proxy CoordinatorService calls and forward "
            "Sessions (ReplicaService) to the leader"
        )
    allowed = sorted(m for m, r in _METHOD_ROLE.items() if _rank(identity.role) >= _rank(r))
    if identity.role == "admin":
        allowed.append("(and every later admin method)")
    payloads = "with" if _rank(identity.role) >= _rank(_PAYLOAD_ROLE) else "without"
    return f"CoordinatorService {', '.join(allowed)} ({payloads} payload bytes)"
