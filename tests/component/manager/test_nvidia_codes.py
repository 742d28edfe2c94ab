"""Every NVIDIA row of the fault-code table (each Xid, each NVML condition), injected as a device
code through the ``sim`` provider (what ``unbroken inject device --code XID-79`` does) on an idle
device of a running job, acts as its level says: recorded, the node put last, the device taken
out of the pool, reset with ``hotReset: 2`` (offline, out of the pool) or not."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.manager_job import PODS, scripted_job

from unbroken.devices import DeviceMonitor, SimProvider, inject_device_fault
from unbroken.faults import CodeTable, FaultLevel
from unbroken.scheduler import Binding

pytestmark = pytest.mark.component

TABLE = CodeTable.load()
NVIDIA = sorted(c for c in TABLE.codes if c.startswith(("XID-", "GPU-", "CUDA-")))


@pytest.mark.parametrize("code", NVIDIA)
def test_an_nvidia_code_on_an_idle_device_acts_as_its_level_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: str
) -> None:
    job = scripted_job(tmp_path, monkeypatch, nodes=3, offline_reset=True)
    job.m.pool.bind(tuple(Binding(p, f"node-{i}", (0, 1)) for i, p in enumerate(PODS)))
    provider = SimProvider(job.m.ctx.sim_dir, {f"node-{i}": 2 for i in range(3)}, clock=job.clock)
    monitor = DeviceMonitor()
    inject_device_fault(job.m.ctx.sim_dir, "node-2", 0, code, at=job.clock())
    for event in monitor.observe(provider.poll(), job.clock()):
        job.m.pool.device_event(event, job.clock())
    level = TABLE.level_for(TABLE.kind_for(code), code)
    (idle,) = job.events("IdleDeviceFault")
    assert (idle["code"], idle["level"]) == (code, str(level))
    pool = job.m.pool
    assert pool.cluster.device_isolated("node-2", 0) is (
        level.isolates_device or level.resets_device
    ), level
    assert bool(job.events("DeviceResetStarted")) is level.resets_device, level
    assert ("node-2" in pool.cluster.deprioritised_nodes) is (level is FaultLevel.SUB_HEALTH)
    assert job.events("FaultDetected") == []  # no rank of the job runs there
