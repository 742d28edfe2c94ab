"""The seed's TaskD manager API: its config is checked, and ``start_taskd_manager`` waits on the
run this pod belongs to (a real control server on loopback, a real ledger) or says there is
none."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from unbroken.compat import taskd
from unbroken.compat.taskd import (
    TaskdManagerConfig,
    init_taskd_manager,
    manager_config,
    start_taskd_manager,
)
from unbroken.ledger import JobPhase, JobStatus, JobSubmitted, Ledger
from unbroken.rpc import ControlServer

pytestmark = pytest.mark.unit

LOGGER = "unbroken.compat.taskd"
GOOD = {"job_id": "mlp", "node_nums": 2, "proc_per_node": 2}


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(taskd, "_manager", None)
    caplog.set_level(logging.INFO, logger=LOGGER)


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.ERROR
    ]


# ---- init_taskd_manager -----------------------------------------------------------------


def test_a_good_config_is_kept() -> None:
    assert init_taskd_manager(dict(GOOD)) is True
    assert manager_config() == TaskdManagerConfig("mlp", 2, 2)
    assert manager_config() is not None and manager_config().world_size == 4  # type: ignore[union-attr]


JOB_ID_EXPECTED = (
    "expected a non-empty string, the job's id (manager.py reads it from MINDX_TASK_ID, which "
    "Unbroken sets in every pod)"
)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            ["mlp", 2, 2],
            "init_taskd_manager: config=['mlp', 2, 2]: expected a dict with the keys job_id, "
            "node_nums, proc_per_node",
        ),
        ({**GOOD, "job_id": None}, f"init_taskd_manager: job_id=None: {JOB_ID_EXPECTED}"),
        ({**GOOD, "job_id": ""}, f"init_taskd_manager: job_id='': {JOB_ID_EXPECTED}"),
        ({**GOOD, "job_id": "  "}, f"init_taskd_manager: job_id='  ': {JOB_ID_EXPECTED}"),
        ({**GOOD, "job_id": 7}, f"init_taskd_manager: job_id=7: {JOB_ID_EXPECTED}"),
        (
            {**GOOD, "node_nums": 0},
            "init_taskd_manager: node_nums=0: expected an integer >= 1, the job's number of nodes",
        ),
        (
            {**GOOD, "node_nums": "2"},
            "init_taskd_manager: node_nums='2': expected an integer >= 1, the job's number of "
            "nodes",
        ),
        (
            {**GOOD, "node_nums": True},
            "init_taskd_manager: node_nums=True: expected an integer >= 1, the job's number of "
            "nodes",
        ),
        (
            {**GOOD, "proc_per_node": 1.5},
            "init_taskd_manager: proc_per_node=1.5: expected an integer >= 1, the training "
            "processes per node",
        ),
        (
            {**GOOD, "proc_per_node": -1},
            "init_taskd_manager: proc_per_node=-1: expected an integer >= 1, the training "
            "processes per node",
        ),
        (
            {"job_id": "mlp", "node_nums": 2},
            "init_taskd_manager: missing key 'proc_per_node': expected an integer >= 1, the "
            "training processes per node",
        ),
        (
            {**GOOD, "nodes": 2},
            "init_taskd_manager: unknown key 'nodes' (allowed: job_id, node_nums, proc_per_node)",
        ),
    ],
)
def test_a_bad_config_is_refused_with_its_reason(
    config: object, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert init_taskd_manager(config) is False  # type: ignore[arg-type]
    assert errors(caplog) == [message]
    assert manager_config() is None


def test_every_problem_is_reported_and_a_failed_init_forgets_the_last_config(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert init_taskd_manager(dict(GOOD))
    assert not init_taskd_manager({"job_id": None, "node_nums": 0, "procs": 2})
    assert errors(caplog) == [
        "init_taskd_manager: unknown key 'procs' (allowed: job_id, node_nums, proc_per_node)",
        f"init_taskd_manager: job_id=None: {JOB_ID_EXPECTED}",
        "init_taskd_manager: node_nums=0: expected an integer >= 1, the job's number of nodes",
        "init_taskd_manager: missing key 'proc_per_node': expected an integer >= 1, the "
        "training processes per node",
    ]
    assert manager_config() is None


# ---- start_taskd_manager: refusals ------------------------------------------------------


def test_start_before_init_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    assert start_taskd_manager(environ={}) is False
    assert errors(caplog) == [
        "start_taskd_manager: call init_taskd_manager({'job_id': ..., 'node_nums': ..., "
        "'proc_per_node': ...}) first (it was not called, or it failed)"
    ]


def test_outside_an_unbroken_run_says_how_to_start_one(caplog: pytest.LogCaptureFixture) -> None:
    assert init_taskd_manager(dict(GOOD))
    assert start_taskd_manager(environ={"MINDX_TASK_ID": "mlp"}) is False
    assert errors(caplog) == [
        "start_taskd_manager: job 'mlp': this process is not inside an Unbroken run "
        "(UNBROKEN_RUN_DIR is not set): in Unbroken the job manager is part of the control "
        "plane that `unbroken run JOB.yaml` starts, outside the training pods; start the job "
        "with `unbroken run JOB.yaml` (a manager.py started inside one of its pods then waits "
        "for the run to end)"
    ]


def test_a_run_that_is_not_running_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert init_taskd_manager(dict(GOOD))
    assert start_taskd_manager(environ={"UNBROKEN_RUN_DIR": str(tmp_path)}) is False
    (message,) = errors(caplog)
    assert message.startswith(
        f"start_taskd_manager: UNBROKEN_RUN_DIR={tmp_path}: run {tmp_path} is not running "
        "(no control.json); in Unbroken the job manager is part of the control plane"
    )


def write_control(run: Path, address: str, job: str | None = "mlp") -> None:
    """The control file as the job manager writes it while the run is alive."""
    data: dict[str, object] = {"address": address, "secret": "s3cret", "pid": os.getpid()}
    if job is not None:
        data["job"] = job
    (run / "control.json").write_text(json.dumps(data))


def submit(run: Path, pods: tuple[str, ...], world_size: int) -> Ledger:
    ledger = Ledger(run / "ledger.db")
    ledger.record(JobSubmitted(job="mlp", pods=pods, world_size=world_size))
    return ledger


def test_a_control_address_that_is_not_host_port_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_control(tmp_path, "nowhere")
    assert init_taskd_manager(dict(GOOD))
    assert start_taskd_manager(environ={"UNBROKEN_RUN_DIR": str(tmp_path)}) is False
    (message,) = errors(caplog)
    assert message.startswith(
        f"start_taskd_manager: UNBROKEN_RUN_DIR={tmp_path}: control plane address 'nowhere' is "
        "not host:port; "
    )


def test_another_job_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_control(tmp_path, "127.0.0.1:1", job="bert")
    assert init_taskd_manager(dict(GOOD))
    assert start_taskd_manager(environ={"UNBROKEN_RUN_DIR": str(tmp_path)}) is False
    assert errors(caplog) == [
        f"start_taskd_manager: job_id='mlp', but the run {tmp_path} is job 'bert' (job_id must "
        "be the job's name, MINDX_TASK_ID in its pods)"
    ]


def test_a_control_file_without_a_job_takes_the_pods_job_id(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_control(tmp_path, "127.0.0.1:1", job=None)
    assert init_taskd_manager(dict(GOOD))
    env = {"UNBROKEN_RUN_DIR": str(tmp_path), "UNBROKEN_JOB_ID": "bert"}
    assert start_taskd_manager(environ=env) is False
    assert errors(caplog) == [
        f"start_taskd_manager: job_id='mlp', but the run {tmp_path} is job 'bert' (job_id must "
        "be the job's name, MINDX_TASK_ID in its pods)"
    ]


def test_a_world_other_than_the_runs_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_control(tmp_path, "127.0.0.1:1")
    submit(tmp_path, ("mlp-master-0", "mlp-worker-0"), world_size=4).close()
    assert init_taskd_manager({"job_id": "mlp", "node_nums": 2, "proc_per_node": 8})
    assert start_taskd_manager(environ={"UNBROKEN_RUN_DIR": str(tmp_path)}) is False
    assert errors(caplog) == [
        "start_taskd_manager: node_nums x proc_per_node = 2 x 8 = 16, but job 'mlp' has 4 "
        "training processes"
    ]


def test_a_node_count_other_than_the_runs_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_control(tmp_path, "127.0.0.1:1")
    submit(tmp_path, ("mlp-master-0", "mlp-worker-0"), world_size=4).close()
    assert init_taskd_manager({"job_id": "mlp", "node_nums": 1, "proc_per_node": 4})
    assert start_taskd_manager(environ={"UNBROKEN_RUN_DIR": str(tmp_path)}) is False
    assert errors(caplog) == ["start_taskd_manager: node_nums=1, but job 'mlp' has 2 nodes"]


# ---- start_taskd_manager: waiting on a live run -----------------------------------------


@pytest.fixture
def control_plane() -> Iterator[ControlServer]:
    server = ControlServer("s3cret", unary={})
    server.start()
    yield server
    server.stop(0)


class _Seen(logging.Handler):
    """Sets ``event`` when a record containing ``text`` is logged."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


