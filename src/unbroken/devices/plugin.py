"""The device plugin flags the seed configures: ``-hotReset``, ``-listWatchPeriod``,
``-autoStowing``.

- ``-listWatchPeriod`` (seconds, integer, default 5, range 3-1800): how often device health is
  polled (:class:`unbroken.devices.monitor.DeviceWatcher`'s period).
- ``-autoStowing`` (default true): a device that turns healthy again returns to the
  schedulable pool by itself. When false, a device isolated for a fault stays isolated after it
  recovers until an operator returns it.
- ``-hotReset``: -1 off (default); 0 reset for inference devices (no effect on training jobs);
  2 offline reset of faulty devices together with process-level recovery. 1 (graceful fault
  tolerance) is sunset in the reference and refused here with the alternatives.

The other flags of the reference plugin (``-useAscendDocker``, ``-volcanoType``, ``-logFile``,
...) have no meaning for this system; the parser returns their names so the caller can say
they were ignored. Parsing follows Go's ``flag`` package: ``-name=value``, ``--name=value``,
``-name value``, and a bare ``-name`` for true.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from unbroken.spec.knobs import LIST_WATCH_PERIOD_S_DEFAULT, LIST_WATCH_PERIOD_S_RANGE


class HotReset(IntEnum):
    OFF = -1
    INFERENCE = 0
    GRACEFUL = 1  # sunset in the reference: refused
    OFFLINE = 2


_SUNSET = (
    "-hotReset=1 (graceful fault tolerance) is sunset in the reference and not supported: "
    "use -hotReset=2 with a recover-strategy for offline reset with process-level recovery, "
    "or -hotReset=-1"
)


@dataclass(frozen=True)
class DevicePluginFlags:
    hot_reset: HotReset = HotReset.OFF
    list_watch_period_s: float = LIST_WATCH_PERIOD_S_DEFAULT
    auto_stowing: bool = True

    def __post_init__(self) -> None:
        low, high = LIST_WATCH_PERIOD_S_RANGE
        if not low <= self.list_watch_period_s <= high:
            raise ValueError(
                f"-listWatchPeriod={self.list_watch_period_s:g}: must be between "
                f"{low:g} and {high:g} seconds"
            )
        if self.hot_reset is HotReset.GRACEFUL:
            raise ValueError(_SUNSET)


_BOOL_WORDS = {
    **dict.fromkeys(("1", "t", "T", "true", "TRUE", "True"), True),
    **dict.fromkeys(("0", "f", "F", "false", "FALSE", "False"), False),
}
_KNOWN = ("hotReset", "listWatchPeriod", "autoStowing")


def parse_device_plugin_args(args: Sequence[str]) -> tuple[DevicePluginFlags, tuple[str, ...]]:
    """The flags in a device plugin command line, and the names of the flags ignored here."""
    values: dict[str, str] = {}
    ignored: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("-") or arg in ("-", "--"):
            continue  # the program name or a positional argument
        name, eq, value = arg.lstrip("-").partition("=")
        if name not in _KNOWN:
            ignored.append(name)
            continue
        if not eq:
            if name == "autoStowing":
                value = "true"
            elif i < len(args):
                value = args[i]
                i += 1
            else:
                raise ValueError(f"device plugin flag -{name} needs a value")
        values[name] = value
    return _flags(values), tuple(ignored)


def _flags(values: dict[str, str]) -> DevicePluginFlags:
    hot_reset = HotReset.OFF
    period_s = LIST_WATCH_PERIOD_S_DEFAULT
    auto_stowing = True
    if "hotReset" in values:
        raw = values["hotReset"]
        try:
            hot_reset = HotReset(int(raw))
        except ValueError:
            allowed = ", ".join(str(int(h)) for h in HotReset)
            raise ValueError(f"-hotReset={raw}: expected one of {allowed}") from None
    if "listWatchPeriod" in values:
        raw = values["listWatchPeriod"]
        try:
            period_s = float(int(raw))
        except ValueError:
            raise ValueError(f"-listWatchPeriod={raw}: expected whole seconds") from None
    if "autoStowing" in values:
        raw = values["autoStowing"]
        if raw not in _BOOL_WORDS:
            raise ValueError(f"-autoStowing={raw}: expected true or false")
        auto_stowing = _BOOL_WORDS[raw]
    return DevicePluginFlags(hot_reset, period_s, auto_stowing)
