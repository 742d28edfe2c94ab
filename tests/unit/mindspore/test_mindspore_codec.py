"""The encodings MindSpore ranks' all-reduces carry (unbroken.mindspore.codec): a corrupt
rank's repair, every dtype as float32 that a sum with the other ranks' -0.0 leaves bit for bit
(MindSpore's CPU all-reduce sums float32 and float16 only), and the checkpoint step each rank
found, exact at any step."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from unbroken.mindspore.codec import (
    as_float32,
    digest_sent,
    digests_got,
    found_steps_got,
    found_steps_sent,
    from_float32,
    replicas_apart,
)

pytestmark = pytest.mark.unit

VALUES = {
    "float32": np.array([[1.5, -0.0], [0.0, np.nan]], np.float32),
    "float32-tiny": np.array([1e-45, -1e-45, 3.4e38, -np.inf], np.float32),
    "float16": np.array([0.1, -0.0, 65504.0], np.float16),
    "int32": np.array([1 << 30, -7, 0, 1], np.int32),  # global_step: its bytes, not its value
    "int64": np.array([-(1 << 62), 5], np.int64),
    "bool": np.array([True, False]),
}


@pytest.mark.parametrize("name", sorted(VALUES))
def test_the_source_s_values_arrive_bit_for_bit(name: str) -> None:
    data = VALUES[name]
    sent = as_float32(data)
    assert sent.dtype == np.float32 and sent.ndim == 1
    others = np.full_like(sent, -0.0)
    summed = sent + others + others  # the all-reduce of three ranks, the source first
    got = from_float32(summed, data)
    assert got.dtype == data.dtype and got.shape == data.shape
    assert got.tobytes() == data.tobytes()


def test_a_plain_zero_from_the_others_would_flip_a_negative_zero() -> None:
    """Why the others send -0.0: -0.0 + 0.0 is +0.0."""
    negative_zero = np.array([-0.0], np.float32)
    assert (negative_zero + np.float32(0.0)).tobytes() != negative_zero.tobytes()
    assert (negative_zero + np.float32(-0.0)).tobytes() == negative_zero.tobytes()


@pytest.mark.parametrize(
    "found",
    [
        [None, None],
        [10, 16],
        [None, 0, 7],
        [(1 << 24) + 3, 5, None, (1 << 31) - 2],  # beyond float32's whole numbers
    ],
)
def test_every_rank_learns_the_step_each_rank_found(found: list[int | None]) -> None:
    world = len(found)
    summed = sum(found_steps_sent(step, rank, world) for rank, step in enumerate(found))
    assert found_steps_got(np.asarray(summed, np.float32)) == found


def test_every_rank_sees_each_rank_s_state_digest() -> None:
    digests = [bytes(range(r, r + 32)) for r in (0, 200, 0)]
    digests[1] = bytes([0xFF] * 8) + digests[1][8:]
    summed = sum(digest_sent(d, rank, 3) for rank, d in enumerate(digests))
    assert digests_got(np.asarray(summed, np.float32)) == [d[:8] for d in digests]


class _Param:
    def __init__(self, data: np.ndarray) -> None:  # type: ignore[type-arg]
        self.data = data

    def asnumpy(self) -> np.ndarray:  # type: ignore[type-arg]
        return self.data


def _compare(states: list[dict[str, _Param]]) -> list[object]:
    """Every rank's replicas_apart, over an all-reduce of threads (a sum at a barrier)."""
    world = len(states)
    barrier = threading.Barrier(world)
    slots: list[object] = [None] * world
    out: list[object] = [None] * world

    def rank(r: int) -> None:
        def sums(sent: np.ndarray) -> np.ndarray:  # type: ignore[type-arg]
            slots[r] = sent
            barrier.wait()
            total = np.sum(np.stack(slots), axis=0, dtype=np.float32)  # type: ignore[arg-type]
            barrier.wait()
            return total

        out[r] = replicas_apart(sums, states[r], r, world)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_replicas_are_compared_by_digest_and_the_parameters_apart_named() -> None:
    def state(bias: float) -> dict[str, _Param]:
        return {
            "w": _Param(np.arange(6, dtype=np.float32).reshape(2, 3)),
            "adam_m.w": _Param(np.full(6, bias, np.float32)),
            "global_step": _Param(np.array([7], np.int32)),
        }

    assert _compare([state(0.5), state(0.5), state(0.5)]) == [None, None, None]
    # Rank 2's moments differ by one bit: every rank says so, naming them.
    off = state(0.5)
    off["adam_m.w"].data[3] = np.nextafter(np.float32(0.5), np.float32(1))
    assert _compare([state(0.5), state(0.5), off]) == [([2], ["adam_m.w"])] * 3
