"""MindFormers' model config, read where the seed sets ``hccl_watchdog: False`` for a MindSpore
job with process-level recovery (unbroken.spec.mindformers)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from unbroken.spec import load_job

pytestmark = pytest.mark.unit

SEED = Path(__file__).resolve().parents[2] / "fixtures" / "seed"
CONFIG = "configs/qwen3/pretrain_qwen3_32b_4k.yaml"
# The seed's context block, with the field it adds (its value is the test's parameter).
CONTEXT = """\
context:
  mode: 0
  device_target: "Ascend"
  max_device_memory: "59GB"
  jit_config:
    jit_level: "O1"
  ascend_config:
{watchdog}
"""


def _job(tmp_path: Path, watchdog: str | None) -> list[str]:
    job = tmp_path / "job.yaml"
    shutil.copy(SEED / "online-recovery-mindspore.yaml", job)
    if watchdog is not None:
        config = tmp_path / CONFIG
        config.parent.mkdir(parents=True)
        config.write_text(CONTEXT.format(watchdog=watchdog))
    return [w for w in load_job(job).warnings if "--config" in w]


def test_the_seeds_setting_is_checked_and_says_nothing(tmp_path: Path) -> None:
    assert _job(tmp_path, "    hccl_watchdog: False") == []


@pytest.mark.parametrize(
    ("watchdog", "shown"),
    [("    hccl_watchdog: True", "True"), ("    op_timeout: 60", "not set (on)")],
)
def test_a_watchdog_left_on_is_a_warning_naming_the_file_and_the_key(
    tmp_path: Path, watchdog: str, shown: str
) -> None:
    (warning,) = _job(tmp_path, watchdog)
    assert f"--config {CONFIG}: context.ascend_config.hccl_watchdog is {shown}: " in warning
    assert "set it to False, as the seed does" in warning


def test_a_config_not_beside_the_job_is_said_to_be_unchecked(tmp_path: Path) -> None:
    (warning,) = _job(tmp_path, None)
    assert f"the MindFormers config is not beside the job ({tmp_path / CONFIG})" in warning
    assert "is not checked" in warning


def test_settings_mindspore_ranks_do_not_act_on_are_warned_about(tmp_path: Path) -> None:
    """Op retry, TSP (link failover, stress tests) and hot switching need the ranks'
    collectives regrouped in live processes: a MindSpore job that sets them is told why not."""
    warnings = load_job(SEED / "link-failover-mindspore.yaml").warnings
    (op_retry,) = [w for w in warnings if "HCCL_OP_RETRY_ENABLE" in w]
    assert "op retry is not run for MindSpore ranks" in op_retry
    (tsp,) = [w for w in warnings if "export MS_ENABLE_TFT" in w]
    assert "TSP (link failover, online stress tests) is not run for MindSpore ranks" in tsp
    assert "MindSpore ranks cannot regroup their collectives in a live process" in tsp
    job = tmp_path / "job.yaml"
    job.write_text(
        (SEED / "pod-rescheduling-mindspore.yaml")
        .read_text()
        .replace("  labels:\n", '  labels:\n    subHealthyStrategy: "hotSwitch"\n', 1)
        .replace('TASKD_PROCESS_ENABLE="off"', 'TASKD_PROCESS_ENABLE="on"')
    )
    (hot,) = [w for w in load_job(job).warnings if "hotSwitch" in w]
    assert "hotSwitch is not run for MindSpore ranks" in hot
    # A PyTorch job with the same settings gets none of these.
    assert not [
        w for w in load_job(SEED / "online-recovery-pytorch.yaml").warnings if "MindSpore" in w
    ]
