"""The sum over virtual data-parallel ranks (:mod:`unbroken.worker.elastic`) in one process:
P physical ranks simulated side by side, the all-gather an edge that hands each the others'
rows. The gradients are bitwise the same for every P from 1 to V, and so is an optimizer step;
a plain sum of per-rank averages (what an all-reduce over P ranks does) is not."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from unbroken.worker.elastic import VirtualGrads, gather_bytes

pytestmark = pytest.mark.component

V = 4


def model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 5))


def batch(step: int, v: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step * 101 + v)
    return torch.randn(8, 16, generator=g), torch.randint(0, 5, (8,), generator=g)


def step_on(world_size: int, step: int = 7) -> list[torch.Tensor]:
    """One step's reduced gradients of rank 0 when ``world_size`` ranks host the V virtual ranks
    (every rank ends with the same; rank 0's are returned)."""
    models = [model() for _ in range(world_size)]
    grads = [VirtualGrads(m, V) for m in models]
    for rank, (m, vg) in enumerate(zip(models, grads, strict=True)):
        for v in vg.begin(world_size, rank):
            x, y = batch(step, v)
            with vg.virtual_rank(v, seed=1234, step=step):
                nn.functional.cross_entropy(m(x), y).backward()
    rows = [vg._rows for vg in grads]

    def all_gather(tensor: torch.Tensor) -> list[torch.Tensor]:
        return [r.clone() for r in rows]  # type: ignore[union-attr]

    for vg in grads:
        vg.reduce(all_gather, world_size)
    out = [p.grad.clone() for p in models[0].parameters()]  # type: ignore[union-attr]
    for m in models[1:]:
        assert all(torch.equal(a, p.grad) for a, p in zip(out, m.parameters(), strict=True))
    return out


def test_the_reduced_gradients_are_bitwise_the_same_on_every_world_size() -> None:
    full = step_on(V)
    for world_size in (1, 2, 3):
        got = step_on(world_size)
        assert all(torch.equal(a, b) for a, b in zip(full, got, strict=True)), world_size


def test_a_sum_in_another_order_differs_so_the_order_is_what_is_tested() -> None:
    full = step_on(V)
    m = model()
    per_v = []
    for v in range(V):
        for p in m.parameters():
            p.grad = None
        torch.default_generator.manual_seed(0)  # any: only the order of the sum differs
        x, y = batch(7, v)
        vg = VirtualGrads(m, V)
        vg.begin(V, v)
        with vg.virtual_rank(v, seed=1234, step=7):
            nn.functional.cross_entropy(m(x), y).backward()
        per_v.append([p.grad.clone() for p in m.parameters()])  # type: ignore[union-attr]
    # Two ranks averaging their own pair first, then the pair of averages: an all-reduce's way.
    pairs = [[(a + b) / 2 for a, b in zip(per_v[i], per_v[i + 1], strict=True)] for i in (0, 2)]
    other = [(a + b) / 2 for a, b in zip(pairs[0], pairs[1], strict=True)]
    assert not all(torch.equal(a, b) for a, b in zip(full, other, strict=True))


def test_a_virtual_rank_not_hosted_here_is_refused() -> None:
    vg = VirtualGrads(model(), V)
    assert list(vg.begin(2, 1)) == [2, 3]
    with (
        pytest.raises(
            ValueError, match=r"virtual rank 0 is not hosted here \(this rank hosts \[2, 3\]\)"
        ),
        vg.virtual_rank(0, seed=None, step=0),
    ):
        pass
    with pytest.raises(RuntimeError, match=r"virtual rank\(s\) \[2, 3\] ran no backward"):
        vg.reduce(lambda t: [t, t], 2)


def test_the_bytes_each_rank_receives() -> None:
    assert gather_bytes(4, 4, 1000) == 3 * 1 * 1000 * 4
    assert gather_bytes(4, 2, 1000) == 1 * 2 * 1000 * 4
    assert gather_bytes(4, 3, 1000) == 2 * 2 * 1000 * 4
    assert gather_bytes(4, 1, 1000) == 0
