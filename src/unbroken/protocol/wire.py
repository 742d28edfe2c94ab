"""The wire's one JSON reader, and the checked readers of a message's fields.

Every JSON message of the protocol (the control plane's calls and their answers, the agents'
orders, a rank's mailbox command, exit report and stress result) is read by :func:`loads`,
which refuses what no sender of this package writes: the constants ``NaN``, ``Infinity`` and
``-Infinity``, a number that overflows to infinity (``1e999``), an integer out of the signed
64-bit range, values nested deeper than :data:`MAX_DEPTH`, more than :data:`MAX_MESSAGE_BYTES`
bytes, and anything but an object at the top. A message's fields are then read with the
readers below, each of one type and range (a pid, a rank, a step, a port, a wall stamp), so a
decoded message holds values its receiver can act on: an ``int`` is never a ``bool``, a float
is finite, a pid is a process (never 0 or -1, which ``kill`` reads as a group or everyone).

What is refused raises :class:`ProtocolError` (a ``ValueError``) naming the message and the
field, so a receiver logs one line and goes on. Standard library only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Final

JsonObj = dict[str, Any]


class ProtocolError(ValueError):
    """A message that is not what this protocol says it must be."""


#: gRPC's own limit on a received message (``grpc.max_receive_message_length``'s default): no
#: message of the protocol comes near it (a heartbeat of 8 ranks is about 2 KiB).
MAX_MESSAGE_BYTES: Final = 4 << 20
#: The deepest nesting of objects and lists in a message: the deepest message (a heartbeat's
#: rows, a stress result's links) nests three.
MAX_DEPTH: Final = 16
#: Integers on the wire fit the heartbeat file's signed 64-bit fields.
INT64_MAX: Final = (1 << 63) - 1
INT64_MIN: Final = -(1 << 63)
#: A process id: ``pid_t``'s range (Linux gives at most 2**22; a simulated agent of the load
#: harness takes one above, never a process); 0 where a report says "not known yet".
PID_MAX: Final = (1 << 31) - 1
#: Ranks, node ranks and the number of processes of a node.
RANK_MAX: Final = (1 << 24) - 1
#: A generation (one per restart or rejoin of a job), a stress test's round.
GENERATION_MAX: Final = (1 << 31) - 1
#: Steps and step counters (exact as a JSON number whatever reads it).
STEP_MAX: Final = 1 << 53
#: A device's index on its node.
DEVICE_MAX: Final = (1 << 16) - 1
PORT_MAX: Final = 65535
#: Wall stamps (seconds since the epoch; 0.0: not yet) and durations, in seconds: the year
#: 5138, far from where a date or a timeout overflows.
TIME_MAX: Final = 1e11
#: Names (pods, nodes, planes, signals, exception classes) and free text (a traceback's tail,
#: an error message), in characters.
NAME_MAX: Final = 1024
TEXT_MAX: Final = 64 * 1024
#: Items of one list or object field (ranks of a pod, planes of a host).
ITEMS_MAX: Final = 1 << 16

_MISSING: Any = object()


def _no_constant(name: str) -> Any:
    raise ProtocolError(f"{name} is not a number this protocol accepts")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ProtocolError(f"number {text[:40]} overflows a double")
    return value


def _int64(text: str) -> int:
    # Checked on the text first: int() of thousands of digits is slow before it refuses.
    if len(text.lstrip("-")) > 19 or not INT64_MIN <= (value := int(text)) <= INT64_MAX:
        raise ProtocolError(f"integer {text[:40]} is out of the signed 64-bit range")
    return value


def _depth_ok(obj: Any) -> bool:
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            return False
        items = value.values() if isinstance(value, dict) else value
        stack.extend((v, depth + 1) for v in items if isinstance(v, dict | list))
    return True


def parse(data: bytes | str, what: str = "message") -> Any:
    """The JSON value of ``data``, or :class:`ProtocolError` saying why it is not one this
    protocol accepts (``what`` names it)."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"{what} is {len(data)} bytes, more than {MAX_MESSAGE_BYTES}")
    try:
        value = json.loads(
            data.decode() if isinstance(data, bytes) else data,  # UTF-8, nothing else
            parse_constant=_no_constant,
            parse_float=_finite,
            parse_int=_int64,
        )
    except ProtocolError as exc:
        raise ProtocolError(f"{what}: {exc}") from None
    except RecursionError:
        raise ProtocolError(f"{what} nests deeper than {MAX_DEPTH}") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ProtocolError(f"{what} is not JSON: {exc}") from None
    if isinstance(value, dict | list) and not _depth_ok(value):
        raise ProtocolError(f"{what} nests deeper than {MAX_DEPTH}")
    return value


def loads(data: bytes | str, what: str = "message") -> JsonObj:
    """The JSON object of ``data`` (:func:`parse`; anything but an object is refused)."""
    value = parse(data, what)
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} is {type(value).__name__}, not a JSON object")
    return value


