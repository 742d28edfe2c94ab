"""The training state beyond model and optimizer, in one process (real torch, no process
group): the state codec, the data stream that serves a redone step the same batches, the
rollback of what a failed step changed, and registered state in a checkpoint."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from unbroken.checkpoint import Checkpointer
from unbroken.worker.data import Batches
from unbroken.worker.statecodec import StateCodecError, decode, encode, pack, unpack
from unbroken.worker.trainstate import TrainState

pytestmark = [
    pytest.mark.multiproc,
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
    pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step()`:UserWarning"),
]


# -- the codec -------------------------------------------------------------------------------


def test_state_dicts_round_trip_with_their_key_types_and_tensors() -> None:
    value = {
        "last_epoch": 7,
        "base_lrs": [0.1, 0.01],
        "lr_lambdas": [None, None],
        "scale": math.inf,
        "nested": {0: (1.5, "x"), "t": torch.arange(3)},
    }
    tensors: list[torch.Tensor] = []
    back = decode(encode(value, tensors), tensors)
    assert back["nested"][0] == (1.5, "x")  # int key and tuple kept
    assert back["scale"] == math.inf
    assert torch.equal(back["nested"]["t"], torch.arange(3))
    packed = pack(value)
    assert set(packed) == {"json", "t0"} and packed["json"].dtype == torch.uint8
    again = unpack(packed)
    assert again["base_lrs"] == [0.1, 0.01] and again["last_epoch"] == 7


def test_a_state_that_cannot_travel_is_refused_naming_where_it_sits() -> None:
    with pytest.raises(StateCodecError, match=r"state\['fn'\] holds a function"):
        encode({"fn": lambda step: step}, [])


def test_registering_an_object_without_the_protocol_is_refused_at_once() -> None:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match=r"state\['counter'\] \(int\) has no state_dict"):
        TrainState(model, opt, {"counter": 3})
    with pytest.raises(ValueError, match="state name 'model'"):
        TrainState(model, opt, {"model": model})


def test_the_sessions_control_exceptions_are_not_swallowed_by_except_exception() -> None:
    from unbroken.worker import RecoveryFailed, ReplicasDiverged, TrainingStopped

    for exc in (RecoveryFailed, ReplicasDiverged, TrainingStopped):
        assert issubclass(exc, BaseException) and not issubclass(exc, Exception), exc


# -- the data stream -------------------------------------------------------------------------


def _loader(kind: str, rank: int = 0) -> Any:
    data = TensorDataset(torch.arange(40))
    sampler = DistributedSampler(data, num_replicas=2, rank=rank, shuffle=True, seed=5)
    cls = StatefulDataLoader if kind == "stateful" else DataLoader
    return cls(data, batch_size=4, sampler=sampler)  # 5 batches an epoch


def _serve(batches: Batches, first: int, steps: int) -> list[list[int]]:
    out = []
    for step in range(first, first + steps):
        batches.begin(step)
        out.append(batches.next()[0].tolist())
    return out


@pytest.mark.parametrize("kind", ["stateful", "plain"])
def test_the_stream_crosses_epochs_reshuffled_as_a_sampler_wants(kind: str) -> None:
    ranks = [_serve(Batches(_loader(kind, rank)), 0, 12) for rank in (0, 1)]
    for epoch in (0, 1):
        seen = [i for served in ranks for batch in served[5 * epoch : 5 * epoch + 5] for i in batch]
        assert sorted(seen) == list(range(40))  # the two ranks' shards make the data set
    assert ranks[0][:5] != ranks[0][5:10]  # set_epoch reshuffled it


@pytest.mark.parametrize("kind", ["stateful", "plain"])
def test_a_redone_step_and_a_step_ahead_are_served_again_from_the_tape(kind: str) -> None:
    reference = _serve(Batches(_loader(kind)), 0, 10)
    batches = Batches(_loader(kind))
    _serve(batches, 0, 7)  # steps 0-6 ran; this rank ran one step ahead of the others
    assert batches.rewind(5)  # the job resumes at step 5
    assert batches.counters(5) == (0, 5)  # the end of epoch 0: the next batch starts epoch 1
    batches.begin(5)
    assert batches.next()[0].tolist() == reference[5]
    assert batches.position(6)["index"] == 1  # step 6 began on the tape: its start is known
    batches.begin(6)
    assert batches.next()[0].tolist() == reference[6]
    assert _serve(batches, 7, 3) == reference[7:]


@pytest.mark.parametrize("kind", ["stateful", "plain"])
def test_a_position_moves_to_another_rank_and_process(kind: str) -> None:
    """A replacement of rank 1 takes rank 0's position at step 7 and is served rank 1's own
    batches from there."""
    reference = _serve(Batches(_loader(kind, rank=1)), 0, 12)
    source = Batches(_loader(kind, rank=0))
    _serve(source, 0, 8)  # rank 0 began step 7 (its tape holds where the step started)
    position = source.position(7)
    tensors: list[torch.Tensor] = []
    sent = decode(encode(position, tensors), tensors)  # as a replica sends it
    replacement = Batches(_loader(kind, rank=1))
    replacement.load(sent)
    assert _serve(replacement, 7, 5) == reference[7:]


# -- rollback and checkpoints ----------------------------------------------------------------


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.norm = torch.nn.BatchNorm1d(4)  # running statistics change in the forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(self.norm(self.lin(x)))


def _setup() -> tuple[_Net, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(0)
    net = _Net()
    opt = torch.optim.AdamW(net.parameters(), lr=0.1)
    return net, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)


def test_rollback_undoes_what_a_failed_step_changed() -> None:
    net, opt, sched = _setup()
    state = TrainState(net, opt, {"scheduler": sched})
    before = state.digests(0)
    state.begin(0, snapshot=True)
    net(torch.randn(8, 4))  # the forward moves the BatchNorm statistics
    sched.step()  # the loop body steps the scheduler, which sets the optimizer's lr
    assert state.digests(0) != before
    assert state.rollback(0)
    assert state.digests(0) == before
    assert opt.param_groups[0]["lr"] == 0.1 and sched.state_dict()["last_epoch"] == 0
    assert not state.rollback(0)  # nothing to undo twice


def test_registered_state_and_data_position_are_in_the_checkpoint(tmp_path: Path) -> None:
    net, opt, sched = _setup()
    sched.step()
    sched.step()
    batches = Batches(_loader("stateful"))
    _serve(batches, 0, 3)
    state = TrainState(net, opt, {"scheduler": sched}, batches)
    ckpt = Checkpointer(tmp_path)
    extra = {f"data.{k}": v for k, v in pack(batches.position(3)).items()}
    ckpt.save_async(3, net, opt, extra, pack(state.state_dicts()))
    ckpt.wait()

    net2, opt2, sched2 = _setup()
    restored = Checkpointer(tmp_path).load_latest(net2, opt2)
    assert restored is not None
    fresh = TrainState(net2, opt2, {"scheduler": sched2}, Batches(_loader("stateful")))
    fresh.load_state_dicts(unpack(restored.shared))
    assert fresh.data is not None
    fresh.data.load(unpack({k[5:]: v for k, v in restored.extra.items() if k.startswith("data.")}))
    assert sched2.state_dict() == sched.state_dict()
    assert fresh.digests(3) == state.digests(3)
    assert _serve(fresh.data, 3, 4) == _serve(batches, 3, 4)


def test_a_tensor_hash_is_reused_until_the_tensor_changes_in_place() -> None:
    from unbroken.worker.digest import TensorHashes, tensor_hash

    t = torch.arange(1000, dtype=torch.float32)
    with TensorHashes(threads=2) as hashes:
        hashes.submit([t])
        first = hashes(t)
        assert first == tensor_hash(t)
        t[3] = -1.0  # an in-place change advances the version counter: hashed again
        assert hashes(t) == tensor_hash(t) != first
        # A view of other bytes of the same storage is another tensor.
        assert hashes(t[:10]) == tensor_hash(t[:10]) != hashes(t)


def test_the_state_digest_is_the_same_hashed_ahead_or_on_the_spot_and_sees_one_bit() -> None:
    from unbroken.worker.digest import TensorHashes

    net, opt, sched = _setup()
    net(torch.randn(8, 4)).sum().backward()
    opt.step()  # the optimizer holds state tensors
    state = TrainState(net, opt, {"scheduler": sched})
    plain = state.digests(2)
    with TensorHashes(threads=2) as hashes:
        hashes.submit(state.tensors())
        assert state.digests(2, hashes) == plain
    exp_avg = next(iter(state.optimizer.state.values()))["exp_avg"]
    exp_avg.view(torch.int32)[0] ^= 1
    changed = state.digests(2)
    assert changed["optimizer"] != plain["optimizer"]
    assert changed["model"] == plain["model"]


def test_a_tensor_hash_sees_one_flipped_bit_anywhere_and_names_its_kind() -> None:
    from unbroken.worker.digest import TENSOR_HASH, tensor_hash

    assert TENSOR_HASH == "xxh3-128"  # the dependency is installed; sha256 only without it
    t = torch.randn(1 << 20)
    base = tensor_hash(t)
    raw = t.view(torch.uint8)
    for at in (0, raw.numel() // 2, raw.numel() - 1):
        raw[at] ^= 1
        assert tensor_hash(t) != base, f"a bit flipped at byte {at} went unseen"
        raw[at] ^= 1
    assert tensor_hash(t) == base
    # The same bytes as another dtype or shape are another tensor.
    assert tensor_hash(t.view(torch.int32)) != base
    assert tensor_hash(t.view(1024, 1024)) != base


def test_faulting_in_a_buffer_keeps_what_was_written_there() -> None:
    from unbroken.worker.replica import _FaultIn, _populate_write

    written = torch.arange(1 << 21, dtype=torch.float32)
    assert _populate_write(written)
    assert torch.equal(written, torch.arange(1 << 21, dtype=torch.float32))
    fresh = [torch.empty(1 << 20) for _ in range(4)]
    fresh[0].fill_(7.0)
    thread = _FaultIn(fresh)
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert bool((fresh[0] == 7.0).all())
    # An offset view: only the whole pages under it are touched, its bytes are kept.
    view = written[3:-5]
    assert _populate_write(view)
    assert torch.equal(written, torch.arange(1 << 21, dtype=torch.float32))
