"""The node agent as one component: its ranks are scripted (heartbeat records written as a
worker writes them, processes that only record what is done to them), the control plane is a
client that records the typed reports. Asserted: the reports the agent sends and what it does
to its ranks for each order. No torch, no rank processes, no network."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from unbroken.agent.hang import process_stopped
from unbroken.agent.launcher import LaunchArgs
from unbroken.agent.managed import AgentSettings, ManagedAgent
from unbroken.agent.ranks import RankExit
from unbroken.protocol.heartbeat import HeartbeatReader, HeartbeatRecord, Phase, encode
from unbroken.protocol.kinds import StepFailure
from unbroken.protocol.mailbox import MailboxWriter
from unbroken.protocol.messages import (
    EndRanks,
    PauseRanks,
    PodStopped,
    RankExited,
    RankFailed,
    RankHung,
    Report,
    StopPod,
    StressRanks,
    WriteLastWords,
    decode_report,
)

pytestmark = pytest.mark.component


class RecordingClient:
    def __init__(self) -> None:
        self.reports: list[Report] = []

    def call(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
        self.reports.append(decode_report(method, body)[1])
        return {"ok": True}


class ScriptedRank:
    """A rank process as the agent drives it; ``pid`` is a real idle process, so the kernel
    can say whether it is stopped."""

    def __init__(self, rank: int, pid: int) -> None:
        self.rank, self.pid, self.generation = rank, pid, 0
        self.alive = True
        self.killed = False
        self.started_at = time.time()

    def kill(self) -> None:
        self.alive, self.killed = False, True

    def signal(self, sig: int) -> None:
        self.alive = False

    def wait(self, timeout_s: float | None = None) -> int:
        return 0

    def traceback(self) -> str:
        return ""


class Pod:
    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("UNBROKEN_DEVICES", "4,5")
        args = LaunchArgs(
            nproc_per_node=2,
            nnodes=2,
            node_rank=1,
            master_addr="127.0.0.1",
            master_port=29500,
            max_restarts=3,
            monitor_interval_s=0.05,
            run_id="job",
            module=False,
            no_python=False,
            log_dir=None,
            script="train.py",
            script_args=(),
        )
        settings = AgentSettings(
            pod="job-worker-1", control="127.0.0.1:9", secret="s", run_dir=tmp_path, standby=False
        )
        self.agent = ManagedAgent(args, settings)
        self.client = RecordingClient()
        self.agent.client = self.client  # type: ignore[assignment]
        self.agent.generation = 0
        self.dir = tmp_path
        self.ranks: dict[int, ScriptedRank] = {}
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        for rank in (2, 3):
            self.procs[rank] = subprocess.Popen(["sleep", "120"])
            self.ranks[rank] = ScriptedRank(rank, self.procs[rank].pid)
            self.agent.ranks[rank] = self.ranks[rank]  # type: ignore[assignment]
            self.agent._readers[rank] = HeartbeatReader(tmp_path / f"hb{rank}")
            self.agent._mailboxes[rank] = MailboxWriter(tmp_path / f"mb{rank}")

    def close(self) -> None:
        for proc in self.procs.values():
            proc.kill()
            proc.wait()

    def stop(self, rank: int) -> None:
        """SIGSTOP the rank's process, as ``unbroken inject hang`` does."""
        self.procs[rank].send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 5.0
        while not process_stopped(self.procs[rank].pid) and time.monotonic() < deadline:
            time.sleep(0.01)

    def pid(self, rank: int) -> int:
        return self.ranks[rank].pid

    def write(self, rank: int, **fields: Any) -> None:
        record = HeartbeatRecord(pid=self.pid(rank), rank=rank, generation=0, **fields)
        (self.dir / f"hb{rank}").write_bytes(encode(record))

    def training(
        self, rank: int, committed: int, committed_ago_s: float, tick_ago_s: float
    ) -> None:
        now = time.time()
        self.write(
            rank,
            phase=Phase.TRAINING,
            committed=committed,
            committed_at=now - committed_ago_s,
            step=committed,
            step_at=now - committed_ago_s,
            tick_at=now - tick_ago_s,
        )

    def mailbox(self, rank: int) -> dict[str, Any] | None:
        path = self.dir / f"mb{rank}"
        return json.loads(path.read_text()) if path.exists() else None


@pytest.fixture
def pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Pod]:
    p = Pod(tmp_path, monkeypatch)
    yield p
    p.close()


def _observe_steps(pod: Pod, step_s: float) -> None:
    """Both ranks commit a few steps ``step_s`` apart, the agent watching."""
    for i in range(4):
        for rank in (2, 3):
            pod.training(rank, committed=10 + i, committed_ago_s=(3 - i) * step_s, tick_ago_s=0.0)
        pod.agent._check_hangs()


