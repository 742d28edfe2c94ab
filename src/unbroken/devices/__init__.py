"""Device health: providers, the transition monitor and its polling thread.

Providers implement :class:`HealthProvider` (``poll() -> tuple[DeviceHealth, ...]``). The
``sim`` provider reads faults injected with :func:`inject_device_fault` /
:func:`clear_device_fault` from any process; the ``nvml`` provider
(:mod:`unbroken.devices.nvml`) reads this machine's NVIDIA GPUs, and
:mod:`unbroken.devices.gpureset` runs the operator's reset command for one of them.
:class:`DeviceWatcher` polls a provider every ``-listWatchPeriod`` and reports
:class:`DeviceFaulted` / :class:`DeviceRecovered`; with ``-autoStowing`` on, the manager
returns a recovered device to the pool (not one isolated at ``ManuallySeparate``), otherwise it
stays isolated until an operator returns it (``unbroken release``). The device plugin flags
themselves are read by the cluster spec (:class:`unbroken.spec.cluster.DevicePlugin`).
"""

from unbroken.devices.health import (
    DeviceEvent,
    DeviceFaulted,
    DeviceHealth,
    DeviceRecovered,
    DeviceStateError,
    HealthProvider,
)
from unbroken.devices.monitor import DeviceMonitor, DeviceWatcher
from unbroken.devices.sim import (
    RESET_S_DEFAULT,
    NodeState,
    Reset,
    SimFault,
    SimProvider,
    clear_device_fault,
    inject_device_fault,
    inject_silent_fault,
    read_node_state,
    reset_device,
    silent_fault,
    state_path,
)

__all__ = [
    "RESET_S_DEFAULT",
    "DeviceEvent",
    "DeviceFaulted",
    "DeviceHealth",
    "DeviceMonitor",
    "DeviceRecovered",
    "DeviceStateError",
    "DeviceWatcher",
    "HealthProvider",
    "NodeState",
    "Reset",
    "SimFault",
    "SimProvider",
    "clear_device_fault",
    "inject_device_fault",
    "inject_silent_fault",
    "read_node_state",
    "reset_device",
    "silent_fault",
    "state_path",
]
