"""The job manager as one component: scripted agents send typed reports, a fake clock drives
its loop, and the test reads the orders it sends back and the facts it records. No torch, no
processes, no network: what is asserted is the manager's decisions for a sequence of reports."""

from __future__ import annotations

import json
import queue
import threading
from pathlib import Path
from typing import Any

import pytest
from tests.support.manager_job import (
    PODS,
    T0,
    Job,
    ScriptedAgent,
    device_event,
    placement_as_edges,
    scripted_job,
)

from unbroken.cli import main
from unbroken.devices import (
    DeviceFaulted,
    DeviceMonitor,
    DeviceRecovered,
    SimProvider,
    inject_device_fault,
)
from unbroken.faults import FaultLevel
from unbroken.manager.layout import ManagerOptions
from unbroken.manager.liveness import STALL_GRACE_S
from unbroken.manager.service import STREAM_CLOSED, Inbound, build_server
from unbroken.policy import Recovering, RestartProcesses, RungFailed, Running
from unbroken.protocol.heartbeat import HeartbeatRecord, Phase
from unbroken.protocol.kinds import StepFailure
from unbroken.protocol.messages import (
    AgentHeartbeat,
    AgentHello,
    EndRanks,
    JoinFrom,
    PauseRanks,
    RankExited,
    RankFailed,
    RankHung,
    RankProgress,
    RanksRejoined,
    RejoinRanks,
    RestartRanks,
    WriteLastWords,
    decode_answer,
)
from unbroken.scheduler import Binding
from unbroken.spec.knobs import (
    Strategy,
    SubHealthyStrategy,
)

pytestmark = pytest.mark.component


def test_a_killed_rank_is_recovered_in_place_and_its_peers_are_not_blamed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = scripted_job(tmp_path, monkeypatch, Strategy.RECOVER_IN_PLACE)
    a0, a1 = job.agents
    # The peers' collectives fail first (echoes), then the killed rank's exit arrives.
    for a, rank in ((a0, 0), (a0, 1), (a1, 2)):
        a.send(RankFailed(rank, 2000 + rank, StepFailure.COLLECTIVE, 10, job.clock() - 0.01))
    job.tick()
    assert job.events("FaultDetected") == []
    a1.send(RankExited(rank=3, pid=2003, returncode=-9, exited_at=job.clock(), signal="SIGKILL"))
    job.tick()
    (fault,) = job.events("FaultDetected")
    assert (fault["source"], fault["code"], fault["ranks"]) == (
        "process-exit",
        "signal:SIGKILL",
        [3],
    )
    (decision,) = job.events("DecisionMade")
    assert decision["strategy"] == "recover-in-place"
    # The replica source's pod alone pauses (rank 0, the lowest of the most advanced).
    assert a1.orders() == [EndRanks((3,))]
    assert a0.orders() == [PauseRanks()]

    # Its ranks stop at a step boundary: the rejoin goes out to every pod, state from rank 0
    # at the step it stopped at; rank 2, still training, stops when the rejoin reaches it.
    a0.beat(Phase.STOPPING, committed=10)
    job.tick()
    assert job.m.gens.current == 1
    assert a0.orders() == [RejoinRanks(1, 29501, source=0, step=10, replace=())]
    assert a1.orders() == [RejoinRanks(1, 29501, source=0, step=10, replace=(3,))]
    rung = job.m.gens.rung_of(1)
    state = job.m.executor.policy_state
    assert isinstance(state, Recovering) and state.generation == rung

    # The new generation commits its first step: the incident ends, the policy runs again.
    job.clock.advance(1.0)
    for a in job.agents:
        a.generation = 1
        a.rank_pids = {r: 2000 + r for r in a.ranks} | ({3: 3003} if a is a1 else {})
        a.send(RanksRejoined(pids=a.rank_pids, joined=(3,) if a is a1 else (), started_at=T0))
        a.beat(Phase.TRAINING, committed=11, start_step=10, ready_at=job.clock())
    job.tick()
    (done,) = job.events("RecoveryCompleted")
    assert (done["strategy"], done["generation"], done["step"]) == ("recover-in-place", 1, 11)
    assert isinstance(job.m.executor.policy_state, Running)
    assert [e["pids"] for e in job.events("ProcessesStarted")][-1] == [3003]