def test_a_stopped_rank_is_hung_after_three_of_its_step_times(pod: Pod) -> None:
    _observe_steps(pod, step_s=0.5)
    pod.stop(3)
    pod.training(2, committed=13, committed_ago_s=0.0, tick_ago_s=0.0)
    pod.training(3, committed=13, committed_ago_s=0.9, tick_ago_s=0.9)  # < 3 x 0.5 s
    pod.agent._check_hangs()
    assert pod.client.reports == []
    pod.training(3, committed=13, committed_ago_s=2.2, tick_ago_s=2.2)  # > 3 x 0.5 s
    pod.agent._check_hangs()
    (hung,) = pod.client.reports
    assert isinstance(hung, RankHung) and hung.rank == 3 and hung.pid == pod.pid(3)
    assert hung.timeout_s == pytest.approx(1.5, rel=0.1)  # stamps written a moment apart
    pod.agent._check_hangs()
    assert len(pod.client.reports) == 1  # once per rank and generation


def test_a_slow_job_is_not_hung_by_a_pause_a_fast_one_would_be(pod: Pod) -> None:
    _observe_steps(pod, step_s=2.0)
    pod.stop(3)
    pod.training(3, committed=13, committed_ago_s=4.0, tick_ago_s=4.0)
    pod.agent._check_hangs()
    assert pod.client.reports == []


def test_a_running_rank_that_holds_the_gil_gets_the_startup_timeout(pod: Pod) -> None:
    """Not stopped, tick and steps still: a C call holding the GIL, which a healthy rank may
    make for a moment (a new process group after an op retry). Three fast steps are not
    enough to call it hung; the startup timeout is."""
    _observe_steps(pod, step_s=0.05)
    pod.training(3, committed=13, committed_ago_s=1.0, tick_ago_s=1.0)
    pod.agent._check_hangs()
    assert pod.client.reports == []
    pod.training(3, committed=13, committed_ago_s=3.5, tick_ago_s=3.5)
    pod.agent._check_hangs()
    (hung,) = pod.client.reports
    assert isinstance(hung, RankHung) and hung.timeout_s == 3.0


def test_a_rank_blocked_in_a_collective_keeps_ticking_and_is_not_hung(pod: Pod) -> None:
    _observe_steps(pod, step_s=0.1)
    pod.training(3, committed=13, committed_ago_s=30.0, tick_ago_s=0.05)
    pod.agent._check_hangs()
    assert pod.client.reports == []


def test_a_failed_step_is_reported_once_with_its_kind_and_device(pod: Pod) -> None:
    now = time.time()
    pod.write(
        2,
        phase=Phase.STOPPING,
        tick_at=now,
        committed=40,
        failed_step=40,
        failed_at=now - 0.1,
        failure=int(StepFailure.DEVICE_MEMORY),
    )
    pod.agent._check_hangs()
    pod.agent._check_hangs()
    (failed,) = pod.client.reports
    assert isinstance(failed, RankFailed)
    assert (failed.rank, failed.failure, failed.failed_step, failed.device) == (
        2,
        StepFailure.DEVICE_MEMORY,
        40,
        4,
    )


def test_an_exit_is_reported_with_the_steps_its_rank_committed(pod: Pod) -> None:
    pod.training(3, committed=21, committed_ago_s=0.0, tick_ago_s=0.0)
    pod.agent._exits.put(RankExit(3, 1, pod.pid(3), 0, -9, time.time()))
    pod.agent._drain_exits()
    (exited,) = pod.client.reports
    assert isinstance(exited, RankExited)
    assert (exited.rank, exited.signal, exited.committed) == (3, "SIGKILL", 21)


def test_orders_reach_the_ranks(pod: Pod) -> None:
    assert pod.agent._obey(PauseRanks()) is None
    assert pod.mailbox(2) == {"op": "pause", "seq": 1} and pod.mailbox(3) == {
        "op": "pause",
        "seq": 1,
    }
    pod.agent._obey(WriteLastWords(rank=2))
    assert pod.mailbox(2) == {"op": "dump", "seq": 2}
    pod.agent._obey(StressRanks(round=1, master_port=29999))
    for rank, seq in ((2, 3), (3, 2)):
        assert pod.mailbox(rank) == {
            "op": "stress",
            "seq": seq,
            "round": 1,
            "master_addr": pod.agent.args.master_addr,
            "master_port": 29999,
            "rank": rank,
            "world_size": pod.agent.args.world_size,
        }
    pod.agent._obey(EndRanks(ranks=(3,)))
    assert pod.ranks[3].killed and not pod.ranks[2].killed
    # The agent ended rank 3 itself: its exit is no fault to report.
    pod.agent._exits.put(RankExit(3, 1, pod.pid(3), 0, -9, time.time()))
    pod.agent._drain_exits()
    assert pod.client.reports == []
    assert pod.agent._obey(StopPod(grace_s=None, success=False)) == 143
    assert pod.ranks[2].killed and pod.client.reports == [PodStopped()]
