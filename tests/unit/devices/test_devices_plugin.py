"""The device plugin flags: the seed's command line, defaults, ranges and the sunset value."""

from __future__ import annotations

import pytest

from unbroken.devices import DevicePluginFlags, HotReset, parse_device_plugin_args

pytestmark = pytest.mark.unit

SEED_ARGS = [
    "device-plugin",
    "-useAscendDocker=true",
    "-volcanoType=true",
    "-autoStowing=true",
    "-listWatchPeriod=5",
    "-hotReset=2",
    "-logFile=/var/log/mindx-dl/devicePlugin/devicePlugin.log",
    "-logLevel=0",
]


def test_the_seed_command_line() -> None:
    flags, ignored = parse_device_plugin_args(SEED_ARGS)
    assert flags == DevicePluginFlags(HotReset.OFFLINE, 5.0, True)
    assert ignored == ("useAscendDocker", "volcanoType", "logFile", "logLevel")


def test_defaults() -> None:
    flags, ignored = parse_device_plugin_args([])
    assert flags == DevicePluginFlags()
    assert (flags.hot_reset, flags.list_watch_period_s, flags.auto_stowing) == (
        HotReset.OFF,
        5.0,
        True,
    )
    assert ignored == ()


def test_go_flag_forms() -> None:
    flags, _ = parse_device_plugin_args(["--listWatchPeriod", "1800", "-autoStowing=F"])
    assert flags == DevicePluginFlags(list_watch_period_s=1800.0, auto_stowing=False)
    flags, _ = parse_device_plugin_args(["-autoStowing", "-hotReset", "-1"])
    assert flags == DevicePluginFlags(hot_reset=HotReset.OFF, auto_stowing=True)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-listWatchPeriod=2"], "-listWatchPeriod=2: must be between 3 and 1800 seconds"),
        (["-listWatchPeriod=1801"], "-listWatchPeriod=1801: must be between 3 and 1800 seconds"),
        (["-listWatchPeriod=2.5"], "-listWatchPeriod=2.5: expected whole seconds"),
        (["-listWatchPeriod"], "device plugin flag -listWatchPeriod needs a value"),
        (["-autoStowing=yes"], "-autoStowing=yes: expected true or false"),
        (["-hotReset=3"], "-hotReset=3: expected one of -1, 0, 1, 2"),
        (
            ["-hotReset=1"],
            "-hotReset=1 (graceful fault tolerance) is sunset in the reference and not "
            "supported: use -hotReset=2 with a recover-strategy",
        ),
    ],
)
def test_bad_values_are_named(args: list[str], message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_device_plugin_args(args)
    assert str(err.value).startswith(message)
