"""The wire contract in ``proto/lazarus/v1``: fresh stubs, documented, usable.

Theory of operation: the committed stubs in ``lazarus/v1`` must equal a fresh
generation byte for byte; every message, field, oneof, enum, enum value,
service and method must carry a leading comment, read from the
``SourceCodeInfo`` protoc emits (never by scanning the ``.proto`` text); and the
generated classes must round-trip representative messages and serve real RPCs.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.message import Message

from lazarus.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    coordinator_pb2,
    coordinator_pb2_grpc,
    records_pb2,
)
from lazarus_dev import protogen

COMMITTED_DIR = protogen.REPO_ROOT / "lazarus" / "v1"
EXPECTED_PROTOS = {"agent.proto", "coordinator.proto", "records.proto", "replica.proto"}

# Field numbers of the descriptor messages, as used in SourceCodeInfo paths.
FILE_MESSAGE_TYPE = 4
FILE_ENUM_TYPE = 5
FILE_SERVICE = 6
MESSAGE_FIELD = 2
MESSAGE_NESTED_TYPE = 3
MESSAGE_ENUM_TYPE = 4
MESSAGE_ONEOF_DECL = 8
ENUM_VALUE = 2
SERVICE_METHOD = 2

Path_ = tuple[int, ...]
M = TypeVar("M", bound=Message)


def _generated_names(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir() if p.is_file() and protogen.is_generated(p)}


def test_proto_sources_present() -> None:
    assert {p.name for p in protogen.proto_files()} == EXPECTED_PROTOS


def test_committed_stubs_are_fresh(tmp_path: Path) -> None:
    fresh_files = protogen.generate(tmp_path)
    fresh_dir = tmp_path / "lazarus" / "v1"
    fresh = _generated_names(fresh_dir)
    committed = _generated_names(COMMITTED_DIR)
    assert fresh == {p.name for p in fresh_files}
    assert committed == fresh, (
        f"lazarus/v1 stubs do not match proto/: missing {sorted(fresh - committed)}, "
        f"extra {sorted(committed - fresh)}; run `make proto`"
    )
    stale = [
        name
        for name in sorted(fresh)
        if (COMMITTED_DIR / name).read_bytes() != (fresh_dir / name).read_bytes()
    ]
    assert not stale, f"stale generated stubs {stale}; run `make proto`"


@pytest.fixture(scope="module")
def descriptor_files(
    tmp_path_factory: pytest.TempPathFactory,
) -> list[descriptor_pb2.FileDescriptorProto]:
    out = tmp_path_factory.mktemp("descriptors") / "lazarus.pb"
    fds = descriptor_pb2.FileDescriptorSet.FromString(protogen.descriptor_set(out))
    return list(fds.file)


def _elements(
    fd: descriptor_pb2.FileDescriptorProto,
) -> Iterator[tuple[str, str, Path_]]:
    """Yield ``(kind, full name, SourceCodeInfo path)`` of every documentable element."""
    pkg = fd.package

    def enum(
        e: descriptor_pb2.EnumDescriptorProto, scope: str, path: Path_
    ) -> Iterator[tuple[str, str, Path_]]:
        name = f"{scope}.{e.name}"
        yield "enum", name, path
        for j, v in enumerate(e.value):
            yield "enum value", f"{name}.{v.name}", (*path, ENUM_VALUE, j)

    def message(
        m: descriptor_pb2.DescriptorProto, scope: str, path: Path_
    ) -> Iterator[tuple[str, str, Path_]]:
        if m.options.map_entry:  # synthesized for map<,> fields; the field carries the comment
            return
        name = f"{scope}.{m.name}"
        yield "message", name, path
        for j, f in enumerate(m.field):
            yield "field", f"{name}.{f.name}", (*path, MESSAGE_FIELD, j)
        for j, o in enumerate(m.oneof_decl):
            if o.name.startswith("_"):  # synthetic oneof of a proto3 `optional` field
                continue
            yield "oneof", f"{name}.{o.name}", (*path, MESSAGE_ONEOF_DECL, j)
        for j, nested in enumerate(m.nested_type):
            yield from message(nested, name, (*path, MESSAGE_NESTED_TYPE, j))
        for j, e in enumerate(m.enum_type):
            yield from enum(e, name, (*path, MESSAGE_ENUM_TYPE, j))

    for i, m in enumerate(fd.message_type):
        yield from message(m, pkg, (FILE_MESSAGE_TYPE, i))
    for i, e in enumerate(fd.enum_type):
        yield from enum(e, pkg, (FILE_ENUM_TYPE, i))
    for i, s in enumerate(fd.service):
        name = f"{pkg}.{s.name}"
        yield "service", name, (FILE_SERVICE, i)
        for j, method in enumerate(s.method):
            yield "method", f"{name}.{method.name}", (FILE_SERVICE, i, SERVICE_METHOD, j)


def test_every_element_has_a_leading_comment(
    descriptor_files: list[descriptor_pb2.FileDescriptorProto],
) -> None:
    assert {Path(fd.name).name for fd in descriptor_files} == EXPECTED_PROTOS
    undocumented: list[str] = []
    counts: dict[str, int] = {}
    for fd in descriptor_files:
        assert fd.HasField("source_code_info"), f"{fd.name}: protoc emitted no SourceCodeInfo"
        comments = {tuple(loc.path): loc.leading_comments for loc in fd.source_code_info.location}
        for kind, name, path in _elements(fd):
            counts[kind] = counts.get(kind, 0) + 1
            if not comments.get(path, "").strip():
                undocumented.append(f"{fd.name}: {kind} {name}")
    assert not undocumented, "elements without a leading comment:\n" + "\n".join(undocumented)
    # The walk must actually have visited each kind of element.
    for kind in ("message", "field", "oneof", "enum", "enum value", "service", "method"):
        assert counts.get(kind, 0) > 0, f"no {kind} visited"


def test_enums_reserve_zero_as_unspecified(
    descriptor_files: list[descriptor_pb2.FileDescriptorProto],
) -> None:
    def enums(
        fd: descriptor_pb2.FileDescriptorProto,
    ) -> Iterator[descriptor_pb2.EnumDescriptorProto]:
        yield from fd.enum_type
        stack = list(fd.message_type)
        while stack:
            m = stack.pop()
            yield from m.enum_type
            stack.extend(m.nested_type)

    bad = []
    for fd in descriptor_files:
        for e in enums(fd):
            prefix = "".join(f"_{c}" if c.isupper() else c.upper() for c in e.name).lstrip("_")
            zero = [v.name for v in e.value if v.number == 0]
            if zero != [f"{prefix}_UNSPECIFIED"]:
                bad.append(f"{e.name}: value 0 is {zero}, want {prefix}_UNSPECIFIED")
            bad.extend(
                f"{e.name}.{v.name}: missing prefix {prefix}_"
                for v in e.value
                if not v.name.startswith(prefix + "_")
            )
    assert not bad, "\n".join(bad)


def test_event_type_values_match_event_body_fields() -> None:
    body = records_pb2.Event.DESCRIPTOR.oneofs_by_name["body"]
    by_number = {f.number: f.name for f in body.fields}
    types = {
        v.number: v.name
        for v in records_pb2.EventType.DESCRIPTOR.values
        if v.number != records_pb2.EVENT_TYPE_UNSPECIFIED
    }
    assert set(types) == set(by_number)
    for number, value_name in types.items():
        assert value_name == "EVENT_TYPE_" + by_number[number].upper()


def test_no_well_known_time_types(
    descriptor_files: list[descriptor_pb2.FileDescriptorProto],
) -> None:
    for fd in descriptor_files:
        assert not [d for d in fd.dependency if d.startswith("google/protobuf/")], fd.name


# ---------------------------------------------------------------------------
# Round trips.
# ---------------------------------------------------------------------------


def _summary(seq: int) -> records_pb2.CheckpointSummary:
    return records_pb2.CheckpointSummary(
        checkpoint_ref=f"t-1@{seq}",
        task_id="t-1",
        epoch=3,
        seq=seq,
        covers_journal_seq=seq * 10,
        label="periodic",
        created_at_unix_ms=1_700_000_000_000,
        stored_bytes=1024,
        replicated=True,
        node_id="node-a",
    )


def _spec() -> records_pb2.TaskSpec:
    return records_pb2.TaskSpec(
        kind="summarize",
        payload=b'{"doc": "moby-dick.txt"}',
        content_type="application/json",
        labels={"team": "search"},
        node_selector={"zone": "a"},
        slots=2,
        priority=5,
        max_attempts=4,
        deadline_unix_ms=1_800_000_000_000,
        durability=records_pb2.CHECKPOINT_DURABILITY_REPLICATED,
        state_model=records_pb2.STATE_MODEL_CRDT,
        checkpoint_interval_ms=5_000,
    )


def _roundtrip(msg: M) -> M:
    """Serialize ``msg``, parse it back, and check the copy equals it."""
    data = msg.SerializeToString()
    parsed = type(msg).FromString(data)
    assert parsed == msg
    assert parsed.SerializeToString(deterministic=True) == msg.SerializeToString(deterministic=True)
    return parsed


def test_agent_messages_roundtrip() -> None:
    hello = agent_pb2.AgentMessage(
        hello=agent_pb2.Hello(
            node_id="node-a",
            incarnation="0b7f2c",
            address="10.0.0.5:7400",
            capacity=records_pb2.NodeCapacity(slots=8, cpu_millicores=2000, memory_bytes=2**31),
            labels={"zone": "a"},
            held_tasks=[
                agent_pb2.HeldTask(
                    task_id="t-1",
                    epoch=3,
                    attempt=1,
                    kind="summarize",
                    status=agent_pb2.HELD_TASK_STATUS_PAUSED,
                    checkpoint=_summary(7),
                    replicated_checkpoint_seq=6,
                    journal_seq=75,
                    replicated_journal_seq=70,
                )
            ],
            agent_version="0.1.0",
            protocol_version=1,
            kinds=["summarize"],
        )
    )
    heartbeat = agent_pb2.AgentMessage(
        heartbeat=agent_pb2.Heartbeat(
            seq=42,
            sent_at_unix_ms=1_700_000_000_500,
            sent_at_monotonic_ms=123_456,
            tasks=[
                agent_pb2.TaskProgress(task_id="t-1", epoch=3, checkpoint_seq=7, progress_ratio=0.5)
            ],
            load=records_pb2.NodeLoad(running_tasks=1, used_slots=2, replication_lag_ms=12),
        )
    )
    update = agent_pb2.AgentMessage(
        task_update=agent_pb2.TaskUpdate(
            update_seq=9,
            task_id="t-1",
            epoch=3,
            attempt=1,
            completed=agent_pb2.TaskUpdate.Completed(
                result=records_pb2.TaskResult(
                    payload=b"{}", content_type="application/json", size_bytes=2
                ),
                final_checkpoint=_summary(8),
                run_ms=1200,
            ),
        )
    )
    lineage = agent_pb2.AgentMessage(
        lineage_report=agent_pb2.LineageReport(
            fork_id="f-1",
            task_id="t-1",
            epoch=3,
            last=True,
            checkpoints=[
                records_pb2.CheckpointRecord(
                    task_id="t-1",
                    epoch=3,
                    seq=7,
                    covers_journal_seq=70,
                    checkpoint_ref="t-1@7",
                    payload=b"state",
                    encoding=records_pb2.PAYLOAD_ENCODING_RAW,
                    checksum_algorithm=records_pb2.CHECKSUM_ALGORITHM_CRC32,
                    checksum=b"\x01\x02\x03\x04",
                )
            ],
            journal_events=[
                records_pb2.JournalEventRecord(
                    task_id="t-1",
                    epoch=3,
                    seq=71,
                    payload=b"e",
                    hlc=records_pb2.HybridTimestamp(wall_ms=1, logical=2, node_id="node-a"),
                )
            ],
        )
    )
    deltas = agent_pb2.AgentMessage(
        delta_batch=agent_pb2.DeltaBatch(
            batch_id=1,
            deltas=[
                records_pb2.DocumentDelta(
                    doc_id="shared/counter",
                    crdt_type=records_pb2.CRDT_TYPE_PN_COUNTER,
                    since=records_pb2.StateVector(counters={"node-a": 3}),
                    until=records_pb2.StateVector(counters={"node-a": 5}),
                    ops=b"\x00",
                    codec="lazarus-crdt-v1",
                    op_count=2,
                )
            ],
        )
    )
    for msg in (hello, heartbeat, update, lineage, deltas):
        parsed = _roundtrip(msg)
        assert parsed.WhichOneof("body") == msg.WhichOneof("body")
    assert _roundtrip(update).task_update.WhichOneof("change") == "completed"


def test_coordinator_messages_roundtrip() -> None:
    assign = agent_pb2.CoordinatorMessage(
        assign=agent_pb2.Assign(
            task_id="t-1",
            epoch=4,
            attempt=2,
            spec=_spec(),
            resume_from=agent_pb2.ResumePoint(
                checkpoint=_summary(6),
                location=records_pb2.CHECKPOINT_LOCATION_REDIS,
                replay_through_journal_seq=70,
            ),
            reason=agent_pb2.ASSIGN_REASON_MOVED,
            move_reason=records_pb2.MOVE_REASON_NODE_DEAD,
            previous_owner_node_id="node-a",
        )
    )
    welcome = agent_pb2.CoordinatorMessage(
        welcome=agent_pb2.Welcome(
            term=17,
            leader_id="coord-0",
            heartbeat_interval_ms=500,
            fence_after_ms=2000,
            dead_after_ms=3000,
        )
    )
    ack = agent_pb2.CoordinatorMessage(
        heartbeat_ack=agent_pb2.HeartbeatAck(
            seq=42, sent_at_unix_ms=1, sent_at_monotonic_ms=123_456, term=17
        )
    )
    revoke = agent_pb2.CoordinatorMessage(
        revoke=agent_pb2.Revoke(
            task_id="t-1", epoch=3, current_epoch=4, reason=agent_pb2.REVOKE_REASON_REASSIGNED
        )
    )
    not_leader = agent_pb2.CoordinatorMessage(not_leader=agent_pb2.NotLeader())
    for msg in (assign, welcome, ack, revoke, not_leader):
        parsed = _roundtrip(msg)
        assert parsed.WhichOneof("body") == msg.WhichOneof("body")
    assert _roundtrip(not_leader).not_leader.leader_address == ""


def test_task_record_and_event_roundtrip() -> None:
    task = records_pb2.TaskRecord(
        task_id="t-1",
        spec=_spec(),
        state=records_pb2.TASK_STATE_RUNNING,
        epoch=4,
        attempt=2,
        owner_node_id="node-b",
        owner_incarnation="9c1d",
        request_id="req-1",
        last_checkpoint=_summary(7),
        last_replicated_checkpoint=_summary(6),
        last_error=records_pb2.TaskError(
            code=records_pb2.TASK_ERROR_CODE_HANDLER_ERROR, message="boom", retryable=True
        ),
        move=records_pb2.TaskMove(move_id="m-1", reason=records_pb2.MOVE_REASON_MIGRATE),
        previous_owner_node_ids=["node-a"],
    )
    assert _roundtrip(task).spec.labels["team"] == "search"
    event = records_pb2.Event(
        revision=100,
        term=17,
        task_reassigned=records_pb2.TaskReassigned(
            task_id="t-1", from_node_id="node-a", to_node_id="node-b", epoch=4, resume_seq=6
        ),
    )
    assert _roundtrip(event).WhichOneof("body") == "task_reassigned"
    status = coordinator_pb2.GetClusterStatusResponse(
        leader_id="coord-0",
        term=17,
        nodes_by_state=[
            coordinator_pb2.NodeStateCount(state=records_pb2.NODE_STATE_ALIVE, count=3)
        ],
        tasks_by_state=[
            coordinator_pb2.TaskStateCount(state=records_pb2.TASK_STATE_RUNNING, count=300)
        ],
    )
    _roundtrip(status)
    req = coordinator_pb2.GetCheckpointRequest(task_id="t-1", seq=6)
    assert _roundtrip(req).WhichOneof("selector") == "seq"
    migrate = coordinator_pb2.MigrateTaskRequest(task_id="t-1")
    assert not _roundtrip(migrate).HasField("expected_epoch")


def test_stubs_expose_services() -> None:
    for module, service in (
        (agent_pb2_grpc, "AgentService"),
        (coordinator_pb2_grpc, "CoordinatorService"),
    ):
        assert callable(getattr(module, f"{service}Stub"))
        assert isinstance(getattr(module, f"{service}Servicer"), type)
        assert callable(getattr(module, f"add_{service}Servicer_to_server"))
    methods = {
        m.name for m in coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"].methods
    }
    assert methods >= {
        "SubmitTask",
        "GetTask",
        "ListTasks",
        "CancelTask",
        "ListNodes",
        "DrainNode",
        "MigrateTask",
        "GetClusterStatus",
        "WatchEvents",
        "GetCheckpoint",
        "ForkTask",
    }
    session = agent_pb2.DESCRIPTOR.services_by_name["AgentService"].methods_by_name["Session"]
    assert session.client_streaming
    assert session.server_streaming


# ---------------------------------------------------------------------------
# The stubs over a real in-process gRPC server.
# ---------------------------------------------------------------------------


class _Agent(agent_pb2_grpc.AgentServiceServicer):
    def Session(
        self, request_iterator: Iterator[agent_pb2.AgentMessage], context: grpc.ServicerContext
    ) -> Iterator[agent_pb2.CoordinatorMessage]:
        for msg in request_iterator:
            kind = msg.WhichOneof("body")
            if kind == "hello":
                yield agent_pb2.CoordinatorMessage(
                    welcome=agent_pb2.Welcome(term=7, heartbeat_interval_ms=500, dead_after_ms=3000)
                )
            elif kind == "heartbeat":
                yield agent_pb2.CoordinatorMessage(
                    heartbeat_ack=agent_pb2.HeartbeatAck(
                        seq=msg.heartbeat.seq,
                        sent_at_monotonic_ms=msg.heartbeat.sent_at_monotonic_ms,
                    )
                )
            else:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unexpected {kind}")


class _Coordinator(coordinator_pb2_grpc.CoordinatorServiceServicer):
    def GetClusterStatus(
        self, request: coordinator_pb2.GetClusterStatusRequest, context: grpc.ServicerContext
    ) -> coordinator_pb2.GetClusterStatusResponse:
        return coordinator_pb2.GetClusterStatusResponse(leader_id="coord-0", term=7)


def test_stubs_serve_over_grpc() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    agent_pb2_grpc.add_AgentServiceServicer_to_server(_Agent(), server)
    coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server(_Coordinator(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            status = coordinator_pb2_grpc.CoordinatorServiceStub(channel).GetClusterStatus(
                coordinator_pb2.GetClusterStatusRequest(), timeout=10
            )
            assert (status.leader_id, status.term) == ("coord-0", 7)
            up = [
                agent_pb2.AgentMessage(hello=agent_pb2.Hello(node_id="node-a", incarnation="1")),
                agent_pb2.AgentMessage(
                    heartbeat=agent_pb2.Heartbeat(seq=1, sent_at_monotonic_ms=55)
                ),
            ]
            down = list(agent_pb2_grpc.AgentServiceStub(channel).Session(iter(up), timeout=10))
            assert [m.WhichOneof("body") for m in down] == ["welcome", "heartbeat_ack"]
            assert down[1].heartbeat_ack.sent_at_monotonic_ms == 55
            # Unimplemented RPCs answer UNIMPLEMENTED, not a crash.
            with pytest.raises(grpc.RpcError) as err:
                coordinator_pb2_grpc.CoordinatorServiceStub(channel).GetTask(
                    coordinator_pb2.GetTaskRequest(task_id="t-1"), timeout=10
                )
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        server.stop(grace=None)
