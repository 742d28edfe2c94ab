"""``unbroken run``, ``status``, ``events`` and ``inject`` given something wrong: exit 1, the
reason on stderr (no traceback), and nothing the user had is lost. A corrupt checkpoint is the
one bad input a run gets past: it resumes from the previous good checkpoint."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from tests.support.cli_runs import (
    FIXTURES,
    JOB,
    Reference,
    digest,
    events,
    of_kind,
    processes_of,
    run_job,
    status,
    unbroken,
    write_job,
)

pytestmark = pytest.mark.e2e


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_invalid_job_yaml_names_the_file_line_and_allowed_tokens(tmp_path: Path) -> None:
    job = write_job(
        tmp_path / "job.yaml",
        replace={
            'pod-rescheduling: "on"\n': 'pod-rescheduling: "on"\n'
            "  annotations:\n"
            '    recover-strategy: "recover,bogus"\n'
        },
    )
    before = job.read_bytes()
    run_dir = tmp_path / "run"
    res = run_job(run_dir, job=job)
    assert res.rc == 1, res.explain()
    assert res.stdout == "", res.explain()
    line = line_of(job, "recover-strategy:")
    assert (
        f"{job}:{line}: metadata.annotations.recover-strategy: unknown recovery strategy: "
        "got 'bogus'; allowed: retry, recover-in-place, recover, elastic-training, dump, exit"
    ) in res.stderr.splitlines(), res.explain()
    assert "Traceback" not in res.stderr
    assert not run_dir.exists(), "a run directory was made for a job that cannot run"
    assert job.read_bytes() == before


def test_missing_training_script_is_named_with_where_it_was_looked_for(tmp_path: Path) -> None:
    job = write_job(tmp_path / "job.yaml", script="no_such_train.py")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    run_dir = tmp_path / "run"
    res = unbroken("run", job, "--run-dir", run_dir, "--quiet", cwd=cwd)
    assert res.rc == 1, res.explain()
    assert res.stderr == (
        f"unbroken run: training script 'no_such_train.py' not found (looked in {tmp_path}, "
        f"{cwd})\n"
    ), res.explain()
    assert not (run_dir / "ledger.db").exists()
    assert not processes_of(run_dir)


def test_master_port_in_use_is_named(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        job = write_job(
            tmp_path / "job.yaml",
            replace={"--master_port=$(MASTER_PORT)": f"--master_port={port}"},
        )
        run_dir = tmp_path / "run"
        res = run_job(run_dir, job=job)
        assert res.rc == 1, res.explain()
        assert res.stderr.startswith(
            f"unbroken run: cannot open the rendezvous store on 127.0.0.1:{port} "
            "(--master_port of the job: is the port in use?): "
        ), res.explain()
        assert "Traceback" not in res.stderr
        # The socket held is still ours, and no pod was started.
        assert held.getsockname() == ("127.0.0.1", port)
    assert not processes_of(run_dir)
    assert not (run_dir / "pods").exists()
    st = unbroken("status", run_dir)
    assert st.rc == 1 and st.stderr == f"unbroken status: {run_dir}: the job has not started yet\n"


def test_unwritable_run_directory_is_refused_and_the_file_in_the_way_kept(tmp_path: Path) -> None:
    in_the_way = tmp_path / "notes.txt"
    in_the_way.write_text("not a directory\n")
    res = run_job(in_the_way / "run")
    assert res.rc == 1, res.explain()
    assert res.stderr == (
        f"unbroken run: cannot use run directory {in_the_way / 'run'}: Not a directory "
        "(choose another with --run-dir)\n"
    ), res.explain()
    assert in_the_way.read_text() == "not a directory\n"


def test_chaos_rank_that_does_not_exist_names_the_entry_and_the_ranks(tmp_path: Path) -> None:
    chaos = FIXTURES / "rank-out-of-range.yaml"
    run_dir = tmp_path / "run"
    res = run_job(run_dir, "--chaos", chaos)
    assert res.rc == 1, res.explain()
    line = line_of(chaos, "rank: 7")
    assert res.stderr == (
        f"unbroken run: {chaos}:{line}: faults[1].rank: 7 does not exist (the job has ranks 0-3)\n"
    ), res.explain()
    assert not (run_dir / "ledger.db").exists()
    assert not processes_of(run_dir)


@pytest.mark.parametrize("wrong", ["script", "chaos"])
def test_bad_input_leaves_no_run_directory_behind(tmp_path: Path, wrong: str) -> None:
    if wrong == "script":
        job = write_job(tmp_path / "job.yaml", script="no_such_train.py")
        extra: tuple[str | Path, ...] = ()
    else:
        job = JOB
        extra = ("--chaos", FIXTURES / "rank-out-of-range.yaml")
    run_dir = tmp_path / "run"
    res = run_job(run_dir, *extra, job=job)
    assert res.rc == 1, res.explain()
    assert not run_dir.exists()


def test_bad_codes_file_is_named_before_anything_is_made(tmp_path: Path) -> None:
    codes = tmp_path / "codes.yaml"
    codes.write_text("codes: [\n")
    run_dir = tmp_path / "run"
    res = run_job(run_dir, "--codes", codes)
    assert res.rc == 1, res.explain()
    assert res.stdout == "", res.explain()
    assert res.stderr.startswith(f"unbroken run: {codes}:2: "), res.explain()
    assert len(res.stderr.splitlines()) == 1, res.explain()
    assert not run_dir.exists(), "a run directory was made for a codes file that cannot be read"


def test_status_events_inject_on_a_directory_that_is_not_a_run(tmp_path: Path) -> None:
    (tmp_path / "ledger.txt").write_text("not a ledger\n")
    for argv, prog in (
        (("status", tmp_path), "status"),
        (("status", tmp_path, "--json"), "status"),
        (("events", tmp_path), "events"),
        (("events", tmp_path, "--incidents"), "events"),
        (("inject", "kill", "--rank", "0", "--run", tmp_path), "inject"),
    ):
        res = unbroken(*argv)
        assert res.rc == 1, res.explain()
        assert res.stdout == "", res.explain()
        assert res.stderr == (
            f"unbroken {prog}: {tmp_path} is not a run directory (no ledger.db in it)\n"
        ), res.explain()
    assert (tmp_path / "ledger.txt").read_text() == "not a ledger\n"


def test_inject_into_a_run_that_is_over(fault_free: Reference) -> None:
    res = unbroken("inject", "hang", "--rank", "2", "--run", fault_free.run_dir)
    assert res.rc == 1, res.explain()
    assert res.stderr == (
        f"unbroken inject: run {fault_free.run_dir} is not running (no control.json)\n"
    )
    # The finished run still reads as it was.
    st = status(fault_free.run_dir)
    assert st is not None and st["phase"] == "Succeeded" and st["faults"] == 0, st


def test_corrupt_newest_checkpoint_resumes_from_the_previous_good_one(
    tmp_path: Path, run_dir: Path, fault_free: Reference
) -> None:
    ckpt = run_dir / "checkpoints"
    first_job = write_job(
        tmp_path / "first.yaml",
        replace={"--ckpt-dir=checkpoints": f"--ckpt-dir={ckpt}", "--steps=60": "--steps=25"},
    )
    first = run_job(run_dir / "first", job=first_job)
    assert first.rc == 0, first.explain()
    assert (ckpt / "step_00000010" / "MANIFEST.json").is_file()
    assert (ckpt / "step_00000020" / "MANIFEST.json").is_file()

    # Bytes flipped in place: the sizes still match, only the manifest's sha256 can tell.
    data = ckpt / "step_00000020" / "__1_0.distcp"
    size = data.stat().st_size
    with data.open("r+b") as f:
        f.seek(size // 2)
        chunk = f.read(64)
        f.seek(size // 2)
        f.write(bytes(b ^ 0xFF for b in chunk))
    assert data.stat().st_size == size

    second_job = write_job(
        tmp_path / "second.yaml", replace={"--ckpt-dir=checkpoints": f"--ckpt-dir={ckpt}"}
    )
    second = run_job(run_dir / "second", job=second_job)
    assert second.rc == 0, second.explain()
    assert "step 60/60; 0 fault(s)" in second.stdout, second.explain()

    loaded = of_kind(events(run_dir / "second"), "StateLoaded", generation=0)
    assert [(e["step"], e["source"]) for e in loaded] == [(10, "checkpoint")], loaded
    rank0_log = (
        run_dir / "second" / "pods" / "e2e-mlp-master-0" / "logs" / "rank0.log"
    ).read_text()
    assert (
        f"skipping checkpoint {ckpt / 'step_00000020'}: file __1_0.distcp does not match its sha256"
    ) in rank0_log, rank0_log
    result = json.loads((run_dir / "second" / "result.json").read_text())
    assert result["start_step"] == 10, result
    assert digest(run_dir / "second") == fault_free.digest
