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
def test_a_busy_process_is_throttled_and_released() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    group = None
    try:
        group = throttle(f"test-{uuid.uuid4().hex[:8]}", [busy.pid, 2**22 + 7], 0.05)
        assert (group / "cpu.cfs_quota_us").read_text().strip() == "5000"
        assert (group / "cgroup.procs").read_text().split() == [str(busy.pid)]
        time.sleep(0.5)
        stat = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines() if line)
        assert int(stat["nr_throttled"]) > 0, stat
        release(group)
        assert not group.exists()
        assert str(busy.pid) in (CPU_ROOT / "cgroup.procs").read_text().split()
    finally:
        busy.kill()
        busy.wait()
        if group is not None:
            release(group)


def test_a_share_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="out of range"):
        throttle("never", [], 1.5)