def test_a_hung_rank_is_the_fault_not_the_peer_its_silence_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = scripted_job(tmp_path, monkeypatch, Strategy.RECOVER_IN_PLACE)
    a0, a1 = job.agents
    a0.send(
        RankExited(
            rank=0,
            pid=2000,
            returncode=1,
            exited_at=job.clock(),
            traceback="Traceback (most recent call last):\nRuntimeError: Connection closed by peer",
            peer_failure=True,
        )
    )
    a1.send(RankHung(rank=3, pid=2003, silent_s=0.8, timeout_s=0.6, last_tick_at=job.clock() - 1))
    job.tick()
    (fault,) = job.events("FaultDetected")
    assert (fault["source"], fault["ranks"]) == ("hang", [3])
    # A hang is no process exit: recover-in-place does not take it; the next rung does.
    assert job.events("DecisionMade")[0]["strategy"] != "recover-in-place"


def test_a_collective_failing_with_every_peer_alive_is_a_link_fault_retried_online(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = scripted_job(tmp_path, monkeypatch, Strategy.RETRY, Strategy.RECOVER_IN_PLACE)
    a0, a1 = job.agents
    a1.send(RankFailed(2, 2002, StepFailure.COLLECTIVE, 10, job.clock()))
    job.tick(0.1)
    assert job.events("FaultDetected") == []  # held: the cause may yet be reported
    while job.clock() - T0 < ManagerOptions().settle_s + 0.1:  # the agents keep beating
        for a in job.agents:
            a.beat(Phase.TRAINING, committed=10)
        job.tick(0.1)
    (fault,) = job.events("FaultDetected")
    assert (fault["source"], fault["code"], fault["ranks"]) == ("link", "collective-failed", [2])
    assert job.events("DecisionMade")[0]["strategy"] == "retry"
    # Rank 2 is suspect: the replica source is rank 0, whose pod alone pauses.
    assert a0.orders() == [PauseRanks()] and a1.orders() == []


def test_reports_of_an_older_generation_are_echoes_of_a_fault_already_handled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = scripted_job(tmp_path, monkeypatch, Strategy.RECOVER_IN_PLACE)
    a0, _ = job.agents
    job.m.gens.current = 1  # as if a recovery had begun generation 1
    a0.send(RankExited(rank=0, pid=2000, returncode=-9, exited_at=job.clock(), signal="SIGKILL"))
    job.tick(1.0)
    assert job.events("FaultDetected") == []


def test_a_second_fault_starts_the_next_rung_and_the_first_rungs_outcomes_are_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = scripted_job(tmp_path, monkeypatch, Strategy.RECOVER_IN_PLACE, Strategy.DUMP)
    a0, a1 = job.agents
    a1.send(RankExited(rank=3, pid=2003, returncode=-9, exited_at=job.clock(), signal="SIGKILL"))
    job.tick()
    first = job.m.executor.policy_state
    assert isinstance(first, Recovering) and str(first.rung) == "recover-in-place"
    assert a1.orders() == [EndRanks((3,))] and a0.orders() == [PauseRanks()]

    # While the replica source's ranks pause, rank 1 is killed too: the next rung is last
    # words, then an in-pod restart of every rank (no rescheduling is allowed for this job).
    job.clock.advance(0.1)
    a0.send(RankExited(rank=1, pid=2001, returncode=-9, exited_at=job.clock(), signal="SIGKILL"))
    job.tick()
    second = job.m.executor.policy_state
    assert isinstance(second, Recovering) and second.generation == first.generation + 1
    decision = job.events("DecisionMade")[-1]
    assert decision["strategy"] == str(second.rung)
    commands = [c.split("(")[0] for c in decision["commands"]]
    assert commands == ["DumpLastWords", "RestartProcesses", "RestartProcesses"]  # one per pod
    assert a0.orders() == [EndRanks((1,)), PauseRanks()]
    assert a1.orders() == [EndRanks((3,)), PauseRanks()]

    # An outcome of the rung given up changes nothing.
    stale = RungFailed(reason="late", at=job.clock(), generation=first.generation)
    job.m.executor.policy(stale, job.clock())
    assert job.m.executor.policy_state == second
    assert len(job.events("DecisionMade")) == 2

    # The healthy replicas stop; the most advanced writes its last words.
    a0.rank_pids.pop(1)
    a1.rank_pids.pop(3)
    a0.beat(Phase.STOPPING, committed=10)
    a1.beat(Phase.STOPPING, committed=11)
    job.tick()
    # (The first rung's rejoin, under way when it was given up, never goes out.)
    assert a1.orders() == [WriteLastWords(rank=2)] and a0.orders() == []
    job.clock.advance(0.5)
    record = HeartbeatRecord(
        pid=2002,
        rank=2,
        phase=Phase.STOPPING,
        tick_at=job.clock(),
        committed=11,
        recoverable=1,
        dumped_step=11,
        dumped_at=job.clock(),
    )
    a1.send(AgentHeartbeat(ranks=(RankProgress(rank=2, pid=2002, alive=True, record=record),)))
    job.tick()
    (saved,) = job.events("CheckpointSaved")
    assert saved["step"] == 11 and saved["last_words"]

    # Then the restart the decision held back, in a generation that names the second rung.
    # (Each pod's restart command restarts every rank: the last generation is the one run.)
    # Both say the last words are written: no agent waits for a rank blocked in a collective.
    gen = job.m.gens.current
    restarts = [
        RestartRanks(generation=g, master_port=29500 + g, last_words=True) for g in (gen - 1, gen)
    ]
    assert a0.orders() == restarts and a1.orders() == restarts
    assert job.m.gens.rung_of(gen) == second.generation


def test_a_restart_in_place_starts_anew_a_pod_an_earlier_rung_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = scripted_job(tmp_path, monkeypatch)
    a0, _ = job.agents
    # An earlier rung stopped pod 1 and released its node (as a pod rescheduling does).
    del job.m.engine.pods[PODS[1]]
    job.m.pool.release([PODS[1]])
    placement_as_edges(job, bind=False)
    a0.send(RankExited(rank=0, pid=2000, returncode=-9, exited_at=job.clock(), signal="SIGKILL"))
    job.tick()
    (decision,) = job.events("DecisionMade")
    assert decision["strategy"] == "process-restart"
    # The stopped pod is placed and started into the new generation; the other restarts
    # its ranks in place into the same one.
    started = [(pod, gen) for pod, _, gen in job.m.engine.started]  # type: ignore[attr-defined]
    assert started == [(PODS[1], 1)] and job.m.gens.current == 1
    assert a0.orders() == [RestartRanks(generation=1, master_port=29501)]
    assert job.events("RecoveryFailed") == []


def _sub_healthy_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nodes: int) -> Job:
    """The job with ``hotSwitch``, each pod bound to its node, device 1 of node-1 (rank 3's)
    turning sub-healthy."""
    job = scripted_job(
        tmp_path, monkeypatch, sub_healthy=SubHealthyStrategy.HOT_SWITCH, nodes=nodes
    )
    job.m.pool.bind(tuple(Binding(p, f"node-{i}", (0, 1)) for i, p in enumerate(PODS)))
    now = job.clock()
    device_event(job, DeviceFaulted("node-1", 1, "80E20207", "sub-healthy", now, now))
    return job


