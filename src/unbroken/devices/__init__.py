"""Device health: providers, the transition monitor and its polling thread, plugin flags.

Providers implement :class:`HealthProvider` (``poll() -> tuple[DeviceHealth, ...]``). The
``sim`` provider reads faults injected with :func:`inject_device_fault` /
:func:`clear_device_fault` from any process. :class:`DeviceWatcher` polls a provider every
``-listWatchPeriod`` and reports :class:`DeviceFaulted` / :class:`DeviceRecovered`; with
``-autoStowing`` on, the manager returns a recovered device to the pool, otherwise it stays
isolated until an operator returns it (see :mod:`unbroken.devices.plugin`).
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
from unbroken.devices.plugin import DevicePluginFlags, HotReset, parse_device_plugin_args
from unbroken.devices.sim import (
    InjectedFault,
    NodeState,
    SimProvider,
    clear_device_fault,
    inject_device_fault,
    read_node_state,
    state_path,
)

__all__ = [
    "DeviceEvent",
    "DeviceFaulted",
    "DeviceHealth",
    "DeviceMonitor",
    "DevicePluginFlags",
    "DeviceRecovered",
    "DeviceStateError",
    "DeviceWatcher",
    "HealthProvider",
    "HotReset",
    "InjectedFault",
    "NodeState",
    "SimProvider",
    "clear_device_fault",
    "inject_device_fault",
    "parse_device_plugin_args",
    "read_node_state",
    "state_path",
]
