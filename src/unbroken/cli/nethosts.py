"""Hosts on one machine: each node a network namespace with a link on each network plane.

A plane is a bridge in the root namespace; node i's link on it is a veth pair, the root end
(``<tag>h<i><letter>``, its carrier the link's) on the bridge and the other end in the node's
namespace (``p<letter>0``, what the ranks' ``GLOO_SOCKET_IFNAME`` names), with address
``10.<77 + plane>.<x>.<i + 1>``. The root namespace holds ``.254`` on every bridge. With
``management``, one more bridge (letter ``m``) carries what must not ride a plane that may go
down: the control channel and the rendezvous stores (the control plane listens on its ``.254``).

``unbroken run`` builds these for a cluster YAML that declares ``planes`` (root and iproute2
needed: :func:`unavailable` says why not); the multi-host tests build them too. Every name
starts with the tag (``ub<pid>``), and :meth:`NetHosts.close` deletes what :meth:`create` made.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

#: Planes a cluster may declare (letters of the bridges and interfaces).
MAX_PLANES = 4
_LETTERS = "abcd"


class NetnsError(RuntimeError):
    """An ``ip`` or ``tc`` command failed; the message has the command and its stderr."""


def _cmd(*cmd: str) -> None:
    done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        raise NetnsError(f"{' '.join(cmd)}: {done.stderr.strip()}")


def _ip(*args: str, netns: str | None = None) -> None:
    _cmd("ip", *(["-n", netns] if netns else []), *args)


def plane_ifname(plane: int) -> str:
    """The interface of plane ``plane`` (0-based) inside a node's namespace."""
    return f"p{_LETTERS[plane]}0"


def unavailable() -> str:
    """Why namespaces cannot be made here, or ""."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"ub{os.getpid()}probe"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if done.returncode != 0:
        return f"`ip netns add` is not permitted: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


@dataclass
class NetHosts:
    """``n`` namespaces, each linked to ``planes`` bridges (and the management bridge)."""

    n: int
    planes: int = 1
    management: bool = False
    tag: str = field(default_factory=lambda: f"ub{os.getpid()}")
    created_ns: list[str] = field(default_factory=list)
    created_links: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 1 <= self.planes <= MAX_PLANES:
            raise ValueError(f"planes: 1 to {MAX_PLANES}, got {self.planes}")

    @property
    def mgmt(self) -> int:
        """The management bridge's index (after the planes)."""
        return self.planes

    def _letter(self, plane: int) -> str:
        return "m" if plane == self.mgmt else _LETTERS[plane]

    def _bridges(self) -> range:
        return range(self.planes + (1 if self.management else 0))

    def ns(self, i: int) -> str:
        return f"{self.tag}h{i}"

    def bridge(self, plane: int) -> str:
        return f"{self.tag}b{self._letter(plane)}"

    def host_veth(self, i: int, plane: int) -> str:
        """The root-namespace end of node i's link on ``plane`` (down: the link is cut)."""
        return f"{self.tag}h{i}{self._letter(plane)}"

    def ifname(self, plane: int) -> str:
        return "pm0" if plane == self.mgmt else plane_ifname(plane)

    def subnet(self, plane: int) -> str:
        return f"10.{77 + plane}.{os.getpid() % 250}"

    def address(self, i: int, plane: int = 0) -> str:
        return f"{self.subnet(plane)}.{i + 1}"

    def root_address(self, plane: int = 0) -> str:
        return f"{self.subnet(plane)}.254"

    def create(self) -> None:
        for plane in self._bridges():
            br = self.bridge(plane)
            _ip("link", "add", br, "type", "bridge")
            self.created_links.append(br)
            _ip("addr", "add", f"{self.root_address(plane)}/24", "dev", br)
            _ip("link", "set", br, "up")
        for i in range(self.n):
            ns = self.ns(i)
            _ip("netns", "add", ns)
            self.created_ns.append(ns)
            _ip("link", "set", "lo", "up", netns=ns)
            for plane in self._bridges():
                outer, inner = self.host_veth(i, plane), self.ifname(plane)
                _ip("link", "add", outer, "type", "veth", "peer", "name", inner, "netns", ns)
                self.created_links.append(outer)
                _ip("link", "set", outer, "master", self.bridge(plane))
                _ip("link", "set", outer, "up")
                _ip("addr", "add", f"{self.address(i, plane)}/24", "dev", inner, netns=ns)
                _ip("link", "set", inner, "up", netns=ns)

    def set_link(self, i: int, up: bool, plane: int = 0) -> None:
        """Take node i's link on ``plane`` down (``ip link set DEV down``) or up again."""
        _ip("link", "set", self.host_veth(i, plane), "up" if up else "down")

    def set_rate(self, i: int, rate: str | None, plane: int = 0) -> None:
        """Slow node i's link on ``plane`` down to ``rate`` (``tc`` token bucket on the traffic
        towards it, e.g. ``"8mbit"``), or lift the limit (None). The carrier stays up."""
        dev = self.host_veth(i, plane)
        if rate is None:
            _cmd("tc", "qdisc", "del", "dev", dev, "root")
        else:
            tbf = ("tbf", "rate", rate, "burst", "32kbit", "latency", "400ms")
            _cmd("tc", "qdisc", "replace", "dev", dev, "root", *tbf)

    def argv(self, i: int, cmd: Sequence[str]) -> list[str]:
        """``cmd`` run inside node i's namespace."""
        return ["ip", "netns", "exec", self.ns(i), *cmd]

    def close(self) -> None:
        for link in reversed(self.created_links):
            subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=10)
        for ns in reversed(self.created_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        self.created_links.clear()
        self.created_ns.clear()
