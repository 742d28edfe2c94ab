"""A process moved into a throttle cgroup is held to its CPU share, and released afterwards."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest

from unbroken.chaos.throttle import CPU_ROOT, release, throttle, unavailable

pytestmark = pytest.mark.component


@pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")
def test_a_busy_process_is_throttled_and_released_to_the_cgroup_it_came_from() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    tag = uuid.uuid4().hex[:8]
    origin = CPU_ROOT / f"unbroken-test-origin-{tag}"
    origin.mkdir()
    held = None
    try:
        (origin / "cgroup.procs").write_text(f"{busy.pid}\n")
        held = throttle(f"test-{tag}", [busy.pid, 2**22 + 7], 0.05)
        group = held.group
        assert held.origins == {busy.pid: origin}
        assert (group / "cpu.cfs_quota_us").read_text().strip() == "5000"
        assert (group / "cgroup.procs").read_text().split() == [str(busy.pid)]
        # The kernel held it back at least once (it may wait for a core on a loaded machine).
        deadline = time.monotonic() + 20.0
        while True:
            stat = dict(
                line.split() for line in (group / "cpu.stat").read_text().splitlines() if line
            )
            if int(stat["nr_throttled"]) > 0 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert int(stat["nr_throttled"]) > 0, stat
        release(held)
        assert not group.exists()
        assert (origin / "cgroup.procs").read_text().split() == [str(busy.pid)]
    finally:
        busy.kill()
        busy.wait()
        if held is not None:
            release(held)
        origin.rmdir()


def test_a_share_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="out of range"):
        throttle("never", [], 1.5)


class _Node:
    """The injector's view of a job with one process on node-1."""

    world_size = 1
    nodes = ("node-0", "node-1")

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def node_pids(self, node: str) -> list[int]:
        return [self.pid] if node == "node-1" else []

    def host(self, node: str) -> None:  # every node is on this machine
        return None


@pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")
def test_a_throttle_entry_holds_the_nodes_processes_until_released() -> None:
    from unbroken.chaos import ChaosFault, InjectKind
    from unbroken.chaos.injector import Injector

    busy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    injector = Injector(_Node(busy.pid))  # type: ignore[arg-type]
    try:
        said = injector.fire(ChaosFault(0, InjectKind.THROTTLE, node="node-1", cpu=0.2))
        assert said == "node node-1 throttled to 0.2 of one CPU (1 processes)"
        group = injector.throttled["node-1"].group
        assert (group / "cgroup.procs").read_text().split() == [str(busy.pid)]
        with pytest.raises(ValueError, match="node node-0 runs no process of the job now"):
            injector.fire(ChaosFault(1, InjectKind.THROTTLE, node="node-0", cpu=0.2))
        injector.release_throttles()
        assert not group.exists() and injector.throttled == {}
    finally:
        busy.kill()
        busy.wait()
        injector.release_throttles()