def run_until(action: Callable[[], None], **kwargs: float) -> tuple[bool, bool]:
    """start_taskd_manager() while a thread does ``action`` once it is waiting on the run.

    Returns (its result, whether it was waiting when the action ran)."""
    seen = _Seen("waiting for the run to end")
    logger = logging.getLogger(LOGGER)
    logger.addHandler(seen)

    def act() -> None:
        seen.event.wait(timeout=10.0)
        action()

    helper = threading.Thread(target=act)
    helper.start()
    try:
        result = start_taskd_manager(**kwargs)  # type: ignore[arg-type]
    finally:
        helper.join(timeout=10.0)
        logger.removeHandler(seen)
    return result, seen.event.is_set()


@pytest.mark.timeout(30)
def test_waits_while_the_run_lives_and_returns_when_it_ends(
    tmp_path: Path, control_plane: ControlServer, caplog: pytest.LogCaptureFixture
) -> None:
    write_control(tmp_path, control_plane.address)
    ledger = submit(tmp_path, ("mlp-master-0", "mlp-worker-0"), world_size=4)
    assert init_taskd_manager(dict(GOOD))

    def end_run() -> None:  # what the job manager does when the job is over
        ledger.set_status(
            JobStatus(
                job="mlp",
                phase=JobPhase.SUCCEEDED,
                generation=0,
                step=200,
                total_steps=200,
                pods=(),
                started_at=0.0,
                updated_at=0.0,
            )
        )
        (tmp_path / "control.json").unlink()

    result, waited = run_until(
        end_run, environ={"UNBROKEN_RUN_DIR": str(tmp_path)}, poll_s=0.02, lost_after_s=5.0
    )
    ledger.close()
    assert (result, waited) == (True, True)
    assert errors(caplog) == []
    assert messages(caplog) == [
        f"start_taskd_manager: job mlp: the job manager runs in Unbroken's control plane at "
        f"{control_plane.address} (run {tmp_path}); waiting for the run to end",
        "start_taskd_manager: job mlp: the run ended (Succeeded)",
    ]


