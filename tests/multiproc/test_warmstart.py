"""A rank's next process takes the shardings its predecessor computed (``warmstart``).

Two ranks (this file run as a script, once per rank, by
:class:`tests.support.worker_ranks.Cluster`) train an FSDP2 model on a 2-rank mesh for three
steps, the loop people write (AdamW, ``clip_grad_norm_``), with a :class:`ShardingMemo` in a
directory of the test's. The same pair runs again, as the ranks' next processes would, twice:
with the memo started before the mesh exists (as the zygote starts it) and installed after:
neither computes a sharding (every one is found in the first run's file) and both end with the
very same parameters. A fourth pair, whose mesh has another dimension name, leaves the file
alone and computes its own. A file that asks the unpickler for anything but a sharding's
classes is not used, and runs nothing.
"""

from __future__ import annotations

import json
import pickle
import sys
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from unbroken.worker import warmstart
from unbroken.worker.warmstart import ShardingMemo

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(240)]

WORLD = 2


class _Planted:
    """What a tampered file would make the unpickler call: writes a marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (Path(self.marker),))


def rank_main(out: Path, dim_name: str, how: str) -> None:
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank = dist.get_rank()
    report: dict[str, Any] = {}
    try:
        path = warmstart.path_of(out, rank)
        started = warmstart.start(path) if how == "start" else None  # as the zygote does
        mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=(dim_name,))
        memo = ShardingMemo.install(path, mesh) if how == "install" else started
        assert memo is not None
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        if how == "start":
            memo.attach(mesh)  # ub.init
        report["loaded"] = memo.loaded
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        generator = torch.Generator().manual_seed(rank)
        for _ in range(3):
            x = torch.randn(4, 8, generator=generator)
            opt.zero_grad()
            model(x).square().mean().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
        report["computed"] = len(memo._known) - memo.loaded
        report["hits"] = memo.hits
        report["written"] = memo.save_if_grown()
        report["params"] = [p.to_local().tolist() for p in model.parameters()]
        if rank == 0:
            tampered = out / "tampered.shardings"
            marker = out / "tampered-ran"
            header = memo._header()
            tampered.write_bytes(pickle.dumps((header, [pickle.dumps(_Planted(str(marker)))])))
            report["tampered_loaded"] = ShardingMemo(tampered, mesh).load()
            report["tampered_ran"] = marker.exists()
            garbage = out / "garbage.shardings"
            garbage.write_bytes(b"\x80\x05not a pickle")
            report["garbage_loaded"] = ShardingMemo(garbage, mesh).load()
        dist.barrier()
    except Exception:
        report["error"] = traceback.format_exc()
    (out / f"report-rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


def _run(out: Path, dim_name: str, how: str = "install") -> dict[int, dict[str, Any]]:
    """One pair of processes: each rank's report."""
    from tests.support.worker_ranks import Cluster  # not in the ranks: they run this file

    for rank in range(WORLD):
        (out / f"report-rank{rank}.json").unlink(missing_ok=True)
    logs = out / f"{dim_name}-{how}-{len(list(out.glob('*-logs')))}-logs"
    logs.mkdir()
    cluster = Cluster(logs, world_size=WORLD, script=Path(__file__))
    try:
        cluster.start([str(out), dim_name, how], managed=False).expect_success()
    finally:
        cluster.close()
    result = {}
    for rank in range(WORLD):
        report = json.loads((out / f"report-rank{rank}.json").read_text())
        assert "error" not in report, f"rank {rank}:\n{report['error']}"
        result[rank] = report
    return result


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[int, dict[str, Any]]]:
    out = tmp_path_factory.mktemp("warmstart")
    return [_run(out, "shard"), _run(out, "shard", "start"), _run(out, "shard"), _run(out, "dp")]


def test_a_first_process_computes_its_shardings_and_writes_them(
    runs: list[dict[int, dict[str, Any]]],
) -> None:
    # A hit of a first process is another thread's cache missing what this one computed
    # (torch's cache is per thread; torch 2.11 asks it before the memo, autograd's thread too).
    for report in runs[0].values():
        assert report["loaded"] == 0
        assert report["computed"] > 10 and report["written"]


def test_the_next_process_computes_none_and_trains_the_same_parameters(
    runs: list[dict[int, dict[str, Any]]],
) -> None:
    first, second = runs[0], runs[2]
    for rank, report in second.items():
        assert report["loaded"] == first[rank]["computed"]
        assert report["computed"] == 0 and report["hits"] >= report["loaded"]
        assert not report["written"]  # nothing new: the file is left as it is
        assert report["params"] == first[rank]["params"]


def test_a_memo_started_before_the_mesh_reads_the_file_at_the_first_sharding(
    runs: list[dict[int, dict[str, Any]]],
) -> None:
    """As the zygote starts it in a rank: ``fully_shard``'s own shardings are read too."""
    for rank, report in runs[1].items():
        assert report["loaded"] == runs[0][rank]["computed"] and report["computed"] == 0
        assert report["hits"] >= report["loaded"]
        assert report["params"] == runs[0][rank]["params"]


def test_a_file_of_another_mesh_is_not_used(runs: list[dict[int, dict[str, Any]]]) -> None:
    for rank, report in runs[3].items():
        assert report["loaded"] == 0
        assert report["computed"] == runs[0][rank]["computed"]


def test_a_file_that_is_not_shardings_is_not_used_and_runs_nothing(
    runs: list[dict[int, dict[str, Any]]],
) -> None:
    report = runs[0][0]
    assert report["tampered_loaded"] == 0 and not report["tampered_ran"]
    assert report["garbage_loaded"] == 0


if __name__ == "__main__":
    rank_main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
