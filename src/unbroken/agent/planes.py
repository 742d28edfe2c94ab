"""A host's network planes: declared, watched, and cut when the job leaves one.

``unbroken launch --join ... --plane a=pa0 --plane b=pb0`` declares the planes this host's ranks
may run their collectives over, in order of preference; the host agent hands them to its pods'
agents as ``UNBROKEN_PLANES=a=pa0,b=pb0`` and starts the ranks on the first (gloo's
``GLOO_SOCKET_IFNAME``). A pod's agent reads each plane's carrier (``/sys/class/net/IF/carrier``,
the kernel's own view of the link: it drops as soon as the cable, the switch port or the peer
of a veth goes down) on every tick and reports a change at once.

When the job leaves a plane whose link is down, its ranks are inside a collective that waits on
connections no packet will cross again; TCP gives up on such a connection only after minutes.
:func:`cut_plane` has the kernel destroy every established connection of the ranks whose local
address is the plane's (``ss -K``, as :mod:`unbroken.worker.linkfault` does for an injected
link fault), so the collective fails at once on this host, the step is redone after the regroup
and nothing waits for a timeout. The control channel and the rendezvous store are on another
address and are never touched.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from unbroken.worker.linkfault import Connection, established, reset, socket_inodes

_NAME = re.compile(r"[a-z][a-z0-9-]{0,15}")
_SYS_NET = Path("/sys/class/net")
#: The environment variable that carries a host's planes to its pods' agents.
PLANES_VAR = "UNBROKEN_PLANES"
#: The plane a pod's agent starts its ranks on, when the control plane says (a job rescheduled
#: while its first plane is down somewhere); else the host's first.
START_PLANE_VAR = "UNBROKEN_START_PLANE"


class PlaneError(ValueError):
    """A plane declaration is malformed; the message is the one line the user sees."""


@dataclass(frozen=True)
class Plane:
    name: str
    ifname: str


def parse_plane(text: str, where: str = "--plane") -> Plane:
    """``NAME=IFNAME``: a plane's name (lower case, as ``a`` or ``plane-b``) and interface."""
    name, sep, ifname = text.partition("=")
    if not sep or not _NAME.fullmatch(name) or not ifname or "/" in ifname or len(ifname) > 15:
        raise PlaneError(
            f"{where} {text!r}: expected NAME=IFNAME (NAME lower case letters, digits or '-', "
            "IFNAME a network interface)"
        )
    return Plane(name, ifname)


def check_planes(planes: Sequence[Plane], where: str = "--plane", sys_net: Path = _SYS_NET) -> None:
    """Raise :class:`PlaneError` for a repeated name or interface, or an interface this host
    does not have."""
    for attr in ("name", "ifname"):
        seen: set[str] = set()
        for p in planes:
            value = getattr(p, attr)
            if value in seen:
                raise PlaneError(f"{where} {p.name}={p.ifname}: {attr} {value!r} declared twice")
            seen.add(value)
    for p in planes:
        if not (sys_net / p.ifname).exists():
            raise PlaneError(
                f"{where} {p.name}={p.ifname}: this host has no network interface {p.ifname!r}"
            )
    if len(planes) == 1:
        raise PlaneError(f"{where}: one plane declared; a failover needs at least two")


def encode_planes(planes: Iterable[Plane]) -> str:
    return ",".join(f"{p.name}={p.ifname}" for p in planes)


def decode_planes(text: str) -> tuple[Plane, ...]:
    if not text:
        return ()
    return tuple(parse_plane(item, PLANES_VAR) for item in text.split(","))


def carrier(ifname: str, sys_net: Path = _SYS_NET) -> bool:
    """Whether the interface is up with a link (``carrier`` 1); an interface that is down
    (reading ``carrier`` fails) or gone counts as down."""
    try:
        return (sys_net / ifname / "carrier").read_text().strip() == "1"
    except OSError:
        return False


class PlaneWatch:
    """Each plane's carrier as last seen; :meth:`changes` says which changed since."""

    def __init__(self, planes: Sequence[Plane], sys_net: Path = _SYS_NET) -> None:
        self.planes = tuple(planes)
        self.sys_net = sys_net
        self.seen: dict[str, bool] = {}

    def changes(self) -> list[tuple[str, bool]]:
        """``(plane, up)`` for every plane whose state differs from the last look (all of
        them on the first)."""
        out = []
        for p in self.planes:
            up = carrier(p.ifname, self.sys_net)
            if self.seen.get(p.name) != up:
                self.seen[p.name] = up
                out.append((p.name, up))
        return out


def interface_addresses(ifname: str) -> set[str]:
    """The IPv4 addresses of ``ifname`` (empty when it has none or does not exist)."""
    import fcntl
    import struct

    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            raw = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", ifname.encode()[:15]))
        except OSError:
            return set()
    return {socket.inet_ntoa(raw[20:24])}


def plane_links(pids: Iterable[int], ifname: str) -> list[Connection]:
    """The established TCP connections of ``pids`` whose local end is on ``ifname``."""
    local = interface_addresses(ifname)
    inodes: set[int] = set()
    for pid in pids:
        inodes |= socket_inodes(pid)
    return [c for c in established(inodes) if c.local[0] in local] if local else []


def cut_plane(pids: Iterable[int], ifname: str) -> list[Connection]:
    """Destroy the ranks' connections on ``ifname`` (see the module doc); the ones destroyed."""
    links = plane_links(pids, ifname)
    return reset(links) if links else []


__all__ = [
    "PLANES_VAR",
    "START_PLANE_VAR",
    "Plane",
    "PlaneError",
    "PlaneWatch",
    "carrier",
    "check_planes",
    "cut_plane",
    "decode_planes",
    "encode_planes",
    "interface_addresses",
    "parse_plane",
    "plane_links",
]
