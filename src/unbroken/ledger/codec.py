"""Events to JSON objects and back.

Encoding is :func:`dataclasses.asdict` made JSON-ready: enums become their values, tuples and
sets become lists, paths become strings, nested dataclasses become objects. Decoding reads the
event class's type hints and rebuilds the exact values (tuples, enums, nested dataclasses), so
``decode(encode(e)) == e``. Fields a newer writer added are ignored; a missing field without a
default, or a value of the wrong type, is an error naming the kind and the field.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from enum import Enum
from pathlib import PurePath
from typing import Any, TypeVar

from unbroken.ledger.events import EVENT_TYPES, Event

T = TypeVar("T")


class DecodeError(ValueError):
    """A stored record does not match its event class."""


_PLAIN = frozenset({str, int, float, bool, type(None)})


def to_json_value(value: Any) -> Any:
    """Return ``value`` as plain JSON types (dict, list, str, int, float, bool, None)."""
    if type(value) in _PLAIN:  # the common case first (a 10k-node status has 100k numbers)
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json_value(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return to_json_value(value.value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, Mapping):
        return {str(k): to_json_value(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [to_json_value(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((to_json_value(v) for v in value), key=repr)
    if isinstance(value, PurePath):
        return str(value)
    raise TypeError(f"{type(value).__name__} value {value!r} cannot be written to the ledger")


def encode(event: Event) -> dict[str, Any]:
    """The event's fields as a JSON object (without its kind)."""
    data = to_json_value(event)
    assert isinstance(data, dict)
    return data


def decode(kind: str, data: Mapping[str, Any]) -> Event | None:
    """The event of a stored record, or None when ``kind`` is not a known event class."""
    cls = EVENT_TYPES.get(kind)
    if cls is None:
        return None
    try:
        event = _build(cls, data)
    except (TypeError, ValueError) as exc:
        raise DecodeError(f"{kind} record: {exc}") from None
    assert isinstance(event, Event)
    return event


def from_data(cls: type[T], data: Mapping[str, Any]) -> T:
    """Rebuild a dataclass of type ``cls`` from its JSON object (see the module doc)."""
    try:
        built: T = _build(cls, data)
    except (TypeError, ValueError) as exc:
        raise DecodeError(f"{cls.__name__}: {exc}") from None
    return built


def _build(cls: type[Any], data: Any) -> Any:
    if not isinstance(data, Mapping):
        raise TypeError(f"expected an object for {cls.__name__}, got {data!r}")
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise TypeError(f"field {f.name!r} is missing")
            continue
        try:
            kwargs[f.name] = _convert(hints[f.name], data[f.name])
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"field {f.name!r}: {exc}") from None
    return cls(**kwargs)


def _convert(hint: Any, value: Any) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value)
            except (TypeError, ValueError) as exc:
                errors.append(str(exc))
        raise TypeError("; ".join(errors) or f"unexpected {value!r}")
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise TypeError(f"expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v) for v in value)
        if len(args) != len(value):
            raise TypeError(f"expected {len(args)} items, got {value!r}")
        return tuple(_convert(a, v) for a, v in zip(args, value, strict=True))
    if origin in (dict, Mapping, typing.Mapping):
        if not isinstance(value, Mapping):
            raise TypeError(f"expected an object, got {value!r}")
        key_t, val_t = args or (Any, Any)
        return {_convert(key_t, k): _convert(val_t, v) for k, v in value.items()}
    if origin in (frozenset, set):
        if not isinstance(value, list):
            raise TypeError(f"expected a list, got {value!r}")
        return origin(_convert(args[0], v) for v in value)
    if isinstance(hint, type):
        return _convert_plain(hint, value)
    raise TypeError(f"cannot read a value of type {hint!r}")


def _convert_plain(hint: type[Any], value: Any) -> Any:
    if issubclass(hint, Enum):
        return hint(value)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value)
    if hint is bool:
        if not isinstance(value, bool):
            raise TypeError(f"expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise TypeError(f"expected a string, got {value!r}")
        return value
    if issubclass(hint, PurePath):
        if not isinstance(value, str):
            raise TypeError(f"expected a path, got {value!r}")
        return hint(value)
    raise TypeError(f"cannot read a value of type {hint.__name__}")
