"""Virtual data-parallel ranks: which of a job's fixed virtual ranks a physical rank hosts.

An elastic job trains ``V`` virtual data-parallel ranks, ``V`` being its largest data-parallel
size; each virtual rank owns a fixed slice of every global batch. ``P`` physical ranks
(``1 <= P <= V``) host them in contiguous, balanced blocks: physical rank ``r`` hosts
``[r*V//P, (r+1)*V//P)``. The map is a pure function of ``(V, P, r)``, so every rank computes
the same one after a change of world size without a message. Pure Python, no torch.
"""

from __future__ import annotations


def check_sizes(virtual: int, world_size: int) -> None:
    """Raise ValueError unless ``world_size`` physical ranks can host ``virtual`` ones."""
    if virtual < 1:
        raise ValueError(f"the number of virtual ranks must be >= 1, got {virtual}")
    if not 1 <= world_size <= virtual:
        raise ValueError(
            f"{world_size} physical rank(s) cannot host {virtual} virtual rank(s): every "
            f"physical rank needs at least one (at most {virtual} physical ranks)"
        )


def hosted(virtual: int, world_size: int, rank: int) -> range:
    """The virtual ranks physical ``rank`` of ``world_size`` hosts, in order."""
    check_sizes(virtual, world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of {world_size}")
    return range(rank * virtual // world_size, (rank + 1) * virtual // world_size)


def host_of(virtual: int, world_size: int, v: int) -> tuple[int, int]:
    """``(physical rank, position among its virtual ranks)`` of virtual rank ``v``."""
    check_sizes(virtual, world_size)
    if not 0 <= v < virtual:
        raise ValueError(f"virtual rank {v} is not in 0..{virtual - 1}")
    # The largest r with r*V//P <= v.
    rank = ((v + 1) * world_size - 1) // virtual
    first = rank * virtual // world_size
    return rank, v - first


def most_hosted(virtual: int, world_size: int) -> int:
    """The most virtual ranks any physical rank hosts (the rows each one sends)."""
    check_sizes(virtual, world_size)
    return -(-virtual // world_size)
