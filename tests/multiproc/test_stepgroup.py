"""The session's process groups (:mod:`unbroken.worker.stepgroup`) with real peers on gloo.

Four ranks (this file run as a script, once per rank, against a TCPStore this test process
owns) make a :class:`StepGroup` their default group, build a 2-D device mesh over it, and run
FSDP2 steps with ``clip_grad_norm_``, a logged loss all-reduce and an all-gather. Then rank 2
dies (``os._exit``) inside a step: the other two finish the step's collectives without an
exception (the mesh's ``DTensor`` norm, the script's all-reduce and all-gather, a barrier),
the step is recorded failed once, and the collectives after the failure return at once. A
collective whose arguments are wrong raises even inside a step, and outside a step a peer's
failure raises as it would without the session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from unbroken.worker import stepgroup

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(240)]

WORLD = 4


class Step:
    """A step's fault sink, as the session's recovery is one."""

    def __init__(self) -> None:
        self.in_step = False
        self.errors: list[str] = []

    @property
    def step_failed(self) -> bool:
        return bool(self.errors)

    def collective_failed(self, error: Exception) -> None:
        self.errors.append(f"{type(error).__name__}: {error}")


def rank_main(rank: int, port: int, out: Path) -> None:
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    store = dist.TCPStore(  # type: ignore[attr-defined]
        "127.0.0.1", port, WORLD, is_master=False, timeout=timedelta(seconds=60)
    )
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=WORLD, timeout=timedelta(seconds=30)
    )
    step = Step()
    report: dict[str, Any] = {}
    try:
        group = stepgroup.adopt_default_group(step, timedelta(seconds=20))
        report["default_is_step_group"] = dist.group.WORLD is group and isinstance(
            group, stepgroup.StepGroup
        )
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("rep", "shard"))
        report["mesh_groups"] = [type(mesh.get_group(d)).__name__ for d in range(mesh.ndim)]
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

        def train_step(n: int) -> None:
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(n * 10 + rank))
            loss = model(x).square().mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # DTensor: an all-reduce
            if not step.step_failed:
                opt.step()
            opt.zero_grad()
            logged = loss.detach().clone()
            dist.all_reduce(logged)
            gathered = [torch.zeros(()) for _ in range(WORLD)]
            dist.all_gather(gathered, logged)

        step.in_step = True
        train_step(0)
        step.in_step = False
        report["healthy_step_failed"] = step.step_failed

        # A wrong argument raises inside a step: it is the script's error, not a peer's.
        step.in_step = True
        try:
            dist.all_gather([torch.zeros(2)], torch.zeros(3))
        except (RuntimeError, ValueError):
            report["bad_argument_raised"] = True
        else:
            report["bad_argument_raised"] = False
        step.in_step = False

        store.set(f"ready/{rank}", "1")
        store.wait([f"ready/{r}" for r in range(WORLD)], timedelta(seconds=60))
        if rank == 2:
            os._exit(0)  # dies between steps: its peers' next step meets a closed link
        time.sleep(0.3)
        step.in_step = True
        began = time.monotonic()
        train_step(1)
        dist.barrier()
        report["failed_step_s"] = time.monotonic() - began
        report["failures"] = step.errors
        tensor = torch.ones(3)
        began = time.monotonic()
        gathered = [torch.ones(3) for _ in range(WORLD)]
        dist.all_gather(gathered, tensor)
        report["after_failure_s"] = time.monotonic() - began
        report["after_failure_zeroed"] = all(t.abs().sum().item() == 0 for t in gathered)
        step.in_step = False
        try:  # outside a step, a peer's failure raises
            dist.all_reduce(torch.ones(1), group=group)
        except RuntimeError as e:
            report["outside_step_raised"] = stepgroup.is_peer_failure(e)
        else:
            report["outside_step_raised"] = False
        report["released"] = stepgroup.release_all() >= 1
    except Exception:
        report["error"] = traceback.format_exc()
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    os._exit(0)  # the peer is gone: no orderly teardown of the group


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    out = tmp_path_factory.mktemp("stepgroup")
    store = dist.TCPStore(  # type: ignore[attr-defined]
        "127.0.0.1", 0, WORLD + 1, is_master=True, wait_for_workers=False
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    procs = []
    for rank in range(WORLD):
        with (out / f"rank{rank}.log").open("wb") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, __file__, str(rank), str(store.port), str(out)],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    try:
        for proc in procs:
            proc.wait(timeout=200)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    result = {}
    for rank in (0, 1, 3):
        path = out / f"rank{rank}.json"
        log = (out / f"rank{rank}.log").read_text(errors="replace")
        assert path.exists(), f"rank {rank} reported nothing:\n{log[-3000:]}"
        report = json.loads(path.read_text())
        assert "error" not in report, f"rank {rank}:\n{report['error']}"
        result[rank] = report
    return result


def test_the_default_group_and_the_mesh_are_the_sessions(
    reports: dict[int, dict[str, Any]],
) -> None:
    for report in reports.values():
        assert report["default_is_step_group"]
        assert report["mesh_groups"] == ["StepGroup", "StepGroup"]
        assert report["healthy_step_failed"] is False


def test_a_dead_peer_fails_the_step_once_without_raising(
    reports: dict[int, dict[str, Any]],
) -> None:
    for rank, report in reports.items():
        assert len(report["failures"]) == 1, (rank, report["failures"])
        assert stepgroup.is_peer_failure(RuntimeError(report["failures"][0])), report
        assert report["failed_step_s"] < 15, report  # no group timeout waited out (20 s)


def test_collectives_after_the_failure_return_at_once_zeroed(
    reports: dict[int, dict[str, Any]],
) -> None:
    for report in reports.values():
        assert report["after_failure_s"] < 0.5, report
        assert report["after_failure_zeroed"] is True


def test_a_wrong_argument_raises_inside_a_step(reports: dict[int, dict[str, Any]]) -> None:
    for report in reports.values():
        assert report["bad_argument_raised"] is True


def test_outside_a_step_a_peers_failure_raises(reports: dict[int, dict[str, Any]]) -> None:
    for report in reports.values():
        assert report["outside_step_raised"] is True
        assert report["released"] is True


def test_peer_failure_words() -> None:
    assert stepgroup.is_peer_failure(RuntimeError("[pair.cc:553] Connection closed by peer [::1]"))
    assert stepgroup.is_peer_failure(dist.DistBackendError("NCCL communicator was aborted"))
    assert not stepgroup.is_peer_failure(RuntimeError("invalid tensor size at index 0"))
    wrapped = ValueError("step failed")
    wrapped.__cause__ = RuntimeError("Connection reset by peer")
    assert stepgroup.is_peer_failure(wrapped)


if __name__ == "__main__":
    rank_main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
