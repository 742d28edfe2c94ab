"""``unbroken run`` with a device code of every fault level, through the ``sim`` health provider:
2 pods x 2 ranks of examples/train_mlp.py on gloo, one spare node. Each level does what the
seed's level means (``unbroken.faults.fault``), and every run ends with the fault-free model,
bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.support.cli_runs import (
    FIXTURES,
    STEP_SLEEP,
    Reference,
    digest,
    events,
    of_kind,
    run_job,
    start_job,
    unbroken,
    wait_for,
    write_job,
)

pytestmark = pytest.mark.e2e

IN_PLACE = FIXTURES / "process-recover-in-place.yaml"


def faults_by_level(evs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f["level"]: f for f in of_kind(evs, "FaultDetected")}


def decision_of(evs: list[dict[str, Any]], fault_id: str) -> dict[str, Any]:
    (made,) = of_kind(evs, "DecisionMade", fault_id=fault_id)
    return made


def test_each_level_of_a_device_code_under_offline_reset(
    run_dir: Path, fault_free: Reference, tmp_path: Path
) -> None:
    """hotReset 2. At step 5: rank 0's device says NotHandle (recorded, nothing else), rank 1's
    PreSeparateNPU (out of the pool, training goes on), rank 3's FreeRestartNPU (the job
    restarts; the device is reset once its pod has stopped, not at once). At step 30 device 0 of
    node-1 says RestartNPU: reset at once, and the job waits for it before it starts again."""
    job = write_job(tmp_path / "job.yaml", job=IN_PLACE, replace={STEP_SLEEP: "--step-sleep=0.15"})
    res = run_job(
        run_dir,
        "--cluster",
        FIXTURES / "cluster-offline-reset.yaml",
        "--chaos",
        FIXTURES / "device-levels.yaml",
        job=job,
    )
    assert res.rc == 0, res.explain()
    assert "job e2e-inplace: SUCCEEDED" in res.stdout, res.explain()
    assert digest(run_dir) == fault_free.digest, "the recovered model differs from the fault-free"
    evs = events(run_dir)
    found = faults_by_level(evs)
    assert set(found) == {"NotHandle", "PreSeparateNPU", "FreeRestartNPU", "RestartNPU"}, found
    # The step-5 codes name the ranks placed there at the start; the pods move after that.
    assert [(found[k]["code"], found[k]["ranks"]) for k in sorted(found)] == [
        ("8C0E4E00", [3]),
        ("80E21007", [0]),
        ("110001024", [1]),
        ("80E18005", found["RestartNPU"]["ranks"]),
    ]
    assert found["RestartNPU"]["nodes"] == ["node-1"], found["RestartNPU"]
    # NotHandle: recorded, no command; PreSeparateNPU: isolated, nothing stops.
    not_handle = of_kind(evs, "DecisionMade", fault_id=found["NotHandle"]["fault_id"])
    assert all(d["commands"] == [] for d in not_handle), not_handle
    pre = decision_of(evs, found["PreSeparateNPU"]["fault_id"])
    assert pre["strategy"] == "none" and "training goes on" in pre["reason"], pre
    isolated = [(e["node"], e["device"], e["reason"]) for e in of_kind(evs, "DeviceIsolated")]
    assert ("node-0", 1, "fault level PreSeparateNPU") in isolated, isolated
    assert not [i for i in isolated if i[:2] == ("node-0", 0)], isolated
    # Both stopping levels were recovered; one device reset each, at different moments.
    free, npu = found["FreeRestartNPU"]["fault_id"], found["RestartNPU"]["fault_id"]
    assert [e["fault_id"] for e in of_kind(evs, "RecoveryCompleted")] == [free, npu]
    resets = {e["code"]: e["id"] for e in of_kind(evs, "DeviceResetStarted")}
    assert set(resets) == {"8C0E4E00", "80E18005"}, resets
    assert [(e["node"], e["device"]) for e in of_kind(evs, "DeviceResetStarted")] == [
        ("node-1", 1),
        ("node-1", 0),
    ]
    # FreeRestartNPU: not reset when it was found, only once its pod's processes had stopped.
    (stopped, *_) = [
        e["id"] for e in of_kind(evs, "PodsStopped") if e["id"] > found["FreeRestartNPU"]["id"]
    ]
    assert resets["8C0E4E00"] > stopped, (resets, stopped)
    # RestartNPU: reset as soon as it was seen, before its decision.
    assert resets["80E18005"] < decision_of(evs, npu)["id"], resets
    assert sorted(e["device"] for e in of_kind(evs, "DeviceReset")) == [0, 1]


def test_a_manually_separated_device_stays_out_until_an_operator_releases_it(
    run_dir: Path, fault_free: Reference, tmp_path: Path
) -> None:
    """A user's code table rates 80E3A201 ``ManuallySeparateNPU`` (the reference's spelling):
    rank 3's device fails at step 5, the pod moves to the spare node and the device stays out
    of the pool when it reports healthy again, until ``unbroken release`` returns it."""
    codes = tmp_path / "codes.yaml"
    codes.write_text('codes:\n  "80E3A201": {level: ManuallySeparateNPU}\n')
    job = write_job(tmp_path / "job.yaml", replace={STEP_SLEEP: "--step-sleep=0.2"})
    running = start_job(
        run_dir,
        tmp_path / "logs",
        "--cluster",
        FIXTURES / "cluster-fast-watch.yaml",
        "--chaos",
        FIXTURES / "device-isolate.yaml",
        "--codes",
        codes,
        job=job,
    )
    try:

        def said(text: str) -> bool:
            assert running.proc.poll() is None, "the job ended first: " + str(running.output())
            return text in running.output()[0]

        wait_for(lambda: said("ManuallySeparate: out until released"), "the hold", 120.0)
        clear = unbroken(
            "inject", "device", "--node", "node-1", "--device", "1", "--clear", "--run", run_dir
        )
        assert clear.rc == 0, clear.explain()
        wait_for(lambda: said("stays out of the pool until released"), "healthy, held", 30.0)
        release = unbroken("release", "--node", "node-1", "--device", "1", "--run", run_dir)
        assert release.rc == 0, release.explain()
        assert "device 1 of node-1 back in the pool" in release.stdout, release.explain()
        done = running.wait()
    finally:
        running.stop()
    assert done.rc == 0, done.explain()
    assert "job e2e-mlp: SUCCEEDED" in done.stdout, done.explain()
    assert digest(run_dir) == fault_free.digest, "the recovered model differs from the fault-free"
    evs = events(run_dir)
    (fault,) = of_kind(evs, "FaultDetected")
    assert (fault["code"], fault["level"]) == ("80E3A201", "ManuallySeparate"), fault
    returned = [(e["node"], e["device"], e["reason"]) for e in of_kind(evs, "DeviceReturned")]
    assert returned == [("node-1", 1, "released by an operator")], returned


def test_a_restart_request_code_restarts_only_the_rank_on_that_device(
    run_dir: Path, fault_free: Reference, tmp_path: Path
) -> None:
    """RestartRequest on rank 3's device: the step must be redone, the device needs no reset
    and stays in the pool, so ``recover-in-place`` gives rank 3 a new process on the same
    device and the other ranks keep theirs."""
    job = write_job(tmp_path / "job.yaml", job=IN_PLACE, replace={STEP_SLEEP: "--step-sleep=0.05"})
    res = run_job(
        run_dir,
        "--cluster",
        FIXTURES / "cluster-fast-watch.yaml",
        "--chaos",
        FIXTURES / "device-restart-request.yaml",
        job=job,
    )
    assert res.rc == 0, res.explain()
    assert "step 60/60; 1 fault(s), 1 recovery(ies)" in res.stdout, res.explain()
    assert digest(run_dir) == fault_free.digest, "the recovered model differs from the fault-free"
    evs = events(run_dir)
    (fault,) = of_kind(evs, "FaultDetected")
    assert (fault["code"], fault["level"], fault["ranks"]) == ("80C98009", "RestartRequest", [3])
    assert decision_of(evs, fault["fault_id"])["strategy"] == "recover-in-place"
    restarted = of_kind(evs, "ProcessesStarted", generation=1)
    assert [r for e in restarted for r in e["ranks"]] == [3], restarted
    assert not of_kind(evs, "DeviceIsolated") and not of_kind(evs, "DeviceResetStarted")
