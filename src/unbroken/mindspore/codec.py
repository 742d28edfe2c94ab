"""What MindSpore ranks' all-reduces carry, encoded so that a sum leaves it exact.

MindSpore's CPU all-reduce sums float32 and float16 only. A corrupt rank's repair sends every
parameter as float32 (other dtypes byte by byte, one float32 per byte) to which every other
rank adds -0.0 (x + -0.0 = x for every float32, signed zeros included); the step each rank's
checkpoint reached travels at that rank's place, in two float32 halves that each hold it
exactly, zeros elsewhere; so do the first bytes of each rank's state digest, which the ranks
compare when they close.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

#: A step travels as two float32 halves (quotient and remainder by this), each exact.
_SPLIT = 1 << 20


def as_float32(data: Any) -> Any:
    """``data`` as a flat float32 array that a sum with -0.0 leaves exact."""
    import numpy as np

    if data.dtype in (np.float32, np.float16):
        return data.astype(np.float32).reshape(-1)
    return np.ascontiguousarray(data).view(np.uint8).astype(np.float32).reshape(-1)


def from_float32(flat: Any, like: Any) -> Any:
    """The inverse of :func:`as_float32`, shaped and typed as ``like``."""
    import numpy as np

    if like.dtype in (np.float32, np.float16):
        return flat.astype(like.dtype).reshape(like.shape)
    return flat.astype(np.uint8).view(like.dtype).reshape(like.shape)


def found_steps_sent(step: int | None, rank: int, world: int) -> Any:
    """What ``rank`` adds to the all-reduce that tells every rank the checkpoint step each one
    found (None: none): zeros but at its own places, the step + 1 in two float32 halves that
    each hold it exactly."""
    import numpy as np

    sent = np.zeros((2, world), np.float32)
    sent[:, rank] = divmod(0 if step is None else step + 1, _SPLIT)
    return sent.reshape(-1)


def found_steps_got(summed: Any) -> list[int | None]:
    """Every rank's found step, by rank, from the all-reduce's sum."""
    import numpy as np

    halves = summed.reshape(2, -1).astype(np.int64)
    both = (int(hi) * _SPLIT + int(lo) for hi, lo in zip(*halves, strict=True))
    return [n - 1 if n else None for n in both]


#: How much of a state digest the ranks compare: 8 bytes, as four 16-bit halves.
_DIGEST_HALVES = 4


def digest_sent(digest: bytes, rank: int, world: int) -> Any:
    """What ``rank`` adds to the all-reduce that shows every rank each rank's state digest:
    its first 8 bytes as four float32 numbers below 2**16 (each exact), zeros elsewhere."""
    import numpy as np

    sent = np.zeros((_DIGEST_HALVES, world), np.float32)
    sent[:, rank] = np.frombuffer(digest[: 2 * _DIGEST_HALVES], dtype="<u2")
    return sent.reshape(-1)


def digests_got(summed: Any) -> list[bytes]:
    """Every rank's 8 digest bytes, by rank, from the all-reduce's sum."""

    halves = summed.reshape(_DIGEST_HALVES, -1).astype("<u2")
    return [halves[:, r].tobytes() for r in range(halves.shape[1])]


def params_digest(params: Mapping[str, Any]) -> bytes:
    """sha256 over every parameter's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name, p in sorted(params.items()):
        data = p.asnumpy()
        h.update(f"{name}|{data.dtype}|{data.shape}|".encode())
        h.update(data.tobytes())
    return h.digest()


def replicas_apart(
    sums: Callable[[Any], Any], params: Mapping[str, Any], rank: int, world: int, most: int = 8
) -> tuple[list[int], list[str]] | None:
    """None when every rank's ``params`` are bitwise equal; else the ranks whose state differs
    from rank 0's and the names of the parameters that differ (at most ``most``). ``sums`` is
    the all-reduce (a sum over the ranks) of a float32 array; two calls, the second only when
    the states differ."""
    import numpy as np

    ordered = sorted(params.items())
    got = digests_got(sums(digest_sent(params_digest(params), rank, world)))
    ranks = [r for r, d in enumerate(got) if d != got[0]]
    if not ranks:
        return None
    sent = [
        digest_sent(hashlib.sha256(p.asnumpy().tobytes()).digest(), rank, world) for _, p in ordered
    ]
    each = sums(np.concatenate(sent)) if sent else np.zeros(0, np.float32)
    width = sent[0].size if sent else 0
    names = [
        name
        for i, (name, _) in enumerate(ordered)
        if len(set(digests_got(each[i * width : (i + 1) * width]))) > 1
    ]
    return ranks, names[:most] + ([f"{len(names) - most} more"] if len(names) > most else [])
