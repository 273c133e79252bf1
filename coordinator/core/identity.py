"""Who may speak for a node id: the incarnation rules of DESIGN.md §4.

Theory of operation: ownership of a task is (node id, incarnation). A node id
is a name an operator chooses (the pod name); an incarnation is one process
start of the agent, identified by a public id and proven by a random secret
whose SHA-256 the leader keeps (Nomad's node SecretID is the model). When a
Hello arrives for a node id that is registered already, :func:`judge_claim`
decides, from facts the core holds, what the claim is:

==================  =======================================================
``NEW_NODE``        no record: register it.
``SAME_INCARNATION`` the registered incarnation with its secret: a Session
                    blip of the same process; its tasks re-attach at the
                    same epoch.
``RESTART_PROVEN``  another incarnation that opened the same local store
                    (same store id) and found the registered incarnation as
                    the store lock's previous holder: on one host that proves
                    the old process is gone. Its tasks move to the new
                    incarnation at once, at epoch + 1.
``HOLDER_GONE``     another incarnation while the registered one is DEAD or
                    LEFT (stopped by its own fence, DESIGN.md §6): admit; any
                    task it still owns moves at epoch + 1.
``CONFLICT``        another incarnation while the registered one has a
                    Session or was heard within ``dead_after``: refused
                    (FAILED_PRECONDITION); the holder is not disturbed.
``IMPOSTOR``        the registered incarnation's public id without its
                    secret while that incarnation is live: refused
                    (FAILED_PRECONDITION). A process that restarts always
                    picks a new incarnation, so only a confused or hostile
                    one reuses an id; once the holder is DEAD or LEFT such a
                    claim is treated as a new incarnation (``HOLDER_GONE``).
==================  =======================================================

Nothing here reads a clock: ``now_s`` and the last-heard time are passed in.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from coordinator.core.records import NodeRecord, NodeState

__all__ = ["Claim", "ClaimKind", "ClaimVerdict", "judge_claim"]


class ClaimKind(enum.Enum):
    """What a Hello for an already registered node id is."""

    NEW_NODE = "new node"
    SAME_INCARNATION = "same incarnation"
    RESTART_PROVEN = "restart in place proven by the local store"
    HOLDER_GONE = "previous incarnation is DEAD or LEFT"
    CONFLICT = "another live incarnation holds the node id"
    IMPOSTOR = "incarnation id reused without its secret"

    @property
    def admitted(self) -> bool:
        """True when the Hello is accepted."""
        return self not in (ClaimKind.CONFLICT, ClaimKind.IMPOSTOR)

    @property
    def takes_over(self) -> bool:
        """True when the claimant replaces a previous incarnation (its tasks move, epoch + 1)."""
        return self in (ClaimKind.RESTART_PROVEN, ClaimKind.HOLDER_GONE)


@dataclass(frozen=True, slots=True)
class Claim:
    """The identity part of a Hello.

    Attributes:
        incarnation: the claimant's public incarnation id.
        secret_sha256: SHA-256 of its secret (32 bytes; empty when it sent none).
        store_id: id of the local store it opened ("" when unknown).
        store_previous_incarnation: the store lock's previous holder ("" for a new store).
    """

    incarnation: str
    secret_sha256: bytes = b""
    store_id: str = ""
    store_previous_incarnation: str = ""


@dataclass(frozen=True, slots=True)
class ClaimVerdict:
    """The decision on a claim.

    Attributes:
        kind: the rule that applied.
        heard_ago_s: seconds since the holder was last heard (None when never).
        message: for the refused agent and the operator; empty when admitted.
    """

    kind: ClaimKind
    heard_ago_s: float | None = None
    message: str = ""


def judge_claim(
    record: NodeRecord | None,
    claim: Claim,
    *,
    connected: bool,
    last_heard_s: float | None,
    now_s: float,
    dead_after_s: float,
) -> ClaimVerdict:
    """Decide a Hello's claim on a node id (the table in this module's docstring).

    Args:
        record: the registered node, or None.
        claim: the Hello's identity.
        connected: the registered incarnation has a Session open.
        last_heard_s: when it was last heard (a heartbeat or Hello; a new
            leader counts its own election time), or None.
        now_s: the current time, seconds.
        dead_after_s: the silence after which a node is DEAD, seconds.

    Returns:
        The verdict. Refusals map to gRPC FAILED_PRECONDITION at the shell.
    """
    if record is None:
        return ClaimVerdict(ClaimKind.NEW_NODE)
    node_id, holder = record.node_id, record.incarnation
    heard_ago = None if last_heard_s is None else max(0.0, now_s - last_heard_s)
    gone = record.state in (NodeState.DEAD, NodeState.LEFT)
    if claim.incarnation == holder:
        known = record.incarnation_secret_sha256
        if not known or claim.secret_sha256 == known:
            return ClaimVerdict(ClaimKind.SAME_INCARNATION, heard_ago)
        # Without its secret the claim is another incarnation that reuses the id.
        if gone:
            return ClaimVerdict(ClaimKind.HOLDER_GONE, heard_ago)
        return ClaimVerdict(
            ClaimKind.IMPOSTOR,
            heard_ago,
            f"node id {node_id} incarnation {holder} is registered with another secret; "
            "a new process must use a new incarnation",
        )
    if gone:
        return ClaimVerdict(ClaimKind.HOLDER_GONE, heard_ago)
    if (
        claim.store_id
        and claim.store_id == record.store_id
        and claim.store_previous_incarnation == holder
    ):
        return ClaimVerdict(ClaimKind.RESTART_PROVEN, heard_ago)
    heard = "never heard" if heard_ago is None else f"last heard {heard_ago:.1f} s ago"
    session = "Session open, " if connected else ""
    wait = "" if connected else f"; retry after {max(0.0, dead_after_s - (heard_ago or 0.0)):.1f} s"
    return ClaimVerdict(
        ClaimKind.CONFLICT,
        heard_ago,
        f"node id {node_id} is held by another live process (incarnation {holder}, "
        f"{session}{heard}); is --node-id unique?{wait}",
    )
