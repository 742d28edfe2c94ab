"""State dicts as JSON plus a list of tensors: what replicas send each other and what
checkpoints hold of the script's own state, without pickling anything.

:func:`encode` turns a ``state_dict()`` (nested dicts, lists, tuples, tensors, numbers,
strings, booleans, None) into a JSON value in which every tensor is replaced by its index in a
list; :func:`decode` reverses it. Dict keys keep their type (``str`` or ``int``: optimizer and
scheduler state dicts key by index). Anything else (a function, an arbitrary object) cannot be
encoded and raises :class:`StateCodecError` naming where it sits, so a script learns at
``unbroken.worker.init`` that a registered object's state cannot travel, not at the first fault.
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch

FORMAT = 1


class StateCodecError(ValueError):
    """A value that cannot be encoded, or an encoding that cannot be decoded."""


def encode(value: Any, tensors: list[torch.Tensor], where: str = "state") -> Any:
    """A JSON value for ``value``; tensors go to ``tensors`` and are referenced by index."""
    if isinstance(value, torch.Tensor):
        tensors.append(value.detach())
        return {"t": len(tensors) - 1}
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"f": repr(value)}
    if isinstance(value, tuple):
        return {"tuple": [encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        items = []
        for key, item in value.items():
            if not isinstance(key, str | int) or isinstance(key, bool):
                raise StateCodecError(f"{where} has a key of type {type(key).__name__}")
            items.append([key, encode(item, tensors, f"{where}[{key!r}]")])
        return {"dict": items}
    raise StateCodecError(
        f"{where} holds a {type(value).__name__}, which cannot be sent or checkpointed "
        "(state dicts may hold tensors, numbers, strings, None, lists, tuples and dicts)"
    )


def decode(value: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(value, list):
        return [decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if "t" in value:
        return tensors[int(value["t"])]
    if "f" in value:
        return float(value["f"])
    if "tuple" in value:
        return tuple(decode(v, tensors) for v in value["tuple"])
    if "dict" in value:
        return {key: decode(item, tensors) for key, item in value["dict"]}
    raise StateCodecError(f"unknown encoded value {sorted(value)}")


def to_tensor(value: Any) -> torch.Tensor:
    """A JSON value as a uint8 tensor (a checkpoint entry, a broadcast payload)."""
    data = json.dumps({"format": FORMAT, "value": value}, separators=(",", ":")).encode()
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def from_tensor(tensor: torch.Tensor) -> Any:
    try:
        data = json.loads(tensor.numpy().tobytes().decode())
    except (UnicodeDecodeError, ValueError) as e:
        raise StateCodecError(f"unreadable encoded state: {e}") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise StateCodecError(f"encoded state of an unknown format, this version reads {FORMAT}")
    return data["value"]


def pack(value: Any, where: str = "state") -> dict[str, torch.Tensor]:
    """``value`` as flat named tensors for a checkpoint: ``json`` and ``t0``, ``t1``, ..."""
    tensors: list[torch.Tensor] = []
    packed = {"json": to_tensor(encode(value, tensors, where))}
    packed.update({f"t{i}": t.contiguous() for i, t in enumerate(tensors)})
    return packed


def unpack(packed: dict[str, torch.Tensor]) -> Any:
    """The value :func:`pack` packed."""
    if "json" not in packed:
        raise StateCodecError("packed state has no json entry")
    count = len(packed) - 1
    try:
        tensors = [packed[f"t{i}"] for i in range(count)]
    except KeyError as e:
        raise StateCodecError(f"packed state misses tensor {e}") from None
    return decode(from_tensor(packed["json"]), tensors)


def tensor_paths(value: Any, path: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], int]:
    """Where each tensor of an :func:`encode`-d value sits (``path`` and the keys and indices
    down to it) and its index in the tensor list."""
    out: dict[tuple[Any, ...], int] = {}
    if isinstance(value, list):
        for i, item in enumerate(value):
            out.update(tensor_paths(item, (*path, i)))
    elif isinstance(value, dict):
        if "t" in value:
            out[path] = int(value["t"])
        elif "tuple" in value:
            out.update(tensor_paths(value["tuple"], (*path, "tuple")))
        elif "dict" in value:
            for key, item in value["dict"]:
                out.update(tensor_paths(item, (*path, key)))
    return out
