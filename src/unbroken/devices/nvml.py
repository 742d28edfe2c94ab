"""The ``nvml`` health provider: NVIDIA GPUs read through NVML (``nvidia-ml-py``).

Chosen in the cluster YAML (``devicePlugin: {provider: nvml}``). It reads this machine's GPUs and
reports them for the device slots they back (:func:`slots_on_gpus`: the embedded cluster's
``nodes x devicesPerNode`` slots laid over the GPUs in turn, several slots to a GPU when there
are fewer GPUs than slots, as the ranks' ``CUDA_VISIBLE_DEVICES`` place them).

Two sources, one report:

- **Polled** every ``listWatchPeriod`` (:meth:`NvmlProvider.poll`): a GPU lost
  (``NVML_ERROR_GPU_IS_LOST``) or unreadable; the volatile uncorrected ECC count rising; a
  remapped row pending or a remapping failure; the clock-event reasons hardware slowdown,
  thermal slowdown and power brake (sub-health); the PCIe replay rate above
  :data:`PCIE_REPLAYS_PER_MIN`; NVLink CRC, replay and recovery counters rising on an active link.
- **Xid critical-error events**, on a thread of their own (:class:`XidListener`: one event set,
  a wait of :data:`EVENT_WAIT_MS` at a time), so a fault is seen within a second rather than at
  the next poll: the event is latched on its GPU and the watcher is woken to poll at once.

Each condition has a code in the fault-code table (``XID-<n>``, ``GPU-...``), whose level decides
what the job does; when a GPU has several at once, the one of the highest level is reported. A
latched Xid whose level leaves the device in service (``NotHandle``, ``SubHealth``,
``RestartRequest``, ``RestartBusiness``) is reported once and then cleared; one that takes the
device out of service (a reset, isolation, no new work) stays until :meth:`NvmlProvider.reset`
(the device plugin's reset command succeeded) or the process ends.

A counter or reason a device answers "Not Supported" for is not watched: said once in the log,
never a fault. The provider reads no CUDA and imports no torch.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from unbroken.devices.health import DeviceHealth, DeviceStateError
from unbroken.spec import nvmlcheck

log = logging.getLogger(__name__)

#: The longest one wait for Xid events blocks (the listener's stop latency).
EVENT_WAIT_MS = 500
#: PCIe replays a minute above which a GPU's link is sub-healthy.
PCIE_REPLAYS_PER_MIN = 8.0

_THROTTLE_REASONS = (  # (pynvml constant, code), most severe first
    ("nvmlClocksEventReasonHwPowerBrakeSlowdown", "GPU-THROTTLE-POWER-BRAKE"),
    ("nvmlClocksEventReasonHwSlowdown", "GPU-THROTTLE-HW-SLOWDOWN"),
    ("nvmlClocksEventReasonHwThermalSlowdown", "GPU-THROTTLE-THERMAL"),
    ("nvmlClocksEventReasonSwThermalSlowdown", "GPU-THROTTLE-THERMAL"),
)
_NVLINK_COUNTERS = (
    "NVML_NVLINK_ERROR_DL_REPLAY",
    "NVML_NVLINK_ERROR_DL_RECOVERY",
    "NVML_NVLINK_ERROR_DL_CRC_FLIT",
    "NVML_NVLINK_ERROR_DL_CRC_DATA",
)
#: What the fault-code table says of a code: its level's severity (the worst condition of a GPU
#: is reported), and whether the GPU stays in service at that level (a latched Xid is then
#: reported once): :meth:`unbroken.faults.CodeTable.judge`.
Judge = Callable[[str], tuple[int, bool]]

Slot = tuple[str, int]  # (node, device)


def slots_on_gpus(
    nodes: Sequence[str], devices_per_node: int, gpus: Sequence[int]
) -> dict[int, list[Slot]]:
    """The device slots each GPU of ``gpus`` (NVML indices) backs: slot ``k`` (node
    ``k // devices_per_node``, device ``k % devices_per_node``) runs on ``gpus[k % len(gpus)]``."""
    if not gpus:
        raise ValueError("no GPU to place device slots on")
    placed: dict[int, list[Slot]] = {}
    for i, node in enumerate(nodes):
        for d in range(devices_per_node):
            placed.setdefault(gpu_of_slot(i, d, devices_per_node, gpus), []).append((node, d))
    return placed


def gpu_of_slot(node_index: int, device: int, devices_per_node: int, gpus: Sequence[int]) -> int:
    """The GPU that device ``device`` of the ``node_index``-th node runs on
    (:func:`slots_on_gpus`)."""
    return gpus[(node_index * devices_per_node + device) % len(gpus)]


def machine_gpus(environ: Mapping[str, str], nvml_count: int | None = None) -> tuple[int, ...]:
    """The GPUs (NVML indices, PCI bus order) a run on this machine places its device slots on:
    those ``CUDA_VISIBLE_DEVICES`` lists when it is set, else every GPU NVML counts (when it was
    asked), else every GPU the NVIDIA driver lists under ``/proc/driver/nvidia/gpus``; none on
    a machine without one. ValueError for a ``CUDA_VISIBLE_DEVICES`` entry that is no index."""
    given = environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        entries = [e.strip() for e in given.split(",") if e.strip()]
        bad = [e for e in entries if not e.isdigit()]
        if bad:
            raise ValueError(
                f"CUDA_VISIBLE_DEVICES={given!r}: {bad[0]!r} is no GPU index (give indices in "
                "PCI bus order, as nvidia-smi lists them)"
            )
        return tuple(int(e) for e in entries)
    if nvml_count is not None:
        return tuple(range(nvml_count))
    try:
        return tuple(range(len(os.listdir("/proc/driver/nvidia/gpus"))))
    except OSError:
        return ()


def load_nvml(module: str = "pynvml") -> ModuleType:
    """NVML's Python binding, initialised; :class:`DeviceStateError` naming what is missing."""
    try:
        return nvmlcheck.load_nvml(module)
    except nvmlcheck.NvmlUnavailable as exc:
        raise DeviceStateError(str(exc)) from None


@dataclass
class _Gpu:
    index: int
    handle: Any
    ecc_uncorrected: int | None = None  # last volatile count read
    pcie_replays: int | None = None
    pcie_at: float = 0.0
    nvlink: dict[tuple[int, int], int] = field(default_factory=dict)
    latched: tuple[str, float] | None = None  # an Xid event: (code, at)


class NvmlProvider:
    """Health of this machine's GPUs for the device slots they back (see the module doc)."""

    def __init__(
        self,
        slots: Mapping[int, Sequence[Slot]],
        judge: Judge,
        nvml: ModuleType | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._nvml = nvml if nvml is not None else load_nvml()
        self._judge = judge
        self._clock = clock
        self._slots = {gpu: tuple(s) for gpu, s in slots.items()}
        self._lock = threading.Lock()
        self._unsupported: set[tuple[int, str]] = set()
        count = self._nvml.nvmlDeviceGetCount()
        missing = sorted(g for g in self._slots if not 0 <= g < count)
        if missing:
            raise DeviceStateError(f"NVML sees {count} GPU(s); no GPU {missing[0]} to watch")
        self._gpus = {g: _Gpu(g, self._nvml.nvmlDeviceGetHandleByIndex(g)) for g in self._slots}
        self._listener: XidListener | None = None
        for gpu in self._gpus.values():  # the baselines: a count already there is no new fault
            self._read_conditions(gpu, self._clock())

    def listen(self, wake: Callable[[], None]) -> None:
        """Start waiting for Xid events; ``wake`` asks the watcher to poll now."""
        if self._listener is None:
            self._listener = XidListener(self._nvml, self._gpus, self._on_xid, wake)
            self._listener.start()

    def close(self) -> None:
        if self._listener is not None:
            self._listener.stop()
            self._listener = None

    def reset(self, gpu: int) -> None:
        """The GPU was reset: a latched Xid no longer holds."""
        with self._lock:
            self._gpus[gpu].latched = None

    def poll(self) -> tuple[DeviceHealth, ...]:
        now = self._clock()
        out: list[DeviceHealth] = []
        for gpu in self._gpus.values():
            worst = self._worst(gpu, now)
            for node, device in self._slots[gpu.index]:
                if worst is None:
                    out.append(DeviceHealth(node, device, healthy=True))
                else:
                    code, detail, since = worst
                    out.append(DeviceHealth(node, device, False, code, detail, since_at=since))
        return tuple(out)

    # -- reading -----------------------------------------------------------------------------

    def _on_xid(self, gpu: int, xid: int, at: float) -> None:
        with self._lock:
            self._gpus[gpu].latched = (f"XID-{xid}", at)

    def _worst(self, gpu: _Gpu, now: float) -> tuple[str, str, float] | None:
        found = self._read_conditions(gpu, now)
        with self._lock:
            latched = gpu.latched
            if latched is not None:
                code, at = latched
                found.append((code, f"Xid {code.removeprefix('XID-')} on GPU {gpu.index}", at))
                if self._judge(code)[1]:
                    gpu.latched = None  # reported once: the device itself stays in service
        if not found:
            return None
        return max(found, key=lambda c: self._judge(c[0])[0])

    def _read_conditions(self, gpu: _Gpu, now: float) -> list[tuple[str, str, float]]:
        nvml, h, i = self._nvml, gpu.handle, gpu.index
        found: list[tuple[str, str, float]] = []
        lost = self._call(gpu, "uuid", nvml.nvmlDeviceGetUUID, h)
        if isinstance(lost, _Failed):
            if lost.error_value == getattr(nvml, "NVML_ERROR_GPU_IS_LOST", 15):
                return [("GPU-LOST", f"GPU {i}: NVML says the GPU is lost", now)]
            return [("GPU-UNREADABLE", f"GPU {i}: NVML cannot read it: {lost.error}", now)]
        ecc = self._call(
            gpu,
            "ecc",
            nvml.nvmlDeviceGetTotalEccErrors,
            h,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nvml.NVML_VOLATILE_ECC,
        )
        if isinstance(ecc, int):
            if gpu.ecc_uncorrected is not None and ecc > gpu.ecc_uncorrected:
                rose = ecc - gpu.ecc_uncorrected
                found.append(("GPU-ECC-UNCORRECTED", f"GPU {i}: {rose} new uncorrected ECC", now))
            gpu.ecc_uncorrected = ecc
        rows = self._call(gpu, "remapped rows", nvml.nvmlDeviceGetRemappedRows, h)
        if isinstance(rows, tuple) and len(rows) == 4:
            _corrected, _uncorrected, pending, failure = rows
            if failure:
                found.append(("GPU-ROW-REMAP-FAILURE", f"GPU {i}: row remapping failed", now))
            elif pending:
                found.append(("GPU-ROW-REMAP-PENDING", f"GPU {i}: a remapped row is pending", now))
        reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if reasons_fn is None:  # nvidia-ml-py before 12.535: the older name
            reasons_fn = nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        reasons = self._call(gpu, "clock-event reasons", reasons_fn, h)
        if isinstance(reasons, int):
            for name, code in _THROTTLE_REASONS:
                bit = getattr(nvml, name, 0)
                if bit and reasons & bit:
                    found.append(
                        (code, f"GPU {i}: {name.removeprefix('nvmlClocksEventReason')}", now)
                    )
                    break
        replays = self._call(gpu, "PCIe replay counter", nvml.nvmlDeviceGetPcieReplayCounter, h)
        if isinstance(replays, int):
            if gpu.pcie_replays is not None and now > gpu.pcie_at:
                per_min = (replays - gpu.pcie_replays) * 60.0 / (now - gpu.pcie_at)
                if per_min > PCIE_REPLAYS_PER_MIN:
                    found.append(
                        ("GPU-PCIE-REPLAY", f"GPU {i}: {per_min:.0f} PCIe replays/min", now)
                    )
            gpu.pcie_replays, gpu.pcie_at = replays, now
        found.extend(self._nvlink(gpu, now))
        return found

    def _nvlink(self, gpu: _Gpu, now: float) -> list[tuple[str, str, float]]:
        nvml = self._nvml
        if (gpu.index, "nvlink") in self._unsupported:
            return []
        rising: list[int] = []
        any_link = False
        for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 0)):
            state = self._call(gpu, "nvlink", nvml.nvmlDeviceGetNvLinkState, gpu.handle, link)
            if isinstance(state, _Failed) or (gpu.index, "nvlink") in self._unsupported:
                break  # "Not Supported" (no NVLink), or no link past this one
            if not state:
                continue
            any_link = True
            for counter_name in _NVLINK_COUNTERS:
                counter = getattr(nvml, counter_name)
                value = self._call(
                    gpu,
                    "nvlink counters",
                    nvml.nvmlDeviceGetNvLinkErrorCounter,
                    gpu.handle,
                    link,
                    counter,
                )
                if not isinstance(value, int):
                    continue
                before = gpu.nvlink.get((link, counter))
                if before is not None and value > before and link not in rising:
                    rising.append(link)
                gpu.nvlink[(link, counter)] = value
        if not any_link or not rising:
            return []
        return [
            ("GPU-NVLINK-ERRORS", f"GPU {gpu.index}: NVLink errors rising on link(s) {rising}", now)
        ]

    def _call(self, gpu: _Gpu, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``; "Not Supported" marks ``what`` as not watched on this GPU (said once)
        and gives None; another NVML error gives a :class:`_Failed`."""
        key = (gpu.index, what)
        if key in self._unsupported:
            return None
        try:
            return fn(*args)
        except Exception as exc:
            value = getattr(exc, "value", None)
            if value == getattr(self._nvml, "NVML_ERROR_NOT_SUPPORTED", 3):
                self._unsupported.add(key)
                log.info("GPU %d: %s not supported by this device; not watched", gpu.index, what)
                return None
            if value is None:
                raise
            return _Failed(exc, value)


@dataclass(frozen=True)
class _Failed:
    error: BaseException
    error_value: int


class XidListener:
    """Waits for Xid critical-error events of the given GPUs on a thread of its own and hands
    each to ``on_xid(gpu, xid, at)``, then calls ``wake()``.

    GPUs that cannot register for the events ("Not Supported") are left to the poll, said once.
    NVML's wait returns after :data:`EVENT_WAIT_MS` at most, so :meth:`stop` is prompt.
    """

    def __init__(
        self,
        nvml: ModuleType,
        gpus: Mapping[int, _Gpu],
        on_xid: Callable[[int, int, float], None],
        wake: Callable[[], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._nvml = nvml
        self._on_xid = on_xid
        self._wake = wake
        self._clock = clock
        self._stop = threading.Event()
        self._set = nvml.nvmlEventSetCreate()
        self._by_handle: dict[Any, int] = {}
        for gpu in gpus.values():
            try:
                nvml.nvmlDeviceRegisterEvents(
                    gpu.handle, nvml.nvmlEventTypeXidCriticalError, self._set
                )
            except Exception as exc:
                log.info(
                    "GPU %d: Xid events not available (%s); the poll alone watches it",
                    gpu.index,
                    exc,
                )
                continue
            self._by_handle[_key(gpu.handle)] = gpu.index
        self._thread = threading.Thread(target=self._run, name="nvml-xid-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)
        try:
            self._nvml.nvmlEventSetFree(self._set)
        except Exception as exc:
            log.debug("freeing the NVML event set: %s", exc)

    def _run(self) -> None:
        nvml = self._nvml
        timeout = getattr(nvml, "NVML_ERROR_TIMEOUT", 10)
        while not self._stop.is_set():
            if not self._by_handle:
                return
            try:
                data = nvml.nvmlEventSetWait(self._set, EVENT_WAIT_MS)
            except Exception as exc:
                if getattr(exc, "value", None) == timeout:
                    continue
                log.error(
                    "waiting for Xid events failed (%s); the poll alone watches the GPUs", exc
                )
                return
            gpu = self._by_handle.get(_key(data.device))
            if gpu is None or not data.eventType & nvml.nvmlEventTypeXidCriticalError:
                continue
            self._on_xid(gpu, int(data.eventData), self._clock())
            self._wake()


def _key(handle: Any) -> Any:
    """A hashable identity of an NVML device handle (a ctypes pointer compares by address)."""
    value = getattr(handle, "value", None)
    if value is None:
        contents = getattr(handle, "contents", None)
        if contents is not None:
            import ctypes

            return ctypes.addressof(contents)
        return handle
    return value
