"""Online stress tests: what a rank measures and how it says so, for both ends.

A stress test runs while every rank of the job stands at a step boundary, out of its training
process group (see :mod:`unbroken.manager.stress`). Each rank then runs two checks, as the
seed's online stress test does (its ``aic`` and ``p2p`` operations):

- **device** (``aic``): a fixed-seed matrix product on the rank's device, reduced to a
  checksum and compared bit for bit with the checksum the same rank computed at its start
  (:data:`DEVICE_SEED`, :data:`DEVICE_SIZE`). A device that computes wrong (silent data
  corruption) gives another checksum;
- **link** (``p2p``): ranks paired as DLRover's node check pairs them (:func:`link_rounds`),
  each pair sending a buffer of :data:`LINK_BYTES` there and back over a process group built
  for the test; the rank reports the bandwidth of each of its links in GB/s.

Each rank writes its :class:`RankStressResult` (JSON, :func:`encode_result`) under
:func:`result_key` in the stress test's store; the manager reads them there. The result codes
are the seed's (``StressTestOpResult.code``), :class:`StressCode`. Standard library only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Any

from unbroken.protocol.wire import (
    RANK_MAX,
    TEXT_MAX,
    ProtocolError,
    integer,
    listed,
    loads,
    number,
    obj,
    optional_text,
    text,
)

#: The seed and the size of the device check's matrices (the same on every rank and every run).
DEVICE_SEED = 20240607
DEVICE_SIZE = 96
#: The bytes each link check sends each way.
LINK_BYTES = 4 << 20
#: The store prefix of a stress test's process group and results.
STORE_PREFIX = "stress"
#: A link's bandwidth as a rank may report it, GB/s.
_GBPS_MAX = 1e9


class StressCode(IntEnum):
    """The seed's stress test result codes (``StressTestOpResult.code``)."""

    OK = 0  # succeeded, no fault
    FAILED = 1  # the test failed, but training can resume
    FAULT = 2  # a fault was found: isolate the device or node
    TIMEOUT = 3  # the test timed out: the job must be restarted
    VOLTAGE = 4  # the voltage was not restored: the job must be restarted (never here)

    @property
    def meaning(self) -> str:
        return _MEANINGS[self]


_MEANINGS = {
    StressCode.OK: "no fault",
    StressCode.FAILED: "failed, training can resume",
    StressCode.FAULT: "fault found, isolate",
    StressCode.TIMEOUT: "timed out",
    StressCode.VOLTAGE: "voltage not restored",
}


class StressOp(StrEnum):
    """The two checks, with the seed's names (its keys: 0 for ``aic``, 1 for ``p2p``)."""

    DEVICE = "aic"
    LINK = "p2p"


@dataclass(frozen=True)
class LinkMeasure:
    """One link as one of its ends measured it: ``gbps`` over ``seconds`` for the round trip;
    ``error``: why it could not be measured (then ``gbps`` is 0)."""

    peer: int
    gbps: float
    seconds: float
    error: str = ""


@dataclass(frozen=True)
class RankStressResult:
    """What one rank found. ``checksum``/``expected``: the device check's checksum now and at
    the rank's start (hex of the float's bits); ``device_code``: the rank's own verdict on its
    device; ``error``: why a check could not run at all."""

    rank: int
    device_code: StressCode
    checksum: str
    expected: str
    device_s: float
    links: tuple[LinkMeasure, ...] = ()
    error: str = ""


def link_rounds(world_size: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Pairs of ranks for the link check, round by round (no rank twice in a round).

    As DLRover's node check pairs nodes: first neighbours ``(0, 1), (2, 3), ...``, then the
    pairs shifted by one ``(1, 2), (3, 4), ..., (w-1, 0)``, so every rank is measured on two
    links with two different peers and a slow *rank* (both its links slow) can be told from a
    slow *link* (one). With an odd world size the ring's last link gets a round of its own;
    two ranks have one link.
    """
    if world_size < 2:
        return ()
    if world_size == 2:
        return (((0, 1),),)
    edges = [(i, (i + 1) % world_size) for i in range(world_size)]
    rounds: list[list[tuple[int, int]]] = []
    for a, b in edges:
        for r in rounds:
            if all(a not in p and b not in p for p in r):
                r.append((a, b))
                break
        else:
            rounds.append([(a, b)])
    return tuple(tuple(sorted((min(p), max(p)) for p in r)) for r in rounds)


def result_key(round_: int, rank: int) -> str:
    return f"{STORE_PREFIX}{round_}/result/{rank}"


def group_prefix(round_: int) -> str:
    return f"{STORE_PREFIX}{round_}/pg"


class StressProtocolError(ProtocolError):
    """A stress result that is not what this module says it must be."""


def encode_result(result: RankStressResult) -> bytes:
    return json.dumps(
        {
            "rank": result.rank,
            "device_code": int(result.device_code),
            "checksum": result.checksum,
            "expected": result.expected,
            "device_s": result.device_s,
            "links": [
                {"peer": m.peer, "gbps": m.gbps, "seconds": m.seconds, "error": m.error}
                for m in result.links
            ],
            "error": result.error,
        },
        sort_keys=True,
    ).encode()


_WHAT = "stress result"


def _link(value: Any) -> LinkMeasure:
    m = obj(value, f"{_WHAT} link")
    return LinkMeasure(
        peer=integer(m, "peer", _WHAT, 0, RANK_MAX),
        gbps=number(m, "gbps", _WHAT, high=_GBPS_MAX),
        seconds=number(m, "seconds", _WHAT),
        error=optional_text(m, "error", _WHAT, TEXT_MAX),
    )


def decode_result(raw: bytes) -> RankStressResult:
    """The result a rank wrote (the stress test's store has no authentication: anything may
    be there); raises :class:`StressProtocolError`."""
    try:
        data = loads(raw, _WHAT)
        code = integer(data, "device_code", _WHAT, min(StressCode), max(StressCode))
        return RankStressResult(
            rank=integer(data, "rank", _WHAT, 0, RANK_MAX),
            device_code=StressCode(code),
            checksum=text(data, "checksum", _WHAT),
            expected=text(data, "expected", _WHAT),
            device_s=number(data, "device_s", _WHAT),
            links=tuple(_link(m) for m in listed(data, "links", _WHAT)),
            error=optional_text(data, "error", _WHAT, TEXT_MAX),
        )
    except StressProtocolError:
        raise
    except ProtocolError as exc:
        raise StressProtocolError(str(exc)) from None
