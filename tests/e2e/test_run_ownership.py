"""What a run exposes and who owns it: its rendezvous store listens on 127.0.0.1 alone, its
directory is private and belongs to it alone, a malformed control message does not end it, and
SIGTERM stops it as SIGINT does; ``unbroken status`` tells a run whose control plane is gone."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
from pathlib import Path
from typing import Any

import grpc
import pytest
from tests.support.cli_runs import (
    JOB,
    STEP_SLEEP,
    assert_no_processes_left,
    events,
    of_kind,
    start_job,
    status,
    unbroken,
    wait_for,
    write_job,
)

pytestmark = pytest.mark.e2e

START_S = 150.0  # from `unbroken run` to every rank training, on two shared cores


def long_job(tmp_path: Path) -> Path:
    """The e2e job with ten times its steps: a run stopped from outside is still training when
    the signal comes, however late a loaded machine shows its ranks training."""
    return write_job(tmp_path / "long.yaml", replace={"--steps=60": "--steps=600"})


def non_loopback_address() -> str | None:
    """An IPv4 address of this machine outside loopback (``ip -4 -o addr``), if it has one."""
    try:
        out = subprocess.run(
            ["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        fields = line.split()
        if "inet" in fields:
            addr = fields[fields.index("inet") + 1].split("/")[0]
            if not addr.startswith("127."):
                return addr
    return None


def connectable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2.0):
            return True
    except OSError:
        return False


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def call(address: str, secret: str, method: str, body: bytes) -> tuple[grpc.StatusCode, bytes]:
    """One control-plane call as any gRPC client can make it: the status and the reply."""
    with grpc.insecure_channel(address) as channel:
        stub = channel.unary_unary(f"/unbroken.Control/{method}")
        try:
            reply: bytes = stub(body, metadata=(("x-unbroken-secret", secret),), timeout=20.0)
        except grpc.RpcError as exc:
            return exc.code(), b""
    return grpc.StatusCode.OK, reply


def running_with_ranks(run_dir: Path) -> bool:
    st = status(run_dir)
    return st is not None and st["phase"] == "Running" and all(p["pids"] for p in st["pods"])


def test_a_live_run_is_on_loopback_private_and_its_own(tmp_path: Path, run_dir: Path) -> None:
    other = non_loopback_address()
    if other is None:
        pytest.skip("this machine has no IPv4 address outside loopback to try the store from")
    # Links planted where the control file is written: the run must not write through them.
    run_dir.mkdir(mode=0o755)
    os.chmod(run_dir, 0o755)
    victim = tmp_path / "victim.txt"
    victim.write_text("not the run's\n")
    (run_dir / "control.tmp").symlink_to(victim)
    (run_dir / "control.json").symlink_to(victim)

    # Steps of 0.1 s: the run stays live through the checks below (at the e2e job's 0.02 s
    # it could end before a loaded machine got to the second run).
    job = write_job(tmp_path / "job.yaml", replace={STEP_SLEEP: "--step-sleep=0.1"})
    bg = start_job(run_dir, tmp_path / "logs", job=job)
    try:
        wait_for(
            lambda: (
                "store 127.0.0.1:" in bg.output()[0]
                and not (run_dir / "control.json").is_symlink()
                and (run_dir / "control.json").is_file()
            ),
            "the store's address and the control file",
            START_S,
        )
        found = re.search(r"store 127\.0\.0\.1:(\d+)", bg.output()[0])
        assert found is not None
        port = int(found.group(1))
        assert connectable("127.0.0.1", port)
        assert not connectable(other, port), f"the store 127.0.0.1:{port} answers on {other}"
        # The manager hosts no store of its own: a keeper forked from the node image does, and
        # the manager never loads torch.
        maps = Path(f"/proc/{bg.proc.pid}/maps").read_text()
        assert "libtorch" not in maps, "the job manager loaded torch"

        assert mode(run_dir) == 0o700
        assert mode(run_dir / "control.json") == 0o600
        assert victim.read_text() == "not the run's\n"

        second = unbroken("run", JOB, "--run-dir", run_dir, "--quiet")
        assert second.rc == 1, second.explain()
        assert second.stdout == "", second.explain()
        assert second.stderr == (
            f"unbroken run: run directory {run_dir} belongs to a live run (pid {bg.proc.pid}) "
            "(choose another with --run-dir)\n"
        ), second.explain()

        # Malformed messages with the run's secret are refused; the control plane goes on.
        control: dict[str, Any] = json.loads((run_dir / "control.json").read_text())
        address, secret = control["address"], control["secret"]
        bad = json.dumps({"pod": "e2e-mlp-master-0", "agent_pid": "not-a-pid"}).encode()
        assert call(address, secret, "AgentHeartbeat", bad)[0] == grpc.StatusCode.OK
        code, reply = call(address, secret, "AgentHello", bad)
        assert code == grpc.StatusCode.OK
        assert json.loads(reply)["ok"] is False, reply
        assert call(address, secret, "AgentReport", b"\xff{")[0] == (
            grpc.StatusCode.INVALID_ARGUMENT
        )
        assert call(address, "guess", "AgentReport", b"\xff{")[0] == (
            grpc.StatusCode.UNAUTHENTICATED
        )
        res = bg.wait()
    finally:
        bg.stop()
    assert res.rc == 0, res.explain()
    assert "job e2e-mlp: SUCCEEDED" in res.stdout, res.explain()
    assert "Traceback" not in res.stderr, res.explain()
    assert victim.read_text() == "not the run's\n"
    assert not (run_dir / "control.json").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signalled_run_stops_every_process_and_records_the_stop(
    tmp_path: Path, run_dir: Path, sig: signal.Signals
) -> None:
    """A graceful stop is the run's own terminal record: ``JobStopped`` with the signal and the
    step, the status ``Stopped``, the shell's exit code for the signal, and no process left."""
    bg = start_job(run_dir, tmp_path / "logs", "--quiet", job=long_job(tmp_path))
    try:
        wait_for(lambda: running_with_ranks(run_dir), "every rank training", START_S)
        wait_for(lambda: (status(run_dir) or {}).get("step", 0) > 0, "a step committed", START_S)
        bg.proc.send_signal(sig)
        res = bg.wait(60.0)
    finally:
        bg.stop()
    assert res.rc == 128 + sig.value, res.explain()  # 130 for SIGINT, 143 for SIGTERM
    assert_no_processes_left(run_dir, deadline_s=5.0)
    (stopped,) = of_kind(events(run_dir), "JobStopped")
    assert stopped["signal"] == sig.name and stopped["step"] > 0, stopped
    step = stopped["step"]
    assert res.stderr == (
        f"unbroken run: stopped by {sig.name} at step {step}; every process of the run was "
        "stopped\n"
    ), res.explain()
    st = unbroken("status", run_dir)
    assert st.rc == 0, st.explain()
    assert f"phase:       Stopped (stopped by {sig.name} at step {step})\n" in st.stdout, (
        st.explain()
    )
    as_json = status(run_dir)
    assert as_json is not None, as_json
    assert (as_json["control_plane"], as_json["phase"], as_json["step"]) == (
        "stopped",
        "Stopped",
        step,
    )
    assert as_json["goodput"]["finished"] is True, as_json


