"""The seed's TaskD Python API over Unbroken: a TaskD script runs with its imports unchanged.

The seed starts a TaskD Manager from the rank-0 pod (``manager.py``) and a TaskD Worker in
every training process. Its import lines work as written: Unbroken installs a top-level
``taskd`` package whose ``taskd.api``, ``taskd.api.taskd_manager_api`` and
``taskd.api.taskd_worker_api`` re-export the functions of this module (the same objects)::

    from taskd.api import init_taskd_manager, start_taskd_manager
    from taskd.api.taskd_worker_api import init_taskd_worker, start_taskd_worker

Importing them from here, ``from unbroken.compat.taskd import ...``, works too. The seed's other
TaskD lines need nothing either (details in :mod:`taskd`): the ``sed`` that puts ``import
taskd.python.adaptor.patch`` into torchrun's ``run.py`` may stay, as that module patches
nothing (the pods' launcher is ``unbroken launch``, which carries what TaskD's patch adds to
torchrun). ``LD_PRELOAD`` of ``libtaskd.so`` is not needed under Unbroken, which ships no such
library: delete the seed's ``TASKD_SO_PATH=...`` and ``export LD_PRELOAD=...`` lines or keep
them. As written they preload nothing (``pip show taskd`` finds no distribution named
``taskd``, so the path is empty); a libtaskd.so path written by hand makes the dynamic loader
print one ``cannot be preloaded ... ignored`` line per process, which then runs on.

The arguments mean what they mean in the seed; what the calls do differs where Unbroken's
architecture differs, and they say so rather than pretend:

- **Manager.** Unbroken's job manager is part of the control plane that ``unbroken run
  JOB.yaml`` starts, outside every training pod (it must survive rank 0's node dying), so
  :func:`start_taskd_manager` starts nothing. Inside an Unbroken pod it checks that the run's
  control plane is alive and is the job ``init_taskd_manager`` named (job id, and the world
  ``node_nums x proc_per_node`` against the run's ledger), then waits until the run ends, as
  the seed's long-running manager process does. Outside an Unbroken run it returns False and
  says how to start one.
- **Worker.** Under an Unbroken agent the worker's duties (heartbeat, step commit, stop at a
  step boundary, in-process recovery) are the hooks of the training session,
  ``unbroken.worker.init(...)`` (``framework="pt"``) or ``unbroken.mindspore.init(...)``
  (``"ms"``); :func:`start_taskd_worker` confirms the agent is there and
  creates no session. A script that calls only this API has none: the run says once that the
  in-process rungs are unavailable to it (``RungsUnavailable``), and its faults are recovered
  by restarting its processes (in-pod restart, pod- and job-level rescheduling), which resume
  from its own checkpoint.

Every function returns a bool like the seed's and never raises: a problem is logged as an
error naming the argument, the value and what is allowed. With no logging configured (the
seed's ``manager.py`` configures none) errors still reach stderr. This module imports neither
torch nor grpc: ``manager.py`` runs as a plain Python process beside the training.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from unbroken.cli.rundir import RunDirError, control_of
from unbroken.worker.env import HEARTBEAT_FILE, JOB_ID, WorkerEnv, WorkerEnvError

log = logging.getLogger(__name__)

RUN_DIR = "UNBROKEN_RUN_DIR"  # set by the job manager for every pod of a run
MANAGER_KEYS = ("job_id", "node_nums", "proc_per_node")
FRAMEWORKS = {"pt": "PyTorch", "ms": "MindSpore"}
_HOW_TO_RUN = (
    "in Unbroken the job manager is part of the control plane that `unbroken run JOB.yaml` "
    "starts, outside the training pods; start the job with `unbroken run JOB.yaml` (a "
    "manager.py started inside one of its pods then waits for the run to end)"
)


@dataclass(frozen=True)
class TaskdManagerConfig:
    """The seed's manager config: the job's id, its node count and processes per node."""

    job_id: str
    node_nums: int
    proc_per_node: int

    @property
    def world_size(self) -> int:
        return self.node_nums * self.proc_per_node


@dataclass(frozen=True)
class TaskdWorkerConfig:
    """The seed's worker arguments (``framework`` is ``"pt"``: Unbroken trains PyTorch only).

    ``upper_limit_of_disk_in_mb`` is TaskD's cap on the disk its worker may fill with logs and
    dumps. Unbroken validates and keeps it, but nothing in Unbroken enforces it: rank logs go to
    the run directory (``pods/``) and checkpoints to the checkpoint directory, unbounded.
    """

    rank: int
    upper_limit_of_disk_in_mb: int
    framework: str


@dataclass(frozen=True)
class RunFacts:
    """What a live run says about itself: its control file and the ledger's JobSubmitted."""

    run_dir: Path
    address: str  # the control plane's host:port
    job: str | None
    world_size: int | None = None  # None: the ledger does not say (yet)
    nodes: int | None = None


