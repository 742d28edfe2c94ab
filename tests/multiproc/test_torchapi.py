"""The private torch APIs of :mod:`unbroken.worker.torchapi`, each exercised for real.

Two ranks on gloo over 127.0.0.1 (this file run as a script, once per rank, against a TCPStore
this test process owns) run one check per function, in turn, and report each check's outcome;
every test below asserts the outcome of its own function. A torch upgrade that moves or changes
one of them fails here, naming it.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from unbroken.worker import torchapi

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(240)]

WORLD = 2
_GROUP_TIMEOUT = timedelta(seconds=30)

# -- the checks, run in each rank process ----------------------------------------------------


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def _gather(tensor: torch.Tensor) -> list[torch.Tensor]:
    out = [torch.empty_like(tensor) for _ in range(WORLD)]
    dist.all_gather(out, tensor)
    return out


def _own_group(rank: int, name: str, timeout_s: float = 30.0) -> torchapi.ProcessGroupGloo:
    store = torchapi.PrefixStore(f"torchapi/{name}/", torchapi.default_store())
    return torchapi.gloo_group(store, rank, WORLD, timedelta(seconds=timeout_s))


def check_default_store(rank: int) -> None:
    store = torchapi.default_store()
    store.set(f"default-store/{rank}", str(rank * 10))
    store.wait([f"default-store/{r}" for r in range(WORLD)], timedelta(seconds=30))
    assert store.get(f"default-store/{1 - rank}") == str((1 - rank) * 10).encode()


def check_set_group_timeout(rank: int) -> None:
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=60))
    torchapi.set_group_timeout(group, timedelta(seconds=1))
    store = torchapi.default_store()
    if rank == 0:  # alone in the collective: it must fail after the new timeout, not 60 s
        began = time.monotonic()
        try:
            dist.all_reduce(torch.ones(1), group=group)
        except RuntimeError:
            elapsed = time.monotonic() - began
            assert elapsed < 20, f"the all-reduce failed after {elapsed:.1f} s"
        else:
            raise AssertionError("an all-reduce without its peer succeeded")
        store.set("set-group-timeout/done", "1")
    else:
        store.wait(["set-group-timeout/done"], timedelta(seconds=60))


def check_unbind_default_group_arguments(rank: int) -> None:
    import importlib

    import torch.distributed.nn.functional as functional

    functional = importlib.reload(functional)  # imported now, with a default group in place

    def bound() -> list[str]:
        return [
            name
            for name, value in vars(functional).items()
            if any(
                isinstance(d, dist.ProcessGroup) for d in getattr(value, "__defaults__", None) or ()
            )
        ]

    assert bound(), "torch.distributed.nn.functional no longer binds the default group"
    torchapi.unbind_default_group_arguments()
    assert bound() == []
    assert functional.all_reduce.__defaults__ is not None
    assert None in functional.all_reduce.__defaults__


def check_gloo_group(rank: int) -> None:
    group = _own_group(rank, "group", timeout_s=120.0)
    assert (group.rank(), group.size()) == (rank, WORLD)
    assert not isinstance(group, dist.ProcessGroup)  # not registered with torch.distributed
    torchapi.gloo_barrier(group).wait()
    store = torchapi.default_store()
    # Dropping the last reference closes the links: a peer blocked in a collective fails at
    # once, long before the group's timeout.
    if rank == 1:
        work = torchapi.gloo_allreduce(group, torch.ones(3))
        store.set("gloo-group/started", "1")
        began = time.monotonic()
        try:
            work.wait()
        except RuntimeError:
            elapsed = time.monotonic() - began
            assert elapsed < 30, f"the peer's collective failed only after {elapsed:.1f} s"
        else:
            raise AssertionError("an all-reduce with a dropped peer group succeeded")
        del work
    else:
        store.wait(["gloo-group/started"], timedelta(seconds=60))
        time.sleep(0.2)
    del group
    gc.collect()


def check_gloo_allreduce(rank: int) -> None:
    group = _own_group(rank, "allreduce")
    tensor = torch.arange(4, dtype=torch.float32) * (rank + 1)
    torchapi.gloo_allreduce(group, tensor).wait()
    assert tensor.tolist() == [0.0, 3.0, 6.0, 9.0]


def check_gloo_broadcast(rank: int) -> None:
    group = _own_group(rank, "broadcast")
    tensor = torch.full((3,), float(rank + 5))
    torchapi.gloo_broadcast(group, tensor).wait()
    assert tensor.tolist() == [5.0, 5.0, 5.0]


def check_gloo_allgather(rank: int) -> None:
    group = _own_group(rank, "allgather")
    outputs = [torch.empty(2) for _ in range(WORLD)]
    torchapi.gloo_allgather(group, outputs, torch.full((2,), float(rank))).wait()
    assert [t.tolist() for t in outputs] == [[0.0, 0.0], [1.0, 1.0]]


def check_gloo_barrier(rank: int) -> None:
    group = _own_group(rank, "barrier")
    store = torchapi.default_store()
    if rank == 1:
        time.sleep(1.0)
        store.set("gloo-barrier/late", "1")
    torchapi.gloo_barrier(group).wait()
    assert store.check(["gloo-barrier/late"])  # rank 0 waited for the late rank


def check_ddp_parameters(rank: int) -> None:
    model = _model()
    model[0].bias.requires_grad_(False)
    model.add_module("again", model[2])  # a shared module: its parameters counted once
    ddp = DistributedDataParallel(model)
    params = torchapi.ddp_parameters(ddp)
    expected = [model[0].weight, model[2].weight, model[2].bias]
    assert [id(p) for p in params] == [id(p) for p in expected]


def check_ddp_use_process_group(rank: int) -> None:
    ddp = DistributedDataParallel(_model())
    solo = dist.new_group(ranks=[rank], backend="gloo", use_local_synchronization=True)
    torchapi.ddp_use_process_group(ddp, solo)
    assert ddp.process_group is solo
    ddp(torch.full((2, 4), float(rank + 1))).sum().backward()
    weight = ddp.module[0].weight
    assert weight.grad is not None
    mine, theirs = _gather(weight.grad)
    assert not torch.equal(mine, theirs)  # reduced over this rank alone: not averaged


def check_ddp_delays_all_reduce(rank: int) -> None:
    plain = DistributedDataParallel(_model())
    assert torchapi.ddp_delays_all_reduce(plain) is False
    model = _model()
    model[2].requires_grad_(False)  # a parameter DDP sees, so it knows the device type
    delayed = DistributedDataParallel(
        model,
        delay_all_reduce_named_params=[(n, p) for n, p in model.named_parameters() if n[0] == "0"],
        param_to_hook_all_reduce=model[0].weight,
    )
    assert torchapi.ddp_delays_all_reduce(delayed) is True


def check_ddp_register_buffer_hook(rank: int) -> None:
    model = _model()
    model.register_buffer("seen", torch.full((2,), float(rank)))
    ddp = DistributedDataParallel(model, broadcast_buffers=True)
    model.seen.fill_(float(rank))  # DDP's constructor broadcast rank 0's
    calls: list[list[str]] = []

    def hook(state: list[list[str]], buffers: dict[str, torch.Tensor]) -> None:
        state.append(sorted(buffers))

    torchapi.ddp_register_buffer_hook(ddp, calls, hook)
    ddp(torch.ones(1, 4))
    assert calls == [["seen"]]  # called before the forward, with the module's buffers
    assert model.seen.tolist() == [float(rank)] * 2  # in place of DDP's own broadcast


def check_abort_group(rank: int) -> None:
    group = dist.group.WORLD
    assert isinstance(group, dist.ProcessGroup)
    assert torchapi.abort_group(group) is False  # gloo: nothing to abort, the group still works
    t = torch.ones(2)
    dist.all_reduce(t)
    assert t.tolist() == [float(WORLD)] * 2


def check_ddp_syncs_buffers(rank: int) -> None:
    with_buffer = _model()
    with_buffer.register_buffer("seen", torch.zeros(2))
    assert torchapi.ddp_syncs_buffers(DistributedDataParallel(with_buffer))  # the default
    quiet = DistributedDataParallel(_model(), broadcast_buffers=False)
    assert not torchapi.ddp_syncs_buffers(quiet)


def check_verify_params_across_processes(rank: int) -> None:
    group = dist.group.WORLD
    assert isinstance(group, dist.ProcessGroup)
    same = [torch.zeros(3, 2), torch.zeros(5)]
    torchapi.verify_params_across_processes(group, same)
    other = [torch.zeros(3, 2), torch.zeros(5 + rank)]
    try:
        torchapi.verify_params_across_processes(group, other)
    except RuntimeError as e:
        assert rank == 1, f"rank 0 holds the reference shapes, yet: {e}"
    else:
        assert rank == 0, "a parameter of another shape than rank 0's passed the check"


def check_broadcast_coalesced(rank: int) -> None:
    group = dist.group.WORLD
    assert isinstance(group, dist.ProcessGroup)
    tensors = [
        torch.full((5,), float(rank + 1)),
        torch.full((2, 3), rank + 7, dtype=torch.int64),
        torch.full((40,), float(rank) - 0.5, dtype=torch.float64),
    ]
    torchapi.broadcast_coalesced(group, tensors, bucket_size=64)  # several buckets
    assert tensors[0].tolist() == [1.0] * 5
    assert tensors[1].tolist() == [[7] * 3] * 2 and tensors[1].dtype == torch.int64
    assert tensors[2].tolist() == [-0.5] * 40


def check_foreach_div_(rank: int) -> None:
    torch.manual_seed(rank)
    tensors = [torch.randn(7), torch.randn(3, 2, dtype=torch.float64)]
    expected = [t.clone().div_(3.0) for t in tensors]
    torchapi.foreach_div_(tensors, 3.0)
    assert all(torch.equal(t, e) for t, e in zip(tensors, expected, strict=True))


def check_device_backends(rank: int) -> None:
    assert torchapi.device_backends(None)["cpu"] == "gloo"  # "cpu:gloo,cuda:gloo" for "gloo"
    group = dist.new_group(backend="gloo")
    assert torchapi.device_backends(group)["cpu"] == "gloo"


def check_plain_group(rank: int) -> None:
    store = torchapi.PrefixStore("torchapi/plain/", torchapi.default_store())
    group = torchapi.plain_group(store, rank, WORLD, timedelta(seconds=60), {"cpu": "gloo"})
    assert (group.rank(), group.size()) == (rank, WORLD)
    tensor = torch.full((3,), float(rank + 1))
    group.allreduce([tensor]).wait()
    assert tensor.tolist() == [3.0] * 3
    outputs = torch.empty(2 * WORLD)
    group._allgather_base(outputs, torch.full((2,), float(rank))).wait()
    assert outputs.tolist() == [0.0, 0.0, 1.0, 1.0]
    # Not registered: dropping it closes its links, so a peer in a collective fails at once.
    store_ = torchapi.default_store()
    if rank == 1:
        work = group.allreduce([torch.ones(2)])
        store_.set("plain-group/started", "1")
        began = time.monotonic()
        try:
            work.wait()
        except RuntimeError:
            assert time.monotonic() - began < 30
        else:
            raise AssertionError("an all-reduce with a dropped peer group succeeded")
        del work
    else:
        store_.wait(["plain-group/started"], timedelta(seconds=60))
        time.sleep(0.2)
    del group
    gc.collect()


def check_make_default_group(rank: int) -> None:
    previous = dist.group.WORLD
    group = dist.new_group(backend="gloo")
    torchapi.make_default_group(group)
    try:
        assert dist.group.WORLD is group
        tensor = torch.full((1,), float(rank + 1))
        dist.all_reduce(tensor)  # group=None: the new default
        assert tensor.item() == 3.0
        assert dist.get_rank() == rank
    finally:
        assert isinstance(previous, dist.ProcessGroup)
        torchapi.make_default_group(previous)


def _propagated_schemas(rows: int) -> tuple[list[Any], list[Any]]:
    """The operator schemas (and their shardings) that ``DTensor`` operations on a shape no
    check used before (``rows`` rows, a number of each check's own) have computed, through a
    wrapper put in place by :func:`torchapi.wrap_sharding_propagation` (taken out after)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    seen: list[Any] = []
    results: list[Any] = []
    originals: list[Callable[[Any], Any]] = []

    def wrap(inner: Callable[[Any], Any]) -> Callable[[Any], Any]:
        originals.append(inner)

        def noted(schema: Any) -> Any:
            result = inner(schema)
            seen.append(schema)
            results.append(result)
            return result

        return noted

    assert torchapi.wrap_sharding_propagation(wrap)
    try:
        mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("torchapi",))
        tensor = distribute_tensor(torch.ones(rows, 7), mesh, [Shard(0)])
        (tensor * 3 + 1).to_local()
    finally:
        original = originals[0]
        assert torchapi.wrap_sharding_propagation(lambda _wrapped: original)
    return seen, results


