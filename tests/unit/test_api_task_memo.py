"""coordinator.api._TaskMemo: ListTasks reuses decoded and encoded records only while unchanged."""

from __future__ import annotations

from coordinator import convert
from coordinator.api import _TaskMemo
from coordinator.core.records import TaskState
from lazarus.v1 import records_pb2


def _value(task_id: str, state: int, epoch: int) -> bytes:
    return records_pb2.TaskRecord(task_id=task_id, state=state, epoch=epoch).SerializeToString()


def test_a_changed_value_is_decoded_again_and_an_unchanged_one_is_reused() -> None:
    memo = _TaskMemo()
    first = _value("t1", records_pb2.TASK_STATE_PENDING, 0)
    a = memo.decode("t1", first)
    assert memo.decode("t1", first) is a
    assert memo.decode("t1", bytes(bytearray(first))) is a  # equal bytes, other object
    changed = _value("t1", records_pb2.TASK_STATE_RUNNING, 2)
    b = memo.decode("t1", changed)
    assert b is not a
    assert (b.state, b.epoch) == (TaskState.RUNNING, 2)


def test_encode_follows_the_record_object_and_equals_convert() -> None:
    memo = _TaskMemo()
    a = memo.decode("t1", _value("t1", records_pb2.TASK_STATE_PENDING, 0))
    message = memo.encode(a)
    assert message == convert.task_record_to_pb(a)
    assert memo.encode(a) is message
    b = memo.decode("t1", _value("t1", records_pb2.TASK_STATE_RUNNING, 3))
    assert memo.encode(b).epoch == 3


def test_prune_forgets_deleted_tasks() -> None:
    memo = _TaskMemo()
    values = {f"t{i}": _value(f"t{i}", records_pb2.TASK_STATE_PENDING, 0) for i in range(200)}
    records = {name: memo.decode(name, v) for name, v in values.items()}
    for record in records.values():
        memo.encode(record)
    live = {"t1": values["t1"]}
    memo.prune(live)
    assert memo.decode("t1", values["t1"]) is records["t1"]
    assert memo.decode("t2", values["t2"]) is not records["t2"]  # forgotten, decoded anew
