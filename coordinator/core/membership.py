"""Membership: the leader's table of node agents and their liveness state machine.

Theory of operation: each node is ALIVE, SUSPECT, DEAD, DRAINING or LEFT.
What moves a node between them is a ``NodeTrigger`` (a Session opened, a
heartbeat, the stream closed, the detector's verdict, a cordon, a Goodbye), and
every legal move is one row of ``NODE_TRANSITIONS``, as h11 keeps its
transitions in one table. One overlay rule joins liveness and the cordon: a
live node is DRAINING while cordoned and ALIVE otherwise; a SUSPECT or DEAD
node keeps its cordon flag and returns to DRAINING when it recovers.

::

               SESSION_OPENED / HEARTBEAT
            +-----------------------------+
            v                             |
        ALIVE ---STREAM_CLOSED/SUSPECTED--> SUSPECT --DECLARED_DEAD--> DEAD
        (DRAINING when cordoned)            |                        |
            |  ^-------SESSION_OPENED-------+------------------------+
            +--LEFT (Goodbye)--> LEFT --SESSION_OPENED (new incarnation)--> ALIVE

A pair missing from the table is a bug in the caller (the core filters peer
input before it gets here) and raises ``InvariantViolation``.

``NodeEntry`` holds what only the leader's memory knows about a node: the
current Session, the last heartbeat seq, the reported load, and when it turned
DEAD. The stored part is the immutable ``NodeRecord`` it carries.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from coordinator.core.errors import InvariantViolation
from coordinator.core.records import NodeLoad, NodeRecord, NodeState

__all__ = ["NODE_TRANSITIONS", "NodeEntry", "NodeTrigger", "next_node_state"]


class NodeTrigger(enum.Enum):
    """What can move a node between states."""

    SESSION_OPENED = "session_opened"
    HEARTBEAT = "heartbeat"
    STREAM_CLOSED = "stream_closed"
    SUSPECTED = "suspected"
    DECLARED_DEAD = "declared_dead"
    CORDONED = "cordoned"
    UNCORDONED = "uncordoned"
    LEFT = "left"


_A, _S, _D, _R, _L = (
    NodeState.ALIVE,
    NodeState.SUSPECT,
    NodeState.DEAD,
    NodeState.DRAINING,
    NodeState.LEFT,
)
_T = NodeTrigger

NODE_TRANSITIONS: dict[tuple[NodeState, NodeTrigger], NodeState] = {
    # A live node (ALIVE, or DRAINING while cordoned).
    (_A, _T.SESSION_OPENED): _A,
    (_A, _T.HEARTBEAT): _A,
    (_A, _T.STREAM_CLOSED): _S,
    (_A, _T.SUSPECTED): _S,
    (_A, _T.DECLARED_DEAD): _D,
    (_A, _T.CORDONED): _A,
    (_A, _T.UNCORDONED): _A,
    (_A, _T.LEFT): _L,
    (_R, _T.SESSION_OPENED): _A,
    (_R, _T.HEARTBEAT): _A,
    (_R, _T.STREAM_CLOSED): _S,
    (_R, _T.SUSPECTED): _S,
    (_R, _T.DECLARED_DEAD): _D,
    (_R, _T.CORDONED): _A,
    (_R, _T.UNCORDONED): _A,
    (_R, _T.LEFT): _L,
    # Suspected: its tasks stay where they are.
    (_S, _T.SESSION_OPENED): _A,
    (_S, _T.HEARTBEAT): _A,
    (_S, _T.STREAM_CLOSED): _S,
    (_S, _T.SUSPECTED): _S,
    (_S, _T.DECLARED_DEAD): _D,
    (_S, _T.CORDONED): _S,
    (_S, _T.UNCORDONED): _S,
    (_S, _T.LEFT): _L,
    # Dead: only a new Session (Hello) brings it back; its old Session was closed.
    (_D, _T.SESSION_OPENED): _A,
    (_D, _T.DECLARED_DEAD): _D,
    (_D, _T.CORDONED): _D,
    (_D, _T.UNCORDONED): _D,
    # Left: back only under a new incarnation; a cordon can still be lifted.
    (_L, _T.SESSION_OPENED): _A,
    (_L, _T.LEFT): _L,
    (_L, _T.CORDONED): _L,
    (_L, _T.UNCORDONED): _L,
}


def next_node_state(state: NodeState, trigger: NodeTrigger, cordoned: bool) -> NodeState:
    """Look up the next state in ``NODE_TRANSITIONS`` and apply the cordon overlay.

    Args:
        state: the node's current state.
        trigger: what happened.
        cordoned: the node's cordon flag after the trigger.

    Returns:
        The new state (ALIVE becomes DRAINING when cordoned).

    Raises:
        InvariantViolation: the table has no row for (state, trigger).
    """
    try:
        target = NODE_TRANSITIONS[(state, trigger)]
    except KeyError:
        raise InvariantViolation(
            f"no node transition from {state.name} on {trigger.name}"
        ) from None
    if target is NodeState.ALIVE and cordoned:
        return NodeState.DRAINING
    return target


_NO_LOAD = NodeLoad()


@dataclass(slots=True)
class NodeEntry:
    """The leader's live view of one node: its stored record plus memory-only figures.

    Attributes:
        record: the record as last written (or to be written this step).
        session_id: id of the current Session; "" when none is open.
        last_seq: last heartbeat seq of the current Session (0 before any).
        load: load reported by the last heartbeat.
        dead_since_s: when it was declared DEAD (None unless DEAD).
        unavailable_since_s: when it stopped being ALIVE / DRAINING (None while live).
        revoked: (task_id, epoch) pairs already revoked on the current Session:
            a heartbeat still listing one is not answered with another Revoke.
        revoked_held: the part of ``revoked`` this Session showed the node
            holding (its own report of the pair, or a heartbeat listing it); see
            ``prune_revoked`` for when a pair is forgotten.
    """

    record: NodeRecord
    session_id: str = ""
    last_seq: int = 0
    load: NodeLoad = _NO_LOAD
    dead_since_s: float | None = None
    unavailable_since_s: float | None = None
    revoked: set[tuple[str, int]] = field(default_factory=set)
    revoked_held: set[tuple[str, int]] = field(default_factory=set)

    @property
    def node_id(self) -> str:
        """The node's id."""
        return self.record.node_id

    @property
    def state(self) -> NodeState:
        """The node's state."""
        return self.record.state

    @property
    def connected(self) -> bool:
        """True while a Session is open."""
        return bool(self.session_id)

    def new_session(self) -> None:
        """A Session opened: nothing is revoked on it yet (a Hello re-lists what it holds)."""
        self.revoked = set()
        self.revoked_held = set()

    def note_revoked(self, key: tuple[str, int], *, held: bool) -> None:
        """A Revoke of ``key`` (task_id, epoch) was sent on the current Session.

        Args:
            key: the revoked task id and epoch.
            held: the node itself reported the pair on this Session (in its
                Hello, a heartbeat or a task update), so it has had the task at
                that epoch; False when the Revoke may overtake the Assign's
                arrival (a cancel, a deadline, a release timeout of its task).
        """
        self.revoked.add(key)
        if held:
            self.revoked_held.add(key)

    def prune_revoked(self, listed: set[tuple[str, int]]) -> None:
        """A heartbeat listed ``listed``: forget the revoked pairs it shows stopped.

        A pair this Session showed the node holding and that a later heartbeat
        no longer lists has stopped for good: on one Session an agent lists a
        (task, epoch) only while it runs or stops it, and starts that pair
        again only on an Assign of the same epoch, which the leader sends on a
        new Session only (re-attach after a Hello). So no heartbeat of this
        Session lists it again, and the skip check has nothing left to skip.
        A pair never seen held stays (the node may not have had the Assign
        yet when it sent this heartbeat); it is listed later, or the core
        forgets it when the task is retired (``forget_revoked``).

        Args:
            listed: the (task_id, epoch) pairs of the heartbeat.
        """
        held = self.revoked_held
        stopped = [key for key in held if key not in listed]
        for key in stopped:
            held.discard(key)
            self.revoked.discard(key)
        for key in listed:
            if key in self.revoked:
                held.add(key)

    def forget_revoked(self, key: tuple[str, int]) -> None:
        """Forget one revoked pair (its task was retired; a node still listing it
        is then revoked as running an unknown task)."""
        self.revoked.discard(key)
        self.revoked_held.discard(key)