def check_wrap_sharding_propagation(rank: int) -> None:
    schemas, results = _propagated_schemas(6)
    assert schemas and len(schemas) == len(results)
    assert all(type(s).__name__ == "OpSchema" for s in schemas)
    assert all(type(r).__name__ == "OutputSharding" for r in results)


def check_sharding_class(rank: int) -> None:
    schemas, results = _propagated_schemas(8)
    spec = results[0].output_spec
    for value in (schemas[0], results[0], spec, spec.tensor_meta, spec.placements[0]):
        cls = type(value)
        assert torchapi.sharding_class(cls.__module__, cls.__qualname__) is cls, cls
    assert torchapi.sharding_class("os", "system") is None
    assert torchapi.sharding_class("torch.distributed.tensor", "distribute_tensor") is None


def check_sharding_mesh(rank: int) -> None:
    schemas, _ = _propagated_schemas(12)
    mesh = torchapi.sharding_mesh(schemas[0])
    assert mesh is not None and mesh.mesh_dim_names == ("torchapi",)
    assert torchapi.sharding_mesh(object()) is None


def check_sharding_rehash(rank: int) -> None:
    import copy

    schemas, _ = _propagated_schemas(10)
    original = schemas[0]
    stale = copy.copy(original)
    stale._comparison_key = ("written by another process",)
    specs = [copy.copy(a) for a in original.args_schema]
    for spec in specs:
        if hasattr(spec, "_hash"):
            object.__setattr__(spec, "_hash", 12345)
    stale.args_schema = tuple(specs)
    assert stale != original
    torchapi.sharding_rehash(stale)
    assert stale == original and hash(stale) == hash(original)
    assert all(hash(a) == hash(b) for a, b in zip(specs, original.args_schema, strict=True))