def test_a_hot_switch_moves_the_pod_at_a_step_boundary_with_state_from_a_rank_that_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = _sub_healthy_job(tmp_path, monkeypatch, nodes=3)
    a0, a1 = job.agents
    ex = job.m.executor
    started = placement_as_edges(job, bind=False)
    stopped = job.m.engine.stopped  # type: ignore[attr-defined]
    (decision,) = job.events("DecisionMade")
    assert decision["strategy"] == "hot-switch"
    assert decision["commands"] == [f"HotSwitch(pod='{PODS[1]}', node='node-1', device=1)"]
    # Training goes on until the step boundary: nothing ends, every rank pauses, and the old
    # pod runs until every rank stopped.
    assert a0.orders() == [PauseRanks()] and a1.orders() == [PauseRanks()]
    a0.beat(Phase.STOPPING, committed=10)
    job.tick()
    assert stopped == [] and started == [], "switched before the old pod's ranks stopped"
    # The leaving ranks are the most advanced, but they do not join the new generation.
    a1.beat(Phase.STOPPING, committed=11)
    job.tick()
    assert stopped == [(PODS[1],)] and started == [(PODS[1], "node-2", 1)]
    assert job.m.engine.pods[PODS[1]].join == JoinFrom(source=0, step=10)
    assert a0.orders() == [RejoinRanks(generation=1, master_port=29501, source=0, step=10)]
    assert [(e["node"], e["device"]) for e in job.events("DeviceIsolated")] == [("node-1", 1)]
    assert job.m.pool.cluster.node_of(PODS[1]) == "node-2"

    # The backup's ranks join; the first step of generation 1 ends the switch.
    backup = ScriptedAgent(job.m, PODS[1], 1100, (2, 3), generation=1)
    answer = decode_answer(backup.send(AgentHello(pid=1100, node_rank=1, nproc=2)) or {})
    assert answer.ok and answer.generation == 1 and answer.join == JoinFrom(0, 10)
    backup.rank_pids = {2: 2102, 3: 2103}
    backup.send(RanksRejoined(pids=backup.rank_pids, joined=(2, 3), started_at=job.clock()))
    a0.generation = 1
    a0.send(RanksRejoined(pids=a0.rank_pids, joined=(), started_at=job.clock()))
    ready = job.clock.advance(0.2)
    for agent in (a0, backup):
        agent.beat(Phase.TRAINING, committed=11, ready_at=ready, start_step=10)
    job.tick()
    (switched,) = job.events("PodHotSwitched")
    assert (switched["pod"], switched["from_node"], switched["to_node"]) == (
        PODS[1],
        "node-1",
        "node-2",
    )
    assert (switched["generation"], switched["step"]) == (1, 11)
    assert switched["switch_s"] == pytest.approx(ready + 0.5 - T0, abs=0.2)
    assert isinstance(ex.policy_state, Running) and job.m.hotswitch.switch is None
    assert job.m.incidents.open is None


