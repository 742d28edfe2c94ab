"""``unbroken stress-test`` against a job that ``unbroken run`` is running: 2 pods x 2 ranks of
examples/train_mlp.py on gloo, ``recover`` among its strategies, one spare node.

Every rank stops at a step boundary, checks its device (a fixed-seed matrix product's checksum
against the one it computed at its start) and its links (GB/s between paired ranks), and
training resumes. On a healthy job nothing restarts and nothing is recomputed; with a device
made to compute wrong (``unbroken inject sdc``: silent data corruption, the device's health
stays good) the test finds it, the ladder isolates the device and moves its pod to the spare
node, and training resumes. Either way the final model is the fault-free one, bit for bit."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tests.support.cli_runs import (
    FIXTURES,
    JOB,
    SLOW_STEP_SLEEP,
    STEP_SLEEP,
    Background,
    Reference,
    Result,
    digest,
    events,
    of_kind,
    replica_specs,
    start_job,
    status,
    unbroken,
    wait_for,
    write_job,
)
from tests.support.process_helpers import (
    rank_pids,
    recomputed_steps,
    started_ranks,
    status_rank_pids,
)

from unbroken.ledger import Ledger, LedgerError
from unbroken.rpc import ControlClient

pytestmark = pytest.mark.e2e

RECOVER = FIXTURES / "process-recover.yaml"
MASTER, WORKER = "e2e-recover-master-0", "e2e-recover-worker-0"
RANKS = [0, 1, 2, 3]


def started(tmp_path: Path, run_dir: Path, step_sleep: str) -> Background:
    """The job in the background with steps long enough for a command to reach it while it
    trains; returns once the job's status says it committed step 5."""
    assert replica_specs(RECOVER) == replica_specs(JOB), "another model than the e2e job's"
    job = write_job(tmp_path / "job.yaml", job=RECOVER, replace={STEP_SLEEP: step_sleep})
    bg = start_job(run_dir, tmp_path / "logs", job=job)

    def trained_5_steps() -> bool:
        assert bg.proc.poll() is None, "the job ended early: " + str(bg.output())
        try:
            with Ledger(run_dir / "ledger.db", create=False) as ledger:
                st = ledger.status()
        except LedgerError:  # not created yet
            return False
        return st is not None and st.step >= 5

    wait_for(trained_5_steps, "the job's status at step 5", deadline_s=120.0)
    return bg


def finish(bg: Background) -> Result:
    try:
        return bg.wait()
    finally:
        bg.stop()


def test_a_stress_test_of_a_healthy_job_pauses_and_resumes_it(
    run_dir: Path, fault_free: Reference, tmp_path: Path
) -> None:
    # 55 steps of 0.1 s after step 5: time for a command from another process on a loaded
    # machine.
    bg = started(tmp_path, run_dir, "--step-sleep=0.1")
    try:
        res = unbroken("stress-test", "--run", run_dir)
    finally:
        done = finish(bg)
    assert done.rc == 0, done.explain()
    assert "step 60/60; 0 fault(s), 0 recovery(ies)" in done.stdout, done.explain()
    assert digest(run_dir) == fault_free.digest, "the model differs from the fault-free run's"

    # The command's own output: the request, every rank's codes and checksum, every link.
    out = res.stdout
    assert res.rc in (0, 1), res.explain()  # 1: a link flagged slow on a loaded machine
    assert out.startswith(
        "stress test 1: every rank stops at its next step boundary, then checks its device "
        "and its links\n"
    ), res.explain()
    rows = re.findall(r"^ +(\d) +(node-\d) +(\d) +(\d) +(\d) +([0-9a-f]{16})", out, re.M)
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        ("0", "node-0", "0", "0"),
        ("1", "node-0", "1", "0"),
        ("2", "node-1", "0", "0"),
        ("3", "node-1", "1", "0"),
    ], res.explain()
    assert len({r[5] for r in rows}) == 1, "the ranks' checksums differ"
    links = re.findall(r"^  link (\d)-(\d): +([0-9.]+) GB/s  code (\d)", out, re.M)
    assert sorted((a, b) for a, b, _, _ in links) == [
        ("0", "1"),
        ("0", "3"),
        ("1", "2"),
        ("2", "3"),
    ]
    assert all(float(g) > 0 and c in "01" for _, _, g, c in links), res.explain()
    assert re.search(
        r"^training resumed: step \d+ committed by generation 1; paused [0-9.]+ s \(stop "
        r"[0-9.]+ s, test [0-9.]+ s, rejoin [0-9.]+ s\)$",
        out,
        re.M,
    ), res.explain()

    evs = events(run_dir)
    (tested,) = of_kind(evs, "StressTested")
    assert tested["round"] == 1 and tested["faulty"] == [], tested
    assert [r["device_code"] for r in tested["ranks"]] == [0, 0, 0, 0], tested
    (finished,) = of_kind(evs, "StressTestFinished")
    assert (finished["round"], finished["generation"], finished["recovered"]) == (1, 1, False)
    # Training resumes with the step after the one every rank stopped at: nothing redone.
    assert finished["step"] == tested["step"] + 1, (tested, finished)
    parts = finished["stop_s"] + finished["test_s"] + finished["resume_s"]
    assert 0 < finished["paused_s"] == pytest.approx(parts, abs=1e-6), finished
    assert not of_kind(evs, "FaultDetected") and not of_kind(evs, "DecisionMade")
    # No process restarted: every rank trained to the end in the process it started in.
    assert started_ranks(evs) == RANKS
    st = status(run_dir)
    assert st is not None and status_rank_pids(st) == rank_pids(evs)


