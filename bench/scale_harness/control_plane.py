"""The real job manager of one load run, in its own process (so its CPU and memory are its own).

Run by ``bench/scale.py``: ``python bench/scale_harness/control_plane.py --nodes N --spares S
--run-dir DIR``. The job's pods are *external*: when the scheduler places a pod, its agent is not
started here but announced on stdout (one JSON line: pod, node, agent pid, generation), and the
load generator's simulated agent for it registers over the real gRPC control channel. Nothing
rendezvous (the ranks are simulated), so each generation's store is a bare listening socket on
127.0.0.1. Other stdout lines: the control address and secret first, then the depth of the
manager's inbox every 0.25 s (the heartbeat backlog). A line ``stop`` (or EOF) on stdin ends the
job.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from unbroken.ledger import Ledger
from unbroken.manager.job import JobManager
from unbroken.manager.layout import ClusterLayout, JobLayout, ManagerOptions, PodLayout
from unbroken.manager.pods import PodProcess
from unbroken.manager.service import Inbound
from unbroken.rpc.store import listening_socket
from unbroken.spec.knobs import FaultHandling, FaultScheduling, ProcessRecover, Strategy

RANKS_PER_NODE = 8
#: Agent pids of external pods start above Linux's largest pid (2**22): never a real process.
FIRST_PID = 1 << 23
_out_lock = threading.Lock()


def emit(obj: dict[str, Any]) -> None:
    with _out_lock:
        sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
        sys.stdout.flush()


class ExternalAgent:
    """The process handle of a simulated agent: it ends itself when told to stop, so a wait
    returns at once; it is never signalled (its pid is no process of this machine)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.ended = False

    def poll(self) -> int | None:
        return 0 if self.ended else None

    def wait(self, timeout: float | None = None) -> int:
        self.ended = True
        return 0


class ExternalPod(PodProcess):
    def kill_all(self) -> list[int]:
        assert isinstance(self.proc, ExternalAgent)
        self.proc.ended = True
        return []


class BareStore:
    """A generation's store port: the simulated ranks never connect to it."""

    def __init__(self, port: int) -> None:
        self._sock = listening_socket("127.0.0.1", port)
        self.port = int(self._sock.getsockname()[1])


class HarnessManager(JobManager):
    def _handle(self, msg: Inbound) -> None:
        if msg.method == "BenchStop":
            self.finish(True, "load run over")
            return
        super()._handle(msg)


def handling(strategy: str) -> FaultHandling:
    """``recover``: a lost node's pod moves to a spare node and every other rank rejoins in
    its process (the seed's process-level rescheduling, pod-level rescheduling below it);
    ``reschedule``: pod-level rescheduling only."""
    if strategy == "recover":
        return FaultHandling(
            strategies=(Strategy.RECOVER, Strategy.EXIT),
            process_recover=ProcessRecover.ON,
            fault_scheduling=FaultScheduling.GRACE,
            pod_rescheduling=True,
        )
    return FaultHandling(
        strategies=(), fault_scheduling=FaultScheduling.GRACE, pod_rescheduling=True
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--spares", type=int, required=True)
    ap.add_argument("--run-dir", type=Path, required=True)
    ap.add_argument("--agent-timeout", type=float, default=2.0)
    ap.add_argument("--strategy", choices=("recover", "reschedule"), default="recover")
    a = ap.parse_args()
    os.environ["UNBROKEN_STANDBY"] = "0"  # no node image, no warm spares: no processes
    a.run_dir.mkdir(parents=True, exist_ok=True)
    job = JobLayout(
        job_id="scale",
        pods=tuple(
            PodLayout(name=f"pod-{i}", node_rank=i, nproc=RANKS_PER_NODE) for i in range(a.nodes)
        ),
        script="train.py",
        script_args=(),
        fault_handling=handling(a.strategy),
        workdir=a.run_dir,
    )
    cluster = ClusterLayout(
        nodes=tuple(f"node-{i}" for i in range(a.nodes + a.spares)),
        devices_per_node=RANKS_PER_NODE,
        list_watch_period_s=3600.0,
    )
    next_pid = [FIRST_PID]
    started = time.time()

    def start_pod(pod: str, node: str, devices: tuple[int, ...], gen: int) -> PodProcess:
        pid = next_pid[0]
        next_pid[0] += 1
        emit({"placed": pod, "node": node, "pid": pid, "gen": gen, "t": time.time()})
        agent: Any = ExternalAgent(pid)  # a process handle by its methods (poll, wait, pid)
        return ExternalPod(pod=pod, node=node, generation=gen, proc=agent, started_at=time.time())

    m = HarnessManager(
        job,
        cluster,
        a.run_dir,
        Ledger(a.run_dir / "ledger.db"),
        options=ManagerOptions(agent_timeout_s=a.agent_timeout, agent_start_timeout_s=120.0),
        pod_starter=start_pod,
        store_opener=lambda _host, port: BareStore(port),
    )
    m.started_at = started

    def watch() -> None:
        while m.server is None:
            time.sleep(0.05)
        emit({"address": m.server.address, "secret": m.secret, "pid": os.getpid()})
        while m.outcome is None:
            emit({"inbox": m.inbox.qsize(), "t": time.time()})
            time.sleep(0.25)

    def stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        m.inbox.put(Inbound("BenchStop", {}))

    threading.Thread(target=watch, daemon=True).start()
    threading.Thread(target=stdin, daemon=True).start()
    profile = os.environ.get("UNBROKEN_SCALE_PROFILE")  # a file for cProfile's statistics
    if profile:
        import cProfile

        with cProfile.Profile() as prof:
            out = m.run()
        prof.dump_stats(profile)
    else:
        out = m.run()
    emit({"done": out.reason, "faults": out.faults, "recoveries": out.recoveries})
    return 0


if __name__ == "__main__":
    sys.exit(main())