def test_a_node_whose_ranks_compute_slowly_is_a_straggler_hot_switched_to_a_free_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = scripted_job(tmp_path, monkeypatch, sub_healthy=SubHealthyStrategy.HOT_SWITCH, nodes=3)
    started = placement_as_edges(job)
    a0, a1 = job.agents
    # node-1's ranks take four times as long before the gradient collective (a CPU quota).
    for step in range(11, 40):
        a0.beat(Phase.TRAINING, committed=step, compute_s=0.1)
        a1.beat(Phase.TRAINING, committed=step, compute_s=0.4)
        job.tick(1.0)
        if job.events("DecisionMade"):
            break
    (fault,) = job.events("FaultDetected")
    assert (fault["source"], fault["code"], fault["level"]) == (
        "sub-health",
        "Straggler",
        "SubHealth",
    )
    assert (fault["nodes"], fault["pods"], fault["ranks"]) == (["node-1"], [PODS[1]], [2, 3])
    # A full window (5 steps), then slow for the hold (10 s) at one step a second.
    assert step == 11 + 4 + 10, step
    (decision,) = job.events("DecisionMade")
    assert decision["strategy"] == "hot-switch"
    assert decision["commands"] == [f"HotSwitch(pod='{PODS[1]}', node='node-1', device=None)"]
    assert a0.orders() == [PauseRanks()] and a1.orders() == [PauseRanks()]
    a0.beat(Phase.STOPPING, committed=step)
    a1.beat(Phase.STOPPING, committed=step)
    job.tick()
    assert started == [(PODS[1], "node-2", 1)]


def test_without_a_free_node_training_goes_on_and_the_decision_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = _sub_healthy_job(tmp_path, monkeypatch, nodes=2)
    a0, a1 = job.agents
    (decision,) = job.events("DecisionMade")
    assert decision["strategy"] == "none" and decision["commands"] == []
    assert (
        "hot switch not possible (no free node for the backup pod); training goes on"
        in (decision["reason"])
    )
    assert a0.orders() == [] and a1.orders() == []
    assert isinstance(job.m.executor.policy_state, Running)
    # Training goes on: no incident is open, the job is not recovering.
    assert job.m.incidents.open is None
    job.tick(1.0)
    st = job.m.ledger.status()
    assert st is not None and str(st.phase) == "Running", st


def test_an_ignored_sub_health_fault_sends_the_next_placement_to_another_free_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = scripted_job(
        tmp_path, monkeypatch, nodes=3
    )  # no recover-strategy; subHealthyStrategy ignore
    m, ex = job.m, job.m.executor
    job.m.pool.bind(tuple(Binding(p, f"node-{i}", (0, 1)) for i, p in enumerate(PODS)))
    lines: list[str] = []
    monkeypatch.setattr(m.console, "line", lines.append)
    placed = placement_as_edges(job, bind=False)

    now = job.clock()
    device_event(job, DeviceFaulted("node-1", 1, "80E20207", "sub-healthy", now, now))
    (decision,) = job.events("DecisionMade")
    assert decision["commands"] == [
        "DeprioritiseNode(node='node-1', reason='sub-healthy: 80E20207')"
    ]
    assert job.events("NodeDeprioritised") == [
        {"node": "node-1", "reason": "sub-healthy: 80E20207"}
    ]
    assert isinstance(ex.policy_state, Running) and m.incidents.open is None
    assert placed == [], "training went on: nothing was placed"

    # A later fault that needs the job placed again (a device on node-0 needs a reset): every
    # node is free once the pods stop, and node-1 is passed over for the free node-2.
    now = job.clock.advance(5.0)
    device_event(job, DeviceFaulted("node-0", 0, "80E18005", "needs a reset", now, now))
    assert [(pod, node) for pod, node, _ in placed] == [(PODS[0], "node-0"), (PODS[1], "node-2")]
    assert job.m.pool.cluster.node_of(PODS[1]) == "node-2"
    assert (
        f"placing {PODS[0]}, {PODS[1]}: passed over node-1 (sub-healthy: 80E20207), placed on last"
        in lines
    )


