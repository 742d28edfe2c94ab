"""``unbroken launch --join --token-file F`` reads a token file of its user's alone: one owned by
another user, or that others may read, is refused with one line naming it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from unbroken.agent.remote import JoinError, read_token

pytestmark = pytest.mark.component


def _token(tmp_path: Path, mode: int = 0o600) -> Path:
    path = tmp_path / "token"
    path.write_text("s3cret\n")
    path.chmod(mode)
    return path


def test_the_users_own_private_token_is_read(tmp_path: Path) -> None:
    assert read_token(_token(tmp_path)) == "s3cret"


def test_a_token_others_may_read_is_refused(tmp_path: Path) -> None:
    with pytest.raises(JoinError, match=r"--token-file .*token: readable by others"):
        read_token(_token(tmp_path, 0o644))


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_token_of_another_user_is_refused(tmp_path: Path) -> None:
    path = _token(tmp_path)
    os.chown(path, 12345, 12345)
    with pytest.raises(JoinError, match=r"owned by uid 12345, not by this user"):
        read_token(path)