CHECKS: dict[str, Callable[[int], None]] = {
    name.removeprefix("check_"): value
    for name, value in list(globals().items())
    if name.startswith("check_") and callable(value)
}


def rank_main(rank: int, port: int, out: Path) -> None:
    """One rank: join the group, run every check in turn (every rank starts a check together),
    write each one's outcome ("ok" or its traceback)."""
    torch.set_num_threads(1)
    store = dist.TCPStore(  # type: ignore[attr-defined]
        "127.0.0.1", port, WORLD, is_master=False, timeout=timedelta(seconds=60)
    )
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=WORLD, timeout=_GROUP_TIMEOUT
    )
    outcomes: dict[str, str] = {}
    for name, check in CHECKS.items():
        store.set(f"begin/{name}/{rank}", "1")
        store.wait([f"begin/{name}/{r}" for r in range(WORLD)], timedelta(seconds=120))
        try:
            check(rank)
        except Exception:
            outcomes[name] = traceback.format_exc()
        else:
            outcomes[name] = "ok"
    (out / f"rank{rank}.json").write_text(json.dumps(outcomes))
    dist.destroy_process_group()


# -- the tests -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Each check's outcome on every rank."""
    out = tmp_path_factory.mktemp("torchapi")
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
    results: dict[str, list[str]] = {name: [] for name in CHECKS}
    for rank in range(WORLD):
        path = out / f"rank{rank}.json"
        log = (out / f"rank{rank}.log").read_text(errors="replace")
        assert path.exists(), f"rank {rank} reported nothing:\n{log}"
        for name, outcome in json.loads(path.read_text()).items():
            results[name].append(outcome)
    return results