@pytest.mark.timeout(30)
def test_a_run_whose_size_is_not_recorded_is_checked_by_job_id_only(
    tmp_path: Path, control_plane: ControlServer, caplog: pytest.LogCaptureFixture
) -> None:
    write_control(tmp_path, control_plane.address)
    assert init_taskd_manager({"job_id": "mlp", "node_nums": 3, "proc_per_node": 5})
    result, waited = run_until(
        (tmp_path / "control.json").unlink,
        environ={"UNBROKEN_RUN_DIR": str(tmp_path)},
        poll_s=0.02,
    )
    assert (result, waited) == (True, True)
    logged = messages(caplog)
    assert logged[0] == (
        "start_taskd_manager: the run does not say its size yet; job id checked only"
    )
    assert logged[-1] == "start_taskd_manager: job mlp: the run ended"


@pytest.mark.timeout(30)
def test_a_control_plane_that_stops_answering_ends_the_wait_with_false(
    tmp_path: Path, control_plane: ControlServer, caplog: pytest.LogCaptureFixture
) -> None:
    write_control(tmp_path, control_plane.address)
    assert init_taskd_manager(dict(GOOD))
    result, waited = run_until(
        lambda: control_plane.stop(0),  # killed: its control file stays behind
        environ={"UNBROKEN_RUN_DIR": str(tmp_path)},
        poll_s=0.02,
        lost_after_s=0.3,
    )
    assert (result, waited) == (False, True)
    assert errors(caplog) == [
        f"start_taskd_manager: the control plane of job mlp at {control_plane.address} stopped "
        f"answering for 0.3 s while its control file {tmp_path / 'control.json'} remains: the "
        "run's control plane is gone"
    ]


@pytest.mark.timeout(30)
def test_a_control_file_left_by_a_dead_control_plane_is_not_waited_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = ControlServer("s3cret", unary={})
    server.start()
    server.stop(0)  # its address now refuses connections
    write_control(tmp_path, server.address)
    assert init_taskd_manager(dict(GOOD))
    env = {"UNBROKEN_RUN_DIR": str(tmp_path)}
    assert start_taskd_manager(environ=env, poll_s=0.02, lost_after_s=0.3) is False
    assert errors(caplog) == [
        f"start_taskd_manager: the control plane of job mlp at {server.address} did not answer "
        f"for 0.3 s while its control file {tmp_path / 'control.json'} remains: the run's "
        "control plane is gone"
    ]
