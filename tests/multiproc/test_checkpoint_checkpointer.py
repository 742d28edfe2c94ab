"""The Checkpointer and the RNG capture in one process (real torch, no process group)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from unbroken.checkpoint import (
    Checkpointer,
    CheckpointError,
    find_latest_good,
    list_checkpoints,
    verify,
)
from unbroken.worker import rng, state_digest

pytestmark = [
    pytest.mark.multiproc,
    # DCP says it assumes a single process when no process group exists: that is the point here.
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]


def _model_and_optimizer(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(4, 8, generator=g)
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()


def test_a_save_holds_the_state_of_its_step_not_a_later_one(tmp_path: Path) -> None:
    model, opt = _model_and_optimizer(0)
    _train(model, opt, 3)
    at_save = state_digest(model)
    ckpt = Checkpointer(tmp_path)
    ckpt.save_async(3, model, opt, {"data_pos": torch.tensor([3])})
    _train(model, opt, 2)  # the model moves on while the save may still be writing
    assert ckpt.wait() == 3
    assert ckpt.wait() is None  # nothing in flight any more

    fresh, fresh_opt = _model_and_optimizer(1)
    restored = Checkpointer(tmp_path).load_latest(fresh, fresh_opt)
    assert restored is not None
    assert (restored.step, restored.world_size) == (3, 1)
    assert restored.extra["data_pos"].tolist() == [3]
    assert state_digest(fresh) == at_save
    assert fresh_opt.state_dict()["state"][0]["step"].item() == 3.0


def test_resumed_training_matches_uninterrupted_training(tmp_path: Path) -> None:
    model, opt = _model_and_optimizer(0)
    _train(model, opt, 4)
    ckpt = Checkpointer(tmp_path)
    ckpt.save_async(4, model, opt)
    ckpt.close()
    _train(model, opt, 3)

    resumed, resumed_opt = _model_and_optimizer(7)
    assert Checkpointer(tmp_path).load_latest(resumed, resumed_opt) is not None
    _train(resumed, resumed_opt, 3)
    assert state_digest(resumed) == state_digest(model)


def test_keeps_the_newest_k(tmp_path: Path) -> None:
    model, opt = _model_and_optimizer(0)
    ckpt = Checkpointer(tmp_path, keep=2)
    for step in (1, 2, 3, 4):
        _train(model, opt, 1)
        ckpt.save_async(step, model, opt)  # waits for the previous save first
    ckpt.close()
    assert [step for step, _ in list_checkpoints(tmp_path)] == [4, 3]
    assert verify(tmp_path / "step_00000004").world_size == 1


def test_nothing_to_restore(tmp_path: Path) -> None:
    model, opt = _model_and_optimizer(0)
    before = state_digest(model)
    assert Checkpointer(tmp_path / "empty").load_latest(model, opt) is None
    assert state_digest(model) == before
    assert find_latest_good(tmp_path / "empty") is None


def test_rng_states_round_trip() -> None:
    torch.manual_seed(11)
    random.seed(12)
    np.random.seed(13)
    random.gauss(0, 1)  # leaves a cached gaussian in Python's state
    states = rng.capture()
    expected = (torch.rand(3).tolist(), random.random(), random.gauss(0, 1), np.random.rand())
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    assert rng.restore(states) == [rng.TORCH, rng.PYTHON, rng.NUMPY]
    assert (torch.rand(3).tolist(), random.random(), random.gauss(0, 1), np.random.rand()) == (
        expected
    )
    assert all(t.dtype in (torch.uint8, torch.int64, torch.float64) for t in states.values())


def test_last_words_are_a_whole_job_checkpoint_from_one_replica(tmp_path: Path) -> None:
    """One rank writes the state of a job of 4 ranks: every rank finds its data position in
    it, and a save of the same step that never got its manifest is moved aside, not mixed in."""
    model, opt = _model_and_optimizer(0)
    _train(model, opt, 5)
    unfinished = tmp_path / "step_00000005"
    unfinished.mkdir(parents=True)
    (unfinished / "__1_0.distcp").write_bytes(b"half a save")
    ckpt = Checkpointer(tmp_path)
    extra = {r: {"data_pos": torch.tensor([5])} for r in range(4)}
    path = ckpt.save_last_words(5, model, opt, extra, world_size=4)
    assert path == unfinished and verify(path).world_size == 4
    assert not (path / "__1_0.distcp").exists()
    assert (tmp_path / "step_00000005.invalid" / "__1_0.distcp").exists()
    assert find_latest_good(tmp_path) is not None
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []

    fresh, fresh_opt = _model_and_optimizer(1)
    restored = Checkpointer(tmp_path).load_latest(fresh, fresh_opt)
    assert restored is not None and (restored.step, restored.world_size) == (5, 4)
    assert restored.extra["data_pos"].tolist() == [5]
    assert state_digest(fresh) == state_digest(model)
    _train(fresh, fresh_opt, 2)
    _train(model, opt, 2)
    assert state_digest(fresh) == state_digest(model)  # the optimizer state came back too


def test_last_words_keep_a_good_checkpoint_of_the_same_step(tmp_path: Path) -> None:
    model, opt = _model_and_optimizer(0)
    ckpt = Checkpointer(tmp_path)
    ckpt.save_async(2, model, opt)
    ckpt.close()
    before = verify(tmp_path / "step_00000002")
    _train(model, opt, 1)  # the last words would differ: they must not replace a good save
    path = ckpt.save_last_words(2, model, opt, {0: {}}, world_size=1)
    assert verify(path) == before


def test_last_words_that_cannot_be_written_leave_nothing_behind(tmp_path: Path) -> None:
    model, opt = _model_and_optimizer(0)
    (tmp_path / "file").write_text("not a directory")
    ckpt = Checkpointer(tmp_path / "file" / "ckpt")
    with pytest.raises(CheckpointError, match=r"saving last words of step 3 to .*file/ckpt"):
        ckpt.save_last_words(3, model, opt, {0: {}}, world_size=1)
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


def test_a_new_checkpoint_directory_is_private(tmp_path: Path) -> None:
    """Restoring unpickles a checkpoint's metadata: only its owner may write (or read) it."""
    model, opt = _model_and_optimizer(0)
    root = tmp_path / "ckpt"
    ckpt = Checkpointer(root)
    ckpt.save_async(1, model, opt)
    ckpt.wait()
    ckpt.save_last_words(2, model, opt, {0: {}}, world_size=1)
    assert root.stat().st_mode & 0o777 == 0o700
    for _, path in list_checkpoints(root):
        assert path.stat().st_mode & 0o777 == 0o700, path
