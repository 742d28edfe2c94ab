"""Run directories: one per run, private to its user, and locked for the run's life."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from unbroken.cli.rundir import RunDirError, claim_run_dir, control_of, is_live

pytestmark = pytest.mark.unit


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_runs_started_in_the_same_second_get_directories_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    now = 1_800_000_000.0
    with claim_run_dir("mlp", None, now) as a, claim_run_dir("mlp", None, now) as b:
        assert a.path != b.path
        assert a.path.parent == b.path.parent == (tmp_path / "runs").resolve()
        assert b.path.name == a.path.name + "-2"
        assert mode(a.path) == mode(b.path) == 0o700


def test_a_given_directory_is_made_private_and_an_existing_one_taken_over(
    tmp_path: Path,
) -> None:
    new = tmp_path / "deep" / "run"
    with claim_run_dir("mlp", new) as lock:
        assert lock.path == new.resolve()
        assert mode(new) == 0o700
    old = tmp_path / "old"
    old.mkdir(mode=0o755)
    os.chmod(old, 0o755)
    (old / "notes.txt").write_text("kept\n")
    with claim_run_dir("mlp", old):
        assert mode(old) == 0o700
    assert (old / "notes.txt").read_text() == "kept\n"


def test_a_live_runs_directory_is_refused_to_a_second_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with claim_run_dir("mlp", run):
        assert is_live(run)
        with pytest.raises(RunDirError) as info:
            claim_run_dir("mlp", run)
        assert str(info.value) == (
            f"run directory {run} belongs to a live run (pid {os.getpid()}) "
            "(choose another with --run-dir)"
        )
        assert is_live(run), "the refused claim or the probe released the live run's lock"
    assert not is_live(run)
    with claim_run_dir("mlp", run):  # a finished run's directory can be used again
        assert is_live(run)


def test_a_file_in_the_way_is_named(tmp_path: Path) -> None:
    in_the_way = tmp_path / "notes.txt"
    in_the_way.write_text("x\n")
    with pytest.raises(RunDirError, match=r"cannot use run directory .*: Not a directory"):
        claim_run_dir("mlp", in_the_way)
    assert in_the_way.read_text() == "x\n"


def test_a_directory_without_a_lock_is_live_only_while_its_control_pid_is(tmp_path: Path) -> None:
    (tmp_path / "control.json").write_text(
        f'{{"address": "127.0.0.1:1", "secret": "s", "pid": {os.getpid()}}}'
    )
    assert is_live(tmp_path)
    (tmp_path / "control.json").write_text('{"address": "127.0.0.1:1", "secret": "s", "pid": 0}')
    assert not is_live(tmp_path)
    (tmp_path / "control.json").unlink()
    assert not is_live(tmp_path)


#: A uid that is not this process's (for the tests that give a file to another user).
OTHER_UID = 4242 if os.geteuid() != 4242 else 4343
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")


@needs_root
def test_a_directory_of_another_user_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    with pytest.raises(RunDirError) as info:
        claim_run_dir("mlp", theirs)
    assert str(info.value) == (
        f"run directory {theirs}: owned by uid {OTHER_UID}, not by this user "
        f"(uid {os.geteuid()}) (choose another with --run-dir)"
    )
    assert theirs.stat().st_uid == OTHER_UID and mode(theirs) == 0o755
    assert not (theirs / "run.lock").exists()


def test_a_directory_others_may_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(RunDirError) as info:
        claim_run_dir("mlp", shared)
    assert str(info.value) == (
        f"run directory {shared}: writable by group or others (mode 777) "
        "(choose another with --run-dir)"
    )
    assert mode(shared) == 0o777 and not (shared / "run.lock").exists()


@needs_root
def test_a_control_file_of_another_user_is_not_read(tmp_path: Path) -> None:
    control = tmp_path / "control.json"
    control.write_text(f'{{"address": "127.0.0.1:1", "secret": "s", "pid": {os.getpid()}}}')
    os.chmod(control, 0o600)
    os.chown(control, OTHER_UID, OTHER_UID)
    with pytest.raises(RunDirError) as info:
        control_of(tmp_path)
    assert str(info.value) == (
        f"{control}: owned by uid {OTHER_UID}, not by this user (uid {os.geteuid()})"
    )
    assert not is_live(tmp_path)


@pytest.mark.parametrize("owner", ["other user", "world-writable"])
def test_serve_refuses_a_secret_file_or_token_file_not_its_own(
    tmp_path: Path, owner: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if owner == "other user" and os.geteuid() != 0:
        pytest.skip("giving a file to another uid needs root")
    from unbroken.cli import main

    job = Path(__file__).resolve().parents[2] / "fixtures" / "e2e" / "job.yaml"
    for flag in ("--secret-file", "--token-file"):
        token = tmp_path / f"{flag[2:]}"
        token.write_text("0123456789abcdef0123456789abcdef\n")
        os.chmod(token, 0o600)
        if owner == "other user":
            os.chown(token, OTHER_UID, OTHER_UID)
            problem = f"owned by uid {OTHER_UID}, not by this user (uid {os.geteuid()})"
        else:
            os.chmod(token, 0o622)
            problem = "writable by group or others (mode 622)"
        run_dir = tmp_path / f"run-{flag[2:]}"
        assert main(["serve", str(job), flag, str(token), "--run-dir", str(run_dir)]) == 1
        err = capsys.readouterr().err.splitlines()
        assert err[-1] == f"unbroken serve: {flag} {token}: {problem}"
        assert not run_dir.exists()
        assert token.read_text() == "0123456789abcdef0123456789abcdef\n"