def _release(job: Job, node: str, device: int) -> dict[str, Any]:
    reply: queue.Queue[dict[str, Any]] = queue.Queue()
    job.m._handle_one(Inbound("Release", {"node": node, "device": device}, reply))
    return reply.get_nowait()


def test_a_manually_separated_device_stays_out_when_healthy_until_an_operator_releases_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = tmp_path / "codes.yaml"
    table.write_text("codes:\n  80E0FFFF: {level: ManuallySeparate, what: test}\n")
    job = scripted_job(tmp_path, monkeypatch, nodes=3, code_table=table)
    job.m.pool.bind(tuple(Binding(p, f"node-{i}", (0, 1)) for i, p in enumerate(PODS)))
    now = job.clock()
    device_event(job, DeviceFaulted("node-2", 0, "80E0FFFF", "broken", now, now))
    (isolated,) = job.events("DeviceIsolated")
    assert (isolated["node"], isolated["device"], isolated["code"]) == ("node-2", 0, "80E0FFFF")
    assert "ManuallySeparate" in isolated["reason"]
    assert _release(job, "node-2", 0) == {
        "ok": False,
        "error": "device 0 of node-2 still reports fault 80E0FFFF; release it once it reports "
        "healthy (unbroken inject device --clear, for a sim device)",
    }
    # Healthy again (autoStowing is on): a ManuallySeparate device does not come back.
    device_event(job, DeviceRecovered("node-2", 0, job.clock.advance(1.0)))
    assert job.m.pool.cluster.device_isolated("node-2", 0) and job.events("DeviceReturned") == []
    assert job.m.pool.free_nodes() == []
    assert _release(job, "node-2", 0) == {
        "ok": True,
        "detail": "device 0 of node-2 back in the pool",
    }
    assert job.events("DeviceReturned") == [
        {"node": "node-2", "device": 0, "reason": "released by an operator"}
    ]
    assert job.m.pool.free_nodes() == ["node-2"]
    again = _release(job, "node-2", 0)
    assert again["ok"] is False and "is not held for release" in again["error"]
    assert "no node 'node-9'" in _release(job, "node-9", 0)["error"]


def test_a_device_isolated_at_separate_npu_returns_by_itself_and_is_not_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = scripted_job(tmp_path, monkeypatch, nodes=3)
    job.m.pool.bind(tuple(Binding(p, f"node-{i}", (0, 1)) for i, p in enumerate(PODS)))
    now = job.clock()
    device_event(job, DeviceFaulted("node-2", 1, "80E3A201", "separate", now, now))
    assert job.m.pool.cluster.device_isolated("node-2", 1) and not job.m.pool.cluster.device_held(
        "node-2", 1
    )
    device_event(job, DeviceRecovered("node-2", 1, job.clock.advance(1.0)))
    assert not job.m.pool.cluster.device_isolated("node-2", 1)
    refused = _release(job, "node-2", 1)
    assert refused["ok"] is False and "it is in the pool" in refused["error"]


def test_with_auto_stowing_off_a_device_healthy_again_stays_out_until_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = scripted_job(tmp_path, monkeypatch, nodes=3, auto_stowing=False)
    lines: list[str] = []
    monkeypatch.setattr(job.m.console, "line", lambda text, at=None: lines.append(text))
    job.m.pool.bind(tuple(Binding(p, f"node-{i}", (0, 1)) for i, p in enumerate(PODS)))
    now = job.clock()
    device_event(job, DeviceFaulted("node-2", 1, "80E3A201", "separate", now, now))
    device_event(job, DeviceRecovered("node-2", 1, job.clock.advance(1.0)))
    assert job.m.pool.cluster.device_isolated("node-2", 1)
    assert (
        "device 1 of node-2 reports healthy; it stays out of the pool until released "
        "(autoStowing=false: unbroken release)"
    ) in lines
    assert job.events("DeviceReturned") == []
    released = _release(job, "node-2", 1)
    assert released["ok"] is True, released
    assert not job.m.pool.cluster.device_isolated("node-2", 1)
    (returned,) = job.events("DeviceReturned")
    assert returned["reason"] == "released by an operator", returned