def test_a_stress_test_finds_a_device_that_computes_wrong_and_the_pod_moves(
    run_dir: Path, fault_free: Reference, tmp_path: Path
) -> None:
    bg = started(tmp_path, run_dir, SLOW_STEP_SLEEP)  # the calls come from this process
    try:
        control = json.loads((run_dir / "control.json").read_text())
        client = ControlClient(str(control["address"]), str(control["secret"]), timeout_s=15.0)
        try:
            sdc = {"kind": "sdc", "node": "node-1", "device": 1}
            injected = client.call("Inject", sdc)
            assert injected["ok"], injected
            reply = client.call("StressTest", {})
            # A second request while the first holds the ranks is refused, saying why.
            again = client.call("StressTest", {})
        finally:
            client.close()
        assert reply["ok"] and reply["round"] == 1, reply
        assert again == {"ok": False, "error": "stress test 1 is still under way"}, again
    finally:
        done = finish(bg)
    assert done.rc == 0, done.explain()
    assert "step 60/60; 1 fault(s), 1 recovery(ies)" in done.stdout, done.explain()
    assert digest(run_dir) == fault_free.digest, "the model differs from the fault-free run's"

    evs = events(run_dir)
    (tested,) = of_kind(evs, "StressTested")
    assert tested["faulty"] == [3] and tested["code"] == 2, tested
    bad = tested["ranks"][3]
    assert (bad["node"], bad["device"], bad["device_code"]) == ("node-1", 1, 2), bad
    assert "computed at start" in bad["reason"], bad
    assert [r["device_code"] for r in tested["ranks"][:3]] == [0, 0, 0], tested
    assert len({r["checksum"] for r in tested["ranks"]}) == 2, tested

    (fault,) = of_kind(evs, "FaultDetected")
    assert (fault["source"], fault["level"], fault["pods"], fault["ranks"]) == (
        "stress-test",
        "SeparateNPU",
        [WORKER],
        [3],
    ), fault
    (decision,) = of_kind(evs, "DecisionMade")
    assert decision["strategy"] == "recover", decision
    isolated = of_kind(evs, "DeviceIsolated")
    assert [(e["node"], e["device"]) for e in isolated] == [("node-1", 1)], isolated
    assert [(e["pod"], e["node"]) for e in of_kind(evs, "PodPlaced", generation=1)] == [
        (WORKER, "node-2")
    ]
    (finished,) = of_kind(evs, "StressTestFinished")
    assert finished["recovered"] and finished["code"] == 2, finished
    assert finished["step"] == tested["step"] + 1 and recomputed_steps(run_dir) == 0
    (recovered,) = of_kind(evs, "RecoveryCompleted")
    assert recovered["step"] == finished["step"], (recovered, finished)
    # The master pod's processes never restarted; the worker pod's run on the spare node.
    first, final = rank_pids(evs[: evs.index(fault)]), rank_pids(evs)
    assert (final[0], final[1]) == (first[0], first[1]) and final[3] != first[3]
    st = status(run_dir)
    assert st is not None
    assert {p["name"]: p["node"] for p in st["pods"]} == {MASTER: "node-0", WORKER: "node-2"}
