"""Checkpoint directories and their manifests: what makes a checkpoint *good*.

A checkpoint is a directory ``<root>/step_<NNNNNNNN>`` holding the data files of one save (for
torch.distributed.checkpoint: ``__<rank>_<n>.distcp`` and ``.metadata``) and a ``MANIFEST.json``
written last: the step (the number of committed steps, which is also the index of the step
training resumes at), the world size, ``created_at``, and every data file with its size and
sha256. The manifest is written to a temporary name, fsynced and renamed into place, so a
directory either has a complete manifest or none. A directory is *good* when its manifest
parses, names the directory's step, and every listed file exists with that size and hash.

Everything here is the standard library only: the control plane and the CLI use it to find and
check checkpoints without importing torch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

MANIFEST_NAME = "MANIFEST.json"
FORMAT = "unbroken-checkpoint"
FORMAT_VERSION = 1
_DIR_RE = re.compile(r"^step_(\d+)$")
_CHUNK = 1 << 20


class CheckpointInvalid(Exception):
    """A checkpoint directory that must not be loaded; ``reason`` says why."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"checkpoint {path} is not usable: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class ManifestFile:
    path: str  # relative to the checkpoint directory
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    step: int
    world_size: int
    created_at: float
    files: tuple[ManifestFile, ...]

    def to_json(self) -> str:
        doc = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "step": self.step,
            "world_size": self.world_size,
            "created_at": self.created_at,
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in self.files],
        }
        return json.dumps(doc, indent=1) + "\n"


def step_dir(root: Path, step: int) -> Path:
    """The directory of the checkpoint taken after ``step`` committed steps."""
    return root / f"step_{step:08d}"


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Every ``step_N`` directory under ``root`` (good or not), newest first."""
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _DIR_RE.match(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), entry))
    return sorted(found, reverse=True)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(
    path: Path, *, step: int, world_size: int, files: Iterable[str], created_at: float
) -> Manifest:
    """Hash the data ``files`` of the checkpoint directory ``path`` and commit its manifest."""
    entries = tuple(
        ManifestFile(name, (path / name).stat().st_size, file_sha256(path / name))
        for name in sorted(set(files))
    )
    manifest = Manifest(step=step, world_size=world_size, created_at=created_at, files=entries)
    tmp = path / f".{MANIFEST_NAME}.tmp"
    with tmp.open("w", encoding="utf-8") as f:
        f.write(manifest.to_json())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path / MANIFEST_NAME)
    _fsync_dir(path)
    return manifest


def _parse(path: Path, text: str) -> Manifest:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointInvalid(path, f"{MANIFEST_NAME} is not valid JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointInvalid(path, f"{MANIFEST_NAME} is not an {FORMAT} manifest")
    if doc.get("version") != FORMAT_VERSION:
        raise CheckpointInvalid(
            path, f"{MANIFEST_NAME} has version {doc.get('version')!r}, expected {FORMAT_VERSION}"
        )
    try:
        files = tuple(
            ManifestFile(str(f["path"]), int(f["size"]), str(f["sha256"])) for f in doc["files"]
        )
        return Manifest(
            step=int(doc["step"]),
            world_size=int(doc["world_size"]),
            created_at=float(doc["created_at"]),
            files=files,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointInvalid(
            path, f"{MANIFEST_NAME} lacks or mistypes a field ({e!r})"
        ) from None


def verify(path: Path, *, hashes: bool = True) -> Manifest:
    """The manifest of a good checkpoint; raises :class:`CheckpointInvalid` otherwise.

    With ``hashes=False`` only presence and sizes are checked (no file is read).
    """
    path = Path(path)
    try:
        text = (path / MANIFEST_NAME).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CheckpointInvalid(path, f"no {MANIFEST_NAME} (the save did not finish)") from None
    except OSError as e:
        raise CheckpointInvalid(path, f"{MANIFEST_NAME} cannot be read ({e})") from None
    manifest = _parse(path, text)
    match = _DIR_RE.match(path.name)
    if match and int(match.group(1)) != manifest.step:
        raise CheckpointInvalid(
            path, f"{MANIFEST_NAME} says step {manifest.step}, the directory says otherwise"
        )
    if not manifest.files:
        raise CheckpointInvalid(path, f"{MANIFEST_NAME} lists no files")
    for entry in manifest.files:
        file = path / entry.path
        try:
            size = file.stat().st_size
        except FileNotFoundError:
            raise CheckpointInvalid(path, f"file {entry.path} is missing") from None
        if size != entry.size:
            raise CheckpointInvalid(
                path, f"file {entry.path} is {size} bytes, the manifest says {entry.size}"
            )
        if hashes and file_sha256(file) != entry.sha256:
            raise CheckpointInvalid(path, f"file {entry.path} does not match its sha256")
    return manifest


def find_latest_good(root: Path, *, hashes: bool = True) -> tuple[int, Path] | None:
    """The newest good checkpoint under ``root`` as ``(step, path)``, or None.

    Every newer directory that is not good is skipped with a warning naming it and the reason.
    """
    for step, path in list_checkpoints(Path(root)):
        try:
            verify(path, hashes=hashes)
        except CheckpointInvalid as e:
            logger.warning("skipping checkpoint %s: %s", e.path, e.reason)
            continue
        return step, path
    return None


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest good checkpoints, and every directory older than the
    newest good one that is not good (a save that never finished). Returns what was deleted.

    Directories newer than the newest good checkpoint are left alone: one may be a save in
    progress.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    good: list[Path] = []
    deleted: list[Path] = []
    for _step, path in list_checkpoints(Path(root)):
        try:
            verify(path, hashes=False)
        except CheckpointInvalid:
            if good:
                shutil.rmtree(path, ignore_errors=True)
                deleted.append(path)
            continue
        good.append(path)
        if len(good) > keep:
            shutil.rmtree(path, ignore_errors=True)
            deleted.append(path)
    for path in deleted:
        logger.info("deleted old checkpoint %s", path)
    return deleted