def test_unbroken_release_reaches_the_manager_through_its_authenticated_control_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    job = scripted_job(tmp_path, monkeypatch, nodes=3)
    job.m.pool.bind(tuple(Binding(p, f"node-{i}", (0, 1)) for i, p in enumerate(PODS)))
    job.m.pool.cluster = job.m.pool.cluster.isolate_device(
        "node-2", 1, "ManuallySeparate", manual=True
    )
    inbox: queue.Queue[Inbound] = queue.Queue()
    server = build_server("s3cret", inbox, job.m.commands, answer_timeout_s=10.0)
    server.start()
    (tmp_path / "control.json").write_text(
        json.dumps({"address": server.address, "secret": "s3cret"})
    )

    def serve(n: int) -> threading.Thread:  # the manager's loop, for n messages
        def loop() -> None:
            for _ in range(n):
                job.m._handle_one(inbox.get(timeout=10.0))

        thread = threading.Thread(target=loop)
        thread.start()
        return thread

    try:
        thread = serve(2)
        assert main(["release", "--node", "node-2", "--device", "1", "--run", str(tmp_path)]) == 0
        assert capsys.readouterr().out == "device 1 of node-2 back in the pool\n"
        assert main(["release", "--node", "node-2", "--device", "1", "--run", str(tmp_path)]) == 1
        err = capsys.readouterr().err
        assert err.startswith("unbroken release: device 1 of node-2 is not held for release")
        thread.join(10.0)
        assert not thread.is_alive()
        (tmp_path / "control.json").write_text(
            json.dumps({"address": server.address, "secret": "guess"})
        )
        assert main(["release", "--node", "node-2", "--device", "0", "--run", str(tmp_path)]) == 1
        assert "UNAUTHENTICATED" in capsys.readouterr().err
        assert inbox.empty(), "an unauthenticated release reached the manager"
    finally:
        server.stop()
    assert job.events("DeviceReturned") == [
        {"node": "node-2", "device": 1, "reason": "released by an operator"}
    ]


def _sim(job: Job) -> tuple[SimProvider, DeviceMonitor]:
    """The job's ``sim`` devices on the fake clock; the monitor turns their polls into events."""
    return SimProvider(job.m.ctx.sim_dir, {f"node-{i}": 2 for i in range(3)}, clock=job.clock), (
        DeviceMonitor()
    )


def _watch(job: Job, provider: SimProvider, monitor: DeviceMonitor) -> None:
    for event in monitor.observe(provider.poll(), job.clock()):
        device_event(job, event)


def test_with_offline_reset_a_device_is_out_of_the_pool_while_it_resets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = scripted_job(tmp_path, monkeypatch, nodes=3, offline_reset=True)
    job.m.pool.bind(tuple(Binding(p, f"node-{i}", (0, 1)) for i, p in enumerate(PODS)))
    provider, monitor = _sim(job)
    _watch(job, provider, monitor)
    inject_device_fault(job.m.ctx.sim_dir, "node-2", 0, "80E18005", at=job.clock())  # RestartNPU
    _watch(job, provider, monitor)
    assert job.events("DeviceResetStarted") == [
        {"node": "node-2", "device": 0, "code": "80E18005", "reset_s": 2.0}
    ]
    assert job.m.pool.cluster.device_isolated("node-2", 0) and job.m.pool.free_nodes() == []
    job.clock.advance(1.9)
    _watch(job, provider, monitor)
    assert job.events("DeviceReset") == [] and job.m.pool.cluster.device_isolated("node-2", 0)
    job.clock.advance(0.1)
    _watch(job, provider, monitor)
    assert job.events("DeviceReset") == [
        {"node": "node-2", "device": 0, "took_s": pytest.approx(2.0)}
    ]
    assert job.m.pool.free_nodes() == ["node-2"]


def test_without_offline_reset_a_reset_level_fault_resets_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = scripted_job(tmp_path, monkeypatch, nodes=3)
    job.m.pool.bind(tuple(Binding(p, f"node-{i}", (0, 1)) for i, p in enumerate(PODS)))
    provider, monitor = _sim(job)
    inject_device_fault(job.m.ctx.sim_dir, "node-2", 0, "80E18005", at=job.clock())
    _watch(job, provider, monitor)
    assert job.events("DeviceResetStarted") == [] and job.m.pool.free_nodes() == ["node-2"]