_manager: TaskdManagerConfig | None = None
_worker: TaskdWorkerConfig | None = None


def manager_config() -> TaskdManagerConfig | None:
    """The config of the last successful :func:`init_taskd_manager`, if any."""
    return _manager


def worker_config() -> TaskdWorkerConfig | None:
    """The arguments of the last successful :func:`init_taskd_worker`, if any."""
    return _worker


# ---- pure checks ------------------------------------------------------------------------


def _int_at_least(value: object, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def check_manager_config(config: object) -> tuple[TaskdManagerConfig | None, list[str]]:
    """The config as a value, or None with one message per problem."""
    allowed = ", ".join(MANAGER_KEYS)
    if not isinstance(config, Mapping):
        return None, [f"config={config!r}: expected a dict with the keys {allowed}"]
    problems = [f"unknown key {k!r} (allowed: {allowed})" for k in config if k not in MANAGER_KEYS]
    expected = {
        "job_id": "a non-empty string, the job's id (manager.py reads it from MINDX_TASK_ID, "
        "which Unbroken sets in every pod)",
        "node_nums": "an integer >= 1, the job's number of nodes",
        "proc_per_node": "an integer >= 1, the training processes per node",
    }
    for key in MANAGER_KEYS:
        if key not in config:
            problems.append(f"missing key {key!r}: expected {expected[key]}")
            continue
        value = config[key]
        good = (
            isinstance(value, str) and value.strip() != ""
            if key == "job_id"
            else _int_at_least(value, 1)
        )
        if not good:
            problems.append(f"{key}={value!r}: expected {expected[key]}")
    if problems:
        return None, problems
    return TaskdManagerConfig(config["job_id"], config["node_nums"], config["proc_per_node"]), []


def check_run(config: TaskdManagerConfig, run: RunFacts) -> list[str]:
    """Why ``config`` does not describe the job of ``run`` (empty: it does)."""
    if run.job is None:
        return [f"run {run.run_dir}: its control file names no job"]
    if run.job != config.job_id:
        return [
            f"job_id={config.job_id!r}, but the run {run.run_dir} is job {run.job!r} "
            "(job_id must be the job's name, MINDX_TASK_ID in its pods)"
        ]
    problems = []
    if run.nodes is not None and run.nodes != config.node_nums:
        problems.append(f"node_nums={config.node_nums}, but job {run.job!r} has {run.nodes} nodes")
    if run.world_size is not None and run.world_size != config.world_size:
        problems.append(
            f"node_nums x proc_per_node = {config.node_nums} x {config.proc_per_node} = "
            f"{config.world_size}, but job {run.job!r} has {run.world_size} training processes"
        )
    return problems


def check_worker_args(
    rank: object, upper_limit_of_disk_in_mb: object, framework: object
) -> list[str]:
    """One message per bad argument of :func:`init_taskd_worker` (empty: all good)."""
    problems = []
    if not _int_at_least(rank, 0):
        problems.append(f"rank={rank!r}: expected an integer >= 0, the global rank")
    if not _int_at_least(upper_limit_of_disk_in_mb, 1):
        problems.append(
            f"upper_limit_of_disk_in_mb={upper_limit_of_disk_in_mb!r}: expected an integer > 0 "
            "(megabytes, e.g. 5000)"
        )
    if not isinstance(framework, str) or framework not in FRAMEWORKS:
        problems.append(f"framework={framework!r}: expected 'pt' (PyTorch) or 'ms' (MindSpore)")
    return problems


def host_port(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) split; ValueError when it is not one."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"control plane address {address!r} is not host:port")
    return host.strip("[]"), int(port)


# ---- manager ----------------------------------------------------------------------------


def init_taskd_manager(config: Mapping[str, object]) -> bool:
    """Validate and keep the seed's manager config (``job_id``, ``node_nums``,
    ``proc_per_node``); False, with an error logged per problem, when it is not valid."""
    global _manager
    _manager = None
    parsed, problems = check_manager_config(config)
    for problem in problems:
        log.error("init_taskd_manager: %s", problem)
    _manager = parsed
    return parsed is not None


def start_taskd_manager(
    *,
    environ: Mapping[str, str] | None = None,
    poll_s: float = 0.5,
    lost_after_s: float = 5.0,
) -> bool:
    """Wait, like the seed's manager process, while the run this pod belongs to is alive.

    Returns True when the run ended (its control plane shut down and removed ``control.json``;
    the job's outcome is logged and in ``unbroken status``). Returns False at once when
    :func:`init_taskd_manager` did not succeed, when this process is not inside an Unbroken
    run, or when the run is not the configured job; and False when its control plane stops
    accepting connections for ``lost_after_s`` while its control file remains (it crashed).
    ``environ`` defaults to ``os.environ``. Never raises.
    """
    try:
        return _start_manager(os.environ if environ is None else environ, poll_s, lost_after_s)
    except KeyboardInterrupt:
        log.error("start_taskd_manager: interrupted while waiting for the run to end")
        return False
    except Exception as exc:
        log.error("start_taskd_manager: unexpected %s: %s", type(exc).__name__, exc)
        log.debug("start_taskd_manager failed", exc_info=True)
        return False


def _start_manager(environ: Mapping[str, str], poll_s: float, lost_after_s: float) -> bool:
    config = _manager
    if config is None:
        log.error(
            "start_taskd_manager: call init_taskd_manager({'job_id': ..., 'node_nums': ..., "
            "'proc_per_node': ...}) first (it was not called, or it failed)"
        )
        return False
    run_dir = environ.get(RUN_DIR)
    if not run_dir:
        log.error(
            "start_taskd_manager: job %r: this process is not inside an Unbroken run (%s is not "
            "set): %s",
            config.job_id,
            RUN_DIR,
            _HOW_TO_RUN,
        )
        return False
    try:
        run = read_run(Path(run_dir), environ)
    except (RunDirError, ValueError) as exc:
        log.error("start_taskd_manager: %s=%s: %s; %s", RUN_DIR, run_dir, exc, _HOW_TO_RUN)
        return False
    problems = check_run(config, run)
    for problem in problems:
        log.error("start_taskd_manager: %s", problem)
    if problems:
        return False
    if run.world_size is None:
        log.info("start_taskd_manager: the run does not say its size yet; job id checked only")
    return _wait_for_end(run, poll_s, lost_after_s)


def read_run(run_dir: Path, environ: Mapping[str, str]) -> RunFacts:
    """The facts of the live run in ``run_dir``; RunDirError when it is not running."""
    control = control_of(run_dir)
    address = str(control["address"])
    host_port(address)
    job = control.get("job") or environ.get(JOB_ID) or None
    world_size, nodes = _submitted_size(run_dir)
    return RunFacts(
        run_dir=run_dir,
        address=address,
        job=None if job is None else str(job),
        world_size=world_size,
        nodes=nodes,
    )


def _submitted_size(run_dir: Path) -> tuple[int | None, int | None]:
    """(world size, nodes) the ledger's JobSubmitted records; (None, None) without one."""
    from unbroken.ledger import JobSubmitted, Ledger, LedgerError  # only the manager side

    path = run_dir / "ledger.db"
    if not path.exists():
        return None, None
    try:
        with Ledger(path, create=False) as ledger:
            records = ledger.events(kinds=[JobSubmitted])
    except LedgerError as exc:
        log.warning("start_taskd_manager: cannot read the job's size: %s", exc)
        return None, None
    for record in reversed(records):
        event = record.event()
        if isinstance(event, JobSubmitted):
            return event.world_size, len(event.pods)
    return None, None


def answers(address: str, timeout_s: float) -> bool:
    """Whether the control plane at ``address`` accepts a TCP connection."""
    try:
        with socket.create_connection(host_port(address), timeout=timeout_s):
            return True
    except OSError:
        return False


def _wait_for_end(run: RunFacts, poll_s: float, lost_after_s: float) -> bool:
    control = run.run_dir / "control.json"
    pause = threading.Event()
    probe_s = min(1.0, max(lost_after_s, 0.05))
    attached = False
    last_answer_at = time.monotonic()
    while control.exists():
        now = time.monotonic()
        if answers(run.address, probe_s):
            last_answer_at = now
            if not attached:
                attached = True
                log.info(
                    "start_taskd_manager: job %s: the job manager runs in Unbroken's control "
                    "plane at %s (run %s); waiting for the run to end",
                    run.job,
                    run.address,
                    run.run_dir,
                )
        elif now - last_answer_at >= lost_after_s and control.exists():
            log.error(
                "start_taskd_manager: the control plane of job %s at %s %s for %.1f s while "
                "its control file %s remains: the run's control plane is gone",
                run.job,
                run.address,
                "stopped answering" if attached else "did not answer",
                lost_after_s,
                control,
            )
            return False
        pause.wait(poll_s)
    log.info("start_taskd_manager: job %s: the run ended%s", run.job, _outcome(run.run_dir))
    return True


def _outcome(run_dir: Path) -> str:
    from unbroken.ledger import Ledger, LedgerError

    try:
        with Ledger(run_dir / "ledger.db", create=False) as ledger:
            status = ledger.status()
    except LedgerError:
        return ""
    if status is None:
        return ""
    return f" ({status.phase}{': ' + status.message if status.message else ''})"


# ---- worker -----------------------------------------------------------------------------


def init_taskd_worker(rank: int, upper_limit_of_disk_in_mb: int, framework: str) -> bool:
    """Validate and keep the seed's worker arguments: the global rank, the disk cap in MB
    (kept, not enforced: see :class:`TaskdWorkerConfig`) and the framework, ``"pt"``
    (PyTorch: the session is ``unbroken.worker.init``) or ``"ms"`` (MindSpore:
    ``unbroken.mindspore.init``)."""
    global _worker
    _worker = None
    problems = check_worker_args(rank, upper_limit_of_disk_in_mb, framework)
    for problem in problems:
        log.error("init_taskd_worker: %s", problem)
    if problems:
        return False
    _worker = TaskdWorkerConfig(rank, upper_limit_of_disk_in_mb, framework)
    return True


def start_taskd_worker(*, environ: Mapping[str, str] | None = None) -> bool:
    """True under an Unbroken agent, whose session hooks do the TaskD worker's work.

    The worker side of Unbroken is the training session, ``unbroken.worker.init(...)``: its
    step loop writes the heartbeat, commits steps, stops at a step boundary and recovers in
    process. Nothing else starts here; a script that never creates a session gets restarts
    from the agent, not those hooks. Under plain ``torchrun`` (no agent) this returns False.
    ``environ`` defaults to ``os.environ``. Never raises.
    """
    config = _worker
    if config is None:
        log.error(
            "start_taskd_worker: call init_taskd_worker(rank, upper_limit_of_disk_in_mb, 'pt') "
            "first (it was not called, or it failed)"
        )
        return False
    try:
        env = WorkerEnv.from_environ(os.environ if environ is None else environ)
    except WorkerEnvError as exc:
        log.error("start_taskd_worker: rank %d: %s", config.rank, exc)
        return False
    if env.heartbeat_file is None:
        log.error(
            "start_taskd_worker: rank %d is not running under an Unbroken agent (%s is not set: "
            "plain torchrun?), so there is no worker to start; launch the job with `unbroken "
            "run JOB.yaml` (pods run `unbroken launch`, a drop-in for torchrun)",
            config.rank,
            HEARTBEAT_FILE,
        )
        return False
    if env.rank != config.rank:
        log.warning(
            "start_taskd_worker: rank %d given, but the agent started this process as rank %d",
            config.rank,
            env.rank,
        )
    session = "unbroken.mindspore.init" if config.framework == "ms" else "unbroken.worker.init"
    log.info(
        "start_taskd_worker: rank %d of job %s: the session hooks of %s(...) take over "
        "(heartbeat, step commit, stop at a step boundary, recovery)",
        config.rank,
        env.job_id,
        session,
    )
    return True


__all__ = [
    "FRAMEWORKS",
    "MANAGER_KEYS",
    "RunFacts",
    "TaskdManagerConfig",
    "TaskdWorkerConfig",
    "answers",
    "check_manager_config",
    "check_run",
    "check_worker_args",
    "host_port",
    "init_taskd_manager",
    "init_taskd_worker",
    "manager_config",
    "read_run",
    "start_taskd_manager",
    "start_taskd_worker",
    "worker_config",
]