def _assert_ok(outcomes: dict[str, list[str]], name: str) -> None:
    failed = [f"rank {r}:\n{o}" for r, o in enumerate(outcomes[name]) if o != "ok"]
    assert len(outcomes[name]) == WORLD and not failed, "\n".join(failed)


def test_every_function_has_a_check() -> None:
    functions = {n for n in torchapi.__all__ if callable(getattr(torchapi, n)) and n.islower()}
    assert functions == set(CHECKS)


def test_the_classes_are_those_torch_distributed_exports() -> None:
    for name in ("GradBucket", "PrefixStore", "ProcessGroupGloo", "Store", "TCPStore"):
        assert getattr(torchapi, name) is getattr(dist, name), name


def test_wrap_sharding_propagation(outcomes: dict[str, list[str]]) -> None:
    _assert_ok(outcomes, "wrap_sharding_propagation")


def test_sharding_class(outcomes: dict[str, list[str]]) -> None:
    _assert_ok(outcomes, "sharding_class")


def test_sharding_mesh(outcomes: dict[str, list[str]]) -> None:
    _assert_ok(outcomes, "sharding_mesh")


def test_sharding_rehash(outcomes: dict[str, list[str]]) -> None:
    _assert_ok(outcomes, "sharding_rehash")


def test_default_store(outcomes: dict[str, list[str]]) -> None:
    _assert_ok(outcomes, "default_store")