def test_a_restart_in_place_waits_for_the_reset_of_a_device_its_ranks_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = scripted_job(tmp_path, monkeypatch, nodes=3, offline_reset=True)
    ex = job.m.executor
    a0, a1 = job.agents
    job.m.pool.bind(tuple(Binding(p, f"node-{i}", (0, 1)) for i, p in enumerate(PODS)))
    _sim(job)
    inject_device_fault(job.m.ctx.sim_dir, "node-1", 1, "80E18005", at=job.clock())
    job.m.pool._reset_device("node-1", 1, "80E18005", FaultLevel.RESTART_NPU, job.clock())
    ex._run((RestartProcesses(PODS[1], (2, 3)),), job.clock())
    assert a0.orders() == [] and a1.orders() == [], "restarted on a device being reset"
    assert ex.held is not None and ex.held[0] == pytest.approx(job.clock() + 2.0)
    job.clock.advance(1.0)
    ex.poll_held(job.clock())
    assert a0.orders() == [] and a1.orders() == []
    job.clock.advance(1.0)
    ex.poll_held(job.clock())
    assert [type(o) for o in a0.orders()] == [RestartRanks]
    assert [type(o) for o in a1.orders()] == [RestartRanks]


def test_a_pod_rescheduled_off_a_device_being_reset_goes_to_another_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = scripted_job(tmp_path, monkeypatch, nodes=3, offline_reset=True)
    m = job.m
    job.m.pool.bind(tuple(Binding(p, f"node-{i}", (0, 1)) for i, p in enumerate(PODS)))
    placed = placement_as_edges(job, bind=False)
    provider, monitor = _sim(job)
    inject_device_fault(m.ctx.sim_dir, "node-1", 1, "80E18005", at=job.clock())
    _watch(job, provider, monitor)
    # RestartNPU stops training; the job is placed again, node-1 short of a device.
    assert [(pod, node) for pod, node, _ in placed] == [(PODS[0], "node-0"), (PODS[1], "node-2")]
    assert [e["node"] for e in job.events("DeviceResetStarted")] == ["node-1"]


def test_a_free_restart_device_is_reset_once_no_pod_of_the_job_is_bound_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FreeRestartNPU: the fault of the rank on the device goes to the loop at once, and nothing
    resets the device under it; the device is reset once idle, here when its pod is released.
    RestartNPU on the same kind of device is reset at once."""
    job = scripted_job(tmp_path, monkeypatch, nodes=3, offline_reset=True)
    pool, now = job.m.pool, job.clock()
    pool.bind(tuple(Binding(p, f"node-{i}", (0, 1)) for i, p in enumerate(PODS)))
    _sim(job)
    for node, device, code in (("node-1", 1, "8C0E4E00"), ("node-0", 0, "80E18005")):
        inject_device_fault(job.m.ctx.sim_dir, node, device, code, at=now)
    fault = pool.device_event(DeviceFaulted("node-1", 1, "8C0E4E00", "free", now, now), now)
    assert fault is not None and fault.level is FaultLevel.FREE_RESTART_NPU
    assert fault.ranks == (3,), fault
    assert job.events("DeviceResetStarted") == [] and pool.reset_when_idle == {
        ("node-1", 1): "8C0E4E00"
    }
    pool.reset_idle(now)
    assert job.events("DeviceResetStarted") == [], "reset under a bound pod"
    pool.release([PODS[1]])
    pool.reset_idle(now)
    assert job.events("DeviceResetStarted") == [
        {"node": "node-1", "device": 1, "code": "8C0E4E00", "reset_s": 2.0}
    ]
    assert pool.reset_when_idle == {}
    fault = pool.device_event(DeviceFaulted("node-0", 0, "80E18005", "reset", now, now), now)
    assert fault is not None and fault.level is FaultLevel.RESTART_NPU
    assert [e["node"] for e in job.events("DeviceResetStarted")] == ["node-1", "node-0"]


def test_a_free_restart_device_still_bound_is_reset_when_the_job_is_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = scripted_job(tmp_path, monkeypatch, nodes=3, offline_reset=True)
    pool, now = job.m.pool, job.clock()
    pool.bind(tuple(Binding(p, f"node-{i}", (0, 1)) for i, p in enumerate(PODS)))
    _sim(job)
    for node, device in (("node-0", 0), ("node-2", 1)):
        inject_device_fault(job.m.ctx.sim_dir, node, device, "8C0E4E00", at=now)
    pool.device_event(DeviceFaulted("node-0", 0, "8C0E4E00", "free", now, now), now)
    # node-2 runs no pod: its device is idle and is reset at once.
    pool.device_event(DeviceFaulted("node-2", 1, "8C0E4E00", "free", now, now), now)
    assert [(e["node"], e["device"]) for e in job.events("DeviceResetStarted")] == [("node-2", 1)]
    pool.reset_idle(now, job_over=True)
    assert [(e["node"], e["device"]) for e in job.events("DeviceResetStarted")] == [
        ("node-2", 1),
        ("node-0", 0),
    ]


def _both_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Job, ScriptedAgent, ScriptedAgent]:
    """A ``recover`` job whose two agents have said their ranks train at step 10."""
    job = scripted_job(tmp_path, monkeypatch, Strategy.RECOVER)
    placement_as_edges(job)
    a0, a1 = job.agents
    for a in (a0, a1):
        a.beat(Phase.TRAINING, committed=10)
    job.tick()
    return job, a0, a1


def test_a_stall_of_the_manager_itself_does_not_lose_the_agents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The manager's loop did not run for 5 s (its process stopped): the agents' heartbeats of
    that time are still queued, so their silence counts from when it runs again; an agent still
    silent past the limit after that is lost."""
    job, a0, _ = _both_training(tmp_path, monkeypatch)
    job.tick(5.0)
    assert job.events("FaultDetected") == [] and not any(p.lost for p in job.m.engine.pods.values())
    for i in range(120):  # only one agent beats from now on
        if i % 10 == 0:
            a0.beat(Phase.TRAINING, committed=11)
        job.tick(0.05)
    lost = [(f["source"], f["pods"]) for f in job.events("FaultDetected")]
    assert lost == [("node-lost", [PODS[1]])], lost


