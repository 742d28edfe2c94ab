"""A host's plane declarations (``--plane NAME=IFNAME``) and the carrier watch, on a fake
``/sys/class/net``."""

from __future__ import annotations

from pathlib import Path

import pytest

from unbroken.agent.planes import (
    Plane,
    PlaneError,
    PlaneWatch,
    check_planes,
    decode_planes,
    encode_planes,
    parse_plane,
)

pytestmark = pytest.mark.unit


def _sys_net(tmp_path: Path, **carriers: str) -> Path:
    for ifname, value in carriers.items():
        (tmp_path / ifname).mkdir()
        if value:
            (tmp_path / ifname / "carrier").write_text(value + "\n")
    return tmp_path


def test_planes_round_trip_through_the_pods_environment() -> None:
    planes = (parse_plane("a=pa0"), parse_plane("plane-b=eth1"))
    assert planes == (Plane("a", "pa0"), Plane("plane-b", "eth1"))
    assert decode_planes(encode_planes(planes)) == planes
    assert decode_planes("") == ()


@pytest.mark.parametrize("text", ["a", "=pa0", "A=pa0", "a=", "a=x/y", "a=" + "i" * 16])
def test_a_malformed_declaration_is_one_line_naming_it(text: str) -> None:
    with pytest.raises(PlaneError) as e:
        parse_plane(text)
    assert str(e.value).startswith(f"--plane {text!r}: expected NAME=IFNAME")


@pytest.mark.parametrize(
    ("planes", "why"),
    [
        (("a=pa0", "a=pb0"), "--plane a=pb0: name 'a' declared twice"),
        (("a=pa0", "b=pa0"), "--plane b=pa0: ifname 'pa0' declared twice"),
        (("a=pa0", "b=nope0"), "--plane b=nope0: this host has no network interface 'nope0'"),
        (("a=pa0",), "--plane: one plane declared; a failover needs at least two"),
    ],
)
def test_declarations_this_host_cannot_use_are_refused(
    tmp_path: Path, planes: tuple[str, ...], why: str
) -> None:
    sys_net = _sys_net(tmp_path, pa0="1", pb0="1")
    with pytest.raises(PlaneError, match="^" + why.replace("(", r"\(") + "$"):
        check_planes([parse_plane(p) for p in planes], sys_net=sys_net)


def test_the_watch_reports_every_plane_first_then_only_changes(tmp_path: Path) -> None:
    sys_net = _sys_net(tmp_path, pa0="1", pb0="")  # pb0 down: reading its carrier fails
    watch = PlaneWatch([Plane("a", "pa0"), Plane("b", "pb0")], sys_net=sys_net)
    assert watch.changes() == [("a", True), ("b", False)]
    assert watch.changes() == []
    (sys_net / "pa0" / "carrier").write_text("0\n")
    (sys_net / "pb0" / "carrier").write_text("1\n")
    assert watch.changes() == [("a", False), ("b", True)]