def test_a_control_plane_of_other_hosts_stopped_by_sigint_records_the_stop(
    tmp_path: Path, run_dir: Path
) -> None:
    """``unbroken serve`` stops as ``unbroken run`` does: stopped while its hosts have not
    joined yet, it records the stop at step 0 and exits 130."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    listen = f"127.0.0.1:{port}"
    bg = start_job(run_dir, tmp_path / "logs", "--listen", listen, "--quiet", command="serve")
    try:
        wait_for(
            lambda: (
                (run_dir / "ledger.db").exists() and bool(of_kind(events(run_dir), "PodPlaced"))
            ),
            "a pod placed",
            START_S,
        )
        bg.proc.send_signal(signal.SIGINT)
        res = bg.wait(60.0)
    finally:
        bg.stop()
    assert res.rc == 130, res.explain()
    assert res.stderr.splitlines()[-1] == (
        "unbroken serve: stopped by SIGINT at step 0; every process of the run was stopped"
    ), res.explain()
    assert_no_processes_left(run_dir, deadline_s=5.0)
    (stopped,) = of_kind(events(run_dir), "JobStopped")
    assert stopped["signal"] == "SIGINT" and stopped["step"] == 0, stopped
    as_json = status(run_dir)
    assert as_json is not None and as_json["phase"] == "Stopped", as_json
    assert as_json["message"] == "stopped by SIGINT at step 0", as_json


def test_a_killed_run_reads_as_stopped(tmp_path: Path, run_dir: Path) -> None:
    bg = start_job(run_dir, tmp_path / "logs", "--quiet", job=long_job(tmp_path))
    try:
        wait_for(lambda: running_with_ranks(run_dir), "every rank training", START_S)
        live = status(run_dir)
        assert live is not None and live["control_plane"] == "running", live
        bg.proc.send_signal(signal.SIGKILL)
        bg.proc.wait(30.0)
        st = unbroken("status", run_dir)
        assert st.rc == 0, st.explain()
        assert "phase:       stopped (control plane not running; last recorded: Running" in (
            st.stdout
        ), st.explain()
    finally:
        bg.stop()
    # Agents that lose their control plane stop their ranks and exit (10 s without an answer).
    assert_no_processes_left(run_dir, deadline_s=45.0)
