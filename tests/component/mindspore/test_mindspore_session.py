"""A MindSpore rank's session on its own (one rank, no cluster): its checkpoints restore every
parameter of the network and the optimizer bit for bit, a checkpoint of another network is
refused by name, a malformed ``MS_ENABLE_TFT`` is one clear error, and a device memory error
with no healthy replica to repair from ends the rank with its fault code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

ms = pytest.importorskip("mindspore", reason="MindSpore is not installed (unbroken[mindspore])")

from mindspore import nn  # noqa: E402

import unbroken.mindspore as ub  # noqa: E402
from unbroken.mindspore.checkpoint import CheckpointError  # noqa: E402

pytestmark = pytest.mark.component


def _model(seed: int, width: int = 8) -> tuple[Any, Any, Any]:
    ms.set_seed(seed)
    net = nn.SequentialCell(nn.Dense(4, width), nn.ReLU(), nn.Dense(width, 2))
    opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-2, weight_decay=0.1)
    loss = nn.MSELoss()
    grad_fn = ms.value_and_grad(lambda x, y: loss(net(x), y), None, opt.parameters)
    return net, opt, grad_fn


def _train(session: Any, grad_fn: Any, steps: int) -> None:
    import numpy as np

    for step in session.steps(steps):
        rng = np.random.default_rng(step)
        x = ms.Tensor(rng.standard_normal((8, 4)).astype(np.float32))
        y = ms.Tensor(rng.standard_normal((8, 2)).astype(np.float32))
        _, grads = grad_fn(x, y)
        assert session.apply(grads, clip_norm=1.0)


def test_a_checkpoint_restores_the_network_and_the_optimizer_bit_for_bit(tmp_path: Path) -> None:
    net, opt, grad_fn = _model(1)
    session = ub.init(net, opt, ckpt_dir=tmp_path, ckpt_every=3)
    _train(session, grad_fn, 6)
    session.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000003", "step_00000006"]
    trained = ub.state_digest(net, opt)

    other, other_opt, other_grad = _model(2)  # other initial weights: all replaced
    assert ub.state_digest(other, other_opt) != trained
    resumed = ub.init(other, other_opt, ckpt_dir=tmp_path)
    assert (resumed.start_step, resumed.committed) == (6, 6)
    assert ub.state_digest(other, other_opt) == trained  # moments and step count too
    _train(resumed, other_grad, 9)  # and training goes on from step 6
    resumed.close()
    assert resumed.committed == 9


def test_a_checkpoint_of_another_network_is_refused_by_name(tmp_path: Path) -> None:
    net, opt, grad_fn = _model(1)
    session = ub.init(net, opt, ckpt_dir=tmp_path, ckpt_every=2)
    _train(session, grad_fn, 2)
    session.close()
    wider, wider_opt, _ = _model(1, width=16)
    shapes = r"step_00000002: 0\.weight has shape \(8, 4\), the network's is \(16, 4\)"
    with pytest.raises(CheckpointError, match=shapes):
        ub.init(wider, wider_opt, ckpt_dir=tmp_path)


def test_a_malformed_ms_enable_tft_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    net, opt, _ = _model(1)
    monkeypatch.setenv("MS_ENABLE_TFT", "{UCE:2}")
    with pytest.raises(ValueError, match=r"environment variable MS_ENABLE_TFT: .*UCE.*'2'"):
        ub.init(net, opt)


def test_a_memory_error_with_no_healthy_replica_ends_the_rank_with_its_code(
    tmp_path: Path,
) -> None:
    """One rank, UCE on: the corrupt rank has no replica to copy from, so the error ends it;
    its exit report carries the fault code the job manager looks up."""
    script = tmp_path / "t.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            sys.path.insert(0, {tests!r})
            import unbroken.mindspore as ub
            from component.mindspore.test_mindspore_session import _model, _train
            net, opt, grad_fn = _model(1)
            session = ub.init(net, opt)
            _train(session, grad_fn, 4)
            """
        ).format(tests=str(Path(__file__).resolve().parents[2]))
    )
    hb = tmp_path / "hb" / "rank0"
    env = dict(
        os.environ,
        UNBROKEN_JOB_ID="j",
        UNBROKEN_HEARTBEAT_FILE=str(hb),
        MS_ENABLE_TFT="{UCE:1}",
        UNBROKEN_CHAOS=json.dumps([{"index": 0, "kind": "memory", "rank": 0, "at_step": 2}]),
        UNBROKEN_CHAOS_DIR=str(tmp_path / "chaos"),
        OMP_NUM_THREADS="1",
    )
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "DeviceMemoryError: uncorrectable device memory error 80E01801 on every rank" in (
        done.stderr
    )
    report = json.loads(next((tmp_path / "hb").glob("*.exit*")).read_text())
    assert report["device_code"] == "80E01801" and report["exception"] == "DeviceMemoryError"
