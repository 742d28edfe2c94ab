"""A scripted stand-in for NVIDIA's ``pynvml`` (``nvidia-ml-py``), for machines with no GPU.

Only the calls the ``nvml`` provider makes, with the real module's names, constants and error
values (checked against nvidia-ml-py 13.615). Every call reads the JSON file named by
``FAKE_NVML_STATE``, so a test (or another process) changes what the GPUs report by rewriting
it (write a temporary file, then rename)::

    {"gpus": 2,
     "devices": {"1": {"ecc_uncorrected": 3, "remapped_rows": [0, 0, 1, 0],
                       "clock_reasons": 8, "pcie_replays": 0, "nvlink": [[1, 0, 0, 0, 0]],
                       "lost": false, "unsupported": ["pcie"], "processes": [4242]}},
     "xids": [{"gpu": 1, "xid": 79}]}

A device missing from ``devices`` reads all zeros with no NVLink ("Not Supported"). Each entry of
``xids`` is delivered once, in order, to the event sets registered for its GPU.
``FAKE_NVML_CALLS``, when set, names a file each call appends its name to (to count them).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_NVLINK_ERROR_DL_CRC_DATA = 3
NVML_NVLINK_ERROR_DL_ECC_DATA = 4
nvmlEventTypeXidCriticalError = 0x8
nvmlClocksEventReasonSwPowerCap = 0x4
nvmlClocksEventReasonHwSlowdown = 0x8
nvmlClocksEventReasonSwThermalSlowdown = 0x20
nvmlClocksEventReasonHwThermalSlowdown = 0x40
nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x80


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {
            NVML_ERROR_NOT_SUPPORTED: "Not Supported",
            NVML_ERROR_TIMEOUT: "Timeout",
            NVML_ERROR_GPU_IS_LOST: "GPU is lost",
            NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        }.get(self.value, f"NVML error {self.value}")


class c_nvmlEventData_t:
    def __init__(self, device: int, event_type: int, event_data: int) -> None:
        self.device = device
        self.eventType = event_type
        self.eventData = event_data


_started = False
_sets: dict[int, dict[str, Any]] = {}


def _record(name: str) -> None:
    calls = os.environ.get("FAKE_NVML_CALLS")
    if calls:
        with open(calls, "a") as f:
            f.write(name + "\n")


def _state() -> dict[str, Any]:
    path = os.environ.get("FAKE_NVML_STATE")
    if not path:
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    with open(path) as f:
        state: dict[str, Any] = json.load(f)
    return state


def _device(handle: int) -> dict[str, Any]:
    state = _state()
    if not 0 <= handle < int(state.get("gpus", 0)):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    device: dict[str, Any] = state.get("devices", {}).get(str(handle), {})
    if device.get("lost"):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return device


def _value(handle: int, key: str, default: Any) -> Any:
    device = _device(handle)
    if key in device.get("unsupported", ()):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return device.get(key, default)


def nvmlInit() -> None:
    global _started
    _record("nvmlInit")
    _state()
    _started = True


def nvmlShutdown() -> None:
    global _started
    _started = False


def nvmlDeviceGetCount() -> int:
    _record("nvmlDeviceGetCount")
    return int(_state().get("gpus", 0))


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    _record("nvmlDeviceGetHandleByIndex")
    if not 0 <= index < nvmlDeviceGetCount():
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return index


def nvmlDeviceGetUUID(handle: int) -> str:
    _record("nvmlDeviceGetUUID")
    _device(handle)
    return f"GPU-fake-{handle:04d}"


def nvmlDeviceGetTotalEccErrors(handle: int, error_type: int, counter_type: int) -> int:
    _record("nvmlDeviceGetTotalEccErrors")
    return int(_value(handle, "ecc_uncorrected", 0))


def nvmlDeviceGetRemappedRows(handle: int) -> tuple[int, int, int, int]:
    _record("nvmlDeviceGetRemappedRows")
    rows = _value(handle, "remapped_rows", [0, 0, 0, 0])
    return (int(rows[0]), int(rows[1]), int(rows[2]), int(rows[3]))


def nvmlDeviceGetCurrentClocksEventReasons(handle: int) -> int:
    _record("nvmlDeviceGetCurrentClocksEventReasons")
    return int(_value(handle, "clock_reasons", 0))


def nvmlDeviceGetPcieReplayCounter(handle: int) -> int:
    _record("nvmlDeviceGetPcieReplayCounter")
    return int(_value(handle, "pcie_replays", 0))


def nvmlDeviceGetNvLinkState(handle: int, link: int) -> int:
    _record("nvmlDeviceGetNvLinkState")
    links = _device(handle).get("nvlink")
    if not links:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if link >= len(links):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return int(links[link][0])


def nvmlDeviceGetNvLinkErrorCounter(handle: int, link: int, counter: int) -> int:
    _record("nvmlDeviceGetNvLinkErrorCounter")
    links = _device(handle).get("nvlink") or []
    return int(links[link][1 + counter])


class c_nvmlProcessInfo_t:
    def __init__(self, pid: int, used: int) -> None:
        self.pid = pid
        self.usedGpuMemory = used


def nvmlDeviceGetComputeRunningProcesses(handle: int) -> list[c_nvmlProcessInfo_t]:
    _record("nvmlDeviceGetComputeRunningProcesses")
    return [c_nvmlProcessInfo_t(int(pid), 1 << 30) for pid in _value(handle, "processes", [])]


def nvmlEventSetCreate() -> int:
    key = len(_sets) + 1
    _sets[key] = {"gpus": set(), "delivered": 0}
    return key


def nvmlDeviceRegisterEvents(handle: int, event_types: int, event_set: int) -> None:
    _record("nvmlDeviceRegisterEvents")
    if "events" in _device(handle).get("unsupported", ()):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    _sets[event_set]["gpus"].add(handle)


def nvmlEventSetWait(event_set: int, timeout_ms: int) -> c_nvmlEventData_t:
    deadline = time.monotonic() + timeout_ms / 1000.0
    entry = _sets[event_set]
    while True:
        xids = _state().get("xids", [])
        while entry["delivered"] < len(xids):
            event = xids[entry["delivered"]]
            entry["delivered"] += 1
            if event["gpu"] in entry["gpus"]:
                _record("nvmlEventSetWait:event")
                return c_nvmlEventData_t(
                    event["gpu"], nvmlEventTypeXidCriticalError, int(event["xid"])
                )
        if time.monotonic() >= deadline:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        time.sleep(0.05)


def nvmlEventSetFree(event_set: int) -> None:
    _sets.pop(event_set, None)
