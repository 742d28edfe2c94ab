"""``unbroken run`` reading GPU health through NVML (``devicePlugin.provider: nvml``), on a
machine with no GPU: a scripted NVML (tests/support/fakenvml) stands in for the driver, with one
GPU per device slot. The job is 2 pods x 2 ranks of examples/train_mlp.py on gloo with
``recover``, one spare node.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support import nvmlscript
from tests.support.cli_runs import (
    FIXTURES,
    STEP_SLEEP,
    Reference,
    digest,
    events,
    of_kind,
    start_job,
    status,
    unbroken,
    wait_for,
    write_job,
)
from tests.support.nvmlscript import write_state

pytestmark = pytest.mark.e2e

FAKE_NVML = nvmlscript.FAKE_DIR


@pytest.fixture
def nvml_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Six healthy GPUs, one per device slot of the three nodes, seen by every process the
    test starts."""
    path = tmp_path / "nvml.json"
    write_state(path, gpus=6)
    monkeypatch.setenv("FAKE_NVML_STATE", str(path))
    monkeypatch.setenv("PYTHONPATH", str(FAKE_NVML))
    return path


def test_an_xid_79_moves_the_pod_of_the_gpu_that_fell_off_the_bus(
    run_dir: Path, fault_free: Reference, tmp_path: Path, nvml_state: Path
) -> None:
    """Once the job has committed step 5, GPU 3 (device 1 of node-1: rank 3's) reports Xid 79.
    The event is seen at once (not at the next poll), the level is SeparateNPU: the device is
    isolated, the pod moves to the spare node (``recover``), and the job ends with the
    fault-free model. Then node-1's idle GPU 2 reports Xid 48: with ``hotReset: 2`` the
    operator's reset command runs for it; healthy again, it stays out of the pool
    (``autoStowing: false``) until ``unbroken release`` returns it."""
    job = write_job(
        tmp_path / "job.yaml",
        job=FIXTURES / "process-recover.yaml",
        replace={STEP_SLEEP: "--step-sleep=0.2"},
    )
    resets = tmp_path / "resets"
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        (FIXTURES / "cluster-nvml.yaml").read_text()
        + f"  hotReset: 2\n  resetCommand: sh -c 'echo {{gpu}} >> {resets}'\n"
        + "  autoStowing: false\n"
    )
    running = start_job(run_dir, tmp_path / "logs", "--cluster", cluster, job=job)
    try:

        def at_step(step: int) -> bool:
            assert running.proc.poll() is None, "the job ended first: " + str(running.output())
            now = status(run_dir)
            return now is not None and int(now.get("step") or 0) >= step

        wait_for(lambda: at_step(5), "step 5", 120.0)
        refused = unbroken(
            "inject", "device", "--node", "node-1", "--device", "1", "--code", "XID-79",
            "--run", run_dir,
        )  # fmt: skip
        assert refused.rc != 0 and "would never be read" in refused.stderr, refused.explain()
        write_state(nvml_state, gpus=6, xids=[{"gpu": 3, "xid": 79}])
        wait_for(lambda: bool(of_kind(events(run_dir), "RecoveryCompleted")), "recovery", 120.0)
        # Node-1 is idle now; its GPU 2 (device 0) reports a double-bit ECC error: RestartNPU,
        # so with hotReset 2 the operator's command resets it, and it returns to the pool.
        xids = [{"gpu": 3, "xid": 79}, {"gpu": 2, "xid": 48}]
        write_state(nvml_state, gpus=6, xids=xids)
        wait_for(lambda: bool(of_kind(events(run_dir), "DeviceReset")), "the reset", 60.0)
        # autoStowing false: healthy again, it stays out until an operator returns it.
        held = "device 0 of node-1 reports healthy; it stays out of the pool until released"
        wait_for(lambda: held in running.output()[0], "the hold", 30.0)
        released = unbroken("release", "--node", "node-1", "--device", "0", "--run", run_dir)
        assert released.rc == 0, released.explain()
        assert "device 0 of node-1 back in the pool" in released.stdout, released.explain()
        done = running.wait()
    finally:
        running.stop()
    assert done.rc == 0, done.explain()
    assert "device health: NVML, 6 GPU(s) under 3 node(s) x 2 device(s)" in done.stdout
    assert "job e2e-recover: SUCCEEDED" in done.stdout, done.explain()
    assert digest(run_dir) == fault_free.digest, "the recovered model differs from the fault-free"
    evs = events(run_dir)
    (fault,) = of_kind(evs, "FaultDetected")
    assert (fault["code"], fault["level"], fault["nodes"]) == ("XID-79", "SeparateNPU", ["node-1"])
    # Seen from the event, not at the next poll (every 30 s): the event's time to the ledger's.
    assert fault["at"] - fault["occurred_at"] < 3.0, fault
    isolated = [(e["node"], e["device"]) for e in of_kind(evs, "DeviceIsolated")]
    assert isolated == [("node-1", 1), ("node-1", 0)], isolated
    (decision,) = of_kind(evs, "DecisionMade", fault_id=fault["fault_id"])
    assert decision["strategy"] == "recover", decision
    assert of_kind(evs, "RecoveryCompleted", fault_id=fault["fault_id"])
    # The idle GPU's fault: nothing of the job stopped; reset by the command, back in the pool.
    assert of_kind(evs, "IdleDeviceFault", node="node-1", device=0, code="XID-48")
    assert of_kind(evs, "DeviceResetStarted", node="node-1", device=0, code="XID-48")
    assert of_kind(evs, "DeviceReset", node="node-1", device=0)
    returned = of_kind(evs, "DeviceReturned", node="node-1", device=0)
    assert [e["reason"] for e in returned] == ["released by an operator"], returned
    assert resets.read_text().split() == ["2"]


def test_validate_refuses_nvml_where_nvml_cannot_start(tmp_path: Path) -> None:
    """No NVML on this machine (no driver: the binding cannot find its library)."""
    res = unbroken("validate", FIXTURES / "job.yaml", "--cluster", FIXTURES / "cluster-nvml.yaml")
    assert res.rc != 0, res.explain()
    line = (res.stderr or res.stdout).strip().splitlines()
    assert any("cluster-nvml.yaml:6" in x and "devicePlugin.provider" in x for x in line), line
