"""A host's agent acts on the process trees it started for pods alone: a descendant of one of
them (a pod's rank) is its own, any other process is not; a tree is killed whole, a node going
down kills every tree, and a throttle holds and frees them all."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from unbroken.agent.hostprocs import OrderRefused, OwnProcesses, descendants
from unbroken.chaos.throttle import unavailable

pytestmark = pytest.mark.component

#: A pod's agent with a rank under it: the shell's child sleeps; the shell waits.
TREE = "sleep 60 & wait"


def _tree() -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["sh", "-c", TREE])
    deadline = time.monotonic() + 10
    while len(descendants([proc.pid])) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    return proc


@pytest.fixture
def trees() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [_tree(), _tree()]
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield [*procs, stranger]
    for p in [*procs, stranger]:
        for pid in descendants([p.pid])[1:]:
            subprocess.run(["kill", "-9", str(pid)], check=False)
        p.kill()
        p.wait()


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def test_the_host_kills_its_own_trees_and_nothing_else(
    trees: list[subprocess.Popen[bytes]],
) -> None:
    first, second, stranger = trees
    own = OwnProcesses("node-0")
    own.add(first.pid)
    own.add(second.pid)
    rank = descendants([first.pid])[1]
    assert own.owns(rank) and own.owns(first.pid)
    assert not own.owns(stranger.pid) and not own.owns(-1) and not own.owns(1)
    with pytest.raises(OrderRefused):
        own.kill_tree(rank)  # a tree is killed from its root, the process started
    with pytest.raises(OrderRefused):
        own.signal(stranger.pid, 9)

    assert own.kill_tree(first.pid) == 2
    first.wait(10)
    deadline = time.monotonic() + 10  # a SIGKILLed process is gone once the kernel ends it
    while not _gone(rank) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _gone(rank)
    assert own.kill_all() == 2  # the node goes down: the other tree
    second.wait(10)
    assert stranger.poll() is None


@pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")
def test_the_host_throttles_its_own_trees_and_frees_them(
    trees: list[subprocess.Popen[bytes]],
) -> None:
    first, _, stranger = trees
    own = OwnProcesses("unbroken-test-host")
    own.add(first.pid)
    try:
        assert own.throttle(0.5) == 2
        assert own.throttled is not None
        group = own.throttled.group
        assert sorted(map(int, (group / "cgroup.procs").read_text().split())) == sorted(
            descendants([first.pid])
        )
        assert str(stranger.pid) not in (group / "cgroup.procs").read_text().split()
        assert own.throttle(None) == 2
        assert not group.exists()
        with pytest.raises(OrderRefused, match="is not throttled"):
            own.throttle(None)
    finally:
        own.release()