def show(value: Any) -> str:
    """``value`` for an error message: short whatever it is (never the repr of a huge or
    deeply nested value)."""
    if isinstance(value, dict | list | tuple):
        return f"<{type(value).__name__} of {len(value)}>"
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:40] + "...")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 1 << 64:
        return "<an integer too large>"
    return repr(value)


def obj(value: Any, what: str) -> Mapping[str, Any]:
    """``value`` as a JSON object (``what`` names it)."""
    if not isinstance(value, Mapping):
        raise ProtocolError(f"{what} is {show(value)}, not an object")
    return value


def _value(body: Mapping[str, Any], key: str, what: str, default: Any) -> Any:
    if key in body:
        return body[key]
    if default is _MISSING:
        raise ProtocolError(f"{what} has no field {key!r}")
    return default


def field(body: Mapping[str, Any], key: str, what: str) -> Any:
    """Field ``key`` of message ``what``, whatever it holds; it must be there."""
    return _value(body, key, what, _MISSING)


def _refused(what: str, key: str, value: Any, expected: str) -> ProtocolError:
    return ProtocolError(f"{what}: field {key}={show(value)} is not {expected}")


def integer(
    body: Mapping[str, Any],
    key: str,
    what: str,
    low: int,
    high: int,
    default: Any = _MISSING,
) -> int:
    """Field ``key`` of message ``what``: an integer in ``low..high`` (``default`` when
    missing; required without one)."""
    value = _value(body, key, what, default)
    if value is default and default is not _MISSING:
        return int(default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _refused(what, key, value, f"an integer in {low}..{high}")
    return value


def optional_integer(
    body: Mapping[str, Any], key: str, what: str, low: int, high: int
) -> int | None:
    """Field ``key``: an integer in ``low..high``, or None when missing or null."""
    return None if body.get(key) is None else integer(body, key, what, low, high)


def number(
    body: Mapping[str, Any],
    key: str,
    what: str,
    low: float = 0.0,
    high: float = TIME_MAX,
    default: Any = _MISSING,
) -> float:
    """Field ``key``: a finite number in ``low..high`` (a wall stamp or a duration unless
    told), as a float."""
    value = _value(body, key, what, default)
    if value is default and default is not _MISSING:
        return float(default)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not low <= value <= high  # NaN and the infinities are not (and no int overflows)
    ):
        raise _refused(what, key, value, f"a number in {low:g}..{high:g}")
    return float(value)


def text(
    body: Mapping[str, Any],
    key: str,
    what: str,
    limit: int = NAME_MAX,
    default: Any = _MISSING,
) -> str:
    """Field ``key``: a string of at most ``limit`` characters."""
    value = _value(body, key, what, default)
    if not isinstance(value, str) or len(value) > limit:
        raise _refused(what, key, value, f"a string of at most {limit} characters")
    return value


def optional_text(body: Mapping[str, Any], key: str, what: str, limit: int = NAME_MAX) -> str:
    """Field ``key``: a string, "" when missing or null."""
    return "" if body.get(key) is None else text(body, key, what, limit)


def flag(body: Mapping[str, Any], key: str, what: str, default: Any = _MISSING) -> bool:
    """Field ``key``: true or false."""
    value = _value(body, key, what, default)
    if not isinstance(value, bool):
        raise _refused(what, key, value, "true or false")
    return value


def listed(body: Mapping[str, Any], key: str, what: str, limit: int = ITEMS_MAX) -> list[Any]:
    """Field ``key``: a list of at most ``limit`` items (empty when missing or null)."""
    value = body.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > limit:
        raise _refused(what, key, value, f"a list of at most {limit} items")
    return value


def integers(body: Mapping[str, Any], key: str, what: str, low: int, high: int) -> tuple[int, ...]:
    """Field ``key``: a list of integers in ``low..high`` (empty when missing or null)."""
    values = listed(body, key, what)
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            raise _refused(what, key, v, f"a list of integers in {low}..{high}")
    return tuple(values)


def texts(body: Mapping[str, Any], key: str, what: str, limit: int = NAME_MAX) -> tuple[str, ...]:
    """Field ``key``: a list of strings of at most ``limit`` characters each."""
    values = listed(body, key, what)
    for v in values:
        if not isinstance(v, str) or len(v) > limit:
            raise _refused(what, key, v, f"a list of strings of at most {limit} characters")
    return tuple(values)


__all__ = [
    "DEVICE_MAX",
    "GENERATION_MAX",
    "INT64_MAX",
    "INT64_MIN",
    "ITEMS_MAX",
    "MAX_DEPTH",
    "MAX_MESSAGE_BYTES",
    "NAME_MAX",
    "PID_MAX",
    "PORT_MAX",
    "RANK_MAX",
    "STEP_MAX",
    "TEXT_MAX",
    "TIME_MAX",
    "JsonObj",
    "ProtocolError",
    "field",
    "flag",
    "integer",
    "integers",
    "listed",
    "loads",
    "number",
    "obj",
    "optional_integer",
    "optional_text",
    "parse",
    "show",
    "text",
    "texts",
]