def test_a_node_whose_stream_broke_before_a_stall_of_the_manager_is_lost_soon_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's order stream broke, then the manager's loop did not run for 3 s. The break
    was stamped when the server saw it and the queued heartbeats are read before each check, so
    the node is lost STALL_GRACE_S after the manager runs again, not an agent timeout after; the
    agent still heard is not."""
    job, a0, a1 = _both_training(tmp_path, monkeypatch)
    job.m._handle_one(Inbound(STREAM_CLOSED, {"pod": a1.pod, "pid": a1.pid}, at=job.clock()))
    pods = job.m.engine.pods
    job.tick(3.0)  # the stall: 3 s since the break, over the 2 s agent timeout
    a0.beat(Phase.TRAINING, committed=11)
    assert not pods[PODS[1]].lost, "lost before the server could read what queued"
    for _ in range(5):
        job.tick(STALL_GRACE_S / 5)
    assert not pods[PODS[1]].lost
    job.tick(0.05)  # the grace is over (the old rule waited 2 s from the wake-up)
    assert pods[PODS[1]].lost and not pods[PODS[0]].lost


def test_a_rung_a_pods_environment_switches_off_is_skipped_for_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker pod's agent says its environment has ENABLE_RESTART_FAULT_PROCESS=off: the
    run says once that recover-in-place is off, and a killed rank of the other pod goes to the
    next rung, recover, with the setting as the reason."""
    job = scripted_job(tmp_path, monkeypatch, Strategy.RECOVER_IN_PLACE, Strategy.RECOVER)
    placement_as_edges(job)
    a0, a1 = job.agents
    off = (("recover-in-place", "ENABLE_RESTART_FAULT_PROCESS=off"),)
    for _ in range(2):  # a second hello (a restarted agent) says nothing new
        a1.send(AgentHello(pid=a1.pid, node_rank=1, nproc=2, switched_off=off))
    (said,) = job.events("RungsSwitchedOff")
    assert said == {
        "pod": PODS[1],
        "ranks": [2, 3],
        "rungs": ["recover-in-place"],
        "setting": "ENABLE_RESTART_FAULT_PROCESS=off",
    }, said
    assert job.events("RungsUnavailable") == []
    a0.send(RankExited(rank=1, pid=2001, returncode=-9, exited_at=job.clock(), signal="SIGKILL"))
    job.tick()
    (decision,) = job.events("DecisionMade")
    assert decision["strategy"] == "recover", decision
    assert (
        "recover-in-place: switched off by ENABLE_RESTART_FAULT_PROCESS=off in pod "
        f"{PODS[1]}" in decision["reason"]
    ), decision
