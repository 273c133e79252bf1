"""The operator commands of ``lazarus`` (status, nodes, tasks, task, submit, cancel,
drain, uncordon, migrate, watch) against a fake of ``lazarus.client.Client``.

No network: ``lazarus.cli.operator.make_operator_client`` is replaced by ``FakeClient``,
which records each call and answers with canned records or raises a typed
``LazarusError``. Checked: option parsing, the request each command makes,
--json shapes, tables for people, error messages and exit codes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from lazarus import cli
from lazarus.client import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
    Unimplemented,
)
from lazarus.v1 import coordinator_pb2, records_pb2

pytestmark = pytest.mark.timeout(10)

R = records_pb2
C = coordinator_pb2


def _task(task_id: str = "task-1", state: int = R.TASK_STATE_RUNNING, **extra: Any) -> Any:
    return R.TaskRecord(
        task_id=task_id,
        spec=R.TaskSpec(kind="sleep", payload=b"{}"),
        state=state,  # type: ignore[arg-type]
        epoch=2,
        attempt=1,
        owner_node_id="agent-1" if state == R.TASK_STATE_RUNNING else "",
        request_id="r-1",
        **extra,
    )


def _node(node_id: str = "agent-1", state: int = R.NODE_STATE_ALIVE, **extra: Any) -> Any:
    return R.NodeRecord(
        node_id=node_id,
        state=state,  # type: ignore[arg-type]
        capacity=R.NodeCapacity(slots=8),
        address=f"{node_id}:9000",
        **extra,
    )


class FakeStream:
    """What ``Client.watch`` returns: async iteration over canned events."""

    def __init__(self, events: list[Any], end: BaseException | None) -> None:
        self._events = list(events)
        self._end = end
        self.closed = False

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> Any:
        if self._events:
            return self._events.pop(0)
        if self._end is not None:
            raise self._end
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self.closed = True


class FakeClient:
    """The methods of ``lazarus.client.Client`` the CLI uses, recorded and canned."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.raises: dict[str, BaseException] = {}
        self.task_list = [_task("task-1"), _task("task-2", R.TASK_STATE_COMPLETED)]
        self.events: list[Any] = []
        self.watch_end: BaseException | None = None
        self.stream: FakeStream | None = None
        self.closed = False

    async def __aenter__(self) -> FakeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.closed = True

    def _record(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((name, args, kwargs))
        if name in self.raises:
            raise self.raises[name]

    async def status(self) -> Any:
        self._record("status")
        return C.GetClusterStatusResponse(
            cluster_name="prod",
            leader_id="coordinator-1",
            leader_address="10.0.0.1:7070",
            term=7,
            serving_member_id="coordinator-0",
            nodes_by_state=[C.NodeStateCount(state=R.NODE_STATE_ALIVE, count=3)],
            tasks_by_state=[C.TaskStateCount(state=R.TASK_STATE_RUNNING, count=5)],
            read_revision=42,
            sessions_by_replica={"coordinator-1": 1, "coordinator-2": 2},
        )

    async def nodes(self, **filters: Any) -> list[Any]:
        self._record("nodes", **filters)
        leader_view = C.NodeInfo(
            record=_node("agent-1"),
            liveness=C.NodeLiveness(
                connected=True,
                assigned_tasks=2,
                load=R.NodeLoad(used_slots=2),
                session_replica="coordinator-2",
            ),
        )
        return [leader_view, C.NodeInfo(record=_node("agent-2", R.NODE_STATE_DRAINING))]

    async def tasks(self, **filters: Any) -> list[Any]:
        self._record("tasks", **filters)
        limit = filters.get("limit")
        return self.task_list[:limit] if limit is not None else list(self.task_list)

    async def get(self, task_id: str) -> Any:
        self._record("get", task_id)
        task = _task(
            task_id,
            R.TASK_STATE_FAILED,
            last_error=R.TaskError(
                code=R.TASK_ERROR_CODE_HANDLER_ERROR, message="boom [red]", node_id="agent-1"
            ),
            fork_count=1,
        )
        fork = R.ForkRecord(fork_id="fork-1", task_id=task_id, node_id="agent-3", stale_epoch=1)
        return C.GetTaskResponse(task=task, forks=[fork], read_revision=9)

    async def submit(self, kind: str, payload: Any, **options: Any) -> Any:
        self._record("submit", kind, payload, **options)
        return C.SubmitTaskResponse(task=_task("task-9", R.TASK_STATE_PENDING), created=True)

    async def cancel(self, task_id: str, reason: str = "") -> Any:
        self._record("cancel", task_id, reason)
        return _task(task_id, R.TASK_STATE_CANCELLED, cancel_reason=reason)

    async def drain(self, node_id: str, reason: str = "", release_timeout_s: float = 0.0) -> Any:
        self._record("drain", node_id, reason, release_timeout_s)
        node = _node(node_id, R.NODE_STATE_DRAINING, cordoned=True, drain_id="drain-1")
        return C.DrainNodeResponse(node=node, drain_id="drain-1", tasks_to_move=0)

    async def uncordon(self, node_id: str) -> Any:
        self._record("uncordon", node_id)
        return _node(node_id)

    async def migrate(self, task_id: str, target_node_id: str = "", **options: Any) -> Any:
        self._record("migrate", task_id, target_node_id, **options)
        return C.MigrateTaskResponse(task=_task(task_id), move_id="migrate-1")

    def watch(self, from_revision: int = 0, **filters: Any) -> FakeStream:
        self._record("watch", from_revision, **filters)
        self.stream = FakeStream(self.events, self.watch_end)
        return self.stream


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeClient:
    client = FakeClient()
    made: list[str] = []

    def make(addresses: str) -> FakeClient:
        made.append(addresses)
        if "bad" in addresses:
            raise ValueError(f"coordinators: {addresses!r} is not host:port")
        return client

    monkeypatch.setattr(cli.operator, "make_operator_client", make)
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("LAZARUS_COORDINATORS", raising=False)
    client.made = made  # type: ignore[attr-defined]
    return client


def run(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> Any:
    return CliRunner().invoke(cli.app, list(args), env=env, input=stdin)


def _json(output: str) -> Any:
    return json.loads(output)


# ------------------------------------------------------------------ help


@pytest.mark.parametrize(
    "command",
    [
        "status",
        "nodes",
        "tasks",
        "task",
        "submit",
        "cancel",
        "drain",
        "uncordon",
        "migrate",
        "watch",
    ],
)
def test_every_command_has_help_with_an_example_and_the_common_options(command: str) -> None:
    result = run(command, "--help")
    assert result.exit_code == 0, result.output
    assert "Example:" in result.output
    assert "--coordinators" in result.output
    assert "--json" in result.output


def test_coordinators_come_from_the_option_the_environment_or_the_default(
    fake: FakeClient,
) -> None:
    made: list[str] = fake.made  # type: ignore[attr-defined]
    assert run("status").exit_code == 0
    assert run("status", env={"LAZARUS_COORDINATORS": "c1:7070,c2:7070"}).exit_code == 0
    assert run("status", "--coordinators", "x:1").exit_code == 0
    assert made == ["127.0.0.1:7070", "c1:7070,c2:7070", "x:1"]


def test_a_malformed_coordinator_list_is_a_usage_error(fake: FakeClient) -> None:
    result = run("status", "--coordinators", "bad")
    assert result.exit_code == 2
    assert "--coordinators" in result.output
    assert "not host:port" in result.output


# ------------------------------------------------------------------ reads


def test_status_table_and_json(fake: FakeClient) -> None:
    result = run("status")
    assert result.exit_code == 0, result.output
    for text in ("cluster prod", "coordinator-1 at 10.0.0.1:7070", "ALIVE 3", "RUNNING 5"):
        assert text in result.output
    # The Sessions each replica holds (fan-in: followers hold some).
    assert "coordinator-1 1 · coordinator-2 2" in result.output
    doc = _json(run("status", "--json").output)
    assert doc["cluster_name"] == "prod"
    assert doc["leader_address"] == "10.0.0.1:7070"
    assert doc["term"] == "7"  # uint64: a string in the proto3 JSON mapping
    assert doc["tasks_by_state"] == [{"state": "TASK_STATE_RUNNING", "count": "5"}]
    assert doc["mass_failure_guard_active"] is False  # defaults are printed
    assert doc["sessions_by_replica"] == {"coordinator-1": 1, "coordinator-2": 2}


def test_nodes_table_json_and_state_filter(fake: FakeClient) -> None:
    result = run("nodes", "--state", "alive,draining")
    assert result.exit_code == 0, result.output
    assert fake.calls[-1] == ("nodes", (), {"states": [R.NODE_STATE_ALIVE, R.NODE_STATE_DRAINING]})
    assert "agent-1" in result.output
    assert "DRAINING" in result.output
    assert "open via coordinator-2" in result.output  # the replica holding its Session
    assert "2/8" in result.output
    doc = _json(run("nodes", "--json").output)
    assert [n["record"]["node_id"] for n in doc["nodes"]] == ["agent-1", "agent-2"]
    assert doc["nodes"][0]["liveness"]["connected"] is True
    assert "liveness" not in doc["nodes"][1]


def test_an_unknown_state_name_is_a_usage_error_naming_the_choices(fake: FakeClient) -> None:
    result = run("tasks", "--state", "runing")
    assert result.exit_code == 2
    assert "runing" in result.output
    assert "running" in result.output
    assert not fake.calls


def test_tasks_filters_limit_and_json(fake: FakeClient) -> None:
    result = run(
        "tasks", "--state", "running", "--state", "pending", "--node", "agent-1", "--kind", "sleep",
        "--label", "team=a", "--limit", "1",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    name, _, filters = fake.calls[-1]
    assert name == "tasks"
    assert filters == {
        "states": [R.TASK_STATE_RUNNING, R.TASK_STATE_PENDING],
        "node_id": "agent-1",
        "kind": "sleep",
        "labels": {"team": "a"},
        "limit": 2,  # one more than shown, to know whether more match
    }
    assert "task-1" in result.output
    assert "task-2" not in result.output
    assert "raise --limit" in result.output
    doc = _json(run("tasks", "--json", "--limit", "0").output)
    assert fake.calls[-1][2]["limit"] is None
    assert doc["count"] == 2
    assert doc["truncated"] is False
    assert [t["task_id"] for t in doc["tasks"]] == ["task-1", "task-2"]
    assert doc["tasks"][0]["state"] == "TASK_STATE_RUNNING"
    doc = _json(run("tasks", "--json", "--limit", "1").output)
    assert doc["count"] == 1
    assert doc["truncated"] is True


def test_a_bad_label_is_a_usage_error(fake: FakeClient) -> None:
    result = run("tasks", "--label", "novalue")
    assert result.exit_code == 2
    assert "key=value" in result.output


def test_task_shows_state_last_error_and_forks(fake: FakeClient) -> None:
    result = run("task", "task-7")
    assert result.exit_code == 0, result.output
    assert fake.calls[-1] == ("get", ("task-7",), {})
    for text in ("FAILED", "HANDLER_ERROR on agent-1", "boom [red]", "fork-1", "agent-3"):
        assert text in result.output
    doc = _json(run("task", "task-7", "--json").output)
    assert doc["task"]["task_id"] == "task-7"
    assert doc["forks"][0]["fork_id"] == "fork-1"
    assert doc["read_revision"] == "9"


# ------------------------------------------------------------------ writes


def test_submit_sends_the_payload_and_spec_options(fake: FakeClient) -> None:
    result = run(
        "submit", "sleep", "--payload", '{"seconds": 3}', "--request-id", "req-1",
        "--max-attempts", "3", "--durability", "replicated", "--label", "team=a",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    name, args, options = fake.calls[-1]
    assert (name, args[0], json.loads(args[1])) == ("submit", "sleep", {"seconds": 3})
    assert options["request_id"] == "req-1"
    assert options["max_attempts"] == 3
    assert options["durability"] == "replicated"
    assert options["labels"] == {"team": "a"}
    assert options["content_type"] == "application/json"
    assert "submitted task-9" in result.output
    assert "req-1" in result.output


def test_submit_defaults_and_json(fake: FakeClient) -> None:
    doc = _json(run("submit", "sleep", "--json").output)
    _, args, options = fake.calls[-1]
    assert args[1] == b"{}"
    assert options["request_id"].startswith("cli-")  # generated, reused on retries
    assert "durability" not in options
    assert doc["created"] is True
    assert doc["task"]["task_id"] == "task-9"


def test_submit_reads_a_payload_file_or_stdin(fake: FakeClient, tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text('{"seconds": 1}')
    assert run("submit", "sleep", "--payload-file", str(path)).exit_code == 0
    assert fake.calls[-1][1][1] == b'{"seconds": 1}'
    assert run("submit", "sleep", "--payload-file", "-", stdin="raw bytes").exit_code == 0
    assert fake.calls[-1][1][1] == b"raw bytes"
    assert fake.calls[-1][2]["content_type"] == ""  # not JSON: opaque


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--payload", "{not json"], "not JSON"),
        (["--payload", "{}", "--payload-file", "x"], "not both"),
        (["--payload-file", "/nonexistent/p.json"], "cannot read"),
        (["--durability", "sometimes"], "--durability"),
        (["--max-attempts", "-1"], "--max-attempts"),
    ],
)
def test_submit_usage_errors(fake: FakeClient, args: list[str], needle: str) -> None:
    result = run("submit", "sleep", *args)
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert not fake.calls


def test_cancel_drain_uncordon_migrate_make_their_calls(fake: FakeClient) -> None:
    result = run("cancel", "task-1", "--reason", "wrong input")
    assert result.exit_code == 0, result.output
    assert fake.calls[-1] == ("cancel", ("task-1", "wrong input"), {})
    assert "CANCELLED" in result.output

    result = run("drain", "agent-2", "--reason", "upgrade", "--release-timeout-s", "2.5")
    assert result.exit_code == 0, result.output
    assert fake.calls[-1] == ("drain", ("agent-2", "upgrade", 2.5), {})
    assert "drain-1" in result.output
    assert "lazarus uncordon agent-2" in result.output

    result = run("uncordon", "agent-2")
    assert result.exit_code == 0, result.output
    assert fake.calls[-1] == ("uncordon", ("agent-2",), {})

    result = run("migrate", "task-1", "agent-3", "--expected-epoch", "2")
    assert result.exit_code == 0, result.output
    assert fake.calls[-1] == (
        "migrate",
        ("task-1", "agent-3"),
        {"expected_epoch": 2, "reason": "", "release_timeout_s": 0.0},
    )
    assert "migrate-1" in result.output
    assert run("migrate", "task-1").exit_code == 0
    assert fake.calls[-1][1] == ("task-1", "")  # placement chooses


def test_write_commands_json_shapes(fake: FakeClient) -> None:
    assert (
        _json(run("cancel", "task-1", "--json").output)["task"]["state"] == "TASK_STATE_CANCELLED"
    )
    drain = _json(run("drain", "agent-2", "--json").output)
    assert drain["drain_id"] == "drain-1"
    assert drain["tasks_to_move"] == 0  # printed although it is the default
    assert drain["node"]["cordoned"] is True
    assert _json(run("uncordon", "agent-2", "--json").output)["node"]["node_id"] == "agent-2"
    moved = _json(run("migrate", "task-1", "agent-3", "--json").output)
    assert moved["move_id"] == "migrate-1"


# ------------------------------------------------------------------ errors


def test_no_coordinator_answering_says_what_to_do_and_exits_3(fake: FakeClient) -> None:
    fake.raises["status"] = Unavailable("failed to connect to all addresses", answered=False)
    result = run("status", "--coordinators", "127.0.0.1:7070")
    assert result.exit_code == 3
    assert "no coordinator answered at 127.0.0.1:7070" in result.output
    assert "is `lazarus coordinator` running?" in result.output
    assert "--coordinators" in result.output


def test_no_leader_is_reported_differently(fake: FakeClient) -> None:
    fake.raises["cancel"] = Unavailable("this replica cannot serve writes; no leader is known")
    result = run("cancel", "task-1")
    assert result.exit_code == 3
    assert "is a leader elected" in result.output
    assert "no leader is known" in result.output


def test_refusals_exit_1_with_the_server_message_and_a_hint(fake: FakeClient) -> None:
    fake.raises["get"] = NotFound("task_id: 'nope' not found")
    result = run("task", "nope")
    assert result.exit_code == 1
    assert "NOT_FOUND: task_id: 'nope' not found" in result.output
    assert "lazarus tasks" in result.output

    fake.raises["cancel"] = FailedPrecondition("task is already COMPLETED")
    result = run("cancel", "task-2")
    assert result.exit_code == 1
    assert "FAILED_PRECONDITION: task is already COMPLETED" in result.output


def test_errors_with_json_are_a_json_document(fake: FakeClient) -> None:
    fake.raises["submit"] = InvalidArgument("spec.kind: must be 1..128 bytes")
    result = run("submit", "sleep", "--json")
    assert result.exit_code == 1
    assert _json(result.output) == {
        "error": {
            "code": "INVALID_ARGUMENT",
            "message": "spec.kind: must be 1..128 bytes",
            "hint": "fix spec.kind and try again",
            "field": "spec.kind",
        }
    }
    fake.raises["status"] = Unavailable("failed to connect", answered=False)
    result = run("status", "--json")
    assert result.exit_code == 3
    error = _json(result.output)["error"]
    assert error["code"] == "UNAVAILABLE"
    assert "no coordinator answered" in error["hint"]


def test_unimplemented_says_to_upgrade(fake: FakeClient) -> None:
    fake.raises["uncordon"] = Unimplemented("not implemented yet")
    result = run("uncordon", "agent-1")
    assert result.exit_code == 1
    assert "upgrade" in result.output


# ------------------------------------------------------------------ watch


def _event(revision: int, **body: Any) -> Any:
    return R.Event(revision=revision, occurred_at_unix_ms=1_700_000_000_000, term=1, **body)


def test_watch_prints_one_line_per_event_and_passes_filters(fake: FakeClient) -> None:
    fake.events = [
        _event(5, task_submitted=R.TaskSubmitted(task_id="task-1", kind="sleep")),
        _event(6, node_dead=R.NodeDead(node_id="agent-2", tasks_to_move=3)),
    ]
    result = run(
        "watch", "--from-revision", "5", "--type", "task_submitted,node_dead", "--task", "task-1",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert fake.calls[-1] == (
        "watch",
        (5,),
        {
            "types": [R.EVENT_TYPE_TASK_SUBMITTED, R.EVENT_TYPE_NODE_DEAD],
            "task_id": "task-1",
            "node_id": "",
        },
    )
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == 2
    assert "TASK_SUBMITTED" in lines[0]
    assert "task_id=task-1" in lines[0]
    assert "NODE_DEAD" in lines[1]
    assert "tasks_to_move=3" in lines[1]
    assert fake.stream is not None
    assert fake.stream.closed


def test_watch_json_prints_json_lines(fake: FakeClient) -> None:
    fake.events = [
        _event(5, task_submitted=R.TaskSubmitted(task_id="task-1")),
        _event(7, task_completed=R.TaskCompleted(task_id="task-1", total_ms=1200)),
    ]
    result = run("watch", "--json")
    assert result.exit_code == 0, result.output
    docs = [json.loads(line) for line in result.stdout.splitlines()]
    assert [d["revision"] for d in docs] == ["5", "7"]
    assert docs[1]["task_completed"]["total_ms"] == "1200"


def test_watch_ends_cleanly_on_ctrl_c(fake: FakeClient) -> None:
    fake.events = [_event(5, task_submitted=R.TaskSubmitted(task_id="task-1"))]
    fake.watch_end = KeyboardInterrupt()
    result = run("watch")
    assert result.exit_code == 0, result.output
    assert "TASK_SUBMITTED" in result.stdout
    assert fake.stream is not None
    assert fake.stream.closed


def test_watch_an_unknown_type_is_a_usage_error(fake: FakeClient) -> None:
    result = run("watch", "--type", "task_exploded")
    assert result.exit_code == 2
    assert "task_completed" in result.output  # the choices are listed
    assert not fake.calls


def test_watch_losing_every_coordinator_exits_3(fake: FakeClient) -> None:
    fake.watch_end = Unavailable("failed to connect", answered=False)
    result = run("watch", "--coordinators", "a:1,b:2")
    assert result.exit_code == 3
    assert "no coordinator answered at a:1,b:2" in result.output


# ------------------------------------------------------------------ the fake matches


def test_the_fake_has_the_signatures_of_the_real_client() -> None:
    import inspect

    from lazarus.client import Client

    for name in ("status", "nodes", "tasks", "get", "submit", "cancel", "drain", "uncordon"):
        assert inspect.iscoroutinefunction(getattr(Client, name)), name
    assert not inspect.iscoroutinefunction(Client.watch)
    real = inspect.signature(Client.drain).parameters
    assert list(real) == ["self", "node_id", "reason", "release_timeout_s"]


async def _collect(stream: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in stream]


async def test_fake_stream_behaves_like_an_async_iterator() -> None:
    stream = FakeStream([1, 2], None)
    assert await _collect(stream) == [1, 2]
