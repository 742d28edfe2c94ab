"""Elastic training's bookkeeping (pure): which pods may be dropped, the world that is left and
how its ranks are numbered, and the scale-in/scale-out records."""

from __future__ import annotations

from pathlib import Path

import pytest

from unbroken.manager.elastic import ElasticState
from unbroken.manager.layout import JobLayout, PodLayout
from unbroken.spec.faulthandling import FaultHandling

pytestmark = pytest.mark.unit


def job(pods: int, nproc: int = 2) -> JobLayout:
    return JobLayout(
        job_id="j",
        pods=tuple(
            PodLayout(
                name=("j-master-0" if i == 0 else f"j-worker-{i - 1}"), node_rank=i, nproc=nproc
            )
            for i in range(pods)
        ),
        script="train.py",
        script_args=(),
        fault_handling=FaultHandling(),
        workdir=Path("."),
    )


@pytest.mark.parametrize(
    ("pods", "min_pods", "dropped", "drop", "refusal"),
    [
        (2, 1, (), ("j-worker-0",), None),
        (3, 1, ("j-worker-0",), ("j-worker-1",), None),
        (
            3,
            2,
            ("j-worker-0",),
            ("j-worker-1",),
            "1 pod(s) would be left, below the job's minimum of 2",
        ),
        (2, 2, (), ("j-worker-0",), "1 pod(s) would be left, below the job's minimum of 2"),
        (2, 1, (), ("j-master-0",), "j-master-0 holds rank 0 and is never dropped"),
        (3, 1, ("j-worker-0",), ("j-worker-0",), "j-worker-0 is not in the current world"),
        (2, 1, (), (), "the fault names no pod to drop"),
    ],
)
def test_refusal(
    pods: int, min_pods: int, dropped: tuple[str, ...], drop: tuple[str, ...], refusal: str | None
) -> None:
    state = ElasticState(job(pods), min_pods)
    for pod in dropped:
        state = state.drop(pod, "node-x", 0.0, "f0")
    got = state.refusal(drop)
    assert got == refusal if refusal is None else got is not None and refusal in got


@pytest.mark.parametrize(
    ("pods", "dropped", "world"),
    [
        (2, (), (0, 1, 2, 3)),
        (2, ("j-worker-0",), (0, 1)),
        (3, ("j-worker-0",), (0, 1, 4, 5)),
        (3, ("j-worker-1", "j-worker-0"), (0, 1)),
    ],
)
def test_the_world_keeps_the_job_rank_order(
    pods: int, dropped: tuple[str, ...], world: tuple[int, ...]
) -> None:
    state = ElasticState(job(pods), 1)
    for pod in dropped:
        state = state.drop(pod, "node-x", 0.0, "f0")
    assert state.world == world and state.world_size == len(world)
    assert state.shrunk == bool(dropped)


def test_a_scale_in_and_a_scale_out_are_recorded_once_their_generation_commits() -> None:
    state = ElasticState(job(3), 1).drop("j-worker-0", "node-1", 10.0, "f1")
    state = state.drop("j-worker-1", "node-2", 10.1, "f1")  # the same decision: one scale-in
    assert state.scaling is not None
    assert (state.scaling.kind, state.scaling.pods) == ("in", ("j-worker-0", "j-worker-1"))
    assert (state.scaling.from_size, state.scaling.to_size) == (6, 2)
    assert state.committed(1) == (state, None)  # no generation went out for it yet
    state = state.began(1)
    state, done = state.committed(1)
    assert done is not None and done.generation == 1 and done.fault_id == "f1"
    assert state.scaling is None and state.world_size == 2

    state = state.restore(20.0).began(2)
    assert state.world_size == 6 and not state.shrunk
    state, done = state.committed(2)
    assert done is not None and (done.kind, done.from_size, done.to_size) == ("out", 2, 6)
    assert [s.kind for s in state.history] == ["in", "out"]


def test_a_job_restarted_whole_forgets_what_it_dropped() -> None:
    state = ElasticState(job(2), 1).drop("j-worker-0", "node-1", 1.0, "f1").abandoned()
    assert not state.shrunk and state.scaling is None and state.world_size == 4
