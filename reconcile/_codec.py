"""Shared validation and JSON codec helpers for ``reconcile`` (internal).

Two kinds of error, as in h11: a caller that misuses the API gets
``TypeError`` / ``ValueError`` from the ``check_*`` helpers; bytes from a peer
that do not parse get ``ValueError`` from :func:`loads` and the ``want_*``
helpers, never anything else. Both map to gRPC INVALID_ARGUMENT.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from .vclock import MAX_COUNTER, MAX_REPLICA_ID_BYTES, VectorClock, check_replica_id

MAX_VALUE_DEPTH = 32

# A JSON value as this package stores it: None, bool, int, finite float, str,
# list of values, dict of str -> value. Tuples are refused: they would come
# back as lists and break round-trips.
JsonValue = Any


def check_value(value: object, field: str, depth: int = 0) -> JsonValue:
    """Validate a stored value (see ``JsonValue``); return it unchanged.

    Raises:
        TypeError: a type JSON cannot round-trip, or a non-str dict key.
        ValueError: NaN / infinity, or nesting deeper than 32.
    """
    if depth > MAX_VALUE_DEPTH:
        raise ValueError(f"{field} nests deeper than {MAX_VALUE_DEPTH} levels")
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is str:
        return value
    if isinstance(value, float) and kind is float:
        if not math.isfinite(value):
            raise ValueError(f"{field} must be a finite float, got {value!r}")
        return value
    if isinstance(value, list) and kind is list:
        for index, item in enumerate(value):
            check_value(item, f"{field}[{index}]", depth + 1)
        return value
    if isinstance(value, dict) and kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise TypeError(f"{field} keys must be str, got {type(key).__name__}")
            check_value(item, f"{field}[{key!r}]", depth + 1)
        return value
    raise TypeError(
        f"{field} must be None, bool, int, float, str, list or dict (JSON), got {kind.__name__}"
    )


def check_key(key: object, field: str = "key") -> str:
    """A map key: any ``str``. Raises TypeError otherwise."""
    if type(key) is not str:
        raise TypeError(f"{field} must be str, got {type(key).__name__}")
    return key


def check_member(member: object, field: str = "member") -> str | int:
    """A set member: ``str`` or ``int`` (not bool, which would alias 0 / 1)."""
    if isinstance(member, str | int) and type(member) is not bool:
        return member
    raise TypeError(f"{field} must be str or int, got {type(member).__name__}")


def check_positive(amount: object, field: str = "amount") -> int:
    """An int in 1 .. 2**64-1."""
    if type(amount) is not int:
        raise TypeError(f"{field} must be int, got {type(amount).__name__}")
    if amount < 1 or amount > MAX_COUNTER:
        raise ValueError(f"{field} must be in 1..2**64-1, got {amount}")
    return amount


def dumps(obj: object) -> bytes:
    """Compact, key-sorted UTF-8 JSON (deterministic for equal inputs)."""
    return json.dumps(obj, separators=(",", ":"), sort_keys=True, allow_nan=False).encode("utf-8")


def _refuse_constant(name: str) -> object:
    raise ValueError(f"JSON constant {name} is not allowed")


def loads(data: object, what: str) -> Any:
    """Parse UTF-8 JSON from ``data``; any failure is a ``ValueError`` naming ``what``.

    Raises:
        TypeError: ``data`` is not bytes.
        ValueError: not UTF-8, not JSON, NaN / Infinity, or nested too deep.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"data must be bytes, got {type(data).__name__}")
    try:
        text = bytes(data).decode("utf-8")
        return json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError(f"{what}: JSON nested too deeply") from None
    except ValueError as exc:
        raise ValueError(f"{what}: not valid UTF-8 JSON ({exc})") from None


# ---- readers for parsed JSON (peer data: every failure is ValueError) ----------


def want_dict(obj: object, field: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise ValueError(f"{field} must be a JSON object")
    return obj


def want_list(obj: object, field: str, length: int | None = None) -> list[Any]:
    if not isinstance(obj, list):
        raise ValueError(f"{field} must be a JSON array")
    if length is not None and len(obj) != length:
        raise ValueError(f"{field} must have {length} elements")
    return obj


def want_int(obj: object, field: str, minimum: int = 0) -> int:
    if not isinstance(obj, int) or isinstance(obj, bool) or not minimum <= obj <= MAX_COUNTER:
        raise ValueError(f"{field} must be an integer in {minimum}..2**64-1")
    return obj


def want_bool(obj: object, field: str) -> bool:
    if not isinstance(obj, bool):
        raise ValueError(f"{field} must be true or false")
    return obj


def want_str(obj: object, field: str) -> str:
    if not isinstance(obj, str):
        raise ValueError(f"{field} must be a string")
    return obj


def want_replica(obj: object, field: str) -> str:
    try:
        return check_replica_id(obj, field)
    except TypeError as exc:
        raise ValueError(str(exc)) from None


def want_member(obj: object, field: str) -> str | int:
    try:
        return check_member(obj, field)
    except TypeError as exc:
        raise ValueError(str(exc)) from None


def want_value(obj: object, field: str) -> JsonValue:
    try:
        return check_value(obj, field)
    except TypeError as exc:
        raise ValueError(str(exc)) from None


def want_clock(obj: object, field: str) -> VectorClock:
    """A vector clock written as ``{replica_id: counter}`` (counters >= 1)."""
    mapping = want_dict(obj, field)
    counters: dict[str, int] = {}
    for key, value in mapping.items():
        want_replica(key, f"{field} key")
        counters[key] = want_int(value, f"{field}[{key!r}]", minimum=1)
    return VectorClock._trusted(counters)


def clock_json(clock: VectorClock | Mapping[str, int]) -> dict[str, int]:
    """``{replica_id: counter}`` for a clock (sorted keys, zeros dropped)."""
    if isinstance(clock, VectorClock):
        return clock.as_dict()
    return {k: clock[k] for k in sorted(clock) if clock[k]}


__all__ = [
    "MAX_REPLICA_ID_BYTES",
    "JsonValue",
    "check_key",
    "check_member",
    "check_positive",
    "check_value",
    "clock_json",
    "dumps",
    "loads",
    "want_bool",
    "want_clock",
    "want_dict",
    "want_int",
    "want_list",
    "want_member",
    "want_replica",
    "want_str",
    "want_value",
]
