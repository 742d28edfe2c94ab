"""Checkpoint manifests: commit, verification, choice of the newest good one, pruning."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from unbroken.checkpoint.manifest import (
    MANIFEST_NAME,
    CheckpointInvalid,
    find_latest_good,
    list_checkpoints,
    prune,
    step_dir,
    verify,
    write_manifest,
)

pytestmark = pytest.mark.unit


def _checkpoint(root: Path, step: int, *, commit: bool = True) -> Path:
    path = step_dir(root, step)
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(bytes(range(256)) * (step + 1))
    (path / "__1_0.distcp").write_bytes(b"rank one " * step)
    (path / ".metadata").write_bytes(b"meta")
    if commit:
        write_manifest(
            path,
            step=step,
            world_size=2,
            files=["__0_0.distcp", "__1_0.distcp", ".metadata"],
            created_at=1000.0 + step,
        )
    return path


def test_a_committed_checkpoint_verifies(tmp_path: Path) -> None:
    path = _checkpoint(tmp_path, 20)
    assert path.name == "step_00000020"
    manifest = verify(path)
    assert (manifest.step, manifest.world_size, manifest.created_at) == (20, 2, 1020.0)
    assert [f.path for f in manifest.files] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert manifest.files[1].size == 256 * 21
    doc = json.loads((path / MANIFEST_NAME).read_text())
    assert doc["format"] == "unbroken-checkpoint" and doc["step"] == 20
    assert not list(path.glob(".*.tmp"))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda p: (p / MANIFEST_NAME).unlink(), "no MANIFEST.json (the save did not finish)"),
        (lambda p: (p / "__1_0.distcp").unlink(), "file __1_0.distcp is missing"),
        (
            lambda p: (p / "__0_0.distcp").write_bytes(b"short"),
            "file __0_0.distcp is 5 bytes, the manifest says 5376",
        ),
        (
            lambda p: (p / ".metadata").write_bytes(b"META"),
            "file .metadata does not match its sha256",
        ),
        (lambda p: (p / MANIFEST_NAME).write_text("{"), "MANIFEST.json is not valid JSON"),
        (
            lambda p: (p / MANIFEST_NAME).write_text('{"format": "unbroken-checkpoint"}'),
            "MANIFEST.json has version None, expected 1",
        ),
    ],
)
def test_damage_is_named(tmp_path: Path, damage: object, reason: str) -> None:
    path = _checkpoint(tmp_path, 20)
    assert callable(damage)
    damage(path)
    with pytest.raises(CheckpointInvalid) as info:
        verify(path)
    assert info.value.path == path
    assert info.value.reason.startswith(reason)
    assert str(info.value).startswith(f"checkpoint {path} is not usable: {reason}")


def test_a_manifest_for_another_step_is_rejected(tmp_path: Path) -> None:
    path = _checkpoint(tmp_path, 10)
    moved = path.rename(step_dir(tmp_path, 30))
    with pytest.raises(CheckpointInvalid, match="says step 10, the directory says otherwise"):
        verify(moved)


def test_hashes_false_checks_sizes_only(tmp_path: Path) -> None:
    path = _checkpoint(tmp_path, 5)
    (path / ".metadata").write_bytes(b"META")
    assert verify(path, hashes=False).step == 5
    with pytest.raises(CheckpointInvalid):
        verify(path)


def test_newest_good_skips_bad_ones_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _checkpoint(tmp_path, 5)
    good = _checkpoint(tmp_path, 10)
    truncated = _checkpoint(tmp_path, 15)
    (truncated / "__0_0.distcp").write_bytes(b"x")
    unfinished = _checkpoint(tmp_path, 20, commit=False)
    (tmp_path / "step_junk").mkdir()
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    with caplog.at_level(logging.WARNING, logger="unbroken.checkpoint.manifest"):
        assert find_latest_good(tmp_path) == (10, good)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        f"skipping checkpoint {unfinished}: no MANIFEST.json (the save did not finish)",
        f"skipping checkpoint {truncated}: file __0_0.distcp is 1 bytes, the manifest says 4096",
    ]


def test_nothing_to_find(tmp_path: Path) -> None:
    assert find_latest_good(tmp_path / "absent") is None
    _checkpoint(tmp_path, 5, commit=False)
    assert find_latest_good(tmp_path) is None


def test_prune_keeps_the_newest_good_and_a_save_in_progress(tmp_path: Path) -> None:
    for step in (5, 10, 15, 20, 25):
        _checkpoint(tmp_path, step)
    stale = _checkpoint(tmp_path, 12, commit=False)
    in_progress = _checkpoint(tmp_path, 30, commit=False)
    deleted = prune(tmp_path, keep=3)
    assert sorted(deleted) == sorted([stale, step_dir(tmp_path, 10), step_dir(tmp_path, 5)])
    assert [step for step, _ in list_checkpoints(tmp_path)] == [30, 25, 20, 15]
    assert in_progress.exists()


def test_prune_needs_keep_of_at_least_one(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep must be >= 1, got 0"):
        prune(tmp_path, keep=0)
