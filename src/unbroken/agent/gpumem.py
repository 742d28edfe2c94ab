"""Wait for the device memory of dead rank processes to be freed before their successors start.

When a rank's process ends, the GPU driver frees its device memory after the process is gone,
not at once; a replacement started on the same GPU in the meantime competes with memory that
is still held, and on a full GPU runs out of it. The agent asks NVML which processes hold
memory on the pod's GPUs (``nvmlDeviceGetComputeRunningProcesses``) and starts the successors
once none of the dead ones is listed, or after :data:`WAIT_BOUND_S`, saying so.

The pod's GPUs are its ``CUDA_VISIBLE_DEVICES`` (NVML indices: the job manager sets
``CUDA_DEVICE_ORDER=PCI_BUS_ID``). Without GPUs, or without NVML (no binding, no driver), there is
nothing to wait for. Standard library and NVIDIA's binding only: the agent imports no torch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any

from unbroken.protocol.messages import DeviceWait
from unbroken.spec.nvmlcheck import NvmlUnavailable, load_nvml

log = logging.getLogger(__name__)

#: The longest a replacement waits for its predecessor's device memory.
WAIT_BOUND_S = 30.0
POLL_S = 0.05


def pod_gpus(environ: Mapping[str, str]) -> tuple[int, ...]:
    """The NVML indices of the pod's GPUs (its ``CUDA_VISIBLE_DEVICES``; none when unset)."""
    given = environ.get("CUDA_VISIBLE_DEVICES", "")
    return tuple(int(e) for e in given.split(",") if e.strip().isdigit())


class GpuMemory:
    """The pod's view of which processes hold memory on its GPUs (see the module doc)."""

    def __init__(
        self,
        gpus: Iterable[int],
        nvml: ModuleType | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.gpus = tuple(gpus)
        self._nvml = nvml
        self._tried = nvml is not None
        self._clock, self._wall, self._sleep = clock, wall, sleep

    def _binding(self) -> ModuleType | None:
        if not self._tried:
            self._tried = True
            try:
                self._nvml = load_nvml()
            except NvmlUnavailable as exc:
                log.info("no wait for device memory before a restart: %s", exc)
        return self._nvml

    def holders(self) -> set[int]:
        """The pids holding memory on the pod's GPUs now."""
        nvml = self._binding()
        if nvml is None:
            return set()
        pids: set[int] = set()
        for gpu in self.gpus:
            handle = nvml.nvmlDeviceGetHandleByIndex(gpu)
            procs: list[Any] = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            pids.update(int(p.pid) for p in procs)
        return pids

    def wait_freed(self, dead: Iterable[int], bound_s: float = WAIT_BOUND_S) -> DeviceWait | None:
        """Wait until none of the ``dead`` pids holds memory on the pod's GPUs (at most
        ``bound_s``); None when there was nothing to wait for (no GPUs, no NVML, none held)."""
        dead = set(dead)
        if not self.gpus or not dead:
            return None
        began = self._clock()
        try:
            held = self.holders() & dead
            if not held:
                return None
            while held and self._clock() - began < bound_s:
                self._sleep(POLL_S)
                held = self.holders() & dead
        except Exception as exc:  # an NVML error must not keep a rank from starting
            log.warning("reading the GPUs' processes failed (%s); starting without waiting", exc)
            return None
        waited = self._clock() - began
        if held:
            log.warning(
                "GPU(s) %s still hold the memory of ended process(es) %s after %.1f s; starting "
                "their successors anyway",
                ",".join(map(str, self.gpus)),
                ",".join(map(str, sorted(held))),
                waited,
            )
        else:
            log.info("waited %.2f s for the device memory of the ended processes", waited)
        return DeviceWait(self.gpus, freed_at=self._wall(), waited_s=waited, freed=not held)
