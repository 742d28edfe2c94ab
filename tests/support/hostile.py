"""Messages of the protocol as a peer that means harm (or is broken) sends them: hypothesis
strategies that take a well-formed body and mutate it (non-finite numbers, huge or negative
integers, deep nesting, huge strings and lists, wrong types, missing and extra fields), the
JSON texts no sender of the package writes, and a check that a decoded value is what its
type says (every ``int`` an integer, every ``float`` finite, every name a string)."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

from hypothesis import strategies as st


class Nested(list[Any]):
    """A list nested ``depth`` deep that prints as ``nested(depth)``: hypothesis's printer
    walks what a test drew recursively and, at 5000 levels, failed the test with a
    ``RecursionError`` of its own (seen in clean-clone runs)."""

    def __init__(self, depth: int) -> None:
        inner: list[Any] = []
        for _ in range(depth - 1):
            inner = [inner]
        super().__init__([inner] if depth > 0 else [])
        self.depth = depth

    def __repr__(self) -> str:
        return f"nested({self.depth})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


def nested(depth: int) -> list[Any]:
    """A list nested ``depth`` deep (built without recursion; printed short)."""
    return Nested(depth)


#: Values no field of the protocol accepts, or accepts only by luck of its range.
HOSTILE: tuple[Any, ...] = (
    math.nan,
    math.inf,
    -math.inf,
    1e308,
    -1e308,
    1 << 63,
    -(1 << 63) - 1,
    1 << 64,
    10**30,
    10**400,
    -1,
    -(1 << 31),
    1 << 31,
    (1 << 53) + 1,
    0,
    1.5,
    True,
    False,
    None,
    "",
    "12",
    "NaN",
    "Infinity",
    "1e999",
    "x" * 70_000,
    [],
    [1, 2],
    [0] * 70_000,
    {},
    {"a": 1},
    nested(60),
    nested(5_000),
)

hostile_values: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from(HOSTILE),
    st.integers(),
    st.floats(),
    st.text(max_size=12),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=4),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=3),
)


def _places(value: Any) -> list[tuple[tuple[Any, ...], Any]]:
    """Every place in ``value`` (object keys, list indexes, outermost first) with the
    container that holds it."""
    out: list[tuple[tuple[Any, ...], Any]] = []
    stack: list[tuple[tuple[Any, ...], Any]] = [((), value)]
    while stack:
        prefix, container = stack.pop()
        keys = list(container) if isinstance(container, dict) else range(len(container))
        for key in keys:
            out.append(((*prefix, key), container))
            item = container[key]
            if isinstance(item, dict | list):
                stack.append(((*prefix, key), item))
    return out


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


@st.composite
def mutated(draw: st.DrawFn, body: Mapping[str, Any]) -> Any:
    """``body`` with one to three mutations: a value somewhere in it replaced by a hostile
    one, a field removed, a field added; or the whole body replaced. Only the body's own
    containers are changed (never a hostile value put in it)."""
    if draw(st.integers(0, 19)) == 0:
        return draw(hostile_values)
    out = _copy(dict(body))
    places = _places(out)
    owned = {id(container) for _, container in places} | {id(out)}
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(("set", "set", "set", "delete", "add")))
        if not places or action == "add":
            key = draw(st.sampled_from(("extra", "pid", "rank", "ranks", "at")))
            out[key] = draw(hostile_values)
            continue
        path, container = draw(st.sampled_from(places))
        key = path[-1]
        alive = id(container) in owned and (
            key in container if isinstance(container, dict) else key < len(container)
        )
        if not alive:
            continue  # a place a former mutation removed
        if action == "delete":
            if isinstance(container, dict):
                del container[key]
            else:
                container.pop(key)
        else:
            old = container[key]
            container[key] = draw(hostile_values)
            if isinstance(old, dict | list):
                owned.discard(id(old))  # its places are gone with it
    return out


def json_text(value: Any) -> bytes | None:
    """``value`` as JSON text as Python writes it (``NaN``, ``Infinity`` included); None for
    a value too deep to write."""
    try:
        return json.dumps(value).encode()
    except (RecursionError, ValueError):
        return None


#: JSON texts no sender of the package writes, each of which a reader must refuse.
BAD_TEXTS: tuple[bytes, ...] = (
    b'{"at": NaN}',
    b'{"at": Infinity}',
    b'{"at": -Infinity}',
    b'{"at": 1e999}',
    b'{"at": -1e999}',
    b'{"pid": 99999999999999999999}',
    b'{"pid": -99999999999999999999}',
    b'{"pid": ' + b"9" * 5000 + b"}",
    b'{"ranks": ' + b"[" * 100 + b"]" * 100 + b"}",
    b'{"ranks": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b"[1, 2]",
    b'"a string"',
    b"17",
    b"null",
    b"{",
    b"\xff\xfe not json",
    b'{"a": "\xed\xa0\x80"}',
)


def _check(value: Any, hint: Any, where: str) -> None:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        errors = []
        for option in typing.get_args(hint):
            try:
                _check(value, option, where)
                return
            except AssertionError as exc:
                errors.append(str(exc))
        raise AssertionError(f"{where}={value!r:.80} is none of {hint}: {errors}")
    if hint is type(None):
        assert value is None, f"{where}={value!r:.80} is not None"
    elif hint is bool:
        assert isinstance(value, bool), f"{where}={value!r:.80} is not a bool"
    elif hint is int:
        assert isinstance(value, int) and not isinstance(value, bool), f"{where} not an int"
        assert -(1 << 63) <= value < 1 << 63, f"{where}={value} out of 64 bits"
    elif hint is float:
        assert isinstance(value, float), f"{where}={value!r:.80} is not a float"
        assert math.isfinite(value), f"{where}={value} is not finite"
    elif hint is str:
        assert isinstance(value, str), f"{where}={value!r:.80} is not a string"
    elif origin is tuple:
        assert isinstance(value, tuple), f"{where}={value!r:.80} is not a tuple"
        (item, _) = typing.get_args(hint)
        for i, v in enumerate(value):
            _check(v, item, f"{where}[{i}]")
    elif origin in (Mapping, dict, typing.get_origin(Mapping[int, int])):
        assert isinstance(value, Mapping), f"{where}={value!r:.80} is not a mapping"
        k_hint, v_hint = typing.get_args(hint)
        for k, v in value.items():
            _check(k, k_hint, f"{where} key")
            _check(v, v_hint, f"{where}[{k!r}]")
    elif isinstance(hint, type) and issubclass(hint, enum.Enum):
        assert isinstance(value, hint), f"{where}={value!r:.80} is not a {hint.__name__}"
    elif isinstance(hint, type) and dataclasses.is_dataclass(hint):
        assert isinstance(value, hint), f"{where}={value!r:.80} is not a {hint.__name__}"
        well_formed(value, where)
    else:
        raise AssertionError(f"{where}: no check for {hint}")


def well_formed(value: Any, where: str = "") -> None:
    """Every field of the dataclass ``value`` (and of those in it) holds what its type says;
    an ``AssertionError`` names the first that does not."""
    assert dataclasses.is_dataclass(value) and not isinstance(value, type), value
    hints = typing.get_type_hints(type(value))
    for f in dataclasses.fields(value):
        _check(getattr(value, f.name), hints[f.name], f"{where}{type(value).__name__}.{f.name}")
