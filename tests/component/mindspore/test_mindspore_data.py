"""A MindSpore rank's data and registered state (unbroken.mindspore.data, the session's
``data=`` and ``state=``), one rank, no cluster: the stream crosses epochs with a new shuffle
each, a redone step is served the same batches, a restored session resumes the stream and the
state where the checkpoint left them, and last words are written once however many ranks try."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ms = pytest.importorskip("mindspore", reason="MindSpore is not installed (unbroken[mindspore])")

import mindspore.dataset as ds  # noqa: E402
from mindspore import nn  # noqa: E402

import unbroken.mindspore as ub  # noqa: E402
from unbroken.checkpoint.manifest import step_dir  # noqa: E402
from unbroken.mindspore import checkpoint  # noqa: E402
from unbroken.mindspore.data import Batches, DataError  # noqa: E402
from unbroken.mindspore.session import tracked_parameters  # noqa: E402

pytestmark = pytest.mark.component


class Samples:
    """12 samples, random access (so a sampler can shuffle them)."""

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        x = np.full((4,), i, np.float32)
        return x, np.array([i % 3, -i], np.float32)

    def __len__(self) -> int:
        return 12


def _dataset() -> Any:
    # Built as a script builds it, after the same seed in every process: the sampler takes
    # the dataset seed when it is built, too.
    ms.set_seed(11)
    return ds.GeneratorDataset(Samples(), ["x", "y"], shuffle=True).batch(4)  # 3 an epoch


def _ids(batch: Any) -> list[int]:
    return [int(v) for v in batch[0].asnumpy()[:, 0]]


def _stream(batches: Batches, n: int) -> list[list[int]]:
    return [_ids(batches.next()) for _ in range(n)]


def test_the_stream_crosses_epochs_each_with_its_own_order() -> None:
    batches = Batches(_dataset(), seed=7)
    epochs = [_stream(batches, 3) for _ in range(3)]
    for epoch in epochs:
        assert sorted(i for b in epoch for i in b) == list(range(12))  # every sample, once
    assert len({json.dumps(e) for e in epochs}) == 3  # a new shuffle every epoch
    assert batches.epoch == 2 and batches.index == 3
    # The same seed: the same stream (a restart's).
    again = Batches(_dataset(), seed=7)
    assert [_stream(again, 3) for _ in range(3)] == epochs


def test_a_redone_step_gets_the_same_batches_and_a_position_resumes_the_stream() -> None:
    batches = Batches(_dataset(), seed=3)
    served = []
    for step in range(5):  # two batches a step
        batches.begin_step()
        got = _stream(batches, 2)
        if step == 2:  # the update was left out: the step is redone
            batches.redo()
            batches.begin_step()
            assert _stream(batches, 2) == got
        batches.commit()
        served.append(got)
    position = batches.committed_position
    assert position == [3, 1]  # 10 batches of 3 an epoch
    later = _stream(batches, 4)

    resumed = Batches(_dataset(), seed=3)
    resumed.load(position)
    assert _stream(resumed, 4) == later
    # A plain iterable of batches is an epoch per pass too.
    plain = Batches([(np.array([[i]], np.float32),) for i in range(3)], seed=None)
    plain.load([4, 2])
    assert [int(plain.next()[0][0, 0]) for _ in range(3)] == [2, 0, 1]


def test_a_position_past_the_epoch_is_refused() -> None:
    batches = Batches(_dataset(), seed=3)
    batches.load([0, 5])
    with pytest.raises(DataError, match="epoch 0 has 3 batches, the position says 5"):
        batches.next()


class TokensSeen:
    """Registered state, as a script keeps it: plain numbers behind state_dict()."""

    def __init__(self) -> None:
        self.tokens = 0

    def state_dict(self) -> dict[str, int]:
        return {"tokens": self.tokens}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.tokens = int(state["tokens"])


def _run(ckpt: Path, steps: int, seed: int = 5) -> tuple[str, Any, TokensSeen]:
    dataset = _dataset()
    ms.set_seed(1)
    net = nn.Dense(4, 2)
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-2)
    loss = nn.MSELoss()
    grad_fn = ms.value_and_grad(lambda x, y: loss(net(x), y), None, opt.parameters)
    seen = TokensSeen()
    session = ub.init(
        net, opt, ckpt_dir=ckpt, ckpt_every=4, seed=seed, data=dataset, state={"seen": seen}
    )
    for _ in session.steps(steps):
        x, y = session.batch()
        seen.tokens += int(x.shape[0])
        _, grads = grad_fn(x, y)
        session.apply(grads)
    session.close()
    return ub.state_digest(net, opt), session, seen


def test_a_restored_session_resumes_the_data_and_the_state_bitwise(tmp_path: Path) -> None:
    whole, whole_session, whole_seen = _run(tmp_path / "whole", 10)
    assert whole_session.data_position == [3, 1]

    _run(tmp_path / "cut", 4)  # a checkpoint at step 4, then the process ends
    extra = json.loads((step_dir(tmp_path / "cut", 4) / "extra.json").read_text())
    assert extra["data"] == [1, 1] and extra["state"] == {"seen": {"tokens": 16}}
    resumed, session, seen = _run(tmp_path / "cut", 10)
    assert session.start_step == 4
    assert (resumed, session.data_position, seen.tokens) == (
        whole,
        whole_session.data_position,
        whole_seen.tokens,
    )


def test_a_checkpoint_without_the_registered_state_is_refused(tmp_path: Path) -> None:
    _run(tmp_path, 4)
    ms.set_seed(1)
    net = nn.Dense(4, 2)
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-2)
    with pytest.raises(checkpoint.CheckpointError, match="holds no state 'ema'"):
        ub.init(net, opt, ckpt_dir=tmp_path, data=_dataset(), state={"ema": TokensSeen()})
    with pytest.raises(TypeError, match=r"state\['lr'\] \(float\) has no state_dict"):
        ub.init(net, opt, ckpt_dir=tmp_path, state={"lr": 0.1})


def test_last_words_are_written_once_by_the_rank_that_claims_them(tmp_path: Path) -> None:
    net = nn.Dense(4, 2)
    params = tracked_parameters(net, None)
    extra = {"step": 5, "world_size": 2}
    # The first rank to claim step 5 writes it; a rank that comes later finds it written.
    assert not checkpoint.last_words_taken(tmp_path, 5)
    assert checkpoint.save_last_words(tmp_path, 5, params, extra, 2, 3) == step_dir(tmp_path, 5)
    assert checkpoint.last_words_taken(tmp_path, 5)  # a rank blocked in a collective may go
    assert checkpoint.save_last_words(tmp_path, 5, params, extra, 2, 3) is None
    # A claim whose writer died mid-save: left to it (its step is not loaded), until the next
    # generation, every old process gone, clears what it left.
    (tmp_path / ".step_00000007.lastwords").touch()
    (tmp_path / ".step_00000007.tmp.4242").mkdir()
    assert checkpoint.save_last_words(tmp_path, 7, params, extra, 2, 3) is None
    assert checkpoint.last_words_taken(tmp_path, 7)  # claimed: being written
    assert checkpoint.load_latest(tmp_path, params) is not None  # step 5's
    checkpoint.clear_leftovers(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000005"]
    assert checkpoint.save_last_words(tmp_path, 7, params, extra, 2, 3) == step_dir(tmp_path, 7)
