"""Hostile or loose YAML given to ``unbroken validate``, ``plan`` and ``run`` (the job, --chaos,
--codes, --cluster): one line naming the file and the problem, exit 1, in bounded time, no
traceback, no run directory and no process left behind."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.cli_runs import JOB, processes_of, run_job, unbroken

pytestmark = pytest.mark.e2e

#: A few hundred bytes whose aliases expand to 9**8 values.
BOMB = "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)
)
DEEP = "a: " + "[" * 20000 + "]" * 20000 + "\n"


@pytest.mark.parametrize("text", [BOMB, DEEP], ids=["alias-bomb", "deep"])
def test_validate_and_plan_refuse_hostile_job_yaml(tmp_path: Path, text: str) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(text)
    for command in ("validate", "plan"):
        res = unbroken(command, job, timeout_s=30.0)
        assert res.rc == 1, res.explain()
        (line,) = res.stderr.splitlines()
        assert line.startswith(f"{job}:1: "), res.explain()
        assert "aliases expand" in line or "nested deeper than 64 levels" in line, line


@pytest.mark.parametrize(
    ("option", "name", "data", "problem"),
    [
        ("--chaos", "chaos.yaml", BOMB.encode(), "aliases expand the file"),
        ("--chaos", "chaos.yaml", DEEP.encode(), "nested deeper than 64 levels"),
        ("--chaos", "chaos.yaml", b"faults:\n  - {kind: kill, rank: 1, at_step: \xff}\n", ""),
        (
            "--chaos",
            "chaos.yaml",
            b"faults:\n  - {kind: hang, rank: 1, after_s: .nan}\n",
            "faults[0].after_s: nan is not a finite number of seconds",
        ),
        ("--codes", "codes.yaml", DEEP.encode(), "nested deeper than 64 levels"),
        ("--cluster", "cluster.yaml", BOMB.encode(), "aliases expand the file"),
    ],
)
def test_run_refuses_hostile_side_files_before_making_anything(
    tmp_path: Path, option: str, name: str, data: bytes, problem: str
) -> None:
    bad = tmp_path / name
    bad.write_bytes(data)
    run_dir = tmp_path / "run"
    res = run_job(run_dir, option, bad, job=JOB, timeout_s=60.0)
    assert res.rc == 1, res.explain()
    assert res.stdout == "", res.explain()
    (line,) = res.stderr.splitlines()
    # job and cluster problems are printed as validate prints them; the others with the command
    assert line.removeprefix("unbroken run: ").startswith(f"{bad}:"), res.explain()
    assert problem in line or "not UTF-8 text" in line, line
    assert "Traceback" not in res.stderr
    assert not run_dir.exists(), "a run directory was made for input that cannot run"
    assert not processes_of(run_dir)