def test_set_group_timeout(outcomes: dict[str, list[str]]) -> None:
    _assert_ok(outcomes, "set_group_timeout")


def test_unbind_default_group_arguments(outcomes: dict[str, list[str]]) -> None:
    _assert_ok(outcomes, "unbind_default_group_arguments")


def test_gloo_group(outcomes: dict[str, list[str]]) -> None:
    _assert_ok(outcomes, "gloo_group")


def test_gloo_allreduce(outcomes: dict[str, list[str]]) -> None:
    _assert_ok(outcomes, "gloo_allreduce")


def test_gloo_broadcast(outcomes: dict[str, list[str]]) -> None:
    _assert_ok(outcomes, "gloo_broadcast")


def test_gloo_allgather(outcomes: dict[str, list[str]]) -> None:
    _assert_ok(outcomes, "gloo_allgather")


def test_gloo_barrier(outcomes: dict[str, list[str]]) -> None:
    _assert_ok(outcomes, "gloo_barrier")


def test_ddp_parameters(outcomes: dict[str, list[str]]) -> None:
    _assert_ok(outcomes, "ddp_parameters")


def test_ddp_use_process_group(outcomes: dict[str, list[str]]) -> None:
    _assert_ok(outcomes, "ddp_use_process_group")


def test_ddp_delays_all_reduce(outcomes: dict[str, list[str]]) -> None:
    _assert_ok(outcomes, "ddp_delays_all_reduce")


def test_ddp_register_buffer_hook(outcomes: dict[str, list[str]]) -> None:
    _assert_ok(outcomes, "ddp_register_buffer_hook")


def test_abort_group(outcomes: dict[str, list[str]]) -> None:
    _assert_ok(outcomes, "abort_group")


def test_ddp_syncs_buffers(outcomes: dict[str, list[str]]) -> None:
    _assert_ok(outcomes, "ddp_syncs_buffers")


def test_verify_params_across_processes(outcomes: dict[str, list[str]]) -> None:
    _assert_ok(outcomes, "verify_params_across_processes")


def test_broadcast_coalesced(outcomes: dict[str, list[str]]) -> None:
    _assert_ok(outcomes, "broadcast_coalesced")


def test_device_backends(outcomes: dict[str, list[str]]) -> None:
    _assert_ok(outcomes, "device_backends")


def test_plain_group(outcomes: dict[str, list[str]]) -> None:
    _assert_ok(outcomes, "plain_group")


def test_make_default_group(outcomes: dict[str, list[str]]) -> None:
    _assert_ok(outcomes, "make_default_group")


def test_foreach_div_(outcomes: dict[str, list[str]]) -> None:
    _assert_ok(outcomes, "foreach_div_")


if __name__ == "__main__":
    rank_main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
