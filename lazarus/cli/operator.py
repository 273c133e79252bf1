"""Operator commands: status, nodes, tasks, task, submit, cancel, drain, uncordon, migrate, watch.

Thin shells over ``lazarus.client.Client`` (see the comment below for exit codes).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, TypeVar

import typer

from lazarus.cli._app import app

# ---------------------------------------------------------------- operator commands
#
# status, nodes, tasks, task, submit, cancel, drain, uncordon, migrate, watch:
# thin shells over ``lazarus.client.Client``. Each takes --coordinators (any
# replica answers) and --json; people get rich tables on stdout, errors on
# stderr with what to do next. Exit status: 0 done, 1 the coordinator refused
# the request, 2 bad usage, 3 no coordinator could answer.

CoordinatorsOption = Annotated[
    str,
    typer.Option(
        "--coordinators",
        envvar="LAZARUS_COORDINATORS",
        help="Coordinator addresses host:port, comma-separated; any replica answers.",
    ),
]
JsonOption = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print one JSON document for scripts (proto3 JSON mapping, defaults included).",
    ),
]
DEFAULT_COORDINATORS = "127.0.0.1:7070"
_R = TypeVar("_R")
OPERATOR_TIMEOUT_S = 5.0
"""Deadline of each call an operator command makes, seconds."""
OPERATOR_RETRY_S = 4.0
"""How long an operator command keeps retrying unreachable coordinators, seconds."""
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
_STATE_STYLES = {
    "RUNNING": "green",
    "ASSIGNED": "cyan",
    "PENDING": "yellow",
    "COMPLETED": "blue",
    "FAILED": "red",
    "CANCELLED": "dim",
    "ALIVE": "green",
    "SUSPECT": "yellow",
    "DEAD": "red",
    "DRAINING": "magenta",
    "LEFT": "dim",
}


def make_operator_client(addresses: str) -> Any:
    """The ``lazarus.client.Client`` operator commands use (unit tests swap in a fake).

    Raises:
        ValueError: a malformed address list.
    """
    from lazarus.client import Client

    return Client(addresses, timeout_s=OPERATOR_TIMEOUT_S, retry_max_s=OPERATOR_RETRY_S)


def _console(*, stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=False)


def _fail(json_output: bool, error: dict[str, str], headline: str, exit_code: int) -> NoReturn:
    """Report a failed call (JSON document on stdout, or text on stderr) and exit."""
    import json

    if json_output:
        typer.echo(json.dumps({"error": error}, indent=2))
    else:
        err = _console(stderr=True)
        err.print(f"[red]error[/]: {escape_markup(headline)}")
        if headline == error["hint"]:  # unreachable: the advice first, the cause after
            detail = f"({error['code']}: {error['message']})"
        else:
            detail = error["hint"]
        if detail:
            err.print(f"  {escape_markup(detail)}")
    raise typer.Exit(exit_code)


def escape_markup(text: str) -> str:
    """``text`` with rich markup escaped."""
    from rich.markup import escape

    return escape(text)


def _hint(exc: Any, coordinators: str, not_found: str) -> tuple[str, str, int]:
    """(headline for people, what to do, exit status) for a LazarusError."""
    from lazarus.client import DeadlineExceeded, Unavailable

    where = coordinators or "(none given)"
    plain = f"{exc.code.name}: {exc.message}"
    if isinstance(exc, Unavailable):
        if not exc.answered:
            hint = (
                f"no coordinator answered at {where} — is `lazarus coordinator` running? "
                "set --coordinators (or LAZARUS_COORDINATORS) to its host:port list"
            )
            return hint, hint, EXIT_UNREACHABLE
        hint = (
            f"the coordinators at {where} answered but could not serve the call — is a leader "
            "elected and etcd reachable? see `lazarus status` and the coordinator logs"
        )
        return hint, hint, EXIT_UNREACHABLE
    if isinstance(exc, DeadlineExceeded):
        hint = (
            f"no answer in time from {where}; a write may still have been applied — check "
            "with `lazarus task <id>` / `lazarus nodes` before repeating it"
        )
        return hint, hint, EXIT_UNREACHABLE
    name = exc.code.name
    if name == "INVALID_ARGUMENT":
        return plain, f"fix {exc.field or 'the request'} and try again", EXIT_REFUSED
    if name == "NOT_FOUND":
        return plain, not_found, EXIT_REFUSED
    if name == "UNIMPLEMENTED":
        return plain, "the coordinators do not serve this call yet; upgrade them", EXIT_REFUSED
    return plain, "", EXIT_REFUSED


def _run_operator(
    coordinators: str,
    json_output: bool,
    work: Callable[[Any], Awaitable[_R]],
    *,
    not_found: str = "",
) -> _R:
    """Run ``work(client)`` on a fresh client; turn a LazarusError into a message and exit code."""
    import asyncio

    from lazarus.client import LazarusError

    try:
        client = make_operator_client(coordinators)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--coordinators") from exc

    async def session() -> _R:
        async with client:
            return await work(client)

    try:
        return asyncio.run(session())
    except LazarusError as exc:
        headline, hint, exit_code = _hint(exc, coordinators, not_found)
        error = {"code": exc.code.name, "message": exc.message, "hint": hint}
        if exc.field:
            error["field"] = exc.field
        _fail(json_output, error, headline, exit_code)


def _as_json(message: Any) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    doc: dict[str, Any] = MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return doc


def _print_json(doc: Any) -> None:
    import json

    typer.echo(json.dumps(doc, indent=2))


def _enum_name(enum: Any, value: int, prefix: str) -> str:
    try:
        return str(enum.Name(value)).removeprefix(prefix)
    except ValueError:
        return str(value)


def _styled(name: str) -> str:
    style = _STATE_STYLES.get(name)
    return f"[{style}]{name}[/]" if style else name


def _task_state(value: int) -> str:
    from lazarus.v1 import records_pb2

    return _enum_name(records_pb2.TaskState, value, "TASK_STATE_")


def _node_state(value: int) -> str:
    from lazarus.v1 import records_pb2

    return _enum_name(records_pb2.NodeState, value, "NODE_STATE_")


def _ago(unix_ms: int, now_ms: int | None = None) -> str:
    import time

    if unix_ms <= 0:
        return "—"
    now = int(time.time() * 1000) if now_ms is None else now_ms
    seconds = max(0, now - unix_ms) // 1000
    if seconds < 120:
        return f"{seconds}s ago"
    if seconds < 7200:
        return f"{seconds // 60}m ago"
    if seconds < 172800:
        return f"{seconds // 3600}h ago"
    return f"{seconds // 86400}d ago"


def _utc(unix_ms: int) -> str:
    import datetime

    if unix_ms <= 0:
        return "—"
    moment = datetime.datetime.fromtimestamp(unix_ms / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _pairs(values: list[str] | None, option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{item!r}: want key=value", param_hint=option)
        out[key] = value
    return out


def _split(values: list[str] | None) -> list[str]:
    return [part.strip() for v in values or [] for part in v.split(",") if part.strip()]


def _states(values: list[str] | None, parse: Callable[[str, str], int]) -> list[int]:
    from lazarus.client import InvalidArgument

    out = []
    for value in _split(values):
        try:
            out.append(parse(value, "--state"))
        except InvalidArgument as exc:
            raise typer.BadParameter(exc.message.partition(": ")[2], param_hint="--state") from exc
    return out


@app.command(rich_help_panel="Operator")
def status(
    coordinators: CoordinatorsOption = DEFAULT_COORDINATORS, json_output: JsonOption = False
) -> None:
    """Show the cluster: leader, term, members, and node and task counts by state.

    --json prints the GetClusterStatusResponse (cluster_name, leader_id,
    leader_address, term, members, serving_member_id, nodes_by_state,
    tasks_by_state, mass_failure_guard_active, read_revision, now_unix_ms,
    sessions_by_replica). "sessions" counts the agents' open Sessions per
    replica holding them (with --fan-in followers hold some); only the
    leader knows them.

    Example: lazarus status --coordinators coord-0:7070,coord-1:7070,coord-2:7070
    """
    from rich.table import Table

    reply = _run_operator(coordinators, json_output, lambda c: c.status())
    if json_output:
        _print_json(_as_json(reply))
        return
    out = _console()
    table = Table(title=f"cluster {reply.cluster_name}", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    leader = reply.leader_address or "[red]none known[/]"
    if reply.leader_id:
        leader = f"{reply.leader_id} at {leader}"
    table.add_row("leader", leader)
    table.add_row("term", str(reply.term))
    table.add_row("answered by", reply.serving_member_id or "?")
    nodes = " · ".join(f"{_styled(_node_state(c.state))} {c.count}" for c in reply.nodes_by_state)
    tasks = " · ".join(f"{_styled(_task_state(c.state))} {c.count}" for c in reply.tasks_by_state)
    table.add_row("nodes", nodes or "none")
    table.add_row("tasks", tasks or "none")
    if reply.sessions_by_replica:
        held = sorted(reply.sessions_by_replica.items())
        table.add_row("sessions", " · ".join(f"{member} {count}" for member, count in held))
    guard = "[red]ACTIVE: redistribution stopped[/]" if reply.mass_failure_guard_active else "off"
    table.add_row("mass-failure guard", guard)
    table.add_row("read revision", str(reply.read_revision))
    if reply.members:
        members = ", ".join(f"{m.member_id} ({m.address})" for m in reply.members)
        table.add_row("members", members)
    for q in reply.quarantined:
        table.add_row("[red]quarantined[/]", f"{q.collection}/{q.name}: {q.reason}")
    out.print(table)


@app.command(rich_help_panel="Operator")
def nodes(
    state: Annotated[
        list[str] | None,
        typer.Option(
            "--state",
            help=(
                "Only nodes in this state (alive, suspect, dead, draining, left);"
                " repeat or comma-separate."
            ),
        ),
    ] = None,
    coordinators: CoordinatorsOption = DEFAULT_COORDINATORS,
    json_output: JsonOption = False,
) -> None:
    """List node agents: state, cordon, Session, tasks, load, last heartbeat.

    Liveness (connected, the replica holding the Session, heartbeat, load) is
    known only to the leader: a follower answers with the stored records. With
    fan-in the session column names the follower that holds and forwards the
    node's Session. --json prints
    {"nodes": [NodeInfo, ...]} (each with "record" and, from the leader,
    "liveness").

    Example: lazarus nodes --state alive,draining
    """
    from rich.table import Table

    from lazarus.client import node_state_value

    states = _states(state, node_state_value)
    infos = _run_operator(coordinators, json_output, lambda c: c.nodes(states=states))
    if json_output:
        _print_json({"nodes": [_as_json(i) for i in infos]})
        return
    out = _console()
    table = Table(title=f"{len(infos)} node(s)", title_justify="left")
    for column in (
        "node",
        "state",
        "cordoned",
        "session",
        "tasks",
        "slots used",
        "heartbeat",
        "address",
    ):
        table.add_column(column, justify="right" if column in ("tasks", "slots used") else "left")
    live_known = False
    for info in infos:
        record = info.record
        has = info.HasField("liveness")
        live_known = live_known or has
        live = info.liveness
        table.add_row(
            record.node_id,
            _styled(_node_state(record.state)),
            "[magenta]yes[/]" if record.cordoned else "no",
            (
                (f"open via {live.session_replica}" if live.session_replica else "open")
                if live.connected
                else "[red]closed[/]"
            )
            if has
            else "—",
            str(live.assigned_tasks) if has else "—",
            f"{live.load.used_slots}/{record.capacity.slots}"
            if has
            else f"?/{record.capacity.slots}",
            _ago(live.last_heartbeat_at_unix_ms if has else record.last_heartbeat_at_unix_ms),
            record.address or "—",
        )
    if infos and not live_known:
        table.caption = "a follower answered: liveness figures come only from the leader"
    out.print(table)


@app.command(rich_help_panel="Operator")
def tasks(
    state: Annotated[
        list[str] | None,
        typer.Option(
            "--state",
            help=(
                "Only tasks in this state (pending, assigned, running, completed, failed,"
                " cancelled); repeat or comma-separate."
            ),
        ),
    ] = None,
    node: Annotated[str, typer.Option("--node", help="Only tasks owned by this node.")] = "",
    kind: Annotated[str, typer.Option("--kind", help="Only tasks of this kind.")] = "",
    label: Annotated[
        list[str] | None,
        typer.Option("--label", help="Only tasks with this label key=value; repeatable."),
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", min=0, help="Show at most this many; 0 = all.")
    ] = 50,
    coordinators: CoordinatorsOption = DEFAULT_COORDINATORS,
    json_output: JsonOption = False,
) -> None:
    """List tasks, ordered by id, with state, owner, epoch and checkpoints.

    --json prints {"tasks": [TaskRecord, ...], "count": N, "truncated": bool}
    (truncated: more tasks match than --limit).

    Example: lazarus tasks --state running --node worker-0 --limit 20
    """
    from rich.markup import escape
    from rich.table import Table

    from lazarus.client import task_state_value

    states = _states(state, task_state_value)
    labels = _pairs(label, "--label")
    records = _run_operator(
        coordinators,
        json_output,
        lambda c: c.tasks(
            states=states,
            node_id=node,
            kind=kind,
            labels=labels,
            limit=(limit + 1) if limit else None,
        ),
    )
    truncated = bool(limit) and len(records) > limit
    records = records[:limit] if limit else records
    if json_output:
        _print_json(
            {"tasks": [_as_json(t) for t in records], "count": len(records), "truncated": truncated}
        )
        return
    out = _console()
    table = Table(title=f"{len(records)} task(s)", title_justify="left")
    for column in (
        "task",
        "kind",
        "state",
        "node",
        "epoch",
        "attempt",
        "checkpoint",
        "updated",
        "note",
    ):
        table.add_column(column, justify="right" if column in ("epoch", "attempt") else "left")
    for t in records:
        checkpoint = "—"
        if t.last_checkpoint.seq:
            checkpoint = f"#{t.last_checkpoint.seq}"
            if t.last_replicated_checkpoint.seq != t.last_checkpoint.seq:
                checkpoint += f" (#{t.last_replicated_checkpoint.seq} in Redis)"
        note = ""
        if t.HasField("move"):
            note = f"moving → {t.move.target_node_id or 'any'}"
        elif t.HasField("last_error"):
            note = t.last_error.message.splitlines()[0][:60] if t.last_error.message else ""
        table.add_row(
            t.task_id,
            t.spec.kind,
            _styled(_task_state(t.state)),
            t.owner_node_id or "—",
            str(t.epoch),
            str(t.attempt),
            checkpoint,
            _ago(t.updated_at_unix_ms),
            escape(note),
        )
    if truncated:
        table.caption = "more tasks match: raise --limit (0 = all)"
    out.print(table)


@app.command(rich_help_panel="Operator")
def task(
    task_id: Annotated[str, typer.Argument(help="The task id.")],
    coordinators: CoordinatorsOption = DEFAULT_COORDINATORS,
    json_output: JsonOption = False,
) -> None:
    """Show one task: spec, state, owner, checkpoints, result, last error, move and forks.

    --json prints the GetTaskResponse: {"task": TaskRecord, "forks":
    [ForkRecord, ...], "read_revision": "..."}.

    Example: lazarus task task-3798de419cd70d9f
    """
    from rich.markup import escape
    from rich.table import Table

    from lazarus.v1 import records_pb2

    reply = _run_operator(
        coordinators,
        json_output,
        lambda c: c.get(task_id),
        not_found="list the tasks with `lazarus tasks`",
    )
    if json_output:
        _print_json(_as_json(reply))
        return
    t = reply.task
    out = _console()
    table = Table(title=f"task {t.task_id}", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("kind", t.spec.kind)
    table.add_row("state", _styled(_task_state(t.state)))
    table.add_row("owner", t.owner_node_id or "—")
    table.add_row(
        "epoch / attempt", f"{t.epoch} / {t.attempt} of {t.spec.max_attempts or 'default'}"
    )
    table.add_row("request id", escape(t.request_id))
    table.add_row("submitted", _utc(t.submitted_at_unix_ms))
    table.add_row("started", _utc(t.started_at_unix_ms))
    table.add_row("finished", _utc(t.finished_at_unix_ms))
    if t.last_checkpoint.seq:
        table.add_row(
            "last checkpoint",
            f"{t.last_checkpoint.checkpoint_ref}"
            f" (journal ≤ {t.last_checkpoint.covers_journal_seq})",
        )
    if t.last_replicated_checkpoint.seq:
        table.add_row(
            "in Redis",
            f"{t.last_replicated_checkpoint.checkpoint_ref},"
            f" journal to {t.last_replicated_journal_seq}",
        )
    if t.previous_owner_node_ids:
        table.add_row("previous owners", ", ".join(t.previous_owner_node_ids))
    if t.HasField("move"):
        reason = _enum_name(records_pb2.MoveReason, t.move.reason, "MOVE_REASON_")
        table.add_row(
            "moving",
            f"{reason} → {t.move.target_node_id or 'placement chooses'} (move {t.move.move_id})",
        )
    if t.cancel_reason:
        table.add_row("cancel reason", escape(t.cancel_reason))
    if t.forked_from_ref:
        table.add_row("forked from", t.forked_from_ref)
    if t.HasField("result"):
        preview = bytes(t.result.payload[:200]).decode("utf-8", "replace")
        more = "…" if t.result.size_bytes > 200 else ""
        table.add_row("result", escape(f"{t.result.size_bytes} bytes: {preview}{more}"))
    if t.HasField("last_error"):
        e = t.last_error
        code = _enum_name(records_pb2.TaskErrorCode, e.code, "TASK_ERROR_CODE_")
        where = f" on {e.node_id}" if e.node_id else ""
        table.add_row(
            "last error",
            escape(f"{code}{where} (attempt {e.attempt}, epoch {e.epoch}): {e.message}"),
        )
    table.add_row("forks", str(len(reply.forks) or t.fork_count))
    out.print(table)
    if reply.forks:
        forks = Table(title="zombie lineages kept as forks", title_justify="left")
        for column in ("fork", "node", "stale epoch", "lineage task", "resolution", "divergent"):
            forks.add_column(column)
        for f in reply.forks:
            forks.add_row(
                f.fork_id,
                f.node_id,
                str(f.stale_epoch),
                f.lineage_task_id,
                _enum_name(records_pb2.ForkResolution, f.resolution, "FORK_RESOLUTION_"),
                f"{f.divergent_checkpoints} checkpoint(s), {f.divergent_journal_events} event(s)",
            )
        out.print(forks)


@app.command(rich_help_panel="Operator")
def submit(
    kind: Annotated[
        str, typer.Argument(help="Task kind (a handler name of the node agents' app).")
    ],
    payload: Annotated[
        str | None, typer.Option("--payload", help="Payload as JSON text (default: {}).")
    ] = None,
    payload_file: Annotated[
        Path | None,
        typer.Option(
            "--payload-file", help="Read the payload from this file (- = stdin); sent as is."
        ),
    ] = None,
    request_id: Annotated[
        str,
        typer.Option(
            "--request-id",
            help="Idempotency key; repeat it to retry safely (default: new, printed).",
        ),
    ] = "",
    task_id: Annotated[
        str, typer.Option("--task-id", help="Task id to use (default: generated).")
    ] = "",
    max_attempts: Annotated[
        int,
        typer.Option("--max-attempts", min=0, help="Attempts before FAILED; 0 = cluster default."),
    ] = 0,
    durability: Annotated[
        Literal["default", "local", "replicated"],
        typer.Option(
            "--durability",
            help="When checkpoint calls return: after local fsync, or after Redis acked.",
        ),
    ] = "default",
    priority: Annotated[
        int, typer.Option("--priority", help="Placement priority; higher first.")
    ] = 0,
    label: Annotated[
        list[str] | None, typer.Option("--label", help="Task label key=value; repeatable.")
    ] = None,
    node_selector: Annotated[
        list[str] | None,
        typer.Option("--node-selector", help="Node label key=value the task needs; repeatable."),
    ] = None,
    coordinators: CoordinatorsOption = DEFAULT_COORDINATORS,
    json_output: JsonOption = False,
) -> None:
    """Submit a task; idempotent on --request-id.

    --json prints the SubmitTaskResponse: {"task": TaskRecord, "created": bool}
    ("created" is false, or absent in the proto3 JSON mapping, when the request
    id was used before and the existing task is returned).

    Example: lazarus submit sleep --payload '{"seconds": 30, "checkpoints": 10}' --max-attempts 3
    """
    import json
    import sys
    import uuid

    if payload is not None and payload_file is not None:
        raise typer.BadParameter(
            "give --payload or --payload-file, not both", param_hint="--payload"
        )
    content_type = "application/json"
    if payload_file is not None:
        try:
            data = (
                sys.stdin.buffer.read() if str(payload_file) == "-" else payload_file.read_bytes()
            )
        except OSError as exc:
            raise typer.BadParameter(
                f"cannot read {payload_file}: {exc.strerror}", param_hint="--payload-file"
            ) from exc
        try:
            json.loads(data)
        except ValueError:
            content_type = ""
    else:
        text = "{}" if payload is None else payload
        try:
            json.loads(text)
        except ValueError as exc:
            raise typer.BadParameter(f"not JSON: {exc}", param_hint="--payload") from exc
        data = text.encode()
    rid = request_id or f"cli-{uuid.uuid4().hex}"
    spec: dict[str, Any] = {
        "max_attempts": max_attempts,
        "priority": priority,
        "labels": _pairs(label, "--label"),
        "node_selector": _pairs(node_selector, "--node-selector"),
        "content_type": content_type,
    }
    if durability != "default":
        spec["durability"] = durability
    reply = _run_operator(
        coordinators,
        json_output,
        lambda c: c.submit(kind, data, request_id=rid, task_id=task_id, **spec),
    )
    if json_output:
        _print_json(_as_json(reply))
        return
    out = _console()
    t = reply.task
    if reply.created:
        out.print(
            f"submitted [bold]{t.task_id}[/] (kind {t.spec.kind},"
            f" {_styled(_task_state(t.state))}); request id {rid}"
        )
    else:
        out.print(
            f"request id {rid} was used before: it is task [bold]{t.task_id}[/] "
            f"({_styled(_task_state(t.state))}); nothing new was submitted"
        )
    out.print(
        f"  follow it: lazarus task {t.task_id}   or   lazarus watch --task {t.task_id}",
        markup=False,
    )


@app.command(rich_help_panel="Operator")
def cancel(
    task_id: Annotated[str, typer.Argument(help="The task id.")],
    reason: Annotated[
        str, typer.Option("--reason", help="Why, for the record and the event.")
    ] = "",
    coordinators: CoordinatorsOption = DEFAULT_COORDINATORS,
    json_output: JsonOption = False,
) -> None:
    """Cancel a task: it becomes CANCELLED and its owner stops it. Idempotent.

    --json prints {"task": TaskRecord} after the cancellation.

    Example: lazarus cancel task-3798de419cd70d9f --reason "wrong input"
    """
    record = _run_operator(
        coordinators,
        json_output,
        lambda c: c.cancel(task_id, reason),
        not_found="list the tasks with `lazarus tasks`",
    )
    if json_output:
        _print_json({"task": _as_json(record)})
        return
    _console().print(f"task [bold]{record.task_id}[/] is {_styled(_task_state(record.state))}")


@app.command(rich_help_panel="Operator")
def drain(
    node_id: Annotated[str, typer.Argument(help="The node to drain.")],
    reason: Annotated[
        str, typer.Option("--reason", help="Why, for the record and the events.")
    ] = "",
    release_timeout_s: Annotated[
        float,
        typer.Option(
            "--release-timeout-s",
            min=0.0,
            help="Seconds each task gets to release; 0 = cluster default.",
        ),
    ] = 0.0,
    coordinators: CoordinatorsOption = DEFAULT_COORDINATORS,
    json_output: JsonOption = False,
) -> None:
    """Cordon a node and move each of its tasks elsewhere with no work redone.

    Idempotent while the drain runs; `lazarus uncordon` ends it. --json prints
    the DrainNodeResponse: {"node": NodeRecord, "drain_id": "...",
    "tasks_to_move": N}.

    Example: lazarus drain worker-3 --reason "kernel upgrade"
    """
    reply = _run_operator(
        coordinators,
        json_output,
        lambda c: c.drain(node_id, reason, release_timeout_s),
        not_found="list the nodes with `lazarus nodes`",
    )
    if json_output:
        _print_json(_as_json(reply))
        return
    out = _console()
    out.print(
        f"draining [bold]{reply.node.node_id}[/] (drain {reply.drain_id}): "
        f"{reply.tasks_to_move} task(s) to move; it gets no new tasks"
    )
    out.print(
        f"  follow: lazarus watch --node {node_id}   end it: lazarus uncordon {node_id}",
        markup=False,
    )


@app.command(rich_help_panel="Operator")
def uncordon(
    node_id: Annotated[str, typer.Argument(help="The node.")],
    coordinators: CoordinatorsOption = DEFAULT_COORDINATORS,
    json_output: JsonOption = False,
) -> None:
    """Lift a node's cordon (ends a drain; tasks already moved stay where they are).

    --json prints {"node": NodeRecord}.

    Example: lazarus uncordon worker-3
    """
    record = _run_operator(
        coordinators,
        json_output,
        lambda c: c.uncordon(node_id),
        not_found="list the nodes with `lazarus nodes`",
    )
    if json_output:
        _print_json({"node": _as_json(record)})
        return
    _console().print(
        f"[bold]{record.node_id}[/] is {_styled(_node_state(record.state))}, "
        f"{'still cordoned' if record.cordoned else 'not cordoned'}: it takes new tasks again"
    )


@app.command(rich_help_panel="Operator")
def migrate(
    task_id: Annotated[str, typer.Argument(help="The task to move (ASSIGNED or RUNNING).")],
    node_id: Annotated[str, typer.Argument(help="Target node; omit to let placement choose.")] = "",
    expected_epoch: Annotated[
        int | None,
        typer.Option(
            "--expected-epoch", min=0, help="Move only if the task is still at this epoch."
        ),
    ] = None,
    reason: Annotated[str, typer.Option("--reason", help="Why, for the record.")] = "",
    release_timeout_s: Annotated[
        float,
        typer.Option(
            "--release-timeout-s", min=0.0, help="Seconds the owner gets to release; 0 = default."
        ),
    ] = 0.0,
    coordinators: CoordinatorsOption = DEFAULT_COORDINATORS,
    json_output: JsonOption = False,
) -> None:
    """Move a running task to another node: released with a final checkpoint, resumed there.

    --json prints the MigrateTaskResponse: {"task": TaskRecord (with "move"),
    "move_id": "..."}.

    Example: lazarus migrate task-3798de419cd70d9f worker-2 --expected-epoch 1
    """
    reply = _run_operator(
        coordinators,
        json_output,
        lambda c: c.migrate(
            task_id,
            node_id,
            expected_epoch=expected_epoch,
            reason=reason,
            release_timeout_s=release_timeout_s,
        ),
        not_found="list them with `lazarus tasks` / `lazarus nodes`",
    )
    if json_output:
        _print_json(_as_json(reply))
        return
    out = _console()
    t = reply.task
    out.print(
        f"moving [bold]{t.task_id}[/] from {t.owner_node_id or '?'} to "
        f"{node_id or 'a node placement chooses'} (move {reply.move_id})"
    )
    out.print(f"  follow: lazarus watch --task {t.task_id}", markup=False)


def event_line(event: Any) -> str:
    """One line for an Event: ``HH:MM:SS.mmm  revision  TYPE  key=value ...`` (rich markup)."""
    import datetime
    import json

    from rich.markup import escape

    body_name = event.WhichOneof("body") or "unknown"
    body = _as_json(getattr(event, body_name)) if event.WhichOneof("body") else {}
    parts = []
    for key, value in body.items():
        text = (
            json.dumps(value, separators=(",", ":"))
            if isinstance(value, dict | list)
            else str(value)
        )
        parts.append(f"{key}={text}")
    moment = datetime.datetime.fromtimestamp(event.occurred_at_unix_ms / 1000, tz=datetime.UTC)
    clock = moment.strftime("%H:%M:%S.%f")[:-3]
    kind = body_name.upper()
    style = (
        "red"
        if kind in ("NODE_DEAD", "TASK_FAILED", "ZOMBIE_FENCED", "CONFLICT_DETECTED")
        else "bold"
    )
    return (
        f"[dim]{clock}[/]  {event.revision:>14}  [{style}]{kind:<18}[/] {escape(' '.join(parts))}"
    )


@app.command(rich_help_panel="Operator")
def watch(
    from_revision: Annotated[
        int, typer.Option("--from-revision", min=0, help="First revision (0 = from now on).")
    ] = 0,
    event_type: Annotated[
        list[str] | None,
        typer.Option(
            "--type",
            help="Only this event type (e.g. task_completed, node_dead); repeat or comma-separate.",
        ),
    ] = None,
    task_id: Annotated[str, typer.Option("--task", help="Only events about this task.")] = "",
    node_id: Annotated[str, typer.Option("--node", help="Only events about this node.")] = "",
    coordinators: CoordinatorsOption = DEFAULT_COORDINATORS,
    json_output: JsonOption = False,
) -> None:
    """Follow cluster events live, one line each, until Ctrl-C.

    The stream resumes on another coordinator when one fails, from the last
    revision seen. --json prints one Event per line (JSON lines:
    {"revision": "...", "occurred_at_unix_ms": "...", "term": "...",
    "<body>": {...}}).

    Example: lazarus watch --type task_completed,task_failed --node worker-0
    """
    from lazarus.client import InvalidArgument, event_type_value

    types = []
    for value in _split(event_type):
        try:
            types.append(event_type_value(value, "--type"))
        except InvalidArgument as exc:
            raise typer.BadParameter(exc.message.partition(": ")[2], param_hint="--type") from exc
    out = _console()
    err = _console(stderr=True)

    async def follow(client: Any) -> None:
        import json

        stream = client.watch(from_revision, types=types, task_id=task_id, node_id=node_id)
        try:
            async for event in stream:
                if json_output:
                    typer.echo(json.dumps(_as_json(event), separators=(",", ":")))
                else:
                    out.print(event_line(event))
        finally:
            await stream.aclose()

    if not json_output:
        err.print(f"watching events at {coordinators} (Ctrl-C ends)", markup=False)
    try:
        _run_operator(coordinators, json_output, follow)
    except KeyboardInterrupt:
        if not json_output:
            err.print("stopped", markup=False)
